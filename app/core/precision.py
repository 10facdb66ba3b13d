"""Precision plans: turn the user's settings into per-component dtypes and backend flags, and
apply them to a pipeline for one job.

A plan is resolved once per job from the settings, the device and the model; `auto` is never
left in a plan. Applying it places each component on the device in its dtype, casts tensors at
component boundaries (so an fp16 UNet can feed an fp32 VAE), installs an attention processor
that honours `upcast_attention` under every attention backend, and sets PyTorch's backend flags
for the duration of the job only.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from app.core.components import COMPONENTS as ALL_COMPONENTS
from app.core.components import FP16_MAX, RUN_ORDER, SETTING_FOLLOWS
from app.core.settings import PrecisionSettings, modules_by_component

__all__ = ["FP16_MAX"]

DTYPE_NAMES = ("fp16", "bf16", "fp32")
# Components we place and check, in the order a pipeline runs them.
COMPONENTS = RUN_ORDER
COMPONENT_SETTING = {c.name: c.setting for c in ALL_COMPONENTS.values()}
_BYTES_PER_ELEMENT = {"fp16": 2, "bf16": 2, "fp32": 4}


def torch_dtype(name: str):
    import torch

    return {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[name]


def dtype_name(dtype) -> str:
    import torch

    return {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}.get(
        dtype, str(dtype)
    )


@dataclass(frozen=True)
class PrecisionPlan:
    """How one job runs: a dtype per component and the backend flags, all resolved.

    `reasons` says, per setting, why `auto` resolved the way it did; `warnings` lists explicit
    choices that are honoured although not recommended (fp16 on a CPU, bf16 without hardware
    support).
    """

    device: str
    dtypes: Mapping[str, str]
    upcast_attention: bool = False
    attention_backend: str = "auto"
    allow_tf32: bool = True
    fp16_reduced_precision_reduction: bool = True
    fp16_accumulation: bool = False
    attention_reduced_precision: bool = False
    # fp16 components run under torch.autocast(device, float16) (A1111's default): matmuls and
    # convolutions in fp16, the ops PyTorch lists for fp32 (softmax, norms on CUDA) in fp32.
    # Components planned in fp32 or bf16 never run under it.
    autocast: bool = False
    # Module-level precision islands: component -> {module path: dtype}; the rest of the
    # component keeps its own dtype (see `PlacedPipeline`).
    modules: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    # Components whose T5 feed-forward output projections are fp32 islands because of the
    # `t5_fp32_feed_forward` setting (those islands are that setting, not `fp32_modules`).
    t5_feed_forward: tuple[str, ...] = ()
    # Activation clamps: component -> module paths whose fp16 output is clamped to +-65504.
    clamps: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    reasons: Mapping[str, str] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    # The settings a remembered fix set (fields the user left on auto, off or empty, that it
    # changed); empty when none was remembered or the user's own choices leave it nothing.
    remembered_used: tuple[str, ...] = ()

    def with_dtypes(self, **dtypes: str) -> PrecisionPlan:
        return replace(self, dtypes={**self.dtypes, **dtypes})

    def with_modules(self, component: str, modules: Mapping[str, str]) -> PrecisionPlan:
        """This plan with `modules` of `component` in their own dtypes."""
        return replace(self, modules={**self.modules, component: dict(modules)})

    def with_clamps(self, component: str, paths: Iterable[str]) -> PrecisionPlan:
        """This plan with the fp16 outputs of `paths` in `component` clamped to +-65504."""
        return replace(self, clamps={**self.clamps, component: tuple(paths)})

    def island_count(self) -> int:
        """How many modules run in another dtype than their component, over all components."""
        return sum(len(self.islands(c)) for c in self.modules)

    def islands(self, component: str) -> dict[str, str]:
        """The module islands of `component` that differ from its dtype."""
        own = self.dtypes.get(component)
        return {m: d for m, d in (self.modules.get(component) or {}).items() if d != own}

    def tested(self) -> dict[str, Any]:
        """The `tested` object of the health report: dtype per component and upcast."""
        return {
            **self.dtypes,
            "upcast_attention": self.upcast_attention,
            "autocast": self.autocast_active,
        }

    @property
    def autocast_active(self) -> bool:
        """Whether any component runs under autocast (one planned in fp16)."""
        return self.autocast and "fp16" in self.dtypes.values()

    def effective_settings(self) -> dict[str, Any]:
        """The plan written back as settings values, with nothing left on `auto`."""
        dtypes = set(self.dtypes.values())
        base = dtypes.pop() if len(dtypes) == 1 else "fp16" if "fp16" in dtypes else "mixed"
        if self.autocast_active:
            base = "autocast"
        first_encoder = self.dtypes.get("text_encoder", base)
        denoiser = self.dtypes.get("unet", self.dtypes.get("transformer", base))  # one setting
        return {
            "device": self.device,
            "precision": base,
            "unet_precision": denoiser,
            "vae_precision": self.dtypes.get("vae", base),
            "text_encoder_precision": first_encoder,
            "text_encoder_2_precision": self.dtypes.get("text_encoder_2", first_encoder),
            "text_encoder_3_precision": self.dtypes.get("text_encoder_3", first_encoder),
            "no_half": all(d == "fp32" for d in self.dtypes.values()),
            "no_half_vae": self.dtypes.get("vae") == "fp32",
            "upcast_attention": self.upcast_attention,
            "attention_backend": self.attention_backend,
            "allow_tf32": self.allow_tf32,
            "fp16_reduced_precision_reduction": self.fp16_reduced_precision_reduction,
            "fp16_accumulation": self.fp16_accumulation,
            "attention_reduced_precision": self.attention_reduced_precision,
            "t5_fp32_feed_forward": any(self.islands(c) for c in self.t5_feed_forward),
            **self.module_settings(),
        }

    def module_settings(self) -> dict[str, list[str]]:
        """The plan's module islands and clamps as the `fp32_modules`, `bf16_modules` and
        `clamp_modules` settings (the T5 feed-forward islands are `t5_fp32_feed_forward`)."""
        settings: dict[str, list[str]] = {"fp32_modules": [], "bf16_modules": []}
        for component in self.modules:
            t5 = component in self.t5_feed_forward
            for path, dtype in self.islands(component).items():
                if t5 and dtype == "fp32" and _is_t5_feed_forward(path):
                    continue  # the t5_fp32_feed_forward setting
                if dtype in ("fp32", "bf16"):
                    settings[f"{dtype}_modules"].append(f"{component}:{path}")
        settings["clamp_modules"] = [f"{c}:{p}" for c, paths in self.clamps.items() for p in paths]
        return settings

    def weights_mb(self, parameter_counts: Mapping[str, int]) -> float:
        """Memory the components' weights take under this plan, in MiB."""
        total = sum(
            n * _BYTES_PER_ELEMENT[self.dtypes[c]]
            for c, n in parameter_counts.items()
            if c in self.dtypes
        )
        return total / 2**20


