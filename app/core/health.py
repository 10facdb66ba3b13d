"""The model health check: which component and which layer overflows, what fp16 and bf16 would
do to each component on this device, and the cheapest fix that really works, proved by
re-running the part that failed and comparing it with an fp32 reference.

The check runs what a generation runs, only shorter: the text encoder(s) on a real prompt and
the empty prompt, the denoiser at the first, middle and last timesteps of the user's own
sampler schedule with the CFG batch, and the VAE decoding the latent that short run produced.
Every module is watched by `probe.ActivationRecorder`. A component that went non-finite gets
candidate fixes (`diagnosis.FIX_KINDS`: backend switches, clamps, layer-level precision islands,
a whole component wider), each re-run on that component alone and judged finite or not and
against the fp32 reference; the verified ones are measured on this device, and the cheapest
(`diagnosis.rank_candidates`) is the fix, the others shown beside it.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app import __version__
from app.core import diagnosis
from app.core.components import COMPONENTS, FP16_MAX, Status, Verdict, in_run_order, join_words
from app.core.components import words as component_words
from app.core.diagnosis import (
    AT_RISK_HEADROOM,
    FixCandidate,
    Quality,
    candidate_fixes,
    no_half,
    status_from_peak,
)
from app.core.errors import CancelledError, HalfSafeError
from app.core.families import family_of
from app.core.jobs import CancelToken, ProgressCallback, no_progress
from app.core.precision import (
    PlacedPipeline,
    PrecisionPlan,
    backend_flags,
    plan_weights_mb,
)
from app.core.prediction import prediction_summary
from app.core.probe import ActivationRecorder, ProbeResult, top_blocks
from app.core.settings import FIELDS, PrecisionSettings, modules_by_component

__all__ = ["AT_RISK_HEADROOM", "FixCandidate", "candidate_fixes", "check_loaded"]

DEFAULT_PROMPT = "a photograph of an astronaut riding a horse, highly detailed"
DEFAULT_STEPS = FIELDS["steps"].default
DEFAULT_SCHEDULER = FIELDS["scheduler"].default
HALF_DTYPES = ("fp16", "bf16")
COST_ROUNDS = 3  # timed UNet steps per plan, alternating fix and no-half, after a warm-up each

# Where a tensor lives, by key prefix: original (LDM) single-file names and diffusers names.
_WEIGHT_PREFIXES = (
    ("model.diffusion_model.", "unet"),
    ("first_stage_model.", "vae"),
    ("cond_stage_model.", "text_encoder"),
    ("conditioner.embedders.0.", "text_encoder"),
    ("conditioner.embedders.1.", "text_encoder_2"),
    ("text_encoder_2.", "text_encoder_2"),
    ("text_encoder_3.", "text_encoder_3"),
    ("transformer.", "transformer"),
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


@dataclass(frozen=True)
class PrecisionOutcome:
    """What one half precision does for a component on this device: `measured` when the
    check ran the component in it, else predicted from the run at the tested precision."""

    status: Status
    measured: bool

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status.value, "measured": self.measured}


@dataclass
class ComponentReport:
    """One component's result. `max_abs` is measured at the tested precision, or, when that run
    went non-finite, on the run that fixed it (so headroom below 1 says by how much it overflows).
    """

    name: str
    dtype: str
    status: Status
    max_abs: float | None
    headroom: float | None
    first_bad_module: str | None
    seconds: float
    blocks: list[dict[str, Any]] = field(default_factory=list)
    precisions: dict[str, PrecisionOutcome] = field(default_factory=dict)
    predicted_first_bad_module: str | None = None  # first layer past 65504 in a wider run
    # The component upstream whose non-finite output this one was fed (None: its inputs were
    # finite). Such a victim is checked on a finite stand-in input; its status says what it did
    # there, never the upstream fault.
    fed_by: str | None = None

    @property
    def predicted_fp16(self) -> str | None:
        """fp16's status when the component was tested wider and fp16 was not measured."""
        fp16 = self.precisions.get("fp16")
        return fp16.status.value if fp16 is not None and not fp16.measured else None

    def to_json(self) -> dict[str, Any]:
        document = {
            "status": self.status.value,
            "max_abs": _finite_or_none(self.max_abs),
            "headroom": _finite_or_none(self.headroom),
            "first_bad_module": self.first_bad_module,
            "seconds": round(self.seconds, 4),
            "dtype": self.dtype,
            "precisions": {name: p.to_json() for name, p in self.precisions.items()},
            "blocks": self.blocks,
            "fed_by": self.fed_by,
        }
        if self.predicted_fp16 is not None:
            document["predicted_fp16"] = self.predicted_fp16
            document["predicted_first_bad_module"] = self.predicted_first_bad_module
        return document


@dataclass
class Fix:
    """A set of settings that makes every failing component finite. `verified` only when the
    re-run output is finite and agrees with the fp32 reference (`quality`, the worst of the
    repaired components)."""

    plan: PrecisionPlan
    settings: dict[str, Any]  # what "Apply fix" writes into the user's settings
    summary: str
    verified: bool
    quality: Quality | None = None
    steps: list[str] = field(default_factory=list)  # the fix in words, one item per change
    cost: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Every candidate tried, per failing component, ranked (the chosen one first), and the
    # tested plan's and no-half's cost measured beside them (component -> label -> cost).
    candidates: list[diagnosis.CandidateResult] = field(default_factory=list)
    baselines: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            **self.plan.tested(),
            "verified": self.verified,
            "summary": self.summary,
            "quality": self.quality.to_json() if self.quality else None,
            "modules": {c: self.plan.islands(c) for c in self.plan.modules if self.plan.islands(c)},
            "settings": self.settings,
            # The figures, and the one sentence that reads them honestly (noise included).
            "cost": {**self.cost, "summary": cost_comparison(self.cost)} if self.cost else {},
            "precision_words": tested_words(self.plan),
            "clamps": {c: list(p) for c, p in self.plan.clamps.items() if p},
            "layers_wider": self.plan.island_count(),
            "candidates": [c.to_json() for c in self.candidates],
            "baselines": self.baselines,
        }


@dataclass
class Advice:
    """For a check run wider than fp16 (no-half, a remembered fix, a CPU): the settings that
    would move the model to fp16 while keeping the components predicted to overflow wider."""

    overflowing: list[str]  # components predicted to overflow in fp16
    settings: dict[str, Any]
    measured: bool  # False: predicted from the wider run
    # The layer-level alternative: everything in fp16 but the layers the wider run measured
    # past fp16's range (and those they feed), kept in fp32; empty when it could not be drawn.
    layer_settings: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "target": "fp16",
            "overflowing": list(self.overflowing),
            "settings": dict(self.settings),
            "layer_settings": dict(self.layer_settings),
            "measured": self.measured,
        }


