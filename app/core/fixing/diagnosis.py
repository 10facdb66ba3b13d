"""The one diagnosis engine under the health check and generation's repair: the plan a model
runs under, the fixes to try for a failing component (cheapest first), and which of the verified
ones to keep. What "verified" measures is `app.core.fixing.quality`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from app.core.components import COMPONENTS, FP16_MAX, Role, Status
from app.core.encoders import t5
from app.core.errors import HalfSafeError
from app.core.fixing.quality import Quality
from app.core.fixing.stage_cost import StageCost
from app.core.precision import PrecisionPlan, pipeline_components, resolve_plan
from app.core.precision.streaming import host_bytes
from app.core.settings import PrecisionSettings
from app.core.settings.values import SettingValue

AT_RISK_HEADROOM = 2.0  # within 2x of 65504: a bigger image or another prompt can tip it over

# --- plans --------------------------------------------------------------------------------


def plan_for_model(
    model,
    precision: PrecisionSettings,
    *,
    device,
    device_info: Any,
    remembered: Mapping[str, Any] | None,
) -> PrecisionPlan:
    """The plan a job on `model` runs under: the user's settings resolved against the device,
    the model's own needs (SDXL's original VAE asks for fp32 through `force_upcast`) and a fix
    remembered for this model on this device. The check and generation both start here.
    A module island that is part of an attention runs as that whole attention
    (`whole_attention_plan`)."""
    pipeline = model.pipeline
    check_module_settings(precision.to_dict(), pipeline, str(model.source))
    # A remembered fix (edited on the Fixes page, say) naming a layer this model lacks costs
    # only that layer: the rest of it is used, and the job's notes name what was left out.
    dropped: tuple[str, ...] = ()
    if remembered:
        dropped = tuple(entry for _, entry in unknown_layers(remembered, pipeline))
        remembered = without_layers(remembered, dropped)
    components = pipeline_components(pipeline)
    plan = resolve_plan(
        precision,
        feed_forward_islands=feed_forward_islands(pipeline),
        device=device,
        components=components,
        device_info=device_info,
        vae_needs_fp32=vae_needs_fp32(model),
        remembered=remembered,
        held_bytes=host_bytes(getattr(pipeline, name) for name in components),
    )
    return whole_attention_plan(replace(plan, remembered_dropped=dropped), pipeline)


def vae_needs_fp32(model) -> bool:
    """Whether the model says its VAE overflows in fp16: its VAE config's `force_upcast`, where
    its family's VAEs mean it (`Family.force_upcast_means_fp32`)."""
    from app.core.families.registry import family_of_architecture

    vae_config = getattr(getattr(model.pipeline, "vae", None), "config", None)
    family = family_of_architecture(str(model.architecture))
    means = family is not None and family.force_upcast_means_fp32
    return means and bool(getattr(vae_config, "force_upcast", False))


def no_half(plan: PrecisionPlan) -> PrecisionPlan:
    """`plan` with every component in fp32: what --no-half does, and the quality reference."""
    return plan.with_dtypes(**dict.fromkeys(plan.dtypes, "fp32"))


def fp32_reference(plan: PrecisionPlan) -> PrecisionPlan:
    """The reference a fix is judged against: everything fp32, full-precision sums, attention
    upcast, TF32 off (TF32 keeps 10 mantissa bits: not a reference), no autocast; each
    component stored narrower computes in fp32 from its stored weights layer by layer (a cast
    to fp32 is exact: the same numbers as an fp32 copy, without holding one)."""
    return replace(
        no_half(plan),
        reference=True,
        upcast_attention=True,
        autocast=False,
        allow_tf32=False,
        fp16_accumulation=False,
        fp16_reduced_precision_reduction=False,
        attention_reduced_precision=False,
    )


