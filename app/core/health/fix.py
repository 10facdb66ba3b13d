"""The search for a fix of a component that went non-finite: every candidate
(`diagnosis.candidate_fixes`: backend switches, clamps, layer-level precision islands, the
component wider) re-run on that component alone, judged finite or not and against the fp32
reference, the verified ones timed on this device, the cheapest accepted
(`diagnosis.rank_candidates`); everything in fp32 as the last resort; the fix in one sentence."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from app.core.components import in_run_order, join_words, module_of
from app.core.components import words as component_words
from app.core.errors import CancelledError
from app.core.fixing import diagnosis
from app.core.fixing.diagnosis import FixCandidate, candidate_fixes, no_half
from app.core.fixing.quality import QUALITY_CEILING_DB, Quality, compare
from app.core.fixing.stage_cost import StageCost
from app.core.health.observations import Observations, component_report
from app.core.health.stages import Runner, Stage
from app.core.jobs import CancelToken, ProgressCallback
from app.core.memory import is_out_of_memory
from app.core.precision import PrecisionPlan
from app.core.precision.placement import generation_held_mb


@dataclass
class Search:
    """The fix search's running state across the stages."""

    plan: PrecisionPlan  # every fix found so far, on top of the tested plan
    settings: dict[str, Any] = field(default_factory=dict)
    words: list[str] = field(default_factory=list)
    qualities: dict[str, Quality] = field(default_factory=dict)  # per repaired component
    rejected: list[str] = field(default_factory=list)  # finite but wrong: never a fix
    unfixed: list[str] = field(default_factory=list)
    candidates: list[diagnosis.CandidateResult] = field(default_factory=list)  # ranked
    baselines: dict[str, dict[str, StageCost]] = field(default_factory=dict)

    def accept(self, candidate: FixCandidate) -> None:
        self.plan = candidate.plan
        self.settings.update(candidate.settings)
        self.words.append(candidate.words)


def choose_fix(
    name: str,
    stage_fn: Callable[[PrecisionPlan, bool], Stage],
    search: Search,
    reference: Stage,
    runner: Runner,
    seen: Observations,
    first_bad: str | None,
    bf16_native: bool,
    measure_cost: bool,
    progress: ProgressCallback,
    cancel: CancelToken,
) -> Stage | None:
    """Try every candidate fix for the failing component `name` (`diagnosis.FIX_KINDS`): each
    re-run is judged finite or not and against the fp32 reference (`reference`, recorded, so
    its per-layer peaks draw the islands); with `measure_cost` the verified ones are timed
    against the tested plan and no-half. The best verified one (`diagnosis.rank_candidates`)
    is accepted; the stage it ran is returned (None: nothing verified)."""
    results: list[diagnosis.CandidateResult] = []
    retries: dict[int, Stage] = {}
    # The candidates read the component's layers; the loaded model has the same ones, and
    # holding the tested copy here would keep it alive beside every candidate's copy.
    candidates = list(
        candidate_fixes(
            module_of(name),  # the VAE's encoder is fixed by the VAE's fixes
            search.plan,
            first_bad,
            getattr(runner.model.pipeline, module_of(name)),
            bf16_native,
            reference.probes.get(name),
        )
    )
    for tried, candidate in enumerate(candidates):
        cancel.raise_if_cancelled()
        progress(f"Trying a fix: {candidate.words}", tried, len(candidates))
        try:
            retry = seen.add(stage_fn(candidate.plan, True), candidate.plan)
        except CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - any failure of a candidate drops it alone
            if is_out_of_memory(error):  # not the candidate's fault: the job stops, said once
                raise
            search.rejected.append(
                f"{_sentence_case(candidate.words)} failed to run ({_error_words(error)}): "
                "not a fix."
            )
            continue
        finite = not retry.probes[name].non_finite
        quality = compare(retry.output, reference.output) if finite else None
        result = diagnosis.CandidateResult(
            component=name,
            kind=candidate.kind,
            words=candidate.words,
            settings=dict(candidate.settings),
            modules=len(candidate.plan.islands(name))
            + len(candidate.plan.clamps.get(module_of(name), ())),
            finite=finite,
            quality=quality,
            cost=StageCost(round(generation_held_mb(runner.model.pipeline, candidate.plan), 2)),
            candidate=candidate,
        )
        if finite:
            retries[id(result)] = retry
        results.append(result)
    verified = [r for r in results if r.verified]
    if measure_cost and verified:
        stage = f"Measuring the fixes for the {component_words(name)}"
        progress(stage, 0, 1)
        plans = {f"{i}": r.candidate.plan for i, r in enumerate(verified) if r.candidate}
        plans["as_tested"] = search.plan
        plans["no_half"] = no_half(search.plan)

        def measured(done: int, total: int) -> None:
            cancel.raise_if_cancelled()
            progress(stage, done, total)

        # Each candidate's stage ran to verify it, and the tested plan's in the first probe:
        # those runs were their warm-ups.
        warm = [label for label in plans if label != "no_half"]
        # The candidates race; the tested plan and no-half are the baselines a fix's cost is
        # told against, timed every round.
        race = [label for label in plans if label not in ("as_tested", "no_half")]
        costs = runner.stage_costs(name, stage_fn, plans, measured, warm, race)
        for i, r in enumerate(verified):
            r.cost = costs[f"{i}"]
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


