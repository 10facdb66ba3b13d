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
    constraints = {op: registry.get_constraints("eager", op) for op in ops}
    with registered(NAME, module, constraints) as name:
        yield name


@contextmanager
def registered(name: str, module: ModuleType, constraints: dict) -> Iterator[str]:
    """`module` registered with comfy-kitchen's registry as the backend `name`, its ops under
    `constraints`, and put first in its order of preference; the registry is put back as it
    was in a finally."""
    import comfy_kitchen

    registry = comfy_kitchen.registry
    priority = list(registry._priority)
    registry.register(name, module, constraints)
    registry.set_priority([name, *priority])
    try:
        yield name
    finally:
        registry.set_priority(priority)
        with registry._lock:
            registry._backends.pop(name, None)
            registry._capabilities.pop(name, None)
            for op in constraints:
                registry._constraints.pop((name, op), None)
