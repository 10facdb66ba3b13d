"""What the check's runs measured, per component: its report (status, peak, headroom, the
first bad layer, the per-block peaks), what fp16 and bf16 would do there (measured where it
ran in them, else predicted from a wider run), and, for a healthy check run wider than fp16,
the advice for moving to fp16."""

from __future__ import annotations

import math
from typing import Any

from app.core.components import COMPONENTS, FP16_MAX, Status, in_run_order, module_of
from app.core.components import words as component_words
from app.core.fixing import layer_islands
from app.core.fixing.diagnosis import AT_RISK_HEADROOM, status_from_peak
from app.core.health.report import Advice, BlockPeak, ComponentReport, PrecisionOutcome
from app.core.precision import PlacedPipeline, PrecisionPlan
from app.core.run.probe import ProbeResult, top_blocks
from app.core.run.watchers import Stage

HALF_DTYPES = ("fp16", "bf16")


class Observations:
    """Every recorded run of every component, by dtype: what `precisions` is built from."""

    def __init__(self) -> None:
        self.runs: dict[str, dict[str, ProbeResult]] = {}
        # A component that failed as the user runs it and ran finite under the fixes found
        # for earlier parts: that run, which tells what a wider dtype would do.
        self.covered: dict[str, ProbeResult] = {}

    def add(self, stage: Stage, plan: PrecisionPlan) -> Stage:
        for name, probe in stage.probes.items():
            self.runs.setdefault(name, {}).setdefault(plan.dtype_of(name), probe)
        return stage

    def add_covered(self, name: str, probe: ProbeResult) -> None:
        """`name`'s finite run under the fixes found so far, where it failed as tested."""
        self.covered.setdefault(name, probe)

    def _finite(self, name: str) -> list[ProbeResult]:
        runs = [p for p in self.runs.get(name, {}).values() if not p.non_finite]
        return runs + ([self.covered[name]] if name in self.covered else [])

    def precisions(self, name: str, broken_weights: bool) -> dict[str, PrecisionOutcome]:
        runs = self.runs.get(name, {})
        finite = self._finite(name)
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
        finite = self._finite(name)
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


def component_report(
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
            first_bad.overflow or layer_islands.is_attention_overflow(first_bad.name, module)
        )
        status = Status.OVERFLOW if overflowed else Status.NAN
    else:
        status = Status.OK
    measured = verify if verify is not None else probe
    peak = measured.max_abs if not (measured.non_finite and verify is None) else None
    wider = None
    if dtype == "fp16" and verify is None and not probe.non_finite and probe.half_max_abs:
        # fp16's headroom is about the values fp16 held; a layer kept wider may carry more.
        peak = probe.half_max_abs
        wider = probe.max_abs if probe.max_abs > peak else None
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
        blocks=_blocks(probe, module, held_in_fp16=wider is not None) if module is not None else [],
        predicted_first_bad_module=over.name if over else None,
        wider_max_abs=wider,
    )


def _blocks(probe: ProbeResult, module, held_in_fp16: bool = False) -> list[BlockPeak]:
    """Per top-level block, in run order: the largest activation anywhere inside it (only
    those fp16 held, `held_in_fp16`, for a part run in fp16 with layers kept wider: the chart
    beside its card is about fp16's limit, as its largest value is)."""
    rows = []
    for name in top_blocks(module):
        stats = probe.modules.get(name)
        if stats is None:
            continue
        peak, non_finite = probe.within(name, held_in_fp16)
        if peak is not None and not math.isfinite(peak):  # past every float: drawn as non-finite
            peak, non_finite = None, True
        rows.append((stats.order, BlockPeak(name, peak or None, non_finite)))
    return [row for _, row in sorted(rows, key=lambda r: r[0])]


def predicted_islands(
    reports: dict[str, ComponentReport], probes: dict[str, ProbeResult], placed: PlacedPipeline
) -> dict[str, list[str]]:
    """For each component run wider than fp16 and predicted to overflow there, the layers to
    keep in fp32 (`layer_islands.overflow_islands` over the run's per-layer peaks)."""
    layers = {}
    for name, report in reports.items():
        fp16 = report.precisions.get("fp16")
        if report.dtype == "fp16" or fp16 is None or not fp16.status.failed:
            continue
        if name in placed and name in probes:
            found = layer_islands.overflow_islands(probes[name], placed[name])
            if found:
                layers[name] = found
    return layers


def fp16_advice(
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
    keep = "bf16" if bf16_native else "fp32"
    for name in reports:
        # A setting several parts share (Anima's conditioner and transformer) stays wide
        # where any of them would overflow.
        if name in overflowing:
            settings[COMPONENTS[name].setting] = keep
        else:
            settings.setdefault(COMPONENTS[name].setting, "fp16")
    measured = all(reports[n].precisions["fp16"].measured for n in wider)
    layer_settings: dict[str, Any] = {}
    layers = predicted_layers or {}
    if overflowing and all(n in layers for n in overflowing):
        layer_settings = {
            **settings,
            **{COMPONENTS[n].setting: "fp16" for n in overflowing},
            "fp32_modules": [
                f"{module_of(n)}:{p}" for n in in_run_order(overflowing) for p in layers[n]
            ],
        }
    return Advice(in_run_order(overflowing), settings, measured, layer_settings)


def at_fault(names: list[str], reports: dict[str, ComponentReport]) -> str | None:
    """The first of `names` (in run order) that failed on its own: damaged weights, or output
    that went non-finite and stayed so, unfed by another (None when none did)."""
    for name in in_run_order(names):
        report = reports.get(name)
        if report is not None and report.fed_by is None and report.status.failed:
            return name
    return None


def mark_fed_by(
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
