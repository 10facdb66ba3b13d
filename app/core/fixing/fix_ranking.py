"""Choosing among verified fixes without timing any (`rank_candidates`): memory first, then the
predicted step where predictions are apart beyond their band, else what each costs the user that
is known exactly (`band_order`: a clamp after a fix computing wider, the layers it changes, the
`FIX_KINDS` order, the memory it holds); the order candidates are verified in (`cost_order`,
memory first) and which can no longer win (`Pruning`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from app.core.fixing import fix_candidates
from app.core.fixing.fix_candidates import FixCandidate
from app.core.fixing.quality import Quality
from app.core.run.stage_cost import StageCost
from app.core.settings.values import SettingValue

# Two verified fixes whose memory differs by less than this are alike in memory; the measured
# time then decides, when the two time ranges do not overlap.
MEMORY_TOLERANCE = 0.10


@dataclass
class CandidateResult:
    """One candidate as the check measured it: finite or not, its quality against the fp32
    reference, and its cost on this device (`cost`: unet/stage step time, memory)."""

    component: str
    kind: str
    words: str
    settings: dict[str, SettingValue]
    modules: int  # layers kept out of the component's dtype by this candidate
    finite: bool
    quality: Quality | None
    cost: StageCost | None = None  # None: not measured
    chosen: bool = False
    candidate: FixCandidate | None = None
    # The layers whose precision the fix changes (every layer of a part it runs wider, those it
    # keeps wider or clamps; none for a switch), known from its plan before a run.
    layers_changed: int = 0

    @property
    def verified(self) -> bool:
        return self.finite and self.quality is not None and self.quality.passed

    def memory_mb(self) -> float | None:
        return self.cost.memory_mb if self.cost is not None else None

    def to_json(self) -> dict[str, Any]:
        return {
            "component": self.component,
            "kind": self.kind,
            "words": self.words,
            "settings": dict(self.settings),
            "modules": self.modules,
            "finite": self.finite,
            "quality": self.quality.to_json() if self.quality else None,
            "verified": self.verified,
            "chosen": self.chosen,
            "cost": self.cost.to_json() if self.cost is not None else {},
        }


# A candidate beats the one the table prefers only by this much time at least (its median a
# tenth below the other's), and beyond the noise: on a busy machine two candidates a few
# percent apart swapped places from one check to the next, the fix the user was shown with them.
MATERIALLY_FASTER = 0.9


def _predicted(a: StageCost | None, b: StageCost | None) -> str | None:
    """How `a`'s predicted step compares with `b`'s where the predictions tell what timing
    would: "faster" (a tenth faster, `MATERIALLY_FASTER`, beyond the larger of the two
    predictions' errors), "slower" or "margin" (not a tenth faster even at the error's worst);
    None where either has no prediction or the two fall inside that band (time them)."""
    pa = a.predicted_ms if a is not None else None
    pb = b.predicted_ms if b is not None else None
    if a is None or b is None or pa is None or pb is None or pb <= 0:
        return None
    error = max(a.predicted_error or 0.0, b.predicted_error or 0.0)
    ratio = pa / pb
    if ratio <= MATERIALLY_FASTER / (1 + error):
        return "faster"
    if ratio > MATERIALLY_FASTER * (1 + error):
        return "slower" if ratio >= 1 else "margin"
    return None


def predicted_apart(a: StageCost | None, b: StageCost | None) -> bool:
    """Whether the predictions of `a` and `b` tell the ranking's verdict on the two (either
    one faster, or neither) as their timing would, so that neither needs timing against the
    other."""
    return _predicted(a, b) is not None and _predicted(b, a) is not None


def _timing(a: StageCost | None, b: StageCost | None) -> str:
    """How `a`'s time compares with `b`'s, measured where both were timed, else predicted
    where the predictions tell it (`_predicted`): "slower" (its median not below `b`'s, or
    either not measured), "noise" (below, but the two runs' ranges overlap), "margin" (apart,
    by less than `MATERIALLY_FASTER`) or "faster" (a fix worth preferring for its time)."""
    ma = a.step_ms if a is not None else None
    mb = b.step_ms if b is not None else None
    if ma is None or mb is None:
        return _predicted(a, b) or "slower"
    if ma >= mb:
        return "slower"
    ra = a.step_ms_range if a is not None else None
    rb = b.step_ms_range if b is not None else None
    if not (ra and rb and ra[1] < rb[0]):
        return "noise"
    return "faster" if ma <= mb * MATERIALLY_FASTER else "margin"


def passed_over(candidate: CandidateResult, chosen: CandidateResult) -> str:
    """Why `rank_candidates` chose `chosen` over the verified `candidate` (of the same
    component): "memory" (it held more, past `MEMORY_TOLERANCE`); "timed_faster" where both were
    timed after the fix was proved and `candidate` ran a tenth faster beyond the noise (the fix
    was chosen before anything was timed, and stays); else its time against the chosen one's,
    timed where both were, else predicted (`_timing`): "slower", "noise", "margin", "order" where
    predicted faster yet the ranking's walk kept another (each rival is weighed against the best
    found before it); "cost_order" where nothing told the two apart, and what each holds, the
    layers each changes and the table's order put the chosen one first (`cost_order`)."""
    least = chosen.memory_mb() or 0.0
    if (candidate.memory_mb() or 0.0) > least * (1 + MEMORY_TOLERANCE) + 1e-9:
        return "memory"
    if _timed(candidate.cost) and _timed(chosen.cost):
        timing = _timing(candidate.cost, chosen.cost)
        return "timed_faster" if timing == "faster" else timing
    predicted = _predicted(candidate.cost, chosen.cost)
    if predicted is None:
        return "cost_order"
    return "order" if predicted == "faster" else predicted


