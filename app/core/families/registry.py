"""The families in the order they are recognised, and the questions other modules ask of them:
which family a loaded pipeline is, which family an architecture name belongs to, and how that
name is shown, and what a single file or a diffusers folder holds. Code outside
`app/core/families/` asks here and never names a family."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from app.core.architecture.single_file import not_a_full_checkpoint, other_file
from app.core.detection import Detection
from app.core.errors import HalfSafeError
from app.core.families.anima import AnimaFamily
from app.core.families.base import Family, FamilyId, GenerationDefaults
from app.core.families.checkpoints import Checkpoint
from app.core.families.chroma import ChromaFamily
from app.core.families.faults import ToolFault
from app.core.families.flux import FluxFamily
from app.core.families.flux2 import Flux2Family, Flux2KleinFamily
from app.core.families.flux3 import Flux3Family, Flux3KleinFamily
from app.core.families.krea2 import Krea2Family
from app.core.families.qwenimage import QwenImageFamily
from app.core.families.qwenimage21 import QwenImage21Family
from app.core.families.sd import StableDiffusionFamily
from app.core.families.sd3 import SD3Family
from app.core.families.sdxl import SDXLFamily
from app.core.families.zimage import ZImageFamily

# Most specific first: the first family that owns a pipeline is its family.
FAMILIES: tuple[Family, ...] = (
    AnimaFamily(),  # its own transformer class (Cosmos's) and text conditioner
    # Krea 2 and Qwen-Image 2.1 before Qwen-Image (all three read Qwen VLs and share its VAE
    # or names); their own markers and transformer classes tell the two apart.
    Krea2Family(),
    QwenImage21Family(),
    QwenImageFamily(),
    ZImageFamily(),
    SD3Family(),
    # FLUX.3's own transformer class and layout, shared by its two variants: the base model's
    # title names the layout's files (both run).
    Flux3Family(),
    Flux3KleinFamily(),
    # Flux.2 before Flux.1 (its transformer files carry Flux.1's markers too); Klein before
    # dev, whose "flux2" would otherwise take "flux2-klein".
    Flux2KleinFamily(),
    Flux2Family(),
    ChromaFamily(),
    FluxFamily(),
    SDXLFamily(),
    StableDiffusionFamily(),
)
_BY_ID = {family.id: family for family in FAMILIES}
# A variant's words after the family's title: "sdxl-inpaint" is "SDXL inpainting".
_VARIANT_WORDS = {"inpaint": "inpainting", "refiner": "refiner"}


def families_words() -> str:
    """The families HalfSafe runs, for sentences: "Stable Diffusion 1.x/2.x, SDXL, ... and
    Qwen-Image"."""
    titles = [f.title for f in reversed(FAMILIES)]
    return ", ".join(titles[:-1]) + " and " + titles[-1]


def companion_words() -> str:
    """The text-encoder files each family's transformer file runs with, by the names ComfyUI
    users give them, for help texts: "Flux.1: clip_l and t5xxl; Chroma: t5xxl; ...". One
    family per layout, as `file_layout_words` names them."""
    chosen = {}  # the first family of each layout in the registry: the one whose files run
    for family in FAMILIES:
        if family.layout is not None:
            chosen.setdefault(id(family.layout), family)
    said = []
    for family in reversed(chosen.values()):
        stems = [s for part, s in family.companion_names.items() if part.startswith("text_")]
        if stems:
            names = ", ".join(stems[:-1]) + " and " + stems[-1] if len(stems) > 1 else stems[0]
            said.append(f"{family.title}: {names}")
    return "; ".join(said)


def file_layout_words() -> str:
    """The families whose transformer HalfSafe reads from a file of its own (a layout: split
    files as ComfyUI keeps them, or all in one), for sentences: "Flux.1, Chroma, ... and
    Krea 2"."""
    # One title per layout: families sharing one (Flux.2 dev and Klein) are named by the one
    # listed first in the registry, the one whose files run (dev's are read, then refused).
    by_layout = {id(f.layout): f.title for f in reversed(FAMILIES) if f.layout is not None}
    titles = list(by_layout.values())
    return ", ".join(titles[:-1]) + " and " + titles[-1]


def tool_faults() -> tuple[ToolFault, ...]:
    """Every family's known fp16 faults in other tools, newest family first (SDXL's names are
    asked before SD 2.x's)."""
    faults: list[ToolFault] = []
    for candidate in FAMILIES:
        faults += [f for f in candidate.tool_faults if f not in faults]
    return tuple(faults)


def family_of(pipeline) -> Family:
    """The family a loaded pipeline belongs to, from the components it has."""
    for family in FAMILIES:
        if family.owns(pipeline):
            return family
    raise HalfSafeError(f"HalfSafe does not run a {type(pipeline).__name__}.")


