"""What a fix costs on this device, as measured beside no-half: `StepCost` for one plan's
denoiser step, `FixCost` for the fix and no-half side by side (a `Fix`'s `cost`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StepCost:
    """One denoiser step (the CFG batch) under one plan (`Runner.unet_step_costs`): the
    median time in ms of `rounds` runs alternating with the other plans, and the fastest and
    slowest of them; the device's peak memory during a step in MB (None where the device does
    not report it, as a CPU); the plan's weights in MB."""

    unet_step_ms: float
    unet_step_ms_range: tuple[float, float]
    rounds: int
    peak_memory_mb: float | None
    weights_mb: float

    def to_json(self) -> dict[str, Any]:
        return {
            "unet_step_ms": self.unet_step_ms,
            "unet_step_ms_range": list(self.unet_step_ms_range),
            "rounds": self.rounds,
            "peak_memory_mb": self.peak_memory_mb,
            "weights_mb": self.weights_mb,
        }


@dataclass(frozen=True)
class FixCost:
    """A step under the fix and under no-half, measured the same way on this device."""

    fix: StepCost
    no_half: StepCost

    def to_json(self) -> dict[str, Any]:
        return {"fix": self.fix.to_json(), "no_half": self.no_half.to_json()}
