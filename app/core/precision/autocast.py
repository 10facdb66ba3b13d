"""fp16 autocast: whether PyTorch has it for a device and what it upcasts there, and the forward
hooks that run a placed component under it (or a module island outside it).
"""

from __future__ import annotations

import functools
from typing import Any

from app.core.hooks import Hooks

# A VAE is entered through .encode/.decode, which bypass its forward: the cast and autocast
# hooks go on these instead.
_ENTRY_SUBMODULES = ("quant_conv", "post_quant_conv", "encoder", "decoder")


@functools.cache
def autocast_available(device_type: str) -> bool:
    """Whether PyTorch has an fp16 autocast for this kind of device."""
    import torch

    try:
        return bool(torch.amp.is_autocast_available(device_type))
    except (RuntimeError, ValueError):
        return False


@functools.cache
def autocast_upcasts_norms(device_type: str) -> bool | None:
    """Whether fp16 autocast on this kind of device runs normalisation in fp32, measured once
    on the device: an fp16 layer norm under autocast comes back fp32 (CUDA and ROCm, as
    PyTorch's op list says) or stays fp16 (PyTorch 2.13's CPU list has no softmax or norm).
    None when it could not be measured."""
    import torch

    try:
        x = torch.ones(1, 4, dtype=torch.float16, device=device_type)
        with torch.autocast(device_type, dtype=torch.float16):
            return torch.nn.functional.layer_norm(x, (4,)).dtype == torch.float32
    except (RuntimeError, ValueError, AssertionError):  # no such device, or no autocast for it
        return None


def autocast_problem(device_type: str) -> str | None:
    """One sentence when autocast cannot mean here what it means in A1111 on a GPU, else None."""
    if not autocast_available(device_type):
        return (
            f"PyTorch has no fp16 autocast for {device_type}: the model runs in plain fp16, "
            "without autocast's fp32 softmax and norms."
        )
    if autocast_upcasts_norms(device_type) is False:
        return (
            f"On {'a CPU' if device_type == 'cpu' else device_type}, PyTorch's autocast keeps "
            "softmax and normalisation in fp16, so autocast runs like plain fp16 here; its "
            "fp32 softmax and norms happen on NVIDIA and AMD GPUs."
        )
    return None


class _AutocastHooks:
    """Forward hooks that run a module under torch.autocast(float16) while its
    `_halfsafe_autocast` attribute names a device type (set per plan by PlacedPipeline), and
    leave it alone otherwise. Plain data, so a deep-copied module gets its own hooks."""

    def __init__(self) -> None:
        self.open: list[Any] = []

    def enter(self, module, args) -> None:
        import torch

        device_type = getattr(module, "_halfsafe_autocast", None)
        context = torch.autocast(device_type, dtype=torch.float16) if device_type else None
        if context is not None:
            context.__enter__()
        self.open.append(context)

    def leave(self, module, args, output) -> None:
        context = self.open.pop() if self.open else None
        if context is not None:
            context.__exit__(None, None, None)


class _AutocastOff:
    """Forward hooks that turn autocast off inside a module while it is on around it (a
    module-level island in a component run under fp16 autocast)."""

    def __init__(self) -> None:
        self.open: list[Any] = []

    def enter(self, module, args) -> None:
        import torch

        from app.core.precision.streaming import device_of

        device_type = device_of(module).type
        context = (
            torch.autocast(device_type, enabled=False)
            if torch.is_autocast_enabled(device_type)
            else None
        )
        if context is not None:
            context.__enter__()
        self.open.append(context)

    def leave(self, module, args, output) -> None:
        context = self.open.pop() if self.open else None
        if context is not None:
            context.__exit__(None, None, None)


def _set_autocast(module, device_type: str | None) -> None:
    """Run `module` (and a VAE's entry submodules) under fp16 autocast on `device_type`, or not
    at all with None. The hooks are installed once, for as long as the module lives (so their
    set is not kept), and read the attribute at each call."""
    entries = [module] + [
        getattr(module, n) for n in _ENTRY_SUBMODULES if getattr(module, n, None) is not None
    ]
    hooks = Hooks()
    for entry in entries:
        if getattr(entry, "_halfsafe_autocast_hooks", None) is None:
            autocast = _AutocastHooks()
            hooks.around(entry, autocast.enter, autocast.leave)
            entry._halfsafe_autocast_hooks = autocast
        entry._halfsafe_autocast = device_type
