"""The lean recorder gives the check's answers bit for bit: a check that records components by
their outputs alone (and, where one goes non-finite, runs its calls up to the failing one again
in full; run wider than fp16, a first probe past 65504 again in full) against the same check
recording every call in full, over the planted corpus and in every precision: healthy, and an
overflow in the VAE, the UNet's feed-forward, its attention scores, the text encoder, NaN in the
weights, an overflow made between two layers by the code of the block that holds them, and a
NaN that the block's own code masks."""

from __future__ import annotations

import pytest

from app.core.components import FP16_MAX
from app.core.health import stages
from app.core.settings import PrecisionSettings
from tests.support.check_answers import answers
from tests.support.planted_sd import (
    FF_BLOCK,
    FP16,
    PLANTS,
    between_layers,
    check,
    loaded,
)
from tests.support.tiny_models import build_tiny_sd_pipeline

# fp16 runs by default; bf16 and fp32, whose answers `test_golden_reports` holds too, are slow.
PRECISIONS = [
    pytest.param(p, marks=[] if p == "fp16" else [pytest.mark.slow])
    for p in ("fp16", "bf16", "fp32")
]


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("planted", list(PLANTS))
def test_the_lean_recorder_gives_the_same_answers(monkeypatch, planted, precision):
    settings = FP16 if precision == "fp16" else PrecisionSettings(precision=precision)
    lean = check(loaded(PLANTS[planted](build_tiny_sd_pipeline()), "lean"), settings)
    monkeypatch.setattr(stages, "LEAN_RECORDER", False)
    full = check(loaded(PLANTS[planted](build_tiny_sd_pipeline()), "full"), settings)
    assert answers(lean) == answers(full)
    # The full check recorded every call in full; the lean one only what went non-finite (or
    # past 65504 in a wider first probe).
    assert full.work.lean_calls == 0
    assert lean.work.lean_calls > 0
    if lean.verdict == "healthy" and all(
        (c.max_abs or 0) <= FP16_MAX for c in lean.components.values()
    ):
        assert lean.work.recorded_calls == 0


def test_an_overflow_between_layers_is_the_blocks_not_the_layer_it_reached():
    """The block whose own code made the overflow is named, not its layer that received it
    (which a record of outputs alone would name: the first output that went non-finite)."""
    report = check(loaded(between_layers(build_tiny_sd_pipeline(), masked=False)))
    assert report.components["unet"].first_bad_module == FF_BLOCK
    assert report.work.recorded_calls >= 1  # the descent ran the failing call in full
