"""The check's words for plain facts, shared by the CLI text, the GUI and the Markdown report:
the status table, a plan's precisions and layer islands, settings as CLI flags, the cost of a
fix against no-half, and the table of fix candidates (read from the fix's JSON form)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from app.core.components import Status, Verdict
from app.core.fixing.fix_ranking import CandidateResult, passed_over, timed_faster
from app.core.health.cost import FixCost, StepCost
from app.core.precision import PrecisionPlan
from app.core.run.stage_cost import StageCost
from app.core.settings import FIELDS, modules_by_component

# One word table per concept, for the terminal, the Markdown report and the window alike.
STATUS_WORDS = {
    Status.OK: "ok",
    Status.AT_RISK: "close to the fp16 limit",
    Status.OVERFLOW: "overflows",
    Status.NAN: "goes NaN",
    Status.BROKEN_WEIGHTS: "damaged weights",
}
VERDICT_WORDS = {
    Verdict.HEALTHY: "Healthy at the tested settings: nothing overflowed.",
    Verdict.FIXABLE: "Fixable: an output went inf or NaN, and a verified fix was found.",
    Verdict.BROKEN: "Broken: no precision setting gives finite output that agrees with fp32.",
}


def headroom_words(headroom: float | None, status: Status) -> str:
    """A component's headroom below fp16's limit (65,504) in one sentence."""
    if status in (Status.OVERFLOW, Status.NAN):
        return "No headroom: values went past the fp16 limit of 65,504."
    if status is Status.BROKEN_WEIGHTS:
        return "The stored weights already hold NaN or infinite values."
    if headroom is None:
        return "Headroom: not measured."
    if headroom >= 10:
        return f"Headroom: {headroom:,.0f}x below the fp16 limit; safe."
    if headroom < 1:
        # Measured wider than fp16 (fp32 or bf16), the values passed 65,504: fp16 would overflow.
        return (
            f"No headroom in fp16: values reached {1 / headroom:.2g}x the fp16 limit of 65,504; "
            "fp16 would overflow."
        )
    return f"Headroom: only {headroom:.2g}x below the fp16 limit; close to overflowing."


def layer_words(plan: PrecisionPlan) -> list[str]:
    """'with 3 VAE layers in fp32', 'with 1 UNet layer clamped': the plan's module islands and
    clamps, per component and dtype (the T5 feed-forward islands included)."""
    from app.core.precision.words import layer_count_words

    words_: list[str] = []
    for component in plan.dtypes:
        by_dtype: dict[str, int] = {}
        for dtype in plan.islands(component).values():
            by_dtype[dtype] = by_dtype.get(dtype, 0) + 1
        for dtype, count in by_dtype.items():
            words_.append(f"with {layer_count_words(count, component)} in {dtype}")
        clamped = len(plan.clamps.get(component, ()))
        if clamped:
            words_.append(f"with {layer_count_words(clamped, component)} clamped")
    return words_


def tested_words(plan: PrecisionPlan) -> str:
    """'fp32 everywhere', 'fp16, VAE in fp32', 'fp16, with 2 VAE layers in fp32': the
    precisions a check ran with, in the one words table (`precision.words.plan_words`)."""
    from app.core.precision.words import plan_words

    return plan_words(plan)


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


# What one priced call of a part is called (`StepCost.component`), by the part's role.
CALL_WORDS = {"denoiser": "{part} step", "vae": "VAE decode", "other": "{part} call"}


def call_words(cost: StepCost) -> str:
    """'UNet step', 'VAE decode', 'text encoder call': the call a `StepCost` times."""
    from app.core.components import words as component_words

    key = "vae" if cost.component == "vae" else "other"
    key = "denoiser" if cost.per_denoiser_step else key
    return CALL_WORDS[key].format(part=component_words(cost.component))


def cost_words(cost: StepCost) -> str:
    """'61.0 ms per UNet step (59.5-63.0 over 5 runs), 7100 MB peak, 5300 MB of weights'."""
    parts = [
        f"{cost.step_ms:.1f} ms per {call_words(cost)} ({cost.step_ms_range[0]:.1f}-"
        f"{cost.step_ms_range[1]:.1f} over {cost.rounds} runs)"
    ]
    if cost.peak_memory_mb is not None:
        parts.append(f"{cost.peak_memory_mb:.0f} MB peak")
    parts.append(f"{cost.weights_mb:.0f} MB of weights")
    return ", ".join(parts)


# Beside a comparison with no-half timed from the stored weights (`FixCost.no_half_as_checked`):
# its figure is the check's, and a generation holding an fp32 copy skips the cast.
NO_HALF_AS_CHECKED_WORDS = (
    "No-half was timed as the check runs it, computing from the stored weights; a --no-half "
    "generation holds an fp32 copy instead, which skips that cast and may run faster."
)


def cost_comparison(cost: FixCost, fix_settings: Mapping[str, Any] | None = None) -> str:
    """One sentence comparing the fix's step time with no-half's, honest about noise: the two
    are told apart when they differ by 10% or more and one's median lies outside the other's
    range of runs (a load spike stretches a range but hardly moves a median); otherwise the
    sentence says the measurement cannot tell them apart, with both figures. For a fix whose
    `fix_settings` leave the denoiser as the settings run it, a second sentence says the times
    are that against fp32, not the fix's own cost."""
    said = _step_comparison(cost)
    if said and cost.no_half_as_checked:
        said += " " + NO_HALF_AS_CHECKED_WORDS
    denoiser_priced = cost.fix.per_denoiser_step
    if (
        said
        and denoiser_priced
        and fix_settings is not None
        and not _touches_denoiser(fix_settings)
    ):
        said += (
            " The fix leaves the denoiser as your settings run it, so these step times compare "
            "that with fp32, not the fix's own cost."
        )
    return said


