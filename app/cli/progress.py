"""Progress of a long `halfsafe` command on stderr: on a terminal one line redrawn in place,
otherwise (a log file, a CI job) a plain line every few seconds with the time so far and an
estimate of the time left. A check's headline (`Headline`: what failed, at which layer) is a
line of its own at once, either way."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

from app.cli.terminal import for_terminal
from app.core.jobs import DONE, Headline
from app.core.words.durations import duration


def progress_for(stream: TextIO) -> RedrawnLine | ProgressLines:
    """The progress callback for `stream`: redrawn in place on a terminal, plain lines
    otherwise. Call its `close()` when the command ends."""
    return RedrawnLine(stream) if stream.isatty() else ProgressLines(stream)


class RedrawnLine:
    """A progress callback for a terminal: `stage: done/total` redrawn in place; a headline
    is printed above it and stays."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def __call__(self, stage: str, done: int, total: int) -> None:
        if isinstance(stage, Headline):
            line = for_terminal(f"halfsafe: {stage}", one_line=True)
            print(f"\r\033[K{line}", file=self.stream, flush=True)
            return
        line = for_terminal(f"{stage}: {done}/{total}", one_line=True)
        print(f"\r{line}\033[K", end="", file=self.stream, flush=True)

    def close(self) -> None:
        print("\r\033[K", end="", file=self.stream, flush=True)


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
        if isinstance(stage, Headline):  # the user learns what failed now, not at the end
            print(for_terminal(f"halfsafe: {stage}", one_line=True), file=self.stream, flush=True)
            return
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
        line += f", {duration(now - self.started)} so far"
        if total > 0 and done > self.stage_first and done < total:
            pace = (now - self.stage_started) / (done - self.stage_first)
            line += f", about {duration(pace * (total - done))} left"
        print(for_terminal(line, one_line=True), file=self.stream, flush=True)

    def close(self) -> None:
        """Nothing to clear: every line printed stays."""