def timed_faster(candidate: CandidateResult, chosen: CandidateResult) -> bool:
    """Whether the verified `candidate`, alike in memory to the `chosen` fix, was timed a tenth
    faster than it beyond the noise after the fix was proved."""
    return candidate.verified and passed_over(candidate, chosen) == "timed_faster"


def _timed(cost: StageCost | None) -> bool:
    return cost is not None and cost.step_ms is not None


# How the fix is chosen among the verified candidates (`rank_candidates`), in the words every
# rendering of the candidates' table uses.
CHOSEN_WORDS = (
    "the verified one holding the least memory is chosen (within a tenth counts as alike); "
    "among those alike, one predicted a tenth faster from its work beyond the prediction's "
    "error, else one computing wider before a clamp, then the one changing the fewest layers, "
    "then the first of a switch, layers kept wider, the part in bf16 and the part in fp32; "
    "nothing is timed before the fix is proved, and the times measured after it are shown "
    "beside it"
)


def cost_order(result: CandidateResult) -> tuple[float, int, int]:
    """What a candidate costs the user that is known before it runs, exactly: the memory its
    plan holds, the layers it changes, its row in `FIX_KINDS` (a kind outside it last)."""
    order = {k.name: i for i, k in enumerate(fix_candidates.FIX_KINDS)}
    return (result.memory_mb() or 0.0, result.layers_changed, order.get(result.kind, 99))


def band_order(result: CandidateResult) -> tuple[bool, int, int, float]:
    """Among verified fixes alike in memory, what decides where no prediction does: a clamp
    after every fix that computes wider (a clamp's agreement with fp32 holds for the inputs
    tested, a wider layer's for any), then the layers it changes, its row in `FIX_KINDS`, and
    the memory it holds."""
    order = {k.name: i for i, k in enumerate(fix_candidates.FIX_KINDS)}
    return (
        result.kind == "clamp",
        result.layers_changed,
        order.get(result.kind, 99),
        result.memory_mb() or 0.0,
    )


