"""The fix search that runs only the candidates that can still win (`fix_ranking.Pruning`) names
the fix the full ranking names: over random tables of memory, verification and time against
`rank_candidates` on every candidate, and bit for bit on the planted corpus against the search
that runs every candidate to its end first, with one injected cost oracle."""

from __future__ import annotations

import random

import pytest

from app.core import work
from app.core.fixing import fix_candidates, fix_ranking
from app.core.fixing.fix_ranking import CandidateResult, Pruning
from app.core.fixing.quality import Quality
from app.core.fixing.stage_cost import StageCost
from app.core.health import fix
from app.core.settings import PrecisionSettings
from tests.support import cost_oracle
from tests.support.check_answers import with_costs
from tests.support.planted_sd import FP16, PLANTS, check, loaded, plant
from tests.support.tiny_models import build_tiny_sd_pipeline

KINDS = [kind.name for kind in fix_candidates.FIX_KINDS]


def _random_table(rng: random.Random, timed: bool) -> list[CandidateResult]:
    """Candidates of distinct kinds in `FIX_KINDS` order (as `candidate_fixes` yields them),
    each with a memory from a few values (ties, band edges), finite or not, a quality on
    either side of the threshold, and with `timed` a median and range (overlapping or apart)."""
    kinds = sorted(rng.sample(KINDS, rng.randint(1, len(KINDS))), key=KINDS.index)
    if rng.random() < 0.2:
        kinds.append("unknown")  # a kind outside the table ranks after every known one
    table = []
    for kind in kinds:
        memory = rng.choice([100.0, 104.0, 109.0, 110.0, 110.1, 115.0, 200.0])
        finite = rng.random() < 0.7
        quality = Quality(rng.choice([5.0, 19.9, 25.0, 40.0])) if finite else None
        cost = StageCost(memory)
        if timed and finite:
            ms = rng.choice([10.0, 10.5, 12.0, 20.0])
            spread = rng.choice([0.1, 1.0, 3.0])
            cost = StageCost(memory, ms, (ms - spread, ms + spread), 3)
        table.append(CandidateResult("unet", kind, kind, {}, 0, finite, quality, cost))
    return table


def _pruned_best(table: list[CandidateResult], timed: bool) -> CandidateResult | None:
    """The search's way: in `verification_order`, each candidate that can still win run (its
    row as measured), the others left; with `timed`, time only where it decides. The best of
    what ran."""
    pruning = Pruning(timed)
    ran = []
    for row in fix_ranking.verification_order(table):
        if pruning.could_win(row):
            ran.append(row)
            pruning.add(row)
    ranked = fix_ranking.rank_candidates(ran)
    return ranked[0] if ranked and ranked[0].verified else None


@pytest.mark.parametrize("timed", [False, True])
def test_the_pruning_names_the_full_rankings_best_on_random_tables(timed):
    rng = random.Random(20261126 + timed)
    skipped = 0
    for _ in range(5000):
        table = _random_table(rng, timed)
        ranked = fix_ranking.rank_candidates(table)
        best = ranked[0] if ranked and ranked[0].verified else None
        assert _pruned_best(table, timed) is best, [
            (r.kind, r.memory_mb(), r.verified, r.cost) for r in table
        ]
        pruning = Pruning(timed)
        for row in fix_ranking.verification_order(table):
            skipped += not pruning.could_win(row)
            if pruning.could_win(row):
                pruning.add(row)
    assert skipped > 1000  # the pruning is no pruning unless it leaves candidates out


def test_a_candidate_past_the_memory_band_cannot_win():
    least = CandidateResult("unet", "islands", "", {}, 0, True, Quality(40.0), StageCost(100.0))
    wide = CandidateResult(
        "unet", "component_fp32", "", {}, 0, True, Quality(40.0), StageCost(111.0)
    )
    later = CandidateResult("unet", "clamp", "", {}, 0, True, Quality(40.0), StageCost(100.0))
    pruning = Pruning(timed=False)
    pruning.add(least)
    assert not pruning.could_win(wide)
    assert not pruning.could_win(later)  # untimed, the table's order decides: islands first
    timed = Pruning(timed=True)
    timed.add(least)
    assert timed.could_win(later) and not timed.could_win(wide)


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
