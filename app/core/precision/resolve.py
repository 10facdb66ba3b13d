"""Resolving the user's precision settings to a plan for one job: `auto` against the device, the
model and a remembered fix, explicit choices kept with warnings; what the settings give each
component before a model is loaded; what this device can really run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from app.core.components import COMPONENTS as ALL_COMPONENTS
from app.core.components import SETTING_FOLLOWS, join_words
from app.core.encoders.kinds import OWN_ISLANDS, own_island
from app.core.precision.autocast import autocast_available, autocast_problem
from app.core.precision.plan import COMPONENT_SETTING, DTYPE_NAMES, PrecisionPlan
from app.core.precision.streaming import device_budget
from app.core.settings import PrecisionSettings, modules_by_component


def expected_dtypes(
    values: Mapping[str, Any], recommended: Mapping[str, Any] | None = None
) -> dict[str, str]:
    """Per precision setting, the dtype it will give its components, as far as the settings and
    this computer's recommendation decide it before a model is loaded ('auto' where neither
    does). The GUI shows this; `resolve_plan` makes the final decision per job, by the same
    rules: a per-component `auto` follows the setting it follows (SETTING_FOLLOWS) or the base
    precision, and no-half / no-half-VAE override."""
    recommended = recommended or {}
    chosen_base = str(values.get("precision", "auto"))
    base = chosen_base if chosen_base != "auto" else str(recommended.get("precision", "auto"))
    if base == "autocast":  # fp16 weights under autocast
        base = "fp16"
    result: dict[str, str] = {}
    for key in dict.fromkeys(c.setting for c in ALL_COMPONENTS.values()):
        value = str(values.get(key, "auto"))
        follows = SETTING_FOLLOWS.get(key)
        if value == "auto" and follows in result:
            value = result[follows]
        elif value == "auto":
            value = base if chosen_base != "auto" else str(recommended.get(key, base))
        result[key] = value
    if values.get("no_half"):
        return dict.fromkeys(result, "fp32")
    if values.get("no_half_vae"):
        result["vae_precision"] = "fp32"
    return result


def resolve_plan(
    settings: PrecisionSettings,
    *,
    device,
    components: Iterable[str],
    device_info: Any | None = None,
    vae_needs_fp32: bool = False,
    remembered: Mapping[str, Any] | None = None,
    own_islands: Mapping[str, Mapping[str, Mapping[str, str]]] | None = None,
    ask_device: bool = True,
    held_bytes: int = 0,
) -> PrecisionPlan:
    """Resolve `auto` against the device and the model; keep explicit choices, with warnings.

    `own_islands` are the layers each component's kind keeps wider itself, per setting that
    keeps them (component -> setting -> {layer: dtype}, `job_plans.own_islands`): with their
    setting on they run in their dtype in every component that runs narrower.

    `device_info` is `app.core.hardware.describe_device(device)` (its `recommended` settings,
    their `reasons`, and its `fp16`/`bf16` classes); `vae_needs_fp32` is the model's own
    statement that its VAE overflows in fp16 (SDXL's original VAE sets `force_upcast`);
    `remembered` is a verified fix stored for this model on this device, as settings values.
    For a field the user left on `auto` (or off), the remembered fix comes first, then the
    model's needs, then the device's recommendation. `ask_device`: the device is asked what
    `device_info` does not say (its free memory for a budget left to it, what its autocast
    does); off for the plan the window shows before a job, which never touches the device.
    `held_bytes`: what the loaded model's weights take in the computer's memory, which a budget
    taken from that memory (a CPU's, an Apple GPU's) leaves to them.
    """
    device_str = str(device)
    kind = device_str.split(":")[0]
    recommended: Mapping[str, Any] = getattr(device_info, "recommended", None) or {}
    device_reasons: Mapping[str, str] = getattr(device_info, "reasons", None) or {}
    bf16_class = getattr(device_info, "bf16", None) or (
        "native" if kind == "cuda" else "unsupported"
    )
    fp16_class = getattr(device_info, "fp16", None) or ("fast" if kind == "cuda" else "slow")
    user = settings.to_dict()
    chosen = dict(user)
    from_memory: set[str] = set()
    for key, value in (remembered or {}).items():
        if key in chosen and key != "device" and left_as_it_comes(key, chosen[key]):
            chosen[key] = value
            from_memory.add(key)
    reasons: dict[str, str] = {}
    warnings: list[str] = []

    base, autocast = _base_precision(
        chosen["precision"], kind, recommended, device_reasons, reasons, warnings, ask_device
    )
    dtypes = _component_dtypes(
        components,
        _Choices(user, chosen, from_memory, base),
        _DeviceSays(kind, recommended, device_reasons, bf16_class, fp16_class),
        vae_needs_fp32,
        reasons,
        warnings,
    )
    upcast = bool(chosen["upcast_attention"] or recommended.get("upcast_attention", False))
    if upcast and not user["upcast_attention"]:
        reasons["upcast_attention"] = (
            "A fix verified for this model on this device is remembered."
            if "upcast_attention" in from_memory
            else device_reasons.get(
                "upcast_attention", "This device needs attention upcast to fp32."
            )
        )
    attention_backend, fp16_accumulation = _what_the_device_runs(
        kind, chosen["attention_backend"], bool(chosen["fp16_accumulation"]), warnings
    )
    if chosen["attention_backend"] == "flash" and upcast:
        warnings.append(
            "Flash attention has no fp32 kernel: upcast attention runs on the "
            "memory-efficient or math kernel instead."
        )
    modules, clamps, kind_islands = _layer_lists(chosen, from_memory, dtypes, own_islands, reasons)
    budget = float(user.get("max_vram_gb") or 0.0) * 1024 or None
    budget_from = "setting" if budget else None
    if budget is None and ask_device:
        budget, budget_from = device_budget(device_str, held_bytes)
    return PrecisionPlan(
        device=device_str,
        dtypes=dtypes,
        modules=modules,
        clamps=clamps,
        kind_islands=kind_islands,
        upcast_attention=upcast,
        attention_backend=attention_backend,
        allow_tf32=bool(chosen["allow_tf32"]) and _runs_tf32(kind, device_info),
        fp16_reduced_precision_reduction=bool(chosen["fp16_reduced_precision_reduction"]),
        fp16_accumulation=fp16_accumulation,
        attention_reduced_precision=bool(chosen["attention_reduced_precision"]),
        autocast=autocast,
        reasons=reasons,
        warnings=tuple(warnings),
        remembered_used=tuple(
            sorted(k for k in from_memory if chosen[k] != user[k] and not _moot(k, user))
        ),
        remembered_held=_held(remembered, user),
        memory_budget_mb=budget,
        memory_budget_from=budget_from,
        vae_tiling=str(user.get("vae_tiling") or "auto"),
    )


def _base_precision(
    asked: str,
    kind: str,
    recommended: Mapping[str, Any],
    device_reasons: Mapping[str, str],
    reasons: dict[str, str],
    warnings: list[str],
    ask_device: bool,
) -> tuple[str, bool]:
    """The precision every part starts from (`asked`, resolved when "auto" or "autocast"), and
    whether PyTorch's autocast runs; the reason and any warning added to `reasons`, `warnings`."""
    base = asked
    autocast = base == "autocast"
    if autocast:
        base = "fp16"
        reasons["precision"] = (
            "Autocast: fp16 weights under PyTorch's autocast, as AUTOMATIC1111 runs by default."
        )
        problem = autocast_problem(kind) if ask_device else None
        if problem:
            warnings.append(problem)
            autocast = autocast_available(kind)
    if base == "auto":
        base = recommended.get("precision", "auto")
        if base not in DTYPE_NAMES:
            base = "fp32" if kind == "cpu" else "fp16"
        reasons["precision"] = device_reasons.get("precision", f"{base} suits this device best.")
    return base, autocast


@dataclass(frozen=True)
class _Choices:
    """The user's settings (`user`), with the remembered fix filled in where they are left on
    auto (`chosen`, and the keys it filled: `from_memory`), and the resolved base precision."""

    user: Mapping[str, Any]
    chosen: Mapping[str, Any]
    from_memory: set[str]
    base: str


@dataclass(frozen=True)
class _DeviceSays:
    """What the device report recommends, why, and its fp16 and bf16 classes."""

    kind: str
    recommended: Mapping[str, Any]
    reasons: Mapping[str, str]
    bf16_class: str
    fp16_class: str


def _component_dtypes(
    components: Iterable[str],
    choices: _Choices,
    device: _DeviceSays,
    vae_needs_fp32: bool,
    reasons: dict[str, str],
    warnings: list[str],
) -> dict[str, str]:
    """Each part's dtype: no-half, the part's own setting (or the one it follows), the model's
    need, the device's recommendation, then the base. One warning per choice honoured though not
    recommended, naming every part it concerns."""
    user, chosen, from_memory, base = (
        choices.user,
        choices.chosen,
        choices.from_memory,
        choices.base,
    )
    dtypes: dict[str, str] = {}
    unwise: dict[str, list[str]] = {}  # a choice honoured though not recommended: its parts
    for component in components:
        key = COMPONENT_SETTING[component]
        device_choice = device.recommended.get(key)
        if chosen["no_half"]:
            dtypes[component], reasons[key] = (
                "fp32",
                "No half precision is on: everything runs in fp32.",
            )
        elif component == "vae" and chosen["no_half_vae"]:
            dtypes[component], reasons[key] = "fp32", "No-half-VAE is on: the VAE runs in fp32."
        elif chosen[key] != "auto":
            dtypes[component] = chosen[key]
        elif chosen.get(SETTING_FOLLOWS.get(key, ""), "auto") != "auto":
            dtypes[component] = chosen[SETTING_FOLLOWS[key]]
        elif component == "vae" and vae_needs_fp32 and base == "fp16":
            dtypes[component] = "fp32"
            reasons[key] = (
                "This model's VAE is known to overflow in fp16 (its config asks for "
                "upcasting), so it runs in fp32."
            )
        elif user["precision"] == "auto" and device_choice in DTYPE_NAMES:
            dtypes[component] = device_choice
            if key in device.reasons:
                reasons[key] = device.reasons[key]
        else:
            dtypes[component] = base
        if (
            (key in from_memory and not _moot(key, user))
            or ("no_half" in from_memory and chosen["no_half"])
            or (component == "vae" and "no_half_vae" in from_memory and chosen["no_half_vae"])
        ):
            reasons[key] = "A fix verified for this model on this device is remembered."

        follows = SETTING_FOLLOWS.get(key)
        explicit = (
            user[key] != "auto"
            or user["precision"] != "auto"
            or (follows is not None and user[follows] != "auto")
        )
        name = dtypes[component]
        if explicit and name == "bf16" and device.bf16_class != "native":
            unwise.setdefault("bf16_emulated", []).append(component)
        elif explicit and name == "fp16" and device.kind == "cpu":
            unwise.setdefault("fp16_cpu", []).append(component)
        elif explicit and name == "fp16" and device.fp16_class == "unreliable":
            unwise.setdefault("fp16_unreliable", []).append(component)
    for what, parts in unwise.items():
        runs = "runs" if len(parts) == 1 else "run"
        warnings.append(_UNWISE_WORDS[what].format(parts=join_words(parts), runs=runs))
    return dtypes


def _layer_lists(
    chosen: Mapping[str, Any],
    from_memory: set[str],
    dtypes: Mapping[str, str],
    own_islands: Mapping[str, Mapping[str, Mapping[str, str]]] | None,
    reasons: dict[str, str],
) -> tuple[dict[str, dict[str, str]], dict[str, tuple[str, ...]], dict[str, tuple[str, ...]]]:
    """The layers kept wider than their part (layer -> dtype, per part), the layers clamped (per
    fp16 part) and, per part, the settings of its kind's own islands it keeps. A layer list or
    island naming a part that already runs as wide keeps nothing wider."""
    modules: dict[str, dict[str, str]] = {}
    kind_islands: dict[str, tuple[str, ...]] = {}
    for component, islands in (own_islands or {}).items():
        for setting, layers in islands.items():
            island = own_island(setting)
            own = dtypes.get(component)
            if not chosen.get(setting) or island is None or own is None:
                continue
            if _as_wide(own, island.dtype):
                continue
            modules.setdefault(component, {}).update(layers)
            kind_islands[component] = (*kind_islands.get(component, ()), setting)
            reasons[setting] = (
                "A fix verified for this model on this device is remembered."
                if setting in from_memory
                else island.asked
            )
    clamps: dict[str, tuple[str, ...]] = {}
    for key in ("fp32_modules", "bf16_modules", "clamp_modules"):
        for component, paths in modules_by_component(list(chosen.get(key) or [])).items():
            own = dtypes.get(component)
            if own is None:
                continue
            if key == "clamp_modules":
                if own == "fp16":
                    clamps[component] = tuple(paths)
                continue
            dtype = key.split("_")[0]
            if _as_wide(own, dtype):
                continue  # already as wide: nothing to keep wider
            modules.setdefault(component, {}).update(dict.fromkeys(paths, dtype))
            if key in from_memory:
                reasons[key] = "A fix verified for this model on this device is remembered."
    return modules, clamps, kind_islands


def _as_wide(own: str, dtype: str) -> bool:
    """Whether a part running in `own` already keeps every value a layer in `dtype` would."""
    return own == "fp32" or own == dtype


def _moot(key: str, user: Mapping[str, Any]) -> bool:
    """Whether a remembered fix's `key` changes nothing the job runs: the user's own no-half
    runs every part in fp32 (no-half-VAE the VAE), so no dtype or layer list of a fix takes
    part; a check or job run so ran without the fix, whatever memory set."""
    if user.get("no_half"):
        return key in _WIDTH_KEYS
    return bool(user.get("no_half_vae")) and key == "vae_precision"


# The settings that only choose how wide a part or its layers compute.
_WIDTH_KEYS = frozenset(
    {
        *COMPONENT_SETTING.values(),
        "precision",
        "no_half_vae",
        "upcast_attention",
        "fp32_modules",
        "bf16_modules",
        "clamp_modules",
        *(island.setting for island in OWN_ISLANDS),
    }
)


def _runs_tf32(kind: str, device_info: Any | None) -> bool:
    """Whether TF32 can run here at all: only CUDA GPUs of the Ampere kind or later have it
    (`DeviceInfo.tf32`; a CUDA device not described is taken at its word). Elsewhere the
    setting changes nothing, and the plan, and so every record of the job, says it did not
    run."""
    if kind != "cuda":
        return False
    return bool(getattr(device_info, "tf32", True))


def left_as_it_comes(key: str, value: Any) -> bool:
    """Whether the user left the setting `key` as it comes (`value`: auto, off, empty, or its
    default), so that a remembered fix may set it: a fix that turns CUDA's reduced-precision
    sums off (on by default) runs, as one that turns attention upcast on (off by default) does."""
    from app.core.settings import FIELDS

    field = FIELDS.get(key)
    return value in ("auto", False, []) or (field is not None and value == field.default)


def _held(remembered: Mapping[str, Any] | None, user: Mapping[str, Any]) -> tuple[str, ...]:
    """The settings of a remembered fix that the user's own settings already give the same
    value (a layer list in any order): the job ran with them, though not from memory."""

    def same(value: Any, other: Any) -> bool:
        if isinstance(value, list | tuple) and isinstance(other, list | tuple):
            return sorted(map(str, value)) == sorted(map(str, other))
        return value == other

    return tuple(
        sorted(
            key
            for key, value in (remembered or {}).items()
            if key in user
            and key != "device"
            and value not in ("auto", False, [], ())
            and same(value, user[key])
        )
    )


# Explicit choices honoured though not recommended, said once for all the parts they concern.
_UNWISE_WORDS = {
    "bf16_emulated": "The {parts} {runs} in bf16 as you asked, but this device has no native "
    "bf16: expect it to be slow or to fail.",
    "fp16_cpu": "The {parts} {runs} in fp16 as you asked; on a CPU fp16 is slow and fp32 is the "
    "usual choice.",
    "fp16_unreliable": "The {parts} {runs} in fp16 as you asked, but this GPU is known to return "
    "NaN from some fp16 operations.",
}

# Attention kernels PyTorch has only for CUDA GPUs; elsewhere SDPA runs its math kernel (and on
# a CPU its fused kernel, under the flash name).
CUDA_ONLY_BACKENDS = {"efficient": "memory-efficient attention", "cudnn": "cuDNN attention"}
_DEVICE_WORDS = {"cpu": "a CPU", "mps": "an Apple GPU (MPS)", "xpu": "an Intel GPU (XPU)"}
# Settings that change only what a CUDA GPU's matrix multiplies do.
CUDA_ONLY_SETTINGS = ("allow_tf32", "fp16_reduced_precision_reduction", "fp16_accumulation")


def idle_settings(settings: Mapping[str, Any], kind: str) -> list[str]:
    """The keys of `settings` that change nothing on a device of this kind ("cuda", "rocm",
    "mps", "cpu", ...): CUDA's matmul switches and its attention kernels, elsewhere."""
    if kind in ("cuda", "rocm"):
        return []
    idle = [key for key in settings if key in CUDA_ONLY_SETTINGS]
    if settings.get("attention_backend") in CUDA_ONLY_BACKENDS:
        idle.append("attention_backend")
    return idle


def _what_the_device_runs(
    kind: str, backend: str, fp16_accumulation: bool, warnings: list[str]
) -> tuple[str, bool]:
    """The attention backend and fp16 accumulation this device really runs, so that the plan
    (and every record made from it: the PNG, the report, the caption) says what ran; a choice
    the device cannot honour is said once, in `warnings`."""
    where = _DEVICE_WORDS.get(kind, kind)
    if kind in ("cpu", "mps") and backend in CUDA_ONLY_BACKENDS:
        warnings.append(
            f"{CUDA_ONLY_BACKENDS[backend].capitalize()} needs a CUDA GPU: on {where} "
            "attention runs on the math kernel, and the job records that."
        )
        backend = "math"
    if kind != "cuda" and fp16_accumulation:
        warnings.append(
            f"Full fp16 accumulation is a CUDA matmul setting: it does nothing on {where}, "
            "so the job records it off."
        )
        fp16_accumulation = False
    return backend, fp16_accumulation
