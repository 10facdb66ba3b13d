"""The model health check: which component and which layer overflows, and the cheapest fix
that really works, proved by re-running the part that failed.

The check runs what a generation runs, only shorter: the text encoder(s) on a real prompt and
the empty prompt, the UNet for a few steps spanning the schedule with the CFG batch, and the
VAE decoding the latent that short run produced. Every module is watched by
`probe.ActivationRecorder`. A component that went non-finite gets candidate fixes from the
cheapest up, each re-run on that component alone; the first that comes out finite is the fix.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from app import __version__
from app.core.errors import HalfSafeError
from app.core.jobs import CancelToken, ProgressCallback, no_progress
from app.core.precision import (
    COMPONENT_SETTING,
    FP16_MAX,
    PlacedPipeline,
    PrecisionPlan,
    backend_flags,
    parameter_counts,
    pipeline_components,
    resolve_plan,
)
from app.core.probe import ActivationRecorder, ProbeResult, top_blocks
from app.core.settings import PrecisionSettings

DEFAULT_PROMPT = "a photograph of an astronaut riding a horse, highly detailed"
PROBE_STEPS = 3  # UNet steps: from pure noise to a rough image, spanning the schedule
PROBE_CFG = 7.0
AT_RISK_HEADROOM = 2.0  # within 2x of 65504: a bigger image or another prompt can tip it over

COMPONENT_WORDS = {
    "text_encoder": "text encoder",
    "text_encoder_2": "second text encoder",
    "unet": "UNet",
    "vae": "VAE",
}

# Where a tensor lives, by key prefix: original (LDM) single-file names and diffusers names.
_WEIGHT_PREFIXES = (
    ("model.diffusion_model.", "unet"),
    ("first_stage_model.", "vae"),
    ("cond_stage_model.", "text_encoder"),
    ("conditioner.embedders.0.", "text_encoder"),
    ("conditioner.embedders.1.", "text_encoder_2"),
    ("text_encoder_2.", "text_encoder_2"),
    ("text_encoder.", "text_encoder"),
    ("unet.", "unet"),
    ("vae.", "vae"),
)


def component_of_tensor(name: str) -> str | None:
    """Which pipeline component a checkpoint tensor belongs to, from its key."""
    for prefix, component in _WEIGHT_PREFIXES:
        if name.startswith(prefix):
            return component
    return None


@dataclass
class ComponentReport:
    """One component's result. `max_abs` is measured at the tested precision, or, when that run
    went non-finite, on the run that fixed it (so headroom below 1 says by how much it overflows).
    """

    name: str
    dtype: str
    status: str  # ok | at_risk | overflow | nan | broken_weights
    max_abs: float | None
    headroom: float | None
    first_bad_module: str | None
    seconds: float
    blocks: list[dict[str, Any]] = field(default_factory=list)
    predicted_fp16: str | None = None  # when tested wider than fp16: ok | at_risk | overflow
    predicted_first_bad_module: str | None = None

    def to_json(self) -> dict[str, Any]:
        document = {
            "status": self.status,
            "max_abs": _finite_or_none(self.max_abs),
            "headroom": _finite_or_none(self.headroom),
            "first_bad_module": self.first_bad_module,
            "seconds": round(self.seconds, 4),
            "dtype": self.dtype,
            "blocks": self.blocks,
        }
        if self.predicted_fp16 is not None:
            document["predicted_fp16"] = self.predicted_fp16
            document["predicted_first_bad_module"] = self.predicted_first_bad_module
        return document


@dataclass
class Fix:
    """A verified set of settings that makes every failing component finite."""

    plan: PrecisionPlan
    settings: dict[str, Any]  # what "Apply fix" writes into the user's settings
    summary: str
    verified: bool
    cost: dict[str, dict[str, float | None]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            **self.plan.tested(),
            "verified": self.verified,
            "summary": self.summary,
            "settings": self.settings,
            "cost": self.cost,
        }


@dataclass
class HealthReport:
    model: dict[str, Any]
    device: dict[str, Any]
    plan: PrecisionPlan
    size: int
    weights_non_finite: list[str]
    components: dict[str, ComponentReport]
    verdict: str  # healthy | fixable | broken
    fix: Fix | None
    seconds: float
    notes: list[str] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "halfsafe": __version__,
            "model": self.model,
            "device": self.device,
            "tested": self.plan.tested(),
            "weights": {"non_finite": self.weights_non_finite},
            "components": {name: c.to_json() for name, c in self.components.items()},
            "verdict": self.verdict,
            "fix": self.fix.to_json() if self.fix else None,
            "seconds": round(self.seconds, 3),
            "size": self.size,
            "notes": self.notes,
            "versions": self.versions,
        }


def _finite_or_none(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


# --- running the pipeline in stages ----------------------------------------------------


@dataclass
class _Stage:
    """What one run of one stage gave: per-component probes, seconds, and the stage's output."""

    probes: dict[str, ProbeResult]
    seconds: dict[str, float]
    output: Any