def _touches_denoiser(settings: Mapping[str, Any]) -> bool:
    """Whether a fix's settings change the denoiser: the base precision, no-half, the
    denoiser's own setting, or layer lists naming its layers."""
    from app.core.components import COMPONENTS, Role

    denoisers = {c.name for c in COMPONENTS.values() if c.role is Role.DENOISER}
    setting = {COMPONENTS[name].setting for name in denoisers}
    for key, value in settings.items():
        if key in ("precision", "no_half", *setting):
            return True
        if isinstance(value, (list, tuple)) and any(
            str(entry).partition(":")[0] in denoisers for entry in value
        ):
            return True
    return False


def _step_comparison(cost: FixCost) -> str:
    fast, slow = cost.fix.step_ms, cost.no_half.step_ms
    if not fast or not slow:
        return ""
    per = f"Per {call_words(cost.fix)}"
    fix_range, half_range = cost.fix.step_ms_range, cost.no_half.step_ms_range
    outside = not half_range[0] <= fast <= half_range[1] or not fix_range[0] <= slow <= fix_range[1]
    if not outside or max(fast, slow) < 1.1 * min(fast, slow):
        return (
            f"{per} the fix ({fast:.0f} ms) and no-half ({slow:.0f} ms) could not be "
            "told apart: their runs varied more than they differ."
        )
    if slow > fast:
        return f"{per} the fix was {slow / fast:.2g}x as fast as no-half."
    return f"{per} the fix was {fast / slow:.2g}x as slow as no-half on this device."


# Where a part that went non-finite has its largest value from: its own run held no finite
# value that large, the run with its fix did.
FROM_THE_FIX_WORDS = "on the run that fixed it"


def largest_words(component) -> str:
    """A part's largest value as a table cell: '3.88e+05 (on the run that fixed it)' for one
    that went non-finite."""
    value = component.max_abs
    if value is None:
        return "-"
    said = f"{value:.3g}"
    return f"{said} ({FROM_THE_FIX_WORDS})" if component.status.failed else said


