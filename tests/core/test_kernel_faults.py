"""A fault in PyTorch's own attention kernel where a precision change repairs it too: the built-in
demo model in fp16 with the flash kernel returning NaN for every fp16 call (its text encoder's,
UNet's and VAE's attention alike; the math kernel right), checked under a GPU's order of costs
(`cost_oracle.gpu_ms`), where bf16 runs as fast as fp16 and the fix search repairs every part
in bf16. The kernel is named for every part it struck and the backend switch, which keeps fp16,
is the fix, with the precision fix beside it; a real fp16 overflow of the same model
(`demo-overflow`) on a healthy kernel still gets its precision fix. The switch is judged
against fp32 run by diffusers' own attention processor, so HalfSafe's processor must compute
what diffusers' does."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from app.core import causes, health
from app.core.health.request import CheckRequest, CheckRun
from app.core.models import load_model
from app.core.settings import PrecisionSettings
from tests.support import cost_oracle
from tests.support.attention_kernels import flash_nan_in_fp16

FP16 = PrecisionSettings(precision="fp16")
PARTS = ["text_encoder", "unet", "vae"]


def check_on_a_gpus_costs(monkeypatch, name: str):
    """`check demo` (or `demo-overflow`) in fp16 at 64 px, its candidates ranked by a GPU's
    costs, with attribution, as the command runs it (nothing remembered)."""
    cost_oracle.inject(monkeypatch, cost_oracle.gpu_ms)
    return causes.check_and_attribute(
        load_model(name),
        CheckRequest(precision=FP16, device="cpu", size=64),
        run=CheckRun(remember=False, measure_cost=True),
    )


def test_halfsafes_attention_processor_computes_what_diffusers_does():
    """Self-attention with a group norm (every VAE's mid-block): the keys and values come from
    the normed input, as diffusers computes them, and the UNet's layers agree as well."""
    from diffusers.models.attention_processor import AttnProcessor2_0

    from app.core.precision import SafeAttnProcessor

    pipeline = load_model("demo").pipeline
    generator = torch.Generator().manual_seed(0)
    layers = {
        "decoder.mid_block.attentions.0": (pipeline.vae, (1, 32, 16, 16), None),
        "down_blocks.0.attentions.0.transformer_blocks.0.attn1": (pipeline.unet, (2, 64, 32), None),
        "down_blocks.0.attentions.0.transformer_blocks.0.attn2": (
            pipeline.unet,
            (2, 64, 32),
            torch.randn(2, 77, 32, generator=generator),
        ),
    }
    for path, (component, shape, context) in layers.items():
        layer = component.get_submodule(path)
        hidden = torch.randn(*shape, generator=generator)
        outputs = []
        for processor in (AttnProcessor2_0(), SafeAttnProcessor(upcast=False)):
            layer.set_processor(processor)
            with torch.no_grad():
                outputs.append(layer(hidden, encoder_hidden_states=context))
        torch.testing.assert_close(outputs[1], outputs[0], rtol=1e-5, atol=1e-5, msg=path)


@pytest.mark.slow
def test_a_flash_fault_in_every_part_is_the_kernel_and_its_switch_comes_first(monkeypatch):
    flash_nan_in_fp16(monkeypatch)
    report = check_on_a_gpus_costs(monkeypatch, "demo")
    cause = report.cause

    # Every part fails as the user runs it. The UNet's own fix (attention computed in fp32, a
    # switch that changes no layer and so ranks first) reaches the VAE's attention too, which
    # then runs finite: the VAE is decoded as the user runs it first, so it is named, and its
    # fault is covered by that fix.
    assert [n for n, c in report.components.items() if c.status.failed] == PARTS
    assert cause is not None and cause.kind == "kernel", report.headline
    assert cause.verified and cause.quality is not None and cause.quality.passed
    assert "against fp32" in cause.quality.words()
    parts = "text encoder, UNet and VAE"
    assert f"attention kernel fault in the {parts}, not an overflow" in report.headline
    assert "overflows" not in report.headline and "overflowed" not in cause.summary
    # First: the backend switch, verified, every part in fp16 as the user runs it.
    fix = report.fix
    assert report.verdict == "fixable" and fix is not None and fix.verified
    assert fix.settings == {"attention_backend": "math"}
    assert fix.plan.dtypes == report.plan.dtypes == dict.fromkeys(PARTS, "fp16")
    # Second: the fix the search found, keeping the backend (the text encoder in bf16, the
    # attention upcast), verified and priced.
    alternative = cause.alternative
    assert alternative is not None and alternative.verified
    assert alternative.settings == {"text_encoder_precision": "bf16", "upcast_attention": True}
    assert fix.cost is not None and alternative.cost is not None
    document = report.to_json()
    assert document["fix"]["settings"] == {"attention_backend": "math"}
    assert document["fix"]["verified"] is True
    assert {n: document["fix"][n] for n in PARTS} == dict.fromkeys(PARTS, "fp16")
    assert document["cause"]["kind"] == "kernel"
    repair = document["cause"]["repair"]
    assert repair["action"] == "switch_backend" and repair["verified"] is True
    assert repair["settings"] == {"attention_backend": "math"}
    assert document["cause"]["alternative"]["settings"] == alternative.settings

    from app.cli.text import health_text

    text = health_text(report)
    assert "\nApply:   --attention-backend math\n" in text
    assert "\nOr:      --text-encoder-precision bf16 --upcast-attention" in text


def _picture(tmp_path) -> str:
    from PIL import Image

    path = tmp_path / "input.png"
    Image.fromarray((np.random.RandomState(0).rand(64, 64, 3) * 255).astype(np.uint8)).save(path)
    return str(path)


def _failed(report) -> list[str]:
    return [n for n, c in report.components.items() if c.status.failed]


@pytest.mark.slow
def test_the_hires_fixs_encoder_is_named_where_the_unets_switch_covers_it(monkeypatch):
    """A hires fix's pixel pass encodes the decoded picture after the VAE is settled: the
    UNet's switch (attention computed in fp32) reaches the VAE's encoder too, which is
    encoded as the user runs it first, so its fault is named, covered by that switch."""
    flash_nan_in_fp16(monkeypatch)
    cost_oracle.inject(monkeypatch, cost_oracle.gpu_ms)
    report = health.check_loaded(
        load_model("demo"),
        CheckRequest(precision=FP16, device="cpu", size=64, pixel_upscale=True),
        run=CheckRun(remember=False, measure_cost=False),
    )
    assert _failed(report) == [*PARTS, "vae_encoder"]
    encoder = report.components["vae_encoder"]
    assert encoder.precisions["fp16"].measured and encoder.precisions["fp16"].status.failed
    assert report.verdict == "fixable" and report.fix is not None and report.fix.verified
    assert report.fix.plan.dtypes["vae"] == "fp16"  # the switch covers it: no fix of its own


@pytest.mark.slow
def test_a_picture_jobs_encoder_fault_is_named_and_its_switch_covers_the_parts_after_it(
    monkeypatch, tmp_path
):
    """On a card where bf16 is slow (emulated), an image-to-image check: the text encoder's fix
    is its own dtype (its attention is not diffusers', so no switch of the VAE's reaches it),
    which leaves the VAE's encoder as the user runs it, so it fails on its own and its fix is
    the attention upcast; that switch reaches the UNet and the decode, which run as the user
    runs them first: both are named, covered by it, and keep fp16."""

    def emulated_bf16(plan, component: str) -> float:
        ms = {"fp16": 10.0, "bf16": 60.0, "fp32": 20.0}[plan.dtype_of(component)]
        return ms * (1.3 if plan.upcast_attention else 1.0)

    flash_nan_in_fp16(monkeypatch)
    cost_oracle.inject(monkeypatch, emulated_bf16)
    report = health.check_loaded(
        load_model("demo"),
        CheckRequest(precision=FP16, device="cpu", size=64, images=(_picture(tmp_path),)),
        run=CheckRun(remember=False, measure_cost=True),
    )
    assert _failed(report) == ["text_encoder", "vae_encoder", "unet", "vae"]
    for name in ("vae_encoder", "unet", "vae"):
        fp16 = report.components[name].precisions["fp16"]
        assert fp16.measured and fp16.status.failed, name
    fix = report.fix
    assert report.verdict == "fixable" and fix is not None and fix.verified
    assert fix.settings == {"text_encoder_precision": "bf16", "upcast_attention": True}
    assert (fix.plan.dtypes["unet"], fix.plan.dtypes["vae"]) == ("fp16", "fp16")
    assert not fix.plan.islands("unet") and not fix.plan.islands("vae")


@pytest.mark.slow
def test_a_real_overflow_of_the_demo_on_a_healthy_kernel_keeps_its_precision_fix(monkeypatch):
    report = check_on_a_gpus_costs(monkeypatch, "demo-overflow")
    cause = report.cause

    assert [n for n, c in report.components.items() if c.status.failed] == ["vae"]
    assert report.components["vae"].status == "overflow"
    assert cause is not None and cause.kind == "precision", report.headline
    assert cause.alternative is None and "kernel" not in report.headline
    fix = report.fix
    assert report.verdict == "fixable" and fix is not None and fix.verified
    assert "attention_backend" not in fix.settings
    assert fix.plan.dtypes["vae"] != "fp16" or fix.plan.islands("vae")
    assert {n: fix.plan.dtypes[n] for n in ("text_encoder", "unet")} == {
        "text_encoder": "fp16",
        "unet": "fp16",
    }


@pytest.mark.slow
def test_a_search_fix_that_switches_the_backend_too_is_no_alternative_to_the_switch(monkeypatch):
    """Where the math kernel is the first switch the search can take (the attention's own
    upcast and diffusers' classic processor are not candidates here), the search's fix for the
    same fault switches the backend and runs the text encoder in bf16: the switch alone is the
    repair, and that fix is not offered beside it as "keep the attention backend"."""
    from app.core.fixing import fix_candidates

    flash_nan_in_fp16(monkeypatch)
    kept = [
        k
        for k in fix_candidates.FIX_KINDS
        if k.name not in ("upcast_attention", "classic_attention")
    ]
    monkeypatch.setattr(fix_candidates, "FIX_KINDS", tuple(kept))
    cost_oracle.inject(
        monkeypatch, lambda plan, _: 8.0 if plan.attention_backend == "math" else 10.0
    )
    report = causes.check_and_attribute(
        load_model("demo"),
        CheckRequest(precision=FP16, device="cpu", size=64),
        run=CheckRun(remember=False, measure_cost=True),
    )
    cause = report.cause

    assert cause is not None and cause.kind == "kernel" and cause.verified, report.headline
    assert report.fix is not None and report.fix.settings == {"attention_backend": "math"}
    assert cause.alternative is None
    assert "Keep the attention backend" not in report.fix.summary
    assert "keep the attention backend" not in cause.summary