class _ComponentTimer:
    """Wall time spent inside a component's own forward calls (synchronised at its boundary)."""

    def __init__(self, module, device) -> None:
        self.seconds = 0.0
        self._device = device
        self._start = 0.0
        self._handles = [
            module.register_forward_pre_hook(self._before),
            module.register_forward_hook(self._after),
        ]

    def _sync(self) -> None:
        import torch

        if self._device.type == "cuda":
            torch.cuda.synchronize(self._device)

    def _before(self, *_):
        self._sync()
        self._start = time.perf_counter()

    def _after(self, *_):
        self._sync()
        self.seconds += time.perf_counter() - self._start

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


class _Runner:
    """Runs the check's three stages under any plan, on one PlacedPipeline."""

    def __init__(self, model, plan: PrecisionPlan, size: int, prompt: str) -> None:
        import torch

        self.model = model
        self.placed = PlacedPipeline(model.pipeline, plan)
        self.device = torch.device(plan.device)
        self.size = size
        self.prompt = prompt
        self.is_sdxl = hasattr(model.pipeline, "text_encoder_2")

    def _watch(
        self, plan: PrecisionPlan, names: list[str], run: Callable[[Any], Any], record: bool = True
    ) -> _Stage:
        self.placed.apply(plan)
        pipe = self.placed.pipeline()
        recorders = {n: ActivationRecorder(self.placed[n]) for n in names} if record else {}
        timers = {n: _ComponentTimer(self.placed[n], self.device) for n in names}
        started = time.perf_counter()
        try:
            with backend_flags(plan):
                import torch

                with torch.inference_mode():
                    output = run(pipe)
        finally:
            for r in recorders.values():
                r.remove()
            for t in timers.values():
                t.remove()
        probes = {n: r.read(output if len(names) == 1 else None) for n, r in recorders.items()}
        seconds = {n: t.seconds for n, t in timers.items()}
        if names == ["vae"]:  # the VAE runs through .decode, not forward: time the stage
            seconds["vae"] = time.perf_counter() - started
        return _Stage(probes, seconds, output)

    def encode(self, plan: PrecisionPlan, record: bool = True) -> _Stage:
        names = [n for n in ("text_encoder", "text_encoder_2") if n in plan.dtypes]

        def run(pipe):
            if self.is_sdxl:
                embeds, negative, pooled, negative_pooled = pipe.encode_prompt(
                    prompt=self.prompt,
                    device=self.device,
                    num_images_per_prompt=1,
                    do_classifier_free_guidance=True,
                    negative_prompt="",
                )
                return {
                    "embeds": embeds,
                    "negative": negative,
                    "pooled": pooled,
                    "negative_pooled": negative_pooled,
                }
            embeds, negative = pipe.encode_prompt(
                self.prompt, self.device, 1, True, negative_prompt=""
            )
            return {"embeds": embeds, "negative": negative}

        stage = self._watch(plan, names, run, record)
        if record:
            # The encoder's own output decides its status, whatever the pipeline did after.
            finite = _all_finite(stage.output)
            for probe in stage.probes.values():
                probe.output_finite = probe.output_finite and (finite or len(names) > 1)
        return stage

    def denoise(
        self,
        plan: PrecisionPlan,
        conditioning: dict[str, Any],
        record: bool = True,
        steps: int = PROBE_STEPS,
    ) -> _Stage:
        import torch
        from diffusers import EulerDiscreteScheduler

        def run(pipe):
            unet = pipe.unet
            scheduler = EulerDiscreteScheduler.from_config(
                pipe.scheduler.config, timestep_spacing="trailing"
            )
            scheduler.set_timesteps(steps, device=self.device)
            side = self.size // 8
            generator = torch.Generator().manual_seed(0)
            latents = torch.randn((1, 4, side, side), generator=generator)
            latents = latents.to(self.device) * scheduler.init_noise_sigma
            text = torch.cat([conditioning["negative"], conditioning["embeds"]])
            extra = {}
            if self.is_sdxl:
                time_ids = torch.tensor(
                    [[self.size, self.size, 0, 0, self.size, self.size]] * 2,
                    device=self.device,
                    dtype=torch.float32,
                )
                pooled = torch.cat([conditioning["negative_pooled"], conditioning["pooled"]])
                extra["added_cond_kwargs"] = {"text_embeds": pooled, "time_ids": time_ids}
            for t in scheduler.timesteps:
                x = scheduler.scale_model_input(torch.cat([latents] * 2), t)
                if unet.config.in_channels > 4:  # inpainting: an empty mask and masked image
                    pad = unet.config.in_channels - 4
                    x = torch.cat([x, x.new_zeros(2, pad, side, side)], dim=1)
                noise = unet(x, t, encoder_hidden_states=text, **extra).sample.float()
                uncond, cond = noise.chunk(2)
                latents = scheduler.step(
                    uncond + PROBE_CFG * (cond - uncond), t, latents
                ).prev_sample
            return latents

        return self._watch(plan, ["unet"], run, record)

    def decode(self, plan: PrecisionPlan, latents, record: bool = True) -> _Stage:
        def run(pipe):
            vae = pipe.vae
            z = latents / vae.config.scaling_factor
            if getattr(vae.config, "shift_factor", None):
                z = z + vae.config.shift_factor
            return vae.decode(z.to(vae.dtype)).sample

        return self._watch(plan, ["vae"], run, record)

    def unet_step_cost(self, plan: PrecisionPlan, conditioning: dict[str, Any]) -> dict[str, Any]:
        """Time of one UNet step (CFG batch) and peak device memory with every component placed
        under `plan`; peak memory only where the device reports it."""
        import torch

        self.placed.apply(plan)
        counts = parameter_counts(self.model.pipeline)
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        self.denoise(plan, conditioning, record=False, steps=1)  # warm-up
        stage = self.denoise(plan, conditioning, record=False, steps=2)
        peak = torch.cuda.max_memory_allocated(self.device) / 2**20 if cuda else None
        return {
            "unet_step_ms": round(stage.seconds["unet"] / 2 * 1000, 2),
            "peak_memory_mb": round(peak, 1) if peak is not None else None,
            "weights_mb": round(plan.weights_mb(counts), 1),
        }


