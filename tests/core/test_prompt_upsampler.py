"""FLUX.3's prompt upsampler (a Qwen3.5 LLM that writes the prompt out before it is encoded) as a
component of its own: the health check runs its generation (the prefill and cached decode calls,
`UPSAMPLER_CHECK_TOKENS` tokens) under the plan's dtype with every layer recorded, names the
first layer that overflows and proves its fix like any component's; a job runs the caption it
writes."""

from __future__ import annotations

import pytest
import torch

from app.core.components import COMPONENTS, Role, Status, Verdict
from app.core.fixing.quality import compare
from app.core.health.stages import DEFAULT_PROMPT, UPSAMPLER_CHECK_TOKENS, Runner
from app.core.precision import PrecisionPlan
from tests.support.family_helpers import (
    check,
    in_memory,
    offline,  # noqa: F401 - an autouse fixture: no network
)
from tests.support.tiny_models import build_tiny_flux3_pipeline

# A layer of the full-attention decoder layer's MLP, and a factor that takes its output past
# fp16's range (the healthy upsampler's largest activation is about 4).
PLANTED = "model.language_model.layers.1.mlp.down_proj"
FACTOR = 5e7


def _klein(planted: bool = False):
    pipeline = build_tiny_flux3_pipeline(distilled=True, upsampler=True)
    if planted:
        with torch.no_grad():
            pipeline.prompt_upsampler.get_submodule(PLANTED).weight.mul_(FACTOR)
    return in_memory(pipeline, "flux3-klein-upsampler", "flux3-klein")


def test_the_prompt_upsampler_is_a_component_that_runs_first():
    upsampler = COMPONENTS["prompt_upsampler"]
    assert upsampler.role is Role.PROMPT_UPSAMPLER
    assert upsampler.setting == "prompt_upsampler_precision"
    assert list(COMPONENTS).index("prompt_upsampler") < list(COMPONENTS).index("text_encoder")


def test_a_healthy_upsampler_is_checked_by_its_generation():
    report = check(_klein())
    assert report.verdict is Verdict.HEALTHY
    upsampler = report.components["prompt_upsampler"]
    assert upsampler.status is Status.OK
    assert upsampler.max_abs is not None and 0 < upsampler.max_abs < 100
    # Generation, not one forward: the prefill and a call per further token.
    assert report.work.calls["prompt_upsampler"] == {"fp16": UPSAMPLER_CHECK_TOKENS}


def test_an_overflow_in_an_upsampler_mlp_is_named_and_its_fix_proved():
    model = _klein(planted=True)
    report = check(model)
    upsampler = report.components["prompt_upsampler"]
    assert upsampler.status.failed
    assert upsampler.first_bad_module == PLANTED
    for other in ("text_encoder", "transformer", "vae"):
        assert report.components[other].status is Status.OK
    assert report.verdict is Verdict.FIXABLE
    fix = report.fix
    assert fix is not None and fix.verified
    assert fix.quality is not None and fix.quality.passed
    assert PLANTED in fix.plan.modules.get("prompt_upsampler", {}) or (
        fix.plan.dtypes["prompt_upsampler"] != "fp16"
    )
    # Only the upsampler moved.
    assert {n: d for n, d in fix.plan.dtypes.items() if n != "prompt_upsampler"} == {
        "text_encoder": "fp16",
        "transformer": "fp16",
        "vae": "fp16",
    }
    # The proof, outside the check: the fixed upsampler, generating freely, writes what fp32
    # writes, and its logits agree with fp32's.
    fixed_logits, fixed_tokens = _generated(model, fix.plan)
    fp32 = PrecisionPlan("cpu", {**fix.plan.dtypes, "prompt_upsampler": "fp32"})
    fp32_logits, fp32_tokens = _generated(model, fp32)
    assert fixed_tokens is not None  # its logits were finite
    assert torch.equal(fixed_tokens, fp32_tokens)
    assert compare(fixed_logits, fp32_logits).passed


def _generated(model, plan: PrecisionPlan):
    """The check's generation under `plan`: each step's logits and, where they were finite,
    the tokens."""
    runner = Runner(model, plan, 64, DEFAULT_PROMPT, 4, "euler")
    try:
        stage = runner.upsample(plan, record=False)
    finally:
        runner.placed.release()
    return stage.output, runner.upsampled_tokens


@pytest.mark.parametrize("planted", [False, True], ids=["healthy", "planted"])
def test_the_unfixed_fp16_upsampler_is_what_fails(planted):
    """The planted factor is what makes fp16 fail: the same generation without the fix."""
    model = _klein(planted)
    plan = PrecisionPlan("cpu", dict.fromkeys(model.components, "fp16"))
    runner = Runner(model, plan, 64, DEFAULT_PROMPT, 4, "euler")
    try:
        stage = runner.upsample(plan)
    finally:
        runner.placed.release()
    assert stage.probes["prompt_upsampler"].non_finite is planted