def feed_forward_islands(pipeline) -> dict[str, dict[str, str]]:
    """Per T5 text encoder of the pipeline, its feed-forward output projections (`wo`, the
    modules transformers keeps in fp32 for T5) as fp32 islands."""
    islands = {}
    for name in pipeline_components(pipeline):
        module = getattr(pipeline, name)
        if COMPONENTS[name].role is Role.TEXT_ENCODER and t5.is_t5(module):
            islands[name] = {
                path: "fp32"
                for path, _ in module.named_modules()
                if t5.is_feed_forward_output(path)
            }
    return islands


# --- fixes --------------------------------------------------------------------------------


@dataclass(frozen=True)
class FixCandidate:
    """One fix to try: the plan to re-run under and the settings it means, said from those
    settings (`precision.words.fix_words`, the one way a fix is said). `kind` names its row of
    `FIX_KINDS`."""

    plan: PrecisionPlan
    settings: Mapping[str, SettingValue]
    kind: str = ""

    @property
    def words(self) -> str:
        from app.core.precision.words import fix_words

        return fix_words(self.settings, self.plan.dtypes)


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


@dataclass(frozen=True)
class FixContext:
    """What a candidate builder knows about one failing component."""

    component: str
    plan: PrecisionPlan
    first_bad: str | None
    module: Any  # the placed component
    bf16_native: bool
    wide: Any = None  # a ProbeResult of the component run in fp32 (None: not measured)

    @property
    def dtype(self) -> str:
        return self.plan.dtypes[self.component]

    @property
    def words(self) -> str:
        return COMPONENTS[self.component].words


def _reduced_precision_off(ctx: FixContext) -> FixCandidate | None:
    plan = ctx.plan
    reduced = (
        plan.fp16_accumulation
        or plan.attention_reduced_precision
        or plan.fp16_reduced_precision_reduction
    )
    if not (plan.device.startswith("cuda") and ctx.dtype != "fp32" and reduced):
        return None
    off = {
        "fp16_accumulation": False,
        "attention_reduced_precision": False,
        "fp16_reduced_precision_reduction": False,
    }
    return FixCandidate(replace(plan, **off), off)


def _attention_failed(ctx: FixContext) -> bool:
    return COMPONENTS[ctx.component].has_attention and _is_attention(ctx.first_bad, ctx.module)


def _upcast_attention(ctx: FixContext) -> FixCandidate | None:
    """Scores, softmax and weighted sum in fp32 on the processor that honours it
    (`precision.SafeAttnProcessor`), whatever kernel runs."""
    if ctx.plan.upcast_attention or not _attention_failed(ctx):
        return None
    return FixCandidate(
        replace(ctx.plan, upcast_attention=True),
        {"upcast_attention": True},
    )


def backend_switch(plan: PrecisionPlan, backend: str) -> FixCandidate:
    """`plan` on another attention backend at the same precision: the one way a backend is
    switched, by the math-kernel candidate below and by the cause's kernel probe
    (`causes`)."""
    return FixCandidate(
        replace(plan, attention_backend=backend),
        {"attention_backend": backend},
        kind="backend",
    )


_UNSET = object()


def switched_backend(settings: Mapping[str, Any], plan: PrecisionPlan) -> str | None:
    """The attention backend `settings` switch `plan` to when that is all they change (a
    kernel repair, not a precision one); None otherwise."""
    changed = {k: v for k, v in settings.items() if getattr(plan, k, _UNSET) != v}
    backend = changed.get("attention_backend")
    return backend if backend is not None and set(changed) == {"attention_backend"} else None


def _math_attention(ctx: FixContext) -> FixCandidate | None:
    """PyTorch's math attention kernel, which computes fp16 attention in fp32 unless reduced
    precision is allowed: another backend, not another precision setting (with reduced
    precision already off, exactly `backend_switch`)."""
    if ctx.plan.attention_backend == "math" or not _attention_failed(ctx):
        return None
    switch = backend_switch(ctx.plan, "math")
    return FixCandidate(
        replace(switch.plan, attention_reduced_precision=False),
        {**switch.settings, "attention_reduced_precision": False},
    )


