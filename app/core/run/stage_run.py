"""The one stage runner: how the check and generation run a stage (the prompt upsampler, the
text encoders, the VAE's encoder, the denoiser, the VAE's decode) under a precision plan.

A stage places its own components alone (`PlacedPipeline.apply`), runs on the pipeline twin
that holds them, under the plan's backend flags and torch's inference mode, with its watchers
(recorders, timers, a stop, the NaN watch, saturation flags) attached for the run alone. Written
once here, so that no stage runs under other flags than its plan's or leaves a hook behind; the
structural test holds the check and generation to it."""

from __future__ import annotations

from collections.abc import Collection, Iterator
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar

from app.core.hooks import Hooks


class Watcher(Protocol):
    """A watcher that attaches its own hooks (`ActivationRecorder`, `NanWatch`)."""

    def remove(self) -> None: ...


W = TypeVar("W", bound=Watcher)


class StageRun:
    """One stage as it runs: `pipe`, the pipeline twin running the placed components, and
    `hooks`, the stage's own hooks, which leave with it, as does every watcher it is
    `watching`."""

    def __init__(self, placed) -> None:
        self._placed = placed
        self._pipe: Any = None
        self.hooks = Hooks()
        self._watchers: list[Watcher] = []

    @property
    def pipe(self) -> Any:
        """The pipeline twin running the stage's placed components (`PlacedPipeline.pipeline`),
        made on first use: a stage that calls its modules alone (a VAE's decode) needs none."""
        if self._pipe is None:
            self._pipe = self._placed.pipeline()
        return self._pipe

    def watching(self, watcher: W) -> W:
        """`watcher`, attached already, removed when the stage ends (in the reverse order)."""
        self._watchers.append(watcher)
        return watcher

    def _remove(self) -> None:
        watchers, self._watchers = self._watchers, []
        try:
            for watcher in reversed(watchers):
                watcher.remove()
        finally:
            self.hooks.remove()


@contextmanager
def computing(plan) -> Iterator[None]:
    """Inside the block, the device computes as `plan` says: its backend flags (restored on the
    way out, `precision.backend_flags`) and torch's inference mode. What a stage runs in; alone,
    for a part the plan does not place (the pipeline's safety checker keeps its own copy)."""
    import torch

    from app.core.precision import backend_flags

    with backend_flags(plan), torch.inference_mode():
        yield


@contextmanager
def running(placed, plan, names: Collection[str]) -> Iterator[StageRun]:
    """Run one stage of the components `names` (pipeline names; the VAE's encoder is the VAE)
    under `plan`: they are placed on `placed` (the copies of every other component dropped, one
    already placed as asked kept: no copy is made that the stage did not need), then the block
    runs under `computing(plan)` with a `StageRun`: the twin to call, and its watchers. Every
    hook of the run is removed and the flags restored on the way out, an error or a cancel
    included. Counts one `stage_runs` into the job's work. Runs on the calling thread."""
    from app.core import work

    placed.apply(plan, names)
    run = StageRun(placed)
    work.add("stage_runs")
    try:
        with computing(plan):
            yield run
    finally:
        run._remove()
