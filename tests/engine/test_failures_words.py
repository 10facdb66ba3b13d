"""A killed engine is blamed on memory only with a sign of it."""

from __future__ import annotations

import signal

from app.engine import failures


def test_a_kill_without_a_sign_of_memory_names_both_causes(monkeypatch):
    monkeypatch.setattr(failures, "memory_left", lambda: 0.6)
    message = failures.describe_exit(-signal.SIGKILL, "step 3 of 25").message
    assert "killed" in message and "another program" in message
    assert "most likely" not in message and "ran out of memory" not in message


def test_a_kill_with_memory_nearly_gone_says_memory_most_likely(monkeypatch):
    monkeypatch.setattr(failures, "memory_left", lambda: 0.03)
    message = failures.describe_exit(-signal.SIGKILL, "").message
    assert "most likely because memory ran out" in message and "3%" in message


def test_a_kill_after_the_log_said_out_of_memory_blames_memory(monkeypatch):
    monkeypatch.setattr(failures, "memory_left", lambda: None)
    message = failures.describe_exit(-signal.SIGKILL, "RuntimeError: out of memory").message
    assert "ran out of memory" in message