def last_resort(runner, search, seen, reports, first_probes, plan, broken, progress, cancel):
    """The whole model in fp32, re-run end to end, when no single-component fix worked."""
    if not search.unfixed or broken or all(d == "fp32" for d in plan.dtypes.values()):
        return
    cancel.raise_if_cancelled()
    progress("Trying a fix: everything in fp32", 2, 3)
    candidate = diagnosis.everything_fp32(search.plan)
    full = candidate.plan
    encoded = seen.add(runner.encode(full), full)
    stages = dict(encoded.probes)
    if runner.encodes_pictures:
        stages.update(seen.add(runner.encode_picture(full), full).probes)
    unet = seen.add(runner.denoise(full, encoded.output), full)
    vae = seen.add(runner.decode(full, unet.output), full)
    stages.update({**unet.probes, **vae.probes})
    if any(p.non_finite for p in stages.values()):
        return
    search.plan, search.settings, search.words = full, dict(candidate.settings), [candidate.words]
    for name in search.unfixed:
        old = reports[name]
        reports[name] = component_report(
            name,
            old.dtype,
            first_probes[name],
            stages[name],
            old.seconds,
            runner.placed[name],
            False,
        )
        # Everything in fp32 is the reference itself.
        search.qualities[name] = Quality(QUALITY_CEILING_DB)
    search.unfixed = []


def fix_summary(
    failed: list[str],
    fix_words: list[str],
    tested: PrecisionPlan,
    fixed: PrecisionPlan,
    quality: Quality | None,
) -> str:
    steps = "; ".join(fix_words)
    kept = [
        c
        for c, d in tested.dtypes.items()
        if fixed.dtypes[c] == d and fixed.islands(c) == tested.islands(c)
    ]
    rest = (
        f" The {join_words(in_run_order(kept))} keep{'s' if len(kept) == 1 else ''} "
        f"{_their(kept)} precision."
        if kept
        else ""
    )
    proof = (
        f"Verified by re-running it with the fix: finite, and {quality.words()}."
        if quality is not None
        else "Not verified."
    )
    return f"The {join_words(in_run_order(failed))} overflowed; fix: {steps}. {proof}{rest}"


def candidate_summary(candidate: diagnosis.CandidateResult) -> str:
    """The sentence a fix the check verified but did not choose is remembered with, as the
    chosen one's (`fix_summary`): what failed, the fix and its measured agreement with fp32."""
    proof = (
        f"Verified by re-running it with the fix: finite, and {candidate.quality.words()}."
        if candidate.quality is not None
        else "Not verified."
    )
    failed = component_words(candidate.component)
    return f"The {failed} overflowed; fix: {candidate.words}. {proof}"


def _error_words(error: BaseException) -> str:
    """An exception in one short line: its type and the first line of its message."""
    first = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


def _sentence_case(text: str) -> str:
    return text[:1].upper() + text[1:]


def _their(parts: list[str]) -> str:
    return "its" if len(parts) == 1 else "their"
