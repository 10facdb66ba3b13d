"""What running a part under one plan costs on this device: its weights as the user's generation
holds them, and, where the check timed it (`Runner.stage_costs`), the median step of the runs raced against the other plans,
their fastest and slowest, how many there were, and the device's peak memory (None where the
device does not report it, as a CPU); where the work and the device's dtype table predicted it,
that step and the prediction's error. The candidates' table and the ranking read it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StageCost:
    weights_mb: float
    step_ms: float | None = None
    step_ms_range: tuple[float, float] | None = None
    rounds: int | None = None
    peak_memory_mb: float | None = None
    # The step predicted from the work and the device's dtype table (`step_work.plan_seconds`),
    # and the relative error of such predictions measured on the device's kind (None: none).
    predicted_ms: float | None = None
    predicted_error: float | None = None

    @property
    def memory_mb(self) -> float:
        """What the ranking weighs: the weights as the user's generation holds them under its
        budget (`placement.generation_held_mb`), on every device alike. Not the peak of the
        check's own runs: it computes a wider candidate from the stored weights layer by layer,
        where a generation holds a copy (an fp32 UNet peaked alike the fp16 one in the check,
        and holds twice its weights in a generation)."""
        return self.weights_mb

    def to_json(self) -> dict[str, Any]:
        """The weights, the timing where it was measured and the prediction where one was made."""
        document: dict[str, Any] = {"weights_mb": self.weights_mb}
        if self.predicted_ms is not None:
            document.update(
                predicted_step_ms=self.predicted_ms, predicted_error=self.predicted_error
            )
        if self.step_ms is not None:
            document.update(
                step_ms=self.step_ms,
                step_ms_range=list(self.step_ms_range) if self.step_ms_range else None,
                rounds=self.rounds,
                peak_memory_mb=self.peak_memory_mb,
            )
        return document
