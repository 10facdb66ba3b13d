"""SD3.5 (MMDiT, CLIP-L + CLIP-G + T5-XXL) on a tiny pipeline built in code: a diffusers folder
loaded offline, the health check over all five components with planted fp16 overflows in the T5
feed-forward (the third text encoder), a joint block and the VAE, and generation with the NaN
watch and a repair. Split files in the original SD3 layout are not supported yet (see README).
"""

from __future__ import annotations

import pytest
import torch

from app.core import generation, models
from app.core.demo import build_tiny_sd3_pipeline
from app.core.families import SD3Family, family_of
from tests.core.family_helpers import (
    FP16,
    check,
    in_memory,
    offline,  # noqa: F401 - an autouse fixture: no network
    plant_scaled,
)

COMPONENTS = ("text_encoder", "text_encoder_2", "text_encoder_3", "transformer", "vae")
T5_LAYER = "encoder.block.0.layer.1.DenseReluDense.wo"
BLOCK_LAYER = "transformer_blocks.0.ff.net.2"
VAE_LAYER = "decoder.up_blocks.0.resnets.0.conv1"
PLANTS = {
    "t5": ("text_encoder_3", T5_LAYER, 1e5),
    "joint_block": ("transformer", BLOCK_LAYER, 1e6),
    "vae": ("vae", VAE_LAYER, 1e6),
}


def plant(pipeline, fault: str):
    return plant_scaled(pipeline, PLANTS, fault)


def loaded(pipeline, key: str):
    return in_memory(pipeline, key, "sd3")


@pytest.mark.slow  # about 20 s here: writing and reading five components
def test_diffusers_folder_round_trip_offline(tmp_path):
    pipeline = build_tiny_sd3_pipeline()
    pipeline.save_pretrained(tmp_path / "sd35")

    model = models.load_model(str(tmp_path / "sd35"))

    assert (model.architecture, model.format, model.prediction_type) == (
        "sd3",
        "diffusers",
        "flow",
    )
    assert model.detected_because.startswith("SD3.5 Large-shaped")
    assert "2 joint blocks" in model.detected_because
    assert "CLIP-L, CLIP-G and T5 text encoders" in model.detected_because
    assert isinstance(family_of(model.pipeline), SD3Family)
    for component in COMPONENTS:
        mine = getattr(pipeline, component).state_dict()
        theirs = getattr(model.pipeline, component).state_dict()
        assert set(mine) == set(theirs)
        assert all(torch.equal(v, theirs[k]) for k, v in mine.items()), component


def test_healthy_sd35_checks_all_three_text_encoders():
    report = check(loaded(build_tiny_sd3_pipeline(), "sd3-healthy"))

    assert report.verdict == "healthy"
    assert list(report.components) == list(COMPONENTS)
    assert report.timesteps[0] == 1000.0 and len(report.timesteps) == 3
    assert report.to_json()["tested"]["text_encoder_3"] == "fp16"


@pytest.mark.parametrize("fault", list(PLANTS))
def test_planted_overflow_is_found_and_only_what_failed_is_fixed(fault):
    component, layer, _ = PLANTS[fault]
    report = check(loaded(plant(build_tiny_sd3_pipeline(), fault), f"sd3-{fault}"))

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
    if fault == "t5":
        assert fix.settings == {"t5_fp32_feed_forward": True}
        assert set(report.to_json()["fix"]["modules"]) == {"text_encoder_3"}


def test_generation_repairs_an_overflowing_joint_block(tmp_path):
    pipeline = plant(build_tiny_sd3_pipeline(), "joint_block")
    request = generation.GenerationRequest(
        prompt="a red cat", steps=3, cfg=4.5, seed=3, width=64, height=64, output_dir=str(tmp_path)
    )

    result = generation.generate(loaded(pipeline, "sd3-generate"), request, precision=FP16)

    image = result.images[0]
    assert (image.status, image.component, image.step) == ("fixed", "transformer", 1)
    assert image.first_bad_module == BLOCK_LAYER
    assert "Text encoder 3 precision: fp16" in image.parameters
