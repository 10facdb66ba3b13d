"""A frozen engine is noticed: after a stated silence the window says the engine stopped
answering and offers Restart, and Cancel ends it. With the fake engine for the words, and with
real engine processes stopped by SIGSTOP (or stuck in a deadlock), the heartbeat and the
silence shortened by parameter."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from app.core.requests.records import PingRequest
from app.engine.events import EngineEvent, EventState, heartbeat
from app.engine.process import EngineProcess
from app.ui.engine_client import EngineState
from tests.support.sample_jobs import Count, Deadlock

posix_only = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


# With the fake engine: the client's watch and the window's words ----------------------------


def test_silence_of_an_engine_that_promises_no_heartbeat_means_nothing(window, engines, qtbot):
    window.client.silence_s = 0.1
    window.client.submit(Count())
    qtbot.wait(400)
    assert window.client.state == EngineState.BUSY
    assert not window.engine_banner.isVisible()


def test_a_silent_engine_is_reported_with_restart_and_recovers_when_it_speaks(
    window, engines, qtbot
):
    engines.heartbeat_s = 0.05
    window.client.silence_s = 0.3
    with qtbot.waitSignal(window.client.not_answering, timeout=3000) as silent:
        window.client.submit(Count())
    assert silent.args[0] >= 0.3
    assert "stopped answering" in window.engine_banner.text.text()
    assert "Restart engine" in window.engine_banner.buttons
    assert window.client.state == EngineState.NOT_ANSWERING
    assert window.engine_status.text() == "Engine: not answering"

    with qtbot.waitSignal(window.client.answering, timeout=3000):
        engines.current._on_event(heartbeat())
    assert not window.engine_banner.isVisible()
    assert window.client.state == EngineState.BUSY


def test_after_the_computer_slept_silence_is_measured_again(window, engines, qtbot):
    engines.heartbeat_s = 0.05
    window.client.silence_s = 10
    window.client.submit(Count())
    # As after a suspend: neither the engine nor this window's timer ran for a minute.
    window.client._last_heard -= 60
    window.client._last_check -= 60
    window.client._check_engine()
    assert window.client.state == EngineState.BUSY
    assert not window.engine_banner.isVisible()
    window.client._last_heard -= 60  # but a real silence after that is still noticed
    window.client._check_engine()
    assert window.client.state == EngineState.NOT_ANSWERING


def test_cancel_on_a_silent_engine_ends_it_and_offers_restart(window, engines, qtbot):
    engines.heartbeat_s = 0.05
    window.client.silence_s = 0.3
    ended: list[EngineEvent] = []
    with qtbot.waitSignal(window.client.not_answering, timeout=3000):
        window.client.submit(Count(), ended.append)
    with qtbot.waitSignal(window.client.died, timeout=3000) as died:
        window.client.cancel_all()
    assert engines.current.killed
    assert [e.state for e in ended] == [EventState.CANCELLED]
    assert "ended when you cancelled" in died.args[0].message
    assert "Restart engine" in window.engine_banner.buttons
    window.restart_engine()
    assert len(engines.started) == 2 and engines.current.running


def test_a_cancel_that_is_never_honoured_ends_the_engine(window, engines, qtbot):
    engines.heartbeat_s = 0.05
    window.client.silence_s = 60
    window.client.cancel_grace_s = 0.3
    ended: list[EngineEvent] = []
    job_id = window.client.submit(Count(), ended.append)
    fake = engines.current
    window.client.cancel(job_id)
    started = time.monotonic()
    while not ended:  # the engine keeps beating, but the job never ends
        fake._on_event(heartbeat())
        qtbot.wait(50)
        assert time.monotonic() - started < 5
    assert fake.killed and ended[0].state == EventState.CANCELLED
    assert "did not stop the job" in window.client.last_failure.message


# With a real engine process ----------------------------------------------------------------


@pytest.fixture
def real_engine_window(qtbot):
    """The window on a real engine with the sample jobs, beating every 0.1 s, judged silent
    after 1 s; the engine is continued and ended whatever the test did to it."""
    from app.ui.application import application, build_main_window

    application()
    started: list[EngineProcess] = []

    def factory() -> EngineProcess:
        started.append(
            EngineProcess(extra_args=["--handlers", "tests.support.sample_jobs"], heartbeat_s=0.1)
        )
        return started[-1]

    window = build_main_window(factory)
    window.client.silence_s = 1.0
    qtbot.addWidget(window)
    window.show()
    yield window, started
    for engine in started:
        if engine.running and sys.platform != "win32":
            os.kill(engine.pid, signal.SIGCONT)
    window.close()
    window.dialogs.close_all()
    for engine in started:
        engine.kill()


def _first_step(qtbot, events: list[EngineEvent]) -> None:
    qtbot.waitUntil(
        lambda: any(e.state == EventState.PROGRESS and e.done > 0 for e in events), timeout=60_000
    )


@posix_only
def test_sigstopped_engine_is_noticed_and_cancel_ends_it(real_engine_window, qtbot):
    window, started = real_engine_window
    events: list[EngineEvent] = []
    window.client.submit(Count(steps=100_000, seconds=0.01), events.append)
    _first_step(qtbot, events)
    engine = started[-1]
    os.kill(engine.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    with qtbot.waitSignal(window.client.not_answering, timeout=10_000):
        pass
    noticed = time.monotonic() - stopped
    assert 0.8 <= noticed < 5, noticed
    assert "stopped answering" in window.engine_banner.text.text()
    assert "Restart engine" in window.engine_banner.buttons

    cancelled = time.monotonic()
    with qtbot.waitSignal(window.client.died, timeout=10_000):
        window.client.cancel_all()
    assert time.monotonic() - cancelled < 5
    assert not engine.running  # killed, though stopped
    assert events[-1].state == EventState.CANCELLED
    assert "The engine stopped." in window.engine_banner.text.text()

    # Restart gives a fresh engine that answers.
    window.restart_engine()
    answers: list[EngineEvent] = []
    window.client.submit(PingRequest(), answers.append)
    qtbot.waitUntil(lambda: bool(answers) and answers[-1].state.final, timeout=60_000)
    assert answers[-1].state == EventState.RESULT
    assert answers[-1].result["pid"] == started[-1].pid != engine.pid


@posix_only
def test_a_continued_engine_is_answering_again_and_finishes_its_job(real_engine_window, qtbot):
    window, started = real_engine_window
    events: list[EngineEvent] = []
    window.client.submit(Count(steps=30, seconds=0.02), events.append)
    _first_step(qtbot, events)
    engine = started[-1]
    os.kill(engine.pid, signal.SIGSTOP)
    with qtbot.waitSignal(window.client.not_answering, timeout=10_000):
        pass
    with qtbot.waitSignal(window.client.answering, timeout=10_000):
        os.kill(engine.pid, signal.SIGCONT)
    assert not window.engine_banner.isVisible()
    qtbot.waitUntil(lambda: events[-1].state.final, timeout=60_000)
    assert events[-1].state == EventState.RESULT and events[-1].result["counted"] == 30


def test_a_deadlocked_job_is_ended_when_cancel_goes_unanswered(real_engine_window, qtbot):
    window, started = real_engine_window
    window.client.cancel_grace_s = 1.0
    events: list[EngineEvent] = []
    window.client.submit(Deadlock(), events.append)
    _first_step(qtbot, events)
    qtbot.wait(1500)  # the heartbeat thread still beats: not reported as silent
    assert window.client.state == EngineState.BUSY
    cancelled = time.monotonic()
    with qtbot.waitSignal(window.client.died, timeout=10_000) as died:
        window.client.cancel_all()
    assert time.monotonic() - cancelled < 5
    assert not started[-1].running
    assert events[-1].state == EventState.CANCELLED
    assert "did not stop the job" in died.args[0].message
