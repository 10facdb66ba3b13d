"""One injected cost oracle for the check: every stage's and denoiser step's time is a function of
the plan alone (10 to 40 ms), and its memory is the plan's weights as a generation places them.
Nothing is timed, so a check under it ranks its candidates the same way on every machine.
`gpu_ms` is another oracle's time, a GPU's order of costs, for the checks that need one."""

from __future__ import annotations

import zlib
from collections.abc import Callable

import pytest

from app.core.health.cost import StepCost
from app.core.precision import plan_weights_mb
from app.core.run import timing
from app.core.run.stage_cost import StageCost


def oracle_ms(plan) -> float:
    """A step's time under `plan` that depends on the plan alone: from 10 to 40 ms."""
    return 10.0 + zlib.crc32(_as_recorded(plan).encode()) % 31


def _as_recorded(plan) -> str:
    """The plan's repr as the golden records' times were drawn from: the kinds' own islands
    written as the field that held them then, the tuple of the parts that keep them (a field's
    new name alone would move every time, and with them the fixes the records chose)."""
    held = tuple(plan.kind_islands)
    return repr(plan).replace(f"kind_islands={plan.kind_islands!r}", f"t5_feed_forward={held!r}")


def gpu_ms(plan, component: str) -> float:
    """A step's time for `component` under `plan` in a GPU's order (an H100's): fp16 and bf16
    alike on the fused attention kernel, PyTorch's math kernel (or diffusers' classic
    processor) and attention upcast to fp32 dearer, fp32 twice fp16."""
    ms = 10.0 * (2.0 if plan.dtype_of(component) == "fp32" else 1.0)
    if plan.attention_backend in ("math", "classic"):
        ms *= 1.4
    if plan.upcast_attention:
        ms *= 1.3
    return ms


def inject(patcher: pytest.MonkeyPatch, ms: Callable[..., float] | None = None) -> None:
    """Replace the runner's timed costs with the oracle's for as long as `patcher` holds: `ms`
    (plan, component) -> a step's time, by default `oracle_ms` of the plan alone."""

    def time_of(plan, component: str) -> float:
        return ms(plan, component) if ms is not None else oracle_ms(plan)

    def stage_costs(self, name, stage_fn, plans, on_run=timing.no_runs, warm=()):
        for done, _ in enumerate(plans, start=1):
            on_run(done, len(plans))
        return {
            label: StageCost(
                round(plan_weights_mb(plan, self.model.pipeline), 2),
                time_of(plan, name),
                (time_of(plan, name) * 0.99, time_of(plan, name) * 1.01),
                timing.COST_ROUNDS,
            )
            for label, plan in plans.items()
        }

    def unet_step_costs(self, plans, conditioning, on_run=timing.no_runs, warm=()):
        denoiser = self.family.denoiser
        return {
            label: StepCost(
                time_of(plan, denoiser),
                (time_of(plan, denoiser), time_of(plan, denoiser)),
                timing.COST_ROUNDS,
                None,
                round(plan_weights_mb(plan, self.model.pipeline), 1),
            )
            for label, plan in plans.items()
        }

    patcher.setattr(timing.Timing, "stage_costs", stage_costs)
    patcher.setattr(timing.Timing, "unet_step_costs", unet_step_costs)
