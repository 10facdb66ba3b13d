"""What every long core function takes: a progress callback and a cancel token.

Core functions call `on_progress` and `cancel.raise_if_cancelled()` at their natural steps (a
denoising step, a component of the health check, a file of a scan); that is where a cancel takes
effect. Both are called on the thread running the job: callbacks must not touch widgets.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from app.core.errors import CancelledError

# on_progress(stage, done, total): stage is a short phrase for the user ("Checking the VAE").
ProgressCallback = Callable[[str, int, int], None]


# The stage of a job's last progress call: its work is done, its result is being written.
DONE = "Done"


def no_progress(stage: str, done: int, total: int) -> None:
    """The default progress callback: ignore it."""


class CancelToken:
    """Set from any thread; checked by the job at its next step."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def cancel(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def raise_if_cancelled(self) -> None:
        if self._event.is_set():
            raise CancelledError()


class Headline(str):
    """A progress stage that is a finding, not a phase: what failed and at which layer, said
    as soon as a check's probe shows it, or how a job's parts will be held in memory, said
    before it starts. A consumer that does not know it shows it as a stage; the CLI prints it
    as a line of its own, the engine sends it as a warning."""
