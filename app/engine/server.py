"""The engine's job loop: one job at a time from a queue, cancel from a listener thread.

Threads: the listener thread reads requests and only touches the queue and the running job's
cancel token; the thread that calls `serve` runs the jobs. Events go out through `send`, which
is called from both threads and is serialised here with a lock.
"""

from __future__ import annotations

import io
import sys
import threading
import time
import traceback
import warnings
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from app.core.errors import CancelledError
from app.core.jobs import CancelToken
from app.core.models.summary import ModelSummary
from app.core.requests.records import LoadRequest
from app.engine.events import (
    ENGINE_EVENTS,
    HEARTBEAT_S,
    CancelRequest,
    EngineEvent,
    EventState,
    JobRequest,
    Message,
    ShutdownRequest,
    StillLoaded,
    heartbeat,
    unreadable,
)
from app.engine.failures import describe_exception

PREVIEW_EDGE = 256


@dataclass
class Session:
    """What the engine keeps between jobs: the loaded model and anything derived from it."""

    model: Any = None
    model_summary: ModelSummary | None = None
    model_request: LoadRequest | None = None  # the request that loaded `model`
    extras: dict[str, Any] = field(default_factory=dict)


class JobContext:
    """What a job handler gets: its cancel token, ways to report, and the engine's session."""

    def __init__(
        self,
        job: JobRequest,
        session: Session,
        send: Callable[[EngineEvent], None],
        cancel: CancelToken,
    ) -> None:
        self.job = job
        self.session = session
        self.cancel = cancel
        self._send = send

    def _event(self, state: EventState, **values: Any) -> None:
        self._send(EngineEvent(self.job.job_id, self.job.kind, state, **values))

    def progress(self, stage: str, done: int, total: int) -> None:
        """Matches app.core.jobs.ProgressCallback; also a cancellation point."""
        self.tell(stage, done, total)
        self.cancel.raise_if_cancelled()

    def tell(self, stage: str, done: int, total: int) -> None:
        """Progress that is no cancellation point, for work a cancel must not stop: loading
        the user's model back after the job that replaced it was cancelled."""
        # A stage may be a str of HalfSafe's own kind (a check's Headline): it crosses as text.
        self._event(EventState.PROGRESS, stage=str(stage), done=int(done), total=int(total))

    def preview(self, step: int, image: Any) -> None:
        """Send a PIL image as a small PNG (matches core's `on_preview(step, image)`)."""
        thumbnail = image.copy()
        thumbnail.thumbnail((PREVIEW_EDGE, PREVIEW_EDGE))
        buffer = io.BytesIO()
        thumbnail.save(buffer, format="PNG", compress_level=1)
        self._event(
            EventState.PREVIEW, stage="Preview", done=int(step), preview_png=buffer.getvalue()
        )

    def warn(self, message: str) -> None:
        self._event(EventState.WARNING, message=message)


# A job: its context and its typed request in, its typed result out.
Handler = Callable[[JobContext, Any], Any]


