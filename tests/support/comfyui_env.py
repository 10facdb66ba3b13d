"""Where the tests of the ComfyUI node package find ComfyUI: its extracted folder and a Python
with its requirements and HalfSafe installed without its window (the test command sets both
up), and the node package's folder in this tree. Tests that need them are skipped without."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "comfyui-halfsafe"
COMFYUI = os.environ.get("HALFSAFE_COMFYUI", "")
PYTHON = os.environ.get("HALFSAFE_COMFYUI_PYTHON", "")

# The marks of a test that runs ComfyUI: slow, and skipped without its environment.
NEEDS_COMFYUI = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (COMFYUI and PYTHON and Path(COMFYUI, "main.py").is_file()),
        reason="no ComfyUI environment (HALFSAFE_COMFYUI, HALFSAFE_COMFYUI_PYTHON)",
    ),
]


def run_driver(script: str, arguments: list[str], home: Path) -> dict:
    """`script` (a driver beside the ComfyUI tests) run by ComfyUI's Python on ComfyUI's folder
    and the node package, then `arguments`, with HalfSafe's folders in `home`; what it printed
    as one JSON object on its last line."""
    import json
    import subprocess

    from tests.support.desktop_check import environment

    done = subprocess.run(
        [PYTHON, str(ROOT / "tests" / "comfyui" / script), COMFYUI, str(PACKAGE), *arguments],
        capture_output=True,
        text=True,
        timeout=300,
        env=environment(home),
        cwd=home,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
