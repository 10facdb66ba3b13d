"""The provisional proof on the first failing timestep (`benchmarks/provisional.py`, measured
by `benchmarks/option_b.py`) against the full proof of the same check: where it agrees on the
planted corpus, where it does not, and the denoiser calls it takes. The agreement is computed
here from both proofs of one check, never copied from a past run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from app.core.health import HealthReport
from app.core.run.probe import ModuleStats, ProbeResult
from app.core.settings import PrecisionSettings
from tests.support import family_rows as families
from tests.support.family_helpers import in_memory, plant_scaled
from tests.support.planted_sd import PLANTS, check, loaded
from tests.support.tiny_models import build_tiny_sd_pipeline

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import option_b  # noqa: E402
import provisional  # noqa: E402

FP16 = PrecisionSettings(precision="fp16")


def _beside(model) -> tuple[HealthReport, list[dict]]:
    """A check of `model` in fp16 with the provisional proof beside its full proof: the report,
    and each failing denoiser's comparison (`option_b.compare_case`)."""
    with option_b.provisional_beside_full() as found:
        report = check(model, FP16, remember=False)
    return report, [option_b.compare_case(report, entry, len(report.timesteps)) for entry in found]


# The denoiser calls to name the fix: the provisional proof's (its one-call reference and one
# call per candidate that could still win), the full proof's (three a run; a candidate that
# goes non-finite stops at its first bad call).
@pytest.mark.parametrize(
    ("planted", "provisional_calls", "full_calls"),
    [("unet_ff", 1 + 1 + 1, 3 + 1 + 3), ("between_layers", 1 + 1 + 1, 3 + 1 + 3)],
)
def test_it_agrees_with_the_full_proof_on_the_planted_unet(planted, provisional_calls, full_calls):
    """Each candidate passes or fails alike, the same fix is chosen, and naming it takes fewer
    denoiser calls than the full proof's (one timestep a run instead of three)."""
    report, (compared,) = _beside(loaded(PLANTS[planted](build_tiny_sd_pipeline()), planted))
    assert report.fix is not None
    assert compared["first_failing_call"] == 0
    assert compared["timestep"] == report.timesteps[0]
    assert sorted(r["kind"] for r in compared["candidates"]) == sorted(
        r.kind for r in report.tried if r.component == "unet"
    )
    for row in compared["candidates"]:
        assert row["same_candidate"], row
        assert row["provisional"]["passes"] == row["full"]["passes"], row
        assert row["provisional"]["finite"] == row["full"]["finite"], row
    assert compared["same_fix"] and compared["agrees"]
    calls = compared["calls"]
    assert (calls["provisional_to_choice"], calls["full_to_fix"]) == (provisional_calls, full_calls)


def test_it_passes_a_bf16_denoiser_the_full_proof_fails():
    """FLUX.2's planted double block: the whole transformer in bf16 agrees with fp32 on the
    first timestep, yet drifts below the threshold over the probe's three; the fix chosen is
    still the same (layers kept wider rank first). The reason the provisional proof is not
    adopted: a candidate's verdict would differ from the full proof's."""
    row = families.ROWS["flux2"]
    plant = row.plants["double_block"]
    pipeline = plant_scaled(row.build(), {"p": (plant.component, plant.layer, plant.factor)}, "p")
    _, (compared,) = _beside(in_memory(pipeline, "flux2", row.architecture, row.prediction))
    (bf16,) = [r for r in compared["candidates"] if r["kind"] == "component_bf16"]
    assert bf16["provisional"]["passes"] and not bf16["full"]["passes"]
    assert bf16["provisional"]["quality_db"] > bf16["full"]["quality_db"] + 10
    assert compared["same_fix"] and not compared["agrees"]


def test_a_check_whose_denoiser_stays_finite_runs_no_provisional_proof():
    _, compared = _beside(loaded(PLANTS["vae"](build_tiny_sd_pipeline()), "vae"))
    assert compared == []


def test_the_first_failing_call_is_read_from_a_full_record():
    """A record in full names no call: the call is the first bad completion over the modules
    a call completes (the component itself last)."""
    probe = ProbeResult(output_finite=False)
    probe.modules["conv"] = ModuleStats("conv", 0, non_finite=True, first_bad=4)
    probe.modules[""] = ModuleStats("", 2, non_finite=True, first_bad=5)
    assert provisional.first_failing_call(probe) == 1
    probe.first_bad_call = 2  # a lean record names it
    assert provisional.first_failing_call(probe) == 2
