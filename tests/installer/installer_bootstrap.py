"""installer/bootstrap.py is a script beside the launchers, not a package: load it from its file."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def _load():
    name = "halfsafe_bootstrap"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "installer" / "bootstrap.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


bootstrap = _load()


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")
