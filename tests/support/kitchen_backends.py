"""A planted comfy-kitchen backend, registered with comfy-kitchen's own registry the way its
backends register (`registry.register(name, module, capabilities)`) and put first in its order
of preference, for the duration. Its ops give NaN for every fp16 input (`faulty="nan"`: a fused
kernel whose fp16 accumulation overflows), NaN only for inputs past 1,000 (`"nan_large"`), or
PyTorch's answer scaled by 1.5 (`faulty="drift"`); their inputs are taken as the eager backend takes them (its constraints)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

import torch

NAME = "planted"


def _faulty(op: str, faulty: str):
    def run(**kwargs):
        import comfy_kitchen

        honest = comfy_kitchen.registry.get_implementation(op, backend="eager")(**kwargs)
        parts = honest if isinstance(honest, tuple) else (honest,)
        large = any(
            isinstance(v, torch.Tensor) and v.is_floating_point() and float(v.abs().max()) > 1000
            for v in kwargs.values()
        )
        if faulty == "nan_large" and not large:
            return honest
        if faulty in ("nan", "nan_large"):
            bad = tuple(torch.full_like(p, float("nan")) for p in parts)
        else:
            bad = tuple(p * 1.5 for p in parts)
        return bad if isinstance(honest, tuple) else bad[0]

    return run


@contextmanager
def planted_backend(ops: tuple[str, ...] = ("apply_rope1",), faulty: str = "nan") -> Iterator[str]:
    """The planted backend offering `ops`, registered and preferred; the registry is put back
    as it was in a finally."""
    import comfy_kitchen

    registry = comfy_kitchen.registry
    module = ModuleType(f"comfy_kitchen_{NAME}")
    for op in ops:
        setattr(module, op, _faulty(op, faulty))
    priority = list(registry._priority)
    registry.register(NAME, module, {op: registry.get_constraints("eager", op) for op in ops})
    registry.set_priority([NAME, *priority])
    try:
        yield NAME
    finally:
        registry.set_priority(priority)
        with registry._lock:
            registry._backends.pop(NAME, None)
            registry._capabilities.pop(NAME, None)
            for op in ops:
                registry._constraints.pop((NAME, op), None)
