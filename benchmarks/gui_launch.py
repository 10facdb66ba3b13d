"""Launch-to-visible-window time of the desktop app against a bare PySide6 window, several
runs each, alternating, median.

Each run starts a fresh Python process that does what `halfsafe` does (import the GUI, load
the settings, build the main window, show it) and reports the moment the window first paints.
The bare run does the least any PySide6 app does (QApplication, an empty QMainWindow, show).
The time counted runs from just before the process is spawned to that first paint, so it
includes interpreter start-up and every import. Settings and caches point at a fresh folder.
The budget: HalfSafe's window within 0.2 s of the bare one.

How the app's own modules are read matters on a small machine: from the bytecode that setup
writes (`installer/bootstrap.py` compiles the app after installing it, and Python keeps it
fresh), or compiled from source on every launch where no bytecode is there and none can be
written (`PYTHONDONTWRITEBYTECODE`, a read-only folder). The script says which it measured.

Run it with a real display server, e.g. under Xvfb:
    xvfb-run -a .venv/bin/python benchmarks/gui_launch.py --runs 9
Without DISPLAY it falls back to Qt's offscreen platform and says so.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import load_average

ROOT = Path(__file__).resolve().parents[1]

BUDGET_S = 0.2  # over the bare PySide6 window

HALFSAFE = r"""
import json, sys, time
started = time.time()
from PySide6.QtCore import QEvent, QObject, QTimer
from app.ui.application import application, build_main_window

app = application()
window = build_main_window()
"""

BARE = r"""
import json, sys, time
started = time.time()
from PySide6.QtCore import QEvent, QObject, QTimer
from PySide6.QtWidgets import QApplication, QMainWindow

app = QApplication(sys.argv)
window = QMainWindow()
window.resize(1024, 700)
"""

SHOW = r"""

class FirstPaint(QObject):
    def __init__(self):
        super().__init__()
        self.at = None

    def eventFilter(self, obj, event):
        if self.at is None and event.type() == QEvent.Type.Paint and obj is window:
            self.at = time.time()
            QTimer.singleShot(0, app.quit)
        return False

probe = FirstPaint()
window.installEventFilter(probe)
window.show()
app.exec()
print(json.dumps({"visible_at": probe.at, "python_started_at": started,
                  "platform": app.platformName(), "torch_loaded": "torch" in sys.modules}))
"""


def app_bytecode() -> str:
    """How the launches read HalfSafe's modules: "bytecode" when every module of the app has
    fresh bytecode beside it, "source" when none has, "partly bytecode" between."""
    fresh = total = 0
    for module in (ROOT / "app").rglob("*.py"):
        total += 1
        cached = Path(importlib.util.cache_from_source(str(module)))
        fresh += cached.is_file() and cached.stat().st_mtime >= module.stat().st_mtime
    return "bytecode" if fresh == total else "source" if fresh == 0 else "partly bytecode"


def one_run(env: dict[str, str], child: str = HALFSAFE) -> dict[str, float | str | bool]:
    spawned = time.time()
    out = subprocess.run(
        [sys.executable, "-c", child + SHOW],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if out.returncode != 0:
        raise SystemExit(f"launch failed:\n{out.stderr}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return {
        "launch_to_visible_s": result["visible_at"] - spawned,
        "python_start_s": result["python_started_at"] - spawned,
        "platform": result["platform"],
        "torch_loaded": result["torch_loaded"],
    }


def measure(runs: int) -> dict:
    env = dict(os.environ)
    if (
        not env.get("DISPLAY")
        and not env.get("WAYLAND_DISPLAY")
        and sys.platform.startswith("linux")
    ):
        env["QT_QPA_PLATFORM"] = "offscreen"
    with tempfile.TemporaryDirectory() as home:
        for var in ("HALFSAFE_CONFIG_DIR", "HALFSAFE_DATA_DIR", "HALFSAFE_CACHE_DIR"):
            env[var] = str(Path(home) / var.lower())
        one_run(env)  # warm the file cache once, as a second launch would find it
        one_run(env, BARE)
        measured, bare = [], []
        for _ in range(runs):  # alternating, so load drifts hit both alike
            measured.append(one_run(env))
            bare.append(one_run(env, BARE))

    times = [r["launch_to_visible_s"] for r in measured]
    bare_median = statistics.median(r["launch_to_visible_s"] for r in bare)
    over = statistics.median(times) - bare_median
    return {
        "benchmark": "gui_launch",
        "runs": len(times),
        "median_s": round(statistics.median(times), 3),
        "min_s": round(min(times), 3),
        "max_s": round(max(times), 3),
        "bare_pyside6_median_s": round(bare_median, 3),
        "over_bare_s": round(over, 3),
        "budget_over_bare_s": BUDGET_S,
        "met": over <= BUDGET_S,
        "interpreter_start_median_s": round(
            statistics.median(r["python_start_s"] for r in measured), 3
        ),
        "qt_platform": measured[0]["platform"],
        "app_modules_read_from": app_bytecode(),
        "torch_loaded": any(r["torch_loaded"] for r in measured),
        "machine": {
            "cpus": os.cpu_count(),
            "load_average": load_average(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
    }


def table(document: dict) -> str:
    return (
        f"launch to visible window: median {document['median_s']:.3f} s over "
        f"{document['runs']} runs (min {document['min_s']:.3f}, max {document['max_s']:.3f}); "
        f"Qt platform {document['qt_platform']}; torch imported: {document['torch_loaded']}; "
        f"app modules read from {document['app_modules_read_from']}\n"
        f"bare PySide6 window: median {document['bare_pyside6_median_s']:.3f} s; HalfSafe is "
        f"{document['over_bare_s']:+.3f} s over it (budget {document['budget_over_bare_s']} s: "
        f"{'met' if document['met'] else 'missed'})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--json", help="write the results here as JSON")
    args = parser.parse_args()
    document = measure(args.runs)
    print(table(document))
    if args.json:
        Path(args.json).write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
