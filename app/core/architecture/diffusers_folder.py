"""Which model a diffusers folder holds, from its model_index.json and its denoiser's and
scheduler's configs (a DiT pipeline is recognised by its family).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.core.architecture.prediction_type import _words
from app.core.detection import Detection
from app.core.families import FAMILIES, architecture_title
from app.core.families.registry import families_words


def detect_from_configs(
    model_index: Mapping[str, Any], unet: Mapping[str, Any], scheduler: Mapping[str, Any]
) -> Detection:
    """Decide the architecture of a diffusers folder from its model_index.json and configs
    (`unet` is the denoiser's config: the UNet's, or a DiT's `transformer`).

    A UNet config must have passed `limits.check_unet_config` (its sizes are numbers).
    """
    class_name = str(model_index.get("_class_name", ""))
    if "transformer" in model_index:
        for family in FAMILIES:
            if family.recognises(class_name):
                return family.detect_folder(model_index, unet, scheduler)
    cross = unet.get("cross_attention_dim")
    cross = cross[0] if isinstance(cross, list) else cross
    in_channels = unet.get("in_channels", 4)
    prediction = scheduler.get("prediction_type", "epsilon")
    sample = unet.get("sample_size") or 64
    size = int(max(sample) if isinstance(sample, list) else sample) * 8
    if "text_encoder_2" in model_index and unet.get("addition_embed_type") == "text_time":
        family, why = (
            "sdxl",
            (
                f"its {class_name} has two text encoders and a UNet with {cross}-wide "
                "text features and text/time embeddings"
            ),
        )
    elif class_name.startswith("StableDiffusion") and "text_encoder_2" not in model_index:
        family = "sd2" if cross == 1024 else "sd1"
        why = f"its {class_name} has one text encoder and a UNet with {cross}-wide text features"
        if family == "sd1" and cross != 768:
            why += " (a non-standard width, treated as SD1.x)"
    else:
        looks = f"a {class_name or 'pipeline of unknown type'}"
        return Detection(
            class_name or "unknown",
            False,
            looks,
            f"its model_index.json names {class_name or 'no pipeline class'}; "
            f"HalfSafe runs {families_words()} pipelines.",
        )
    variant = "-inpaint" if in_channels == 9 else ""
    if in_channels not in (4, 9):
        return Detection(
            f"{family}-in{in_channels}",
            False,
            f"a UNet with {in_channels} input channels",
            f"{why}, but its UNet takes {in_channels} input channels where a "
            "text-to-image model takes 4.",
        )
    because = (
        f"{architecture_title(family)}{' inpainting' if variant else ''}: {why}; "
        f"{_words(prediction)} per its scheduler config."
    )
    return Detection(
        family + variant,
        True,
        f"a {architecture_title(family)} pipeline",
        because,
        prediction,
        size,
        None,
        class_name,
        zero_terminal_snr=bool(scheduler.get("rescale_betas_zero_snr")),
        prediction_because=f"{_words(prediction)} per its scheduler config",
    )
