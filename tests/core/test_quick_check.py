"""`halfsafe check --quick`: the check stops at the proved fix. The fix is the one the whole
check proves, remembered alike; nothing runs after the proof (no other candidate for the table,
no timed cost against no-half), and the report says so in one sentence. A healthy model's
quick check is its whole check."""

from __future__ import annotations

import json

import pytest

from app.core import health
from app.core.health.request import CheckRequest
from tests.support.planted_sd import FP16, loaded, plant
from tests.support.tiny_models import build_tiny_sd_pipeline

STOPPED = "The check stopped at the proved fix:"


def _checked(fault: str | None, run):
    pipeline = build_tiny_sd_pipeline()
    if fault is not None:
        plant(pipeline, fault)
    request = CheckRequest(precision=FP16, device="cpu", size=64)
    return health.check_loaded(loaded(pipeline, fault or "healthy"), request, run=run)


@pytest.mark.parametrize("fault", ["unet_ff", "vae"])
def test_a_quick_check_proves_the_whole_checks_fix_and_runs_nothing_after(fault):
    whole = _checked(fault, health.CheckRun(remember=False))
    quick = _checked(fault, health.QUICK)

    assert quick.verdict == whole.verdict == "fixable"
    assert quick.fix is not None and whole.fix is not None and quick.fix.verified
    assert quick.fix.settings == whole.fix.settings
    assert quick.fix.quality == whole.fix.quality
    # Nothing after the proof: the calls, placements and timed runs of the proof are all.
    done, proved = quick.work, quick.work.at("proved_fix")
    assert proved is not None
    assert done.calls == proved.calls and done.placements == proved.placements
    assert done.timed_runs == 0 and quick.fix.cost is None
    assert whole.work.timed_runs > 0 and whole.fix.cost is not None
    # The table holds the candidates run to prove it, the fix first, each as the whole
    # check's row; the whole check ran more.
    rows = {(c.component, c.words): c for c in whole.tried}
    assert quick.tried and quick.tried[0].chosen
    for row in quick.tried:
        twin = rows[(row.component, row.words)]
        assert (row.verified, row.quality) == (twin.verified, twin.quality)
    untried = len(whole.tried) - len(quick.tried)
    assert untried > 0
    (said,) = [n for n in quick.notes if n.startswith(STOPPED)]
    assert f"{untried} other fix" in said and "the fix was not timed" in said
    assert not any(n.startswith(STOPPED) for n in whole.notes)


def test_a_healthy_models_quick_check_is_its_whole_check():
    quick = _checked(None, health.QUICK)
    whole = _checked(None, health.CheckRun(remember=False))
    assert quick.verdict == whole.verdict == "healthy"
    assert quick.work.calls == whole.work.calls
    assert not any(n.startswith(STOPPED) for n in quick.notes)


def test_the_command_stops_at_the_proof_with_quick(capsys):
    from app.cli import main

    argv = ["check", "demo-overflow", "--device", "cpu", "--precision", "fp16", "--size", "64"]
    assert main([*argv, "--json", "--quick"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["verdict"] == "fixable" and report["fix"]["verified"]
    assert "cost" not in report["fix"] or not report["fix"]["cost"]
    work = report["work"]
    assert work["timed_runs"] == 0
    assert work["calls"] == work["milestones"]["proved_fix"]["calls"]
    assert any(n.startswith(STOPPED) for n in report["notes"])
    # Remembered as a whole check's fix is: the next check runs with it, healthy.
    assert main([*argv, "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["verdict"] == "healthy" and again["remembered"], again["headline"]
