"""Placing a pipeline under a plan: each component copied to the device in its dtype, its
floating inputs cast at the component's boundary, module islands in their own dtype with
guards at their edges, fp16 output clamps (`PlacedPipeline`).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from app.core.components import FP16_MAX, module_of
from app.core.precision.attention import set_attention
from app.core.precision.autocast import _ENTRY_SUBMODULES, _AutocastOff, _set_autocast
from app.core.precision.plan import PrecisionPlan, _is_t5_feed_forward, torch_dtype


def _cast_floats(value, dtype):
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() and value.dtype != dtype else value
    if isinstance(value, dict):
        return {k: _cast_floats(v, dtype) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_cast_floats(v, dtype) for v in value)
    return value


def _cast_inputs_hook(module, args, kwargs):
    # Looked up per call, not captured: a placed copy may later be cast to another dtype.
    dtype = next(module.parameters()).dtype
    return _cast_floats(args, dtype), _cast_floats(kwargs, dtype)


def _add_cast_hooks(module) -> None:
    entries = [module] + [
        getattr(module, n) for n in _ENTRY_SUBMODULES if getattr(module, n, None) is not None
    ]
    for entry in entries:
        has_weights = next(entry.parameters(), None) is not None
        if has_weights and getattr(entry, "_halfsafe_cast_hook", None) is None:
            entry._halfsafe_cast_hook = entry.register_forward_pre_hook(
                _cast_inputs_hook, with_kwargs=True
            )


def _make_islands(module, islands: Mapping[str, str], guard: bool = True) -> None:
    """Run each named submodule of a placed component in its own dtype: its weights are cast,
    and so are its floating inputs on every call. Its output keeps that dtype, as transformers
    runs the T5 feed-forward output projection it keeps in fp32 (`_keep_in_fp32_modules`):
    the residual addition after it promotes, so the stream it feeds is carried in fp32 until
    the next layer casts back. Casting the output straight back to fp16 would bring the very
    overflow the island exists to avoid.

    With `guard`, every other layer that holds weights gets a guard that casts its floating
    inputs to its own dtype (a no-op check while they already match): that is the cast back at
    the island's far edge, wherever the wider values flow, and the layer that takes them back
    is one whose inputs the probe measured inside fp16's range (`diagnosis.overflow_islands`
    puts every layer fed values past it into the island). The T5 feed-forward islands run
    without guards, as transformers runs them: T5's own layer norm takes the fp32 stream and
    casts back itself."""
    for path, dtype in islands.items():
        island = module.get_submodule(path)
        island.to(torch_dtype(dtype))
        if getattr(island, "_halfsafe_cast_hook", None) is None:
            island._halfsafe_cast_hook = island.register_forward_pre_hook(
                _cast_inputs_hook, with_kwargs=True
            )
            # Under fp16 autocast (the component's) an island would compute in fp16 again.
            outside = _AutocastOff()
            island.register_forward_pre_hook(outside.enter)
            island.register_forward_hook(outside.leave, always_call=True)
    if not islands or not guard:
        return
    for layer in module.modules():
        own = next(iter(layer.parameters(recurse=False)), None)
        if own is None or getattr(layer, "_halfsafe_cast_hook", None) is not None:
            continue
        layer._halfsafe_dtype = own.dtype
        layer._halfsafe_cast_hook = layer.register_forward_pre_hook(_guard_hook, with_kwargs=True)


def _guard_hook(module, args, kwargs):
    import torch

    dtype = module._halfsafe_dtype
    if not kwargs and all(
        not isinstance(a, torch.Tensor) or not a.is_floating_point() or a.dtype == dtype
        for a in args
    ):
        return None
    return _cast_floats(args, dtype), _cast_floats(kwargs, dtype)


def _clamp_hook(module, args, output):
    """diffusers' fp16 clamp: an fp16 output held to +-65504 (inf saturates, NaN stays)."""
    import torch

    if isinstance(output, torch.Tensor) and output.dtype == torch.float16:
        return output.clamp(-FP16_MAX, FP16_MAX)
    if isinstance(output, tuple):
        return tuple(
            o.clamp(-FP16_MAX, FP16_MAX)
            if isinstance(o, torch.Tensor) and o.dtype == torch.float16
            else o
            for o in output
        )
    return output


def _make_clamps(module, paths: Iterable[str]) -> None:
    for path in paths:
        module.get_submodule(path).register_forward_hook(_clamp_hook)


class PlacedPipeline:
    """A pipeline's components on the job's device, each in its plan's dtype (and its module
    islands, `PrecisionPlan.modules`, in theirs).

    The loaded pipeline stays untouched on the CPU in its stored dtype: a component is copied
    and cast only when the plan needs it in a different dtype or on another device, so moving
    between plans never loses precision. Each placed UNet and VAE casts its floating inputs to
    its own dtype, which is what makes mixed-precision plans work across component boundaries.
    """

    def __init__(self, pipeline, plan: PrecisionPlan) -> None:
        self.source = pipeline
        self.plan = plan
        self._placed: dict[str, tuple[Any, Any]] = {}
        self.apply(plan)

    def apply(self, plan: PrecisionPlan) -> None:
        """Re-place only the components whose dtype changed; reset attention processors."""
        import torch

        self.plan = plan
        device = torch.device(plan.device)
        for name, dtype in plan.dtypes.items():
            islands = plan.islands(name)
            clamps = tuple(plan.clamps.get(name, ())) if dtype == "fp16" else ()
            key = (dtype, tuple(sorted(islands.items())), clamps, name in plan.t5_feed_forward)
            current = self._placed.get(name)
            if current is not None and current[0] == key:
                module = current[1]
            else:
                self._placed.pop(name, None)  # free the old copy before making the new one
                module = self._place(
                    getattr(self.source, name),
                    device,
                    torch_dtype(dtype),
                    copy_always=bool(islands or clamps),
                )
                t5 = name in plan.t5_feed_forward
                _make_islands(
                    module,
                    islands,
                    guard=any(not (t5 and _is_t5_feed_forward(p)) for p in islands),
                )
                _make_clamps(module, clamps)
                self._placed[name] = (key, module)
            use_autocast = plan.autocast and dtype == "fp16"
            _set_autocast(module, device.type if use_autocast else None)
            if name in ("unet", "vae"):
                set_attention(module, plan)

    @staticmethod
    def _place(source, device, dtype, copy_always: bool = False):
        first = next(source.parameters())
        same = first.device == device and all(p.dtype == dtype for p in source.parameters())
        if same and copy_always:  # islands and clamps change a copy, never the loaded model
            module = copy.deepcopy(source)
        elif same:
            module = source
        else:
            keep_source = first.device.type == "cpu" or copy_always
            module = copy.deepcopy(source) if keep_source else source
            module = module.to(device=device, dtype=dtype)
        module.eval().requires_grad_(False)
        _add_cast_hooks(module)
        return module

    def __getitem__(self, name: str):
        """The placed module of a component (the VAE's for its encoder, see `module_of`)."""
        return self._placed[module_of(name)][1]

    def __contains__(self, name: str) -> bool:
        return module_of(name) in self._placed

    def pipeline(self):
        """The source pipeline's twin running the placed components (a shallow copy: the
        tokenizers, scheduler and config are shared, nothing is re-initialised)."""
        twin = copy.copy(self.source)
        for name, (_, module) in self._placed.items():
            # Plain attribute: DiffusionPipeline.__setattr__ would also rewrite the config.
            object.__setattr__(twin, name, module)
        return twin

    def release(self) -> None:
        """Drop the placed copies and give cached device memory back."""
        import torch

        self._placed.clear()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
