"""Model families: one module each (its `Family` subclass, named in `registry.FAMILIES`), what
they share (`base`), and the ordered registry (`registry`), the one list of them. A family class
is imported from its own module.

A family says which components a pipeline has (by role, see `components.py`), how to encode a
prompt into the named tensors its denoiser takes, which of those tensors come from which text
encoder (so the NaN watch can blame the right one), how the check's probe steps the denoiser
through the user's schedule, how generation makes its noise, its sampler and its pixels'
latents, and what its latents look like (`LatentFormat`). The health check and generation loop
over a family's components and call these steps; neither names an architecture.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.core.lazy import lazy_exports

if TYPE_CHECKING:
    from app.core.families.base import (
        Family,
        FamilyId,
        GenerationDefaults,
        LatentFormat,
        make_scheduler,
    )
    from app.core.families.registry import (
        FAMILIES,
        architecture_title,
        detect_architecture,
        detect_from_configs,
        family,
        family_of,
        family_of_architecture,
        family_of_denoiser,
        family_of_detection,
        generation_defaults,
        profile_architecture,
    )

__all__ = [
    "FAMILIES",
    "Family",
    "FamilyId",
    "GenerationDefaults",
    "LatentFormat",
    "architecture_title",
    "detect_architecture",
    "detect_from_configs",
    "family",
    "family_of",
    "family_of_architecture",
    "family_of_denoiser",
    "family_of_detection",
    "generation_defaults",
    "make_scheduler",
    "profile_architecture",
]

if not TYPE_CHECKING:  # pyright would take any name from a module with __getattr__
    __getattr__, __dir__ = lazy_exports(
        globals(),
        {
            ".base": ["Family", "FamilyId", "GenerationDefaults", "LatentFormat", "make_scheduler"],
            ".registry": [
                "FAMILIES",
                "architecture_title",
                "detect_architecture",
                "detect_from_configs",
                "family",
                "family_of",
                "family_of_architecture",
                "family_of_denoiser",
                "family_of_detection",
                "generation_defaults",
                "profile_architecture",
            ],
        },
    )
