"""One injected cost oracle for the check: every stage's and denoiser step's time is a function of
the plan alone (10 to 40 ms), and its memory is the plan's weights as a generation places them.
Nothing is timed, so a check under it ranks its candidates the same way on every machine."""

from __future__ import annotations

import zlib

import pytest

from app.core.fixing.stage_cost import StageCost
from app.core.health import stages
from app.core.health.cost import StepCost
from app.core.precision import plan_weights_mb


def oracle_ms(plan) -> float:
    """A step's time under `plan` that depends on the plan alone: from 10 to 40 ms."""
    return 10.0 + zlib.crc32(repr(plan).encode()) % 31


def _stage_costs(self, name, stage_fn, plans, on_run=stages._no_runs, warm=(), race=()):
    for done, _ in enumerate(plans, start=1):
        on_run(done, len(plans))
    return {
        label: StageCost(
            round(plan_weights_mb(plan, self.model.pipeline), 2),
            oracle_ms(plan),
            (oracle_ms(plan) * 0.99, oracle_ms(plan) * 1.01),
            stages.COST_ROUNDS,
        )
        for label, plan in plans.items()
    }


def _unet_step_costs(self, plans, conditioning, on_run=stages._no_runs, warm=()):
    return {
        label: StepCost(
            oracle_ms(plan),
            (oracle_ms(plan), oracle_ms(plan)),
            stages.COST_ROUNDS,
            None,
            round(plan_weights_mb(plan, self.model.pipeline), 1),
        )
        for label, plan in plans.items()
    }


def inject(patcher: pytest.MonkeyPatch) -> None:
    """Replace the runner's timed costs with the oracle's for as long as `patcher` holds."""
    patcher.setattr(stages.Runner, "stage_costs", _stage_costs)
    patcher.setattr(stages.Runner, "unet_step_costs", _unet_step_costs)
