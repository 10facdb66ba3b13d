"""Faults a family's models are known for in fp16 in the tools that run them (SDXL's original
VAE, SD 2.x's attention), and how another tool's record says an image came from such a model:
what `explain` suggests first when the model itself cannot be checked. Each family module
lists its own (`Family.tool_faults`)."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class ToolFault:
    """One known fp16 fault: the models it belongs to in explain's words, the likely cause it
    makes an image's, the parts to widen for it first to last, and what in a record says the
    models (a tool's stated base, the model's name, its VAE's name)."""

    family: str  # explain's name for the models: "sdxl", "sd2" (JSON `family`)
    title: str  # "SDXL", "SD 2.x"
    likely: str  # the likely cause's key: "sdxl_vae"
    likely_words: str  # completing "the likely cause is ..."
    order: tuple[str, ...]  # the parts to widen, first to last ("vae", "attention", "all")
    bases: tuple[str, ...] = ()  # a tool's stated base (lower case) starting with one of these
    exact_bases: tuple[str, ...] = ()  # ... or equal to one of these
    # A stated base that names these models' kind without telling them apart ("SD 1.x or 2.x"),
    # under which a model name still says them: prefixes, and prefixes that rule it out.
    vague_bases: tuple[str, ...] = ()
    not_vague_bases: tuple[str, ...] = ()
    names: tuple[re.Pattern[str], ...] = ()  # model names that say them
    vae_names: tuple[re.Pattern[str], ...] = ()  # VAE names that say them

    def stated(self, base: str) -> bool:
        return (bool(self.bases) and base.startswith(self.bases)) or base in self.exact_bases

    def vaguely_stated(self, base: str) -> bool:
        return bool(self.vague_bases) and (
            base.startswith(self.vague_bases) and not base.startswith(self.not_vague_bases)
        )

    def named(self, name: str) -> bool:
        return any(pattern.search(name) for pattern in self.names)

    def vae_named(self, vae: str) -> bool:
        return any(pattern.search(vae) for pattern in self.vae_names)
