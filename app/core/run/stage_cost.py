"""What running a part under one plan costs on this device: its weights as the user's generation
holds them, and, where the check timed it (`Timing.stage_costs`), the median step of the runs raced against the other plans,
their fastest and slowest, how many there were, and the device's peak memory (None where the
device does not report it, as a CPU); where the work and the device's dtype table predicted it,
that step and the prediction's error. The candidates' table and the ranking read it.
`StepCost`: one plan's call as a fix's cost tells it beside no-half."""

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


@dataclass(frozen=True)
class StepCost:
    """One call of `component` under one plan placed as a generation places it
    (`Timing.unet_step_costs` for a denoiser step with the CFG batch, `Timing.stage_costs` for
    another part): the median time in ms of `rounds` runs alternating with the other plans, and
    the fastest and slowest of them; the device's peak memory during a call in MB (None where the
    device does not report it, as a CPU); what the plan's weights hold in MB, as the generation
    holds them under its memory budget (`placement.generation_held_mb`)."""

    step_ms: float
    step_ms_range: tuple[float, float]
    rounds: int
    peak_memory_mb: float | None
    weights_mb: float
    component: str = "unet"

    @property
    def per_denoiser_step(self) -> bool:
        """Whether the figures are a denoiser's step (else one call of another part)."""
        from app.core.components import COMPONENTS, Role

        known = COMPONENTS.get(self.component)
        return known is not None and known.role is Role.DENOISER

    @property
    def unet_step_ms(self) -> float:
        """The step time, as readers of a denoiser's step name it."""
        return self.step_ms

    @property
    def unet_step_ms_range(self) -> tuple[float, float]:
        return self.step_ms_range

    def to_json(self) -> dict[str, Any]:
        denoiser = self.per_denoiser_step
        return {
            "component": self.component,
            "step_ms": self.step_ms,
            "step_ms_range": list(self.step_ms_range),
            "unet_step_ms": self.step_ms if denoiser else None,
            "unet_step_ms_range": list(self.step_ms_range) if denoiser else None,
            "rounds": self.rounds,
            "peak_memory_mb": self.peak_memory_mb,
            "weights_mb": self.weights_mb,
        }
