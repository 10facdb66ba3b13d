"""The window under a real X server (Xvfb, 1024 x 700) driven by real input (xdotool): the
first window fits the screen, and a wheel notch over a field that was not clicked into changes
no setting. Offscreen Qt and synthetic events skip what a real wheel event does before any
event filter sees it (it gives a `WheelFocus` field the focus), so these run where X runs.

Slow (an X server and a window manager start); skipped where Xvfb or xdotool is missing. A window
manager (openbox) is used where installed, for the frame and placement a desktop gives."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (shutil.which("Xvfb") and shutil.which("xdotool")), reason="needs Xvfb and xdotool"
    ),
]

SCREEN = (1024, 700)
ROOT = Path(__file__).resolve().parents[2]
WHEEL_UP, WHEEL_DOWN = "4", "5"


@pytest.fixture
def display(tmp_path):
    """A fresh X display of SCREEN's size (with openbox where installed); its name."""
    read, write = os.pipe()
    server = subprocess.Popen(
        ["Xvfb", "-displayfd", str(write), "-screen", "0", f"{SCREEN[0]}x{SCREEN[1]}x24",
         "-nolisten", "tcp"],
        pass_fds=(write,),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    os.close(write)
    with os.fdopen(read) as answer:
        name = ":" + answer.readline().strip()
    manager = None
    if shutil.which("openbox"):
        manager = subprocess.Popen(
            ["openbox"],
            env={**os.environ, "DISPLAY": name},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)  # it takes the screen before the window maps
    yield name
    for process in (manager, server):
        if process is not None:
            process.terminate()
            process.wait(10)


class RealWindow:
    """The main window in its own process on `display` (`tests.support.real_x_window`)."""

    def __init__(self, display: str) -> None:
        self.display = display
        env = {
            **os.environ,
            "DISPLAY": display,
            "QT_QPA_PLATFORM": "xcb",
            "PYTHONPATH": str(ROOT),
        }
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.real_x_window"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.opened = self._read()

    def _read(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line, f"the window's process ended (status {self.process.poll()})"
        return json.loads(line)

    def ask(self, command: str) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self._read()

    def xdotool(self, *args: str) -> str:
        done = subprocess.run(
            ["xdotool", *args],
            env={**os.environ, "DISPLAY": self.display},
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def wheel(self, where: list[int], button: str) -> None:
        """One notch of the real wheel with the pointer at `where` (screen pixels)."""
        self.xdotool("mousemove", str(where[0]), str(where[1]))
        self.xdotool("click", button)
        time.sleep(0.3)  # X delivers it; the window handles it

    def close(self) -> None:
        if self.process.poll() is None:
            with_stdin = self.process.stdin
            if with_stdin is not None:
                with_stdin.write("quit\n")
                with_stdin.close()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


@pytest.fixture
def real_window(display):
    """The window, over settings the user changed by hand and saved (Precision fp16, UNet
    precision fp16) as a report reproduced it."""
    from app.core.settings import update_settings

    update_settings({"precision": "fp16", "unet_precision": "fp16"})
    window = RealWindow(display)
    yield window
    window.close()


def _inside_screen(rect: list[int]) -> bool:
    x, y, width, height = rect
    return x >= 0 and y >= 0 and x + width <= SCREEN[0] and y + height <= SCREEN[1]


def _settings_file() -> dict[str, Any]:
    path = Path(os.environ["HALFSAFE_CONFIG_DIR"]) / "settings.json"
    return json.loads(path.read_text(encoding="utf-8"))["settings"]


def test_the_first_window_fits_a_1024_by_700_screen(real_window):
    opened = real_window.opened
    assert _inside_screen(opened["frame"]), opened["frame"]
    assert _inside_screen(opened["status_bar"]), opened["status_bar"]
    generate = real_window.ask("show Generate")
    assert _inside_screen(generate["demo_button"]), generate["demo_button"]
    # The window's size as X has it (xdotool's position counts a reparenting window
    # manager's frame twice, so the position is the window's own, above).
    (window_id,) = real_window.xdotool("search", "--onlyvisible", "--name", "HalfSafe").split()
    geometry = real_window.xdotool("getwindowgeometry", "--shell", window_id)
    seen = dict(line.split("=", 1) for line in geometry.split())
    assert int(seen["WIDTH"]) <= SCREEN[0] and int(seen["HEIGHT"]) <= SCREEN[1], seen


def test_a_wheel_notch_over_a_field_changes_no_setting(real_window):
    real_window.ask("show Settings")
    settings = real_window.ask("state")["settings"]
    saved_before = _settings_file()
    assert saved_before["precision"] == settings["precision"] == "fp16"
    for name in ("precision", "unet_precision"):
        where = real_window.ask("show Settings")["fields"]
        if name not in where:
            continue  # scrolled out of the page by the notch before
        for button in (WHEEL_UP, WHEEL_DOWN):
            real_window.wheel(where[name], button)
            state = real_window.ask("state")
            assert state["focus"] != name, f"the wheel gave {name} the focus"
            assert state["settings"] == settings, f"a wheel notch over {name} changed a setting"
    assert _settings_file() == saved_before

    generate = real_window.ask("show Generate")["fields"]
    cfg = real_window.ask("state")["values"]["cfg"]
    real_window.wheel(generate["cfg"], WHEEL_UP)
    state = real_window.ask("state")
    assert state["values"]["cfg"] == cfg and state["focus"] != "cfg"
    # Clicked into, the field takes the wheel: the events above were real and reached it.
    real_window.xdotool("click", "1")
    time.sleep(0.3)
    real_window.wheel(generate["cfg"], WHEEL_UP)
    state = real_window.ask("state")
    assert state["focus"] == "cfg" and state["values"]["cfg"] > cfg
    assert _settings_file() == saved_before
