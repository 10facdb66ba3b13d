"""Counts the memory that copies of a module's parameters hold while code runs: every tensor an
operation makes from a parameter (or from such a copy) element for element, a cast, a clone,
a move, is tracked by its storage until that storage is freed, and the most held at once is
kept. Activations are not copies of parameters and are not counted."""

from __future__ import annotations

from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class ParameterCopies(TorchDispatchMode):
    """`with ParameterCopies(module) as copies: ...`, then `copies.peak_bytes`."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self._sources = {StorageWeakRef(p.untyped_storage()) for p in module.parameters()}
        self._copies: dict[StorageWeakRef, int] = {}
        self.peak_bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        output = func(*args, **(kwargs or {}))
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        sizes = {t.numel() for t in inputs if self._derived(t)}
        for made in tree_leaves(output):
            if isinstance(made, torch.Tensor) and made.numel() in sizes:
                storage = made.untyped_storage()
                key = StorageWeakRef(storage)
                if key not in self._sources:
                    self._copies[key] = storage.nbytes()
        self._copies = {k: n for k, n in self._copies.items() if not k.expired()}
        self.peak_bytes = max(self.peak_bytes, sum(self._copies.values()))
        return output

    def _derived(self, tensor: Any) -> bool:
        key = StorageWeakRef(tensor.untyped_storage())
        return key in self._sources or key in self._copies


def own_parameter_bytes(module: torch.nn.Module, dtype: torch.dtype) -> int:
    """The most bytes one layer's own parameters take in `dtype`."""
    return max(
        sum(p.numel() for p in layer.parameters(recurse=False)) * dtype.itemsize
        for layer in module.modules()
    )