@dataclass
class HealthReport:
    model: dict[str, Any]
    device: dict[str, Any]
    plan: PrecisionPlan
    size: int
    weights_non_finite: list[str]
    components: dict[str, ComponentReport]
    verdict: Verdict
    fix: Fix | None
    seconds: float
    notes: list[str] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)
    remembered: str | None = None  # the summary of a remembered fix the check ran with
    timesteps: list[float] = field(default_factory=list)  # where the denoiser was probed
    advice: Advice | None = None
    # Why it failed, from re-runs (see `causes.attribute`): None when healthy or not attributed.
    cause: Any = None
    loras: list[Any] = field(default_factory=list)  # lora.AppliedLora the check ran with
    # Every fix candidate the check re-ran, ranked per component, verified or not (kept also
    # when nothing was verified: the cause's kernel probe reuses their re-runs). Not reported.
    tried: list[diagnosis.CandidateResult] = field(default_factory=list, repr=False)
    # Quantized weights that decode wrongly (QuantFinding.to_json each): a loader's or a
    # conversion's fault, told apart from overflow.
    weights_bad_quantized: list[dict[str, Any]] = field(default_factory=list)

    @property
    def headline(self) -> str:
        """The report's first line: what the user most needs to know, never a bare "healthy"
        when a component would overflow at the precision the user is likely to move to."""
        return headline(self)

    def to_json(self) -> dict[str, Any]:
        return {
            "halfsafe": __version__,
            "model": self.model,
            "device": self.device,
            "tested": self.plan.tested(),
            "tested_layers": layer_words(self.plan),
            "weights": {
                "non_finite": self.weights_non_finite,
                "bad_quantized": self.weights_bad_quantized,
            },
            "components": {name: c.to_json() for name, c in self.components.items()},
            "verdict": self.verdict.value,
            "headline": self.headline,
            "fix": self.fix.to_json() if self.fix else None,
            "advice": self.advice.to_json() if self.advice else None,
            "cause": self.cause.to_json() if self.cause is not None else None,
            "loras": [lora.to_json() for lora in self.loras],
            "remembered": self.remembered,
            "seconds": round(self.seconds, 3),
            "size": self.size,
            "timesteps": list(self.timesteps),
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

    def __init__(
        self, model, plan: PrecisionPlan, size: int, prompt: str, steps: int, scheduler: str
    ) -> None:
        import torch

        self.model = model
        self.placed = PlacedPipeline(model.pipeline, plan)
        self.device = torch.device(plan.device)
        self.size = size
        self.prompt = prompt
        self.family = family_of(model.pipeline)
        self.timesteps = probe_timesteps(model, steps, scheduler, size)

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
        names = [n for n in self.family.text_encoders(self.model.pipeline) if n in plan.dtypes]

        def run(pipe):
            return self.family.encode(pipe, self.prompt, "", self.device, guidance=True)

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
        timesteps: list[float] | None = None,
    ) -> _Stage:
        """The denoiser stepped through `timesteps` (by default the probe's: the first, middle
        and last timesteps of the user's schedule) from seeded noise, as the family samples
        (SD: Euler with the CFG batch; Flux: flow-matching Euler with its guidance embedding)."""

        def run(pipe):
            return self.family.probe_denoise(
                pipe, conditioning, self.size, self.device, list(timesteps or self.timesteps)
            )

        return self._watch(plan, [self.family.denoiser], run, record)

    def decode(self, plan: PrecisionPlan, latents, record: bool = True) -> _Stage:
        def run(pipe):
            return self.family.decode(pipe.vae, latents)

        return self._watch(plan, ["vae"], run, record)

    def stage_costs(
        self,
        name: str,
        stage_fn: Callable[[PrecisionPlan, bool], _Stage],
        plans: dict[str, PrecisionPlan],
    ) -> dict[str, dict[str, Any]]:
        """Time of one step of the component `name` (a denoiser step, a VAE decode, a prompt
        encode) under each plan, measured as `unet_step_costs` does: a warm-up each (which also
        gives peak device memory where the device reports it), then `COST_ROUNDS` rounds that
        alternate between the plans; median and range."""
        import torch

        cuda = self.device.type == "cuda"
        per_run = len(self.timesteps) if name == self.family.denoiser else 1
        samples: dict[str, list[float]] = {label: [] for label in plans}
        peaks: dict[str, float | None] = dict.fromkeys(plans)
        for label, plan in plans.items():
            if cuda:
                torch.cuda.synchronize(self.device)
                torch.cuda.reset_peak_memory_stats(self.device)
            stage_fn(plan, False)
            if cuda:
                peaks[label] = torch.cuda.max_memory_allocated(self.device) / 2**20
        for _ in range(COST_ROUNDS):
            for label, plan in plans.items():
                stage = stage_fn(plan, False)
                samples[label].append(stage.seconds.get(name, 0.0) * 1000 / per_run)
        return {
            label: {
                "step_ms": round(statistics.median(samples[label]), 2),
                "step_ms_range": [round(min(samples[label]), 2), round(max(samples[label]), 2)],
                "rounds": COST_ROUNDS,
                "peak_memory_mb": _rounded(peaks[label]),
                "weights_mb": round(plan_weights_mb(plan, self.model.pipeline), 2),
            }
            for label, plan in plans.items()
        }

    def unet_step_costs(
        self, plans: dict[str, PrecisionPlan], conditioning: dict[str, Any]
    ) -> dict[str, dict[str, Any]]:
        """Time of one UNet step (CFG batch) under each plan, measured the same way for all:
        one warm-up step each, then `COST_ROUNDS` rounds that alternate between the plans, so
        drift (clocks, caches, other load) hits every plan alike. Reports the median and the
        spread; peak device memory where the device reports it."""
        import torch

        cuda = self.device.type == "cuda"
        one_step = self.timesteps[len(self.timesteps) // 2 : len(self.timesteps) // 2 + 1]
        samples: dict[str, list[float]] = {name: [] for name in plans}
        peaks: dict[str, float | None] = dict.fromkeys(plans)
        for name, plan in plans.items():  # warm-up, and the peak memory of a step
            if cuda:
                torch.cuda.synchronize(self.device)
                torch.cuda.reset_peak_memory_stats(self.device)
            self.denoise(plan, conditioning, record=False, timesteps=one_step)
            if cuda:
                peaks[name] = torch.cuda.max_memory_allocated(self.device) / 2**20
        for _ in range(COST_ROUNDS):
            for name, plan in plans.items():
                stage = self.denoise(plan, conditioning, record=False, timesteps=one_step)
                samples[name].append(stage.seconds[self.family.denoiser] * 1000)
        return {
            name: {
                "unet_step_ms": round(statistics.median(samples[name]), 2),
                "unet_step_ms_range": [round(min(samples[name]), 2), round(max(samples[name]), 2)],
                "rounds": COST_ROUNDS,
                "peak_memory_mb": _rounded(peaks[name]),
                "weights_mb": round(plan_weights_mb(plan, self.model.pipeline), 1),
            }
            for name, plan in plans.items()
        }


def _rounded(value: float | None) -> float | None:
    return round(value, 1) if value is not None else None


def probe_timesteps(model, steps: int, scheduler: str, size: int | None = None) -> list[float]:
    """Where the check runs the denoiser: the first, the middle and the last timestep of the
    user's sampler at the user's step count.

    Three are enough because what decides a denoiser's activations is the noise level, through
    the input's scale and the timestep embedding, and both change monotonically along the
    schedule: the ends bound them. The first step sees pure noise at the largest sigma; the last
    sees an almost clean latent at the smallest timestep the sampler ever uses (t=0 for Karras
    schedules), where faults that only fire at low noise live and where every real image ends.
    The middle step catches a fault peaked inside the range. The probe integrates with Euler
    steps between these three, so the latent at each one is a plausible one for its noise level.
    A flow-matching family (Flux) probes its own sigma schedule at this size (sigma x 1000).
    """
    return family_of(model.pipeline).probe_timesteps(
        model, steps, scheduler, size or model.native_size
    )


def _all_finite(value: Any) -> bool:
    from app.core.probe import max_abs

    peak = max_abs(value)
    return peak is None or math.isfinite(float(peak))


@dataclass
class ProbeRun:
    """One end-to-end run of the check's three stages under one plan: the decoded image and
    every component's probe."""

    image: Any
    probes: dict[str, ProbeResult]

    @property
    def failed(self) -> list[str]:
        """The components whose output went non-finite, in run order."""
        return in_run_order([n for n, p in self.probes.items() if p.non_finite])

    @property
    def finite(self) -> bool:
        return not self.failed and _all_finite(self.image)

    def first_bad_module(self, component: str) -> str | None:
        probe = self.probes.get(component)
        return _first_bad_name(probe) if probe is not None else None


def probe_run(
    model,
    plan: PrecisionPlan,
    *,
    size: int,
    steps: int = DEFAULT_STEPS,
    scheduler: str = DEFAULT_SCHEDULER,
    prompt: str = DEFAULT_PROMPT,
) -> ProbeRun:
    """Run the text encoder(s), the denoiser at the probe's timesteps and the VAE once under
    `plan`, as the check's first pass does, recording every module; the device copies are
    released at the end. Runs on the calling thread."""
    runner = _Runner(model, plan, size, prompt, steps, scheduler)
    try:
        encoded = runner.encode(plan)
        denoised = runner.denoise(plan, encoded.output)
        decoded = runner.decode(plan, denoised.output)
    finally:
        runner.placed.release()
    return ProbeRun(decoded.output, {**encoded.probes, **denoised.probes, **decoded.probes})


# --- the check -----------------------------------------------------------------------------


class _Observations:
    """Every recorded run of every component, by dtype: what `precisions` is built from."""

    def __init__(self) -> None:
        self.runs: dict[str, dict[str, ProbeResult]] = {}

    def add(self, stage: _Stage, plan: PrecisionPlan) -> _Stage:
        for name, probe in stage.probes.items():
            self.runs.setdefault(name, {}).setdefault(plan.dtypes[name], probe)
        return stage

    def precisions(self, name: str, broken_weights: bool) -> dict[str, PrecisionOutcome]:
        runs = self.runs.get(name, {})
        finite = [p for p in runs.values() if not p.non_finite]
        widest = max(finite, key=lambda p: p.max_abs, default=None)
        outcomes = {}
        for dtype in HALF_DTYPES:
            if broken_weights:
                outcomes[dtype] = PrecisionOutcome(Status.BROKEN_WEIGHTS, False)
            elif dtype in runs:
                outcomes[dtype] = PrecisionOutcome(_measured_status(runs[dtype], dtype), True)
            elif widest is None:  # nothing ran finite: no half precision will either
                outcomes[dtype] = PrecisionOutcome(Status.NAN, False)
            elif dtype == "bf16":  # fp32's range: only a value past 3.4e38 overflows it
                outcomes[dtype] = PrecisionOutcome(Status.OK, False)
            else:
                outcomes[dtype] = PrecisionOutcome(_predicted_fp16(widest), False)
        return outcomes

    def score_note(self, name: str) -> str | None:
        """A sentence when fp16 is predicted at risk only through attention scores."""
        finite = [p for p in self.runs.get(name, {}).values() if not p.non_finite]
        top = max(
            (t for t in (p.top_scores() for p in finite) if t is not None),
            key=lambda t: t.score_bound,
            default=None,
        )
        if top is None or top.score_bound <= FP16_MAX or "fp16" in self.runs.get(name, {}):
            return None
        return (
            f"In fp16 the attention scores of the {component_words(name)} could pass 65504 at "
            f"{top.name} (an upper bound of {top.score_bound:.3g} from this run; scores are "
            "never a layer's output): upcast attention keeps them in fp32."
        )


def _predicted_fp16(run: ProbeResult) -> Status:
    """fp16's status predicted from a finite wider run: its largest activation, and the bound
    on its attention scores (past 65504, the scores may overflow: at risk, not certain)."""
    status = status_from_peak(run.max_abs)
    top = run.top_scores()
    if status is Status.OK and top is not None and top.score_bound > FP16_MAX:
        return Status.AT_RISK
    return status


def _measured_status(probe: ProbeResult, dtype: str) -> Status:
    """A run's status; only fp16's range makes a large finite value a risk."""
    if probe.non_finite:
        bad = probe.first_bad_module()
        return Status.OVERFLOW if bad is not None and bad.overflow else Status.NAN
    if dtype == "fp16" and probe.half_max_abs > FP16_MAX / AT_RISK_HEADROOM:
        return Status.AT_RISK
    return Status.OK


@dataclass
class _Search:
    """The fix search's running state across the stages."""

    plan: PrecisionPlan  # every fix found so far, on top of the tested plan
    settings: dict[str, Any] = field(default_factory=dict)
    words: list[str] = field(default_factory=list)
    qualities: dict[str, Quality] = field(default_factory=dict)  # per repaired component
    rejected: list[str] = field(default_factory=list)  # finite but wrong: never a fix
    unfixed: list[str] = field(default_factory=list)
    candidates: list[diagnosis.CandidateResult] = field(default_factory=list)  # ranked
    baselines: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)

    def accept(self, candidate: FixCandidate) -> None:
        self.plan = candidate.plan
        self.settings.update(candidate.settings)
        self.words.append(candidate.words)