def _classic_upcast(ctx: FixContext) -> FixCandidate | None:
    """diffusers' classic processor with its own upcast flags (attention and softmax)."""
    if ctx.plan.attention_backend == "classic" or not _attention_failed(ctx):
        return None
    return FixCandidate(
        replace(ctx.plan, attention_backend="classic", upcast_attention=True),
        {"attention_backend": "classic", "upcast_attention": True},
    )


def _t5_feed_forward(ctx: FixContext) -> FixCandidate | None:
    if (
        ctx.dtype == "fp32"
        or not t5.is_t5(ctx.module)
        or ctx.first_bad is None
        or "DenseReluDense" not in ctx.first_bad
        or ctx.plan.islands(ctx.component)
    ):
        return None
    islands = {
        path: "fp32" for path, _ in ctx.module.named_modules() if path.endswith("DenseReluDense.wo")
    }
    plan = ctx.plan.with_modules(ctx.component, islands)
    plan = replace(plan, t5_feed_forward=(*plan.t5_feed_forward, ctx.component))
    return FixCandidate(
        plan,
        {"t5_fp32_feed_forward": True},
    )


def _clamp(ctx: FixContext) -> FixCandidate | None:
    """Clamp the overflowing layers' fp16 outputs to +-65504, as diffusers and ComfyUI do for
    some models: finite, but right only when the clamp cuts almost nothing (the fp32
    comparison decides)."""
    if ctx.dtype != "fp16" or ctx.plan.clamps.get(ctx.component):
        return None
    layers = overflowing_layers(ctx.wide, ctx.module)
    if not layers:
        return None
    entries = [f"{ctx.component}:{p}" for p in layers]
    return FixCandidate(
        ctx.plan.with_clamps(ctx.component, layers),
        {"clamp_modules": entries},
    )


def _islands(ctx: FixContext) -> FixCandidate | None:
    """The overflowing layers, and those their values feed until back in range, wider (bf16
    where native, else fp32); the rest of the component stays in fp16."""
    if ctx.dtype != "fp16":
        return None
    layers = overflow_islands(ctx.wide, ctx.module)
    if not layers:
        return None
    dtype = "bf16" if ctx.bf16_native else "fp32"
    islands = {**ctx.plan.islands(ctx.component), **dict.fromkeys(layers, dtype)}
    plan = ctx.plan.with_modules(ctx.component, islands)
    return FixCandidate(
        plan,
        {f"{dtype}_modules": plan.module_settings()[f"{dtype}_modules"]},
    )


def _whole_component(ctx: FixContext, dtype: str) -> FixCandidate | None:
    """The component in `dtype` by its setting, and with it every part that setting governs
    (Anima's text conditioner and transformer share the denoiser's), as the setting will run."""
    setting = COMPONENTS[ctx.component].setting
    shared = [n for n in ctx.plan.dtypes if n in COMPONENTS and COMPONENTS[n].setting == setting]
    plan = ctx.plan.with_dtypes(**dict.fromkeys([ctx.component, *shared], dtype))
    return FixCandidate(plan, {setting: dtype})


def _component_bf16(ctx: FixContext) -> FixCandidate | None:
    return _whole_component(ctx, "bf16") if ctx.dtype == "fp16" and ctx.bf16_native else None


def _component_fp32(ctx: FixContext) -> FixCandidate | None:
    return _whole_component(ctx, "fp32") if ctx.dtype != "fp32" else None


@dataclass(frozen=True)
class FixKind:
    """One row of the fix table: its name, its builder, and what it is in the field."""

    name: str
    build: Callable[[FixContext], FixCandidate | None]
    about: str


