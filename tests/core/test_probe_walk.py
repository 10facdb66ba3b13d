"""The probe record's walk through a check: the record a stage's recorders leave
(`run.probe.ProbeResult`) is read by the check (`app/core/health`) and by the diagnosis that
draws its fixes (`app/core/fixing`), and crosses between the two at most three times, for a
planted fault in the UNet, the VAE or the text encoder and for a healthy model.

The walk is traced (`sys.setprofile`): every function of those two packages that is handed a
record or returns one, in the order they run, the record's own methods and the expressions
inside a function (lambdas, comprehensions) left out. Counts, not times: the same on every
machine."""

from __future__ import annotations

import sys

import pytest
import torch

from app.core.run.probe import ActivationRecorder, ModuleStats, ProbeResult
from tests.support.planted_sd import TE_LAYER, check, loaded, plant
from tests.support.tiny_models import build_tiny_sd_pipeline

SIDES = ("app.core.health", "app.core.fixing")
MOST_CROSSINGS = 3


def _holds_record(value) -> bool:
    if isinstance(value, ProbeResult):
        return True
    if isinstance(value, dict) and value:
        return isinstance(next(iter(value.values())), ProbeResult)
    return False


def walk(run) -> list[tuple[str, str]]:
    """(side, function) of each function of `SIDES` handed a probe record or returning one
    while `run()` runs, consecutive calls of one function once."""
    seen: list[tuple[str, str]] = []

    def profile(frame, event, arg):
        if event not in ("call", "return"):
            return
        module = frame.f_globals.get("__name__", "")
        side = next((s for s in SIDES if module.startswith(s + ".")), None)
        code = frame.f_code
        if side is None or code.co_name.startswith("<"):
            return
        owner = frame.f_locals.get("self")
        if isinstance(owner, (ProbeResult, ModuleStats, ActivationRecorder)):
            return
        if event == "call":
            handed = any(_holds_record(v) for v in frame.f_locals.values())
        else:
            handed = _holds_record(arg)
        name = f"{module}.{code.co_name}"
        if handed and (not seen or seen[-1][1] != name):
            seen.append((side, name))

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return seen


def crossings(steps: list[tuple[str, str]]) -> int:
    """How often the walk moves from one side to the other."""
    return sum(1 for a, b in zip(steps, steps[1:], strict=False) if a[0] != b[0])


def test_the_walks_crossings_are_counted():
    health, fixing = SIDES
    steps = [(health, "a"), (health, "b"), (fixing, "c"), (health, "d"), (fixing, "e")]
    assert crossings(steps) == 3
    assert crossings(steps[:2]) == 0 and crossings([]) == 0


def _planted(fault: str):
    pipeline = build_tiny_sd_pipeline()
    if fault == "text_encoder":
        with torch.no_grad():
            pipeline.text_encoder.get_submodule(TE_LAYER).weight.mul_(1e5)
    elif fault != "healthy":
        plant(pipeline, fault)
    return pipeline


@pytest.mark.parametrize("fault", ["unet_ff", "vae", "text_encoder", "healthy"])
def test_the_probe_record_crosses_between_the_check_and_the_diagnosis_at_most_three_times(
    fault,
):
    model = loaded(_planted(fault))
    reports = []
    steps = walk(lambda: reports.append(check(model, remember=False)))
    (report,) = reports
    assert report.verdict == ("healthy" if fault == "healthy" else "fixable"), report.headline
    if fault != "healthy":  # the diagnosis read the record: the walk reached it
        assert any(side == "app.core.fixing" for side, _ in steps), steps
    assert crossings(steps) <= MOST_CROSSINGS, "\n".join(f"{s:18} {n}" for s, n in steps)
