"""The precision plan: a dtype per component, module islands, clamps and backend flags, all
resolved, and what the plan costs in weight memory; the dtype names and the pipeline's
checkable components. No torch at import.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from app.core.components import COMPONENTS as ALL_COMPONENTS
from app.core.components import PIPELINE_PARTS, module_of
from app.core.encoders.kind import OwnIsland
from app.core.encoders.kinds import OWN_ISLANDS, own_island

DTYPE_NAMES = ("fp16", "bf16", "fp32")
# Components we place and check, in the order a pipeline runs them.
COMPONENTS = PIPELINE_PARTS
COMPONENT_SETTING = {c.name: c.setting for c in ALL_COMPONENTS.values()}
# The settings that decide each part's dtype.
DTYPE_SETTINGS = ("precision", *dict.fromkeys(COMPONENT_SETTING.values()))
_BYTES_PER_ELEMENT = {"fp16": 2, "bf16": 2, "fp32": 4}


def dtype_settings_of(effective: Mapping[str, Any], components: Collection[str]) -> dict[str, Any]:
    """`PrecisionPlan.dtype_settings` from a plan's effective settings as a job records them
    (`GenerationResult.settings`) and the model's `components`: what a fix proved in that job
    is a fix for (the prompt upsampler's precision only where the model has one: a fix proved
    without one is for the same settings it always was, and the check's record of it is the
    same record)."""
    settings = {key: effective[key] for key in DTYPE_SETTINGS if key in effective}
    if settings.get("precision") == "mixed":  # every part's own setting says it
        settings["precision"] = settings.get("unet_precision", "fp16")
    if "prompt_upsampler" not in components:
        settings.pop("prompt_upsampler_precision", None)
    settings.update(no_half=False, no_half_vae=False)
    return settings


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
    # Component -> the settings of its kind's own islands (`kinds.own_islands`) that its
    # `modules` hold (those layers are those settings, not `fp32_modules`).
    kind_islands: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # Activation clamps: component -> module paths whose fp16 output is clamped to +-65504.
    clamps: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    reasons: Mapping[str, str] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    # The settings a remembered fix set (fields the user left on auto, off or empty, that it
    # changed); empty when none was remembered or the user's own choices leave it nothing.
    remembered_used: tuple[str, ...] = ()
    # Settings of the remembered fix that the job's own settings already held, the same value.
    remembered_held: tuple[str, ...] = ()
    # Layers ("component:layer") a remembered fix names that this model does not have: left
    # out of the plan, the rest of the fix used.
    remembered_dropped: tuple[str, ...] = ()
    # The most one placed component may hold on the device, in MiB (the `max_vram_gb`
    # setting, else the device's free memory less a reserve, `streaming.device_budget`); None:
    # no budget. A component that would not fit in a dtype wider than it is stored in keeps
    # its stored weights and computes in the wider dtype layer by layer.
    memory_budget_mb: float | None = None
    # Where the budget came from: "setting" (`max_vram_gb`), "free memory" (a CUDA GPU's),
    # "free RAM" (the computer's, for a CPU or an Apple GPU), None for no budget.
    memory_budget_from: str | None = None
    # Whether this plan is one of a fix search's (a check's runs, a generation's search for a
    # repair): each component planned wider than it is stored computes from its stored weights
    # layer by layer, budget or not, and so does one planned in another dtype as wide where its
    # loaded weights already sit on the device (a CPU's RAM, where such a copy is the part
    # again). The numbers are a copy's (a cast to a wider dtype is exact, one to a dtype as
    # wide is the copy's own); a search then holds the model's stored bytes and one layer's
    # wider copy, whichever fix it tries, and the fix it chooses runs as a copy where the
    # budget has room (a copy computes faster: `docs/benchmarks.md`).
    compute_in_place: bool = False
    # Whether this is the fp32 reference a fix is judged against (`job_plans.fp32_reference`):
    # each component stored narrower computes in fp32 from its stored weights layer by layer,
    # budget or not (a few runs, for which a copy would hold twice an fp16 denoiser's bytes;
    # a cast to fp32 is exact: the numbers are a copy's), and how it held its parts is not the
    # job's to record.
    reference: bool = False
    # Whether the VAE decodes in tiles: "on" or "off" once a job has resolved it for its
    # picture size (`tiling.resolve`), "auto" until then (the setting).
    vae_tiling: str = "auto"
    # The side of the square tiles a tiled VAE decodes (and encodes) in, in px: 0 for the
    # VAE's own (its config's sample size: 1024 px for SDXL's, so a 1024 px picture is one
    # tile), smaller where one tile of that size would not fit beside the VAE
    # (`tiling.resolve`).
    vae_tile_px: int = 0

    def with_dtypes(self, **dtypes: str) -> PrecisionPlan:
        return replace(self, dtypes={**self.dtypes, **dtypes})

    def with_modules(self, component: str, modules: Mapping[str, str]) -> PrecisionPlan:
        """This plan with `modules` of `component` in their own dtypes."""
        return replace(self, modules={**self.modules, component: dict(modules)})

    def with_clamps(self, component: str, paths: Iterable[str]) -> PrecisionPlan:
        """This plan with the fp16 outputs of `paths` in `component` clamped to +-65504."""
        return replace(self, clamps={**self.clamps, component: tuple(paths)})

    def with_kind_island(self, component: str, setting: str) -> PrecisionPlan:
        """This plan with the kind's own island `setting` keeps on in `component` (its layers
        put in `modules` by the caller)."""
        on = (*self.kind_islands.get(component, ()), setting)
        return replace(self, kind_islands={**self.kind_islands, component: on})

    def kind_islands_of(self, component: str) -> tuple[OwnIsland, ...]:
        """The kind's own islands on in `component`."""
        found = (own_island(s) for s in self.kind_islands.get(component, ()))
        return tuple(i for i in found if i is not None)

    def island_count(self) -> int:
        """How many modules run in another dtype than their component, over all components."""
        return sum(len(self.islands(c)) for c in self.modules)

    def dtype_of(self, component: str) -> str:
        """The dtype a checked component runs in (the VAE's for its encoder, see
        `components.module_of`)."""
        return self.dtypes[module_of(component)]

    def islands(self, component: str) -> dict[str, str]:
        """The module islands of `component` that differ from its dtype."""
        component = module_of(component)
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
            **{
                island.setting: any(
                    self.islands(c) for c, on in self.kind_islands.items() if island.setting in on
                )
                for island in OWN_ISLANDS
            },
            "vae_tiling": self.vae_tiling,
            **self.module_settings(),
            "prompt_upsampler_precision": self.dtypes.get("prompt_upsampler", first_encoder),
        }

    def dtype_settings(self) -> dict[str, Any]:
        """The dtype of each part as the settings that give it whatever else is set: the base
        and per-part precisions, no-half off. What a fix found under this plan is a fix for
        (`dtype_settings_of`)."""
        return dtype_settings_of(self.effective_settings(), self.dtypes)

    def module_settings(self) -> dict[str, list[str]]:
        """The plan's module islands and clamps as the `fp32_modules`, `bf16_modules` and
        `clamp_modules` settings (a kind's own islands are their own settings)."""
        settings: dict[str, list[str]] = {"fp32_modules": [], "bf16_modules": []}
        for component in self.modules:
            own = self.kind_islands_of(component)
            for path, dtype in self.islands(component).items():
                if any(i.dtype == dtype and i.holds(path) for i in own):
                    continue  # the kind's own island: its setting says it
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
