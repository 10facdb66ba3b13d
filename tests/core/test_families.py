"""The contract every family in the registry keeps, one row per family: a family added to
`app.core.families` without its row here fails `test_every_family_has_a_row`.

Each row names the tiny pipeline of that family (`tests/support/tiny_models.py`); the contract
is what the rest of HalfSafe relies on without naming a family: the registry recognises the
pipeline, its diffusers folder and (where the family keeps one) its transformer file in its own
key layout, the latent format matches the VAE, and an architecture name reads back to the
family with a title. Loading, checking and generating each family run in its own test file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch

from app.core import architecture, split
from app.core.families import (
    FAMILIES,
    FamilyId,
    architecture_title,
    family,
    family_of,
    family_of_architecture,
)
from app.core.layouts import to_diffusers, to_original
from tests.support import tiny_models


@dataclass(frozen=True)
class Row:
    build: Any  # () -> the family's tiny pipeline
    architecture: str  # what detection calls that pipeline


ROWS: dict[FamilyId, Row] = {
    FamilyId.SD: Row(tiny_models.build_tiny_sd_pipeline, "sd1"),
    FamilyId.SDXL: Row(tiny_models.build_tiny_sdxl_pipeline, "sdxl"),
    FamilyId.FLUX: Row(tiny_models.build_tiny_flux_pipeline, "flux-dev"),
    FamilyId.CHROMA: Row(tiny_models.build_tiny_chroma_pipeline, "chroma"),
    FamilyId.SD3: Row(tiny_models.build_tiny_sd3_pipeline, "sd3"),
    FamilyId.ZIMAGE: Row(tiny_models.build_tiny_zimage_pipeline, "zimage"),
    FamilyId.QWENIMAGE: Row(tiny_models.build_tiny_qwenimage_pipeline, "qwenimage"),
}
IDS = [f.id for f in FAMILIES]


def test_every_family_has_a_row():
    assert set(ROWS) == {f.id for f in FAMILIES} == set(FamilyId)
    assert len(FAMILIES) == len(set(IDS))


@pytest.fixture(scope="module", params=IDS, ids=lambda i: i.value)
def built(request):
    """(family, its tiny pipeline), built once per family for this module."""
    return family(request.param), ROWS[request.param].build()


def test_the_registry_recognises_the_familys_pipeline(built):
    expected, pipeline = built
    assert family_of(pipeline) is expected
    assert [f for f in FAMILIES if f.owns(pipeline)] == [expected]  # no other family claims it


def test_the_latent_format_is_the_vaes(built):
    expected, pipeline = built
    config = pipeline.vae.config
    channels = config.get("latent_channels") or config.get("z_dim")
    assert expected.latent.channels == channels
    factors = expected.latent.rgb_factors
    assert factors is None or len(factors) == channels


def test_an_architecture_name_reads_back_to_its_family_with_a_title(built):
    expected, _ = built
    name = ROWS[expected.id].architecture
    assert family_of_architecture(name) is expected
    assert architecture_title(name) not in ("", name)
    for own in expected.architectures:
        assert family_of_architecture(own) is expected


def test_a_diffusers_folder_of_the_family_is_detected_as_it(built):
    expected, pipeline = built
    denoiser = getattr(pipeline, expected.denoiser)
    index: dict[str, Any] = {"_class_name": type(pipeline).__name__}
    for name, part in pipeline.components.items():
        if part is not None:
            index[name] = [type(part).__module__.split(".")[0], type(part).__name__]
    scheduler = dict(pipeline.scheduler.config)

    detection = architecture.detect_from_configs(index, dict(denoiser.config), scheduler)

    assert detection.supported, detection.because
    assert family_of_architecture(detection.architecture) is expected
    assert detection.pipeline_class == type(pipeline).__name__
    assert detection.because.endswith(".")


def test_a_transformer_file_in_the_familys_layout_is_read_as_it(built):
    """The layout's key table maps both ways with identical tensors, and a file in it is told
    apart from every other family's (Chroma carries all of Flux.1's keys, and more)."""
    expected, pipeline = built
    if expected.layout is None:
        assert expected.transformer_class is None  # a UNet family: single files, see models
        return
    transformer = pipeline.transformer
    config = {**transformer.config, "_class_name": type(transformer).__name__}
    state = transformer.state_dict()

    original = to_original(expected.layout.table(config), state)
    model = split.read_model({k: tuple(v.shape) for k, v in original.items()})

    assert model is not None and model.layout == expected.id.value
    assert family_of_architecture(model.architecture) is expected
    assert set(expected.companion_names) == {n.component for n in model.needs}
    back = to_diffusers(model.rows(), original, {k: tuple(v.shape) for k, v in state.items()})
    assert set(back) == set(state)
    assert all(torch.equal(back[k], v) for k, v in state.items())


def test_a_pipeline_of_no_family_is_refused_naming_every_family_there_is():
    detection = architecture.detect_from_configs({"_class_name": "WanPipeline"}, {}, {})

    assert not detection.supported and "WanPipeline" in detection.because
    assert all(f.title in detection.because for f in FAMILIES)