def _is_t5_feed_forward(path: str) -> bool:
    return path.endswith("DenseReluDense.wo")


def plan_weights_mb(plan: PrecisionPlan, pipeline) -> float:
    """Memory the weights take under `plan`, in MiB, module islands included (a layer kept in
    fp32 inside an fp16 component costs its own parameters twice over, not the component's)."""
    total = 0
    for component, dtype in plan.dtypes.items():
        module = getattr(pipeline, component, None)
        if module is None:
            continue
        own = _BYTES_PER_ELEMENT[dtype]
        total += sum(p.numel() for p in module.parameters()) * own
        islands = plan.islands(component)
        for path, island_dtype in islands.items():
            if any(path.startswith(other + ".") for other in islands):
                continue  # inside a larger island: counted there
            try:
                island = module.get_submodule(path)
            except AttributeError:
                continue
            extra = _BYTES_PER_ELEMENT[island_dtype] - own
            total += sum(p.numel() for p in island.parameters()) * extra
    return total / 2**20


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
    feed_forward_islands: Mapping[str, Mapping[str, str]] | None = None,
) -> PrecisionPlan:
    """Resolve `auto` against the device and the model; keep explicit choices, with warnings.

    `feed_forward_islands` are the model's T5 feed-forward output projections per component
    (`diagnosis.feed_forward_islands`): with `t5_fp32_feed_forward` on they run in fp32 in
    every component that is not fp32 already.

    `device_info` is `app.core.hardware.describe_device(device)` (its `recommended` settings,
    their `reasons`, and its `fp16`/`bf16` classes); `vae_needs_fp32` is the model's own
    statement that its VAE overflows in fp16 (SDXL's original VAE sets `force_upcast`);
    `remembered` is a verified fix stored for this model on this device, as settings values.
    For a field the user left on `auto` (or off), the remembered fix comes first, then the
    model's needs, then the device's recommendation.
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
        if key in chosen and key != "device" and chosen[key] in ("auto", False, []):
            chosen[key] = value
            from_memory.add(key)
    reasons: dict[str, str] = {}
    warnings: list[str] = []

    base = chosen["precision"]
    autocast = base == "autocast"
    if autocast:
        base = "fp16"
        reasons["precision"] = (
            "Autocast: fp16 weights under PyTorch's autocast, as AUTOMATIC1111 runs by default."
        )
        problem = autocast_problem(kind)
        if problem:
            warnings.append(problem)
            autocast = autocast_available(kind)
    if base == "auto":
        base = recommended.get("precision", "auto")
        if base not in DTYPE_NAMES:
            base = "fp32" if kind == "cpu" else "fp16"
        reasons["precision"] = device_reasons.get("precision", f"{base} suits this device best.")

    dtypes: dict[str, str] = {}
    for component in components:
        key = COMPONENT_SETTING[component]
        device_choice = recommended.get(key)
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
            if key in device_reasons:
                reasons[key] = device_reasons[key]
        else:
            dtypes[component] = base
        if key in from_memory or ("no_half" in from_memory and chosen["no_half"]):
            reasons[key] = "A fix verified for this model on this device is remembered."

        follows = SETTING_FOLLOWS.get(key)
        explicit = (
            user[key] != "auto"
            or user["precision"] != "auto"
            or (follows is not None and user[follows] != "auto")
        )
        name = dtypes[component]
        if explicit and name == "bf16" and bf16_class != "native":
            warnings.append(
                f"The {ALL_COMPONENTS[component].words} runs in bf16 as you asked, but this device has no "
                "native bf16: expect it to be slow or to fail."
            )
        elif explicit and name == "fp16" and kind == "cpu":
            warnings.append(
                f"The {ALL_COMPONENTS[component].words} runs in fp16 as you asked; on a CPU fp16 is slow and "
                "fp32 is the usual choice."
            )
        elif explicit and name == "fp16" and fp16_class == "unreliable":
            warnings.append(
                f"The {ALL_COMPONENTS[component].words} runs in fp16 as you asked, but this GPU is known to "
                "return NaN from some fp16 operations."
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
    modules: dict[str, dict[str, str]] = {}
    t5_components: list[str] = []
    if chosen.get("t5_fp32_feed_forward"):
        for component, islands in (feed_forward_islands or {}).items():
            if dtypes.get(component, "fp32") != "fp32":
                modules[component] = dict(islands)
                t5_components.append(component)
        if modules:
            reasons["t5_fp32_feed_forward"] = (
                "A fix verified for this model on this device is remembered."
                if "t5_fp32_feed_forward" in from_memory
                else "The T5 feed-forward output projections run in fp32, as you asked."
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
            if own == "fp32" or (own == "bf16" and dtype == "bf16"):
                continue  # already as wide: nothing to keep wider
            modules.setdefault(component, {}).update(dict.fromkeys(paths, dtype))
            if key in from_memory:
                reasons[key] = "A fix verified for this model on this device is remembered."
    return PrecisionPlan(
        device=device_str,
        dtypes=dtypes,
        modules=modules,
        clamps=clamps,
        t5_feed_forward=tuple(t5_components),
        upcast_attention=upcast,
        attention_backend=attention_backend,
        allow_tf32=bool(chosen["allow_tf32"]),
        fp16_reduced_precision_reduction=bool(chosen["fp16_reduced_precision_reduction"]),
        fp16_accumulation=fp16_accumulation,
        attention_reduced_precision=bool(chosen["attention_reduced_precision"]),
        autocast=autocast,
        reasons=reasons,
        warnings=tuple(warnings),
        remembered_used=tuple(sorted(k for k in from_memory if chosen[k] != user[k])),
    )


# Attention kernels PyTorch has only for CUDA GPUs; elsewhere SDPA runs its math kernel (and on
# a CPU its fused kernel, under the flash name).
CUDA_ONLY_BACKENDS = {"efficient": "memory-efficient attention", "cudnn": "cuDNN attention"}
_DEVICE_WORDS = {"cpu": "a CPU", "mps": "an Apple GPU (MPS)", "xpu": "an Intel GPU (XPU)"}


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


# --- autocast ----------------------------------------------------------------------------


@functools.cache
def autocast_available(device_type: str) -> bool:
    """Whether PyTorch has an fp16 autocast for this kind of device."""
    import torch

    try:
        return bool(torch.amp.is_autocast_available(device_type))
    except (RuntimeError, ValueError):
        return False


@functools.cache
def autocast_upcasts_norms(device_type: str) -> bool | None:
    """Whether fp16 autocast on this kind of device runs normalisation in fp32, measured once
    on the device: an fp16 layer norm under autocast comes back fp32 (CUDA and ROCm, as
    PyTorch's op list says) or stays fp16 (PyTorch 2.13's CPU list has no softmax or norm).
    None when it could not be measured."""
    import torch

    try:
        x = torch.ones(1, 4, dtype=torch.float16, device=device_type)
        with torch.autocast(device_type, dtype=torch.float16):
            return torch.nn.functional.layer_norm(x, (4,)).dtype == torch.float32
    except (RuntimeError, ValueError, AssertionError):  # no such device, or no autocast for it
        return None


def autocast_problem(device_type: str) -> str | None:
    """One sentence when autocast cannot mean here what it means in A1111 on a GPU, else None."""
    if not autocast_available(device_type):
        return (
            f"PyTorch has no fp16 autocast for {device_type}: the model runs in plain fp16, "
            "without autocast's fp32 softmax and norms."
        )
    if autocast_upcasts_norms(device_type) is False:
        return (
            f"On {'a CPU' if device_type == 'cpu' else device_type}, PyTorch's autocast keeps "
            "softmax and normalisation in fp16, so autocast runs like plain fp16 here; its "
            "fp32 softmax and norms happen on NVIDIA and AMD GPUs."
        )
    return None


class _AutocastHooks:
    """Forward hooks that run a module under torch.autocast(float16) while its
    `_halfsafe_autocast` attribute names a device type (set per plan by PlacedPipeline), and
    leave it alone otherwise. Plain data, so a deep-copied module gets its own hooks."""

    def __init__(self) -> None:
        self.open: list[Any] = []

    def enter(self, module, args) -> None:
        import torch

        device_type = getattr(module, "_halfsafe_autocast", None)
        context = torch.autocast(device_type, dtype=torch.float16) if device_type else None
        if context is not None:
            context.__enter__()
        self.open.append(context)

    def leave(self, module, args, output) -> None:
        context = self.open.pop() if self.open else None
        if context is not None:
            context.__exit__(None, None, None)


class _AutocastOff:
    """Forward hooks that turn autocast off inside a module while it is on around it (a
    module-level island in a component run under fp16 autocast)."""

    def __init__(self) -> None:
        self.open: list[Any] = []

    def enter(self, module, args) -> None:
        import torch

        device_type = next(module.parameters()).device.type
        context = (
            torch.autocast(device_type, enabled=False)
            if torch.is_autocast_enabled(device_type)
            else None
        )
        if context is not None:
            context.__enter__()
        self.open.append(context)

    def leave(self, module, args, output) -> None:
        context = self.open.pop() if self.open else None
        if context is not None:
            context.__exit__(None, None, None)


def _set_autocast(module, device_type: str | None) -> None:
    """Run `module` (and a VAE's entry submodules) under fp16 autocast on `device_type`, or not
    at all with None. The hooks are installed once and read the attribute at each call."""
    entries = [module] + [
        getattr(module, n) for n in _ENTRY_SUBMODULES if getattr(module, n, None) is not None
    ]
    for entry in entries:
        if getattr(entry, "_halfsafe_autocast_hooks", None) is None:
            hooks = _AutocastHooks()
            entry.register_forward_pre_hook(hooks.enter)
            entry.register_forward_hook(hooks.leave, always_call=True)
            entry._halfsafe_autocast_hooks = hooks
        entry._halfsafe_autocast = device_type


# --- attention ---------------------------------------------------------------------------


class SafeAttnProcessor:
    """Scaled-dot-product attention that can compute scores, softmax and the weighted sum in fp32.

    diffusers' default processor ignores `upcast_attention`; this one honours it, and also the
    model's own config flag (SD2.x sets it on some blocks), whichever SDPA kernel is selected.
    The result is cast back to the layer's dtype, so the rest of the model is unchanged.
    """

    def __init__(self, upcast: bool) -> None:
        self.upcast = upcast

    def __call__(
        self,
        attn,
        hidden_states,
        encoder_hidden_states=None,
        attention_mask=None,
        temb=None,
        *args,
        **kwargs,
    ):
        import torch.nn.functional as F

        residual = hidden_states
        if attn.spatial_norm is not None:
            hidden_states = attn.spatial_norm(hidden_states, temb)
        image_shape = None
        if hidden_states.ndim == 4:
            image_shape = hidden_states.shape
            b, c, h, w = image_shape
            hidden_states = hidden_states.view(b, c, h * w).transpose(1, 2)
        context = hidden_states if encoder_hidden_states is None else encoder_hidden_states
        batch, context_len, _ = context.shape

        if attention_mask is not None:
            attention_mask = attn.prepare_attention_mask(attention_mask, context_len, batch)
            attention_mask = attention_mask.view(batch, attn.heads, -1, attention_mask.shape[-1])
        if attn.group_norm is not None:
            hidden_states = attn.group_norm(hidden_states.transpose(1, 2)).transpose(1, 2)
        if encoder_hidden_states is not None and attn.norm_cross:
            context = attn.norm_encoder_hidden_states(context)

        query, key, value = attn.to_q(hidden_states), attn.to_k(context), attn.to_v(context)
        head_dim = key.shape[-1] // attn.heads

        def heads(t):
            return t.view(batch, -1, attn.heads, head_dim).transpose(1, 2)

        query, key, value = heads(query), heads(key), heads(value)
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)

        scores = getattr(attn, "_halfsafe_scores", None)
        if scores is not None:  # a probe is recording: bound |q.k| * scale (Cauchy-Schwarz)
            norms_q = query.detach().float().norm(dim=-1).amax()
            norms_k = key.detach().float().norm(dim=-1).amax()
            scores.append(norms_q * norms_k * (attn.scale or head_dim**-0.5))

        out_dtype = query.dtype
        if self.upcast or getattr(attn, "upcast_attention", False):
            query, key, value = query.float(), key.float(), value.float()
            if attention_mask is not None:
                attention_mask = attention_mask.float()
        hidden_states = F.scaled_dot_product_attention(
            query,
            key,
            value,
            attn_mask=attention_mask,
            dropout_p=0.0,
            is_causal=False,
            scale=attn.scale,
        )
        hidden_states = hidden_states.transpose(1, 2).reshape(batch, -1, attn.heads * head_dim)
        hidden_states = attn.to_out[1](attn.to_out[0](hidden_states.to(out_dtype)))

        if image_shape is not None:
            hidden_states = hidden_states.transpose(-1, -2).reshape(image_shape)
        if attn.residual_connection:
            hidden_states = hidden_states + residual
        return hidden_states / attn.rescale_output_factor


def set_attention(module, plan: PrecisionPlan) -> None:
    """Install the attention processor the plan asks for on every attention layer of `module`.

    `classic` is diffusers' original processor, which honours the per-layer upcast flags; every
    other backend runs `SafeAttnProcessor` and is picked by `backend_flags` at run time.
    """
    from diffusers.models.attention_processor import Attention, AttnProcessor

    for layer in module.modules():
        if not isinstance(layer, Attention):
            continue
        # The model's own flags, kept once so that a later plan without upcast restores them.
        config: tuple[bool, bool] | None = getattr(layer, "_halfsafe_config_upcast", None)
        if config is None:
            config = (bool(layer.upcast_attention), bool(layer.upcast_softmax))
            object.__setattr__(layer, "_halfsafe_config_upcast", config)
        layer.upcast_attention = config[0] or plan.upcast_attention
        layer.upcast_softmax = config[1] or plan.upcast_attention
        processor: Any = (
            AttnProcessor()
            if plan.attention_backend == "classic"
            else SafeAttnProcessor(plan.upcast_attention)
        )
        layer.set_processor(processor)


@contextmanager
def backend_flags(plan: PrecisionPlan) -> Iterator[None]:
    """Set PyTorch's precision and attention-kernel flags for one job, and restore them after.

    The flags are process-wide; the engine runs one job at a time, so a job owns them.
    """
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    matmul = torch.backends.cuda.matmul
    saved = (
        matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        matmul.allow_fp16_reduced_precision_reduction,
        getattr(matmul, "allow_fp16_accumulation", False),
        torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed(),
    )
    matmul.allow_tf32 = plan.allow_tf32
    torch.backends.cudnn.allow_tf32 = plan.allow_tf32
    matmul.allow_fp16_reduced_precision_reduction = plan.fp16_reduced_precision_reduction
    if hasattr(matmul, "allow_fp16_accumulation"):
        matmul.allow_fp16_accumulation = plan.fp16_accumulation
    torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(plan.attention_reduced_precision)

    kernels = {
        "flash": [SDPBackend.FLASH_ATTENTION],
        "efficient": [SDPBackend.EFFICIENT_ATTENTION],
        "cudnn": [SDPBackend.CUDNN_ATTENTION],
        "math": [SDPBackend.MATH],
    }.get(plan.attention_backend)
    if kernels is not None:
        # Math is always allowed as a fallback: a kernel that cannot run a shape (flash in
        # fp32 under upcast, any fused kernel on CPU) must not turn into an error.
        kernels = [*kernels, SDPBackend.MATH] if SDPBackend.MATH not in kernels else kernels
    try:
        if kernels is None:
            yield
        else:
            with sdpa_kernel(kernels, set_priority=True):
                yield
    finally:
        (
            matmul.allow_tf32,
            torch.backends.cudnn.allow_tf32,
            matmul.allow_fp16_reduced_precision_reduction,
            fp16_acc,
            math_sdp,
        ) = saved
        if hasattr(matmul, "allow_fp16_accumulation"):
            matmul.allow_fp16_accumulation = fp16_acc
        torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(math_sdp)


# --- placement ---------------------------------------------------------------------------


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


# A VAE is entered through .encode/.decode, which bypass its forward: cast at these instead.
_ENTRY_SUBMODULES = ("quant_conv", "post_quant_conv", "encoder", "decoder")


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
        return self._placed[name][1]

    def __contains__(self, name: str) -> bool:
        return name in self._placed

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


def parameter_counts(pipeline) -> dict[str, int]:
    """Parameters per component, for memory estimates."""
    return {
        name: sum(p.numel() for p in getattr(pipeline, name).parameters())
        for name in COMPONENTS
        if getattr(pipeline, name, None) is not None
    }


def pipeline_components(pipeline) -> list[str]:
    """The checkable components this pipeline has, in run order."""
    return [name for name in COMPONENTS if getattr(pipeline, name, None) is not None]
