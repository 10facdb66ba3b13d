"""The GUI's one bridge to the engine process."""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal, Slot

from app.core.requests.records import Request
from app.engine.events import SILENCE_S, CancelRequest, EngineEvent, EventState, JobRequest
from app.engine.failures import Failure
from app.engine.process import EngineProcess, EngineTransport

JobHandler = Callable[[EngineEvent], None]


class EngineState:
    NOT_STARTED = "not started"
    STARTING = "starting"
    IDLE = "idle"
    BUSY = "busy"
    NOT_ANSWERING = "not answering"
    STOPPED = "stopped"


# A cancelled job that has not ended this long after Cancel is taken for a stuck engine (a
# deadlocked job: its heartbeat thread may still beat). Far above one denoising step.
CANCEL_GRACE_S = 60.0


@dataclass
class _PendingJob:
    kind: str
    params: Any
    handler: JobHandler | None


class EngineClient(QObject):
    """Starts the engine on first need, submits jobs, forwards its events, notices its death.

    Threading contract: call every method from the GUI thread. Every signal of this class, and
    every per-job handler passed to `submit`, is emitted or called in the GUI thread, in the
    order the engine sent its events. The transport reports from its own reader thread; those
    reports cross to the GUI thread through the private queued signals `_arrived` and `_ended`;
    the only other thing done on the reader thread is stamping the time the engine was last
    heard from (one float), so a busy GUI thread never makes a live engine look silent.

    Watching for a frozen engine: when the transport promises heartbeats, an engine silent for
    `silence_s` seconds is NOT_ANSWERING (`not_answering` is emitted; `answering` if it speaks
    again). Cancel on such an engine ends it at once; so does a Cancel that the engine has not
    honoured after `cancel_grace_s`. Either way its jobs end CANCELLED and `died` says why.

    Signals:
      job_event(EngineEvent): every event of every job, after that job's own handler ran.
      state_changed(str): one of EngineState's values.
      died(Failure): the engine ended without being asked to (or was ended for not answering);
        jobs it held got an ERROR (or CANCELLED) event.
      restarted(): a fresh engine was started by `restart`.
      not_answering(float): nothing heard from the engine for that many seconds.
      answering(): the engine spoke again after `not_answering`.
    """

    job_event = Signal(object)  # not `event`: that would hide QObject.event, Qt's dispatcher
    state_changed = Signal(str)
    died = Signal(object)
    restarted = Signal()
    not_answering = Signal(float)
    answering = Signal()

    _arrived = Signal(int, object)
    _ended = Signal(int, object)

    def __init__(
        self,
        transport_factory: Callable[[], EngineTransport] = EngineProcess,
        parent: QObject | None = None,
        *,
        silence_s: float = SILENCE_S,
        cancel_grace_s: float = CANCEL_GRACE_S,
    ) -> None:
        super().__init__(parent)
        self.silence_s = silence_s
        self.cancel_grace_s = cancel_grace_s
        self._last_heard = time.monotonic()
        self._last_check = time.monotonic()
        self._silent = False
        self._cancelled_at: dict[int, float] = {}
        self._watch = QTimer(self)
        self._watch.timeout.connect(self._check_engine)
        self._factory = transport_factory
        self._transport: EngineTransport | None = None
        self._generation = 0
        self._ids = itertools.count(1)
        self._pending: dict[int, _PendingJob] = {}
        self._state = EngineState.NOT_STARTED
        self.last_failure: Failure | None = None
        self._arrived.connect(self._on_arrived)
        self._ended.connect(self._on_ended)

    # Public API ------------------------------------------------------------------------------

    @property
    def state(self) -> str:
        return self._state

    @property
    def transport(self) -> EngineTransport | None:
        return self._transport

    @property
    def busy(self) -> bool:
        return bool(self._pending)

    def pending_kinds(self) -> list[str]:
        return [job.kind for job in self._pending.values()]

    def pending_request(self, kind: str) -> Any:
        """The request of the newest job of `kind` not ended yet (None: there is none)."""
        requests = [job.params for job in self._pending.values() if job.kind == kind]
        return requests[-1] if requests else None

    def ensure_started(self) -> bool:
        """Start the engine if it is not running; False (and `died`) if it cannot start."""
        if self._transport is not None and self._state != EngineState.STOPPED:
            return True
        self._generation += 1
        generation = self._generation
        transport = self._factory()
        self._set_state(EngineState.STARTING)
        self._last_heard = time.monotonic()
        self._silent = False
        try:
            transport.start(
                lambda event: self._heard(generation, event),
                lambda failure: self._ended.emit(generation, failure),
            )
        except OSError as error:
            self._transport = None
            self._fail(Failure(str(error), "", "StartFailed"))
            return False
        self._transport = transport
        self._set_state(EngineState.IDLE)
        if getattr(transport, "heartbeat_s", None):
            # Check a few times per silence period, so the verdict comes soon after it.
            self._last_check = time.monotonic()
            self._watch.start(max(20, min(1000, int(self.silence_s * 1000 / 4))))
        return True

    def submit(self, request: Request, handler: JobHandler | None = None) -> int:
        """Queue a job: `request` is its typed request (`app.core.requests.records`, or an
        engine extension's record), whose class picks the job. Returns its id. Starts the
        engine first if needed.

        If the engine cannot take the job, `handler` still gets a final ERROR event.
        """
        job_id = next(self._ids)
        kind = request.kind
        self._pending[job_id] = _PendingJob(kind, request, handler)
        self._set_state(EngineState.BUSY)
        if not self.ensure_started():
            return job_id
        try:
            assert self._transport is not None
            self._transport.send(JobRequest(job_id, request))
        except OSError:
            # The engine is gone; its reader thread will report the death and fail this job.
            pass
        return job_id

    def cancel(self, job_id: int) -> None:
        """Ask the engine to cancel a job; an engine that is not answering is ended instead."""
        if job_id not in self._pending or self._transport is None:
            return
        if self._silent:
            self._end_frozen_engine(
                f"The engine had not answered for {self._silence():.0f} s, so it was ended "
                "when you cancelled."
            )
            return
        self._cancelled_at.setdefault(job_id, time.monotonic())
        # A dead engine cancels nothing; its death is reported by the reader.
        with contextlib.suppress(OSError):
            self._transport.send(CancelRequest(job_id))

    def cancel_all(self) -> None:
        for job_id in list(self._pending):
            self.cancel(job_id)

    def restart(self) -> None:
        """Stop the engine (killing it if it does not stop at once) and start a fresh one.

        A fresh process also frees a GPU left in a bad state. Jobs the old engine held end
        with a CANCELLED event.
        """
        self._stop_transport(
            timeout=0.5, reason="Cancelled because the engine was restarted.", kill=self._silent
        )
        self.last_failure = None
        if self.ensure_started():
            self.restarted.emit()

    def shutdown(self, timeout: float = 2.0) -> None:
        """Stop the engine for good (window closing); no signals about its end follow."""
        self._stop_transport(
            timeout=timeout, reason="Cancelled because HalfSafe is closing.", kill=self._silent
        )

    # Internals -------------------------------------------------------------------------------

    def _stop_transport(self, timeout: float, reason: str, kill: bool = False) -> None:
        """Stop the engine (asking first, or killing a frozen one at once) and cancel its jobs."""
        transport, self._transport = self._transport, None
        self._generation += 1
        self._watch.stop()
        self._silent = False
        if transport is not None:
            if kill:
                transport.kill()
            else:
                transport.stop(timeout=timeout)
        self._finish_pending(EventState.CANCELLED, reason)
        self._set_state(EngineState.NOT_STARTED)

    def _heard(self, generation: int, event: EngineEvent) -> None:
        """Reader thread: stamp the time, then hand the event to the GUI thread."""
        if generation == self._generation:
            self._last_heard = time.monotonic()
        if event.state != EventState.HEARTBEAT:
            self._arrived.emit(generation, event)

    def _silence(self) -> float:
        return time.monotonic() - self._last_heard

    @Slot()
    def _check_engine(self) -> None:
        """GUI thread, on the watch timer: has the engine gone silent, or come back?"""
        if self._transport is None:
            return
        now = time.monotonic()
        late, self._last_check = now - self._last_check, now
        if late >= self.silence_s / 2:
            # This timer itself did not run for a long while (the computer slept): the
            # engine's silence says nothing then, so it is measured again from now.
            self._last_heard = max(self._last_heard, now)
            return
        silence = self._silence()
        if silence >= self.silence_s and not self._silent:
            self._silent = True
            self._set_state(EngineState.NOT_ANSWERING)
            self.not_answering.emit(silence)
        elif silence < self.silence_s and self._silent:
            self._silent = False
            self._set_state(EngineState.BUSY)
            self.answering.emit()
        if any(now - asked >= self.cancel_grace_s for asked in self._cancelled_at.values()):
            self._end_frozen_engine(
                f"The engine did not stop the job within {self.cancel_grace_s:g} s of Cancel, "
                "so it was ended."
            )

    def _end_frozen_engine(self, message: str) -> None:
        """Kill an engine that no longer answers; its jobs end CANCELLED, and `died` offers a
        restart like any other death."""
        self._stop_transport(
            timeout=0, reason="Cancelled; the engine was not answering, so it was ended.", kill=True
        )
        self._fail(Failure(message, "", "EngineNotAnswering"))

    def _set_state(self, state: str) -> None:
        if state in (EngineState.IDLE, EngineState.BUSY) and self._transport is not None:
            state = EngineState.BUSY if self._pending else EngineState.IDLE
            if self._silent:
                state = EngineState.NOT_ANSWERING
        if state != self._state:
            self._state = state
            self.state_changed.emit(state)

    def _finish_pending(
        self, state: EventState, message: str, details: str = "", error_type: str = ""
    ) -> None:
        pending, self._pending = self._pending, {}
        self._cancelled_at.clear()
        for job_id, job in pending.items():
            self._deliver(
                EngineEvent(
                    job_id, job.kind, state, message=message, details=details, error_type=error_type
                ),
                job,
            )

    def _deliver(self, event: EngineEvent, job: _PendingJob | None) -> None:
        if job is not None and job.handler is not None:
            job.handler(event)
        self.job_event.emit(event)

    def _fail(self, failure: Failure) -> None:
        self.last_failure = failure
        self._transport = None
        self._watch.stop()
        self._silent = False
        self._set_state(EngineState.STOPPED)
        self._finish_pending(EventState.ERROR, failure.message, failure.details, "EngineDied")
        self.died.emit(failure)

    @Slot(int, object)
    def _on_arrived(self, generation: int, event: EngineEvent) -> None:
        if generation != self._generation:
            return
        job = self._pending.get(event.job_id)
        if event.state.final:
            self._pending.pop(event.job_id, None)
            self._cancelled_at.pop(event.job_id, None)
        self._deliver(event, job)
        self._set_state(EngineState.BUSY)

    @Slot(int, object)
    def _on_ended(self, generation: int, failure: Failure) -> None:
        if generation != self._generation:
            return
        self._fail(failure)
