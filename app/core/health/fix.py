"""The search for a fix of a component that went non-finite: its candidates
(`fix_candidates.candidate_fixes`: backend switches, clamps, layer-level precision islands, the
component wider) re-run on that component alone, judged finite or not and against the fp32
reference, the cheapest accepted without timing any (`fix_ranking.rank_candidates`: memory,
predicted steps where they are apart, else what each holds and changes): only those that can
still win before the fix is named, the rest for the table after (`CandidateTable`); the rows
that are the call the fix's cost timed take its figures (`take_timed`); everything in fp32 as
the last resort; the fix in one sentence."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from typing import Any

from app.core.components import in_run_order, join_words, module_of
from app.core.components import words as component_words
from app.core.errors import CancelledError
from app.core.fixing import fix_candidates, fix_ranking
from app.core.fixing.fix_candidates import FixCandidate, candidate_fixes
from app.core.fixing.quality import QUALITY_CEILING_DB, Quality, compare
from app.core.health import step_work
from app.core.health.observations import Observations, component_report
from app.core.health.stages import Runner
from app.core.jobs import CancelToken, ProgressCallback
from app.core.memory import is_out_of_memory
from app.core.precision import PrecisionPlan
from app.core.precision.placement import generation_held_mb
from app.core.run.stage_cost import StageCost, StepCost
from app.core.run.timing import only
from app.core.run.watchers import Stage, counted_module

# Candidates that can no longer be ranked first are not run before the fix is named
# (`fix_ranking.Pruning`); False runs every one first, as the pruning's answers are tested.
PRUNE_CANDIDATES = True


@dataclass
class Search:
    """The fix search's running state across the stages."""

    plan: PrecisionPlan  # every fix found so far, on top of the tested plan
    settings: dict[str, Any] = field(default_factory=dict)
    words: list[str] = field(default_factory=list)
    qualities: dict[str, Quality] = field(default_factory=dict)  # per repaired component
    rejected: list[str] = field(default_factory=list)  # finite but wrong: never a fix
    unfixed: list[str] = field(default_factory=list)
    candidates: list[fix_ranking.CandidateResult] = field(default_factory=list)  # ranked
    # Per failing component, the baselines its rows are told against (no-half, where the fix's
    # cost timed it on that component's call: `take_timed`).
    baselines: dict[str, dict[str, StageCost]] = field(default_factory=dict)
    # Per failing component, its candidates' table, finished after the fix is named.
    tables: list[CandidateTable] = field(default_factory=list)

    def accept(self, candidate: FixCandidate) -> None:
        self.plan = candidate.plan
        self.settings.update(candidate.settings)
        self.words.append(candidate.words)

    def finish(self, progress: ProgressCallback, cancel: CancelToken, complete: bool = True) -> int:
        """Every table finished (`CandidateTable.finish`), in the order the components failed:
        the ranked candidates and the rejections, as a search that ran every candidate before
        choosing gives them; without `complete`, of the candidates run to prove the fix alone.
        Returns how many candidates were left untried."""
        untried = 0
        for table in self.tables:
            untried += table.finish(progress, cancel, complete)
            self.candidates.extend(table.ranked)
            self.rejected.extend(table.rejected())
        self.tables.clear()
        return untried


@dataclass
class _Entry:
    """One candidate of a table: its place in `FIX_KINDS` order, and once run its result (and
    the stage it ran, kept while it may be the fix) or why it failed to run."""

    index: int
    candidate: FixCandidate
    result: fix_ranking.CandidateResult
    ran: bool = False
    failed_to_run: str | None = None
    retry: Stage | None = None
    observed_ms: float | None = None  # a call of the component in its verification run