def _all_finite(value: Any) -> bool:
    from app.core.probe import max_abs

    peak = max_abs(value)
    return peak is None or math.isfinite(float(peak))


# --- fixes ---------------------------------------------------------------------------------


@dataclass
class FixCandidate:
    """One fix to try: the plan to re-run under, the settings it means, and its words."""

    plan: PrecisionPlan
    settings: dict[str, Any]
    words: str


def _is_attention(module_name: str | None, component_module) -> bool:
    if not module_name:
        return False
    from diffusers.models.attention_processor import Attention

    return isinstance(component_module.get_submodule(module_name), Attention)


def candidate_fixes(
    component: str, plan: PrecisionPlan, first_bad: str | None, module, bf16_native: bool
) -> Iterator[FixCandidate]:
    """Fixes for one failing component, cheapest first: reduced-precision accumulation off
    (CUDA), upcast attention (when the first bad layer is an attention layer), bf16 (where
    native), fp32 for that component. Whole-model fp32 is the caller's last resort."""
    words = COMPONENT_WORDS[component]
    dtype = plan.dtypes[component]
    reduced = (
        plan.fp16_accumulation
        or plan.attention_reduced_precision
        or plan.fp16_reduced_precision_reduction
    )
    if plan.device.startswith("cuda") and dtype != "fp32" and reduced:
        yield FixCandidate(
            replace(
                plan,
                fp16_accumulation=False,
                attention_reduced_precision=False,
                fp16_reduced_precision_reduction=False,
            ),
            {
                "fp16_accumulation": False,
                "attention_reduced_precision": False,
                "fp16_reduced_precision_reduction": False,
            },
            "turn off reduced-precision accumulation",
        )
    if (
        component in ("unet", "vae")
        and not plan.upcast_attention
        and _is_attention(first_bad, module)
    ):
        yield FixCandidate(
            replace(plan, upcast_attention=True),
            {"upcast_attention": True},
            "upcast attention to fp32",
        )
    shared = [c for c in plan.dtypes if COMPONENT_SETTING[c] == COMPONENT_SETTING[component]]
    setting = COMPONENT_SETTING[component]
    if dtype == "fp16" and bf16_native:
        yield FixCandidate(
            plan.with_dtypes(**{c: "bf16" for c in shared}),
            {setting: "bf16"},
            f"run the {words} in bf16",
        )
    if dtype != "fp32":
        yield FixCandidate(
            plan.with_dtypes(**{c: "fp32" for c in shared}),
            {setting: "fp32"},
            f"run the {words} in fp32",
        )


