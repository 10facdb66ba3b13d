"""Activation probes: where in a component values grow past fp16's range or go non-finite.

`ActivationRecorder` hooks every module of a component. Each hook reduces the module's inputs
and output on the device to the numbers whose largest magnitude is max |value| (inf or NaN
propagate through the reduction, so they also say whether the tensor was finite). Nothing is
read back during the forward pass; `read()` transfers all the numbers at once at the end.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from app.core import work
from app.core.components import FP16_MAX
from app.core.hooks import Hooks

__all__ = [
    "FP16_MAX",
    "ActivationRecorder",
    "ProbeResult",
    "descended",
    "float_tensors",
    "max_abs",
]


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


def extremes(tensor) -> list[Any]:
    """One fused reduction of `tensor`: 0-d device tensors whose largest magnitude is max |x|,
    NaN where it holds a NaN and inf where it holds an inf (`tests/unit/test_probe.py` holds it
    to a result computed element by element, on the CPU and on CUDA).

    On CUDA the infinity norm accumulated in fp32, one kernel (on an H200 the recorder cost
    SD1.5's UNet stage +184% so, +281% with |x|, its max and a cast); on a CPU its smallest and
    largest value in one pass (`torch.aminmax`: no copy of |x|, whose magnitude the host takes
    at `ActivationRecorder.read`), 7 to 17 times quicker there than |x| and its max on SD1.5's
    activations, the norm slower still (`benchmarks/probe_overhead.py` compares them); elsewhere
    |x| and its max."""
    import torch

    tensor = tensor.detach()
    if tensor.is_cuda:
        return [torch.linalg.vector_norm(tensor, math.inf, dtype=torch.float32)]
    if tensor.device.type == "cpu":
        return list(torch.aminmax(tensor))
    return [tensor.abs().amax()]


def peaks(value: Any) -> list[Any]:
    """max |x| of each floating tensor in `value`, each a 0-d fp32 device tensor (NaN anywhere
    in a tensor makes its peak NaN and inf makes it inf)."""
    import torch

    found = []
    for t in float_tensors(value):
        parts = extremes(t)
        peak = parts[0].abs() if len(parts) == 1 else torch.maximum(parts[0].abs(), parts[1].abs())
        found.append(peak.float())
    return found


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


def rotated(module, args) -> list[Any]:
    """An int8 ConvRot layer's input as its kernel rotates it (in the input's dtype, before its
    int8 product), read as one more output of the layer: its tool holds that tensor in the
    compute dtype, so it is where an fp16 run overflows first (a rotated group's largest value
    reaches up to sqrt(group) times the input's: 16 times for 256). Empty for other modules."""
    weight = getattr(module, "weight", None)
    if getattr(weight, "codec", None) != "int8_convrot" or not args:
        return []
    from app.core.checkpoint.stored import rotated_input

    found = rotated_input(weight, args[0])
    return [] if found is None else list(float_tensors(found))


def _distinct(tensors: list[Any]) -> list[Any]:
    """`tensors` with each one object once (a UNet down block returns its last output twice)."""
    return list({id(t): t for t in tensors}.values())


def fused(tensors: list[Any]) -> list[Any]:
    """One module call's tensors (all on one device) as one reduction (`extremes`): several are
    read as one flat tensor, a copy only such calls make (a UNet down block's outputs, a text
    encoder's hidden states), cast to fp32 where their dtypes differ."""
    import torch

    if len(tensors) == 1:
        return extremes(tensors[0])
    if len({t.device for t in tensors}) > 1:  # no one tensor holds them: each its own
        return [part for t in tensors for part in extremes(t)]
    if len({t.dtype for t in tensors}) > 1:
        tensors = [t.float() for t in tensors]
    return extremes(torch.cat([t.detach().reshape(-1) for t in tensors]))


def _largest(values: list[float]) -> float:
    """max |v| of host floats as the device's reduction gives it: NaN if any is NaN."""
    if any(math.isnan(v) for v in values):
        return math.nan
    return max(abs(v) for v in values)


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
    # A lean probe's: the component call (0-based, counted by the recorder's `calls_of`) during
    # which the first non-finite output came, where one did.
    first_bad_call: int | None = None

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

    Per module call it keeps the reductions of its inputs and of its output (`extremes`, a
    reduction a tensor), and for attention layers run by `precision.SafeAttnProcessor` the
    bound on their scores; no host synchronisation happens until `read()`.

    `lean`: outputs only, one hook and one fused reduction a module call (`fused`): the peaks
    and whether they held, which is all a finite run needs. With `scores` (a component run
    wider than fp16: its record predicts fp16) its attention layers still bound their scores.
    Its inputs are not seen, so a lean probe that went non-finite cannot name the layer at
    fault, nor can a wider one predict fp16's first layer past 65504 or its islands: the caller
    runs the calls again under a full recorder where it needs those (`Runner._watch`).

    `module_calls` and `reductions` count the calls recorded and the reductions their hooks
    made; they go into the job's `work.Work` when the hooks leave.
    """

    SCORES = "_halfsafe_scores"  # the list an attention processor appends its bounds to

    def __init__(
        self,
        root,
        skip: tuple[str, ...] = (),
        lean: bool = False,
        calls_of=None,
        scores: bool | None = None,
    ) -> None:
        self.root = root
        self.lean = lean
        self.module_calls = 0
        self.reductions = 0
        # The module whose completed calls are the component's calls (`first_bad_call`), and
        # per recorded call, how many of them had completed by then.
        self._calls_of = id(calls_of if calls_of is not None else root)
        self._completed = 0
        self._call_of: list[int] = []
        self._names: dict[int, str] = {}
        self._pending: dict[int, list[Any]] = {}
        self._calls: list[tuple[int, Any, Any, Any]] = []
        self._half: list[bool] = []  # per call: whether its output held fp16 tensors
        self._hooks = Hooks()
        scores = not lean if scores is None else scores
        for name, module in root.named_modules():
            if any(name == s or name.startswith(s + ".") for s in skip):
                continue
            self._names[id(module)] = name
            if scores and hasattr(module, "set_processor"):  # a diffusers attention layer
                setattr(module, self.SCORES, [])
            if lean:
                self._hooks.after(module, self._output_only)
                continue
            self._hooks.before(module, self._before, kwargs=True)
            self._hooks.after(module, self._after)

    def _before(self, module, args, kwargs):
        tensors = list(float_tensors((args, kwargs)))
        self.reductions += len(tensors)
        self._pending.setdefault(id(module), []).append(
            [part for t in tensors for part in extremes(t)]
        )

    def _after(self, module, args, output):
        stack = self._pending.get(id(module))
        inputs = stack.pop() if stack else []
        outputs = list(float_tensors(output))
        # Each tensor's reduction, kept apart: a call's inputs and outputs are combined on the
        # host at `read()`, so a hook launches one reduction a tensor and nothing more.
        read = outputs + rotated(module, args)
        self.module_calls += 1
        self.reductions += len(read)
        self._calls.append(
            (id(module), inputs, [p for t in read for p in extremes(t)], self._bound(module))
        )
        self._half.append(any(_is_half(t) for t in outputs))

    def _output_only(self, module, args, output):
        outputs = list(float_tensors(output))
        read = _distinct(outputs + rotated(module, args))
        self.module_calls += 1
        if read:  # one reduction, unless the tensors lie on several devices (`fused`)
            self.reductions += 1 if len({t.device for t in read}) == 1 else len(read)
        self._calls.append((id(module), [], fused(read) if read else [], self._bound(module)))
        self._half.append(any(_is_half(t) for t in outputs))
        self._call_of.append(self._completed)
        self._completed += id(module) == self._calls_of

    def _bound(self, module):
        """The bound its attention processor appended for this call (None: none)."""
        scores = getattr(module, self.SCORES, None)
        return scores.pop() if scores else None

    def __enter__(self) -> ActivationRecorder:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

    def remove(self) -> None:
        self._hooks.remove()
        for module in self.root.modules():
            if hasattr(module, self.SCORES):
                delattr(module, self.SCORES)
        work.add("module_calls", self.module_calls)
        work.add("reductions", self.reductions)
        self.module_calls = self.reductions = 0  # counted once

    def read(self, output: Any = None) -> ProbeResult:
        """Bring every recorded number to the host in one transfer and summarise per module."""
        result = ProbeResult()
        if not self._calls:
            return result
        # Every number of every call in one transfer: inputs', outputs', the attention bound,
        # laid out call after call, then the final output's.
        flat: list[Any] = []
        spans: list[tuple[int, int, int]] = []  # per call: inputs, outputs, bound counts
        for _, inputs, outputs, bound in self._calls:
            flat.extend(inputs)
            flat.extend(outputs)
            if bound is not None:
                flat.append(bound)
            spans.append((len(inputs), len(outputs), int(bound is not None)))
        final = [part for t in float_tensors(output) for part in extremes(t)]
        flat.extend(final)
        if not flat:
            return result
        numbers = _to_host(flat)  # the one host sync of the probe
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
                if self._call_of and result.first_bad_call is None:
                    result.first_bad_call = self._call_of[index]
        return result


def _to_host(values: list[Any]) -> list[float]:
    """0-d device tensors of several dtypes as host floats, in one transfer: stacked a dtype at
    a time on the first one's device, cast to fp32 (exact from every float type), joined."""
    import torch

    device = values[0].device
    places: dict[Any, list[int]] = {}
    for index, value in enumerate(values):
        places.setdefault((value.dtype, value.device), []).append(index)
    groups = [
        torch.stack([values[i] for i in where]).to(device=device, dtype=torch.float32)
        for where in places.values()
    ]
    joined = (groups[0] if len(groups) == 1 else torch.cat(groups)).cpu().tolist()
    numbers = [0.0] * len(values)
    at = 0
    for where in places.values():
        for index in where:
            numbers[index] = joined[at]
            at += 1
    return numbers


def descended(lean: ProbeResult, full: ProbeResult) -> ProbeResult | None:
    """A lean probe that went non-finite, told in full: every call's outputs from `lean`, and
    from `full` (the full recorder's run of the same calls up to the first that went
    non-finite) the inputs, the score bounds and which layer made the first non-finite value.
    None where that run names no such layer (the component's own input was already
    non-finite): the caller then records every call in full."""
    if full.first_bad_module() is None:
        return None
    result = ProbeResult(output_finite=lean.output_finite)
    for name, seen in lean.modules.items():
        told = full.modules.get(name)
        merged = result.modules[name] = replace(seen)
        if told is None:
            continue
        merged.input_max_abs = told.input_max_abs
        merged.score_bound = told.score_bound
        # A layer that first went bad in a later call than the full run saw is no culprit:
        # the first bad layer came before it, in the calls seen in full.
        merged.bad_with_finite_inputs = told.first_bad is not None and told.bad_with_finite_inputs
        if told.first_bad is not None:
            merged.first_bad, merged.overflow = told.first_bad, told.overflow
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
