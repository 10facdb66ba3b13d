"""FLUX.3's prompt upsampler (a Qwen3.5 LLM that writes the prompt out before it is encoded) as a
component of its own: the health check runs its generation (the prefill and cached decode calls,
`UPSAMPLER_CHECK_TOKENS` tokens) under the plan's dtype with every layer recorded, names the
first layer that overflows and proves its fix like any component's; a job runs the caption it
writes."""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest
import torch

from app.core import generation, models
from app.core.components import COMPONENTS, Role, Status, Verdict
from app.core.errors import BadFileError
from app.core.fixing.quality import compare
from app.core.generation import GenerationRequest
from app.core.health.request import DEFAULT_PROMPT, CheckRequest, CheckRun
from app.core.health.stages import UPSAMPLER_CHECK_TOKENS, Runner
from app.core.precision import PrecisionPlan
from app.core.settings import PrecisionSettings
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
FP32 = PrecisionSettings(precision="fp32")


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


def _request(tmp_path, prompt: str, upsample: bool) -> GenerationRequest:
    return GenerationRequest(
        prompt=prompt,
        steps=2,
        cfg=1.0,
        seed=4,
        width=64,
        height=64,
        output_dir=str(tmp_path),
        upsample_prompt=upsample,
    )


def test_generation_encodes_the_caption_the_upsampler_writes(tmp_path):
    model = _klein()
    pipeline = model.pipeline
    pipeline.upsampler_new_tokens = 8  # diffusers' blocks take the bound as an input
    caption = pipeline.upsample_prompt("a red cat", torch.device("cpu"), 8).text
    assert caption and caption != "a red cat"

    upsampled = generation.generate(
        model, _request(tmp_path / "on", "a red cat", True), precision=FP32, device="cpu"
    )
    assert upsampled.upsampled_prompt == caption
    assert upsampled.to_json()["upsampled_prompt"] == caption
    # The same image as the caption typed in with the upsampler off: the encoders read it.
    typed = generation.generate(
        model, _request(tmp_path / "off", caption, False), precision=FP32, device="cpu"
    )
    assert typed.upsampled_prompt is None
    (made,), (expected,) = upsampled.images, typed.images
    assert np.array_equal(np.asarray(made.image), np.asarray(expected.image))
    plain = generation.generate(
        model, _request(tmp_path / "plain", "a red cat", False), precision=FP32, device="cpu"
    )
    assert not np.array_equal(np.asarray(plain.images[0].image), np.asarray(made.image))


@pytest.mark.slow  # saving and loading two 151,669-token embeddings
def test_a_folder_with_an_upsampler_loads_it_kept_as_stored(tmp_path):
    pipeline = build_tiny_flux3_pipeline(distilled=True, upsampler=True)
    pipeline.prompt_upsampler.to(torch.bfloat16)
    pipeline.save_pretrained(tmp_path / "klein")

    model = models.load_model(str(tmp_path / "klein"))

    loaded = model.pipeline.prompt_upsampler
    assert "prompt_upsampler" in model.components
    assert loaded.dtype == torch.bfloat16
    saved = pipeline.prompt_upsampler.state_dict()
    assert all(torch.equal(saved[k], v) for k, v in loaded.state_dict().items())


@pytest.mark.slow  # saving a 151,669-token embedding
def test_an_upsampler_without_its_processor_is_one_sentence(tmp_path):
    pipeline = build_tiny_flux3_pipeline(distilled=True, upsampler=True)
    pipeline.save_pretrained(tmp_path / "klein")
    shutil.rmtree(tmp_path / "klein" / "prompt_upsampler_processor")

    with pytest.raises(BadFileError, match="prompt upsampler but not its processor"):
        models.load_model(str(tmp_path / "klein"))


@pytest.mark.parametrize(("flag", "expected"), [([], True), (["--upsample-prompt", "off"], False)])
def test_generate_takes_the_upsampler_on_or_off(flag, expected):
    from app.cli.arguments import build_parser, effective_settings
    from app.cli.commands import generate_request

    args = build_parser().parse_args(["generate", "demo", *flag])
    request = generate_request(args, effective_settings(args), native_size=128)
    assert request.generation.upsample_prompt is expected


# A ComfyUI graph's prompt upsampler ---------------------------------------------------------


def _graph_with(node: dict) -> str:
    from tests.support.image_files import comfy_prompt

    nodes = json.loads(comfy_prompt("flux3-image-klein.safetensors"))
    nodes["30"] = node
    return json.dumps(nodes)