def _no_half(plan: PrecisionPlan) -> PrecisionPlan:
    return plan.with_dtypes(**{c: "fp32" for c in plan.dtypes})


# --- the check -----------------------------------------------------------------------------


def check_model(
    source: str,
    *,
    precision: PrecisionSettings,
    device: str = "auto",
    size: int | None = None,
    vae: str | None = None,
    allow_pickle: bool = False,
    on_progress: ProgressCallback | None = None,
    cancel: CancelToken | None = None,
) -> HealthReport:
    """Load a model (see `models.load_model`) and check it. Raises HalfSafeError for bad input."""
    from app.core.models import load_model

    model = load_model(
        source, vae=vae, allow_pickle=allow_pickle, on_progress=on_progress, cancel=cancel
    )
    return check_loaded(
        model, precision=precision, device=device, size=size, on_progress=on_progress, cancel=cancel
    )


def check_loaded(
    model,
    *,
    precision: PrecisionSettings,
    device: str = "auto",
    size: int | None = None,
    prompt: str = DEFAULT_PROMPT,
    on_progress: ProgressCallback | None = None,
    cancel: CancelToken | None = None,
    remember: bool = True,
    measure_cost: bool = True,
) -> HealthReport:
    """Check a loaded model on `device` under the user's precision settings.

    Runs on the calling thread and takes seconds on a GPU. Side effects: components are copied
    to the device for the duration (released at the end), and a verified fix is stored in the
    model's remembered profile (unless `remember` is False). With `measure_cost`, a verified
    fix is also timed against no-half: a few extra UNet steps under each.
    """
    import torch

    from app.core import hardware, profiles

    started = time.perf_counter()
    progress = on_progress or no_progress
    cancel = cancel or CancelToken()
    size = size or model.native_size
    if size < 64 or size % 8:
        raise HalfSafeError(f"The check size must be a multiple of 8 and at least 64, not {size}.")

    torch_device = hardware.pick_device(device)
    info = hardware.describe_device(torch_device)
    remembered = profiles.remembered_fix(model.profile_key, info.name)
    pipeline = model.pipeline
    vae_config = getattr(getattr(pipeline, "vae", None), "config", None)
    plan = resolve_plan(
        precision,
        device=torch_device,
        components=pipeline_components(pipeline),
        device_info=info,
        vae_needs_fp32=bool(getattr(vae_config, "force_upcast", False))
        and model.architecture == "sdxl",
        remembered=remembered.settings if remembered else None,
    )
    notes = list(plan.warnings)
    if remembered:
        notes.append(
            f"Using the fix remembered for this model on this device: {remembered.summary}"
        )

    bad_weights = sorted(model.weights.non_finite)
    broken = {component_of_tensor(name) for name in bad_weights}
    runner = _Runner(model, plan, size, prompt)
    try:
        bf16_native = getattr(info, "bf16", None) == "native"
        reports: dict[str, ComponentReport] = {}
        fix_plan = plan
        fix_settings: dict[str, Any] = {}
        fix_words: list[str] = []
        unfixed: list[str] = []
        first_probes: dict[str, ProbeResult] = {}

        def settle(
            stage_fn: Callable[[PrecisionPlan], _Stage], names: list[str], first: _Stage
        ) -> _Stage:
            """Report each component of a stage and, for one that failed, find its fix."""
            nonlocal fix_plan
            good = first
            for name in names:
                probe = first_probes[name] = first.probes[name]
                verify: ProbeResult | None = None
                if name in broken:
                    pass
                elif probe.non_finite and good is not first and not good.probes[name].non_finite:
                    verify = good.probes[name]  # the fix found for a sibling fixed this one too
                elif probe.non_finite:
                    module = runner.placed[name]
                    for candidate in candidate_fixes(
                        name, fix_plan, _first_bad_name(probe), module, bf16_native
                    ):
                        cancel.raise_if_cancelled()
                        progress(f"Trying a fix: {candidate.words}", 0, 1)
                        retry = stage_fn(candidate.plan)
                        if not retry.probes[name].non_finite:
                            fix_plan, verify, good = candidate.plan, retry.probes[name], retry
                            fix_settings.update(candidate.settings)
                            fix_words.append(candidate.words)
                            break
                    if verify is None:
                        unfixed.append(name)
                reports[name] = _component_report(
                    name,
                    plan.dtypes[name],
                    probe,
                    verify,
                    first.seconds.get(name, 0.0),
                    runner.placed[name],
                    name in broken,
                )
            return good

        total = 3
        progress("Checking the text encoder", 0, total)
        cancel.raise_if_cancelled()
        te_names = [n for n in ("text_encoder", "text_encoder_2") if n in plan.dtypes]
        encoded = settle(lambda p: runner.encode(p), te_names, runner.encode(plan))

        progress("Checking the UNet", 1, total)
        cancel.raise_if_cancelled()
        conditioning = encoded.output
        denoised = settle(
            lambda p: runner.denoise(p, conditioning),
            ["unet"],
            runner.denoise(fix_plan, conditioning),
        )

        progress("Checking the VAE", 2, total)
        cancel.raise_if_cancelled()
        latents = denoised.output
        if not _all_finite(latents):  # nothing fixed the UNet: decode a plausible latent instead
            latents = torch.randn(latents.shape, generator=torch.Generator().manual_seed(1)).to(
                latents.device
            )
        settle(lambda p: runner.decode(p, latents), ["vae"], runner.decode(fix_plan, latents))

        # Last resort: the whole model in fp32, re-run end to end.
        if unfixed and not broken and any(d != "fp32" for d in plan.dtypes.values()):
            cancel.raise_if_cancelled()
            progress("Trying a fix: everything in fp32", 2, total)
            full = _no_half(fix_plan)
            encoded32 = runner.encode(full)
            unet32 = runner.denoise(full, encoded32.output)
            vae32 = runner.decode(full, unet32.output)
            stages = {**encoded32.probes, **unet32.probes, **vae32.probes}
            if not any(p.non_finite for p in stages.values()):
                fix_plan, fix_settings, fix_words = (
                    full,
                    {"no_half": True},
                    ["run everything in fp32"],
                )
                for name in unfixed:
                    old = reports[name]
                    reports[name] = _component_report(
                        name,
                        old.dtype,
                        first_probes[name],
                        stages[name],
                        old.seconds,
                        runner.placed[name],
                        False,
                    )
                unfixed = []

        for name, probe in first_probes.items():
            root = probe.modules.get("")
            if probe.first_bad_module() is None and root is not None and root.non_finite:
                notes.append(
                    f"The {COMPONENT_WORDS[name]} received values already beyond fp16's "
                    "range from the part before it, so no layer inside it is to blame."
                )
        failed = [
            n for n, r in reports.items() if r.status in ("overflow", "nan", "broken_weights")
        ]
        if broken or unfixed:
            verdict, fix = "broken", None
            if broken:
                notes.append(
                    "The weights themselves hold NaN or Inf values: this file is damaged, "
                    "and no precision setting can repair it."
                )
            else:
                notes.append(
                    f"The {', '.join(COMPONENT_WORDS[n] for n in unfixed)} gives "
                    "non-finite output even in fp32: the model itself is broken."
                )
        elif failed:
            verdict = "fixable"
            summary = _fix_summary(failed, fix_words, plan, fix_plan)
            fix = Fix(fix_plan, fix_settings, summary, verified=True)
            if measure_cost:
                progress("Measuring the cost of the fix", 3, total)
                fix.cost = {
                    "fix": runner.unet_step_cost(fix_plan, conditioning),
                    "no_half": runner.unet_step_cost(_no_half(plan), conditioning),
                }
            if remember:
                profiles.remember_fix(
                    model.profile_key, info.name, fix_settings, summary, "health check"
                )
        else:
            verdict, fix = "healthy", None
    finally:
        # Also on cancel or error: drop the device copies and hand cached memory back.
        runner.placed.release()
    progress("Done", total, total)

    return HealthReport(
        model={
            "source": model.source,
            "format": model.format,
            "architecture": model.architecture,
            "name": model.name,
        },
        device={"kind": info.kind, "name": info.name},
        plan=plan,
        size=size,
        weights_non_finite=bad_weights,
        components=reports,
        verdict=verdict,
        fix=fix,
        seconds=time.perf_counter() - started,
        notes=notes,
        versions=_versions(),
    )


