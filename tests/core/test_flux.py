"""What only Flux.1 does, on tiny pipelines built in code: schnell told apart from dev, ComfyUI's
split files (Black Forest Labs' layout) with their companions, the flow-matching schedule the
check probes, the T5 island that runs only the feed-forward's `wo` in fp32 (also when
transformers clamps the overflow), and a control-shaped transformer. A diffusers folder, the
health check with planted overflows in the T5 feed-forward, a double block, a single block and
the VAE, and generation repairing a single block are every family's contract:
test_families.py.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from app.core import generation, health, models
from app.core.errors import UnsupportedModelError
from app.core.families import family_of
from app.core.families.flux import FluxFamily
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
PLANTS = {"t5": ("text_encoder_2", T5_LAYER, 1e5)}


def plant(pipeline, fault: str):
    return plant_scaled(pipeline, PLANTS, fault)


def loaded(pipeline, key: str):
    return in_memory(pipeline, key, "flux-dev")


def same_weights(a, b) -> None:
    helpers.same_weights(a, b, COMPONENTS)


# --- loading -------------------------------------------------------------------------------


def test_a_schnell_folder_is_told_from_dev_by_its_missing_guidance_embedding(tmp_path):
    """dev's folder is every family's contract (test_families.py); schnell is dev without the
    guidance embedding."""
    pipeline = build_tiny_flux_pipeline(guidance=False)
    folder = tmp_path / "flux"
    pipeline.save_pretrained(folder)

    model = models.load_model(str(folder))

    assert model.architecture == "flux-schnell"
    assert model.format == "diffusers"
    assert model.prediction_type == "flow"
    assert "FluxTransformer2DModel with 1 double and 2 single blocks" in model.detected_because
    assert "a guidance embedding" not in model.detected_because
    assert isinstance(family_of(model.pipeline), FluxFamily)
    same_weights(pipeline, model.pipeline)


@pytest.mark.parametrize("guidance", [True, False], ids=["dev", "schnell"])
def test_its_transformer_file_is_in_black_forest_labs_layout_dev_or_schnell(tmp_path, guidance):
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


def test_the_check_probes_the_pipelines_own_shifted_sigmas():
    """The check probes what `probe_timesteps` picks (every family's contract); for Flux.1
    that is the first, middle and last sigma of FluxPipeline's own schedule at the user's
    steps, shifted by resolution (x 1000)."""
    model = loaded(build_tiny_flux_pipeline(), "flux-schedule")
    family = family_of(model.pipeline)

    timesteps = family.probe_timesteps(model, health.DEFAULT_STEPS, health.DEFAULT_SCHEDULER, 64)

    sigmas = FluxFamily()._sigmas(model.pipeline, health.DEFAULT_STEPS, 64)
    picked = (sigmas[0], sigmas[len(sigmas) // 2], sigmas[-1])
    assert timesteps == [round(s * 1000, 2) for s in picked]
    assert timesteps[0] == 1000.0 and timesteps[-1] < 100


def test_t5_island_runs_only_wo_in_fp32_and_leaves_the_loaded_model_alone():
    pipeline = build_tiny_flux_pipeline()
    islands = {"text_encoder_2": {T5_LAYER: "fp32"}}
    plan = resolve_plan(
        PrecisionSettings(precision="fp16", t5_fp32_feed_forward=True),
        device="cpu",
        components=["text_encoder", "text_encoder_2", "transformer", "vae"],
        own_islands={"text_encoder_2": {"t5_fp32_feed_forward": islands["text_encoder_2"]}},
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


def test_a_control_shaped_transformer_is_named_as_not_text_to_image():
    pipeline = build_tiny_flux_pipeline()
    family = family_of(pipeline)
    assert family.text_to_image_problem(pipeline) is None

    # Flux.1 Depth and Canny take a control picture's latents beside the noise: 128 channels.
    # (Fill, 384, is a model of its own: test_flux_fill.py.)
    pipeline.transformer.register_to_config(in_channels=128)

    problem = family.text_to_image_problem(pipeline)
    assert problem is not None
    assert "takes 128 input channels" in problem and "takes 64" in problem
    assert "Depth or Canny" in problem


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