def family_of_denoiser(denoiser) -> Family | None:
    """The family whose transformer `denoiser` is (None for a UNet: its family is told by the
    pipeline's text encoders, see `family_of`)."""
    name = type(denoiser).__name__
    return next((f for f in FAMILIES if f.transformer_class == name), None)


def family(family_id: str) -> Family:
    """The family whose id is `family_id` ("sdxl"); ValueError for a name no family has."""
    try:
        return _BY_ID[FamilyId(family_id)]
    except KeyError:
        raise ValueError(f"HalfSafe runs no model family named {family_id!r}") from None


def family_of_architecture(architecture: str) -> Family | None:
    """The family of one of HalfSafe's architecture names ("sd2-inpaint", "flux-dev"), None
    for a model HalfSafe does not run."""
    base = architecture.split("-")[0]
    for candidate in FAMILIES:
        if architecture in candidate.architectures or base in candidate.architectures:
            return candidate
    return None


def architecture_title(architecture: str | None) -> str:
    """An architecture name as people say it: "sdxl" -> "SDXL", "sd1-inpaint" ->
    "Stable Diffusion 1.x inpainting", "flux-dev" -> "Flux.1 dev"; an unknown name as it is."""
    if not architecture:
        return "unknown"
    for candidate in FAMILIES:
        if architecture in candidate.architectures:
            return candidate.architectures[architecture]
    base, _, variant = architecture.partition("-")
    for candidate in FAMILIES:
        if base in candidate.architectures and variant in _VARIANT_WORDS:
            return f"{candidate.architectures[base]} {_VARIANT_WORDS[variant]}"
    return architecture


def _by(family: Family, detection: Detection) -> Detection:
    """`detection` carrying the family that made it, where that family runs it."""
    return replace(detection, family_id=family.id) if detection.supported else detection


def family_of_detection(detection: Detection) -> Family | None:
    """The family that recognised `detection` (None: a file no family runs)."""
    if detection.family_id:
        return _BY_ID.get(FamilyId(detection.family_id))
    return family_of_architecture(detection.architecture) if detection.supported else None


def detect_architecture(
    shapes: Mapping[str, tuple[int, ...]],
    *,
    metadata: Mapping[str, str] | None = None,
    name: str = "",
    sidecar_config: str | None = None,
) -> Detection:
    """Which model a single-file checkpoint of the original Stable Diffusion layout holds, from
    its tensor names and shapes, or in one sentence what else the file is (a LoRA, an
    embedding, a VAE, another architecture's model).

    `metadata` is the safetensors `__metadata__`, `name` the file name, `sidecar_config` the
    text of an A1111-style `.yaml` beside the file; they only inform the prediction type,
    which the weights do not record. Never raises: an unknown file gives an unsupported
    Detection that names what it looks like.
    """
    markers = [(m, str(f.id), words) for f in FAMILIES for m, words in f.file_markers]
    other = other_file(list(shapes), markers, file_layout_words(), name)
    if other is not None:
        return other
    file = Checkpoint(shapes, metadata or {}, name, sidecar_config)
    for candidate in FAMILIES:
        found = candidate.detect_checkpoint(file)
        if found is not None:
            return _by(candidate, found)
    return not_a_full_checkpoint(file.keys)


def detect_from_configs(
    model_index: Mapping[str, Any], denoiser: Mapping[str, Any], scheduler: Mapping[str, Any]
) -> Detection:
    """Which model a diffusers folder holds, from its model_index.json and its denoiser's
    (`unet` or `transformer`) and scheduler's configs; a UNet config must have passed
    `config_limits.check_unet_config`."""
    class_name = str(model_index.get("_class_name", ""))
    if "transformer" in model_index:
        for candidate in FAMILIES:
            if candidate.recognises(class_name):
                return _by(candidate, candidate.detect_folder(model_index, denoiser, scheduler))
    for candidate in FAMILIES:
        found = candidate.detect_unet_folder(model_index, denoiser, scheduler)
        if found is not None:
            return _by(candidate, found)
    return Detection(
        class_name or "unknown",
        False,
        f"a {class_name or 'pipeline of unknown type'}",
        f"its model_index.json names {class_name or 'no pipeline class'}; "
        f"HalfSafe runs {families_words()} pipelines.",
    )


def generation_defaults(architecture: str | None) -> GenerationDefaults | None:
    """The steps and CFG scale a model of this architecture runs at when the user gives none
    for the job (Z-Image Turbo's 9 steps without CFG); None where its family states none (the
    saved settings apply) or the name is unknown."""
    family = family_of_architecture(architecture or "")
    return family.generation_defaults(architecture or "") if family is not None else None


def profile_architecture(architecture: str) -> str:
    """The architecture's name in the keys of what is saved per model (remembered fixes and
    reports): its own, or the name its family keyed that state by before the variant was told
    apart ("zimage" for Z-Image Turbo and Base), so that nothing saved is lost."""
    family = family_of_architecture(architecture)
    return family.profile_name(architecture) if family is not None else architecture