def _first_bad_name(probe: ProbeResult) -> str | None:
    bad = probe.first_bad_module()
    return bad.name if bad else None


def _component_report(
    name: str,
    dtype: str,
    probe: ProbeResult,
    verify: ProbeResult | None,
    seconds: float,
    module,
    broken_weights: bool,
) -> ComponentReport:
    first_bad = probe.first_bad_module()
    if broken_weights:
        status = "broken_weights"
    elif probe.non_finite:
        # Softmax turns inf scores into NaN, so NaN out of an attention layer whose inputs were
        # finite is an overflow of its scores, not a NaN from nowhere.
        overflowed = first_bad is not None and (
            first_bad.overflow or _is_attention(first_bad.name, module)
        )
        status = "overflow" if overflowed else "nan"
    else:
        status = "ok"
    measured = verify if verify is not None else probe
    peak = measured.max_abs if not (measured.non_finite and verify is None) else None
    headroom = FP16_MAX / peak if peak else None
    if status == "ok" and headroom is not None and headroom < AT_RISK_HEADROOM:
        status = "at_risk"
    report = ComponentReport(
        name=name,
        dtype=dtype,
        status=status,
        max_abs=peak,
        headroom=headroom,
        first_bad_module=first_bad.name if first_bad else None,
        seconds=seconds,
        blocks=_blocks(probe, module) if module is not None else [],
    )
    if dtype != "fp16" and not probe.non_finite:
        over = probe.first_over_fp16()
        report.predicted_fp16 = (
            "overflow"
            if probe.max_abs > FP16_MAX
            else "at_risk"
            if headroom and headroom < AT_RISK_HEADROOM
            else "ok"
        )
        report.predicted_first_bad_module = over.name if over else None
    return report


