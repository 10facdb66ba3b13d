"""The words for each cause of a failed check or generation (`causes.CAUSES`): the one table
the CLI, the Markdown report and the generation messages read, so that a cause is named the same
way everywhere. Importing it costs nothing (no torch, no other module of HalfSafe)."""

from __future__ import annotations

CAUSE_WORDS = {
    "precision": "fp16/bf16 overflow: a precision change fixes it",
    "kernel": "a kernel fault, not the model",
    "weights": "damaged or overflowing weights in the file, not a setting",
    "state": "a part went bad in memory after loading; a fresh load fixes it",
    "intermittent": (
        "the NaN did not come back on an identical re-run: a kernel or device fault that "
        "strikes at random, not the model"
    ),
    "cache": (
        "a cache (the step cache, or the prompt cache of the text's keys and values): made "
        "again without it, the image came out right, so the NaN was one the cache held and "
        "replayed, not the model's"
    ),
}


def cause_words(kind: str) -> str:
    """What a cause kind means, in a user's words; an unknown kind is shown as it is."""
    return CAUSE_WORDS.get(kind, kind)