def rank_candidates(results: list[CandidateResult]) -> list[CandidateResult]:
    """Verified candidates, best first, then the rest (never a fix), by quality. The best is
    found among the verified ones whose memory (the weights as a generation holds them) is
    within `MEMORY_TOLERANCE` of the least, walked in `band_order`: one predicted faster than the
    best so far beyond the band and the prediction's error (`_predicted`) takes its place; a
    time measured never does (`passed_over` says where one was timed faster after). The other
    verified ones follow in `cost_order`."""
    verified = sorted((r for r in results if r.verified), key=cost_order)
    if verified:
        least = verified[0].memory_mb() or 0.0
        alike = sorted(
            (
                r
                for r in verified
                if (r.memory_mb() or 0.0) <= least * (1 + MEMORY_TOLERANCE) + 1e-9
            ),
            key=band_order,
        )
        best = alike[0]
        for other in alike[1:]:
            if _predicted(other.cost, best.cost) == "faster":
                best = other
        verified.remove(best)
        verified.insert(0, best)
    rest = sorted(
        (r for r in results if not r.verified),
        key=lambda r: -(r.quality.value if r.quality is not None else -math.inf),
    )
    return verified + rest


def verification_order(results: list[CandidateResult]) -> list[CandidateResult]:
    """`results` (candidates not run yet, each with the memory its plan holds and the layers it
    changes) in the order the ranking prefers them before any is run (`cost_order`)."""
    return sorted(results, key=cost_order)


class Pruning:
    """Which candidates, run in `verification_order`, can still be ranked first
    (`rank_candidates`) once run, given those verified so far: the rest need no run before the
    fix is named (the candidates' table runs them after).

    Run in that order, the first verified candidate holds the least memory of every verified
    one, so the band of memory alike to the least (`MEMORY_TOLERANCE`) is fixed by it: a
    candidate past the band cannot win. Within it `band_order` walks the band, and a candidate
    takes the best's place only where its step is predicted faster beyond the band and the
    prediction's error (`_predicted`). So one in the band runs while it would come before the
    best verified so far in `band_order` (a clamp verified first does not end the search), or,
    where steps are predicted (`predicting`), while its prediction is faster than that of one
    it would meet before it in the walk, verified or still to run. `foresee` gives a
    candidate's predicted step before it runs, as `predict_verified` gives it after (or none
    where the prediction is left out there: then it can beat nothing); None from it, or no
    `foresee`, means not known yet, and the candidate runs. This holds where the memory ranked
    is known before a run (the plan's, `StageCost.memory_mb`);
    `tests/core/test_pruned_search.py` holds it to the full ranking over random tables."""

    def __init__(
        self,
        predicting: bool,
        foresee: Callable[[CandidateResult], StageCost | None] | None = None,
    ) -> None:
        self.predicting = predicting
        self.foresee = foresee
        self.verified: list[CandidateResult] = []

    def add(self, result: CandidateResult) -> None:
        """`result`, run (in `verification_order`)."""
        if result.verified:
            self.verified.append(result)

    def could_win(self, result: CandidateResult, pending: Sequence[CandidateResult] = ()) -> bool:
        """Whether `result`, not run yet, could be ranked first once run; `pending`: the
        candidates after it still to run."""
        if not self.verified:
            return True
        least = self.verified[0]
        if not _alike_in_memory(result, least):
            return False
        alike = [r for r in self.verified if _alike_in_memory(r, least)]
        if band_order(result) < min(band_order(r) for r in alike):
            return True
        if not self.predicting:
            return False
        own = self.foresee(result) if self.foresee is not None else None
        if own is None:
            return True
        for rival in (*alike, *pending):
            if rival is result or not _alike_in_memory(rival, least):
                continue
            if band_order(rival) >= band_order(result):
                continue
            theirs = self.foresee(rival) if self.foresee is not None else None
            if theirs is None or _predicted(own, theirs) == "faster":
                return True
        return False


def _alike_in_memory(result: CandidateResult, least: CandidateResult) -> bool:
    """Whether `result` holds memory alike to `least`'s, the least (as `rank_candidates`)."""
    bound = (least.memory_mb() or 0.0) * (1 + MEMORY_TOLERANCE) + 1e-9
    return (result.memory_mb() or 0.0) <= bound