def _blocks(probe: ProbeResult, module) -> list[dict[str, Any]]:
    rows = []
    for name in top_blocks(module):
        stats = probe.modules.get(name)
        if stats is not None:
            rows.append(
                (
                    stats.order,
                    {
                        "module": name,
                        "max_abs": stats.max_abs if stats.max_abs else None,
                        "non_finite": stats.non_finite,
                    },
                )
            )
    return [row for _, row in sorted(rows, key=lambda r: r[0])]


def _fix_summary(
    failed: list[str], fix_words: list[str], tested: PrecisionPlan, fixed: PrecisionPlan
) -> str:
    parts = " and ".join(COMPONENT_WORDS[n] for n in failed)
    steps = "; ".join(fix_words)
    kept = [COMPONENT_WORDS[c] for c, d in tested.dtypes.items() if fixed.dtypes[c] == d]
    rest = (
        f" The {', '.join(kept)} keep{'s' if len(kept) == 1 else ''} {_their(kept)} precision."
        if kept
        else ""
    )
    return (
        f"The {parts} overflowed; fix: {steps}. Verified by re-running it with the fix, "
        f"which gave finite output.{rest}"
    )


def _their(parts: list[str]) -> str:
    return "its" if len(parts) == 1 else "their"


def _versions() -> dict[str, str]:
    import diffusers
    import torch

    return {
        "halfsafe": __version__,
        "torch": torch.__version__,
        "diffusers": diffusers.__version__,
        "cuda": torch.version.cuda or "",
        "hip": getattr(torch.version, "hip", None) or "",
    }


