"""Job kinds for exercising the engine itself: counting with cancel points, failing, crashing."""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time

from app.core.errors import BadFileError


def count(context, params):
    """`steps` steps of `seconds` each, a progress event and a cancel check per step."""
    steps = int(params.get("steps", 3))
    for step in range(1, steps + 1):
        time.sleep(float(params.get("seconds", 0.01)))
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
    context.session.extras["value"] = params["value"]
    return {}


def recall(context, params):
    return {"value": context.session.extras.get("value")}


HANDLERS = {
    "count": count,
    "deadlock": deadlock,
    "fail": fail,
    "bad_file": bad_file,
    "oom": oom,
    "segfault": segfault,
    "remember": remember,
    "recall": recall,
}