def check_loaded(
    model,
    *,
    precision: PrecisionSettings,
    device: str = "auto",
    size: int | None = None,
    steps: int = DEFAULT_STEPS,
    scheduler: str = DEFAULT_SCHEDULER,
    prompt: str = DEFAULT_PROMPT,
    on_progress: ProgressCallback | None = None,
    cancel: CancelToken | None = None,
    remember: bool = True,
    measure_cost: bool = True,
) -> HealthReport:
    """Check a loaded model on `device` under the user's precision settings.

    `steps` and `scheduler` are the user's sampler settings: the denoiser is probed at the first,
    middle and last timesteps of that schedule. Runs on the calling thread and takes seconds on a
    GPU. Side effects: components are copied to the device for the duration (released at the
    end), and a verified fix is stored in the model's remembered profile (unless `remember` is
    False). With `measure_cost`, a verified fix is also timed against no-half, alternating.
    """
    import torch

    from app.core import hardware, profiles

    started = time.perf_counter()
    progress = on_progress or no_progress
    cancel = cancel or CancelToken()
    size = size or model.native_size
    if size < 64 or size % 8:
        raise HalfSafeError(f"The check size must be a multiple of 8 and at least 64, not {size}.")
    problem = family_of(model.pipeline).size_problem(model.pipeline, size, size)
    if problem is not None:
        raise HalfSafeError(f"{model.name}: {problem}")

    torch_device = hardware.pick_device(device)
    info = hardware.describe_device(torch_device)
    found = profiles.lookup(model.profile_key, info.name)
    remembered = found.fix
    plan = diagnosis.plan_for_model(
        model,
        precision,
        device=torch_device,
        device_info=info,
        remembered=remembered.settings if remembered else None,
    )
    notes = list(plan.warnings) + found.notes + list(getattr(model, "notes", []))
    notes.extend(profiles.remembered_words(remembered, plan))
    bad_weights = sorted(model.weights.non_finite)
    bad_quantized = list(getattr(model.weights, "bad_quantized", []))
    broken = {component_of_tensor(name) for name in bad_weights} | {
        f.component or component_of_tensor(f.tensor) for f in bad_quantized
    }
    quantization = getattr(model, "quantization", None)
    if quantization and not bad_quantized:
        notes.append(
            f"The model is stored quantized ({quantization['format']}: "
            f"{', '.join(quantization['types'])}); the check ran on its weights dequantised to "
            f"{quantization['dequantized_to']}, whose scales and decoded values are plausible."
        )
    runner = _Runner(model, plan, size, prompt, steps, scheduler)
    seen = _Observations()
    search = _Search(plan)
    bf16_native = getattr(info, "bf16", None) == "native"
    reports: dict[str, ComponentReport] = {}
    first_probes: dict[str, ProbeResult] = {}
    predicted_layers: dict[str, list[str]] = {}
    try:

        def settle(
            stage_fn: Callable[[PrecisionPlan, bool], _Stage], names: list[str], first: _Stage
        ) -> _Stage:
            """Report each component of a stage and, for one that failed, find its fix: the
            cheapest candidate whose re-run is finite and agrees with the fp32 reference."""
            seen.add(first, search.plan)
            good = first
            reference: _Stage | None = None
            for name in names:
                probe = first_probes[name] = first.probes[name]
                verify: ProbeResult | None = None
                if name in broken:
                    pass
                elif probe.non_finite and good is not first and not good.probes[name].non_finite:
                    verify = good.probes[name]  # the fix found for a sibling fixed this one too
                elif probe.non_finite:
                    if reference is None:
                        progress("Running the fp32 reference", 0, 1)
                        reference = stage_fn(diagnosis.fp32_reference(search.plan), True)
                    chosen = _choose_fix(
                        name,
                        stage_fn,
                        search,
                        reference,
                        runner,
                        seen,
                        _first_bad_name(probe),
                        bf16_native,
                        measure_cost,
                        progress,
                        cancel,
                    )
                    if chosen is not None:
                        # The fp32 reference shows the true magnitude (a clamp's run would not).
                        verify, good = reference.probes[name], chosen
                    if verify is None:
                        search.unfixed.append(name)
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
        te_names = [n for n in runner.family.text_encoders(model.pipeline) if n in plan.dtypes]
        encoded = settle(runner.encode, te_names, runner.encode(plan))

        # A stage fed non-finite values by an earlier one is checked on a finite stand-in, and
        # its components are reported as fed by the first component at fault upstream.
        fed_by: str | None = None
        progress(f"Checking the {component_words(runner.family.denoiser)}", 1, total)
        cancel.raise_if_cancelled()
        conditioning = encoded.output
        if not _all_finite(conditioning):  # nothing fixed an encoder: zero what is non-finite
            fed_by = _at_fault(te_names, reports)
            conditioning = _finite_stand_in(conditioning)
        denoised = settle(
            lambda p, record: runner.denoise(p, conditioning, record),
            [runner.family.denoiser],
            runner.denoise(search.plan, conditioning),
        )
        _mark_fed_by(reports, [runner.family.denoiser], fed_by, notes, "zeroed embeddings")

        progress("Checking the VAE", 2, total)
        cancel.raise_if_cancelled()
        latents = denoised.output
        stand_in = f"what the {component_words(runner.family.denoiser)} made of its stand-in"
        if not _all_finite(latents):  # nothing fixed the denoiser: decode a plausible latent
            fed_by = fed_by or _at_fault([runner.family.denoiser], reports)
            stand_in = "a seeded noise latent"
            latents = torch.randn(latents.shape, generator=torch.Generator().manual_seed(1)).to(
                latents.device
            )
        settle(
            lambda p, record: runner.decode(p, latents, record),
            ["vae"],
            runner.decode(search.plan, latents),
        )
        _mark_fed_by(reports, ["vae"], fed_by, notes, stand_in)

        _last_resort(runner, search, seen, reports, first_probes, plan, broken, progress, cancel)

        for name, probe in first_probes.items():
            root = probe.modules.get("")
            if probe.first_bad_module() is None and root is not None and root.non_finite:
                notes.append(
                    f"The {component_words(name)} received values already beyond fp16's "
                    "range from the part before it, so no layer inside it is to blame."
                )
        for name, report in reports.items():
            report.precisions = seen.precisions(name, name in broken)
            note = seen.score_note(name)
            if note:
                notes.append(note)
        failed = [n for n, r in reports.items() if r.status.failed]
        notes.extend(search.rejected)
        fix = None
        if broken or search.unfixed:
            verdict = Verdict.BROKEN
            if bad_weights:
                notes.append(
                    "The weights themselves hold NaN or Inf values: this file is damaged, "
                    "and no precision setting can repair it."
                )
            if bad_quantized:
                more = f" (and {len(bad_quantized) - 1} more)" if len(bad_quantized) > 1 else ""
                notes.append(
                    f"Quantized weights decode wrongly: {bad_quantized[0].sentence}{more}. "
                    "This is the file's quantisation (or the tool that converted it), not fp16 "
                    "overflow, and no precision setting can repair it."
                )
            if not broken:
                notes.append(
                    f"The {join_words(search.unfixed)} gives no finite output that agrees with "
                    "fp32 under any precision setting, so the cause is not precision (the "
                    "weights, a LoRA or a kernel: see the cause, where one was found)."
                )
        elif failed:
            verdict = Verdict.FIXABLE
            quality = min(search.qualities.values(), key=lambda q: q.value, default=None)
            fix = Fix(
                search.plan,
                search.settings,
                _fix_summary(failed, search.words, plan, search.plan, quality),
                verified=quality is not None and quality.passed,
                quality=quality,
                steps=list(search.words),
                candidates=list(search.candidates),
                baselines=dict(search.baselines),
            )
            if measure_cost:
                progress("Measuring the cost of the fix", 3, total)
                fix.cost = runner.unet_step_costs(
                    {"fix": search.plan, "no_half": no_half(plan)}, conditioning
                )
            if remember and fix.verified:
                profiles.remember_fix(
                    model.profile_key, info.name, search.settings, fix.summary, "health check"
                )
        else:
            verdict = Verdict.HEALTHY
            predicted_layers = _predicted_layers(reports, first_probes, runner.placed)
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
            "prediction": prediction_summary(model),
            "quantization": getattr(model, "quantization", None),
            "companions": dict(getattr(model, "companions", {})),
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
        remembered=remembered.summary if remembered and plan.remembered_used else None,
        timesteps=runner.timesteps,
        advice=(
            _advice(reports, plan, bf16_native, predicted_layers)
            if verdict is Verdict.HEALTHY
            else None
        ),
        loras=list(getattr(model, "loras", [])),
        tried=list(search.candidates),
        weights_bad_quantized=[f.to_json() for f in bad_quantized],
    )