@pytest.mark.parametrize(
    ("node", "said"),
    [
        (
            {
                "class_type": "PromptUpsampler",
                "inputs": {"model_name": "qwen3.5_9b_w4a8.safetensors", "text": "a cat."},
            },
            "PromptUpsampler (qwen3.5_9b_w4a8.safetensors)",
        ),
        (
            {"class_type": "CLIPLoader", "inputs": {"clip_name": "flux-3-image-klein-pup.gguf"}},
            "CLIPLoader (flux-3-image-klein-pup.gguf)",
        ),
        ({"class_type": "CLIPLoader", "inputs": {"clip_name": "qwen3vl_4b.safetensors"}}, None),
    ],
    ids=["upsampler node", "upsampler file", "text encoder"],
)
def test_a_comfyui_graph_names_its_prompt_upsampler(tmp_path, node, said):
    from app.core import explain
    from tests.support.image_files import pixels, png_text

    image = png_text(
        tmp_path / "ComfyUI_00001_.png", {"prompt": _graph_with(node)}, pixels("noise")
    )
    record, _, _ = explain.read_image(image)
    assert record.prompt_upsampler == said
    assert record.to_json()["prompt_upsampler"] == said
    if said is not None:
        explanation = explain.explain_image(str(image), folders=[str(tmp_path / "none")])
        assert any(said in note and "prompt upsampler" in note for note in explanation.notes)


def test_a_job_whose_upsampler_overflows_encodes_the_prompt_as_typed(tmp_path):
    model = _klein(planted=True)
    model.pipeline.upsampler_new_tokens = 8
    fp16_upsampler = PrecisionSettings(precision="fp32", prompt_upsampler_precision="fp16")

    result = generation.generate(
        model, _request(tmp_path / "on", "a red cat", True), precision=fp16_upsampler, device="cpu"
    )

    assert result.upsampled_prompt is None
    assert any("prompt upsampler went NaN/Inf in fp16" in w for w in result.warnings)
    typed = generation.generate(
        model, _request(tmp_path / "off", "a red cat", False), precision=FP32, device="cpu"
    )
    assert np.array_equal(np.asarray(result.images[0].image), np.asarray(typed.images[0].image))


def test_an_upsampler_overflow_is_the_model_not_an_intermittent_fault():
    """The cause attribution re-runs the check's plan: the upsampler runs in it, so its NaN
    comes back and is the model's (precision), never a fault that struck at random."""
    from app.core.causes.check import check_and_attribute

    report = check_and_attribute(
        _klein(planted=True),
        CheckRequest(precision=PrecisionSettings(precision="fp16"), device="cpu", size=64),
        run=CheckRun(remember=False, measure_cost=False),
    )
    assert report.cause is not None and report.cause.kind == "precision"
    assert report.verdict is Verdict.FIXABLE
    assert report.components["prompt_upsampler"].first_bad_module == PLANTED


def test_a_job_under_the_checks_fix_writes_the_caption_fp32_writes(tmp_path):
    """The fix the check proved, as settings: the job's upsampler stays finite in fp16 and
    writes what it writes in fp32."""
    model = _klein(planted=True)
    model.pipeline.upsampler_new_tokens = 8
    report = check(model)
    assert report.fix is not None
    fixed = PrecisionSettings.from_mapping(
        {"precision": "fp32", "prompt_upsampler_precision": "fp16", **report.fix.settings}
    )

    made = generation.generate(
        model, _request(tmp_path / "fixed", "a red cat", True), precision=fixed, device="cpu"
    )
    wide = generation.generate(
        model, _request(tmp_path / "fp32", "a red cat", True), precision=FP32, device="cpu"
    )

    assert not any("upsampler went" in w for w in made.warnings)
    assert made.upsampled_prompt is not None and made.upsampled_prompt == wide.upsampled_prompt


def test_an_edit_job_has_the_upsampler_read_its_reference_pictures(tmp_path):
    """diffusers' image-conditioned upsampling: the reference pictures, then the instruction,
    under the editing system prompt; not the text-to-image caption."""
    from PIL import Image

    path = tmp_path / "ref.png"
    noise = np.random.RandomState(0).rand(64, 64, 3) * 255
    Image.fromarray(noise.astype(np.uint8)).save(path)
    model = _klein()
    model.pipeline.upsampler_new_tokens = 8
    cpu = torch.device("cpu")
    with Image.open(path) as opened:
        picture = opened.convert("RGB")
    expected = model.pipeline.upsample_prompt("make it red", cpu, 8, references=(picture,)).text
    text_only = model.pipeline.upsample_prompt("make it red", cpu, 8).text
    assert expected != text_only

    request = _request(tmp_path / "edit", "make it red", True)
    edit = dataclasses.replace(request, images=[str(path)])
    result = generation.generate(model, edit, precision=FP32, device="cpu")

    assert result.upsampled_prompt == expected


def test_the_check_of_an_edit_has_the_upsampler_read_the_reference(tmp_path):
    from PIL import Image

    from app.core import health

    path = tmp_path / "ref.png"
    noise = np.random.RandomState(0).rand(64, 64, 3) * 255
    Image.fromarray(noise.astype(np.uint8)).save(path)
    model = _klein()
    pictures_seen: list[int] = []
    visual = model.pipeline.prompt_upsampler.model.visual
    handle = visual.register_forward_hook(lambda *_: pictures_seen.append(1))
    try:
        report = health.check_loaded(
            model,
            CheckRequest(
                precision=PrecisionSettings(precision="fp16"),
                device="cpu",
                size=64,
                images=(str(path),),
            ),
            run=CheckRun(remember=False, measure_cost=False),
        )
    finally:
        handle.remove()
    assert report.components["prompt_upsampler"].status is Status.OK
    assert pictures_seen  # the vision tower read the reference in the prefill
