"""Placing a pipeline under a plan: each component copied to the device in its dtype, its
floating inputs cast at the component's boundary, module islands in their own dtype with
guards at their edges, fp16 output clamps (`PlacedPipeline`).
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import time
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from app.core import work
from app.core.components import FP16_MAX, module_of
from app.core.hooks import Hooks
from app.core.precision import tiling
from app.core.precision.attention import set_attention
from app.core.precision.autocast import _ENTRY_SUBMODULES, _AutocastOff, _set_autocast
from app.core.precision.layerwise import cast_floats, compute_in
from app.core.precision.plan import (
    PrecisionPlan,
    dtype_name,
    torch_dtype,
)
from app.core.precision.streaming import (
    Sizes,
    sizes,
    streamed_copy,
    streamed_of,
    wanted_dtypes,
)
from app.core.precision.transfer import moved_as
from app.core.precision.twin import module_twin

# A dropped placed copy holding this many bytes of its own (not shared with the loaded model) or
# more is freed at once by a collection (see `PlacedPipeline._drop`); a collection takes a
# fraction of a second, a small copy is left to Python's own collector.
COLLECT_AFTER_DROPPING_BYTES = 64 << 20
# While plans of one stage are timed in turn (`PlacedPipeline.keeping_variants`), a copy that
# holds little of its own (an island's layers beside the weights it computes from, shared with
# the loaded part or its resident copy) is kept beside the next instead of being made again for
# each run: at most this much, and at most `VARIANT_SHARE` of its part; all of them together at
# most `VARIANTS_BYTES`. A whole copy of a part is never kept: one stage's copies at a time.
VARIANT_BYTES = COLLECT_AFTER_DROPPING_BYTES
VARIANT_SHARE = 1 / 8
VARIANTS_BYTES = 4 * VARIANT_BYTES


def _cast_inputs_hook(module, args, kwargs):
    # Looked up per call, not captured: a placed copy may later be cast to another dtype. A
    # component computing wider than it stores (`compute_in`) takes its inputs in that dtype.
    dtype = getattr(module, "_halfsafe_compute_dtype", None) or next(module.parameters()).dtype
    return cast_floats(args, dtype), cast_floats(kwargs, dtype)


def _add_cast_hooks(module) -> None:
    """Cast the floating inputs of a placed copy and its entries, for as long as it lives (the
    set is not kept; each entry keeps its hook's handle)."""
    entries = [module] + [
        getattr(module, n) for n in _ENTRY_SUBMODULES if getattr(module, n, None) is not None
    ]
    hooks = Hooks()
    for entry in entries:
        has_weights = next(entry.parameters(), None) is not None
        if has_weights and getattr(entry, "_halfsafe_cast_hook", None) is None:
            entry._halfsafe_cast_hook = hooks.before(entry, _cast_inputs_hook, kwargs=True)


def _make_islands(module, islands: Mapping[str, str], guard: bool = True, computes_in=None) -> None:
    """Run each named submodule of a placed component in its own dtype: its weights are cast,
    and so are its floating inputs on every call. Its output keeps that dtype, as transformers
    runs the layers a kind keeps in fp32 (`_keep_in_fp32_modules`, `kinds.own_islands`):
    the residual addition after it promotes, so the stream it feeds is carried in fp32 until
    the next layer casts back. Casting the output straight back to fp16 would bring the very
    overflow the island exists to avoid.

    With `guard`, every other layer that holds weights gets a guard that casts its floating
    inputs to its own dtype (`Guards`: kept after the first call only where it cast anything):
    that is the cast back at the island's far edge, wherever the wider values flow, and the
    layer that takes them back is one whose inputs the probe measured inside fp16's range
    (`layer_islands.overflow_islands`
    puts every layer fed values past it into the island). A kind's own islands declared
    unguarded run without guards, as transformers runs them: the kind's own next layer takes
    the fp32 stream and casts back itself. In a component kept as stored and computing in `computes_in`
    (`compute_in`), a guard casts to that dtype, never to the stored one: fp32 values put
    through bf16 on their way to fp16 would lose the digits a copy in fp16 keeps."""
    hooks = Hooks()  # for as long as the copy lives
    for path, dtype in islands.items():
        island = module.get_submodule(path)
        island.to(torch_dtype(dtype))
        if getattr(island, "_halfsafe_cast_hook", None) is None:
            island._halfsafe_cast_hook = hooks.before(island, _cast_inputs_hook, kwargs=True)
            # Under fp16 autocast (the component's) an island would compute in fp16 again.
            outside = _AutocastOff()
            hooks.around(island, outside.enter, outside.leave)
    if not islands or not guard:
        return
    inside = {id(layer) for path in islands for layer in module.get_submodule(path).modules()}
    guarded = []
    for layer in module.modules():
        own = next(iter(layer.parameters(recurse=False)), None)
        if own is None or getattr(layer, "_halfsafe_cast_hook", None) is not None:
            continue
        outside_islands = id(layer) not in inside
        layer._halfsafe_dtype = computes_in if computes_in and outside_islands else own.dtype
        guarded.append(layer)
    module._halfsafe_guards = Guards(module, guarded)


class Guards:
    """The guards of one placed component with islands (see `_make_islands`), kept only where
    wider values arrive.

    Every layer holding weights is guarded at first; its guard notes whether it cast anything.
    When a call of the component (its forward or an entry's: a VAE's decoder) ends, the guards
    that ran in it for the first time and cast nothing are removed: the layers they sat on take
    values in their own dtype. What a layer is handed depends on the code path and the dtypes flowing in,
    never on the values, so each later call hands it the same dtypes and the guard would only
    look and pass; on a real UNet the look (a Python hook on ~1,000 layers) cost a GPU step 17%.
    What stays guarded is the layers that read an island's wider output, those the wider stream
    reaches through residual additions before a layer takes it back, and those that have not run
    yet. `arm` guards every layer again and starts over: a placed copy kept for a plan with other
    attention settings or autocast may hand on other dtypes (`PlacedPipeline.apply`); one kept
    for the same settings (a check's timed runs) keeps its guards settled, as a generation's
    steps after the first do.

    `calls` counts the guards' runs; `attached` is how many layers are guarded now. A layer's
    guard is its `_halfsafe_cast_hook` (None once dropped)."""

    def __init__(self, module, layers) -> None:
        self.module = module
        self.layers = {id(layer): layer for layer in layers}
        self.calls = 0
        # The guards, and the watch of each call through an entry: for as long as the copy lives.
        self._hooks = Hooks()
        self._ran: set[int] = set()
        self._cast: set[int] = set()
        self._depth = 0
        self.arm()
        for entry in _entries(self.module):
            self._hooks.around(entry, self._enter, self._leave)

    @property
    def attached(self) -> int:
        return sum(layer._halfsafe_cast_hook is not None for layer in self.layers.values())

    def arm(self) -> None:
        """Guard every layer and watch the next call, as when the copy was placed."""
        for layer in self.layers.values():
            if getattr(layer, "_halfsafe_cast_hook", None) is None:
                # First among the layer's hooks, as at placement: a recorder reads what it casts.
                layer._halfsafe_cast_hook = self._hooks.before(
                    layer, self._guard, kwargs=True, first=True
                )
        self._ran.clear()
        self._cast.clear()
        self._depth = 0

    def _guard(self, layer, args, kwargs):
        self.calls += 1
        cast = _guard_hook(layer, args, kwargs)
        key = id(layer)
        self._ran.add(key)
        if cast is not None and _changes(args, kwargs, cast):
            self._cast.add(key)
        return cast

    def _enter(self, module, args) -> None:
        self._depth += 1

    def _leave(self, module, args, output) -> None:
        if self._depth > 0:  # (a call refused before `_enter` ran leaves without entering)
            self._depth -= 1
            if self._depth == 0:
                self._settle()

    def _settle(self) -> None:
        """After a call: drop the guards that ran in it for the first time and cast nothing."""
        for key in self._ran - self._cast:
            layer = self.layers[key]
            self._hooks.drop(layer._halfsafe_cast_hook)
            layer._halfsafe_cast_hook = None
        self._ran.clear()


def _rearm_guards(module) -> None:
    """A kept copy runs under other settings: its guards watch the next call again (`Guards`)."""
    guards = getattr(module, "_halfsafe_guards", None)
    if guards is not None:
        guards.arm()


def _entries(module) -> list[Any]:
    """The modules a component is called through: itself, and the entry submodules it has."""
    found = [getattr(module, n, None) for n in _ENTRY_SUBMODULES]
    return [module] + [entry for entry in found if entry is not None]


def _changes(args, kwargs, cast) -> bool:
    """Whether a guard's `cast` (args, kwargs) holds a tensor other than those it was given."""
    import torch

    def tensors(value):
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, dict):
            for v in value.values():
                yield from tensors(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                yield from tensors(v)

    given = [id(t) for t in tensors((args, kwargs))]
    return given != [id(t) for t in tensors(cast)]


def _guard_hook(module, args, kwargs):
    import torch

    dtype = module._halfsafe_dtype
    if not kwargs and all(
        not isinstance(a, torch.Tensor) or not a.is_floating_point() or a.dtype == dtype
        for a in args
    ):
        return None
    return cast_floats(args, dtype), cast_floats(kwargs, dtype)


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
    """Clamp the fp16 outputs of `module`'s layers at `paths`, for as long as it lives."""
    Hooks().after_each((module.get_submodule(path) for path in paths), _clamp_hook)


def _copy_as(source, device, dtype, islands: Mapping[str, str] | None = None):
    """A copy of the module `source` whose floating tensors are on `device` in `dtype` (an
    island's in its own, see `wanted_dtypes`; with `dtype` None, every tensor keeps its own:
    a move), made one tensor at a time: each tensor is
    converted as the copy takes it, so the peak is the source and the copy, never a second
    copy in the source's dtype on the way (a whole-module `deepcopy` then `.to()`). A tensor
    already on that device in that dtype is shared with the source, not copied: an island or
    clamp changes the copy's own Parameter objects, never the storage they share, so the
    loaded model stays as it was."""
    import torch

    wanted_of = wanted_dtypes(source, dtype, islands or {}) if dtype is not None else {}
    converted: dict[int, Any] = {}
    for tensor in itertools.chain(source.parameters(), source.buffers()):
        if id(tensor) in converted:
            continue
        wanted = wanted_of.get(id(tensor), tensor.dtype)
        twin = moved_as(tensor, device, wanted)
        if isinstance(tensor, torch.nn.Parameter):
            twin = torch.nn.Parameter(twin, requires_grad=False)
        converted[id(tensor)] = twin
    return module_twin(source, converted)


def tensor_bytes(module, shared_with=None) -> int:
    """Bytes of `module`'s tensors, each storage once (a weight kept as stored counts its
    file's bytes); with `shared_with`, only those not shared with that module's (what a copy
    costs beside the loaded model on the same device)."""
    from app.core.checkpoint.stored import storages

    def held(of):
        for tensor in itertools.chain(of.parameters(), of.buffers()):
            if tensor.device.type != "meta":  # a streamed block's placeholder holds nothing
                yield from storages(tensor)

    shared = {s.data_ptr() for s in held(shared_with)} if shared_with is not None else set()
    seen: set[int] = set()
    total = 0
    for storage in held(module):
        pointer = storage.data_ptr()
        if pointer in shared or pointer in seen:
            continue
        seen.add(pointer)
        total += storage.nbytes()
    return total


def _kept_as_stored(source, dtype, budget_mb: float | None, as_wide: bool = False):
    """The dtype `source` is stored in, where it is narrower than `dtype` (or, `as_wide`, a
    different dtype of the same width: fp16 for bf16) and `source` in `dtype` would take more
    than `budget_mb`: it keeps its stored weights and computes in `dtype` layer by layer. Else
    None: placed in `dtype` as usual. Weights kept as their file stores them (fp8, GGUF) cost
    their stored bytes in any dtype: only the others would widen."""
    from app.core.checkpoint.stored import StoredTensor, stored_bytes

    if budget_mb is None:
        return None
    floats = [t for t in source.parameters() if t.is_floating_point()]
    if not floats:
        return None
    stored = floats[0].dtype
    if any(t.dtype != stored for t in floats) or stored == dtype:
        return None
    if stored.itemsize > dtype.itemsize or (stored.itemsize == dtype.itemsize and not as_wide):
        return None
    widening = [t for t in floats if not isinstance(t, StoredTensor)]
    kept = sum(stored_bytes(t) for t in floats if isinstance(t, StoredTensor))
    wide = sum(t.numel() for t in widening) * dtype.itemsize + kept
    return stored if widening and wide > budget_mb * 2**20 else None


def _own_bytes(module, pipeline, name: str, resident=None) -> int:
    """What a placed `module` of component `name` holds beside the loaded one, or beside the
    `resident` copy it computes from (nothing for a component computing from those weights):
    what dropping it can free."""
    loaded = resident if resident is not None else getattr(pipeline, name, None)
    return tensor_bytes(module) if loaded is None else tensor_bytes(module, shared_with=loaded)


def _over_budget(source, dtype, budget_mb: float | None) -> bool:
    """Whether `source` placed whole with its floating tensors in `dtype` (weights kept as
    stored at their stored bytes) would take more than `budget_mb`, and it has blocks to stream."""
    if budget_mb is None or next(source.parameters()).device.type != "cpu":
        return False
    if _at_most_bytes(source) <= budget_mb * 2**20:
        return False  # fits in any dtype a plan places it in: no need to count it block by block
    held = sizes(source, dtype)
    return held.whole > budget_mb * 2**20 and held.blocks > 0


def _at_most_bytes(source) -> int:
    """An upper bound of what `source` can hold placed in any dtype a plan gives it (fp32 at
    most, a tensor stored wider in its own), each tensor counted once: a quick "it fits"."""
    seen: set[int] = set()
    total = 0
    for tensor in itertools.chain(source.parameters(), source.buffers()):
        if id(tensor) not in seen:
            seen.add(id(tensor))
            total += tensor.numel() * max(tensor.element_size(), 4)
    return total


@dataclass(frozen=True)
class PartMemory:
    """How a plan places one component under its memory budget, before it is placed."""

    component: str
    dtype: str  # the plan's dtype for it
    stored_dtype: str | None  # set when it keeps this narrower stored dtype, computing wider
    streams: bool
    sizes: Sizes | None  # in the dtype it is held in, where it streams (else not counted)


def memory_plan(pipeline, plan: PrecisionPlan) -> list[PartMemory]:
    """How each component of `plan` will be held on the device, as `PlacedPipeline.apply`
    will place it: whole, whole in its stored dtype computing wider, or streamed."""
    parts = []
    for name, dtype in plan.dtypes.items():
        source = getattr(pipeline, name, None)
        if source is None or next(source.parameters(), None) is None:
            continue
        storage, streams = _form(source, plan, name)
        wide = torch_dtype(dtype)
        parts.append(
            PartMemory(
                component=name,
                dtype=dtype,
                stored_dtype=dtype_name(storage) if storage != wide else None,
                streams=streams,
                sizes=sizes(source, storage, plan.islands(name)) if streams else None,
            )
        )
    return parts


def as_generated(plan: PrecisionPlan) -> PrecisionPlan:
    """`plan` as a generation places it: a component planned wider than it is stored held as a
    copy in its dtype where the budget has room, not computed from its stored weights layer by
    layer as a fix search's runs are (`PrecisionPlan.compute_in_place`)."""
    return replace(plan, compute_in_place=False, reference=False)


def generation_held_mb(pipeline, plan: PrecisionPlan) -> float:
    """What the components of `plan` hold on the device as a generation places them under the
    plan's memory budget (`memory_plan` of `as_generated(plan)`), in MiB: each whole in its
    dtype with its islands in theirs (an fp32 copy twice an fp16 one's bytes), or in its
    stored dtype computing wider where a copy would not fit, or streamed (what stays resident
    and the largest block). Counted from the loaded model; nothing is placed."""
    generated = as_generated(plan)
    total = 0
    for part in memory_plan(pipeline, generated):
        if part.sizes is not None:  # streamed
            total += part.sizes.resident + part.sizes.block
            continue
        held = torch_dtype(part.stored_dtype or part.dtype)
        total += sizes(getattr(pipeline, part.component), held, plan.islands(part.component)).whole
    return total / 2**20


def _form(source, plan: PrecisionPlan, name: str):
    """The dtype `name`'s floating tensors are held in under `plan` (its own, or the one it is
    stored in where a copy in its own would not fit the budget or the plan computes in place)
    and whether it streams."""
    import torch

    wide = torch_dtype(plan.dtypes[name])
    loaded = next(source.parameters())
    in_place = plan.compute_in_place or plan.reference
    # Loaded on the device itself (a CPU, whose memory is the RAM the model is loaded in): a
    # copy in another dtype of the same width (fp16 for bf16 weights) would hold the part twice
    # for no gain in range, so it computes from its loaded weights, each layer cast as it runs
    # (the same numbers, bit for bit).
    beside = loaded.device == torch.device(plan.device)
    same_width = loaded.is_floating_point() and loaded.dtype.itemsize == wide.itemsize
    budget = 0.0 if in_place or (beside and same_width) else plan.memory_budget_mb
    stored = _kept_as_stored(source, wide, budget, as_wide=beside)
    storage = stored or wide
    return storage, _over_budget(source, storage, plan.memory_budget_mb)


class PlacedPipeline:
    """A pipeline's components on the job's device, each in its plan's dtype (and its module
    islands, `PrecisionPlan.modules`, in theirs), one stage's components at a time.

    The loaded pipeline stays untouched on the CPU in its stored dtype: a component is copied
    and cast only when the plan needs it in a different dtype or on another device, so moving
    between plans never loses precision. Each placed UNet and VAE casts its floating inputs to
    its own dtype, which is what makes mixed-precision plans work across component boundaries.
    `placed_bytes` is what the placed components hold on the device now, shared tensors
    included (on a CPU too: what a GPU would hold of them), `peak_bytes` the most at once.
    """

    def __init__(
        self, pipeline, plan: PrecisionPlan, components: Collection[str] | None = None
    ) -> None:
        self.source = pipeline
        self.plan = plan
        self._placed: dict[str, tuple[Any, Any]] = {}
        self._bytes: dict[str, int] = {}
        self.peak_bytes = 0
        # The components placed at some point in their stored dtype, computing wider layer by
        # layer because the wider copy would not fit the plan's memory budget (a fix search's
        # and the fp32 reference's, which always compute so, are not counted).
        self.computed_in_place: set[str] = set()
        # The components streamed block by block at some point, because even as stored they
        # would not fit the budget whole (the last streaming of each).
        self.streamed: dict[str, Sizes] = {}
        # How many copies were made, and the seconds making them took (the whole of it: on a
        # GPU a copy from the RAM, its casts, its islands), which a check's timing runs repeat.
        self.placements = 0
        self.placing_seconds = 0.0
        # Per component, its stored weights moved to the device once for plans that compute
        # from them (a check's: its reference, its candidates), kept while its stage runs
        # (`_resident_source`).
        self._resident: dict[str, Any] = {}
        # While `keeping_variants`: the copies set aside by their key, and the bytes they hold.
        self._variants: dict[tuple[str, Any], tuple[Any, int]] | None = None
        self.apply(plan, components)

    @property
    def placed_bytes(self) -> int:
        """What the placed copies hold, and the copies set aside beside them."""
        kept = sum(b for _, b in self._variants.values()) if self._variants else 0
        return sum(self._bytes.values()) + kept

    def _drop(self, name: str) -> None:
        """Forget a placed copy, and free it now where it held much: a placed module sits in
        reference cycles (diffusers' hook registries and hooks' closures point back at it),
        which only Python's collector frees, and it may not run before the next copy is made
        (a bf16 transformer generated in fp16 held a dropped 2.4 GiB fp16 copy beside the
        next one). While `keeping_variants`, a small copy is set aside instead."""
        dropped = self._placed.pop(name, None)
        self._bytes.pop(name, None)
        if dropped is None:
            return
        own = _own_bytes(dropped[1], self.source, name, self._resident.get(name))
        if self._variants is not None and own <= min(
            VARIANT_BYTES, VARIANT_SHARE * tensor_bytes(getattr(self.source, name))
        ):
            held = sum(b for _, b in self._variants.values())
            budget = self.plan.memory_budget_mb
            fits = budget is None or self.placed_bytes + own <= budget * 2**20
            if held + own <= VARIANTS_BYTES and fits:  # never past the job's memory budget
                self._variants[(name, dropped[0])] = (dropped[1], own)
                return
        if own >= COLLECT_AFTER_DROPPING_BYTES:
            del dropped
            work.collect_garbage()

    @contextlib.contextmanager
    def keeping_variants(self) -> Iterator[None]:
        """Inside the block, plans that take turns with a part (the runs that time a stage under
        several plans) keep each one's copy of it beside the others, where it holds little of
        its own, so that a run places nothing; the copies set aside are dropped after it."""
        if self._variants is not None:
            yield
            return
        self._variants = {}
        try:
            yield
        finally:
            kept, self._variants = self._variants, None
            if sum(b for _, b in kept.values()) >= COLLECT_AFTER_DROPPING_BYTES:
                kept.clear()
                work.collect_garbage()

    def _set_aside(self, name: str, key) -> Any:
        """The copy of `name` placed under `key` and set aside while `keeping_variants` (taken
        back out), or None."""
        if self._variants is None:
            return None
        kept = self._variants.pop((name, key), None)
        return kept[0] if kept is not None else None

    def _drop_resident(self, name: str) -> None:
        """Forget the stored weights moved to the device for `name`, freeing them now."""
        resident = self._resident.pop(name, None)
        if resident is not None and tensor_bytes(resident) >= COLLECT_AFTER_DROPPING_BYTES:
            del resident
            work.collect_garbage()

    def _resident_source(self, name: str, source, plan: PrecisionPlan, device):
        """What a plan that computes from the stored weights (a check's reference and
        candidates) places `name` from: on a device other than the loaded model's (a GPU), the
        stored weights moved there once, each tensor in its own dtype, and kept while the stage
        runs; each such plan then shares them (an island copies its own layers alone), where
        it was copied from the RAM again for every timed run (a failing SDXL check on an H200
        spent about 1.2 s a run on a step of 55-128 ms). None where this gains nothing: a plan
        that copies, a part already on the device, or one that streams."""
        from app.core.checkpoint.stored import StoredTensor

        loaded = next(source.parameters(), None)
        if loaded is None or loaded.device == device:
            return None
        if any(isinstance(t, StoredTensor) for t in source.parameters()):
            return None  # weights kept as their file stores them move as their class says
        wide = torch_dtype(plan.dtypes[name])
        from_stored = loaded.dtype == wide or _kept_as_stored(source, wide, 0.0, as_wide=True)
        in_place = plan.compute_in_place or plan.reference
        if not (in_place and from_stored) or name in plan.kind_islands:
            # A plan that copies (a generation's, or one whose part would be converted, not
            # computed from the stored weights): beside the move it would hold the part twice.
            self._drop_resident(name)
            return None
        resident = self._resident.get(name)
        if resident is not None:
            return resident
        if _over_budget(source, loaded.dtype, plan.memory_budget_mb):
            return None  # even as stored it does not fit: it streams
        self._drop(name)  # its copy from the RAM goes before the move is made
        began = time.perf_counter()
        resident = _copy_as(source, device, None)
        resident.eval().requires_grad_(False)
        self.placements += 1
        work.add("placements")
        self.placing_seconds += time.perf_counter() - began
        self._resident[name] = resident
        return resident

    def apply(self, plan: PrecisionPlan, components: Collection[str] | None = None) -> None:
        """Place the `components` a stage runs (pipeline component names; the VAE's encoder is
        the VAE), each in its dtype under `plan`, after dropping the copies of every other
        component, so that only one stage's copies are ever resident; None places every
        component of the plan. A component already placed as the plan asks is kept; attention
        processors are reset."""
        import torch

        self.plan = plan
        device = torch.device(plan.device)
        wanted = set(plan.dtypes) if components is None else {module_of(c) for c in components}
        for name in [n for n in self._placed if n not in wanted]:
            self._drop(name)
        for name in [n for n in self._resident if n not in wanted]:
            self._drop_resident(name)
        for name, dtype in plan.dtypes.items():
            if name not in wanted:
                continue
            islands = plan.islands(name)
            clamps = tuple(plan.clamps.get(name, ())) if dtype == "fp16" else ()
            source = getattr(self.source, name)
            source = self._resident_source(name, source, plan, device) or source
            storage, streams = _form(source, plan, name)
            stored = storage if storage != torch_dtype(dtype) else None
            # A tiled VAE is a copy (its tensors shared): the loaded VAE keeps no job's tiling.
            tiled = name == "vae" and plan.vae_tiling == "on"
            tiles = plan.vae_tile_px if tiled else 0
            key = (
                dtype,
                tuple(sorted(islands.items())),
                clamps,
                plan.kind_islands.get(name, ()),
                stored,
                streams,
                tiled,
                tiles,
            )
            current = self._placed.get(name)
            if current is not None and current[0] == key:
                module = current[1]
            elif (kept := self._set_aside(name, key)) is not None:
                self._drop(name)
                module = kept
                self._placed[name] = (key, module)
                held = streamed_of(module)
                self._bytes[name] = tensor_bytes(module) + (held.block if held else 0)
                self.peak_bytes = max(self.peak_bytes, self.placed_bytes)
            else:
                current = None
                self._drop(name)  # free the old copy before making the new one
                began = time.perf_counter()
                if streams:
                    module, streamed = streamed_copy(source, device, storage, islands)
                    module.eval().requires_grad_(False)
                    _add_cast_hooks(module)
                    self.streamed[name] = streamed
                else:
                    module = self._place(
                        source,
                        device,
                        storage,
                        copy_always=bool(islands or clamps or stored or tiled),
                        islands=islands,
                    )
                if stored is not None:  # the stored weights, computed wider
                    compute_in(module, torch_dtype(dtype), islands)
                    budget = plan.memory_budget_mb
                    if _kept_as_stored(source, torch_dtype(dtype), budget) is not None:
                        self.computed_in_place.add(name)  # the budget's doing, not a search's
                # A kind's own unguarded island (transformers' choice) needs no guard; others do.
                own = [i for i in plan.kind_islands_of(name) if not i.guarded]
                _make_islands(
                    module,
                    islands,
                    guard=any(not any(i.holds(p) for i in own) for p in islands),
                    computes_in=torch_dtype(dtype) if stored is not None else None,
                )
                _make_clamps(module, clamps)
                self._placed[name] = (key, module)
                self.placements += 1
                work.add("placements")
                self.placing_seconds += time.perf_counter() - began
                held = streamed_of(module)
                self._bytes[name] = tensor_bytes(module) + (held.block if held else 0)
                self.peak_bytes = max(self.peak_bytes, self.placed_bytes)
            use_autocast = plan.autocast and dtype == "fp16"
            # What decides the dtypes handed from layer to layer beside the placement: a kept
            # copy run under other settings of these watches its next call again (`Guards`).
            flow = (
                use_autocast,
                plan.upcast_attention,
                plan.attention_backend,
                plan.attention_reduced_precision,
            )
            if getattr(module, "_halfsafe_flow", flow) != flow:
                _rearm_guards(module)
            module._halfsafe_flow = flow
            _set_autocast(module, device.type if use_autocast else None)
            if name in ("unet", "vae"):
                set_attention(module, plan)
            if name == "vae":
                tiling.apply(module, plan)

    @staticmethod
    def _place(source, device, dtype, copy_always: bool = False, islands=None):
        first = next(source.parameters())
        same = first.device == device and all(p.dtype == dtype for p in source.parameters())
        if same and not copy_always:
            module = source
        elif first.device.type == "cpu" or copy_always:
            # Islands and clamps change a copy, never the loaded model; a copy to the device
            # or to another dtype is made tensor by tensor (same-place tensors shared).
            module = _copy_as(source, device, dtype, islands)
        else:  # a model loaded on the device itself moves, as before
            module = source.to(device=device, dtype=dtype)
        module.eval().requires_grad_(False)
        _add_cast_hooks(module)
        return module

    def __getitem__(self, name: str):
        """The placed module of a component (the VAE's for its encoder, see `module_of`); for a
        component not placed now, the loaded one (the same layers, for reading its structure)."""
        found = self._placed.get(module_of(name))
        return found[1] if found is not None else getattr(self.source, module_of(name))

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

        own = sum(_own_bytes(m, self.source, n) for n, (_, m) in self._placed.items())
        own += sum(tensor_bytes(m) for m in self._resident.values())
        self._placed.clear()
        self._bytes.clear()
        self._resident.clear()
        if own >= COLLECT_AFTER_DROPPING_BYTES:
            work.collect_garbage()  # the copies' reference cycles, as in `_drop`
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
