"""Precision plans: how `auto` resolves, that explicit choices win, and that a plan really
applies (dtypes per component, boundary casts, backend flags restored after the job)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from app.core.precision import PlacedPipeline, PrecisionPlan, backend_flags, resolve_plan
from app.core.settings import PrecisionSettings
from tests.support.tiny_models import build_tiny_sd_pipeline

SD = ("text_encoder", "unet", "vae")
RTX = SimpleNamespace(  # what hardware.describe_device says of an Ampere+ card
    fp16="fast",
    bf16="native",
    recommended={
        "precision": "fp16",
        "unet_precision": "fp16",
        "vae_precision": "bf16",
        "text_encoder_precision": "fp16",
        "upcast_attention": False,
    },
    reasons={"vae_precision": "bf16 has fp32's range, so the VAE cannot overflow"},
)
GTX16 = SimpleNamespace(
    fp16="unreliable", bf16="emulated", recommended={"precision": "fp32"}, reasons={}
)


def plan(settings=None, device="cuda", info=RTX, **kwargs):
    return resolve_plan(
        settings or PrecisionSettings(), device=device, components=SD, device_info=info, **kwargs
    )


def test_auto_on_cpu_is_fp32_everywhere():
    p = resolve_plan(PrecisionSettings(), device="cpu", components=SD)
    assert set(p.dtypes.values()) == {"fp32"}
    assert p.warnings == ()


def test_auto_follows_the_device_recommendation_with_its_reason():
    p = plan()
    assert p.dtypes == {"text_encoder": "fp16", "unet": "fp16", "vae": "bf16"}
    assert "range" in p.reasons["vae_precision"]


def test_explicit_choices_are_honoured_with_a_warning_where_unwise():
    p = plan(PrecisionSettings(precision="fp16"), device="cuda:0", info=GTX16)
    assert set(p.dtypes.values()) == {"fp16"}
    assert any("NaN" in w for w in p.warnings)
    cpu = resolve_plan(
        PrecisionSettings(unet_precision="bf16"),
        device="cpu",
        components=SD,
        device_info=SimpleNamespace(bf16="emulated", fp16="slow", recommended={}, reasons={}),
    )
    assert cpu.dtypes["unet"] == "bf16" and any("bf16" in w for w in cpu.warnings)


def test_no_half_and_no_half_vae():
    assert set(plan(PrecisionSettings(no_half=True)).dtypes.values()) == {"fp32"}
    p = plan(PrecisionSettings(precision="fp16", no_half_vae=True))
    assert p.dtypes == {"text_encoder": "fp16", "unet": "fp16", "vae": "fp32"}


def test_model_that_needs_an_fp32_vae_gets_one_unless_told_otherwise():
    assert plan(PrecisionSettings(precision="fp16"), vae_needs_fp32=True).dtypes["vae"] == "fp32"
    told = plan(PrecisionSettings(precision="fp16", vae_precision="fp16"), vae_needs_fp32=True)
    assert told.dtypes["vae"] == "fp16"


def test_remembered_fix_fills_auto_fields_only():
    remembered = {"vae_precision": "fp32", "upcast_attention": True}
    p = plan(PrecisionSettings(precision="fp16"), remembered=remembered)
    assert p.dtypes["vae"] == "fp32" and p.upcast_attention
    assert "remembered" in p.reasons["vae_precision"]
    mine = plan(PrecisionSettings(precision="fp16", vae_precision="bf16"), remembered=remembered)
    assert mine.dtypes["vae"] == "bf16"
    assert plan(remembered={"no_half": True}).dtypes["unet"] == "fp32"


def test_a_remembered_fix_is_said_to_be_used_only_where_it_set_something():
    from app.core.fixing.profiles import RememberedFix
    from app.core.fixing.remembered_notes import remembered_words

    fix = RememberedFix({"vae_precision": "fp32"}, "run the VAE in fp32", "health check", 0.0)
    used = plan(PrecisionSettings(precision="fp16"), remembered=fix.settings)
    assert used.remembered_used == ("vae_precision",)
    assert remembered_words(fix, used) == [
        "Using the fix remembered for this model on this device: run the VAE in fp32."
    ]
    # The user's own VAE choice wins: the job runs without the fix and says so.
    mine = plan(PrecisionSettings(precision="fp16", vae_precision="fp16"), remembered=fix.settings)
    assert mine.remembered_used == () and mine.dtypes["vae"] == "fp16"
    (note,) = remembered_words(fix, mine)
    assert note.startswith("A fix is remembered for this model on this device")
    assert "ran without it" in note and "Using" not in note
    assert remembered_words(None, mine) == []
    # The job's own settings hold the same fix (a fix applied to it): it ran with it.
    layers = ["vae:decoder.up_blocks.0.resnets.0.conv1", "vae:decoder.conv_in"]
    layered = RememberedFix({"fp32_modules": layers}, "keep 2 VAE layers in fp32", "check", 0.0)
    again = plan(
        PrecisionSettings(precision="fp16", fp32_modules=layers[::-1]), remembered=layered.settings
    )
    assert again.remembered_used == () and again.remembered_held == ("fp32_modules",)
    (note,) = remembered_words(layered, again)
    assert "ran with it" in note and "without" not in note and "override" not in note


def test_a_remembered_kernel_switch_to_pytorchs_own_attention_is_said_as_run():
    """ComfyUI's HalfSafe Check stores a kernel fault's fix, PyTorch's own attention, as
    `attention_backend: auto`: a job that runs auto attention ran with it; one on another
    kernel did not."""
    from app.core.fixing.profiles import RememberedFix
    from app.core.fixing.remembered_notes import remembered_words

    fix = RememberedFix({"attention_backend": "auto"}, "switch attention", "comfyui check", 0.0)
    ran = plan(PrecisionSettings(precision="fp16"), remembered=fix.settings)
    assert ran.attention_backend == "auto"
    (note,) = remembered_words(fix, ran)
    assert "ran with it" in note and "override" not in note
    assert "PyTorch's own kernel" in note
    other = plan(
        PrecisionSettings(precision="fp16", attention_backend="math"), remembered=fix.settings
    )
    (note,) = remembered_words(fix, other)
    assert "override" in note and "ran without it" in note


def test_backend_flags_hold_for_the_job_and_are_restored_even_on_error():
    matmul = torch.backends.cuda.matmul
    before = (
        matmul.allow_tf32,
        matmul.allow_fp16_reduced_precision_reduction,
        matmul.allow_fp16_accumulation,
        torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed(),
    )
    job = PrecisionPlan(
        device="cpu",
        dtypes={},
        allow_tf32=not before[0],
        fp16_reduced_precision_reduction=not before[1],
        fp16_accumulation=not before[2],
        attention_reduced_precision=not before[3],
    )
    with pytest.raises(RuntimeError), backend_flags(job):
        assert matmul.allow_tf32 is (not before[0])
        assert matmul.allow_fp16_reduced_precision_reduction is (not before[1])
        assert matmul.allow_fp16_accumulation is (not before[2])
        assert torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed() is (not before[3])
        raise RuntimeError("the job failed")
    after = (
        matmul.allow_tf32,
        matmul.allow_fp16_reduced_precision_reduction,
        matmul.allow_fp16_accumulation,
        torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed(),
    )
    assert after == before


def test_mixed_precision_pipeline_runs_and_leaves_the_source_untouched():
    """fp16 text encoder and UNet with an fp32 VAE: diffusers alone raises a dtype error here."""
    source = build_tiny_sd_pipeline()
    mixed = PrecisionPlan(
        device="cpu", dtypes={"text_encoder": "fp16", "unet": "fp16", "vae": "fp32"}
    )
    placed = PlacedPipeline(source, mixed)
    assert placed["unet"].dtype == torch.float16 and placed["vae"].dtype == torch.float32
    with backend_flags(mixed), torch.inference_mode():
        image = placed.pipeline()(
            "a red barn", num_inference_steps=2, height=64, width=64, output_type="np"
        ).images
    assert image.shape == (1, 64, 64, 3) and (image == image).all()
    assert source.unet.dtype == torch.float32  # the loaded model keeps its stored precision

    vae_before = placed["vae"]
    placed.apply(mixed.with_dtypes(unet="fp32"))
    assert placed["unet"].dtype == torch.float32
    assert placed["vae"] is vae_before  # an unchanged component is not copied again


@pytest.mark.parametrize("backend", ["cudnn", "efficient"])
def test_a_choice_the_cpu_cannot_run_is_recorded_as_what_ran(backend):
    chosen = PrecisionSettings(precision="fp32", attention_backend=backend, fp16_accumulation=True)
    on_cpu = plan(chosen, device="cpu", info=None)
    assert on_cpu.attention_backend == "math" and on_cpu.fp16_accumulation is False
    settings = on_cpu.effective_settings()
    assert settings["attention_backend"] == "math" and settings["fp16_accumulation"] is False
    assert any("needs a CUDA GPU: on a CPU" in w for w in on_cpu.warnings)
    assert any("does nothing on a CPU" in w for w in on_cpu.warnings)
    # A CUDA device runs them as chosen.
    on_gpu = plan(chosen, device="cuda")
    assert on_gpu.attention_backend == backend and on_gpu.fp16_accumulation is True


def test_tf32_is_recorded_only_where_it_runs():
    """TF32 (on by default) exists only on CUDA GPUs of the Ampere kind or later: a plan for a
    CPU, an Apple GPU or an older card says it did not run, so the PNG and the report do."""
    on = PrecisionSettings(allow_tf32=True)
    assert plan(on, device="cpu", info=None).effective_settings()["allow_tf32"] is False
    assert plan(on, device="mps", info=None, ask_device=False).allow_tf32 is False
    assert (
        plan(on, device="cuda", info=SimpleNamespace(**vars(GTX16), tf32=False)).allow_tf32 is False
    )
    assert plan(on, device="cuda", info=SimpleNamespace(**vars(RTX), tf32=True)).allow_tf32
    assert not plan(PrecisionSettings(allow_tf32=False), device="cuda").allow_tf32


def test_a_choice_honoured_though_not_recommended_is_said_once_for_all_its_parts():
    plan = resolve_plan(
        PrecisionSettings(precision="fp16"),
        device="cpu",
        components=["text_encoder", "unet", "vae"],
    )
    assert plan.warnings == (
        "The text encoder, UNet and VAE run in fp16 as you asked; on a CPU fp16 is slow and "
        "fp32 is the usual choice.",
    )
    one = resolve_plan(
        PrecisionSettings(unet_precision="fp16"), device="cpu", components=["unet", "vae"]
    )
    assert one.warnings == (
        "The UNet runs in fp16 as you asked; on a CPU fp16 is slow and fp32 is the usual choice.",
    )


def test_a_remembered_switch_off_runs_where_the_user_left_it_as_it_comes():
    """A fix that turns CUDA's reduced-precision sums off (on by default) is used where the
    user left those switches as they come (at their default), as one that turns a switch on
    is where it is off; a value other than the default is the user's own. It never ran
    before: a remembered value filled only fields on auto, off or empty."""
    from app.core.precision.resolve import left_as_it_comes

    off = {
        "fp16_reduced_precision_reduction": False,
        "attention_reduced_precision": False,
        "fp16_accumulation": False,
    }
    used = plan(PrecisionSettings(precision="fp16"), remembered=off)
    assert used.fp16_reduced_precision_reduction is False
    assert "fp16_reduced_precision_reduction" in used.remembered_used
    assert left_as_it_comes("fp16_reduced_precision_reduction", True)  # its default
    assert left_as_it_comes("upcast_attention", False) and left_as_it_comes("vae_precision", "auto")
    assert not left_as_it_comes("vae_precision", "bf16")
