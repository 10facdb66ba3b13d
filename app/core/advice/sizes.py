"""What a family needs in each stored form at real size, on one card and in the computer's
memory: the projection `benchmarks/family_memory.py` makes from the published shapes, kept in
`app/resources/family_forms.json`, judged as a job without a budget set is placed.

A card's budget is its memory less 0.5 GiB for the desktop and the driver's context, less the
reserve a job keeps for activations (`streaming`: a fifth of the card, at least 1.5 GiB). A
part fits whole within it, or streams block by block when its non-block layers and its largest
block fit, or does not run there. The loaded model stays in RAM, so the files' bytes and 1.5 GiB
of HalfSafe's working set must fit beside 2.5 GiB for the system. No torch here: the window
asks this too.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.core import paths
from app.core.precision.streaming import BUDGET_MIN_MB, RESERVE_MIN_MB, RESERVE_SHARE

FORMS_FILE = "family_forms.json"
GIB = 2**30
DESKTOP_GIB = 0.5
SYSTEM_RAM_GIB = 2.5
WORKING_SET_GIB = 1.5
# The projection's columns, by the bytes a quantised matrix weight holds (None: 16 bits).
COLUMNS: Mapping[float | None, str] = {None: "16-bit", 1.0: "fp8", 34 / 32: "Q8_0", 18 / 32: "Q4_0"}

WHOLE, STREAMS, NO_ROOM = "whole", "streams", "no room"


@dataclass(frozen=True)
class SizeFit:
    """One projected model in one form on this device: the bytes its files hold (and the
    loaded model keeps in RAM); on a card (`card_bytes` set) whether it runs whole, streams
    `streamed` parts block by block, or has no room (`short`: the part and the bytes it needs
    at least); and whether it fits in RAM (None where the RAM is unknown). `card_peak` is the
    most the card holds at once where it runs there: the largest part as placed (whole, or its
    resident layers and one block), since a job places its parts one after another."""

    model: str
    files_bytes: int
    card_bytes: int | None
    card: str | None
    streamed: tuple[str, ...] = ()
    short: tuple[tuple[str, int], ...] = ()
    ram_bytes: int | None = None
    ram_fits: bool | None = None
    card_peak: int | None = None

    @property
    def ram_needed(self) -> int:
        """Bytes of RAM the loaded model and HalfSafe's working set take."""
        return int(self.files_bytes + WORKING_SET_GIB * GIB)

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "files_bytes": self.files_bytes,
            "card_bytes": self.card_bytes,
            "card": self.card,
            "streamed": list(self.streamed),
            "short": {part: need for part, need in self.short},
            "ram_bytes": self.ram_bytes,
            "ram_fits": self.ram_fits,
            "card_peak_bytes": self.card_peak,
        }


@functools.lru_cache(maxsize=1)
def family_table() -> dict[str, Any]:
    """`app/resources/family_forms.json`: per family id its published forms, the projections that
    stand for it, and the projections themselves."""
    return json.loads(paths.resource(FORMS_FILE).read_text(encoding="utf-8"))


def card_budget(card_bytes: int) -> float:
    """Bytes a job's parts may each hold on a card of `card_bytes` with nothing else running."""
    free = card_bytes - DESKTOP_GIB * GIB
    reserve = max(RESERVE_MIN_MB * 2**20, RESERVE_SHARE * card_bytes)
    return max(free - reserve, BUDGET_MIN_MB * 2**20)


def ram_fits(files_bytes: int, ram_bytes: int) -> bool:
    """Whether a loaded model of `files_bytes` fits in a computer of `ram_bytes`."""
    return files_bytes + WORKING_SET_GIB * GIB <= ram_bytes - SYSTEM_RAM_GIB * GIB


def projections_for(family_id: str, architecture: str) -> list[str]:
    """The projections standing for a family (by its architecture name first, then its id)."""
    table = family_table()["projected_as"]
    return list(table.get(architecture) or table.get(family_id) or [])


def size_fit(
    projection: str, bytes_per_weight: float | None, card_bytes: int | None, ram_bytes: int | None
) -> SizeFit:
    """One projection in the form of `bytes_per_weight`, judged on a card of `card_bytes` (None:
    the device computes in the computer's memory) and in `ram_bytes` of RAM (None: unknown)."""
    projected = family_table()["projections"][projection]
    column = COLUMNS[_column_key(bytes_per_weight)]
    parts = {name: part["forms"][column] for name, part in projected["parts"].items()}
    files = sum(held["whole"] for held in parts.values())
    card = None
    peak = None
    streamed: list[str] = []
    short: list[tuple[str, int]] = []
    if card_bytes is not None:
        budget = card_budget(card_bytes)
        placed = []
        for name, held in parts.items():
            if held["whole"] <= budget:
                placed.append(held["whole"])
                continue
            floor = held["resident"] + held["block"]
            if held["blocks"] and floor <= budget:
                streamed.append(name)
                placed.append(floor)
            else:
                short.append((name, floor))
        card = NO_ROOM if short else STREAMS if streamed else WHOLE
        peak = max(placed) if placed and not short else None
    return SizeFit(
        model=projected["words"],
        files_bytes=files,
        card_bytes=card_bytes,
        card=card,
        streamed=tuple(streamed),
        short=tuple(short),
        ram_bytes=ram_bytes,
        ram_fits=None if ram_bytes is None else ram_fits(files, ram_bytes),
        card_peak=peak,
    )


def _column_key(bytes_per_weight: float | None) -> float | None:
    if bytes_per_weight is None:
        return None
    return min((k for k in COLUMNS if k is not None), key=lambda k: abs(k - bytes_per_weight))
