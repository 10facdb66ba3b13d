"""The engine process seen from the GUI: start it, send it requests, hear its events and its end.

No Qt and no torch here. `EngineProcess` calls `on_event` and `on_exit` from its reader
thread; the Qt-side client moves them onto the GUI thread.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO, Protocol, cast

from app.core import paths
from app.engine.events import (
    HEARTBEAT_S,
    EngineEvent,
    Message,
    ProtocolError,
    ShutdownRequest,
    read_message,
    write_message,
)
from app.engine.failures import Failure, describe_exit

ROOT = Path(__file__).resolve().parents[2]
LOG_NAME = "engine.log"


class EngineTransport(Protocol):
    """How the client talks to an engine: the real process, or a stand-in in tests.

    `heartbeat_s` is the interval of the engine's HEARTBEAT events, or None for a transport that
    sends none (then its silence means nothing). `kill` ends the engine at once, even a frozen
    one, and reports nothing.
    """

    heartbeat_s: float | None

    def start(
        self, on_event: Callable[[EngineEvent], None], on_exit: Callable[[Failure], None]
    ) -> None: ...

    def send(self, message: Message) -> None: ...

    def stop(self, timeout: float = 5.0) -> None: ...

    def kill(self) -> None: ...

    @property
    def running(self) -> bool: ...


def log_path() -> Path:
    return paths.cache_dir() / LOG_NAME


def _tail(path: Path, lines: int = 40) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 16384))
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


# Python puts the working folder first on sys.path for `-m` and `-c`, so a module there named as
# one the engine imports (an argparse.py in the folder the window was started from) would run
# inside it. -P (Python 3.11+) leaves the folder out; before 3.11 the command takes it out itself
# before it runs the engine's module (PYTHONPATH, which finds the app, is kept either way).
_ENGINE_WITHOUT_WORKING_FOLDER = (
    "import sys\n"
    "if sys.path[:1] == ['']: del sys.path[0]\n"
    "import runpy\n"
    "runpy.run_module('app.engine', run_name='__main__', alter_sys=True)\n"
)


def engine_command(python: str, arguments: Sequence[str], version: tuple[int, int]) -> list[str]:
    """The command that starts the engine with `python` (of `version`) and its `arguments`,
    importing nothing from the working folder. A frozen build's executable takes the plain
    `-m app.engine` form (installer/frozen_entry.py), whose path holds only its bundle."""
    if getattr(sys, "frozen", False):
        return [python, "-m", "app.engine", *arguments]
    if version >= (3, 11):
        return [python, "-P", "-m", "app.engine", *arguments]
    return [python, "-c", _ENGINE_WITHOUT_WORKING_FOLDER, *arguments]


def engine_python_path(given: str | None) -> str:
    """The engine's PYTHONPATH: the app's folder, then the absolute folders of the one `given`
    (the user's). An empty or relative entry would name the working folder again (a PYTHONPATH
    of "$PYTHONPATH:/x" begins with one), so it is left out."""
    kept = [e for e in (given or "").split(os.pathsep) if e and os.path.isabs(e)]
    return os.pathsep.join([str(ROOT), *kept])


class EngineProcess:
    """`python -P -m app.engine` as a child process (`engine_command`), framed pickles over its
    stdin/stdout.

    Its stderr goes to `engine.log` in the cache folder (the previous run's log is kept as
    `engine.log.1`). When the process ends without being asked to, `on_exit` gets a Failure
    that says why in plain words, with the log's last lines as details. One instance runs one
    process; a restart makes a new instance.
    """

    def __init__(
        self,
        extra_args: Sequence[str] = (),
        python: str | None = None,
        heartbeat_s: float = HEARTBEAT_S,
    ) -> None:
        self.heartbeat_s: float | None = heartbeat_s
        arguments = ["--heartbeat", repr(float(heartbeat_s)), *extra_args]
        # Another interpreter's version is not known here: the form every version runs.
        version = sys.version_info[:2] if python is None else (3, 10)
        self._command = engine_command(python or sys.executable, arguments, version)
        self._process: subprocess.Popen[bytes] | None = None
        self._write_lock = threading.Lock()
        self._stopping = False
        self._reader: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(
        self, on_event: Callable[[EngineEvent], None], on_exit: Callable[[Failure], None]
    ) -> None:
        log = log_path()
        if log.exists():
            log.replace(log.with_name(LOG_NAME + ".1"))
        env = dict(os.environ)
        env["PYTHONPATH"] = engine_python_path(env.get("PYTHONPATH"))
        env.setdefault("PYTHONUNBUFFERED", "1")
        flags = subprocess.CREATE_NO_WINDOW if sys.platform == "win32" else 0
        try:
            # The child keeps its own handle on the log; ours is closed straight away.
            with log.open("ab") as log_file:
                self._process = subprocess.Popen(
                    self._command,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log_file,
                    env=env,
                    creationflags=flags,
                )
        except OSError as error:
            raise OSError(
                f"The engine could not be started ({error.strerror or error})."
            ) from error
        self._reader = threading.Thread(
            target=self._read,
            args=(self._process, on_event, on_exit),
            name="engine-reader",
            daemon=True,
        )
        self._reader.start()

    def _read(
        self,
        process: subprocess.Popen[bytes],
        on_event: Callable[[EngineEvent], None],
        on_exit: Callable[[Failure], None],
    ) -> None:
        assert process.stdout is not None
        problem = ""
        try:
            while True:
                message = read_message(cast(BinaryIO, process.stdout))
                if message is None:
                    break
                if isinstance(message, EngineEvent):
                    on_event(message)
        except (ProtocolError, OSError) as error:
            problem = f"\n\nMessage stream: {error}"
            process.kill()
        try:
            returncode = process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            returncode = process.wait()
        process.stdout.close()
        with self._write_lock:
            if process.stdin is not None and not process.stdin.closed:
                # The pipe may already be broken; closing it is all we want.
                with contextlib.suppress(OSError):
                    process.stdin.close()
        if self._stopping:
            return
        failure = describe_exit(returncode, _tail(log_path()))
        on_exit(Failure(failure.message, failure.details + problem, failure.error_type))

    def send(self, message: Message) -> None:
        """Write one request; raises BrokenPipeError (an OSError) if the engine is gone."""
        process = self._process
        if process is None or process.stdin is None:
            raise BrokenPipeError("the engine is not running")
        with self._write_lock:
            if process.stdin.closed:
                raise BrokenPipeError("the engine is not running")
            write_message(cast(BinaryIO, process.stdin), message)

    def stop(self, timeout: float = 5.0) -> None:
        """Ask the engine to stop, then make sure it has: terminate, then kill."""
        process = self._process
        if process is None:
            return
        self._stopping = True
        if process.poll() is None:
            try:
                self.send(ShutdownRequest())
                with self._write_lock:
                    if process.stdin is not None:
                        process.stdin.close()
            except OSError:
                pass
            deadline = time.monotonic() + timeout
            while process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        if self._reader is not None:
            self._reader.join(timeout=5)

    def kill(self) -> None:
        """End the engine now, without asking: for one that stopped answering. SIGKILL ends
        even a stopped (SIGSTOP) process, which SIGTERM would not until it is continued."""
        process = self._process
        if process is None:
            return
        self._stopping = True
        if process.poll() is None:
            process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)
        if self._reader is not None:
            self._reader.join(timeout=5)
