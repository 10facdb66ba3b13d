"""Tiny SD1.x models for the generation tests: a loaded model sharing a base pipeline's
components but the replaced ones, one with no weight scan, and a stand-in UNet whose output goes
NaN."""

from __future__ import annotations

import torch

from app.core.checkpoint import WeightScan
from app.core.models import LoadedModel
from tests.support.tiny_models import build_tiny_sd_pipeline

PROMPT = "a lighthouse at night, storm"


def tiny_model() -> LoadedModel:
    return LoadedModel(
        pipeline=build_tiny_sd_pipeline(),
        source="<tiny>",
        name="tiny",
        format="demo",
        architecture="sd1",
        prediction_type="epsilon",
        native_size=64,
        stored_dtype="fp32",
        model_hash=None,
        profile_key="tiny-hires",
        weights=WeightScan([], 0, 0, 0.0),
        detected_because="built in a test",
    )


def variant(base, key: str = "tiny", **replacements) -> LoadedModel:
    """A pipeline sharing `base`'s components except the replaced ones."""
    pipeline = type(base)(**{**base.components, **replacements})
    return LoadedModel(
        pipeline=pipeline,
        source=f"<{key}>",
        name=key,
        format="demo",
        architecture="sd1",
        prediction_type="epsilon",
        native_size=64,
        stored_dtype="fp32",
        model_hash="abcdef1234",
        profile_key=key,
        weights=WeightScan([], 0, 0, 0.0),
        detected_because="built in a test",
    )


class Poisoned(torch.nn.Module):
    """A stand-in UNet whose output for image 1 of 2 goes NaN from its third call on."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(1))
        self.calls = 0

    def forward(self, sample, timestep, encoder_hidden_states=None, return_dict=True):
        self.calls += 1
        out = sample * self.weight
        if self.calls >= 3:
            out = out.clone()
            out[1] = float("nan")  # uncond half of image 1
        return (out,)