class CandidateTable:
    """The candidate fixes of one failing component (`fix_candidates.FIX_KINDS`), verified in the
    order the ranking prefers them (`fix_ranking.verification_order`): those that can still win
    first (`fix_ranking.Pruning`), each stopped at its first non-finite call, and on a device
    whose steps are predicted, each verified one's step predicted from its work. Nothing is
    timed. The best is the fix; `finish` then runs the rest for the
    table, after the fix is reported."""

    def __init__(
        self,
        name: str,
        stage_fn: Callable[[PrecisionPlan, bool], Stage],
        search: Search,
        reference: Stage,
        runner: Runner,
        seen: Observations,
        candidates: list[FixCandidate],
    ) -> None:
        self.name = name
        self.stage_fn = stage_fn
        self.tested = search.plan
        self.reference = reference
        self.runner = runner
        self.seen = seen
        pipeline = runner.host.parts  # each component's loaded module, by its name
        self.entries = [
            _Entry(index, candidate, unrun_result(name, candidate, pipeline, search.plan))
            for index, candidate in enumerate(candidates)
        ]
        self.ranked: list[fix_ranking.CandidateResult] = []
        self.tried = 0  # candidates run so far, for the progress line
        self.finishing = False  # the fix is named: the rest runs for the table alone
        # The device's dtype table where predictions are used there, and the work of one call
        # of the component (`step_work.call_flops`), counted from a verification run's call.
        # The ranking's predictions, whether or not the fix is timed after: a check that is not
        # priced (`--quick`, a generation's) names the fix a priced one names.
        self.speed = step_work.device_speed(runner.device)
        self.flops: dict[str, dict[str, float]] | None = None
        self.predicted: set[int] = set()  # the entries ranked by their predictions, counted

    def choose(self, progress: ProgressCallback, cancel: CancelToken) -> _Entry | None:
        """Run the candidates that can still win, predict the steps of those verified, and
        return the best (None: nothing verified)."""
        by_result = {id(e.result): e for e in self.entries}
        pruning = fix_ranking.Pruning(
            self.speed is not None, lambda r: self.foreseen(by_result[id(r)])
        )
        order = fix_ranking.verification_order([e.result for e in self.entries])
        for at, result in enumerate(order):
            entry = by_result[id(result)]
            if PRUNE_CANDIDATES and not pruning.could_win(result, order[at + 1 :]):
                continue
            self.run(entry, progress, cancel)
            pruning.add(entry.result)
        self.predict_verified()
        ranked = fix_ranking.rank_candidates([e.result for e in self.entries if e.ran])
        if not ranked or not ranked[0].verified:
            return None
        return by_result[id(ranked[0])]

    def run(self, entry: _Entry, progress: ProgressCallback, cancel: CancelToken) -> None:
        """One candidate's re-run of the stage, stopped at its first non-finite call, judged
        finite or not and against the fp32 reference."""
        cancel.raise_if_cancelled()
        candidate = entry.candidate
        trying = "Completing the table, trying" if self.finishing else "Trying a fix:"
        progress(f"{trying} {candidate.words}", self.tried, len(self.entries))
        self.tried += 1
        entry.ran = True
        try:
            with (
                self.runner.stopping_at_bad(self.name) if PRUNE_CANDIDATES else nullcontext(),
                self.catching() as caught,
            ):
                stage = self.stage_fn(candidate.plan, True)
            retry = self.seen.add(stage, candidate.plan)
        except CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - any failure of a candidate drops it alone
            if is_out_of_memory(error):  # not the candidate's fault: the job stops, said once
                raise
            entry.failed_to_run = (
                f"{_sentence_case(candidate.words)} failed to run ({_error_words(error)}): "
                "not a fix."
            )
            return
        finite = not retry.probes[self.name].non_finite
        entry.result.finite = finite
        entry.result.quality = compare(retry.output, self.reference.output) if finite else None
        if entry.result.verified:
            entry.retry = retry
            self.observe(entry, stage, caught)

    def catching(self):
        """Where predictions are made, the component's calls caught (`step_work.first_call`)
        until its work is counted; else nothing."""
        if self.speed is None:
            return nullcontext(None)
        return step_work.first_call(type(self._counted()))

    def _counted(self):
        """The module whose calls are the component's (`counted_module`) in the loaded one."""
        return counted_module(self.name, self.runner.host.loaded(self.name))

    def observe(self, entry: _Entry, stage: Stage, caught) -> None:
        """The time a call of the component took in `entry`'s verification run, and the work
        of such a call, counted once from the first one caught."""
        if caught is None or not caught.calls:
            return
        entry.observed_ms = stage.seconds.get(self.name, 0.0) * 1000 / caught.calls
        if self.flops is None:
            part = self.runner.host.loaded(self.name)
            self.flops = step_work.call_flops(part, self._counted(), caught) or {}

    def foreseen(self, entry: _Entry) -> StageCost | None:
        """`entry`'s cost with its step predicted before it runs, as `predict_verified` will
        predict it once verified (or with none where the work of a call was not counted:
        then none is); None while that work is not counted yet (no verified run so far)."""
        cost = entry.result.cost
        if self.speed is None or self.flops is None or cost is None:
            return None
        if not self.flops or cost.predicted_ms is not None:
            return cost
        seconds = step_work.plan_seconds(
            self.speed,
            self.flops,
            self.runner.host.parts,
            entry.candidate.plan,
            module_of(self.name),
        )
        if seconds is None:
            return cost
        error = step_work.PREDICTION_ERROR[self.runner.device.type]
        return replace(cost, predicted_ms=round(seconds * 1000, 2), predicted_error=error)

    def predict_verified(self) -> None:
        """Each verified entry with its step predicted from the work at the device's rates
        (`step_work.plan_seconds`) where the work explains enough of its observed call
        (`step_work.EXPLAINED`), with the error measured on the device's kind; each one
        predicted is counted (`predicted_costs`)."""
        from app.core import work

        if self.speed is None or not self.flops:
            return
        error = step_work.PREDICTION_ERROR[self.runner.device.type]
        pipeline = self.runner.host.parts
        for entry in self.entries:
            cost, observed = entry.result.cost, entry.observed_ms
            if not entry.result.verified or cost is None or cost.predicted_ms is not None:
                continue
            if not observed:
                continue
            seconds = step_work.plan_seconds(
                self.speed, self.flops, pipeline, entry.candidate.plan, module_of(self.name)
            )
            if seconds is None or seconds * 1000 < step_work.EXPLAINED * observed:
                continue
            entry.result.cost = replace(
                cost, predicted_ms=round(seconds * 1000, 2), predicted_error=error
            )
            work.add("predicted_costs")

    def finish(self, progress: ProgressCallback, cancel: CancelToken, complete: bool = True) -> int:
        """The table as a search that ran every candidate gives it: the candidates the fix
        needed no run of, run now (unless not `complete`: then the table holds those run to
        prove it), the verified ones' steps predicted; every candidate ranked, the chosen one
        first. Returns how many were left untried."""
        self.finishing = True
        for entry in self.entries:
            if complete and not entry.ran:
                self.run(entry, progress, cancel)
            entry.retry = None  # the fix's stage was handed on: nothing here needs one
        self.predict_verified()
        chosen = [e.result for e in self.entries if e.result.chosen]
        self.ranked = fix_ranking.rank_candidates(
            [e.result for e in self.entries if e.ran and not e.failed_to_run]
        )
        # `fix_ranking.Pruning` ranks the fix first where the memory ranked is the plan's, known
        # before a run; were it not, the fix still heads the table.
        if chosen and self.ranked[0] is not chosen[0]:
            self.ranked.remove(chosen[0])
            self.ranked.insert(0, chosen[0])
        return sum(1 for e in self.entries if not e.ran)

    @property
    def has_verified(self) -> bool:
        """Whether any candidate was verified."""
        return any(e.result.verified for e in self.entries)

    def rejected(self) -> list[str]:
        """The notes on candidates that are no fix: those that failed to run, in `FIX_KINDS`
        order, then those finite but wrong, best first."""
        notes = [e.failed_to_run for e in self.entries if e.failed_to_run]
        for r in self.ranked:
            if r.finite and not r.verified and r.quality is not None:
                notes.append(
                    f"{_sentence_case(r.words)} gave finite output that differs from the fp32 "
                    f"reference ({r.quality.words()}): not a fix."
                )
        return notes


