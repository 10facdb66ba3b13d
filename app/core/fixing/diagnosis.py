"""What a finite run's largest activation predicts of fp16: out of range, at risk (within
`AT_RISK_HEADROOM` of 65504) or fine. The plans, fixes and their ranking live beside it:
`job_plans`, `layer_islands`, `fix_candidates`, `fix_ranking`.
"""

from __future__ import annotations

import math

from app.core.components import FP16_MAX, Status

AT_RISK_HEADROOM = 2.0  # within 2x of 65504: a bigger image or another prompt can tip it over


def status_from_peak(peak: float | None) -> Status:
    """What a finite run's largest activation says about fp16: past 65504 it overflows, within
    2x of it a bigger image or another prompt can tip it over."""
    if peak is None or not math.isfinite(peak):
        return Status.OVERFLOW
    if peak > FP16_MAX:
        return Status.OVERFLOW
    if peak > FP16_MAX / AT_RISK_HEADROOM:
        return Status.AT_RISK
    return Status.OK
