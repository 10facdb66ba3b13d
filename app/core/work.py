"""The work a job does, counted: each component's forward calls by dtype, the stages run, the
calls run under the activation recorder and the calls timed for a cost, the copies placed on
the device, the garbage collector's passes, and the points where the host waits for the device.

Counts, unlike seconds, do not depend on the machine, so tests hold budgets on them and the
benchmarks print them beside the times. Code deep in a job counts into the job's `Work` through
`counting()` (a context variable: each thread counts its own job); outside one nothing is kept.

The collector: a loaded model is millions of Python objects, and one full pass over them takes
0.3-0.6 s (`docs/benchmarks.md`), where the copies a job drops (whose reference cycles only the
collector frees) are a small part of them. `frozen_world()` sets everything that existed before
the job aside (`gc.freeze`), so the job's passes look at what the job made alone, and hands it
back at the end (`gc.unfreeze`), so nothing is kept longer than it was.
"""

from __future__ import annotations

import functools
import gc
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar


@dataclass
class Work:
    """What one job did, counted."""

    # component -> dtype it computed in -> forward calls (a VAE's decoder or encoder calls).
    calls: dict[str, dict[str, int]] = field(default_factory=dict)
    recorded_calls: int = 0  # component calls run under the full activation recorder
    lean_calls: int = 0  # component calls run under the lean one (outputs only)
    module_calls: int = 0  # module calls the recorders recorded (full or lean)
    reductions: int = 0  # ... and the reductions they made of those calls' tensors
    timed_calls: int = 0  # component calls run to time a plan (a candidate's or a fix's cost)
    stage_runs: int = 0  # stages run (`run.stage_run.running`): components placed and run
    timed_runs: int = 0  # ... of them, those made to be timed
    # candidates ranked by their cost predicted from the work and the device's dtype table,
    # whose timing the ranking did not need
    predicted_costs: int = 0
    placements: int = 0  # copies of a part made on the device
    timed_placements: int = 0  # ... of them, those made while plans were timed
    gc_passes: int = 0  # the collector's passes the job asked for
    full_gc_passes: int = 0  # ... of them, those that walked every object (nothing set aside)
    host_syncs: int = 0  # points where the host waited for the device to read a result
    # The work done by each milestone a check reached (`MILESTONES`), and the seconds it took.
    milestones: dict[str, dict[str, Any]] = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter, repr=False, compare=False)

    def call(self, component: str, dtype: str, *, recorder: str | None, timed: bool) -> None:
        """One forward call of `component` computing in `dtype`, under the `recorder` named
        ("full", "lean" or None), timed or not."""
        by_dtype = self.calls.setdefault(component, {})
        by_dtype[dtype] = by_dtype.get(dtype, 0) + 1
        self.recorded_calls += recorder == "full"
        self.lean_calls += recorder == "lean"
        self.timed_calls += timed

    def calls_of(self, component: str, dtype: str | None = None) -> int:
        """Forward calls of `component` (in `dtype`, or in any)."""
        by_dtype = self.calls.get(component, {})
        return by_dtype.get(dtype, 0) if dtype is not None else sum(by_dtype.values())

    def counts(self) -> dict[str, Any]:
        """Every count so far (the milestones aside)."""
        return {
            "calls": {name: dict(sorted(d.items())) for name, d in sorted(self.calls.items())},
            "recorded_calls": self.recorded_calls,
            "lean_calls": self.lean_calls,
            "module_calls": self.module_calls,
            "reductions": self.reductions,
            "timed_calls": self.timed_calls,
            "stage_runs": self.stage_runs,
            "timed_runs": self.timed_runs,
            "predicted_costs": self.predicted_costs,
            "placements": self.placements,
            "timed_placements": self.timed_placements,
            "gc_passes": self.gc_passes,
            "full_gc_passes": self.full_gc_passes,
            "host_syncs": self.host_syncs,
        }

    def reach(self, milestone: str) -> None:
        """Mark `milestone` (one of `MILESTONES`) reached now, with the work done so far; only
        its first time counts."""
        if milestone not in self.milestones:
            self.milestones[milestone] = {
                **self.counts(),
                "seconds": round(time.perf_counter() - self.started, 3),
            }

    def at(self, milestone: str) -> Work | None:
        """The work done by `milestone` as a record of its own (None: not reached)."""
        reached = self.milestones.get(milestone)
        if reached is None:
            return None
        counts = {k: v for k, v in reached.items() if k != "seconds"}
        return Work(**{**counts, "calls": {n: dict(d) for n, d in counts["calls"].items()}})

    def to_json(self) -> dict[str, Any]:
        return {
            **self.counts(),
            "milestones": {
                name: self.milestones[name] for name in MILESTONES if name in self.milestones
            },
        }


# What a check reaches as it runs, in order: what failed first and where (told right after its
# first non-finite call), the fix proved for everything that failed, the verdict, and the end
# (the candidates' table finished and the fix's cost measured).
MILESTONES = ("first_finding", "proved_fix", "verdict", "done")


_current: ContextVar[Work | None] = ContextVar("halfsafe_work", default=None)
# How deep inside `frozen_world` blocks the process is (0: outside any).
_frozen_depth = 0


@contextmanager
def counting(work: Work | None = None) -> Iterator[Work]:
    """Count the work done inside the block into `work` (a new `Work` by default). A block
    inside another counts into its own record alone."""
    work = work if work is not None else Work()
    token = _current.set(work)
    try:
        yield work
    finally:
        _current.reset(token)


def counted() -> Work | None:
    """The record the running job counts into (None outside `counting()`)."""
    return _current.get()


def add(what: str, times: int = 1) -> None:
    """Add `times` to the running job's counter `what` (a `Work` field); nothing outside a job."""
    work = _current.get()
    if work is not None:
        setattr(work, what, getattr(work, what) + times)


def reach(milestone: str) -> None:
    """Mark `milestone` reached in the running job's record (`Work.reach`); nothing outside one."""
    work = _current.get()
    if work is not None:
        work.reach(milestone)


def collect_garbage() -> None:
    """One pass of the collector, counted; inside `frozen_world()` it walks the job's own
    objects only."""
    work = _current.get()
    if work is not None:
        work.gc_passes += 1
        work.full_gc_passes += not _frozen_depth
    gc.collect()


@contextmanager
def frozen_world() -> Iterator[None]:
    """Set every object that exists now aside from the collector for the block (the loaded
    model, the libraries), and give them back after it. A block inside another is the outer
    one's: only the outermost freezes and unfreezes. (Whether a block is inside another is
    counted here, never read from `gc.get_freeze_count()`: libraries freeze objects of their
    own, and a count above 0 from them once kept a check from freezing anything.)"""
    global _frozen_depth
    if _frozen_depth:
        _frozen_depth += 1
        try:
            yield
        finally:
            _frozen_depth -= 1
        return
    gc.freeze()
    _frozen_depth = 1
    try:
        yield
    finally:
        _frozen_depth = 0
        gc.unfreeze()


P = ParamSpec("P")
R = TypeVar("R")


def setting_world_aside(function: Callable[P, R]) -> Callable[P, R]:
    """`function` run inside `frozen_world()` (a job: a generation, its repairs)."""

    @functools.wraps(function)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        with frozen_world():
            return function(*args, **kwargs)

    return run