def unrun_result(
    name: str, candidate: FixCandidate, pipeline, tested: PrecisionPlan
) -> fix_ranking.CandidateResult:
    """A candidate's row before it runs: what it is, the memory its plan holds and the layers
    it changes from the `tested` plan."""
    return fix_ranking.CandidateResult(
        component=name,
        kind=candidate.kind,
        words=candidate.words,
        settings=dict(candidate.settings),
        modules=len(candidate.plan.islands(name))
        + len(candidate.plan.clamps.get(module_of(name), ())),
        finite=False,
        quality=None,
        cost=StageCost(round(generation_held_mb(pipeline, candidate.plan), 2)),
        candidate=candidate,
        layers_changed=layers_changed(pipeline, name, tested, candidate.plan),
    )


def layers_changed(pipeline, name: str, tested: PrecisionPlan, plan: PrecisionPlan) -> int:
    """The layers of the failing component `name` (a pipeline name; the VAE's encoder is the
    VAE) whose precision `plan` changes from the `tested` one: every layer holding weights where
    the part runs in another dtype, else those it keeps in another dtype or clamps beyond the
    tested plan's; none for a switch (attention, sums)."""
    part = module_of(name)
    module = getattr(pipeline, part, None)
    if module is not None and plan.dtypes.get(part) != tested.dtypes.get(part):
        return sum(1 for _, m in module.named_modules() if any(True for _ in m.parameters(False)))
    islands, before = plan.islands(part), tested.islands(part)
    kept = sum(1 for path, dtype in islands.items() if before.get(path) != dtype)
    clamped = set(plan.clamps.get(part, ())) - set(tested.clamps.get(part, ()))
    return kept + len(clamped)