# Every fix the check knows, in the order they are tried. Which one is chosen is measured
# (`rank_candidates`: memory, then time); among fixes alike in cost this order decides:
# settings that change no weights, then layers kept wider (fp16's precision everywhere else),
# then a whole component in bf16, then a clamp (its agreement with fp32 holds for the inputs it
# was tested on; a precision change holds for any), then a whole component in fp32. None is
# applied because a model family is known to need it.
FIX_KINDS: tuple[FixKind, ...] = (
    FixKind("reduced_precision_off", _reduced_precision_off, "CUDA's reduced-precision sums off"),
    FixKind("upcast_attention", _upcast_attention, "attention scores and softmax in fp32"),
    FixKind("math_attention", _math_attention, "the math attention kernel (fp32 inside)"),
    FixKind("classic_attention", _classic_upcast, "diffusers' classic processor, upcast"),
    FixKind("t5_feed_forward", _t5_feed_forward, "T5's feed-forward output in fp32"),
    FixKind("islands", _islands, "the overflowing layers in fp32 (bf16 where native)"),
    FixKind("component_bf16", _component_bf16, "the whole component in bf16"),
    FixKind("clamp", _clamp, "clamp the overflowing layers' fp16 output to +-65504"),
    FixKind("component_fp32", _component_fp32, "the whole component in fp32"),
)


def candidate_fixes(
    component: str,
    plan: PrecisionPlan,
    first_bad: str | None,
    module,
    bf16_native: bool,
    wide: Any = None,
) -> Iterator[FixCandidate]:
    """Fixes for one failing component, in `FIX_KINDS` order. `wide` is a probe of the
    component run in fp32 (the island and clamp candidates are drawn from it), or a function
    that makes one when first needed. Whole-model fp32 is the caller's last resort."""
    measured: list[Any] = []

    def probe():
        if not measured:
            measured.append(wide() if callable(wide) else wide)
        return measured[0]

    for kind in FIX_KINDS:
        needs_probe = kind.name in ("clamp", "islands")
        ctx = FixContext(
            component, plan, first_bad, module, bf16_native, probe() if needs_probe else None
        )
        candidate = kind.build(ctx)
        if candidate is not None:
            yield replace(candidate, kind=kind.name)


MODULE_SETTINGS = ("fp32_modules", "bf16_modules", "clamp_modules")


def unknown_layers(settings: Mapping[str, Any], pipeline) -> list[tuple[str, str]]:
    """(setting, "component:layer") of every module setting entry (`MODULE_SETTINGS`) that
    names a layer this model does not have."""
    from app.core.settings import modules_by_component

    unknown = []
    for key in MODULE_SETTINGS:
        for component, paths in modules_by_component(list(settings.get(key) or [])).items():
            module = getattr(pipeline, component, None)
            for path in paths:
                try:
                    if module is None:
                        raise AttributeError(path)
                    module.get_submodule(path)
                except AttributeError:
                    unknown.append((key, f"{component}:{path}"))
    return unknown


def without_layers(settings: Mapping[str, Any], entries: Collection[str]) -> dict[str, Any]:
    """`settings` with the module entries `entries` ("component:layer") left out, and a
    module setting left empty by that left out too."""
    kept = dict(settings)
    for key in MODULE_SETTINGS:
        if key in kept:
            remaining = [e for e in kept[key] or [] if e not in entries]
            if remaining:
                kept[key] = remaining
            else:
                del kept[key]
    return kept


def check_module_settings(settings: Mapping[str, Any], pipeline, source: str) -> None:
    """Refuse, in one sentence, a module setting (`MODULE_SETTINGS`) that names a layer this
    model does not have: checked when the model is loaded, before anything runs."""
    for key, entry in unknown_layers(settings, pipeline)[:1]:
        raise HalfSafeError(
            f"{source}: --{key.replace('_', '-')} names {entry}, which this model does not have."
        )


# --- choosing among verified fixes ----------------------------------------------------------

