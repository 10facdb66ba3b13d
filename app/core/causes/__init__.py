"""Why a check failed, told apart by re-running: a precision limit, an attention kernel, bad
weights (the checkpoint's or a LoRA's) or state that went bad in memory (`attribution`'s words
say how each is proved).

One responsibility per module, each importing only those before it:
  records      the causes' names and their records (`Cause`, `LoraBlame`, `KernelBlame`)
  attribution  the re-runs that tell the causes apart (`attribute`)
  check        the check with its LoRAs, attributed where it failed (`check_and_attribute`)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.core.lazy import lazy_exports

if TYPE_CHECKING:
    from app.core.causes.attribution import attribute, statistical_words
    from app.core.causes.check import check_and_attribute, check_model
    from app.core.causes.records import CAUSES, Cause, KernelBlame, LoraBlame, layer_name

__all__ = [
    "CAUSES",
    "Cause",
    "KernelBlame",
    "LoraBlame",
    "attribute",
    "check_and_attribute",
    "check_model",
    "layer_name",
    "statistical_words",
]

if not TYPE_CHECKING:  # pyright would take any name from a module with __getattr__
    __getattr__, __dir__ = lazy_exports(
        globals(),
        {
            ".attribution": ["attribute", "statistical_words"],
            ".check": ["check_and_attribute", "check_model"],
            ".records": ["CAUSES", "Cause", "KernelBlame", "LoraBlame", "layer_name"],
        },
    )