# --- presenting the report -----------------------------------------------------------------

_STATUS_WORDS = {
    "ok": "ok",
    "at_risk": "close to the fp16 limit",
    "overflow": "OVERFLOWS",
    "nan": "goes NaN",
    "broken_weights": "damaged weights",
}


def _fmt_number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def format_report(report: HealthReport) -> str:
    """The human-readable report `halfsafe check` prints."""
    lines = [
        f"Model:   {report.model['source']} ({report.model['architecture']}, {report.model['format']})",
        f"Device:  {report.device['name']} ({report.device['kind']}), probed at "
        f"{report.size}x{report.size}",
        "Tested:  "
        + ", ".join(f"{k} {v}" for k, v in report.plan.dtypes.items())
        + (", upcast attention" if report.plan.upcast_attention else ""),
        "",
        f"{'component':<16}{'status':<26}{'max |x|':>10}{'headroom':>10}  first bad layer",
    ]
    for name, c in report.components.items():
        lines.append(
            f"{name:<16}{_STATUS_WORDS[c.status]:<26}{_fmt_number(c.max_abs):>10}"
            f"{_fmt_number(c.headroom):>10}  {c.first_bad_module or '-'}"
        )
        if c.predicted_fp16 and c.predicted_fp16 != "ok":
            where = f" at {c.predicted_first_bad_module}" if c.predicted_first_bad_module else ""
            lines.append(
                f"{'':<16}in fp16 this would {'overflow' if c.predicted_fp16 == 'overflow' else 'come close to overflowing'}{where}"
            )
    lines.append("")
    if report.weights_non_finite:
        lines.append(
            f"Damaged tensors: {', '.join(report.weights_non_finite[:5])}"
            + (" ..." if len(report.weights_non_finite) > 5 else "")
        )
    verdicts = {
        "healthy": "HEALTHY: nothing overflowed.",
        "fixable": "FIXABLE: something overflowed, and a verified fix exists.",
        "broken": "BROKEN: no precision setting gives finite output.",
    }
    lines.append(f"Verdict: {verdicts[report.verdict]}")
    if report.fix:
        lines.append(f"Fix:     {report.fix.summary}")
        lines.append("Apply:   " + " ".join(_flag(k, v) for k, v in report.fix.settings.items()))
        fix_cost, half_cost = report.fix.cost.get("fix", {}), report.fix.cost.get("no_half", {})
        if fix_cost:
            lines.append(
                f"Cost:    {_cost_words(fix_cost)} with the fix; "
                f"{_cost_words(half_cost)} with --no-half"
            )
    for note in report.notes:
        lines.append(f"Note:    {note}")
    lines.append(f"Checked in {report.seconds:.2f} s.")
    return "\n".join(lines)


