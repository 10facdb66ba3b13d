"""A damaged self-test cache costs a re-run, never a hang or a traceback: a FIFO in its place, a
document nested 200,000 deep, a text where a low-bit call belongs, an 8 GB sparse file. Through
the real command (`gpu` and `advise`, which describe the devices from the cache, as `generate`
does), in a subprocess under a timeout so that a hang fails the test instead of the suite."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from app.core.hardware import dtype_speed, selftest
from app.core.hardware.probe import _probe_cpu
from app.core.hardware.selftest_cache import self_test_key
from tests.support.cli_output import run_halfsafe

SECONDS = 120  # generous for a loaded 2-core machine; each command takes a few seconds


def _deep(path: Path, key: str) -> None:
    nested = "[" * 200_000 + "]" * 200_000
    path.write_text(f'{{"key": {json.dumps(key)}, "result": {nested}}}')


def _text_for_a_call(path: Path, key: str) -> None:
    result = {"fp16": "fail", "bf16": "pass", "low_bit": {"calls": ["int8 GEMM"]}}
    path.write_text(json.dumps({"key": key, "result": result}))


def _sparse(path: Path, key: str) -> None:
    with path.open("wb") as handle:
        handle.truncate(8 << 30)  # 8 GB that take no disk


def _fifo(path: Path, key: str) -> None:
    os.mkfifo(path)


DAMAGE = {"nested 200,000 deep": _deep, "a text for a low-bit call": _text_for_a_call}
DAMAGE["8 GB sparse file"] = _sparse
if hasattr(os, "mkfifo"):
    DAMAGE["FIFO"] = _fifo


def cpu_cache() -> tuple[Path, str]:
    """Where the CPU's self-test is cached (the command computes the same key), and the key."""
    key = self_test_key(_probe_cpu())
    path = selftest.cache_path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path, key


def cpu_self_test(document: dict) -> dict:
    return next(d for d in document["devices"] if d["kind"] == "cpu")["self_test"]


def test_a_sound_cache_is_what_the_command_reads():
    """The control: the same path, well formed, is read (so the cases below reach the file)."""
    path, key = cpu_cache()
    path.write_text(
        json.dumps({"key": key, "result": {"fp16": "fail", "bf16": "pass", "details": []}})
    )

    done = run_halfsafe("gpu", "--no-self-test", "--json", timeout=SECONDS)

    assert done.returncode == 0, done.stderr[-2000:]
    assert cpu_self_test(json.loads(done.stdout))["fp16"] == "fail"


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_cache_is_no_cache_for_gpu(damage):
    path, key = cpu_cache()
    DAMAGE[damage](path, key)

    shown = run_halfsafe("gpu", "--no-self-test", "--json", timeout=SECONDS)

    assert shown.returncode == 0, shown.stderr[-2000:]
    assert cpu_self_test(json.loads(shown.stdout))["fp16"] == "skipped"
    assert "Traceback" not in shown.stderr


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")
def test_advise_does_not_wait_on_a_fifo_in_the_cache():
    path, key = cpu_cache()
    _fifo(path, key)

    advised = run_halfsafe("advise", "sdxl", "--device", "cpu", timeout=SECONDS)

    assert advised.returncode == 0, advised.stderr[-2000:]
    assert "Traceback" not in advised.stderr and "SDXL" in advised.stdout


def _within(seconds: float, function, *args):
    """What `function(*args)` returns, run on a watched thread: a hang fails the test."""
    found: list = []
    worker = threading.Thread(target=lambda: found.append(function(*args)), daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"{function.__name__} still running after {seconds} s: a hang"
    assert found, f"{function.__name__} raised"
    return found[0]


# In this process: never the sparse file, which a reader that regressed would load whole.
@pytest.mark.parametrize("damage", sorted(set(DAMAGE) - {"8 GB sparse file"}))
def test_a_damaged_speed_table_beside_it_is_no_table(damage):
    _, key = cpu_cache()
    path = dtype_speed.cache_path(key)
    DAMAGE[damage](path, key)

    assert _within(30, dtype_speed.cached, key) is None
