"""The check gives the answers it gave when its golden records were written
(`tests/support/golden.py`), over the planted corpus, in fp16, bf16 and fp32, with one injected
cost oracle (`tests/support/cost_oracle.py`):

- the built-in demo and demo-overflow;
- the tiny SD model (`sd1-`) healthy and with each plant of `planted_sd.PLANTS`: the VAE,
  the UNet's feed-forward, its attention scores, NaN in its weights, the text encoder, an
  overflow made between two layers by the block's own code, and a NaN the block's code masks;
- every other family's tiny model (`family_rows.ROWS`) healthy, with each of its planted
  layers (denoiser blocks, text encoders, the VAE) and with NaN in its denoiser's weights; and
  SDXL's attention scores. Attention scores are planted in the UNet families alone: their
  attention runs HalfSafe's processor, which bounds the scores; the transformer families'
  attention runs their own processors, whose scores no record holds.

A difference fails with every place the answers moved. When an answer is meant to change,
write the records again (the module docstring of `tests/support/golden.py` says how) and read
the diff: it is what the users will be told differently.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import torch

from app.core.models import load_model
from app.core.settings import PrecisionSettings
from tests.support import cost_oracle, golden
from tests.support import family_rows as families
from tests.support.planted_sd import PLANTS, check, loaded
from tests.support.tiny_models import build_tiny_sd_pipeline

PRECISIONS = ("fp16", "bf16", "fp32")
SDXL_ATTENTION = "down_blocks.0.attentions.0.transformer_blocks.0.attn1"


# Rows whose answers other cases already hold (`golden.ROWS_WITHOUT_RECORDS`; Anima 2.9B's last
# block's plant is held, at five seconds a check, by `test_families`).
FAMILIES_ELSEWHERE = golden.ROWS_WITHOUT_RECORDS
# The family rows' planted layers in fp16: test_families' planted test checks each once and
# holds that check to its record here, so that the same check does not run twice.
IN_TEST_FAMILIES = {
    f"{name}-{key}"
    for name, row in families.ROWS.items()
    if name not in FAMILIES_ELSEWHERE
    for key in row.plants
}


def _family_nan(name: str):
    """The row's tiny pipeline with one NaN in the weights of its first planted denoiser layer."""
    row = families.ROWS[name]
    (plant, *_) = [p for p in row.plants.values() if p.component in ("unet", "transformer")]
    pipeline = row.build()
    with torch.no_grad():
        weight = getattr(pipeline, plant.component).get_submodule(plant.layer).weight
        weight.view(-1)[0] = float("nan")
    return pipeline


def _sdxl_attention():
    """SDXL's tiny UNet with its first self-attention's queries and keys scaled: scores past
    fp16's range, bounded by HalfSafe's attention processor (the plant of `sd1-attention`)."""
    pipeline = families.ROWS["sdxl"].build()
    attention = pipeline.unet.get_submodule(SDXL_ATTENTION)
    with torch.no_grad():
        attention.to_q.weight.mul_(1000)
        attention.to_k.weight.mul_(1000)
    return pipeline


def _cases() -> dict[str, Callable[[], Any]]:
    """Case name -> a function that builds the loaded model afresh."""
    cases: dict[str, Callable[[], Any]] = {
        "demo": lambda: load_model("demo"),
        "demo-overflow": lambda: load_model("demo-overflow"),
    }
    for planted, plant in PLANTS.items():
        cases[f"sd1-{planted}"] = lambda p=plant, k=planted: loaded(p(build_tiny_sd_pipeline()), k)
    for name, row in families.ROWS.items():
        if name in FAMILIES_ELSEWHERE:
            continue
        cases[f"{name}-healthy"] = lambda n=name: families.loaded(
            families.ROWS[n].build(), n, "healthy"
        )
        for key, plant in row.plants.items():
            cases[f"{name}-{key}"] = lambda n=name, p=plant, k=key: families.loaded(
                families.planted(n, p), n, k
            )
        cases[f"{name}-nan_weights"] = lambda n=name: families.loaded(
            _family_nan(n), n, "nan_weights"
        )
    cases["sdxl-attention"] = lambda: families.loaded(_sdxl_attention(), "sdxl", "attention")
    return cases


CASES = _cases()
# The tiny SD model and the demos run by default; every family's model is slow to build.
FAST = {name for name in CASES if name.startswith(("demo", "sd1-"))}


