"""The `autocast` precision: AUTOMATIC1111's default (fp16 weights under torch.autocast), what it
resolves to, where it applies, and what it really changes, measured on this machine's PyTorch."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from app.core.families import family_of
from app.core.fixing import job_plans
from app.core.precision import (
    PlacedPipeline,
    autocast_upcasts_norms,
    backend_flags,
    resolve_plan,
)
from app.core.settings import FIELDS, PrecisionSettings
from tests.support.tiny_models import build_tiny_sd_pipeline

SD = ("text_encoder", "unet", "vae")


def autocast_plan(device="cpu", **settings):
    return resolve_plan(
        PrecisionSettings(precision="autocast", **settings), device=device, components=SD
    )


def test_autocast_is_a_choice_of_the_base_precision_only():
    assert "autocast" in FIELDS["precision"].choices
    assert "autocast" not in FIELDS["unet_precision"].choices
    with pytest.raises(ValueError):
        PrecisionSettings(vae_precision="autocast")


def test_autocast_resolves_to_fp16_weights_with_the_flag_and_says_so():
    plan = autocast_plan(device="cuda")
    assert dict(plan.dtypes) == dict.fromkeys(SD, "fp16")
    assert plan.autocast and plan.autocast_active
    assert "AUTOMATIC1111" in plan.reasons["precision"]
    assert plan.effective_settings()["precision"] == "autocast"
    assert plan.tested()["autocast"] is True
    assert not plan.warnings  # on a GPU autocast means what it means in A1111


def test_fixes_and_overrides_keep_their_own_dtypes_outside_autocast():
    plan = autocast_plan(device="cuda", no_half_vae=True)
    assert plan.dtypes["vae"] == "fp32" and plan.dtypes["unet"] == "fp16"
    assert plan.effective_settings()["precision"] == "autocast"
    everything = autocast_plan(device="cuda", no_half=True)
    assert not everything.autocast_active  # nothing is left in fp16 for autocast to act on
    assert everything.effective_settings()["precision"] == "fp32"
    reference = job_plans.fp32_reference(plan)
    assert not reference.autocast and set(reference.dtypes.values()) == {"fp32"}


def test_on_a_cpu_autocast_is_honest_that_it_runs_like_fp16():
    # Measured, not assumed: PyTorch 2.13's CPU autocast has no fp32 softmax or norm.
    x = torch.ones(2, 8, dtype=torch.float16)
    with torch.autocast("cpu", dtype=torch.float16):
        cpu_norm_dtype = torch.nn.functional.layer_norm(x, (8,)).dtype
        cpu_softmax_dtype = torch.softmax(x, -1).dtype
    assert autocast_upcasts_norms("cpu") == (cpu_norm_dtype == torch.float32)
    plan = autocast_plan(device="cpu")
    assert plan.autocast and plan.dtypes["unet"] == "fp16"
    if cpu_norm_dtype == torch.float16 and cpu_softmax_dtype == torch.float16:
        assert any("runs like plain fp16" in w for w in plan.warnings)
    else:  # a later PyTorch upcasts on the CPU too: then the warning would be untrue
        assert not any("runs like plain fp16" in w for w in plan.warnings)


def _runs_under_autocast(module) -> list[bool]:
    seen: list[bool] = []
    module.register_forward_hook(lambda *_: seen.append(torch.is_autocast_enabled("cpu")))
    return seen


def test_only_the_fp16_components_run_under_autocast():
    source = build_tiny_sd_pipeline()
    plan = autocast_plan(device="cpu", no_half_vae=True)
    placed = PlacedPipeline(source, plan)
    unet_seen = _runs_under_autocast(placed["unet"].conv_in)
    encoder_seen = _runs_under_autocast(placed["text_encoder"].final_layer_norm)
    vae_seen = _runs_under_autocast(placed["vae"].decoder.conv_in)
    with backend_flags(plan), torch.inference_mode():
        text = placed["text_encoder"](torch.tensor([[49406, 49407] + [49407] * 75]))[0]
        latents = placed["unet"](torch.zeros(1, 4, 8, 8), 1, text).sample
        image = placed["vae"].decode(latents).sample
    assert torch.isfinite(image).all() and image.dtype == torch.float32
    assert encoder_seen and all(encoder_seen)
    assert unet_seen and all(unet_seen)
    assert vae_seen == [False]  # the fp32 VAE stays fp32: autocast would cast its convs to fp16
    assert not torch.is_autocast_enabled("cpu")  # nothing left switched on after the job

    # The same placed copies under a plan without autocast: the hooks stand down.
    plain = dataclasses.replace(plan, autocast=False)
    placed.apply(plain)
    unet_seen.clear()
    with backend_flags(plain), torch.inference_mode():
        placed["unet"](torch.zeros(1, 4, 8, 8, dtype=torch.float16), 1, torch.zeros(1, 77, 32))
    assert unet_seen == [False]


def test_autocast_leaves_no_state_behind_when_a_component_fails():
    source = build_tiny_sd_pipeline()
    placed = PlacedPipeline(source, autocast_plan(device="cpu"))
    with pytest.raises(RuntimeError):
        placed["unet"](torch.zeros(1, 3, 8, 8), 1, torch.zeros(1, 77, 32))  # wrong channels
    assert not torch.is_autocast_enabled("cpu")


def test_what_autocast_changes_on_this_cpu_is_measured():
    """On a CPU, fp16 weights under autocast give the same text embeddings as plain fp16, bit
    for bit, because every op that would differ (softmax, layer norm) stays fp16 there."""
    source = build_tiny_sd_pipeline()
    fp16 = resolve_plan(PrecisionSettings(precision="fp16"), device="cpu", components=SD)
    autocast = autocast_plan(device="cpu")
    outputs = []
    for plan in (fp16, autocast):
        placed = PlacedPipeline(source, plan)
        with backend_flags(plan), torch.inference_mode():
            tensors = family_of(source).encode(placed.pipeline(), "a (cat:1.2)", "", "cpu", True)
        outputs.append(tensors["prompt_embeds"])
    if autocast_upcasts_norms("cpu"):
        assert outputs[1].dtype == torch.float32
    else:
        assert outputs[1].dtype == torch.float16
        assert torch.equal(outputs[0], outputs[1])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_a_norm_past_65504_stays_finite_under_autocast():
    """What autocast really changes on a GPU: a layer norm runs (and returns) fp32, so a norm
    whose output passes 65504 (its weight planted large) is finite under autocast and inf in
    plain fp16. The text encoder ends in such a norm, so its embeddings stay finite."""
    source = build_tiny_sd_pipeline()
    source.text_encoder = copy.deepcopy(source.text_encoder)
    with torch.no_grad():
        source.text_encoder.final_layer_norm.weight.fill_(6e4)  # fits fp16; its output does not
    results = {}
    for name in ("fp16", "autocast"):
        plan = resolve_plan(PrecisionSettings(precision=name), device="cuda", components=SD)
        placed = PlacedPipeline(source, plan)
        with backend_flags(plan), torch.inference_mode():
            tensors = family_of(source).encode(placed.pipeline(), "a cat", "", "cuda", True)
        results[name] = tensors["prompt_embeds"]
    assert not torch.isfinite(results["fp16"]).all()
    assert results["autocast"].dtype == torch.float32
    assert torch.isfinite(results["autocast"]).all()


@pytest.mark.slow  # about 12 s on a 2-core CPU: fp16 convolutions are slow there
def test_a_generation_under_autocast_says_so_in_the_png_and_the_json(tmp_path, capsys):
    import json

    from app.cli import main
    from app.core.images.finished import read_parameters
    from app.core.words.infotext import split_text

    argv = ["generate", "demo", "--precision", "autocast", "--device", "cpu", "--steps", "1"]
    argv += ["--width", "64", "--height", "64", "--out", str(tmp_path), "--json"]
    assert main([*argv, "--prompt", "a (red fox:1.3) BREAK snow"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["settings"]["precision"] == "autocast"
    assert any("runs like plain fp16" in w for w in result["warnings"])
    prompt, _, params = split_text(read_parameters(result["images"][0]["path"]))
    assert prompt == "a (red fox:1.3) BREAK snow"
    assert (params["Precision"], params["UNet precision"], params["RNG"]) == (
        "autocast",
        "fp16",
        "CPU",
    )


def test_the_checks_words_name_autocast():
    from app.core.health import tested_words

    assert tested_words(autocast_plan(device="cuda")) == "fp16 everywhere, under autocast"
    assert tested_words(autocast_plan(device="cuda", no_half_vae=True)) == (
        "fp16 under autocast, VAE in fp32"
    )
    assert tested_words(autocast_plan(device="cuda", no_half=True)) == "fp32 everywhere"
