"""Progress of a long `halfsafe` command on stderr when it is not a terminal (a log file, a CI
job): a plain line every few seconds with the time so far and an estimate of the time left."""

from __future__ import annotations

import time
from collections.abc import Callable

from app.core.jobs import DONE


class ProgressLines:
    """A progress callback for output that is not a terminal: one plain line per `interval`
    seconds after the first few (and a last one at "Done"), with the ETA from the pace so
    far, e.g.
    `halfsafe: Denoising: step 12 of 25, 9 s so far, about 10 s left`.
    `clock` is injectable for tests; nothing is printed between intervals."""

    def __init__(
        self, stream, interval: float = 5.0, clock: Callable[[], float] | None = None
    ) -> None:
        self.stream = stream
        self.interval = interval
        self.clock = clock or time.monotonic
        self.stage = ""
        self.started = self.clock()
        self.stage_started = self.started
        self.stage_first = 0
        self.last_printed: float | None = None

    def __call__(self, stage: str, done: int, total: int) -> None:
        now = self.clock()
        new_stage = stage != self.stage
        if new_stage:
            self.stage, self.stage_started, self.stage_first = stage, now, done
        # Quiet for the first interval: a quick run (or one that fails at once, whose one
        # stderr line is the error) prints no progress at all.
        since = self.started if self.last_printed is None else self.last_printed
        due = now - since >= self.interval
        finished = new_stage and stage == DONE and self.last_printed is not None
        if not (due or finished):
            return
        self.last_printed = now
        line = f"halfsafe: {stage}"
        if total > 1 or (total == 1 and done == 1):
            line += f": {done} of {total}"
        line += f", {_seconds(now - self.started)} so far"
        if total > 0 and done > self.stage_first and done < total:
            pace = (now - self.stage_started) / (done - self.stage_first)
            line += f", about {_seconds(pace * (total - done))} left"
        print(line, file=self.stream, flush=True)


def _seconds(value: float) -> str:
    value = max(0.0, value)
    if value < 90:
        return f"{value:.0f} s"
    return f"{value // 60:.0f} min {value % 60:02.0f} s"
