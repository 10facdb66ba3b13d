"""A part computing wider than it is stored, layer by layer (`compute_in`): each layer's own
floating tensors cast for the length of its forward, its floating inputs with them (`cast_floats`).
"""

from __future__ import annotations

import copy
import functools
import itertools
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from app.core.hooks import Hooks
from app.core.precision.autocast import _ENTRY_SUBMODULES


def cast_floats(value, dtype):
    """`value` with its floating tensors in `dtype`, through dicts (a mapping of its own kind
    stays one), lists and tuples; anything else as it is."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() and value.dtype != dtype else value
    if isinstance(value, dict):
        # A mapping of its own kind stays one (transformers' ModelOutput, which generation
        # hands back in as a keyword: its fields are read as attributes).
        cast = {} if type(value) is dict else copy.copy(value)
        for key, item in value.items():
            cast[key] = cast_floats(item, dtype)
        return cast
    if isinstance(value, (list, tuple)):
        return type(value)(cast_floats(v, dtype) for v in value)
    return value


def compute_in(module, dtype, islands: Iterable[str] = ()) -> None:
    """Every layer of `module` computes in `dtype` from its weights as stored: each module's
    own floating parameters and buffers are cast to `dtype` for the length of its forward
    (`ComputeIn`), so the component holds its stored bytes and one layer's in `dtype` at a
    time. A cast from fp16 or bf16 to fp32 is exact: the results are those of a copy in
    `dtype`. The hooks are diffusers' layerwise-casting kind, registered under its name, so a
    diffusers model reports `dtype` as its compute dtype and the pipelines cast their inputs to
    it. The layers of `islands` (paths) and all below them are left to compute in their own
    dtype (`placement._make_islands`)."""
    from diffusers.hooks.hooks import HookRegistry

    apart = {id(layer) for path in islands for layer in module.get_submodule(path).modules()}
    module._halfsafe_compute_dtype = dtype
    for name in _ENTRY_SUBMODULES:
        entry = getattr(module, name, None)
        if entry is not None:
            entry._halfsafe_compute_dtype = dtype
    for layer in module.modules():
        if id(layer) in apart:
            continue
        own = [
            t
            for t in itertools.chain(layer.parameters(recurse=False), layer.buffers(recurse=False))
            if t.is_floating_point()
        ]
        if own:
            registry = HookRegistry.check_if_exists_or_initialize(layer)
            registry.register_hook(_compute_in_hook()(dtype), "layerwise_casting")


@functools.cache
def _compute_in_hook():
    """The hook class of `compute_in` (made on first use: diffusers is imported then)."""
    from diffusers.hooks.hooks import ModelHook

    class ComputeIn(ModelHook):
        """A layer computing in `compute_dtype` from its stored tensors, its floating inputs
        cast with them (see `compute_in`).

        For its forward the layer holds each tensor cast, in the stored one's place in its
        own tables; the stored tensor object itself is never changed, and is put back however
        the forward ends. Changing its data in place instead (`tensor.data = cast`) left a
        layer whose forward raised holding the cast, and a forward run on fake tensors (a
        count of the work, `step_work.module_flops`) wrote fake data into the placed copy's
        weights, which the copy's next run met as meta tensors."""

        def __init__(self, compute_dtype) -> None:
            super().__init__()
            self.compute_dtype = compute_dtype

        def pre_forward(self, module, *args, **kwargs) -> tuple[tuple[Any], dict[str, Any]]:
            cast: Any = cast_floats((args, kwargs), self.compute_dtype)
            return cast[0], cast[1]

        def new_forward(self, module, *args, **kwargs):
            stored = [
                (table, name, tensor)
                for table in (module._parameters, module._buffers)
                for name, tensor in table.items()
                if tensor is not None
                and tensor.is_floating_point()
                and tensor.dtype != self.compute_dtype
            ]
            try:
                for table, name, tensor in stored:
                    table[name] = tensor.to(self.compute_dtype)
                forward: Any = self.fn_ref.original_forward  # set: the hook has `new_forward`
                return forward(*args, **kwargs)
            finally:
                for table, name, tensor in stored:
                    table[name] = tensor

    return ComputeIn


@contextmanager
def each_layer_in_fp32(modules: list[Any]) -> Iterator[None]:
    """Run `modules` in fp32 one layer at a time: each layer's weights are widened just before
    it runs and put back right after, so only one layer's fp32 copy exists at once (an SDXL
    UNet widened whole would take 10 GB more). The stored weights are never changed."""
    import torch

    def widen(layer, args):
        layer._halfsafe_stored = dict(layer._parameters)
        for name, param in layer._parameters.items():
            if param is not None and param.is_floating_point():
                layer._parameters[name] = torch.nn.Parameter(param.float(), requires_grad=False)

    def restore(layer, args, output):
        layer._parameters.update(layer.__dict__.pop("_halfsafe_stored", {}))

    layers = [
        layer
        for module in modules
        if module is not None
        for layer in module.modules()
        if any(p.is_floating_point() for p in layer.parameters(recurse=False))
    ]
    try:
        with Hooks() as hooks:
            for layer in layers:
                hooks.around(layer, widen, restore)
            yield
    finally:
        for layer in layers:  # a layer that raised mid-call is put back here too
            layer._parameters.update(layer.__dict__.pop("_halfsafe_stored", {}))
