"""Checking many models in one run ("Check all my models", and Re-verify of one): which of the
library's rows can be checked, and the run's record, one row per model with its verdict and
fix, or the one sentence that says why it was not checked.

Plain data: the engine runs the checks, the GUI shows the rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from app.core.components import Verdict
from app.core.library import MODEL, LibraryEntry
from app.core.models.summary import ModelSummary
from app.core.requests.records import LoadRequest

# One run loads each model in turn: past this many, the rest are counted, not checked.
MAX_MODELS_PER_RUN = 100


@dataclass(frozen=True)
class ModelToCheck:
    """A model the run will load and check, with the VAE its folder pairs with it; `problem`
    is the sentence saying why it cannot be (then it is not loaded)."""

    source: str
    name: str
    vae: str | None = None
    problem: str | None = None


@dataclass(frozen=True)
class ModelCheckRow:
    """One model's line of the run: its verdict, the report's headline and the fix the check
    found or used (empty when none); a model that was not checked has no verdict and
    `words` says why in one sentence."""

    source: str
    name: str
    verdict: Verdict | None
    words: str
    fix: str = ""


@dataclass(frozen=True)
class ModelChecks:
    """What a run did: its rows in the order checked, whether it was cancelled (between models
    or during one, whose row is then left out), how many models were past the run's bound, and
    the model loaded when it ended (the one loaded before it, loaded again), with the sentence
    saying why that failed, if it did."""

    rows: tuple[ModelCheckRow, ...]
    cancelled: bool = False
    not_checked: int = 0
    loaded: ModelSummary | None = None
    loaded_request: LoadRequest | None = None
    restore_problem: str = ""


def models_to_check(entries: Sequence[LibraryEntry]) -> list[ModelToCheck]:
    """The library's models (never its VAEs), in its order, each with what stops it from being
    checked: a file that could not be read, a missing companion, a pickle (opened only when the
    user loads it and allows it), or a model HalfSafe does not run."""
    models = []
    for entry in entries:
        if entry.role != MODEL:
            continue
        name = Path(entry.path).name
        models.append(ModelToCheck(entry.path, name, entry.vae, _problem(entry, name)))
    return models


def _problem(entry: LibraryEntry, name: str) -> str | None:
    if entry.error:
        return entry.error
    if entry.missing:
        return entry.missing
    if entry.format == "pickle":
        return (
            f"{name} is a pickle file, which HalfSafe opens only when you load it yourself and "
            "allow it."
        )
    if not entry.supported:
        return f"{name} is not a model HalfSafe can run."
    return None
