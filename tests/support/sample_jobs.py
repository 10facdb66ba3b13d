"""Jobs for exercising the engine itself: counting with cancel points, failing, crashing; each
asked for by a record of its own, as HalfSafe's jobs are (`--handlers tests.support.sample_jobs`
lets an engine process read these records)."""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import ClassVar

from app.core.errors import BadFileError


@dataclass(frozen=True)
class Count:
    kind: ClassVar[str] = "count"
    steps: int = 3
    seconds: float = 0.01


@dataclass(frozen=True)
class Deadlock:
    kind: ClassVar[str] = "deadlock"


@dataclass(frozen=True)
class Fail:
    kind: ClassVar[str] = "fail"


@dataclass(frozen=True)
class BadFile:
    kind: ClassVar[str] = "bad_file"


@dataclass(frozen=True)
class Oom:
    kind: ClassVar[str] = "oom"


@dataclass(frozen=True)
class Segfault:
    kind: ClassVar[str] = "segfault"


@dataclass(frozen=True)
class Remember:
    kind: ClassVar[str] = "remember"
    value: int = 0


@dataclass(frozen=True)
class Recall:
    kind: ClassVar[str] = "recall"


def count(context, params):
    """`steps` steps of `seconds` each, a progress event and a cancel check per step."""
    steps = params.steps
    for step in range(1, steps + 1):
        time.sleep(params.seconds)
        context.cancel.raise_if_cancelled()
        context.progress("Counting", step, steps)
    return {"counted": steps, "pid": os.getpid()}


def deadlock(context, params):
    """Reports one step, then waits forever on a lock it already holds: a stuck job whose
    engine still beats (its heartbeat thread is free)."""
    context.progress("Stuck", 1, 2)
    lock = threading.Lock()
    lock.acquire()
    lock.acquire()


def fail(context, params):
    raise ValueError("something internal\nwith a second line")


def bad_file(context, params):
    raise BadFileError("/models/x.safetensors", "the header is cut short")


def oom(context, params):
    raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 6.00 GiB total)")


def segfault(context, params):
    if hasattr(signal, "SIGSEGV") and os.name == "posix":
        os.kill(os.getpid(), signal.SIGSEGV)
    ctypes.string_at(0)  # an access violation where there are no signals


def remember(context, params):
    context.session.extras["value"] = params.value
    return {}


def recall(context, params):
    return {"value": context.session.extras.get("value")}


HANDLERS = {
    Count: count,
    Deadlock: deadlock,
    Fail: fail,
    BadFile: bad_file,
    Oom: oom,
    Segfault: segfault,
    Remember: remember,
    Recall: recall,
}
# Each record by its job's name, for tests that pick a job by name.
RECORDS = {record.kind: record for record in HANDLERS}
