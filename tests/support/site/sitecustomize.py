"""The test suite's subprocesses: fp16 products on the CPU computed in fp32 and rounded once, as
in the suite's own process (`tests/support/cpu_fp16.py`), once torch is imported.

On PYTHONPATH only in the tests' environment (`tests/conftest.py`), and only while
HALFSAFE_TEST_CPU_FP16=fp32-sum: nothing is imported here before the process imports torch
itself, so a process that never does pays nothing."""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from pathlib import Path


class _AfterTorch(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps torch's loader so that the overrides follow its import."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module):
            run(module)
            _install()

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _install() -> None:
    tests = str(Path(__file__).resolve().parents[1])
    sys.path.insert(0, tests)
    try:
        import cpu_fp16
    finally:
        sys.path.remove(tests)
    cpu_fp16.install()


if os.environ.get("HALFSAFE_TEST_CPU_FP16") == "fp32-sum":
    sys.meta_path.insert(0, _AfterTorch())