def _choose_fix(
    name: str,
    stage_fn: Callable[[PrecisionPlan, bool], _Stage],
    search: _Search,
    reference: _Stage,
    runner: _Runner,
    seen: _Observations,
    first_bad: str | None,
    bf16_native: bool,
    measure_cost: bool,
    progress: ProgressCallback,
    cancel: CancelToken,
) -> _Stage | None:
    """Try every candidate fix for the failing component `name` (`diagnosis.FIX_KINDS`): each
    re-run is judged finite or not and against the fp32 reference (`reference`, recorded, so
    its per-layer peaks draw the islands); with `measure_cost` the verified ones are timed
    against the tested plan and no-half. The best verified one (`diagnosis.rank_candidates`)
    is accepted; the stage it ran is returned (None: nothing verified)."""
    results: list[diagnosis.CandidateResult] = []
    retries: dict[int, _Stage] = {}
    module = runner.placed[name]
    candidates = list(
        candidate_fixes(
            name, search.plan, first_bad, module, bf16_native, reference.probes.get(name)
        )
    )
    for candidate in candidates:
        cancel.raise_if_cancelled()
        progress(f"Trying a fix: {candidate.words}", 0, 1)
        try:
            retry = seen.add(stage_fn(candidate.plan, True), candidate.plan)
        except CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - any failure of a candidate drops it alone
            search.rejected.append(
                f"{_sentence_case(candidate.words)} failed to run ({_error_words(error)}): "
                "not a fix."
            )
            continue
        finite = not retry.probes[name].non_finite
        quality = diagnosis.compare(retry.output, reference.output) if finite else None
        result = diagnosis.CandidateResult(
            component=name,
            kind=candidate.kind,
            words=candidate.words,
            settings=dict(candidate.settings),
            modules=len(candidate.plan.islands(name)) + len(candidate.plan.clamps.get(name, ())),
            finite=finite,
            quality=quality,
            cost={"weights_mb": round(plan_weights_mb(candidate.plan, runner.model.pipeline), 2)},
            candidate=candidate,
        )
        if finite:
            retries[id(result)] = retry
        results.append(result)
    verified = [r for r in results if r.verified]
    if measure_cost and verified:
        progress(f"Measuring the fixes for the {component_words(name)}", 0, 1)
        plans = {f"{i}": r.candidate.plan for i, r in enumerate(verified) if r.candidate}
        plans["as_tested"] = search.plan
        plans["no_half"] = no_half(search.plan)
        costs = runner.stage_costs(name, stage_fn, plans)
        for i, r in enumerate(verified):
            r.cost.update(costs[f"{i}"])
        search.baselines[name] = {"as_tested": costs["as_tested"], "no_half": costs["no_half"]}
    ranked = diagnosis.rank_candidates(results)
    for r in ranked:
        if r.finite and not r.verified and r.quality is not None:
            search.rejected.append(
                f"{_sentence_case(r.words)} gave finite output that differs from the fp32 "
                f"reference ({r.quality.words()}): not a fix."
            )
    best = ranked[0] if ranked and ranked[0].verified else None
    search.candidates.extend(ranked)
    if best is None or best.candidate is None:
        return None
    best.chosen = True
    search.accept(best.candidate)
    if best.quality is not None:
        search.qualities[name] = best.quality
    return retries[id(best)]


