"""The bad-input contract as the tests hold a refusal to it: a call bounded in time, one plain
sentence naming the file, and the CLI's exit 2 with one line on stderr, run in a subprocess
with capped memory."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from app.core.errors import BadFileError
from tests.support.cli_output import without_progress

ROOT = Path(__file__).resolve().parents[2]
# Generous for a loaded 2-core machine; the cases themselves take well under a second each.
SECONDS = 60


def bounded(function, *args, seconds: float = SECONDS, **kwargs):
    """Run `function` on a watched thread; fail the test if it is still running after `seconds`
    (a hang), else return what it returned or raised, as ("ok", value) or ("error", exception)."""
    outcome: list[tuple[str, object]] = []

    def run() -> None:
        try:
            outcome.append(("ok", function(*args, **kwargs)))
        except BaseException as error:  # handed to the test thread
            outcome.append(("error", error))

    worker = threading.Thread(target=run, daemon=True)
    started = time.monotonic()
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        pytest.fail(f"{function.__name__} still running after {seconds} s: a hang")
    assert time.monotonic() - started < seconds
    return outcome[0]


def refused(function, *args, **kwargs) -> BaseException:
    kind, value = bounded(function, *args, **kwargs)
    assert kind == "error", f"expected a refusal, got {value!r}"
    assert isinstance(value, BaseException)
    return value


def assert_sentence(error: BaseException, path: Path, words: str = "") -> str:
    """One plain sentence that names the file (and says `words`), from a BadFileError."""
    assert isinstance(error, BadFileError), repr(error)
    text = str(error)
    assert str(path) in text, text
    assert "\n" not in text and text.endswith("."), text
    assert "Traceback" not in text
    assert words in text, text
    return text


_CLI = """
import resource, sys
limit = int(sys.argv[1]) << 30
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
from app.cli import main
sys.exit(main(sys.argv[2:]))
"""


def run_cli(*argv: str, memory_gib: int = 4, timeout: float = 180, prelude: str = ""):
    """`halfsafe ARGV` in a subprocess with at most `memory_gib` of address space and `timeout`
    seconds; `prelude` is Python run first (to plant a fault)."""
    code = prelude + _CLI
    return subprocess.run(
        [sys.executable, "-c", code, str(memory_gib), *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_cannot_run(result, path: Path, words: str = "") -> str:
    """Exit 2, one line on stderr naming the file, no traceback (the CLI contract)."""
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    # A command that runs a while prints progress lines first on a slow or busy machine
    # ("..., 7 s so far"); past those, the refusal is one line.
    err = without_progress(result.stderr)
    assert err.count("\n") == 1 and err.startswith("halfsafe: "), err
    assert str(path) in err and words in err, err
    assert "Traceback" not in err
    return err