# What "ms per run" times: a candidate's component once (its median over the alternating
# rounds, and their spread), computed from the stored weights as the fix search runs every
# candidate. The chosen fix's cost is timed again as a generation places it (`cost.price_fix`:
# a copy in its dtype where the budget has room), so the two figures of one fix can differ.
RUN_WORDS = (
    "ms per run: one step of the denoiser, one whole run of a text encoder or the VAE (the "
    "median, then the fastest and slowest of its runs), each candidate computed from the "
    "stored weights as the check runs it; the fix's cost is timed again as your generation "
    "places it, so the two can differ"
)

CANDIDATE_COLUMNS = (
    "component",
    "candidate",
    "layers",
    "quality",
    "result",
    "ms per run",
    "peak MB",
    "weights MB",
)


# Why a verified candidate was not chosen (`fix_ranking.passed_over`), said in its result cell.
PASSED_OVER_WORDS = {
    "memory": "verified; holds more memory",
    "slower": "verified; not faster",
    "noise": "verified; faster only within the noise",
    "margin": "verified; faster by less than a tenth",
    "order": "verified; kept out by the table's order",
    "cost_order": "verified; after it by the memory held, the layers changed or the table's order",
    "timed_faster": "verified; timed faster after the fix was proved (the fix stays)",
}


def timed_faster_notes(candidates: Sequence[CandidateResult]) -> list[str]:
    """A note for each verified candidate timed a tenth faster than the chosen fix beyond the
    noise after the fix was proved (`fix_ranking.timed_faster`): both figures, and why the fix
    stays the one applied."""
    notes = []
    for component in dict.fromkeys(c.component for c in candidates):
        mine = [c for c in candidates if c.component == component]
        chosen = next((c for c in mine if c.chosen), None)
        if chosen is None or chosen.cost is None or chosen.cost.step_ms is None:
            continue
        for c in mine:
            if c.chosen or c.cost is None or c.cost.step_ms is None or not timed_faster(c, chosen):
                continue
            notes.append(
                f"Timed after the fix was proved, {c.words} ran faster than the fix "
                f"({c.cost.step_ms:.1f} against {chosen.cost.step_ms:.1f} ms per run). The fix "
                "was chosen before anything was timed, from what each holds and changes, and "
                "stays the one applied; the other is verified too and can be applied instead."
            )
    return notes


def _result_words(candidate: CandidateResult, chosen: CandidateResult | None) -> str:
    if candidate.chosen:
        return "chosen"
    if candidate.verified:
        if chosen is None:
            return "verified"
        return PASSED_OVER_WORDS[passed_over(candidate, chosen)]
    if candidate.finite:
        return "rejected: differs from fp32"
    return "rejected: not finite"


def _ms(cost: StageCost | None) -> str:
    step = cost.step_ms if cost is not None else None
    if cost is not None and step is None and cost.predicted_ms is not None:
        return f"{cost.predicted_ms:.1f} (predicted)"  # ranked by it, not timed
    if cost is None or step is None:
        return "-"
    spread = cost.step_ms_range
    return f"{step:.1f} ({spread[0]:.1f}-{spread[1]:.1f})" if spread else f"{step:.1f}"


def _mb(value: Any) -> str:
    return "-" if value is None else f"{value:.1f}"


def candidate_rows(
    candidates: Sequence[CandidateResult],
    baselines: Mapping[str, Mapping[str, StageCost]],
) -> list[tuple[str, ...]]:
    """A fix's candidates as table rows (`CANDIDATE_COLUMNS`), ranked, each failing
    component's measured baselines (its tested plan, no-half) after its candidates: the one
    table the CLI, the Markdown report and the GUI show."""
    rows: list[tuple[str, ...]] = []
    for component in dict.fromkeys(c.component for c in candidates):
        mine = [c for c in candidates if c.component == component]
        chosen = next((c for c in mine if c.chosen), None)
        for c in mine:
            rows.append(
                (
                    component,
                    c.words,
                    str(c.modules or "-"),
                    c.quality.figure() if c.quality else "-",
                    _result_words(c, chosen),
                    _ms(c.cost),
                    _mb(c.cost.peak_memory_mb if c.cost else None),
                    _mb(c.cost.weights_mb if c.cost else None),
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
                        _mb(cost.peak_memory_mb),
                        _mb(cost.weights_mb),
                    )
                )
    return rows
