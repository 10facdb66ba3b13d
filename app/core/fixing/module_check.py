"""The check's pieces for any torch module tree called once by its host's own code (ComfyUI's
diffusion model, not a diffusers pipeline): record the call with the activation recorder, name
the first bad layer, run an fp32 reference of the same call, and build the precision islands
that a fix keeps wider, each a copy of one layer computing in a wider dtype.

Nothing here knows who calls the tree; the host hands over a call (a function of no arguments)
and the inputs it passed to the tree's root."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.core.hooks import Hooks
from app.core.run.probe import ActivationRecorder, ProbeResult

ISLAND_HOOKS = "_halfsafe_island_hooks"  # where an island copy keeps the hooks that cast for it


@dataclass(frozen=True)
class RecordedCall:
    """One call of a module tree under the full recorder: what each layer did, its output."""

    probe: ProbeResult
    output: Any

    @property
    def first_bad_layer(self) -> str | None:
        """The innermost layer whose output first went non-finite while its inputs were
        finite, in the tree's own dotted names (None when none did)."""
        found = self.probe.first_bad_module()
        return found.name if found is not None else None

    @property
    def finite(self) -> bool:
        return not self.probe.non_finite


def recorded_call(root, call: Callable[[], Any]) -> RecordedCall:
    """Run `call` (which calls `root` once, through its host's code) with every module of
    `root` recorded; one host sync, at the end."""
    import torch

    with ActivationRecorder(root) as recorder, torch.no_grad():
        output = call()
    return RecordedCall(recorder.read(output), output)


def cast_floats(value: Any, dtype) -> Any:
    """`value` with every floating tensor in it (nested in tuples, lists and dicts) cast to
    `dtype`; other values as they are."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, dict):
        return {k: cast_floats(v, dtype) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(cast_floats(v, dtype) for v in value)
    return value


def reference_call(root, args: tuple, kwargs: dict) -> RecordedCall:
    """The same call of `root` computed in fp32 from its stored weights, recorded: the
    reference a fix is measured against and the run whose peaks draw the islands. Each layer's
    weights are widened for its own call and put back after it (`each_layer_in_fp32`, as the
    prediction test runs a UNet), so the reference holds one layer's fp32 copy at a time, never
    a copy of the tree (an SDXL UNet copied whole in fp32 is 10 GB). A cast from fp16 or bf16
    to fp32 is exact: the result is a whole fp32 copy's. `root` is left as it was."""
    import torch

    from app.core.precision.layerwise import each_layer_in_fp32

    wide_args = cast_floats(args, torch.float32)
    wide_kwargs = cast_floats(kwargs, torch.float32)
    with each_layer_in_fp32([root]):
        return recorded_call(root, lambda: root(*wide_args, **wide_kwargs))


def closed_islands(wide: ProbeResult, islands: list[str]) -> list[str]:
    """`islands` (from `overflow_islands`) each widened to the innermost module holding it
    whose output, in the wider run `wide`, is back in fp16's range: where the host casts every
    island's output back to its own dtype (ComfyUI's layers take one dtype in), an island must
    end where its values fit. The tree's root is the last resort (the whole component)."""
    from app.core.fixing.layer_islands import ISLAND_LIMIT

    closed: set[str] = set()
    for name in islands:
        parts = name.split(".")
        chosen = ""
        for end in range(len(parts), 0, -1):
            path = ".".join(parts[:end])
            stats = wide.modules.get(path)
            if stats is not None and stats.max_abs <= ISLAND_LIMIT:
                chosen = path
                break
        closed.add(chosen)
    if "" in closed:
        return [""]
    return sorted(n for n in closed if not any(n.startswith(o + ".") for o in closed))


def island_copy(layer, dtype, rebuild: Callable[[Any, Any], Any] | None = None):
    """A copy of `layer` holding its weights in `dtype`, whose calls take their floating
    inputs in `dtype` and hand their output back in the dtype the first floating input came
    in: put in the layer's place, only this layer computes wider. Its parameters keep the
    layer's names, so a host that patches weights by name (a LoRA) still finds them. The copy
    is the only memory it costs: the layer's weights once, in `dtype`.

    `rebuild` is the host's, for its layers that a cast cannot widen (weights stored in a
    quantized layout with their scales): `rebuild(module, dtype)` gives a plain module computing
    that one in `dtype` from its weights dequantized, or None for a module a cast widens. A
    rebuilt module takes its place in the copy; its stored weights are never copied."""
    import torch

    rebuilt = {}
    if rebuild is not None:
        for module in layer.modules():
            plain = rebuild(module, dtype)
            if plain is not None:
                rebuilt[id(module)] = plain
    from app.core import work

    work.add("placements")  # the island: a copy of this layer alone, in `dtype`
    if id(layer) in rebuilt:
        island = rebuilt[id(layer)]
    else:  # a rebuilt module met while copying is its plain one (deepcopy's memo)
        island = copy.deepcopy(layer, dict(rebuilt)).to(dtype)
    came_in: list[Any] = []

    def cast_in(_module, args, kwargs):
        floats = [t for t in _floats((args, kwargs))]
        came_in.append(floats[0].dtype if floats else None)
        return cast_floats(args, dtype), cast_floats(kwargs, dtype)

    def cast_back(_module, _args, output):
        back = came_in.pop() if came_in else None
        return output if back is None or back == dtype else cast_floats(output, back)

    hooks = Hooks()
    hooks.before(island, cast_in, kwargs=True)
    hooks.after(island, cast_back, always=True)
    setattr(island, ISLAND_HOOKS, hooks)
    island.requires_grad_(False)
    assert isinstance(island, torch.nn.Module)
    return island


def _floats(value: Any):
    from app.core.run.probe import float_tensors

    return float_tensors(value)