def _last_resort(runner, search, seen, reports, first_probes, plan, broken, progress, cancel):
    """The whole model in fp32, re-run end to end, when no single-component fix worked."""
    if not search.unfixed or broken or all(d == "fp32" for d in plan.dtypes.values()):
        return
    cancel.raise_if_cancelled()
    progress("Trying a fix: everything in fp32", 2, 3)
    candidate = diagnosis.everything_fp32(search.plan)
    full = candidate.plan
    encoded = seen.add(runner.encode(full), full)
    unet = seen.add(runner.denoise(full, encoded.output), full)
    vae = seen.add(runner.decode(full, unet.output), full)
    stages = {**encoded.probes, **unet.probes, **vae.probes}
    if any(p.non_finite for p in stages.values()):
        return
    search.plan, search.settings, search.words = full, dict(candidate.settings), [candidate.words]
    for name in search.unfixed:
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
        # Everything in fp32 is the reference itself.
        search.qualities[name] = Quality(diagnosis.QUALITY_CEILING_DB)
    search.unfixed = []


def _predicted_layers(
    reports: dict[str, ComponentReport], probes: dict[str, ProbeResult], placed: PlacedPipeline
) -> dict[str, list[str]]:
    """For each component run wider than fp16 and predicted to overflow there, the layers to
    keep in fp32 (`diagnosis.overflow_islands` over the run's per-layer peaks)."""
    layers = {}
    for name, report in reports.items():
        fp16 = report.precisions.get("fp16")
        if report.dtype == "fp16" or fp16 is None or not fp16.status.failed:
            continue
        if name in placed and name in probes:
            found = diagnosis.overflow_islands(probes[name], placed[name])
            if found:
                layers[name] = found
    return layers


