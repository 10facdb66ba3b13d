"""What the check found, as data: per component (`ComponentReport`, with what each half
precision does there: `PrecisionOutcome`), the proved fix (`Fix`), the advice for a check run
wider than fp16 (`Advice`) and the whole report (`HealthReport`), each with its JSON form;
and the words that read a report: its headline, a component's status and precisions."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from app import __version__
from app.core.components import COMPONENTS, FP16_MAX, Status, Verdict, join_words
from app.core.fixing import fix_ranking
from app.core.fixing.diagnosis import AT_RISK_HEADROOM
from app.core.fixing.quality import Quality
from app.core.formats.weight_findings import QuantFinding
from app.core.health.cost import FixCost
from app.core.health.words import STATUS_WORDS, cost_comparison, layer_words, tested_words
from app.core.identities import DeviceIdentity, LoraIdentity, ModelIdentity
from app.core.models.summary import ModelSummary
from app.core.precision import PrecisionPlan
from app.core.run.stage_cost import StageCost
from app.core.settings.values import SettingValue, setting_word
from app.core.work import Work

if TYPE_CHECKING:  # the causes are told from re-runs of the check: they import it
    from app.core.causes.records import Cause
    from app.core.precision.lowbit import LowBitReport

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


@dataclass(frozen=True)
class BlockPeak:
    """One top-level block of a component, in run order: the largest value anywhere inside it
    (None: none finite, or not measured) and whether it went non-finite; the chart beside a
    component's card draws one bar per block."""

    module: str
    max_abs: float | None
    non_finite: bool = False

    @property
    def level(self) -> str:
        """ "bad" past fp16's limit (or non-finite), "warn" within a tenth of it, else "good"."""
        if self.non_finite or (self.max_abs is not None and self.max_abs >= FP16_MAX):
            return "bad"
        if self.max_abs is not None and self.max_abs >= FP16_MAX / 10:
            return "warn"
        return "good"

    def to_json(self) -> dict[str, Any]:
        return {"module": self.module, "max_abs": self.max_abs, "non_finite": self.non_finite}


@dataclass(frozen=True)
class StreamedPart:
    """How a component streamed block by block was held: `resident_mb` for its whole stage,
    plus one of its `blocks` at a time, the largest `block_mb`."""

    blocks: int
    resident_mb: float
    block_mb: float

    def to_json(self) -> dict[str, Any]:
        return {"blocks": self.blocks, "resident_mb": self.resident_mb, "block_mb": self.block_mb}


@dataclass(frozen=True)
class CheckMemory:
    """What the check's copies of the parts held on the device: the memory budget (None: none)
    and where it came from, the VAE's tiling, the most its placed components held at once, how
    often and for how long it placed a part, the parts kept as stored computing wider layer by
    layer, and those streamed block by block."""

    budget_mb: float | None
    budget_from: str | None
    vae_tiling: str
    vae_tile_px: int | None
    peak_placed_mb: float
    placements: int
    placing_s: float
    computed_in_place: tuple[str, ...] = ()
    streamed: dict[str, StreamedPart] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "budget_mb": self.budget_mb,
            "budget_from": self.budget_from,
            "vae_tiling": self.vae_tiling,
            "vae_tile_px": self.vae_tile_px,
            "peak_placed_mb": self.peak_placed_mb,
            "placements": self.placements,
            "placing_s": self.placing_s,
            "computed_in_place": list(self.computed_in_place),
            "streamed": {name: part.to_json() for name, part in self.streamed.items()},
        }


