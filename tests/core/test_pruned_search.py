"""The fix search that runs only the candidates that can still win (`fix_ranking.Pruning`) names
the fix the full ranking names: over random tables of memory, layers, verification, predictions
and times against `rank_candidates` on every candidate, and bit for bit on the planted corpus
against the search that runs every candidate to its end first, with one injected cost oracle."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from app.core import work
from app.core.fixing import fix_candidates, fix_ranking
from app.core.fixing.fix_ranking import CandidateResult, Pruning
from app.core.fixing.quality import Quality
from app.core.health import fix
from app.core.run.stage_cost import StageCost
from app.core.settings import PrecisionSettings
from tests.support import cost_oracle
from tests.support.check_answers import with_costs
from tests.support.planted_sd import FP16, PLANTS, check, loaded, plant
from tests.support.tiny_models import build_tiny_sd_pipeline

KINDS = [kind.name for kind in fix_candidates.FIX_KINDS]


def _random_table(rng: random.Random, predicting: bool) -> list[CandidateResult]:
    """Candidates of distinct kinds in `FIX_KINDS` order (as `candidate_fixes` yields them),
    each with a memory from a few values (ties, band edges), layers changed from a few (ties),
    finite or not, a quality on either side of the threshold, a time measured after the proof
    (overlapping or apart: never a rank's), and with `predicting` a predicted step (apart or
    inside the band, or none)."""
    kinds = sorted(rng.sample(KINDS, rng.randint(1, len(KINDS))), key=KINDS.index)
    if rng.random() < 0.2:
        kinds.append("unknown")  # a kind outside the table ranks after every known one
    table = []
    for kind in kinds:
        memory = rng.choice([100.0, 104.0, 109.0, 110.0, 110.1, 115.0, 200.0])
        finite = rng.random() < 0.7
        quality = Quality(rng.choice([5.0, 19.9, 25.0, 40.0])) if finite else None
        cost = StageCost(memory)
        if finite:
            ms = rng.choice([10.0, 10.5, 12.0, 20.0])
            spread = rng.choice([0.1, 1.0, 3.0])
            cost = StageCost(memory, ms, (ms - spread, ms + spread), 3)
        if predicting and finite and rng.random() < 0.8:
            predicted = rng.choice([5.0, 10.0, 10.5, 12.0, 20.0, 40.0])
            cost = replace(cost, predicted_ms=predicted, predicted_error=rng.choice([0.0, 0.6]))
        layers = rng.choice([0, 1, 2, 31])
        table.append(
            CandidateResult("unet", kind, kind, {}, 0, finite, quality, cost, layers_changed=layers)
        )
    return table


def _pruning(predicting: bool) -> Pruning:
    """The search's pruning over a table whose rows' predicted steps are known before they
    run, as a check's are once one candidate's work is counted (`CandidateTable.foreseen`)."""
    return Pruning(predicting, (lambda row: row.cost) if predicting else None)


def _pruned_best(table: list[CandidateResult], predicting: bool) -> CandidateResult | None:
    """The search's way: in `verification_order`, each candidate that can still win run (its
    row as measured), the others left. The best of what ran."""
    pruning = _pruning(predicting)
    ran = []
    order = fix_ranking.verification_order(table)
    for at, row in enumerate(order):
        if pruning.could_win(row, order[at + 1 :]):
            ran.append(row)
            pruning.add(row)
    ranked = fix_ranking.rank_candidates(ran)
    return ranked[0] if ranked and ranked[0].verified else None


@pytest.mark.parametrize("predicting", [False, True])
def test_the_pruning_names_the_full_rankings_best_on_random_tables(predicting):
    rng = random.Random(20261126 + predicting)
    skipped = 0
    for _ in range(5000):
        table = _random_table(rng, predicting)
        ranked = fix_ranking.rank_candidates(table)
        best = ranked[0] if ranked and ranked[0].verified else None
        assert _pruned_best(table, predicting) is best, [
            (r.kind, r.memory_mb(), r.layers_changed, r.verified, r.cost) for r in table
        ]
        pruning = _pruning(predicting)
        order = fix_ranking.verification_order(table)
        for at, row in enumerate(order):
            if pruning.could_win(row, order[at + 1 :]):
                pruning.add(row)
            else:
                skipped += 1
    # The pruning is no pruning unless it leaves candidates out: with predictions known before
    # a run, it leaves out those predicted no faster than one met before them.
    assert skipped > (9000 if predicting else 1000), skipped


def test_a_candidate_past_the_memory_band_cannot_win():
    least = CandidateResult("unet", "islands", "", {}, 0, True, Quality(40.0), StageCost(100.0))
    wide = CandidateResult(
        "unet", "component_fp32", "", {}, 0, True, Quality(40.0), StageCost(111.0)
    )
    later = CandidateResult("unet", "clamp", "", {}, 0, True, Quality(40.0), StageCost(100.0))
    pruning = Pruning(predicting=False)
    pruning.add(least)
    assert not pruning.could_win(wide)
    assert not pruning.could_win(later)  # unpredicted, what each holds and changes decides
    predicting = Pruning(predicting=True)
    predicting.add(least)
    assert predicting.could_win(later) and not predicting.could_win(wide)


def test_a_time_measured_never_ranks_a_candidate():
    """Two verified candidates alike in memory, the later in the table's order timed far
    faster: the ranking keeps the one first in what each holds and changes; a prediction
    apart beyond its band and error moves it."""
    first = CandidateResult(
        "unet",
        "islands",
        "",
        {},
        31,
        True,
        Quality(40.0),
        StageCost(100.0, 30.0, (29.0, 31.0), 3),
        layers_changed=31,
    )
    fast = CandidateResult(
        "unet",
        "component_bf16",
        "",
        {},
        0,
        True,
        Quality(40.0),
        StageCost(100.0, 5.0, (4.9, 5.1), 3),
        layers_changed=200,
    )
    assert fix_ranking.rank_candidates([fast, first])[0] is first
    assert fix_ranking.passed_over(fast, first) == "timed_faster"
    predicted = [
        replace(first, cost=replace(first.cost, predicted_ms=30.0, predicted_error=0.6)),
        replace(fast, cost=replace(fast.cost, predicted_ms=5.0, predicted_error=0.6)),
    ]
    assert fix_ranking.rank_candidates(predicted)[0] is predicted[1]


@pytest.mark.parametrize("precision", ["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("planted", list(PLANTS))
def test_the_pruned_search_gives_the_full_searchs_answers(monkeypatch, planted, precision):
    """Verdict, statuses, first bad layers, the fix, its quality, notes, and the whole table of
    candidates with their costs, under one cost oracle: the same whether the search runs every
    candidate to its end before choosing or only those that can still win."""
    cost_oracle.inject(monkeypatch)
    settings = PrecisionSettings(precision=precision)
    kwargs = {"measure_cost": True, "remember": False}
    pruned = check(loaded(PLANTS[planted](build_tiny_sd_pipeline()), "pruned"), settings, **kwargs)
    monkeypatch.setattr(fix, "PRUNE_CANDIDATES", False)
    full = check(loaded(PLANTS[planted](build_tiny_sd_pipeline()), "full"), settings, **kwargs)
    assert with_costs(pruned) == with_costs(full)
    assert pruned.work is not None and full.work is not None
    proved, full_proved = pruned.work.at("proved_fix"), full.work.at("proved_fix")
    assert (proved is None) == (full_proved is None)
    if proved is not None and full_proved is not None:  # no more calls to get there
        assert proved.calls_of("unet") <= full_proved.calls_of("unet")


def test_a_candidate_stops_at_its_first_non_finite_call():
    """The clamp candidate of a planted UNet overflow is still non-finite in the denoiser's
    first call: its run ends there (one call where the probe makes three), and its row says
    what a run to the end says."""
    calls: list[int] = []
    original = fix.CandidateTable.run

    def unet_calls() -> int:
        return (work.counted() or work.Work()).calls_of("unet")

    def counted_run(self, entry, progress, cancel):
        before = unet_calls()
        original(self, entry, progress, cancel)
        if entry.candidate.kind == "clamp":
            calls.append(unet_calls() - before)

    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(fix.CandidateTable, "run", counted_run)
        report = check(loaded(plant(build_tiny_sd_pipeline(), "unet_ff")), FP16, remember=False)
    (clamp,) = [c for c in report.tried if c.kind == "clamp"]
    assert calls == [1] and not clamp.finite and clamp.quality is None
