"""The lean recorder gives the check's answers bit for bit: a check that records components by
their outputs alone (and, where one goes non-finite, runs its calls up to the failing one again
in full; run wider than fp16, a first probe past 65504 again in full) against the same check
recording every call in full, over the planted corpus and in every precision: healthy, and an
overflow in the VAE, the UNet's feed-forward, its attention scores, the text encoder, NaN in the
weights, an overflow made between two layers by the code of the block that holds them, and a
NaN that the block's own code masks."""

from __future__ import annotations

import types

import pytest
import torch

from app.core.components import FP16_MAX
from app.core.health import stages
from app.core.settings import PrecisionSettings
from tests.core.test_health import FF_LAYER, FP16, TE_LAYER, check, loaded, plant
from tests.support.tiny_models import build_tiny_sd_pipeline

FF_BLOCK = FF_LAYER.rsplit(".net.", 1)[0]  # the FeedForward holding that layer


def _between_layers(pipeline, masked: bool):
    """The feed-forward block's own code scales (or, `masked`, plants NaN in and then zeroes)
    what passes between its first layer and its second: no layer of its own is at fault."""
    block = pipeline.unet.get_submodule(FF_BLOCK)

    def forward(self, hidden_states, *args, **kwargs):
        hidden = self.net[0](hidden_states)
        if masked:
            hidden = torch.where(hidden > 0, hidden, torch.full_like(hidden, float("nan")))
            hidden = torch.nan_to_num(hidden, nan=0.0)
        else:
            hidden = hidden * 1e5
        for layer in self.net[1:]:
            hidden = layer(hidden)
        return hidden

    block.forward = types.MethodType(forward, block)
    return pipeline


def _text_encoder(pipeline):
    with torch.no_grad():
        pipeline.text_encoder.get_submodule(TE_LAYER).weight.mul_(1e5)
    return pipeline


PLANTS = {
    "healthy": lambda p: p,
    "vae": lambda p: plant(p, "vae"),
    "unet_ff": lambda p: plant(p, "unet_ff"),
    "attention": lambda p: plant(p, "attention"),
    "nan_weights": lambda p: plant(p, "nan_weights"),
    "text_encoder": _text_encoder,
    "between_layers": lambda p: _between_layers(p, masked=False),
    "masked_nan": lambda p: _between_layers(p, masked=True),
}


def _answers(report) -> dict:
    """Everything a check says but its times."""
    fix = report.fix
    return {
        "verdict": report.verdict,
        "components": {
            name: (
                c.status,
                c.first_bad_module,
                c.max_abs,
                c.headroom,
                c.wider_max_abs,
                [(b.module, b.max_abs, b.non_finite) for b in c.blocks],
                {d: (o.status, o.measured) for d, o in c.precisions.items()},
                c.fed_by,
                c.predicted_first_bad_module,  # read from the layers' inputs
            )
            for name, c in report.components.items()
        },
        "fix": None
        if fix is None
        else (fix.settings, fix.verified, fix.quality, fix.summary, fix.steps),
        "candidates": [
            (c.component, c.words, c.finite, c.quality, c.verified, c.chosen, c.modules)
            for c in report.tried
        ],
        "notes": report.notes,
        "headline": report.headline,
        "advice": report.advice,  # its islands are read from the layers' inputs
    }


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
    assert _answers(lean) == _answers(full)
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
    report = check(loaded(_between_layers(build_tiny_sd_pipeline(), masked=False)))
    assert report.components["unet"].first_bad_module == FF_BLOCK
    assert report.work.recorded_calls >= 1  # the descent ran the failing call in full