@dataclass
class ComponentReport:
    """One component's result. `max_abs` is measured at the tested precision, or, when that run
    went non-finite, on the run that fixed it (so headroom below 1 says by how much it overflows).
    A component that ran in fp16 with layers kept wider (a fix's islands) has its `max_abs` and
    headroom from the values held in fp16, and the wider layers' own largest value, where it is
    above those, as `wider_max_abs`: fp16's range is no concern of theirs.
    """

    name: str
    dtype: str
    status: Status
    max_abs: float | None
    headroom: float | None
    first_bad_module: str | None
    seconds: float
    blocks: list[BlockPeak] = field(default_factory=list)
    precisions: dict[str, PrecisionOutcome] = field(default_factory=dict)
    predicted_first_bad_module: str | None = None  # first layer past 65504 in a wider run
    # The component upstream whose non-finite output this one was fed (None: its inputs were
    # finite). Such a victim is checked on a finite stand-in input; its status says what it did
    # there, never the upstream fault.
    fed_by: str | None = None
    wider_max_abs: float | None = None

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
            "blocks": [block.to_json() for block in self.blocks],
            "fed_by": self.fed_by,
        }
        if self.wider_max_abs is not None:
            document["wider_max_abs"] = _finite_or_none(self.wider_max_abs)
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
    settings: dict[str, SettingValue]  # what "Apply fix" writes into the user's settings
    summary: str
    verified: bool
    quality: Quality | None = None
    steps: list[str] = field(default_factory=list)  # the fix in words, one item per change
    cost: FixCost | None = None  # measured beside no-half (None: not measured)
    # Every candidate tried, per failing component, ranked (the chosen one first), and the
    # tested plan's and no-half's cost measured beside them (component -> label -> cost).
    candidates: list[fix_ranking.CandidateResult] = field(default_factory=list)
    baselines: dict[str, dict[str, StageCost]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            **self.plan.tested(),
            "verified": self.verified,
            "summary": self.summary,
            "quality": self.quality.to_json() if self.quality else None,
            "modules": {c: self.plan.islands(c) for c in self.plan.modules if self.plan.islands(c)},
            "settings": self.settings,
            # The figures, and the sentences that read them honestly (noise included).
            "cost": (
                {**self.cost.to_json(), "summary": cost_comparison(self.cost, self.settings)}
                if self.cost
                else {}
            ),
            "precision_words": tested_words(self.plan),
            "clamps": {c: list(p) for c, p in self.plan.clamps.items() if p},
            "layers_wider": self.plan.island_count(),
            "candidates": [c.to_json() for c in self.candidates],
            "baselines": {
                component: {label: cost.to_json() for label, cost in costs.items()}
                for component, costs in self.baselines.items()
            },
        }


