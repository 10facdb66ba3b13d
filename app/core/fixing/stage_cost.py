"""What running a part under one plan costs on this device: its weights as the user's generation
holds them, and, where the check timed it (`Runner.stage_costs`), the median step of the runs raced against the other plans,
their fastest and slowest, how many there were, and the device's peak memory (None where the
device does not report it, as a CPU). The candidates' table and the ranking read it."""

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

    @property
    def memory_mb(self) -> float:
        """What the ranking weighs: the weights as the user's generation holds them under its
        budget (`placement.generation_held_mb`), on every device alike. Not the peak of the
        check's own runs: it computes a wider candidate from the stored weights layer by layer,
        where a generation holds a copy (an fp32 UNet peaked alike the fp16 one in the check,
        and holds twice its weights in a generation)."""
        return self.weights_mb

    def to_json(self) -> dict[str, Any]:
        """The weights, and the timing where it was measured."""
        document: dict[str, Any] = {"weights_mb": self.weights_mb}
        if self.step_ms is not None:
            document.update(
                step_ms=self.step_ms,
                step_ms_range=list(self.step_ms_range) if self.step_ms_range else None,
                rounds=self.rounds,
                peak_memory_mb=self.peak_memory_mb,
            )
        return document
