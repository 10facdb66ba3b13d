"""What a checkpoint or model folder is, in HalfSafe's words, and how to load it: the record
that detection (`architecture/` for checkpoints, each family's `detect_folder` for diffusers
folders) hands to the loader. Data only."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

UNET = "model.diffusion_model."  # where a Stability AI checkpoint keeps its denoiser
VAE = "first_stage_model."  # and its VAE


@dataclass(frozen=True)
class TextEncoderLayout:
    """Where one text encoder lives in a single file and in which key layout."""

    component: str  # "text_encoder" or "text_encoder_2"
    prefix: str  # key prefix in the file, up to the model's own names
    layout: str  # "hf" (transformers names) or "openclip"
    # SD2 reads OpenCLIP's penultimate layer. Original files carry the full tower, so its last
    # block goes unused; files from diffusers' converter hold only the blocks SD2 reads.
    drop_last_layer: bool = False


@dataclass(frozen=True)
class Detection:
    """What a checkpoint is, in HalfSafe's words, and how to load it."""

    architecture: str  # "sd1", "sd2", "sdxl", with "-inpaint" for inpainting, or another name
    supported: bool
    looks_like: str  # plain words: "an SDXL refiner", "a LoRA"
    because: str  # one sentence: why we think so
    prediction_type: str = "epsilon"
    native_size: int = 512
    config_name: str | None = None  # folder under app/resources/configs
    pipeline_class: str | None = None  # diffusers class name
    text_encoders: tuple[TextEncoderLayout, ...] = ()
    has_vae: bool = False
    vae_prefix: str = VAE
    unet_prefix: str = UNET
    notes: tuple[str, ...] = field(default=())
    zero_terminal_snr: bool = False
    prediction_decided: bool = True  # False: a guess the loader tests (app.core.models.prediction)
    prediction_because: str = ""  # the end of `because`: how the prediction type is known
    # The family that recognised it (its `FamilyId`: "sd", "flux"); "" for a file no family
    # runs. Set by the registry's detection (`families.registry`).
    family_id: str = ""

    @property
    def family(self) -> str:
        """ "sd1", "sd2" or "sdxl" without the variant suffix."""
        return self.architecture.split("-")[0]


def pipeline_part_class(model_index: Mapping[str, Any], component: str) -> str:
    """The class a diffusers folder's model_index.json names for `component` ("unknown")."""
    spec = model_index.get(component)
    return str(spec[1]) if isinstance(spec, list) and len(spec) == 2 else "unknown"
