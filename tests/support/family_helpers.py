"""Shared by the family tests (the conformance tests in test_families.py and each family's own
file): no network, tiny pipelines held in memory as loaded models, planted overflows, and a
quick check."""

from __future__ import annotations

import pytest
import torch

from app.core import health
from app.core.checkpoint import scan_weights
from app.core.health.request import CheckRequest, CheckRun
from app.core.models import LoadedModel
from app.core.settings import PrecisionSettings

FP16 = PrecisionSettings(precision="fp16")


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    """No network and an empty Hugging Face cache: everything must come from the files."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))


def plant_scaled(pipeline, plants: dict[str, tuple[str, str, float]], fault: str):
    """Scale one layer's weights (plants[fault] = component, layer, factor) past fp16."""
    component, layer, factor = plants[fault]
    with torch.no_grad():
        getattr(pipeline, component).get_submodule(layer).weight.mul_(factor)
    return pipeline


def in_memory(pipeline, key: str, architecture: str, prediction_type: str = "flow") -> LoadedModel:
    """A pipeline built in the test, as the loader would hand it over."""
    return LoadedModel(
        pipeline=pipeline,
        source=f"<{key}>",
        name=key,
        format="demo",
        architecture=architecture,
        prediction_type=prediction_type,
        native_size=64,
        stored_dtype="fp32",
        model_hash=None,
        profile_key=key,
        weights=scan_weights(pipeline),
        detected_because="built in a test",
    )


def same_weights(a, b, components) -> None:
    """Every tensor of each component is the same in pipelines `a` and `b`."""
    for component in components:
        mine, theirs = getattr(a, component).state_dict(), getattr(b, component).state_dict()
        assert set(mine) == set(theirs), component
        for key, tensor in mine.items():
            assert torch.equal(tensor, theirs[key]), f"{component}.{key}"


def check(model, precision=FP16):
    return health.check_loaded(
        model,
        CheckRequest(precision=precision, device="cpu", size=64),
        run=CheckRun(remember=False, measure_cost=False),
    )
