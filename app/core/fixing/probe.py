"""Activation probes: where in a component values grow past fp16's range or go non-finite.

`ActivationRecorder` hooks every module of a component. Each hook reduces the module's inputs
and output to one number, max |value|, on the device (inf or NaN propagate through the
reduction, so that single number also says whether the tensor was finite). Nothing is read
back during the forward pass; `read()` transfers all the numbers at once at the end.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from app.core import work
from app.core.components import FP16_MAX

__all__ = ["FP16_MAX", "ActivationRecorder", "ProbeResult", "float_tensors", "max_abs"]


def float_tensors(value: Any) -> Iterable[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        if value.is_floating_point() and value.numel():
            yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from float_tensors(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from float_tensors(item)


def peaks(value: Any) -> list[Any]:
    """max |x| of each floating tensor in `value`, each a 0-d fp32 device tensor.

    NaN anywhere in a tensor makes its peak NaN and inf makes it inf (`amax` propagates NaN:
    `tests/core/test_probe.py` holds it to a result computed element by element, on the CPU
    and on CUDA). A fused infinity norm would spare the full-size |x| copy, but on a CPU the recorder
    cost 2.2 to 2.8 times as much with it (`benchmarks/probe_overhead.py` compares the two on
    the device it runs on; docs/benchmarks.md).
    """
    return [t.detach().abs().amax().float() for t in float_tensors(value)]


def max_abs(value: Any):
    """max |x| over every floating tensor in `value`, as a 0-d fp32 device tensor (or None).

    NaN anywhere makes the result NaN and inf makes it inf: one reduction answers both "how
    big" and "is it finite".
    """
    import torch

    found = peaks(value)
    if not found:
        return None
    return found[0] if len(found) == 1 else torch.stack(found).amax()


def _largest(values: list[float]) -> float:
    """max of host floats as the device's reduction gives it: NaN if any is NaN."""
    if any(math.isnan(v) for v in values):
        return math.nan
    return max(values)


@dataclass
class ModuleStats:
    """What one module did across all its calls in a probe."""

    name: str
    order: int  # completion order of its first call (children come first)
    max_abs: float = 0.0  # largest finite |output| seen
    input_max_abs: float = 0.0  # largest finite |input| seen
    half_max_abs: float = 0.0  # largest finite |output| of the calls that returned fp16
    non_finite: bool = False  # some output held inf or NaN
    overflow: bool = False  # the first bad output held inf (not only NaN)
    first_bad: int | None = None  # completion index of the first call that went bad
    bad_with_finite_inputs: bool = False
    first_over_fp16: int | None = None  # first call whose |output| > 65504 with inputs below it
    # Attention layers only: an upper bound on |q.k| * scale over every call (Cauchy-Schwarz,
    # from the largest query and key norms). Scores live inside the kernel, never as a module's
    # output, so without this an fp32 run could not predict an fp16 score overflow.
    score_bound: float = 0.0


@dataclass
class ProbeResult:
    """Per-module statistics of one component, in completion order."""

    modules: dict[str, ModuleStats] = field(default_factory=dict)
    output_finite: bool = True

    @property
    def non_finite(self) -> bool:
        return not self.output_finite or any(m.non_finite for m in self.modules.values())

    @property
    def max_abs(self) -> float:
        return max((m.max_abs for m in self.modules.values()), default=0.0)

    @property
    def half_max_abs(self) -> float:
        """The largest finite value held in fp16: what fp16's headroom is about (a layer kept
        wider inside an fp16 component may carry larger values, by design)."""
        return max((m.half_max_abs for m in self.modules.values()), default=0.0)

    def first_bad_module(self) -> ModuleStats | None:
        """The innermost module whose output first went non-finite while its inputs were finite."""
        candidates = [
            m for m in self.modules.values() if m.first_bad is not None and m.bad_with_finite_inputs
        ]
        return min(candidates, key=lambda m: m.first_bad or 0) if candidates else None

    def within(self, block: str, held_in_fp16: bool = False) -> tuple[float, bool]:
        """The largest finite |output| anywhere inside `block` (the block and every module
        below it) and whether any of them went non-finite: a peak that a normalisation shrinks
        before the block's output is still seen. `held_in_fp16`: only the outputs fp16 held
        (a layer kept wider carries larger values by design)."""
        prefix = block + "."
        inside = [m for n, m in self.modules.items() if n == block or n.startswith(prefix)]
        return (
            max((m.half_max_abs if held_in_fp16 else m.max_abs for m in inside), default=0.0),
            any(m.non_finite for m in inside),
        )

    def top_scores(self) -> ModuleStats | None:
        """The attention layer with the largest score bound (None when none reported one)."""
        layers = [m for m in self.modules.values() if m.score_bound > 0]
        return max(layers, key=lambda m: m.score_bound) if layers else None

    def first_over_fp16(self) -> ModuleStats | None:
        """The first module whose output passed 65504 while its inputs had not (fp32 runs)."""
        candidates = [m for m in self.modules.values() if m.first_over_fp16 is not None]
        return min(candidates, key=lambda m: m.first_over_fp16 or 0) if candidates else None


