"""GUI fixtures: a fake engine that speaks the real event type, and a main window built on it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from app.core.checkpoint import WeightScan
from app.core.images.pictures import Mode
from app.core.models.summary import ModelSummary
from app.engine.events import CancelRequest, EngineEvent, EventState, JobRequest, Message
from app.engine.failures import Failure, describe_exit


class FakeEngine:
    """Stands in for the engine process: records what the client sends, and lets a test send
    events and deaths back exactly as the process reader thread would. It sends no heartbeats
    (`heartbeat_s` None), so its silence means nothing, unless a test sets `heartbeat_s`."""

    def __init__(self) -> None:
        self.sent: list[Message] = []
        self.running = False
        self.stopped = False
        self.killed = False
        self.heartbeat_s: float | None = None
        self._on_event: Callable[[EngineEvent], None] | None = None
        self._on_exit: Callable[[Failure], None] | None = None

    def start(self, on_event, on_exit) -> None:
        self._on_event, self._on_exit = on_event, on_exit
        self.running = True

    def send(self, message: Message) -> None:
        if not self.running:
            raise BrokenPipeError("engine not running")
        self.sent.append(message)

    def stop(self, timeout: float = 5.0) -> None:
        self.running = False
        self.stopped = True

    def kill(self) -> None:
        self.running = False
        self.killed = True

    # Test side ----------------------------------------------------------------------------

    def jobs(self, kind: str | None = None) -> list[JobRequest]:
        return [m for m in self.sent if isinstance(m, JobRequest) and kind in (None, m.kind)]

    def last_job(self, kind: str) -> JobRequest:
        jobs = self.jobs(kind)
        assert jobs, f"no {kind} job was sent; sent: {self.sent}"
        return jobs[-1]

    def cancels(self) -> list[int]:
        return [m.job_id for m in self.sent if isinstance(m, CancelRequest)]

    def emit(self, job: JobRequest, state: EventState, **values: Any) -> None:
        assert self._on_event is not None
        self._on_event(EngineEvent(job.job_id, job.kind, state, **values))

    def finish(self, job: JobRequest, result: Any) -> None:
        self.emit(job, EventState.RESULT, result=result)

    def crash(self, returncode: int = -11, log: str = "") -> None:
        assert self._on_exit is not None
        self.running = False
        self._on_exit(describe_exit(returncode, log))


class FakeEngines:
    """The transport factory: every (re)start makes a new FakeEngine."""

    def __init__(self) -> None:
        self.started: list[FakeEngine] = []
        self.heartbeat_s: float | None = None  # what the engines started from now on promise

    def __call__(self) -> FakeEngine:
        engine = FakeEngine()
        engine.heartbeat_s = self.heartbeat_s
        self.started.append(engine)
        return engine

    @property
    def current(self) -> FakeEngine:
        assert self.started, "the engine was never started"
        return self.started[-1]


# What the engine sends back for the built-in demo, as core's own record.
DEMO_SUMMARY = ModelSummary(
    source="demo",
    name="demo",
    format="demo",
    architecture="sd1",
    prediction_type="epsilon",
    native_size=128,
    stored_dtype="fp32",
    profile_key="demo-1",
    weights=WeightScan(non_finite=[], tensors=250, bytes=4_000_000, seconds=0.1),
    detected_because=("The built-in demo is an SD 1.x-shaped pipeline.",),
    components=("text_encoder", "unet", "vae"),
    picture_modes={Mode.IMAGE: "", Mode.INPAINT: ""},  # an SD 1.x pipeline runs both
)


@pytest.fixture
def engines() -> FakeEngines:
    return FakeEngines()


@pytest.fixture
def window(qtbot, engines):
    from app.ui.application import application, build_main_window

    application()
    main = build_main_window(engines)
    qtbot.addWidget(main)
    main.show()
    qtbot.waitExposed(main)
    yield main
    main.dialogs.close_all()
    _delete(main)


def _delete(main) -> None:
    """Close the window and delete it now, with every widget it holds. A `deleteLater` posted
    outside an event loop waits for one that never runs in a test, so each window a test built
    stayed alive for the rest of the worker's run, and every later style or palette change
    repolished all of them (about 950 widgets a window)."""
    from PySide6.QtCore import QCoreApplication, QEvent

    main.close()
    main.deleteLater()
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete.value)


def load_fake_model(window, engines, summary: ModelSummary | None = None) -> JobRequest:
    """Load through the Models page and answer for the engine."""
    window.models_view.load_path("demo")
    job = engines.current.last_job("load")
    engines.current.finish(job, summary or DEMO_SUMMARY)
    assert window.state.model is not None
    return job


def pytest_collection_modifyitems(items):
    # Qt's offscreen platform plugin warns that it cannot propagate size hints whenever a
    # dialog opens; that is the test platform talking, not the app.
    for item in items:
        if "tests/ui/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.qt_log_ignore("propagateSizeHints"))
