"""Qwen-Image (a Qwen2.5-VL text encoder, an MMDiT transformer on packed 2x2 patches with real
CFG, a causal 3D VAE with per-channel latent statistics) on a tiny pipeline built in code: a
diffusers folder loaded offline, the health check with planted fp16 overflows in the Qwen2.5-VL
feed-forward, a block and the VAE, and generation with the NaN watch and a repair. Split files as
ComfyUI keeps them: test_qwenimage_split.py.
"""

from __future__ import annotations

import pytest

from app.core import generation, models
from app.core.errors import HalfSafeError
from app.core.families import QwenImageFamily, family_of
from tests.support.family_helpers import (
    FP16,
    check,
    in_memory,
    offline,  # noqa: F401 - an autouse fixture: no network
    plant_scaled,
    same_weights,
)
from tests.support.tiny_models import build_tiny_qwenimage_pipeline

COMPONENTS = ("text_encoder", "transformer", "vae")
BLOCK_LAYER = "transformer_blocks.0.img_mlp.net.2"
PLANTS = {
    "qwen25_vl": ("text_encoder", "model.language_model.layers.0.mlp.down_proj", 1e6),
    "block": ("transformer", BLOCK_LAYER, 1e6),
    "vae": ("vae", "decoder.up_blocks.0.resnets.0.conv1", 1e6),
}


def plant(pipeline, fault: str):
    return plant_scaled(pipeline, PLANTS, fault)


def loaded(pipeline, key: str):
    return in_memory(pipeline, key, "qwenimage")


@pytest.mark.slow  # about 10 s here: saving and loading a 151,669-token embedding
def test_diffusers_folder_round_trip_offline(tmp_path):
    pipeline = build_tiny_qwenimage_pipeline()
    pipeline.save_pretrained(tmp_path / "qwen-image")

    model = models.load_model(str(tmp_path / "qwen-image"))

    assert (model.architecture, model.format, model.prediction_type) == (
        "qwenimage",
        "diffusers",
        "flow",
    )
    assert model.detected_because.startswith("Qwen-Image: its QwenImagePipeline")
    assert "a Qwen2.5-VL text encoder" in model.detected_because
    assert isinstance(family_of(model.pipeline), QwenImageFamily)
    same_weights(pipeline, model.pipeline, COMPONENTS)


def test_healthy_qwenimage_checks_its_three_components():
    report = check(loaded(build_tiny_qwenimage_pipeline(), "qwenimage-healthy"))

    assert report.verdict == "healthy"
    assert list(report.components) == list(COMPONENTS)
    assert len(report.timesteps) == 3 and report.timesteps[0] == 1000.0


@pytest.mark.parametrize("fault", list(PLANTS))
def test_planted_overflow_is_found_and_only_what_failed_is_fixed(fault):
    component, layer, _ = PLANTS[fault]
    report = check(loaded(plant(build_tiny_qwenimage_pipeline(), fault), f"qwenimage-{fault}"))

    assert report.verdict == "fixable"
    failed = {n for n, c in report.components.items() if c.status in ("overflow", "nan")}
    assert failed == {component}
    assert report.components[component].first_bad_module == layer
    fix = report.fix
    assert fix.verified is True
    tested, fixed = report.plan, fix.plan
    changed = {
        c
        for c in tested.dtypes
        if tested.dtypes[c] != fixed.dtypes[c] or tested.islands(c) != fixed.islands(c)
    }
    assert changed == {component}


def test_generation_repairs_an_overflowing_block(tmp_path):
    pipeline = plant(build_tiny_qwenimage_pipeline(), "block")
    request = generation.GenerationRequest(
        prompt="a red cat", steps=3, cfg=4.0, seed=3, width=64, height=64, output_dir=str(tmp_path)
    )

    result = generation.generate(loaded(pipeline, "qwenimage-generate"), request, precision=FP16)

    image = result.images[0]
    assert (image.status, image.component, image.step) == ("fixed", "transformer", 1)
    assert image.first_bad_module == BLOCK_LAYER
    assert "Sampler: Euler, CFG scale: 4" in image.parameters


def test_generation_repairs_an_overflowing_3d_vae(tmp_path):
    pipeline = plant(build_tiny_qwenimage_pipeline(), "vae")
    request = generation.GenerationRequest(
        prompt="a red cat", steps=2, cfg=4.0, seed=3, width=64, height=64, output_dir=str(tmp_path)
    )

    result = generation.generate(loaded(pipeline, "qwenimage-vae"), request, precision=FP16)

    image = result.images[0]
    assert (image.status, image.component) == ("fixed", "vae")
    assert image.first_bad_module == PLANTS["vae"][1]


def test_a_size_off_the_patch_grid_is_one_sentence(tmp_path):
    request = generation.GenerationRequest(
        prompt="a red cat", steps=2, cfg=4.0, seed=3, width=72, height=64, output_dir=str(tmp_path)
    )

    with pytest.raises(HalfSafeError) as raised:
        generation.generate(
            loaded(build_tiny_qwenimage_pipeline(), "qwenimage-size"), request, precision=FP16
        )

    assert str(raised.value) == (
        "qwenimage-size: this model makes pictures whose sides are multiples of 16 px, not 72x64."
    )
    assert not list(tmp_path.iterdir())