def _advice(
    reports: dict[str, ComponentReport],
    plan: PrecisionPlan,
    bf16_native: bool,
    predicted_layers: dict[str, list[str]] | None = None,
) -> Advice | None:
    """For a healthy check that ran some component wider than fp16: how to move to fp16
    safely, keeping only the components predicted (or measured) to overflow there wider."""
    wider = [n for n, r in reports.items() if r.dtype != "fp16"]
    if not wider:
        return None
    overflowing = [
        n
        for n in wider
        if reports[n].precisions.get("fp16", PrecisionOutcome(Status.OK, False)).status.failed
    ]
    settings: dict[str, Any] = {"no_half": False, "no_half_vae": False, "precision": "fp16"}
    for name in reports:
        keep = "bf16" if bf16_native else "fp32"
        settings[COMPONENTS[name].setting] = keep if name in overflowing else "fp16"
    measured = all(reports[n].precisions["fp16"].measured for n in wider)
    layer_settings: dict[str, Any] = {}
    layers = predicted_layers or {}
    if overflowing and all(n in layers for n in overflowing):
        layer_settings = {
            **settings,
            **{COMPONENTS[n].setting: "fp16" for n in overflowing},
            "fp32_modules": [f"{n}:{p}" for n in in_run_order(overflowing) for p in layers[n]],
        }
    return Advice(in_run_order(overflowing), settings, measured, layer_settings)


def _at_fault(names: list[str], reports: dict[str, ComponentReport]) -> str | None:
    """The first of `names` (in run order) that failed on its own: damaged weights, or output
    that went non-finite and stayed so, unfed by another (None when none did)."""
    for name in in_run_order(names):
        report = reports.get(name)
        if report is not None and report.fed_by is None and report.status.failed:
            return name
    return None


