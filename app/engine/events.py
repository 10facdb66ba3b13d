"""What crosses the process boundary: job requests in, one event type out, and their framing.

Everything that crosses is plain, typed data: builtins, and HalfSafe's own records (dataclasses
and enums of `app.core` and `app.engine`, e.g. a `CheckRequest` in, a `HealthReport` out), so
that it pickles the same way in the GUI process and the engine process. Importing this module,
or reading a frame, never pulls in torch or Qt: any other class in a frame is refused.
"""

from __future__ import annotations

import dataclasses
import importlib
import io
import pickle
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, BinaryIO, TypeVar, Union

from app.core.models.summary import ModelSummary
from app.core.requests.records import LoadRequest, Request

if TYPE_CHECKING:  # the window unpickles them; it never imports what builds them
    from app.core.explain.explanation import Explanation
    from app.core.generation.records import GenerationResult
    from app.core.hardware.records import HardwareReport
    from app.core.health.report import CheckResult
    from app.core.requests.library_check import ModelChecks


class EventState(str, Enum):
    """Where a job stands. RESULT, ERROR and CANCELLED are final: no event follows them.

    HEARTBEAT belongs to no job (`job_id` 0, `kind` "engine"): the engine sends one every
    `HEARTBEAT_S` while it lives, so a frozen engine is noticed by its silence.
    """

    HEARTBEAT = "heartbeat"
    QUEUED = "queued"
    PROGRESS = "progress"
    PREVIEW = "preview"
    WARNING = "warning"
    RESULT = "result"
    ERROR = "error"
    CANCELLED = "cancelled"

    @property
    def final(self) -> bool:
        return self in (EventState.RESULT, EventState.ERROR, EventState.CANCELLED)


R = TypeVar("R")

# What a finished job gives back, by its request (`app.engine.jobs.HANDLERS`): a load's and a
# remembered fix's model, a check's, a run over many models', a generation's, an explanation's
# and the devices' records; a ping's (and an engine extension's) plain data; and the model a
# failed or cancelled load leaves loaded.
JobResult = Union[
    ModelSummary,
    "CheckResult",
    "ModelChecks",
    "GenerationResult",
    "Explanation",
    "HardwareReport",
    "StillLoaded",
    Mapping[str, object],
    None,
]


@dataclass(frozen=True)
class EngineEvent:
    """The one message the engine sends back, for every job and every state.

    `stage`, `done` and `total` describe progress ("Denoising", 5, 25). `message` is one plain
    sentence for WARNING, ERROR and CANCELLED; `details` holds what a user does not need to read
    (a traceback, the log path). `error_type` names the core exception class of an ERROR
    (e.g. "PickleRefusedError"), so the GUI can offer the right follow-up. `preview_png` is a PNG
    thumbnail for PREVIEW; `result` is the job's typed result for RESULT (a `HealthReport`, a
    `ModelSummary`, ...), and for the ERROR or CANCELLED of a load, a `StillLoaded`: the model
    the engine still holds (the previous one, kept or loaded again). `seconds` is how long a
    finished job ran in the engine.
    """

    job_id: int
    kind: str
    state: EventState
    stage: str = ""
    done: int = 0
    total: int = 0
    message: str = ""
    details: str = ""
    error_type: str = ""
    preview_png: bytes | None = None
    result: JobResult = None
    seconds: float = 0.0

    def result_as(self, kind: type[R]) -> R:
        """The result, which is a `kind` (the record the job's request gives back); another
        is a fault of the engine's, said as one."""
        if not isinstance(self.result, kind):
            raise TypeError(
                f"the engine's {self.kind} job gave back {type(self.result).__name__}, "
                f"not {kind.__name__}"
            )
        return self.result

    def result_or_none(self, kind: type[R]) -> R | None:
        """The result where it is a `kind`, else None (a failed load's `StillLoaded`, which
        an older engine may leave out)."""
        return self.result if isinstance(self.result, kind) else None


@dataclass(frozen=True)
class JobRequest:
    """Run the job `params` asks for once the jobs before it have finished: its typed request
    (a `CheckRequest`, say), whose class picks the engine's handler."""

    job_id: int
    params: Request

    @property
    def kind(self) -> str:
        """The job's name in its events ("check"); "unknown" for params that are no request
        (a plain dict or string), which the engine refuses with an ERROR event."""
        kind = getattr(type(self.params), "kind", None)
        return kind if isinstance(kind, str) else "unknown"


@dataclass(frozen=True)
class StillLoaded:
    """The result of a load that failed or was cancelled: the model the engine holds now (the
    one loaded before, kept or loaded again), and the request that loaded it; None for none."""

    model: ModelSummary | None
    request: LoadRequest | None


