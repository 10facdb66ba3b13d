"""Timing a step under several plans, for the cost of a fix after it is proved: a warm-up each,
then `COST_ROUNDS` rounds alternating between the plans, so drift (clocks, caches, other load)
hits every plan alike. Nothing is timed before a fix is proved: the fix search ranks its
candidates untimed (`fixing.fix_ranking`). `Timing` times through its runner's stages
(`health.stages.Runner`), which it belongs to."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Collection
from dataclasses import replace
from typing import Any

from app.core.components import module_of
from app.core.precision import PrecisionPlan
from app.core.precision.placement import generation_held_mb
from app.core.run.stage_cost import StageCost, StepCost
from app.core.run.watchers import Stage

COST_ROUNDS = 3  # timed UNet steps per plan, alternating fix and no-half, after a warm-up each

# on_run(done, total): a timing run finished, `done` of the `total` a measurement makes.
RunCallback = Callable[[int, int], None]


def no_runs(done: int, total: int) -> None:
    """The default run callback: ignore it."""


class _Runs:
    """Counts a measurement's runs (a warm-up, unless the plan is warm, and `COST_ROUNDS` timed
    runs per plan) for its callback, so a measurement that takes a while says how far along it
    is."""

    def __init__(self, plans: int, on_run: RunCallback, warm: int = 0) -> None:
        self.done = 0
        self.total = plans * (1 + COST_ROUNDS) - warm  # a warm plan needs no warm-up
        self.on_run = on_run

    def one_more(self) -> None:
        self.done += 1
        self.on_run(self.done, self.total)


class Timing:
    """The timed runs of one `Runner`: each plan's step of a component, alternating."""

    def __init__(self, runner) -> None:
        self._runner = runner

    @property
    def model(self):
        return self._runner.model

    @property
    def family(self):
        return self._runner.family

    @property
    def placed(self):
        return self._runner.placed

    @property
    def device(self):
        return self._runner.device

    def stage_costs(
        self,
        name: str,
        stage_fn: Callable[[PrecisionPlan, bool], Stage],
        plans: dict[str, PrecisionPlan],
        on_run: RunCallback = no_runs,
        warm: Collection[str] = (),
    ) -> dict[str, StageCost]:
        """Time of one step of the component `name` (a denoiser step, a VAE decode, a prompt
        encode) under each plan, measured as `unet_step_costs` does. `warm`: the plans whose
        stage already ran in this check at this size (a candidate's verification, the first
        probe), which need no warm-up. `on_run(done, total)` follows each run."""

        def seconds(plan: PrecisionPlan) -> float:  # a timed denoiser runs one step (`one_step`)
            return stage_fn(plan, False).seconds.get(name, 0.0)

        samples, peaks = self._alternating(name, plans, seconds, warm, on_run)
        return {
            label: StageCost(
                weights_mb=round(generation_held_mb(self.model.pipeline, plan), 2),
                step_ms=round(statistics.median(samples[label]), 2),
                step_ms_range=(round(min(samples[label]), 2), round(max(samples[label]), 2)),
                rounds=len(samples[label]),
                peak_memory_mb=_rounded(peaks[label]),
            )
            for label, plan in plans.items()
        }

    def unet_step_costs(
        self,
        plans: dict[str, PrecisionPlan],
        conditioning: dict[str, Any],
        on_run: RunCallback = no_runs,
        warm: Collection[str] = (),
    ) -> dict[str, StepCost]:
        """Time of one UNet step (CFG batch) under each plan, measured the same way for all:
        one warm-up step each (none for the `warm` plans, whose denoiser already ran in this
        check), then `COST_ROUNDS` rounds that alternate between the plans, so drift (clocks,
        caches, other load) hits every plan alike. Reports the median and the spread; peak
        device memory where the device reports it. `on_run(done, total)` follows each run."""
        denoiser = self.family.denoiser

        def seconds(plan: PrecisionPlan) -> float:
            stage = self._runner.denoise(plan, conditioning, record=False)
            return stage.seconds[denoiser]

        samples, peaks = self._alternating(denoiser, plans, seconds, warm, on_run)
        return {
            name: StepCost(
                step_ms=round(statistics.median(samples[name]), 2),
                step_ms_range=(round(min(samples[name]), 2), round(max(samples[name]), 2)),
                rounds=COST_ROUNDS,
                peak_memory_mb=_rounded(peaks[name]),
                weights_mb=round(generation_held_mb(self.model.pipeline, plan), 1),
                component=denoiser,
            )
            for name, plan in plans.items()
        }

    def _alternating(
        self,
        name: str,
        plans: dict[str, PrecisionPlan],
        seconds: Callable[[PrecisionPlan], float],
        warm: Collection[str],
        on_run: RunCallback,
    ) -> tuple[dict[str, list[float]], dict[str, float | None]]:
        """`seconds(plan)` of the component `name` under each plan, in milliseconds: a warm-up
        each but the `warm` ones, then `COST_ROUNDS` rounds alternating between the plans.

        A plan's first run (its warm-up, or for a warm plan its first timed run) places the
        whole plan and gives its peak device memory; the runs after it place only `name`, whose
        time alone is taken, so alternating plans never copies the other components back and
        forth (a UNet between fp16 and fp32 for every no-half run of the VAE), and a copy of
        `name` that holds little of its own is kept for the plan's next run
        (`PlacedPipeline.keeping_variants`)."""
        from app.core import work

        samples: dict[str, list[float]] = {label: [] for label in plans}
        peaks: dict[str, float | None] = {}
        runs = _Runs(len(plans), on_run, warm=len(set(warm) & set(plans)))
        timing, self._runner.timing_now = self._runner.timing_now, True
        placed_before = self.placed.placements
        try:
            with self.placed.keeping_variants():
                for label, plan in plans.items():
                    if label not in warm:
                        _, peaks[label] = self._with_peak(lambda plan=plan: seconds(plan))
                        runs.one_more()
                for _ in range(COST_ROUNDS):
                    for label, plan in plans.items():
                        if label in peaks:
                            taken = seconds(only(plan, [name]))
                        else:
                            taken, peaks[label] = self._with_peak(lambda plan=plan: seconds(plan))
                        runs.one_more()
                        samples[label].append(taken * 1000)
                return samples, peaks
        finally:
            self._runner.timing_now = timing
            work.add("timed_runs", runs.done)
            work.add("timed_placements", self.placed.placements - placed_before)

    def _with_peak(self, run: Callable[[], float]) -> tuple[float, float | None]:
        """`run()` and the peak device memory it reached, in MiB (None where the device does
        not report it)."""
        import torch

        if self.device.type != "cuda":
            return run(), None
        from app.core import work

        torch.cuda.synchronize(self.device)
        work.add("host_syncs")
        torch.cuda.reset_peak_memory_stats(self.device)
        taken = run()
        return taken, torch.cuda.max_memory_allocated(self.device) / 2**20


def only(plan: PrecisionPlan, names: Collection[str]) -> PrecisionPlan:
    """`plan` for a run of the components `names` alone: placing it leaves the other
    components placed as they are (the backend flags are the plan's)."""
    parts = {module_of(n) for n in names}
    return replace(plan, dtypes={n: d for n, d in plan.dtypes.items() if n in parts})


def _rounded(value: float | None) -> float | None:
    return round(value, 1) if value is not None else None