# Two verified fixes whose memory differs by less than this are alike in memory; the measured
# time then decides, when the two time ranges do not overlap.
MEMORY_TOLERANCE = 0.10


@dataclass
class CandidateResult:
    """One candidate as the check measured it: finite or not, its quality against the fp32
    reference, and its cost on this device (`cost`: unet/stage step time, memory)."""

    component: str
    kind: str
    words: str
    settings: dict[str, SettingValue]
    modules: int  # layers kept out of the component's dtype by this candidate
    finite: bool
    quality: Quality | None
    cost: StageCost | None = None  # None: not measured
    chosen: bool = False
    candidate: FixCandidate | None = None

    @property
    def verified(self) -> bool:
        return self.finite and self.quality is not None and self.quality.passed

    def memory_mb(self) -> float | None:
        return self.cost.memory_mb if self.cost is not None else None

    def to_json(self) -> dict[str, Any]:
        return {
            "component": self.component,
            "kind": self.kind,
            "words": self.words,
            "settings": dict(self.settings),
            "modules": self.modules,
            "finite": self.finite,
            "quality": self.quality.to_json() if self.quality else None,
            "verified": self.verified,
            "chosen": self.chosen,
            "cost": self.cost.to_json() if self.cost is not None else {},
        }


# A candidate beats the one the table prefers only by this much time at least (its median a
# tenth below the other's), and beyond the noise: on a busy machine two candidates a few
# percent apart swapped places from one check to the next, the fix the user was shown with them.
MATERIALLY_FASTER = 0.9


def _timing(a: StageCost | None, b: StageCost | None) -> str:
    """How `a`'s measured time compares with `b`'s: "slower" (its median not below `b`'s, or
    either not measured), "noise" (below, but the two runs' ranges overlap), "margin" (apart,
    by less than `MATERIALLY_FASTER`) or "faster" (a fix worth preferring for its time)."""
    ma = a.step_ms if a is not None else None
    mb = b.step_ms if b is not None else None
    if ma is None or mb is None or ma >= mb:
        return "slower"
    ra = a.step_ms_range if a is not None else None
    rb = b.step_ms_range if b is not None else None
    if not (ra and rb and ra[1] < rb[0]):
        return "noise"
    return "faster" if ma <= mb * MATERIALLY_FASTER else "margin"


def _faster(a: StageCost | None, b: StageCost | None) -> bool:
    """Whether `a` was measured faster than `b` beyond the noise (the ranges do not overlap)
    and by a margin that matters (`MATERIALLY_FASTER`)."""
    return _timing(a, b) == "faster"


def passed_over(candidate: CandidateResult, chosen: CandidateResult) -> str:
    """Why `rank_candidates` chose `chosen` over the verified `candidate` (of the same
    component): "memory" (it held more, past `MEMORY_TOLERANCE`), else its time against the
    chosen one's (`_timing`): "slower", "noise", "margin", or "order" where it was faster yet
    the ranking's walk through the table's order kept another (each rival is timed against the
    best found before it)."""
    least = chosen.memory_mb() or 0.0
    if (candidate.memory_mb() or 0.0) > least * (1 + MEMORY_TOLERANCE) + 1e-9:
        return "memory"
    timing = _timing(candidate.cost, chosen.cost)
    return "order" if timing == "faster" else timing


# How the fix is chosen among the verified candidates (`rank_candidates`), in the words every
# rendering of the candidates' table uses.
CHOSEN_WORDS = (
    "the verified one holding the least memory is chosen (within a tenth counts as alike); "
    "among those alike, the first of a "
    "switch, layers kept wider, the part in bf16, a clamp and the part in fp32, unless another "
    "was a tenth faster beyond the noise"
)


