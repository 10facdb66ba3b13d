"""The engine's heartbeat: it beats while the engine lives, busy or idle, and falls silent when
the process is stopped; a stopped engine can still be ended at once."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import ClassVar

import pytest

from app.engine.events import ENGINE_EVENTS, EngineEvent, EventState, JobRequest
from app.engine.process import EngineProcess
from app.engine.server import Engine
from tests.support.sample_jobs import Count


@dataclass(frozen=True)
class _Quick:
    kind: ClassVar[str] = "quick"


BEAT = 0.05


class Heard:
    """Everything a process sent, with arrival times, and its end."""

    def __init__(self) -> None:
        self.events: list[tuple[float, EngineEvent]] = []
        self.exits: list = []
        self.lock = threading.Lock()

    def __call__(self, event: EngineEvent) -> None:
        with self.lock:
            self.events.append((time.monotonic(), event))

    def beats_since(self, moment: float) -> int:
        with self.lock:
            return sum(
                1 for at, e in self.events if at >= moment and e.state == EventState.HEARTBEAT
            )

    def wait_for(self, condition, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.01)


def test_heartbeats_belong_to_no_job_and_stop_with_the_engine():
    sent: list[EngineEvent] = []
    engine = Engine(sent.append, {})
    beater = engine.beat(0.01)
    deadline = time.monotonic() + 10
    while len(sent) < 3:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert all(e.state == EventState.HEARTBEAT and e.job_id == ENGINE_EVENTS for e in sent)
    assert not EventState.HEARTBEAT.final
    engine.stop()
    beater.join(2)
    assert not beater.is_alive()


def test_a_beating_engine_still_starts_every_job():
    """The beat thread must never take the wake-up meant for the worker: with it waiting
    first, every job is still run."""
    sent: list[EngineEvent] = []
    finished = threading.Event()

    def quick(context, params):
        return {}

    engine = Engine(sent.append, {_Quick: quick})
    engine.beat(30.0)
    time.sleep(0.1)  # the beat thread is waiting before the worker
    worker = threading.Thread(target=lambda: (engine.serve(), finished.set()), daemon=True)
    worker.start()
    time.sleep(0.1)
    for job_id in range(1, 6):
        engine.receive(JobRequest(job_id, _Quick()))
        deadline = time.monotonic() + 5
        while not any(e.job_id == job_id and e.state.final for e in sent):
            assert time.monotonic() < deadline, f"job {job_id} never started"
            time.sleep(0.01)
    engine.stop()
    assert finished.wait(5)


@pytest.fixture
def process():
    engine = EngineProcess(extra_args=["--handlers", "tests.support.sample_jobs"], heartbeat_s=BEAT)
    heard = Heard()
    engine.start(heard, heard.exits.append)
    yield engine, heard
    if engine.running and sys.platform != "win32":
        os.kill(engine.pid, signal.SIGCONT)
    engine.stop(timeout=2)


def test_a_busy_engine_keeps_beating(process):
    engine, heard = process
    engine.send(JobRequest(1, Count(steps=40, seconds=0.02)))
    heard.wait_for(lambda: any(e.job_id == 1 and e.state == EventState.PROGRESS
                               for _, e in heard.events))  # fmt: skip
    started = time.monotonic()
    heard.wait_for(lambda: heard.beats_since(started) >= 5, timeout=10)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_a_stopped_engine_falls_silent_and_kill_ends_it_at_once(process):
    engine, heard = process
    started = time.monotonic()
    heard.wait_for(lambda: heard.beats_since(started) >= 2)
    os.kill(engine.pid, signal.SIGSTOP)
    time.sleep(BEAT * 2)  # a beat already on its way may still land
    quiet_from = time.monotonic()
    time.sleep(BEAT * 8)
    assert heard.beats_since(quiet_from) == 0
    os.kill(engine.pid, signal.SIGCONT)
    resumed = time.monotonic()
    heard.wait_for(lambda: heard.beats_since(resumed) >= 2, timeout=10)

    os.kill(engine.pid, signal.SIGSTOP)
    killed = time.monotonic()
    engine.kill()
    assert time.monotonic() - killed < 3
    assert not engine.running
    assert heard.exits == []  # asked for: not reported as a death
