"""Which layers of a component overflow in fp16 and must be kept wider (`overflow_islands`),
widened to the whole computation they belong to (an attention runs whole).
"""

from __future__ import annotations

from dataclasses import replace

from app.core.components import FP16_MAX
from app.core.fixing.diagnosis import AT_RISK_HEADROOM
from app.core.precision import PrecisionPlan


def _is_attention(module_name: str | None, component_module) -> bool:
    if not module_name:
        return False
    from diffusers.models.attention_processor import Attention

    try:
        return isinstance(component_module.get_submodule(module_name), Attention)
    except AttributeError:
        return False


def is_attention_overflow(module_name: str | None, component_module) -> bool:
    """Softmax turns inf scores into NaN, so NaN out of an attention layer whose inputs were
    finite is an overflow of its scores, not a NaN from nowhere."""
    return _is_attention(module_name, component_module)


# How far below 65504 a value counts as out of fp16's range when islands are drawn: the same
# headroom as "at risk", so that another prompt does not overflow the layer just outside.
ISLAND_LIMIT = FP16_MAX / AT_RISK_HEADROOM


MAX_ISLANDS = 128  # more than this is no longer a few layers: the component's own dtype is


def overflow_islands(wide, module) -> list[str] | None:
    """The layers to keep wider than fp16 in `module`, decided from `wide`, a probe of it run
    wider (fp32: `ActivationRecorder` measured every layer's max |input| and max |output|).

    A layer is in when its output passes fp16's range (it overflows) or its input does (it is
    fed by one that did, directly or through the functional code between layers); the island
    ends at the layers whose inputs and outputs are back in range. A container is kept whole
    only when none of the layers below it is in: then the large values are made by its own
    code between its layers. Layers without weights need no island (they compute in whatever
    dtype reaches them). None when nothing was out of range or the set would not be a few
    layers (the component's own dtype is then the fix)."""
    if wide is None:
        return None
    hot = {
        name
        for name, stats in wide.modules.items()
        if name and (stats.max_abs > ISLAND_LIMIT or stats.input_max_abs > ISLAND_LIMIT)
    }
    if not hot:
        return None
    whole = [n for n in hot if not any(o.startswith(n + ".") for o in hot)]
    kept = []
    for name in sorted(whole):
        try:
            layer = module.get_submodule(name)
        except AttributeError:
            continue
        if next(layer.parameters(), None) is not None:
            kept.append(name)
    kept = whole_computations(module, kept)
    if not kept or len(kept) > MAX_ISLANDS:
        return None
    return kept


def is_attention(module) -> bool:
    """Whether `module` is one attention computation, whose query, key and value must reach
    the attention op in one dtype: a diffusers attention layer (UNet, VAE, DiT), or a text
    encoder's (CLIP, T5, Qwen: a class named "...Attention" holding its projections)."""
    import torch
    from diffusers.models.attention import AttentionModuleMixin
    from diffusers.models.attention_processor import Attention

    if isinstance(module, (Attention, AttentionModuleMixin)):
        return True
    projections = sum(isinstance(c, torch.nn.Linear) for c in module.children())
    return type(module).__name__.endswith("Attention") and projections >= 2


def whole_computations(module, paths: list[str]) -> list[str]:
    """`paths` (layers of `module` to keep wider) with every layer inside an attention
    replaced by that whole attention, and every path inside another dropped, sorted.

    Kept wider alone, a query projection would hand the attention op an fp32 query beside fp16
    keys and values, which PyTorch refuses; an island is a set of whole computations."""
    whole: set[str] = set()
    for path in paths:
        parts = path.split(".")
        chosen = path
        for end in range(len(parts), 0, -1):  # the innermost attention holding the path
            prefix = ".".join(parts[:end])
            try:
                if is_attention(module.get_submodule(prefix)):
                    chosen = prefix
                    break
            except AttributeError:
                break
        whole.add(chosen)
    return sorted(n for n in whole if not any(n.startswith(o + ".") for o in whole))


def whole_attention_plan(plan: PrecisionPlan, pipeline) -> PrecisionPlan:
    """`plan` with each module island that is part of an attention widened to that whole
    attention (the wider dtype where two parts of one attention asked for different ones):
    settings or a remembered fix naming one projection then run, and report, what can run."""
    modules: dict[str, dict[str, str]] = {}
    widened: list[tuple[str, str]] = []  # (setting, component:path)
    for component, islands in plan.modules.items():
        module = getattr(pipeline, component, None)
        if module is None or not islands:
            modules[component] = dict(islands)
            continue
        kept: dict[str, str] = {}
        for path, dtype in islands.items():
            (whole,) = whole_computations(module, [path])
            if whole != path:
                widened.append((f"{dtype}_modules", f"{component}:{path}"))
            if kept.get(whole) != "fp32":  # fp32 is the wider of the two
                kept[whole] = dtype
        modules[component] = kept
    if not widened:
        return plan
    reasons = dict(plan.reasons)
    for key in dict.fromkeys(k for k, _ in widened):
        named = [path for k, path in widened if k == key]
        reasons[key] = (
            f"{named[0]}{' and others' if len(named) > 1 else ''} is part of an attention, "
            "which runs in one precision: the whole attention is kept wider."
        )
    return replace(plan, modules=modules, reasons=reasons)


def overflowing_layers(wide, module) -> list[str]:
    """The layers with weights whose own output passes fp16's range in the wider run (`wide`):
    where a clamp would go."""
    if wide is None:
        return []
    over = [
        name
        for name, stats in wide.modules.items()
        if name
        and stats.max_abs > FP16_MAX
        and stats.input_max_abs <= FP16_MAX
        and next(module.get_submodule(name).parameters(), None) is not None
    ]
    return [n for n in over if not any(o.startswith(n + ".") for o in over)][:MAX_ISLANDS]
