"""A planted fused-kernel library, installed the way such libraries are (a package on sys.path
with its distribution metadata) and patched over torch.nn.functional's `group_norm` for the
duration, as fused-op libraries replace norms and activations. Its fault is deterministic: NaN
for every fp16 input (a fused kernel whose fp16 accumulation overflows); in other dtypes, and
when built honest, it is PyTorch's own group norm."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import torch.nn.functional as F

from tests.support.attention_kernels import on_path, write_distribution

NAME = "fusedkit"
VERSION = "0.2.0"

_CORE = """
import torch

FAULTY = {faulty}


def fused_group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
    out = torch.group_norm(input, num_groups, weight, bias, eps)
    if FAULTY and input.dtype == torch.float16:
        return torch.full_like(out, float("nan"))
    return out
"""


@contextmanager
def patched_in(root: Path, *, faulty: bool = True) -> Iterator[ModuleType]:
    """The planted library installed under `root` with its group norm patched over PyTorch's;
    PyTorch's function is restored in a finally."""
    write_distribution(
        root,
        NAME,
        VERSION,
        {
            "__init__.py": "from .core import fused_group_norm\n",
            "core.py": _CORE.format(faulty=faulty),
        },
    )
    original = F.group_norm
    with on_path(root):
        module = importlib.import_module(NAME)
        F.group_norm = module.fused_group_norm
        try:
            yield module
        finally:
            F.group_norm = original