@dataclass
class Advice:
    """For a check run wider than fp16 (no-half, a remembered fix, a CPU): the settings that
    would move the model to fp16 while keeping the components predicted to overflow wider."""

    overflowing: list[str]  # components predicted to overflow in fp16
    settings: dict[str, SettingValue]
    measured: bool  # False: predicted from the wider run
    # The layer-level alternative: everything in fp16 but the layers the wider run measured
    # past fp16's range (and those they feed), kept in fp32; empty when it could not be drawn.
    layer_settings: dict[str, SettingValue] = field(default_factory=dict)

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
    """What the check found for `model` on `device`, tested under `plan` at `size` px."""

    model: ModelIdentity
    device: DeviceIdentity
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
    cause: Cause | None = None
    loras: list[LoraIdentity] = field(default_factory=list)  # the LoRAs the check ran with
    # Every fix candidate the check re-ran, ranked per component, verified or not (kept also
    # when nothing was verified: the cause's kernel probe reuses their re-runs). Not reported.
    tried: list[fix_ranking.CandidateResult] = field(default_factory=list, repr=False)
    # The failed components no precision setting made finite and right (in run order): what a
    # broken verdict is about. Not reported (each one's status is).
    unfixed: list[str] = field(default_factory=list, repr=False)
    # What of the fix remembered for the model the check ran with (`job_plans.remembered_ran`):
    # a fix it proves is remembered with it, since its proof stood on it. Not reported.
    remembered_ran: dict[str, SettingValue] = field(default_factory=dict, repr=False)
    # Quantized weights that decode wrongly: a loader's or a conversion's fault, told apart
    # from overflow.
    weights_bad_quantized: list[QuantFinding] = field(default_factory=list)
    # The path the check ran (`pictures.Mode`'s word) and the files it read for it: the input
    # pictures, then the mask.
    mode: str = "txt2img"
    pictures: list[str] = field(default_factory=list)
    # What the check's copies held on the device (None: a report made without a check).
    memory: CheckMemory | None = None
    # What the check did, counted (None: a report made without a check).
    work: Work | None = None
    # comfy-kitchen's int8 kernels at the shapes of the model's layers stored int8, on the
    # checked device (`precision.lowbit`): None for a model with none or without comfy-kitchen.
    low_bit_kernels: LowBitReport | None = None

    @property
    def headline(self) -> str:
        """The report's first line: what the user most needs to know, never a bare "healthy"
        when a component would overflow at the precision the user is likely to move to."""
        return headline(self)

    def to_json(self) -> dict[str, Any]:
        return {
            "halfsafe": __version__,
            "model": self.model.check_json(),
            "device": self.device.to_json(),
            "tested": self.plan.tested(),
            "tested_layers": layer_words(self.plan),
            "weights": {
                "non_finite": self.weights_non_finite,
                "bad_quantized": [f.to_json() for f in self.weights_bad_quantized],
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
            "mode": self.mode,
            "pictures": list(self.pictures),
            "memory": self.memory.to_json() if self.memory is not None else {},
            "work": self.work.to_json() if self.work is not None else None,
            "timesteps": list(self.timesteps),
            "notes": self.notes,
            "versions": self.versions,
            "low_bit_kernels": (
                self.low_bit_kernels.to_json() if self.low_bit_kernels is not None else None
            ),
        }


@dataclass(frozen=True)
class CheckResult:
    """A finished health check as the app shows it: the report, its Markdown form (what
    Export and Copy give the user), and the checked model's summary after it (with the fix
    the check remembered for it, which the next job uses), when the engine holds that model."""

    report: HealthReport
    markdown: str
    model: ModelSummary | None = None


def _finite_or_none(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def status_words(component: ComponentReport) -> str:
    """A component's status in the report's words; a component fed non-finite input that did
    not fail on its stand-in is named as fed, not by a status of its own."""
    if component.fed_by is not None and not component.status.failed:
        return f"fed non-finite input by {component.fed_by}"
    return STATUS_WORDS[component.status]


def precision_words(component: ComponentReport, kept_wider: int = 0) -> str:
    """'fp16 overflows (predicted), bf16 ok (measured)' for one component; where it ran with
    `kept_wider` layers out of its dtype (a layer fix), its own dtype's outcome is measured
    with them: 'fp16 with 2 layers kept wider ok (measured)', not plain fp16's."""
    said = []
    for dtype, o in component.precisions.items():
        name = dtype
        if kept_wider and o.measured and dtype == component.dtype:
            name = f"{dtype} with {kept_wider} layer{'s' if kept_wider != 1 else ''} kept wider"
        status = STATUS_WORDS[o.status].lower()
        said.append(f"{name} {status} ({'measured' if o.measured else 'predicted'})")
    return ", ".join(said)


def _factor(peak: float | None) -> str:
    """' 27x', ' 402,000x': by how much a peak passes 65504 ('' when it does not)."""
    if not peak or peak <= FP16_MAX:
        return ""
    ratio = peak / FP16_MAX
    return f" {ratio:.2g}x" if ratio < 10 else f" {float(f'{ratio:.3g}'):,.0f}x"


def damaged_files(report: HealthReport) -> list[str]:
    """The files holding the weights with NaN or Inf: for a component read from a companion
    file (a split transformer's T5, VAE, ...) that file, else the model the user gave."""
    companions, source = report.model.companions, report.model.source
    files: list[str] = []
    for name in report.weights_non_finite:
        file = companions.get(component_of_tensor(name) or "", source)
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
                f"Broken: quantized weight {first.tensor} {first.problem}; this is the "
                "file's quantisation, not fp16 overflow, and no precision setting repairs it."
            )
        if report.weights_non_finite:
            bad = report.weights_non_finite
            named = f" ({bad[0]}{f' and {len(bad) - 1} more' if len(bad) > 1 else ''})"
            files = damaged_files(report)
            if files == [report.model.source]:
                return (
                    f"Broken: the weights hold NaN or Inf values{named}; no precision setting "
                    "can repair this file."
                )
            return (
                f"Broken: the weights in {join_words(files)} hold NaN or Inf values{named}; no "
                f"precision setting can repair {'that file' if len(files) == 1 else 'them'}."
            )
        failed = [n for n, c in components.items() if c.status.failed]
        unfixed = report.unfixed or failed or list(components)
        return (
            f"Broken: the {join_words(unfixed)} {'gives' if len(unfixed) == 1 else 'give'} no "
            "finite output that agrees with fp32 under any precision setting."
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
        keep = {setting_word(advice.settings, COMPONENTS[n].setting) for n in advice.overflowing}
        basis = "measured" if advice.measured else "predicted from this run"
        keep_only = (
            f"keep only the {join_words(advice.overflowing)} in {' or '.join(sorted(keep))} "
            "and run the rest in fp16"
        )
        if report.device.kind == "cpu":
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