def rank_candidates(results: list[CandidateResult]) -> list[CandidateResult]:
    """Verified candidates, best first, then the rest (never a fix), by quality. The best is
    found among the verified ones whose memory (peak where the device reports it, else
    weights) is within `MEMORY_TOLERANCE` of the least: one measured faster beyond the noise
    wins, otherwise the `FIX_KINDS` order decides. The other verified ones follow by memory."""
    order = {k.name: i for i, k in enumerate(FIX_KINDS)}

    def memory(r: CandidateResult) -> float:
        return r.memory_mb() or 0.0

    verified = sorted(
        (r for r in results if r.verified), key=lambda r: (memory(r), order.get(r.kind, 99))
    )
    if verified:
        least = memory(verified[0])
        alike = sorted(
            (r for r in verified if memory(r) <= least * (1 + MEMORY_TOLERANCE) + 1e-9),
            key=lambda r: order.get(r.kind, 99),
        )
        best = alike[0]
        for other in alike[1:]:
            if _faster(other.cost, best.cost):
                best = other
        verified.remove(best)
        verified.insert(0, best)
    rest = sorted(
        (r for r in results if not r.verified),
        key=lambda r: -(r.quality.value if r.quality is not None else -math.inf),
    )
    return verified + rest


def verification_order(results: list[CandidateResult]) -> list[CandidateResult]:
    """`results` (candidates not run yet, each with the memory its plan holds) in the order the
    ranking prefers them before any is run: least memory first, then `FIX_KINDS` order."""
    order = {k.name: i for i, k in enumerate(FIX_KINDS)}
    return sorted(results, key=lambda r: (r.memory_mb() or 0.0, order.get(r.kind, 99)))


class Pruning:
    """Which candidates, run in `verification_order`, can still be ranked first
    (`rank_candidates`) once run, given those verified so far: the rest need no run before the
    fix is named (the candidates' table runs them after).

    Run in that order, the first verified candidate holds the least memory of every verified
    one, so the band of memory alike to the least (`MEMORY_TOLERANCE`) is fixed by it: a
    candidate past the band cannot win. Within it, with the time measured (`timed`) any one
    may win by being faster; without it the first in `FIX_KINDS` order wins, so one after the
    best so far cannot. This holds where the memory ranked is known before a run (the plan's,
    `StageCost.memory_mb` of a row not timed yet); `tests/core/test_pruned_search.py` holds it
    to the full ranking over random tables."""

    def __init__(self, timed: bool) -> None:
        self.timed = timed
        self.verified: list[CandidateResult] = []

    def add(self, result: CandidateResult) -> None:
        """`result`, run (in `verification_order`)."""
        if result.verified:
            self.verified.append(result)

    def could_win(self, result: CandidateResult) -> bool:
        """Whether `result`, not run yet, could be ranked first once run."""
        if not self.verified:
            return True
        if not _alike_in_memory(result, self.verified[0]):
            return False
        if self.timed:
            return True
        order = {k.name: i for i, k in enumerate(FIX_KINDS)}
        best = min(order.get(v.kind, 99) for v in self.verified)
        return order.get(result.kind, 99) < best


def _alike_in_memory(result: CandidateResult, least: CandidateResult) -> bool:
    """Whether `result` holds memory alike to `least`'s, the least (as `rank_candidates`)."""
    bound = (least.memory_mb() or 0.0) * (1 + MEMORY_TOLERANCE) + 1e-9
    return (result.memory_mb() or 0.0) <= bound


def everything_fp32(plan: PrecisionPlan) -> FixCandidate:
    return FixCandidate(no_half(plan), {"no_half": True})


# --- predictions --------------------------------------------------------------------------


def status_from_peak(peak: float | None) -> Status:
    """What a finite run's largest activation says about fp16: past 65504 it overflows, within
    2x of it a bigger image or another prompt can tip it over."""
    if peak is None or not math.isfinite(peak):
        return Status.OVERFLOW
    if peak > FP16_MAX:
        return Status.OVERFLOW
    if peak > FP16_MAX / AT_RISK_HEADROOM:
        return Status.AT_RISK
    return Status.OK