@dataclass(frozen=True)
class CancelRequest:
    """Cancel a job: dropped if still queued, interrupted at its next step if running."""

    job_id: int


@dataclass(frozen=True)
class ShutdownRequest:
    """Finish nothing more: cancel the running job and exit."""


Message = EngineEvent | JobRequest | CancelRequest | ShutdownRequest

# The engine's heartbeat interval, and how long the GUI waits without hearing anything before it
# says the engine stopped answering: many beats, so a busy machine is not mistaken for a frozen
# engine.
HEARTBEAT_S = 1.0
SILENCE_S = 15.0
ENGINE_EVENTS = 0  # the job id of events that belong to the engine, not a job


def heartbeat() -> EngineEvent:
    return EngineEvent(ENGINE_EVENTS, "engine", EventState.HEARTBEAT)


_HEADER = struct.Struct("<I")
# A preview is a few tens of kB and a result a few kB; anything near this is a broken stream.
MAX_FRAME = 256 * 1024 * 1024


class ProtocolError(Exception):
    """The byte stream between the processes is not a sequence of our frames."""


class StrayFrame(ProtocolError):
    """A whole frame that holds no message (undecodable, or a value of another type): the
    stream is still in step, so a reader may leave the frame out and read on."""


def encode(message: Message) -> bytes:
    """One frame: a 4-byte little-endian length, then the pickled message."""
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(payload)) + payload


def write_message(stream: BinaryIO, message: Message) -> None:
    stream.write(encode(message))
    stream.flush()


def read_message(stream: BinaryIO) -> Message | None:
    """The next message, or None at a clean end of stream. Raises ProtocolError on garbage:
    StrayFrame for a whole frame that holds no message (the next frame reads as usual)."""
    header = _read_exactly(stream, _HEADER.size)
    if header is None:
        return None
    (length,) = _HEADER.unpack(header)
    if length > MAX_FRAME:
        raise ProtocolError(f"frame of {length} bytes is larger than allowed")
    payload = _read_exactly(stream, length)
    if payload is None:
        raise ProtocolError("stream ended in the middle of a frame")
    try:
        message = _PlainUnpickler(io.BytesIO(payload)).load()
    except Exception as error:  # noqa: BLE001 - any unpickling failure is a protocol failure
        raise StrayFrame(f"frame could not be decoded: {error}") from error
    if not isinstance(message, (EngineEvent, JobRequest, CancelRequest, ShutdownRequest)):
        raise StrayFrame(f"unexpected message type {type(message).__name__}")
    return message


def unreadable(message: Message) -> str | None:
    """Why the other side would refuse `message` (`read_message` raising ProtocolError, which
    ends the stream), or None when it reads back as it is: the engine asks this before it
    writes, so that one value that is not plain data fails its job, not the engine."""
    try:
        _PlainUnpickler(io.BytesIO(pickle.dumps(message, pickle.HIGHEST_PROTOCOL))).load()
    except Exception as error:  # noqa: BLE001 - any failure is the answer
        return f"{type(error).__name__}: {error}"
    return None


# Modules besides HalfSafe's whose records an engine reads: a handlers module it was started
# with (`python -m app.engine --handlers MODULE`) brings its own job requests.
_EXTRA_RECORD_MODULES: set[str] = set()


def allow_records_from(module: str) -> None:
    """Let `read_message` build the dataclasses of `module` too (an engine extension's own job
    requests); nothing else of it."""
    _EXTRA_RECORD_MODULES.add(module)


class _PlainUnpickler(pickle.Unpickler):
    """Builds only builtins (which pickle builds without naming a class), this module's
    messages and HalfSafe's own records: the dataclasses and enums of `app.core` and
    `app.engine`, whose modules import neither torch nor Qt. Any other class would import its
    module here: torch into the GUI process (which must never load it), or anything at all
    from a bad frame."""

    def find_class(self, module: str, name: str) -> Any:
        ours = module.split(".")[:2] in (["app", "core"], ["app", "engine"])
        if (ours or module in _EXTRA_RECORD_MODULES) and name.isidentifier():
            found = getattr(importlib.import_module(module), name, None)
            if isinstance(found, type) and (
                dataclasses.is_dataclass(found) or issubclass(found, Enum)
            ):
                return found
        raise pickle.UnpicklingError(
            f"it holds a {module}.{name}, not plain data (builtins and HalfSafe's records)"
        )


def _read_exactly(stream: BinaryIO, size: int) -> bytes | None:
    buffer = io.BytesIO()
    remaining = size
    while remaining:
        chunk = stream.read(remaining)
        if not chunk:
            if buffer.tell() == 0:
                return None
            raise ProtocolError("stream ended in the middle of a frame")
        buffer.write(chunk)
        remaining -= len(chunk)
    return buffer.getvalue()
