"""Chroma (Flux-shaped, T5 as its only text encoder, real CFG) on a tiny pipeline built in code:
a diffusers folder loaded offline, the health check with planted fp16 overflows in the T5
feed-forward, a double and a single block and the VAE, and generation with the NaN watch and a
repair. Chroma's single-file/split layout is not supported yet (see README).
"""

from __future__ import annotations

import pytest
import torch

from app.core import generation, models
from app.core.demo import build_tiny_chroma_pipeline
from app.core.families import ChromaFamily, family_of
from tests.core.family_helpers import (
    FP16,
    check,
    in_memory,
    offline,  # noqa: F401 - an autouse fixture: no network
    plant_scaled,
)

COMPONENTS = ("text_encoder", "transformer", "vae")
SINGLE_LAYER = "single_transformer_blocks.1.proj_out"
PLANTS = {
    "t5": ("text_encoder", "encoder.block.0.layer.1.DenseReluDense.wo", 1e5),
    "double_block": ("transformer", "transformer_blocks.0.ff.net.2", 1e6),
    "single_block": ("transformer", SINGLE_LAYER, 1e6),
    "vae": ("vae", "decoder.up_blocks.0.resnets.0.conv1", 1e6),
}


def plant(pipeline, fault: str):
    return plant_scaled(pipeline, PLANTS, fault)


def loaded(pipeline, key: str):
    return in_memory(pipeline, key, "chroma")


def test_diffusers_folder_round_trip_offline(tmp_path):
    pipeline = build_tiny_chroma_pipeline()
    pipeline.save_pretrained(tmp_path / "chroma")

    model = models.load_model(str(tmp_path / "chroma"))

    assert (model.architecture, model.format, model.prediction_type) == (
        "chroma",
        "diffusers",
        "flow",
    )
    assert model.detected_because.startswith("Chroma: its ChromaPipeline")
    assert "a T5 text encoder only" in model.detected_because
    assert isinstance(family_of(model.pipeline), ChromaFamily)
    for component in COMPONENTS:
        mine = getattr(pipeline, component).state_dict()
        theirs = getattr(model.pipeline, component).state_dict()
        assert set(mine) == set(theirs)
        assert all(torch.equal(v, theirs[k]) for k, v in mine.items()), component


@pytest.mark.parametrize("fault", list(PLANTS))
def test_planted_overflow_is_found_and_only_what_failed_is_fixed(fault):
    component, layer, _ = PLANTS[fault]
    report = check(loaded(plant(build_tiny_chroma_pipeline(), fault), f"chroma-{fault}"))

    assert list(report.components) == list(COMPONENTS)
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
        assert fixed.dtypes["text_encoder"] == "fp16"


def test_generation_repairs_an_overflowing_single_block(tmp_path):
    pipeline = plant(build_tiny_chroma_pipeline(), "single_block")
    request = generation.GenerationRequest(
        prompt="a red cat", steps=3, cfg=5.0, seed=3, width=64, height=64, output_dir=str(tmp_path)
    )

    result = generation.generate(loaded(pipeline, "chroma-generate"), request, precision=FP16)

    image = result.images[0]
    assert (image.status, image.component, image.step) == ("fixed", "transformer", 1)
    assert image.first_bad_module == SINGLE_LAYER
    assert "Sampler: Euler, CFG scale: 5" in image.parameters
