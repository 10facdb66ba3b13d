"""Plain sentences for what went wrong: a failed job, or an engine process that died.

Cheap to import on both sides of the process boundary: no torch, no Qt. Exceptions are
recognised by class name and text so that this module never needs torch to classify them.
"""

from __future__ import annotations

import signal
import sys
import traceback
from dataclasses import dataclass

from app.core.errors import HalfSafeError

DOING = {
    "load": "loading the model",
    "check": "running the health check",
    "generate": "generating",
    "explain": "explaining the image",
    "hardware": "checking this computer's devices",
    "ping": "starting up",
}


@dataclass(frozen=True)
class Failure:
    """One plain sentence for the user, details for the folded-away part, and the error class."""

    message: str
    details: str = ""
    error_type: str = ""


def _sentence(text: str) -> str:
    text = " ".join(text.split())
    if text and text[-1] not in ".!?":
        text += "."
    return text[:1].upper() + text[1:]


def describe_exception(error: BaseException, kind: str = "") -> Failure:
    """Turn an exception raised by a job into a Failure a user can act on."""
    doing = DOING.get(kind, "running the job")
    details = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    name = type(error).__name__
    text = str(error)
    first_line = text.strip().splitlines()[0] if text.strip() else ""
    lowered = text.lower()

    if isinstance(error, HalfSafeError):
        # An expected error says all it has in its sentence; a traceback under "Show Details"
        # would only make it look like a crash. The engine log keeps the traceback.
        return Failure(_sentence(text) or f"Something went wrong while {doing}.", "", name)
    if name == "OutOfMemoryError" or "out of memory" in lowered:
        return Failure(
            f"The GPU ran out of memory while {doing}; try a smaller image size or batch, a "
            "lower Memory budget in Settings so that large parts stream, or close other "
            "programs that use the GPU.",
            details,
            "OutOfMemoryError",
        )
    if isinstance(error, MemoryError):
        return Failure(
            f"The computer ran out of memory while {doing}; close other programs or try a "
            "smaller image size.",
            details,
            name,
        )
    if "cuda error" in lowered or "device-side assert" in lowered or "hip error" in lowered:
        return Failure(
            f"The GPU reported an error while {doing}; restart the engine to clear it.",
            details,
            "GPUError",
        )
    if isinstance(error, OSError) and error.filename:
        reason = error.strerror or first_line or name
        return Failure(_sentence(f"{error.filename}: {reason}"), details, name)
    return Failure(
        f"Something went wrong while {doing} ({name}); the details have the full report.",
        details,
        name,
    )


_SIGNAL_WORDS = {
    "SIGKILL": "The engine was killed (SIGKILL): by another program or a user (kill -9, a task "
    "manager), or by the system when memory runs out.",
    "SIGSEGV": "The engine crashed (segmentation fault), usually a fault in the GPU driver or a "
    "native library.",
    "SIGABRT": "The engine aborted after an internal error in PyTorch or the GPU driver.",
    "SIGTERM": "The engine was stopped by another program.",
    "SIGBUS": "The engine crashed (bus error): most often a model file was shortened or "
    "rewritten on disk while it was in use, so load it again once it is complete.",
    "SIGILL": "The engine crashed (illegal instruction): a library was built for a newer CPU.",
    "SIGFPE": "The engine crashed (arithmetic fault in a native library).",
}


def memory_left() -> float | None:
    """The fraction of the computer's memory still available (Linux's /proc/meminfo), or None
    where that cannot be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            values = {line.split(":")[0]: int(line.split()[1]) for line in meminfo if ":" in line}
        return values["MemAvailable"] / values["MemTotal"]
    except (OSError, KeyError, ValueError, IndexError, ZeroDivisionError):
        return None


def _killed_words(log_tail: str, available: float | None) -> str:
    """A SIGKILL is blamed on memory only with a sign of it: the log says so, or the computer
    is still nearly out of memory. Otherwise both causes are named, neither claimed."""
    if "out of memory" in log_tail or "memoryerror" in log_tail:
        return (
            "The engine was killed because the computer ran out of memory; close other "
            "programs or try a smaller image size."
        )
    if available is not None and available < 0.10:
        return (
            f"The engine was killed, most likely because memory ran out: only {available:.0%} "
            "of this computer's memory is free now."
        )
    return _SIGNAL_WORDS["SIGKILL"]


# Windows reports crashes as NTSTATUS exit codes.
_WINDOWS_CODES = {
    0xC0000005: "The engine crashed (access violation), usually a fault in the GPU driver or a "
    "native library.",
    0xC00000FD: "The engine crashed (stack overflow).",
    0xC0000409: "The engine aborted after an internal error in PyTorch or the GPU driver.",
    0xC0000017: "The engine stopped because the computer ran out of memory.",
}


def describe_exit(returncode: int | None, log_tail: str = "") -> Failure:
    """Say in words why the engine process ended, from its exit status and its last log lines."""
    details = f"Exit status: {returncode}\n\nLast lines of the engine log:\n{log_tail}".rstrip()
    lowered = log_tail.lower()
    if returncode is not None and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        message = _SIGNAL_WORDS.get(name, f"The engine stopped unexpectedly ({name}).")
        if name == "SIGKILL":
            message = _killed_words(lowered, memory_left())
        return Failure(message, details, name)
    if (
        returncode is not None
        and sys.platform == "win32"
        and (returncode & 0xFFFFFFFF) in _WINDOWS_CODES
    ):
        return Failure(_WINDOWS_CODES[returncode & 0xFFFFFFFF], details, "crash")
    if "out of memory" in lowered or "memoryerror" in lowered:
        return Failure(
            "The engine stopped because the computer or the GPU ran out of memory.",
            details,
            "OutOfMemory",
        )
    if returncode in (0, None):
        return Failure("The engine stopped unexpectedly.", details, "exit")
    return Failure(f"The engine stopped unexpectedly (exit status {returncode}).", details, "exit")
