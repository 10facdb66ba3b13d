"""The plan a job runs under: the user's settings resolved against the device, the model's own
needs and a remembered fix (`plan_for_model`, where the check and generation both start), the
plans derived from it (no-half, the fp32 reference), and the layer lists a setting may name.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import replace
from typing import Any

from app.core.components import COMPONENTS, Role, module_of, runs_layer
from app.core.encoders import kinds
from app.core.errors import HalfSafeError
from app.core.fixing.layer_islands import whole_attention_plan
from app.core.precision import PrecisionPlan, pipeline_components, resolve_plan
from app.core.precision.streaming import host_bytes
from app.core.settings import PrecisionSettings


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
        own_islands=own_islands(pipeline),
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


# A plan's switches that every part it runs runs under (not one part's own settings).
SHARED_SWITCHES = (
    "upcast_attention",
    "attention_backend",
    "allow_tf32",
    "fp16_reduced_precision_reduction",
    "fp16_accumulation",
    "attention_reduced_precision",
    "autocast",
)


def held(plan: PrecisionPlan, part: str) -> tuple[Any, ...]:
    """What `plan` holds for the part `part` alone: its dtype, the layers it keeps otherwise
    (its kind's islands among them) and the layers it clamps."""
    return (plan.dtypes.get(part), plan.islands(part), tuple(plan.clamps.get(part, ())))


def switched(plan: PrecisionPlan, base: PrecisionPlan) -> bool:
    """Whether `plan` sets a switch every part runs under otherwise than `base`."""
    return any(getattr(plan, s) != getattr(base, s) for s in SHARED_SWITCHES)


def changes_part(part: str, plan: PrecisionPlan, base: PrecisionPlan) -> bool:
    """Whether `plan` runs the checked part `part` otherwise than `base` does: what it holds
    for the layers the part runs (`held`, of its module: the VAE's encoder and decoder apart,
    `components.runs_layer`), or a switch every part runs under (an earlier part's fix that
    upcasts attention reaches this one)."""
    return _runs(plan, part) != _runs(base, part) or switched(plan, base)


def _runs(plan: PrecisionPlan, part: str) -> tuple[Any, ...]:
    """What `plan` holds for the layers the checked part `part` runs."""
    dtype, islands, clamps = held(plan, module_of(part))
    ran = {path: d for path, d in islands.items() if runs_layer(part, path)}
    return (dtype, ran, tuple(path for path in clamps if runs_layer(part, path)))


def own_islands(pipeline) -> dict[str, dict[str, dict[str, str]]]:
    """Per text encoder of the pipeline whose kind keeps layers wider itself (the modules
    transformers keeps in fp32, `kinds.own_islands`), per setting that keeps them, its layers
    and their dtype."""
    islands = {}
    for name in pipeline_components(pipeline):
        module = getattr(pipeline, name)
        if COMPONENTS[name].role is Role.TEXT_ENCODER and (own := kinds.own_islands(module)):
            islands[name] = {island.setting: island.layers(module) for island in own}
    return islands


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


def remembered_ran(plan: PrecisionPlan, remembered: Any) -> dict[str, Any]:
    """What of the remembered fix `remembered` (a `RememberedFix`, or None) the job planned as
    `plan` ran with: a setting the user's own overrode, or a layer the model lacks, took no
    part in it."""
    if remembered is None:
        return {}
    ran_with = {*plan.remembered_used, *plan.remembered_held}
    usable = without_layers(remembered.settings, plan.remembered_dropped)
    return {key: value for key, value in usable.items() if key in ran_with}


def proved_with(ran: Mapping[str, Any], settings: Mapping[str, Any], plan: PrecisionPlan):
    """The fix to remember: its `settings`, proved running `plan`, with what of the remembered
    fix the job ran with (`ran`, `remembered_ran`), which its proof stood on (a check run with
    the VAE in fp32 from memory proves the UNet's layers beside it, not instead of it). A layer
    of the remembered fix is kept in the list `plan` holds it in: the new fix's lists are the
    plan's own, and a layer it moved (bf16 to fp32) is not kept in the old one too."""
    kept = dict(ran)
    lists = plan.module_settings()
    for key in MODULE_SETTINGS:
        if key in kept and key not in settings:
            still = [e for e in kept[key] or [] if e in lists.get(key, ())]
            if still:
                kept[key] = still
            else:
                del kept[key]
    return {**kept, **settings}


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