@pytest.mark.parametrize(
    ("case", "precision"),
    [
        pytest.param(c, p, id=f"{c}-{p}", marks=[] if c in FAST else [pytest.mark.slow])
        for c in CASES
        for p in PRECISIONS
        if not (p == "fp16" and c in IN_TEST_FAMILIES)
    ],
)
def test_the_check_answers_as_its_golden_record(monkeypatch, case, precision):
    cost_oracle.inject(monkeypatch)
    report = check(
        CASES[case](),
        PrecisionSettings(precision=precision),
        remember=False,
        measure_cost=True,
    )
    golden.check_against_golden(report, case, precision)


def test_every_golden_record_is_a_case_of_the_corpus():
    """No record outlives its case (a renamed plant would leave one that nothing reads)."""
    records = {p for p in golden.GOLDEN_DIR.glob("*.json") if p.name != golden.MACHINE_FILE}
    assert {path.stem for path in records} == set(CASES)
    for path in records:
        by_class = json.loads(path.read_text(encoding="utf-8"))
        assert set(by_class["native"]) == set(PRECISIONS), path.name
        assert set(by_class) <= {"native", "emulated"}, path.name


BEFORE = {
    "verdict": "fixable",
    "headline": "keep 31 UNet layers in bf16 (35.9 dB; 402,000x; a bound of 2.68e+05)",
    "components": {"unet": {"max_abs": 26333845504.0, "layers": 31}},
    "candidates": [{"chosen": True}],
}


def _with(**changed) -> dict:
    document = json.loads(json.dumps(BEFORE))
    for path, value in changed.items():
        *parents, key = path.split("__")
        place = document
        for parent in parents:
            place = place[parent]
        place[key] = value
    return document


def test_measured_figures_are_held_bit_for_bit_here_and_within_the_tolerance_elsewhere():
    nudged = _with(
        headline="keep 31 UNet layers in bf16 (37.0 dB; 420,000x; a bound of 2.65e+05)",
        components__unet__max_abs=26333845504.0 * 1.05,
    )
    assert golden.differences(BEFORE, BEFORE) == []
    assert golden.differences(BEFORE, nudged, relative=golden.ANOTHER_MACHINE) == []
    assert golden.differences(BEFORE, nudged) == [
        f".headline: {BEFORE['headline']!r} != {nudged['headline']!r}",
        ".components.unet.max_abs: 26333845504.0 != 27650537779.2",
    ]
    far = _with(components__unet__max_abs=26333845504.0 * 1.2)
    assert golden.differences(BEFORE, far, relative=golden.ANOTHER_MACHINE) != []


def test_every_other_answer_is_held_exactly_on_any_machine():
    moved = _with(
        verdict="healthy",
        headline="keep 32 UNet layers in bf16 (35.9 dB; 402,000x; a bound of 2.68e+05)",
        components__unet__layers=30,
    )
    moved["candidates"].append({"chosen": False})
    assert golden.differences(BEFORE, moved, relative=golden.ANOTHER_MACHINE) == [
        ".verdict: 'fixable' != 'healthy'",
        f".headline: {BEFORE['headline']!r} != {moved['headline']!r}",
        ".components.unet.layers: 31 != 30",
        ".candidates: 1 items != 2",
    ]
    # A count never passes for a measured figure, nor a ratio for a count, nor one layer's
    # name for another's.
    assert golden.differences({"s": "31 layers"}, {"s": "31x layers"}, relative=0.5) != []
    names = {"s": "at blocks.3.5.attn1"}, {"s": "at blocks.3.6.attn1"}
    assert golden.differences(*names, relative=0.5) != []


def test_the_records_machine_compares_bit_for_bit_and_another_within_the_tolerance(monkeypatch):
    recorded = json.loads((golden.GOLDEN_DIR / golden.MACHINE_FILE).read_text(encoding="utf-8"))
    monkeypatch.setattr(golden, "machine", lambda: recorded)
    assert golden.tolerance() == 0.0
    monkeypatch.setattr(golden, "machine", lambda: {**recorded, "cores": recorded["cores"] + 1})
    assert golden.tolerance() == golden.ANOTHER_MACHINE


def test_another_bf16_class_keeps_only_what_differs_from_native():
    native = {"verdict": "fixable", "fix": {"unet": "fp16", "modules": {"unet": {"a": "bf16"}}}}
    emulated = {"verdict": "fixable", "fix": {"unet": "fp16", "modules": {"unet": {"a": "fp32"}}}}
    change = golden.delta(native, emulated)
    assert change == {"fix": {"modules": {"unet": {"a": "fp32"}}}}
    assert golden.patched(native, change) == emulated
    assert native["fix"]["modules"]["unet"] == {"a": "bf16"}  # the native record is unchanged
    fewer = {"fix": [1, 2]}
    assert golden.patched(native, golden.delta(native, fewer)) == fewer
    assert golden.delta(native, native) == {}