class Engine:
    """Runs jobs one at a time in the order they arrive; see the module docstring for threads."""

    def __init__(
        self, send: Callable[[EngineEvent], None], handlers: Mapping[type, Handler]
    ) -> None:
        self._send_raw = send
        self._send_lock = threading.Lock()
        self.handlers = dict(handlers)
        self.session = Session()
        self._queue: deque[JobRequest] = deque()
        self._condition = threading.Condition()
        self._running: tuple[int, CancelToken] | None = None
        self._stopping = False
        self._stop_beating = threading.Event()

    def send(self, event: EngineEvent) -> None:
        """Write one event. One the window could not read back (a value in it that is not
        plain data) would end the stream and the engine with it: a job's final event goes out
        as its ERROR instead, any other event is left out, and the log says what it held."""
        problem = unreadable(event)
        if problem is not None:
            print(
                f"[engine] an event of job {event.job_id} ({event.kind}, {event.state.name}) "
                f"could not be sent: {problem}",
                file=sys.stderr,
                flush=True,
            )
            if not event.state.final:
                return
            event = EngineEvent(
                event.job_id,
                event.kind,
                EventState.ERROR,
                message="The engine made an answer the window cannot read; nothing was changed.",
                details=problem,
                error_type="UnreadableAnswer",
            )
        with self._send_lock:
            self._send_raw(event)

    # Listener side -------------------------------------------------------------------------

    def receive(self, message: Message) -> None:
        """Handle one request; called from the listener thread, returns at once. A job whose
        request no handler takes (a plain dict or string where a request belongs) is answered
        with its ERROR at once, never queued: the engine goes on."""
        if isinstance(message, JobRequest):
            refusal = self._refusal(message)
            if refusal is not None:
                self.send(refusal)
                return
            with self._condition:
                if self._stopping:
                    return
                self._queue.append(message)
                position = len(self._queue) + (1 if self._running else 0)
                # Sent under the lock, so QUEUED always goes out before the job's first event.
                self.send(
                    EngineEvent(
                        message.job_id,
                        message.kind,
                        EventState.QUEUED,
                        stage="Waiting",
                        done=0,
                        total=position,
                    )
                )
                self._condition.notify()
        elif isinstance(message, CancelRequest):
            self.cancel(message.job_id)
        elif isinstance(message, ShutdownRequest):
            self.stop()

    def _refusal(self, job: JobRequest) -> EngineEvent | None:
        """The ERROR that answers a job this engine cannot run, or None for one it can."""
        job_id = job.job_id
        if not isinstance(job_id, int) or isinstance(job_id, bool):
            print(f"[engine] a job numbered {job_id!r} was refused", file=sys.stderr, flush=True)
            return _refused(ENGINE_EVENTS, "engine", "A job without a job number was refused.")
        if type(job.params) in self.handlers:
            return None
        asked = type(job.params).__name__
        print(f"[engine] job {job_id}: no handler takes a {asked}", file=sys.stderr, flush=True)
        if job.kind != "unknown":  # a request of a kind this engine was not given
            return _refused(job_id, job.kind, f"This engine cannot run '{job.kind}' jobs.")
        return _refused(
            job_id, job.kind, f"This engine cannot run a job asked as a {asked}; nothing ran."
        )

    def refuse_frame(self, problem: str) -> None:
        """Answer a frame that held no message (the listener reads on): one line in the log,
        an ERROR of the engine's own."""
        print(f"[engine] a request could not be read: {problem}", file=sys.stderr, flush=True)
        self.send(
            _refused(ENGINE_EVENTS, "engine", "A request the engine cannot read was refused.")
        )

    def cancel(self, job_id: int) -> None:
        dropped: JobRequest | None = None
        with self._condition:
            for job in self._queue:
                if job.job_id == job_id:
                    dropped = job
                    break
            if dropped is not None:
                self._queue.remove(dropped)
            elif self._running and self._running[0] == job_id:
                self._running[1].cancel()
        if dropped is not None:
            self.send(
                EngineEvent(
                    dropped.job_id,
                    dropped.kind,
                    EventState.CANCELLED,
                    message="Cancelled before it started.",
                )
            )

    def beat(self, interval: float = HEARTBEAT_S) -> threading.Thread:
        """Send a HEARTBEAT every `interval` seconds from a thread of its own until `stop`.

        Its own thread, so that a long job (a model load, one slow step) never looks frozen;
        what it proves is that the process runs and its Python is not stuck (a SIGSTOP, a
        native call that hangs holding the GIL). A job stuck on its own is caught by the GUI
        when Cancel does not end it.
        """

        def run() -> None:
            # An Event of its own, not the job queue's condition: a beat thread waiting there
            # could take the one notify() meant to wake the worker, and a job would never start.
            while not self._stop_beating.wait(interval):
                try:
                    self.send(heartbeat())
                except OSError:  # the GUI is gone; the listener stops the engine
                    return

        thread = threading.Thread(target=run, name="engine-heartbeat", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        """Stop after the running job notices its cancel token; queued jobs are dropped."""
        self._stop_beating.set()
        with self._condition:
            self._stopping = True
            dropped = list(self._queue)
            self._queue.clear()
            if self._running:
                self._running[1].cancel()
            self._condition.notify_all()
        for job in dropped:
            self.send(
                EngineEvent(
                    job.job_id,
                    job.kind,
                    EventState.CANCELLED,
                    message="Cancelled because the engine is stopping.",
                )
            )

    # Worker side ---------------------------------------------------------------------------

    def serve(self) -> None:
        """Run jobs until `stop`; call from the thread that should own torch."""
        while True:
            with self._condition:
                while not self._queue and not self._stopping:
                    self._condition.wait()
                if self._stopping:
                    return
                job = self._queue.popleft()
                token = CancelToken()
                self._running = (job.job_id, token)
            try:
                self.run(job, token)
            finally:
                with self._condition:
                    self._running = None

    def _still_loaded(self, job: JobRequest) -> StillLoaded | None:
        """For a load that failed or was cancelled: which model the engine holds now (the one
        loaded before it, kept or loaded again), so the GUI never shows a model that is gone."""
        if job.kind != "load":
            return None
        return StillLoaded(self.session.model_summary, self.session.model_request)

    def run(self, job: JobRequest, token: CancelToken) -> None:
        """Run one job to its final event (RESULT, ERROR or CANCELLED)."""
        context = JobContext(job, self.session, self.send, token)
        handler = self.handlers.get(type(job.params))
        if handler is None:
            self.send(
                EngineEvent(
                    job.job_id,
                    job.kind,
                    EventState.ERROR,
                    message=f"This engine cannot run '{job.kind}' jobs.",
                    error_type="UnknownJob",
                )
            )
            return
        started = time.monotonic()
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                context.progress("Starting", 0, 0)
                result = handler(context, job.params)
            for warning in _own_warnings(caught):
                context.warn(warning)
        except CancelledError as error:
            self.send(
                EngineEvent(
                    job.job_id,
                    job.kind,
                    EventState.CANCELLED,
                    message=str(error),
                    result=self._still_loaded(job),
                )
            )
            return
        except BaseException as error:  # noqa: BLE001 - every failure becomes an ERROR event
            if isinstance(error, (KeyboardInterrupt, SystemExit)):
                raise
            failure = describe_exception(error, job.kind)
            _log_failure(job.kind, error)
            self.send(
                EngineEvent(
                    job.job_id,
                    job.kind,
                    EventState.ERROR,
                    message=failure.message,
                    details=failure.details,
                    error_type=failure.error_type,
                    result=self._still_loaded(job),
                )
            )
            return
        if token.cancelled and job.kind in ("load",):
            # A load that finished after cancel was asked: honour the cancel, drop the model.
            self.session.model = None
            self.session.model_summary = None
            self.session.model_request = None
            self.send(
                EngineEvent(
                    job.job_id,
                    job.kind,
                    EventState.CANCELLED,
                    message="Cancelled.",
                    result=self._still_loaded(job),
                )
            )
            return
        seconds = round(time.monotonic() - started, 3)
        self.send(
            EngineEvent(job.job_id, job.kind, EventState.RESULT, result=result, seconds=seconds)
        )


def _refused(job_id: int, kind: str, message: str) -> EngineEvent:
    return EngineEvent(job_id, kind, EventState.ERROR, message=message, error_type="UnknownJob")


def _log_failure(kind: str, error: BaseException) -> None:
    """Every failed job's traceback goes to the engine log (its stderr), expected errors'
    included, whose ERROR event carries only their sentence."""
    print(f"engine: {kind} job failed:", file=sys.stderr)
    traceback.print_exception(type(error), error, error.__traceback__, file=sys.stderr)


def _own_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    """Warnings that HalfSafe's own code raised for the user; library noise goes to the log."""
    seen: list[str] = []
    for item in caught:
        filename = (item.filename or "").replace("\\", "/")
        if "/app/core/" in filename or "/app/engine/" in filename:
            text = str(item.message)
            if text not in seen:
                seen.append(text)
        else:
            warnings.showwarning(item.message, item.category, item.filename, item.lineno)
    return seen
