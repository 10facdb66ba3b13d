"""The test suite's subprocesses: fp16 products on the CPU computed in fp32 and rounded once, as
in the suite's own process (`tests/support/cpu_fp16.py`), once torch is imported.

On PYTHONPATH only in the tests' environment (`tests/conftest.py`), and only while
HALFSAFE_TEST_CPU_FP16=fp32-sum. torch is not imported here: the overrides follow the process's
own import of torch, so a process that never imports it pays nothing for them."""

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
            _cpu_fp16.install()

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _overrides():
    """`tests/support/cpu_fp16.py`, imported by its path (no torch is imported with it)."""
    support = str(Path(__file__).resolve().parents[1])
    sys.path.insert(0, support)
    try:
        import cpu_fp16
    finally:
        sys.path.remove(support)
    return cpu_fp16


_cpu_fp16 = _overrides()
if os.environ.get(_cpu_fp16.ENV) == _cpu_fp16.VALUE:
    sys.meta_path.insert(0, _AfterTorch())
