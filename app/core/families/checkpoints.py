"""The original Stable Diffusion checkpoint layout (LDM, as A1111 and Civitai keep it) that SD1.x,
SD2.x and SDXL share: what one of their files holds, once its family has recognised its text
encoders. The families ask here for the parts of a detection they have in common (the UNet's
input channels, the prediction type, the VAE, the pipeline to build) and for their encoders'
words; the keys and config inference live in `app.core.architecture`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.core.architecture.configs import infer_text_encoder_config
from app.core.architecture.keys import (
    _TOKEN_EMBEDDING,
    Shapes,
    _count_layers,
    _cross_attention_dim,
    _prefix_checker,
    _shape,
)
from app.core.architecture.prediction_type import _words as prediction_words
from app.core.architecture.prediction_type import read_prediction
from app.core.detection import UNET, VAE, Detection, TextEncoderLayout

# What a UNet that takes neither 4 nor 9 input channels is.
_OTHER_INPUTS = {
    8: "an InstructPix2Pix model",
    5: "an SD2 depth-to-image model",
    7: "an SD x4 upscaler",
}


@dataclass(frozen=True)
class Checkpoint:
    """A file's header as the families read it: its shapes and what they state beside them
    (the safetensors metadata, the file name, an A1111 `.yaml` beside it)."""

    shapes: Shapes
    metadata: Mapping[str, str]
    name: str
    sidecar_config: str | None

    @property
    def keys(self) -> list[str]:
        return list(self.shapes)

    def has(self, prefix: str) -> bool:
        return _prefix_checker(self.keys)(prefix)

    @property
    def cross(self) -> int | None:
        """The width of the text features the UNet's cross-attention takes."""
        return _cross_attention_dim(self.shapes, UNET)

    @property
    def cross_words(self) -> str:
        return f"{self.cross}-wide text features" if self.cross else "no text features"

    def hf_prefix(self, prefix: str) -> str:
        """CLIP in transformers layout sits under `text_model.`; very old files lack that."""
        nested = prefix + "text_model."
        return nested if any(k.startswith(nested) for k in self.shapes) else prefix


def full_checkpoint(
    file: Checkpoint,
    architecture: str,
    title: str,
    why: str,
    encoders: tuple[TextEncoderLayout, ...],
    pipeline_class: str,
    native: int | None,
    v_config: str | None = None,
) -> Detection:
    """The detection of a full checkpoint whose family and text encoders are known: its
    inpainting variant or other UNet from the input channels, its prediction type from what
    the file states (or the guess to test), its VAE. `native` None: 768 px for v-prediction,
    else 512 (SD2.x's two resolutions); `v_config` the shipped config a v-prediction model
    of the family loads with (None: the architecture's own)."""
    in_channels = _shape(file.shapes, UNET + "input_blocks.0.0.weight", 1)
    variant = ""
    if in_channels == 9:
        variant = "-inpaint"
        why += (
            ", and its UNet takes 9 input channels (latents, mask and masked image), so it is "
            "an inpainting model"
        )
    elif in_channels not in (None, 4):
        return Detection(
            f"{architecture}-in{in_channels}",
            False,
            _OTHER_INPUTS.get(in_channels, f"a UNet with {in_channels} input channels"),
            f"{why}, but its UNet takes {in_channels} input channels where a "
            "text-to-image model takes 4.",
        )
    stated = read_prediction(architecture, file.keys, file.metadata, file.name, file.sidecar_config)
    prediction = stated.kind
    if native is None:
        native = 768 if prediction == "v_prediction" else 512
    inpainting = " inpainting" if variant else ""
    if variant:
        pipeline_class = pipeline_class.replace("Pipeline", "InpaintPipeline")
    has_vae = file.has(VAE + "decoder.") and file.has(VAE + "encoder.")
    notes: tuple[str, ...] = ()
    if not has_vae:
        notes = ("The file has no VAE (first_stage_model); a separate VAE is needed.",)
    return Detection(
        architecture + variant,
        True,
        f"a {title}{inpainting} checkpoint",
        f"{title}{inpainting}: {why}; {stated.because}.",
        prediction,
        native,
        v_config if v_config and prediction == "v_prediction" else architecture,
        pipeline_class,
        encoders,
        has_vae,
        notes=notes,
        zero_terminal_snr=stated.zero_terminal_snr,
        prediction_decided=stated.decided,
        prediction_because=stated.because,
    )


def unet_without_text(file: Checkpoint) -> Detection:
    """A file with the layout's UNet and no text encoder any family reads (ComfyUI's
    `diffusion_models/` keeps these): named by the UNet's shape, and refused."""
    label_emb = (UNET + "label_emb.0.0.weight") in file.shapes
    guess = "SDXL" if label_emb else ("SD2.x" if file.cross == 1024 else "SD1.x")
    return Detection(
        "unet-only",
        False,
        f"a {guess} UNet without its text encoder",
        f"it holds a {guess}-shaped UNet ({UNET}*) but no text encoder, like the "
        "files ComfyUI keeps in models/diffusion_models; HalfSafe needs a full "
        "checkpoint with text encoder, UNet and VAE.",
    )


def unet_folder(
    architecture: str,
    title: str,
    why: str,
    class_name: str,
    unet: Mapping[str, Any],
    scheduler: Mapping[str, Any],
) -> Detection:
    """The detection of a diffusers folder of a UNet family whose family is known: its
    inpainting variant from the UNet's input channels, its prediction type from its
    scheduler's config. `unet` must have passed `config_limits.check_unet_config`."""
    in_channels = unet.get("in_channels", 4)
    prediction = str(scheduler.get("prediction_type", "epsilon"))
    sample = unet.get("sample_size") or 64
    size = int(max(sample) if isinstance(sample, list) else sample) * 8
    if in_channels not in (4, 9):
        return Detection(
            f"{architecture}-in{in_channels}",
            False,
            f"a UNet with {in_channels} input channels",
            f"{why}, but its UNet takes {in_channels} input channels where a "
            "text-to-image model takes 4.",
        )
    variant = "-inpaint" if in_channels == 9 else ""
    inpainting = " inpainting" if variant else ""
    said = f"{prediction_words(prediction)} per its scheduler config"
    return Detection(
        architecture + variant,
        True,
        f"a {title} pipeline",
        f"{title}{inpainting}: {why}; {said}.",
        prediction,
        size,
        None,
        class_name,
        zero_terminal_snr=bool(scheduler.get("rescale_betas_zero_snr")),
        prediction_because=said,
    )


def clip_words(shapes: Shapes, encoder: TextEncoderLayout) -> str:
    """ "CLIP ViT-L (768 wide, 12 layers)" or, for other widths, "CLIP (32 wide, 2 layers)"."""
    kind = "CLIP" if encoder.layout == "hf" else "OpenCLIP"
    try:
        hidden = infer_text_encoder_config(shapes, {}, encoder)["hidden_size"]
    except ValueError:
        return f"{kind} (unreadable)"
    model = {768: " ViT-L", 1024: " ViT-H", 1280: " ViT-bigG"}.get(hidden, "")
    return f"{kind}{model} ({hidden} wide, {_count_layers(shapes, encoder)} layers)"


def token_width(shapes: Shapes, prefix: str, layout: str) -> int | None:
    """The width of a CLIP's token embedding under `prefix`."""
    return _shape(shapes, prefix + _TOKEN_EMBEDDING[layout], 1)
