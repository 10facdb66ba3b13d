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