def _finite_stand_in(value: Any) -> Any:
    """`value` (a stage's output: tensors in dicts, lists and tuples) with every floating
    tensor that holds NaN or Inf replaced by zeros of its shape: zeroed embeddings are what
    SDXL and SD3 give the denoiser for an empty negative prompt, a plausible input."""
    import torch

    if isinstance(value, torch.Tensor):
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            return torch.zeros_like(value)
        return value
    if isinstance(value, dict):
        return {k: _finite_stand_in(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_finite_stand_in(v) for v in value)
    return value


def _mark_fed_by(
    reports: dict[str, ComponentReport],
    names: list[str],
    fed_by: str | None,
    notes: list[str],
    stand_in: str,
) -> None:
    """Mark the components of a stage as fed non-finite input by `fed_by`, with a note."""
    if fed_by is None:
        return
    for name in names:
        if name not in reports:
            continue
        reports[name].fed_by = fed_by
        notes.append(
            f"The {component_words(name)} was fed non-finite input by the "
            f"{component_words(fed_by)} (no fault of its own): it was checked on {stand_in} "
            "instead."
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
        status = Status.BROKEN_WEIGHTS
    elif probe.non_finite:
        overflowed = first_bad is not None and (
            first_bad.overflow or diagnosis.is_attention_overflow(first_bad.name, module)
        )
        status = Status.OVERFLOW if overflowed else Status.NAN
    else:
        status = Status.OK
    measured = verify if verify is not None else probe
    peak = measured.max_abs if not (measured.non_finite and verify is None) else None
    headroom = FP16_MAX / peak if peak else None
    # Within 2x of 65504 is a risk only for a component that runs in fp16; a wider run's
    # large values are reported under `precisions` as what fp16 would do.
    # Only values held in fp16 are at risk: a layer kept wider carries larger ones by design.
    if status is Status.OK and dtype == "fp16" and probe.half_max_abs > FP16_MAX / AT_RISK_HEADROOM:
        status = Status.AT_RISK
    over = probe.first_over_fp16() if dtype != "fp16" and not probe.non_finite else None
    return ComponentReport(
        name=name,
        dtype=dtype,
        status=status,
        max_abs=peak,
        headroom=headroom,
        first_bad_module=first_bad.name if first_bad else None,
        seconds=seconds,
        blocks=_blocks(probe, module) if module is not None else [],
        predicted_first_bad_module=over.name if over else None,
    )


def _blocks(probe: ProbeResult, module) -> list[dict[str, Any]]:
    """Per top-level block, in run order: the largest activation anywhere inside it."""
    rows = []
    for name in top_blocks(module):
        stats = probe.modules.get(name)
        if stats is None:
            continue
        peak, non_finite = probe.within(name)
        rows.append(
            (stats.order, {"module": name, "max_abs": peak or None, "non_finite": non_finite})
        )
    return [row for _, row in sorted(rows, key=lambda r: r[0])]


def _fix_summary(
    failed: list[str],
    fix_words: list[str],
    tested: PrecisionPlan,
    fixed: PrecisionPlan,
    quality: Quality | None,
) -> str:
    steps = "; ".join(fix_words)
    kept = [
        component_words(c)
        for c, d in tested.dtypes.items()
        if fixed.dtypes[c] == d and fixed.islands(c) == tested.islands(c)
    ]
    rest = (
        f" The {', '.join(kept)} keep{'s' if len(kept) == 1 else ''} {_their(kept)} precision."
        if kept
        else ""
    )
    proof = (
        f"Verified by re-running it with the fix: finite, and {quality.words()}."
        if quality is not None
        else "Not verified."
    )
    return f"The {join_words(in_run_order(failed))} overflowed; fix: {steps}. {proof}{rest}"


def _error_words(error: BaseException) -> str:
    """An exception in one short line: its type and the first line of its message."""
    first = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


def _sentence_case(text: str) -> str:
    return text[:1].upper() + text[1:]


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

STATUS_WORDS = {
    Status.OK: "ok",
    Status.AT_RISK: "close to the fp16 limit",
    Status.OVERFLOW: "OVERFLOWS",
    Status.NAN: "goes NaN",
    Status.BROKEN_WEIGHTS: "damaged weights",
}


def status_words(component: ComponentReport) -> str:
    """A component's status in the report's words; a component fed non-finite input that did
    not fail on its stand-in is named as fed, not by a status of its own."""
    if component.fed_by is not None and not component.status.failed:
        return f"fed non-finite input by {component.fed_by}"
    return STATUS_WORDS[component.status]


def layer_words(plan: PrecisionPlan) -> list[str]:
    """'with 3 VAE layers in fp32', 'with 1 UNet layer clamped': the plan's module islands and
    clamps, per component and dtype (the T5 feed-forward islands included)."""
    words_: list[str] = []
    for component in plan.dtypes:
        by_dtype: dict[str, int] = {}
        for dtype in plan.islands(component).values():
            by_dtype[dtype] = by_dtype.get(dtype, 0) + 1
        name = component_words(component)
        for dtype, count in by_dtype.items():
            words_.append(f"with {count} {name} layer{'s' if count != 1 else ''} in {dtype}")
        clamped = len(plan.clamps.get(component, ()))
        if clamped:
            words_.append(f"with {clamped} {name} layer{'s' if clamped != 1 else ''} clamped")
    return words_


def tested_words(plan: PrecisionPlan) -> str:
    """'no-half', 'fp16', 'fp16, VAE in fp32', 'fp16, with 2 VAE layers in fp32': the
    precisions a check ran with, briefly."""
    dtypes = plan.dtypes
    if all(d == "fp32" for d in dtypes.values()):
        return "no-half"
    counts: dict[str, int] = {}
    for dtype in dtypes.values():
        counts[dtype] = counts.get(dtype, 0) + 1
    base = max(counts, key=lambda d: counts[d])
    others = [f"{component_words(n)} in {d}" for n, d in dtypes.items() if d != base]
    others.extend(layer_words(plan))
    if plan.autocast_active and base == "fp16":
        base = "fp16 under autocast"
    elif plan.autocast_active:
        others.append("fp16 parts under autocast")
    return ", ".join([base, *others])


def _factor(peak: float | None) -> str:
    """' 27x', ' 402,000x': by how much a peak passes 65504 ('' when it does not)."""
    if not peak or peak <= FP16_MAX:
        return ""
    ratio = peak / FP16_MAX
    return f" {ratio:.2g}x" if ratio < 10 else f" {float(f'{ratio:.3g}'):,.0f}x"


def damaged_files(report: HealthReport) -> list[str]:
    """The files holding the weights with NaN or Inf: for a component read from a companion
    file (a split transformer's T5, VAE, ...) that file, else the model the user gave."""
    companions = report.model.get("companions") or {}
    files: list[str] = []
    for name in report.weights_non_finite:
        file = companions.get(component_of_tensor(name) or "", report.model.get("source", ""))
        if file not in files:
            files.append(file)
    return files


def headline(report: HealthReport) -> str:
    """The first line of every rendering of a report (CLI, Markdown, the GUI's banner)."""
    tested = tested_words(report.plan)
    components = report.components
    if report.cause is not None and report.cause.headline:
        return report.cause.headline
    if report.verdict is Verdict.BROKEN:
        # A bad scale first: it is the cause when it also made its weight NaN.
        if report.weights_bad_quantized:
            first = report.weights_bad_quantized[0]
            return (
                f"Broken: quantized weight {first['tensor']} {first['problem']}; this is the "
                "file's quantisation, not fp16 overflow, and no precision setting repairs it."
            )
        if report.weights_non_finite:
            bad = report.weights_non_finite
            named = f" ({bad[0]}{f' and {len(bad) - 1} more' if len(bad) > 1 else ''})"
            files = damaged_files(report)
            if files == [report.model.get("source", "")]:
                return (
                    f"Broken: the weights hold NaN or Inf values{named}; no precision setting "
                    "can repair this file."
                )
            return (
                f"Broken: the weights in {join_words(files)} hold NaN or Inf values{named}; no "
                f"precision setting can repair {'that file' if len(files) == 1 else 'them'}."
            )
        failed = [n for n, c in components.items() if c.status.failed]
        return (
            f"Broken: the {join_words(failed or list(components))} gives no finite output that "
            "agrees with fp32 under any precision setting."
        )
    if report.verdict is Verdict.FIXABLE and report.fix is not None:
        failed = [n for n, c in components.items() if c.status.failed]
        peak = max((components[n].max_abs or 0.0 for n in failed), default=0.0)
        how = (
            "overflows"
            if any(components[n].status is Status.OVERFLOW for n in failed)
            else "goes NaN"
        )
        proof = (
            f"verified fix ({report.fix.quality.words()})"
            if report.fix.verified and report.fix.quality
            else "unverified fix"
        )
        words_ = "; ".join(report.fix.steps)
        return (
            f"Fixable: at your settings ({tested}) the {join_words(failed)} {how}"
            f"{_factor(peak)}; {proof}: {words_}."
        )
    where = (
        "Safe with the fix remembered for this model"
        if report.remembered
        else f"Safe at your settings ({tested})"
    )
    advice = report.advice
    if advice is not None and advice.overflowing:
        peak = max((components[n].max_abs or 0.0 for n in advice.overflowing), default=0.0)
        keep = {advice.settings[COMPONENTS[n].setting] for n in advice.overflowing}
        basis = "measured" if advice.measured else "predicted from this run"
        keep_only = (
            f"keep only the {join_words(advice.overflowing)} in {' or '.join(sorted(keep))} "
            "and run the rest in fp16"
        )
        if report.device.get("kind") == "cpu":
            # fp16 is emulated on a CPU: the advice is for a GPU, and fp32 stays fastest here.
            keep_only = f"on a GPU, {keep_only}; on this CPU fp32 is the fastest choice"
        return (
            f"{where}. In fp16 the {join_words(advice.overflowing)} would overflow"
            f"{_factor(peak)} ({basis}): {keep_only}."
        )
    predicted_risk = [
        n
        for n, c in components.items()
        if (p := c.precisions.get("fp16")) is not None
        and not p.measured
        and p.status is Status.AT_RISK
    ]
    if advice is not None and predicted_risk:
        return (
            f"{where}. In fp16 the {join_words(predicted_risk)} would come close to fp16's limit "
            "(predicted from this run), so a larger image or another prompt may overflow it."
        )
    at_risk = [n for n, c in components.items() if c.status is Status.AT_RISK]
    risk = (
        f"; the {join_words(at_risk)} comes within {AT_RISK_HEADROOM:g}x of fp16's limit, so a "
        "larger image or another prompt may overflow it"
        if at_risk
        else ""
    )
    if advice is not None:
        return f"{where}, and fp16 would be safe too (predicted from this run){risk}."
    if report.remembered:
        return f"{where} ({tested}): nothing overflowed{risk}."
    return f"Healthy at your settings ({tested}): nothing overflowed{risk}."


def _fmt_number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def precision_words(component: ComponentReport) -> str:
    """'fp16 overflows (predicted), bf16 ok (measured)' for one component."""
    return ", ".join(
        f"{dtype} {STATUS_WORDS[o.status].lower()} ({'measured' if o.measured else 'predicted'})"
        for dtype, o in component.precisions.items()
    )


def flag(key: str, value: Any) -> str:
    """A setting as the CLI flag that sets it ('' for a switch already at its default)."""
    field_ = FIELDS[key]
    name = "--" + field_.flag_name
    if isinstance(value, bool):
        if value:
            return name
        return f"--no-{field_.flag_name}" if field_.default else ""
    if field_.kind == "modules":  # one flag per component: --fp32-modules vae:a,b
        return " ".join(
            f"{name} {component}:{','.join(paths)}"
            for component, paths in modules_by_component(list(value)).items()
        )
    return f"{name} {value}"


def flags(settings: dict[str, Any]) -> str:
    return " ".join(f for f in (flag(k, v) for k, v in settings.items()) if f)


def cost_words(cost: dict[str, Any]) -> str:
    parts = []
    if cost.get("unet_step_ms") is not None:
        spread = cost.get("unet_step_ms_range")
        parts.append(
            f"{cost['unet_step_ms']:.1f} ms per UNet step"
            + (
                f" ({spread[0]:.1f}-{spread[1]:.1f} over {cost.get('rounds')} runs)"
                if spread
                else ""
            )
        )
    if cost.get("peak_memory_mb") is not None:
        parts.append(f"{cost['peak_memory_mb']:.0f} MB peak")
    if cost.get("weights_mb") is not None:
        parts.append(f"{cost['weights_mb']:.0f} MB of weights")
    return ", ".join(parts) or "not measured"


def cost_comparison(cost: dict[str, dict[str, Any]]) -> str:
    """One sentence comparing the fix's step time with no-half's, honest about noise: when the
    two ranges overlap the measurement cannot tell them apart, and says so."""
    fix, half = cost.get("fix") or {}, cost.get("no_half") or {}
    fast, slow = fix.get("unet_step_ms"), half.get("unet_step_ms")
    if not fast or not slow:
        return ""
    fix_range = fix.get("unet_step_ms_range") or [fast, fast]
    half_range = half.get("unet_step_ms_range") or [slow, slow]
    if fix_range[1] >= half_range[0] and half_range[1] >= fix_range[0]:
        return (
            "Per UNet step the fix and no-half took the same time within this measurement's noise."
        )
    if slow > fast:
        return f"Per UNet step the fix was {slow / fast:.2g}x as fast as no-half."
    return f"Per UNet step the fix was {fast / slow:.2g}x as slow as no-half on this device."


CANDIDATE_COLUMNS = (
    "component",
    "candidate",
    "layers",
    "quality",
    "result",
    "ms per step",
    "peak MB",
    "weights MB",
)


def _result_words(row: dict[str, Any]) -> str:
    if row.get("chosen"):
        return "chosen"
    if row.get("verified"):
        return "verified"
    if row.get("finite"):
        return "rejected: differs from fp32"
    return "rejected: not finite"


def _ms(cost: dict[str, Any]) -> str:
    step, spread = cost.get("step_ms"), cost.get("step_ms_range")
    if step is None:
        return "-"
    return f"{step:.1f} ({spread[0]:.1f}-{spread[1]:.1f})" if spread else f"{step:.1f}"


def _mb(value: Any) -> str:
    return "-" if value is None else f"{value:.1f}"


def candidate_rows(fix: dict[str, Any]) -> list[tuple[str, ...]]:
    """The fix's candidates as table rows (`CANDIDATE_COLUMNS`), ranked, each failing
    component's measured baselines (its tested plan, no-half) after its candidates. Reads the
    JSON form (`Fix.to_json()`), so the CLI, the Markdown report and the GUI show one table."""
    rows: list[tuple[str, ...]] = []
    candidates = fix.get("candidates") or []
    baselines = fix.get("baselines") or {}
    for component in dict.fromkeys(c["component"] for c in candidates):
        for c in (c for c in candidates if c["component"] == component):
            quality = c.get("quality")
            cost = c.get("cost") or {}
            rows.append(
                (
                    component,
                    c["words"],
                    str(c.get("modules") or "-"),
                    f"{quality['value']:.1f} dB" if quality else "-",
                    _result_words(c),
                    _ms(cost),
                    _mb(cost.get("peak_memory_mb")),
                    _mb(cost.get("weights_mb")),
                )
            )
        for label, words_ in (("as_tested", "as tested (no fix)"), ("no_half", "no-half")):
            cost = (baselines.get(component) or {}).get(label)
            if cost:
                rows.append(
                    (
                        component,
                        words_,
                        "-",
                        "-",
                        "baseline",
                        _ms(cost),
                        _mb(cost.get("peak_memory_mb")),
                        _mb(cost.get("weights_mb")),
                    )
                )
    return rows


def candidate_markdown(fix: dict[str, Any]) -> str:
    rows = candidate_rows(fix)
    if not rows:
        return ""
    head = "| " + " | ".join(CANDIDATE_COLUMNS) + " |\n|" + "---|" * len(CANDIDATE_COLUMNS)
    body = "\n".join("| " + " | ".join(r) + " |" for r in rows)
    return f"{head}\n{body}\n"


def markdown_report(report: HealthReport) -> str:
    """A Markdown report to paste into a bug report: versions, device, model, table, fix."""
    v = report.versions
    rows = "\n".join(
        f"| {n} | {c.dtype} | {status_words(c)} | {_fmt_number(c.max_abs)} | "
        f"{_fmt_number(c.headroom)} | {('`' + c.first_bad_module + '`') if c.first_bad_module else '-'} "
        f"| {precision_words(c)} |"
        for n, c in report.components.items()
    )
    fix = "None needed." if report.verdict is Verdict.HEALTHY else "None: the model is broken."
    if report.fix:
        cost = report.fix.cost
        fix = f"{report.fix.summary}\n\nSettings: `{flags(report.fix.settings)}`"
        if cost:
            fix += (
                f"\n\nCost: {cost_words(cost.get('fix', {}))} with the fix; "
                f"{cost_words(cost.get('no_half', {}))} with no-half. {cost_comparison(cost)}"
            )
        table = candidate_markdown(report.fix.to_json())
        if table:
            fix += (
                "\n\n### Candidates\n\nEvery fix tried, judged against fp32 "
                f"({diagnosis.QUALITY_THRESHOLD_DB:g} dB)"
                + (" and timed on this device" if report.fix.baselines else "")
                + (
                    "; the cheapest verified one is chosen.\n\n"
                    if any(c.chosen for c in report.fix.candidates)
                    else "; none is chosen: the cause's repair replaced them.\n\n"
                )
                + table
            )
    elif report.advice is not None and report.advice.overflowing:
        fix = f"To run in fp16: `{flags(report.advice.settings)}` (not verified on this device)."
        if report.advice.layer_settings:
            fix += (
                "\n\nOr, keeping only the layers measured past fp16's range in fp32: "
                f"`{flags(report.advice.layer_settings)}` (not verified on this device)."
            )
    notes = "".join(f"- {n}\n" for n in report.notes)
    return (
        f"# HalfSafe health check: {report.model.get('name', report.model['source'])}\n\n"
        f"**{report.headline}**\n\n"
        f"- Verdict: **{report.verdict.value}**\n"
        f"- Model: `{report.model['source']}` ({report.model['architecture']}, "
        f"{report.model['format']})\n"
        f"- Device: {report.device['name']} ({report.device['kind']})\n"
        + "".join(f"- LoRA: `{applied.name}` at {applied.weight:g}\n" for applied in report.loras)
        + (
            f"- Cause: **{report.cause.kind}**; repair: {report.cause.repair} "
            f"({'verified' if report.cause.verified else 'not verified'})\n"
            if report.cause is not None
            else ""
        )
        + f"- Versions: HalfSafe {v.get('halfsafe')}, torch {v.get('torch')}, diffusers "
        f"{v.get('diffusers')}" + (f", CUDA {v['cuda']}" if v.get("cuda") else "") + "\n"
        f"- Probe size: {report.size}x{report.size}, timesteps "
        f"{', '.join(map(str, report.timesteps))}; check took {report.seconds:.2f} s\n\n"
        "| component | dtype | status | max abs | headroom | first bad layer | half precisions |\n"
        "|---|---|---|---|---|---|---|\n"
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
