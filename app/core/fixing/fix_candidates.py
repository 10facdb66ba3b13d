"""The fixes the check and a repair try for a failing component, cheapest first (`FIX_KINDS`,
`candidate_fixes`): settings that change no weights, layers kept wider, a whole component
wider, a clamp.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from app.core.components import COMPONENTS
from app.core.encoders.kind import OwnIsland
from app.core.encoders.kinds import OWN_ISLANDS, own_islands
from app.core.fixing.job_plans import no_half
from app.core.fixing.layer_islands import _is_attention, overflow_islands, overflowing_layers
from app.core.precision import PrecisionPlan
from app.core.settings.values import SettingValue


@dataclass(frozen=True)
class FixCandidate:
    """One fix to try: the plan to re-run under and the settings it means, said from those
    settings (`precision.words.fix_words`, the one way a fix is said). `kind` names its row of
    `FIX_KINDS`."""

    plan: PrecisionPlan
    settings: Mapping[str, SettingValue]
    kind: str = ""
    # What this candidate adds, where its settings also carry the fixes found before it (a
    # layer list holds every component's layers): its words say only this.
    own: Mapping[str, SettingValue] | None = None

    @property
    def words(self) -> str:
        from app.core.precision.words import fix_words

        return fix_words(self.settings if self.own is None else self.own, self.plan.dtypes)


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


def _kind_island(island: OwnIsland) -> Callable[[FixContext], FixCandidate | None]:
    """The builder of the fix that keeps `island` wider, as the failing part's kind does itself
    (`kinds.own_islands`): for a part of that kind, narrower than the island, that failed
    within it and keeps no layer wider yet."""

    def build(ctx: FixContext) -> FixCandidate | None:
        if (
            ctx.dtype in ("fp32", island.dtype)
            or island not in own_islands(ctx.module)
            or ctx.first_bad is None
            or island.within not in ctx.first_bad
            or ctx.plan.islands(ctx.component)
        ):
            return None
        plan = ctx.plan.with_modules(ctx.component, island.layers(ctx.module))
        return FixCandidate(
            plan.with_kind_island(ctx.component, island.setting),
            {island.setting: True},
        )

    return build


def _clamp(ctx: FixContext) -> FixCandidate | None:
    """Clamp the overflowing layers' fp16 outputs to +-65504, as diffusers and ComfyUI do for
    some models: finite, but right only when the clamp cuts almost nothing (the fp32
    comparison decides)."""
    if ctx.dtype != "fp16" or ctx.plan.clamps.get(ctx.component):
        return None
    layers = overflowing_layers(ctx.wide, ctx.module)
    if not layers:
        return None
    plan = ctx.plan.with_clamps(ctx.component, layers)
    return FixCandidate(
        plan,
        {"clamp_modules": plan.module_settings()["clamp_modules"]},
        own={"clamp_modules": [f"{ctx.component}:{p}" for p in layers]},
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
    key = f"{dtype}_modules"
    entries = plan.module_settings()[key]
    return FixCandidate(
        plan,
        {key: entries},
        own={key: [e for e in entries if e.partition(":")[0] == ctx.component]},
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
# (`rank_candidates`: memory, predictions apart, what each holds and changes); this order is the
# last of those keys:
# settings that change no weights, then layers kept wider (fp16's precision everywhere else),
# then a whole component in bf16, then a clamp (its agreement with fp32 holds for the inputs it
# was tested on; a precision change holds for any), then a whole component in fp32. None is
# applied because a model family is known to need it.
FIX_KINDS: tuple[FixKind, ...] = (
    FixKind("reduced_precision_off", _reduced_precision_off, "CUDA's reduced-precision sums off"),
    FixKind("upcast_attention", _upcast_attention, "attention scores and softmax in fp32"),
    FixKind("math_attention", _math_attention, "the math attention kernel (fp32 inside)"),
    FixKind("classic_attention", _classic_upcast, "diffusers' classic processor, upcast"),
    *(FixKind(i.fix, _kind_island(i), i.about) for i in OWN_ISLANDS),
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


def everything_fp32(plan: PrecisionPlan) -> FixCandidate:
    return FixCandidate(no_half(plan), {"no_half": True})