def _flag(key: str, value: Any) -> str:
    from app.core.settings import FIELDS

    flag = "--" + FIELDS[key].flag_name
    if isinstance(value, bool):
        return flag if value else f"--no-{FIELDS[key].flag_name}" if FIELDS[key].default else ""
    return f"{flag} {value}"


def _cost_words(cost: dict[str, Any]) -> str:
    parts = []
    if cost.get("unet_step_ms") is not None:
        parts.append(f"{cost['unet_step_ms']:.1f} ms per UNet step")
    if cost.get("peak_memory_mb") is not None:
        parts.append(f"{cost['peak_memory_mb']:.0f} MB peak")
    if cost.get("weights_mb") is not None:
        parts.append(f"{cost['weights_mb']:.0f} MB of weights")
    return ", ".join(parts) or "not measured"


def markdown_report(report: HealthReport) -> str:
    """A Markdown report to paste into a bug report: versions, device, model, table, fix."""
    v = report.versions
    rows = "\n".join(
        f"| {n} | {c.dtype} | {_STATUS_WORDS[c.status]} | {_fmt_number(c.max_abs)} | "
        f"{_fmt_number(c.headroom)} | {('`' + c.first_bad_module + '`') if c.first_bad_module else '-'} |"
        for n, c in report.components.items()
    )
    fix = "None needed." if report.verdict == "healthy" else "None: the model is broken."
    if report.fix:
        fix = (
            f"{report.fix.summary}\n\nSettings: `"
            + " ".join(_flag(k, val) for k, val in report.fix.settings.items())
            + "`\n\n"
            f"Cost: {_cost_words(report.fix.cost.get('fix', {}))} with the fix; "
            f"{_cost_words(report.fix.cost.get('no_half', {}))} with no-half."
        )
    notes = "".join(f"- {n}\n" for n in report.notes)
    return (
        f"# HalfSafe health check: {report.model.get('name', report.model['source'])}\n\n"
        f"- Verdict: **{report.verdict}**\n"
        f"- Model: `{report.model['source']}` ({report.model['architecture']}, "
        f"{report.model['format']})\n"
        f"- Device: {report.device['name']} ({report.device['kind']})\n"
        f"- Versions: HalfSafe {v.get('halfsafe')}, torch {v.get('torch')}, diffusers "
        f"{v.get('diffusers')}" + (f", CUDA {v['cuda']}" if v.get("cuda") else "") + "\n"
        f"- Probe size: {report.size}x{report.size}; check took {report.seconds:.2f} s\n\n"
        "| component | dtype | status | max abs | headroom | first bad layer |\n"
        "|---|---|---|---|---|---|\n"
        f"{rows}\n\n## Fix\n\n{fix}\n" + (f"\n## Notes\n\n{notes}" if notes else "")
    )


def write_markdown_report(report: HealthReport, path: str | Path) -> Path:
    from app.core.files import write_atomic

    try:
        return write_atomic(Path(path), markdown_report(report))
    except OSError as error:
        raise HalfSafeError(
            f"{path}: cannot write the report ({error.strerror or error})."
        ) from None
