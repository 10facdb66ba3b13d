"""Flux.1 (dev and schnell) end to end on tiny pipelines built in code: loading as users keep
it (a diffusers folder, ComfyUI's split files), the health check with planted fp16 overflows
in the T5 feed-forward, a double block, a single block and the VAE, and generation with the
NaN watch and a repair.

Each plant scales one layer's weights so that its output passes 65504 in fp16 while staying
finite in fp32: the check must name that component and that layer, fix only what failed, and
prove the fix against fp32.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from app.core import generation, health, models
from app.core.errors import UnsupportedModelError
from app.core.families import FluxFamily, family_of
from app.core.precision import PlacedPipeline, resolve_plan
from app.core.settings import PrecisionSettings
from tests.support import family_helpers as helpers
from tests.support.family_helpers import (
    FP16,
    check,
    in_memory,
    offline,  # noqa: F401 - an autouse fixture: no network
    plant_scaled,
)
from tests.support.model_files import save_split_files
from tests.support.tiny_models import build_tiny_flux_pipeline

COMPONENTS = ("transformer", "text_encoder", "text_encoder_2", "vae")
T5_LAYER = "encoder.block.0.layer.1.DenseReluDense.wo"
DOUBLE_LAYER = "transformer_blocks.0.ff.net.2"
SINGLE_LAYER = "single_transformer_blocks.1.proj_out"
VAE_LAYER = "decoder.up_blocks.0.resnets.0.conv1"
PLANTS = {
    "t5": ("text_encoder_2", T5_LAYER, 1e5),
    "double_block": ("transformer", DOUBLE_LAYER, 1e5),
    "single_block": ("transformer", SINGLE_LAYER, 1e5),
    "vae": ("vae", VAE_LAYER, 1e6),
}


def plant(pipeline, fault: str):
    return plant_scaled(pipeline, PLANTS, fault)


def loaded(pipeline, key: str):
    return in_memory(pipeline, key, "flux-dev")


def same_weights(a, b) -> None:
    helpers.same_weights(a, b, COMPONENTS)


# --- loading -------------------------------------------------------------------------------


@pytest.mark.parametrize("guidance", [True, False], ids=["dev", "schnell"])
def test_diffusers_folder_round_trip_offline(tmp_path, guidance):
    pipeline = build_tiny_flux_pipeline(guidance=guidance)
    folder = tmp_path / "flux"
    pipeline.save_pretrained(folder)

    model = models.load_model(str(folder))

    assert model.architecture == ("flux-dev" if guidance else "flux-schnell")
    assert model.format == "diffusers"
    assert model.prediction_type == "flow"
    assert "FluxTransformer2DModel with 1 double and 2 single blocks" in model.detected_because
    assert ("a guidance embedding" in model.detected_because) is guidance
    assert isinstance(family_of(model.pipeline), FluxFamily)
    same_weights(pipeline, model.pipeline)


@pytest.mark.parametrize("guidance", [True, False], ids=["dev", "schnell"])
def test_split_files_round_trip_offline_with_identical_weights_and_outputs(tmp_path, guidance):
    pipeline = build_tiny_flux_pipeline(guidance=guidance)
    written = save_split_files(pipeline, tmp_path / "models", "flux1-tiny")
    # The transformer file is in Black Forest Labs' layout, as ComfyUI users download it.
    header = models.read_safetensors_header(written["transformer"]).shapes()
    assert "double_blocks.0.img_attn.qkv.weight" in header
    assert "single_blocks.1.linear1.weight" in header
    assert ("guidance_in.in_layer.weight" in header) is guidance

    model = models.load_model(str(written["transformer"]))  # companions found beside it

    assert model.format == "split_files"
    assert model.architecture == ("flux-dev" if guidance else "flux-schnell")
    assert "Black Forest Labs' layout" in model.detected_because
    same_weights(pipeline, model.pipeline)
    # Same weights is not enough: the config read from the shapes must run them the same way.
    config = pipeline.transformer.config
    inputs = {
        "hidden_states": torch.randn(1, 16, config.in_channels),
        "encoder_hidden_states": torch.randn(1, 5, config.joint_attention_dim),
        "pooled_projections": torch.randn(1, config.pooled_projection_dim),
        "timestep": torch.tensor([0.5]),
        "img_ids": torch.rand(16, 3) * 4,
        "txt_ids": torch.zeros(5, 3),
        "guidance": torch.tensor([3.5]) if guidance else None,
    }
    with torch.no_grad():
        expected = pipeline.transformer(**inputs).sample
        got = model.pipeline.transformer(**inputs).sample
    assert torch.equal(expected, got)


def test_split_files_given_by_flag_load_from_anywhere(tmp_path):
    pipeline = build_tiny_flux_pipeline()
    written = save_split_files(pipeline, tmp_path / "models")
    lone = tmp_path / "elsewhere" / "flux.safetensors"
    lone.parent.mkdir()
    written["transformer"].rename(lone)

    model = models.load_model(
        str(lone),
        text_encoders=[str(written["text_encoder_2"]), str(written["text_encoder"])],
        vae=str(written["vae"]),
    )

    same_weights(pipeline, model.pipeline)


def test_split_file_with_a_missing_companion_says_which_in_one_sentence(tmp_path):
    written = save_split_files(build_tiny_flux_pipeline(), tmp_path / "models")
    written["text_encoder_2"].unlink()

    with pytest.raises(UnsupportedModelError) as caught:
        models.load_model(str(written["transformer"]))

    message = str(caught.value)
    assert str(written["transformer"]) in message
    assert "needs its T5 text encoder (t5xxl)" in message
    assert "--text-encoder PATH" in message and "--vae" not in message
    assert "text_encoders" in message
    assert message.count(". ") == 0 and message.endswith(".")


def test_cli_missing_companion_is_exit_2_with_one_line(tmp_path):
    written = save_split_files(build_tiny_flux_pipeline(), tmp_path / "models")
    written["vae"].unlink()

    done = subprocess.run(
        [sys.executable, "-m", "app", "check", str(written["transformer"]), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "needs its 16-channel VAE (ae)" in lines[0]
    assert "Traceback" not in done.stderr


# --- the health check ----------------------------------------------------------------------


def test_healthy_flux_probes_the_flow_matching_schedule():
    model = loaded(build_tiny_flux_pipeline(), "flux-healthy")
    report = check(model)

    assert report.verdict == "healthy"
    assert list(report.components) == ["text_encoder", "text_encoder_2", "transformer", "vae"]
    # First, middle and last sigma of FluxPipeline's own schedule at the user's steps (x 1000).
    sigmas = FluxFamily()._sigmas(model.pipeline, health.DEFAULT_STEPS, 64)
    picked = (sigmas[0], sigmas[len(sigmas) // 2], sigmas[-1])
    assert report.timesteps == [round(s * 1000, 2) for s in picked]
    assert report.timesteps[0] == 1000.0 and report.timesteps[-1] < 100


@pytest.mark.parametrize("fault", list(PLANTS))
def test_planted_overflow_is_found_and_only_what_failed_is_fixed(fault):
    component, layer, _ = PLANTS[fault]
    report = check(loaded(plant(build_tiny_flux_pipeline(), fault), f"flux-{fault}"))

    assert report.verdict == "fixable"
    failed = {n for n, c in report.components.items() if c.status in ("overflow", "nan")}
    assert failed == {component}
    bad = report.components[component]
    assert bad.status == "overflow"
    assert bad.first_bad_module == layer
    fix = report.fix
    assert fix.verified is True and fix.quality.passed
    tested, fixed = report.plan, fix.plan
    changed = {
        c
        for c in tested.dtypes
        if tested.dtypes[c] != fixed.dtypes[c] or tested.islands(c) != fixed.islands(c)
    }
    assert changed == {component}
    document = report.to_json()["fix"]
    if fault == "t5":
        # The known T5 fix is found and verified: only the feed-forward output projections...
        (known,) = [c for c in fix.candidates if c.kind == "t5_feed_forward"]
        assert known.verified and known.settings == {"t5_fp32_feed_forward": True}
        assert known.candidate.plan.islands(component) == {
            "encoder.block.0.layer.1.DenseReluDense.wo": "fp32",
            "encoder.block.1.layer.1.DenseReluDense.wo": "fp32",
        }
        # ...and the fix chosen keeps the T5 in fp16 with a few layers wider, the overflowing
        # one among them (where bf16 is native, the layers measured hot, in bf16: less memory).
        assert fixed.dtypes[component] == "fp16"
        assert T5_LAYER in document["modules"][component]
        assert len(document["modules"][component]) <= 4
    else:  # the component wider, or only its overflowing layers
        assert fixed.dtypes[component] in ("bf16", "fp32") or fixed.islands(component)
        assert set(document["modules"]) <= {component}

    # Proof by re-running: the whole check under the fix's settings is healthy.
    settings = PrecisionSettings.from_mapping({**FP16.to_dict(), **fix.settings})
    again = check(loaded(plant(build_tiny_flux_pipeline(), fault), f"flux-{fault}-2"), settings)
    assert again.verdict == "healthy"


def test_t5_island_runs_only_wo_in_fp32_and_leaves_the_loaded_model_alone():
    pipeline = build_tiny_flux_pipeline()
    islands = {"text_encoder_2": {T5_LAYER: "fp32"}}
    plan = resolve_plan(
        PrecisionSettings(precision="fp16", t5_fp32_feed_forward=True),
        device="cpu",
        components=["text_encoder", "text_encoder_2", "transformer", "vae"],
        feed_forward_islands=islands,
    )
    assert plan.modules == islands
    placed = PlacedPipeline(pipeline, plan)

    t5 = placed["text_encoder_2"]
    assert t5.get_submodule(T5_LAYER).weight.dtype == torch.float32
    assert t5.get_submodule("encoder.block.0.layer.1.DenseReluDense.wi_0").weight.dtype == (
        torch.float16
    )
    assert pipeline.text_encoder_2.get_submodule(T5_LAYER).weight.dtype == torch.float32
    assert pipeline.text_encoder_2.shared.weight.dtype == torch.float32  # source untouched
    assert plan.effective_settings()["t5_fp32_feed_forward"] is True
    placed.apply(plan.with_modules("text_encoder_2", {}))
    assert placed["text_encoder_2"].get_submodule(T5_LAYER).weight.dtype == torch.float16


# --- generation ----------------------------------------------------------------------------


def test_generation_watches_repairs_and_names_the_flux_sampler(tmp_path):
    pipeline = build_tiny_flux_pipeline()
    with torch.no_grad():
        pipeline.transformer.get_submodule(SINGLE_LAYER).weight.mul_(1e6)
    request = generation.GenerationRequest(
        prompt="a red cat", steps=4, cfg=3.5, seed=7, width=64, height=64, output_dir=str(tmp_path)
    )

    result = generation.generate(
        loaded(pipeline, "flux-generate"), request, precision=FP16, device="cpu"
    )

    image = result.images[0]
    assert image.status == "fixed"
    assert image.component == "transformer"
    assert image.step == 1
    assert image.first_bad_module == SINGLE_LAYER
    assert image.fixes_applied and "transformer" in image.fixes_applied[0]
    assert image.non_finite == 0
    text = image.parameters
    assert "Sampler: Euler," in text and "NaN component: transformer" in text
    assert "CFG scale: 1, Distilled CFG Scale: 3.5" in text
    assert any("does not apply" in w for w in result.warnings)  # the default DPM++ 2M Karras
    assert json.loads(json.dumps(result.to_json()))["images"][0]["status"] == "fixed"


def test_library_lists_a_split_transformer_with_its_companions_or_what_is_missing(tmp_path):
    from app.core.library import scan_library

    written = save_split_files(build_tiny_flux_pipeline(), tmp_path / "models")
    folder = str(tmp_path / "models" / "diffusion_models")

    (entry,) = scan_library([folder], include_defaults=False, use_cache=False)

    assert (entry.format, entry.architecture, entry.supported) == ("split_files", "flux-dev", True)
    assert entry.companions == {
        "text_encoder": str(written["text_encoder"]),
        "text_encoder_2": str(written["text_encoder_2"]),
        "vae": str(written["vae"]),
    }
    assert entry.missing is None

    written["vae"].unlink()
    (entry,) = scan_library([folder], include_defaults=False, use_cache=False)

    assert entry.supported is False and entry.companions["vae"] is None
    assert "needs its 16-channel VAE (ae)" in entry.missing


def test_generation_catches_a_clamped_t5_overflow_and_keeps_only_wo_in_fp32(tmp_path):
    # transformers clamps T5's fp16 overflow to 65504, so the embeddings come out finite and
    # wrong: the watch must see the clamp, and the repair must be the T5 feed-forward island.
    pipeline = plant(build_tiny_flux_pipeline(), "t5")
    request = generation.GenerationRequest(
        prompt="a red cat", steps=2, cfg=3.5, seed=5, width=64, height=64, output_dir=str(tmp_path)
    )

    result = generation.generate(loaded(pipeline, "flux-t5"), request, precision=FP16, device="cpu")

    image = result.images[0]
    assert (image.status, image.component) == ("fixed", "text_encoder_2")
    assert image.first_bad_module == T5_LAYER
    assert image.fix == {"t5_fp32_feed_forward": True}
    assert image.settings["text_encoder_2_precision"] == "fp16"


def test_a_fill_shaped_transformer_is_named_as_not_text_to_image():
    pipeline = build_tiny_flux_pipeline()
    family = family_of(pipeline)
    assert family.text_to_image_problem(pipeline) is None

    # Flux.1 Fill takes the masked image and the mask beside the noise: 384 input channels.
    pipeline.transformer.register_to_config(in_channels=384)

    problem = family.text_to_image_problem(pipeline)
    assert problem is not None
    assert "takes 384 input channels" in problem and "takes 64" in problem and "Fill" in problem


def test_nan_in_the_t5_weights_leaves_the_transformer_and_vae_victims_as_on_sd3():
    """The same mechanism as every family: Flux's T5 (its second text encoder) with a NaN
    weight makes the transformer and the VAE victims, not culprits."""
    pipeline = build_tiny_flux_pipeline()
    with torch.no_grad():
        pipeline.text_encoder_2.get_submodule(T5_LAYER).weight[0, 0] = float("nan")
    report = check(in_memory(pipeline, "flux-nan-t5", "flux-dev"))

    assert report.verdict == "broken"
    assert f"text_encoder_2.{T5_LAYER}.weight" in report.headline
    assert report.components["text_encoder_2"].status == "broken_weights"
    for name in ("transformer", "vae"):
        victim = report.components[name]
        assert (victim.status, victim.fed_by) == ("ok", "text_encoder_2")
