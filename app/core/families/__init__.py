"""Model families: one module each (`sd`, `sdxl`, `flux`, `chroma`, `sd3`, `zimage`,
`qwenimage`, `qwenimage21`, `krea2`, `flux2`, `anima`, `flux3`), what they share (`base`), and
the ordered registry (`registry`).

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
    from app.core.families.anima import AnimaFamily
    from app.core.families.base import (
        Family,
        FamilyId,
        GenerationDefaults,
        LatentFormat,
        make_scheduler,
    )
    from app.core.families.chroma import ChromaFamily
    from app.core.families.flux import FluxFamily
    from app.core.families.flux2 import Flux2Family, Flux2KleinFamily
    from app.core.families.flux3 import Flux3Family, Flux3KleinFamily
    from app.core.families.krea2 import Krea2Family
    from app.core.families.qwenimage import QwenImageFamily
    from app.core.families.qwenimage21 import QwenImage21Family
    from app.core.families.registry import (
        FAMILIES,
        architecture_title,
        detect_architecture,
        detect_from_configs,
        family,
        family_of,
        family_of_architecture,
        family_of_denoiser,
        generation_defaults,
        profile_architecture,
    )
    from app.core.families.sd import StableDiffusionFamily
    from app.core.families.sd3 import SD3Family
    from app.core.families.sdxl import SDXLFamily
    from app.core.families.zimage import ZImageFamily

__all__ = [
    "FAMILIES",
    "AnimaFamily",
    "ChromaFamily",
    "Family",
    "FamilyId",
    "Flux2Family",
    "Flux2KleinFamily",
    "Flux3Family",
    "Flux3KleinFamily",
    "FluxFamily",
    "GenerationDefaults",
    "Krea2Family",
    "LatentFormat",
    "QwenImage21Family",
    "QwenImageFamily",
    "SD3Family",
    "SDXLFamily",
    "StableDiffusionFamily",
    "ZImageFamily",
    "architecture_title",
    "detect_architecture",
    "detect_from_configs",
    "family",
    "family_of",
    "family_of_architecture",
    "family_of_denoiser",
    "generation_defaults",
    "make_scheduler",
    "profile_architecture",
]

if not TYPE_CHECKING:  # pyright would take any name from a module with __getattr__
    __getattr__, __dir__ = lazy_exports(
        globals(),
        {
            ".anima": ["AnimaFamily"],
            ".base": ["Family", "FamilyId", "GenerationDefaults", "LatentFormat", "make_scheduler"],
            ".chroma": ["ChromaFamily"],
            ".flux": ["FluxFamily"],
            ".flux2": ["Flux2Family", "Flux2KleinFamily"],
            ".flux3": ["Flux3Family", "Flux3KleinFamily"],
            ".krea2": ["Krea2Family"],
            ".qwenimage": ["QwenImageFamily"],
            ".qwenimage21": ["QwenImage21Family"],
            ".registry": [
                "FAMILIES",
                "architecture_title",
                "detect_architecture",
                "detect_from_configs",
                "family",
                "family_of",
                "family_of_architecture",
                "family_of_denoiser",
                "generation_defaults",
                "profile_architecture",
            ],
            ".sd": ["StableDiffusionFamily"],
            ".sd3": ["SD3Family"],
            ".sdxl": ["SDXLFamily"],
            ".zimage": ["ZImageFamily"],
        },
    )
