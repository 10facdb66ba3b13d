"""Choosing among verified fixes: memory first, then time where it is measured
(`rank_candidates`), the order candidates are verified in and which can no longer win
(`Pruning`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from app.core.fixing import fix_candidates
from app.core.fixing.fix_candidates import FixCandidate
from app.core.fixing.quality import Quality
from app.core.fixing.stage_cost import StageCost
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


def _faster(a: StageCost | None, b: StageCost | None) -> bool:
    """Whether `a` was measured faster than `b` beyond the noise (the ranges do not overlap)
    and by a margin that matters (`MATERIALLY_FASTER`)."""
    return _timing(a, b) == "faster"


def passed_over(candidate: CandidateResult, chosen: CandidateResult) -> str:
    """Why `rank_candidates` chose `chosen` over the verified `candidate` (of the same
    component): "memory" (it held more, past `MEMORY_TOLERANCE`), else its time against the
    chosen one's (`_timing`): "slower", "noise", "margin", or "order" where it was faster yet
    the ranking's walk through the table's order kept another (each rival is timed against the
    best found before it)."""
    least = chosen.memory_mb() or 0.0
    if (candidate.memory_mb() or 0.0) > least * (1 + MEMORY_TOLERANCE) + 1e-9:
        return "memory"
    timing = _timing(candidate.cost, chosen.cost)
    return "order" if timing == "faster" else timing


# How the fix is chosen among the verified candidates (`rank_candidates`), in the words every
# rendering of the candidates' table uses.
CHOSEN_WORDS = (
    "the verified one holding the least memory is chosen (within a tenth counts as alike); "
    "among those alike, the first of a "
    "switch, layers kept wider, the part in bf16, a clamp and the part in fp32, unless another "
    "was a tenth faster beyond the noise, timed or predicted from its work beyond the "
    "prediction's error"
)


def rank_candidates(results: list[CandidateResult]) -> list[CandidateResult]:
    """Verified candidates, best first, then the rest (never a fix), by quality. The best is
    found among the verified ones whose memory (peak where the device reports it, else
    weights) is within `MEMORY_TOLERANCE` of the least: one measured faster beyond the noise
    wins, otherwise the `FIX_KINDS` order decides. The other verified ones follow by memory."""
    order = {k.name: i for i, k in enumerate(fix_candidates.FIX_KINDS)}

    def memory(r: CandidateResult) -> float:
        return r.memory_mb() or 0.0

    verified = sorted(
        (r for r in results if r.verified), key=lambda r: (memory(r), order.get(r.kind, 99))
    )
    if verified:
        least = memory(verified[0])
        alike = sorted(
            (r for r in verified if memory(r) <= least * (1 + MEMORY_TOLERANCE) + 1e-9),
            key=lambda r: order.get(r.kind, 99),
        )
        best = alike[0]
        for other in alike[1:]:
            if _faster(other.cost, best.cost):
                best = other
        verified.remove(best)
        verified.insert(0, best)
    rest = sorted(
        (r for r in results if not r.verified),
        key=lambda r: -(r.quality.value if r.quality is not None else -math.inf),
    )
    return verified + rest


def verification_order(results: list[CandidateResult]) -> list[CandidateResult]:
    """`results` (candidates not run yet, each with the memory its plan holds) in the order the
    ranking prefers them before any is run: least memory first, then `FIX_KINDS` order."""
    order = {k.name: i for i, k in enumerate(fix_candidates.FIX_KINDS)}
    return sorted(results, key=lambda r: (r.memory_mb() or 0.0, order.get(r.kind, 99)))


class Pruning:
    """Which candidates, run in `verification_order`, can still be ranked first
    (`rank_candidates`) once run, given those verified so far: the rest need no run before the
    fix is named (the candidates' table runs them after).

    Run in that order, the first verified candidate holds the least memory of every verified
    one, so the band of memory alike to the least (`MEMORY_TOLERANCE`) is fixed by it: a
    candidate past the band cannot win. Within it, with the time measured (`timed`) any one
    may win by being faster; without it the first in `FIX_KINDS` order wins, so one after the
    best so far cannot. This holds where the memory ranked is known before a run (the plan's,
    `StageCost.memory_mb` of a row not timed yet); `tests/core/test_pruned_search.py` holds it
    to the full ranking over random tables."""

    def __init__(self, timed: bool) -> None:
        self.timed = timed
        self.verified: list[CandidateResult] = []

    def add(self, result: CandidateResult) -> None:
        """`result`, run (in `verification_order`)."""
        if result.verified:
            self.verified.append(result)

    def could_win(self, result: CandidateResult) -> bool:
        """Whether `result`, not run yet, could be ranked first once run."""
        if not self.verified:
            return True
        if not _alike_in_memory(result, self.verified[0]):
            return False
        if self.timed:
            return True
        order = {k.name: i for i, k in enumerate(fix_candidates.FIX_KINDS)}
        best = min(order.get(v.kind, 99) for v in self.verified)
        return order.get(result.kind, 99) < best


def _alike_in_memory(result: CandidateResult, least: CandidateResult) -> bool:
    """Whether `result` holds memory alike to `least`'s, the least (as `rank_candidates`)."""
    bound = (least.memory_mb() or 0.0) * (1 + MEMORY_TOLERANCE) + 1e-9
    return (result.memory_mb() or 0.0) <= bound
