"""A fix remembered for a model on one device (`RememberedFix`), as plain data.

It lives apart from the store that reads and writes `profiles.json` (`profiles`, which
re-exports it): a `ModelSummary` carries it to the window, whose process need not import the
store to show it. Imports no other HalfSafe module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RememberedFix:
    settings: dict[str, Any]  # settings values that make the model run finite on this device
    summary: str  # one sentence, as the health check wrote it
    verified_by: str  # "health check" or "generation repair"
    saved_at: float
    edited_at: float | None = None  # when the user last changed its layer lists by hand