def take_timed(
    search: Search,
    name: str,
    timed: dict[str, tuple[PrecisionPlan | None, StepCost]],
) -> dict[str, StageCost]:
    """The figures the fix's cost timed on the component `name`'s call (`timed`: label -> the
    plan it ran as the check runs it, None where a generation places it otherwise, and its
    cost) given to the rows of `name`'s table that are that same call: the chosen fix where it
    is placed as it was timed, a candidate that runs the part as no-half does. Nothing is run;
    the choice stays as it was. Returns the baselines of `name` (no-half), as the table shows
    them."""
    rows = [c for c in search.candidates if c.component == name and c.verified and c.candidate]
    if not rows:
        return {}
    for plan, cost in timed.values():
        if plan is None:
            continue
        for row in rows:
            assert row.candidate is not None
            if row.cost is None or row.cost.step_ms is not None:
                continue
            if only(row.candidate.plan, [name]) != only(plan, [name]):
                continue
            whole = row.candidate.plan == plan  # its peak too, else the part's call alone
            row.cost = replace(
                row.cost,
                step_ms=cost.step_ms,
                step_ms_range=cost.step_ms_range,
                rounds=cost.rounds,
                peak_memory_mb=cost.peak_memory_mb if whole else None,
            )
    if "no_half" not in timed:
        return {}
    _, cost = timed["no_half"]
    return {
        "no_half": StageCost(
            cost.weights_mb, cost.step_ms, cost.step_ms_range, cost.rounds, cost.peak_memory_mb
        )
    }


def choose_fix(
    name: str,
    stage_fn: Callable[..., Stage],
    search: Search,
    reference: Stage,
    runner: Runner,
    seen: Observations,
    first_bad: str | None,
    bf16_native: bool,
    progress: ProgressCallback,
    cancel: CancelToken,
) -> Stage | None:
    """Find the fix for the failing component `name` among its candidates
    (`fix_candidates.FIX_KINDS`, `CandidateTable`): each re-run is judged finite or not and against
    the fp32 reference (`reference`, recorded, so its per-layer peaks draw the islands); nothing
    is timed. The best verified one (`fix_ranking.rank_candidates`) is accepted; the stage it ran is returned (None:
    nothing verified). The table is finished later (`Search.finish`)."""
    # The candidates read the component's layers; the loaded model has the same ones, and
    # holding the tested copy here would keep it alive beside every candidate's copy.
    candidates = list(
        candidate_fixes(
            module_of(name),  # the VAE's encoder is fixed by the VAE's fixes
            search.plan,
            first_bad,
            runner.host.loaded(name),
            bf16_native,
            reference.probes.get(name),
        )
    )
    table = CandidateTable(name, stage_fn, search, reference, runner, seen, candidates)
    search.tables.append(table)
    best = table.choose(progress, cancel)
    if best is None or best.retry is None:
        return None
    best.result.chosen = True
    search.accept(best.candidate)
    if best.result.quality is not None:
        search.qualities[name] = best.result.quality
    return best.retry


def last_resort(runner, search, seen, reports, first_probes, plan, broken, progress, cancel):
    """The whole model in fp32, re-run end to end, when no single-component fix worked."""
    if not search.unfixed or broken or all(d == "fp32" for d in plan.dtypes.values()):
        return
    cancel.raise_if_cancelled()
    progress("Trying a fix: everything in fp32", 2, 3)
    candidate = fix_candidates.everything_fp32(search.plan)
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


def candidate_summary(candidate: fix_ranking.CandidateResult) -> str:
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