class ActivationRecorder:
    """Hooks on every module of `root`; use as a context manager around the forward passes.

    Per module call it keeps two 0-d device tensors (inputs' and output's max |value|), and for
    attention layers run by `precision.SafeAttnProcessor` a third, the bound on their scores; no
    host synchronisation happens until `read()`.
    """

    SCORES = "_halfsafe_scores"  # the list an attention processor appends its bounds to

    def __init__(self, root, skip: tuple[str, ...] = ()) -> None:
        self.root = root
        self._names: dict[int, str] = {}
        self._pending: dict[int, list[Any]] = {}
        self._calls: list[tuple[int, Any, Any, Any]] = []
        self._half: list[bool] = []  # per call: whether its output held fp16 tensors
        self._handles: list[Any] = []
        for name, module in root.named_modules():
            if any(name == s or name.startswith(s + ".") for s in skip):
                continue
            self._names[id(module)] = name
            if hasattr(module, "set_processor"):  # a diffusers attention layer
                setattr(module, self.SCORES, [])
            self._handles.append(module.register_forward_pre_hook(self._before, with_kwargs=True))
            self._handles.append(module.register_forward_hook(self._after))

    def _before(self, module, args, kwargs):
        self._pending.setdefault(id(module), []).append(peaks((args, kwargs)))

    def _after(self, module, args, output):
        stack = self._pending.get(id(module))
        inputs = stack.pop() if stack else []
        scores = getattr(module, self.SCORES, None)
        bound = scores.pop() if scores else None
        outputs = list(float_tensors(output))
        # Each tensor's peak, kept apart: a call's inputs and outputs are combined on the host
        # at `read()`, so a hook launches one reduction a tensor and nothing more.
        self._calls.append((id(module), inputs, peaks(outputs), bound))
        self._half.append(any(_is_half(t) for t in outputs))

    def __enter__(self) -> ActivationRecorder:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for module in self.root.modules():
            if hasattr(module, self.SCORES):
                delattr(module, self.SCORES)

    def read(self, output: Any = None) -> ProbeResult:
        """Bring every recorded number to the host in one transfer and summarise per module."""
        import torch

        result = ProbeResult()
        if not self._calls:
            return result
        # Every peak of every call in one transfer: inputs', outputs', the attention bound,
        # laid out call after call, then the final output's.
        flat: list[Any] = []
        spans: list[tuple[int, int, int]] = []  # per call: inputs, outputs, bound counts
        for _, inputs, outputs, bound in self._calls:
            flat.extend(inputs)
            flat.extend(outputs)
            if bound is not None:
                flat.append(bound)
            spans.append((len(inputs), len(outputs), int(bound is not None)))
        final = peaks(output)
        flat.extend(final)
        if not flat:
            return result
        device = flat[0].device
        values = torch.stack([v.to(device=device, dtype=torch.float32) for v in flat])
        numbers = values.cpu().tolist()  # the one host sync of the probe
        work.add("host_syncs")
        table = []
        at = 0
        for n_in, n_out, n_bound in spans:
            inputs = _largest(numbers[at : at + n_in]) if n_in else 0.0
            at += n_in
            peak = _largest(numbers[at : at + n_out]) if n_out else math.nan
            at += n_out
            bound = numbers[at] if n_bound else 0.0
            at += n_bound
            table.append((inputs, peak, bound))
        if final:
            result.output_finite = math.isfinite(_largest(numbers[at:]))

        for index, ((module_id, _, out, _), (inputs, peak, bound), half) in enumerate(
            zip(self._calls, table, self._half, strict=True)
        ):
            if not out:
                continue
            name = self._names[module_id]
            stats = result.modules.get(name)
            if stats is None:
                stats = result.modules[name] = ModuleStats(name, index)
            if math.isfinite(bound):
                stats.score_bound = max(stats.score_bound, bound)
            if math.isfinite(inputs):
                stats.input_max_abs = max(stats.input_max_abs, inputs)
            if math.isfinite(peak):
                stats.max_abs = max(stats.max_abs, peak)
                if half:
                    stats.half_max_abs = max(stats.half_max_abs, peak)
                if (
                    stats.first_over_fp16 is None
                    and peak > FP16_MAX
                    and math.isfinite(inputs)
                    and inputs <= FP16_MAX
                ):
                    stats.first_over_fp16 = index
            elif stats.first_bad is None:
                stats.non_finite = True
                stats.overflow = math.isinf(peak)
                stats.first_bad = index
                stats.bad_with_finite_inputs = math.isfinite(inputs)
        return result


def _is_half(tensor) -> bool:
    import torch

    return tensor.dtype == torch.float16


def top_blocks(root) -> list[str]:
    """Dotted names of a component's main blocks, for the per-block chart.

    Walks down through wrappers (modules that hold a ModuleList, like a VAE's decoder or CLIP's
    encoder) and stops at blocks: the items of a ModuleList, modules whose class name says
    "Block", and leaf-level children.
    """
    import torch

    blocks: list[str] = []

    def walk(module, prefix: str) -> None:
        for name, child in module.named_children():
            path = f"{prefix}{name}"
            if isinstance(child, torch.nn.ModuleList):
                blocks.extend(f"{path}.{i}" for i, _ in enumerate(child))
            elif "Block" not in type(child).__name__ and any(
                isinstance(c, torch.nn.ModuleList) for c in child.children()
            ):
                walk(child, path + ".")
            else:
                blocks.append(path)

    walk(root, "")
    return blocks
