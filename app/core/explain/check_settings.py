"""The settings the health check of an image runs at, read from its record: the precision the
tool ran, the size (the image's, bounded by the model's native size, or a hires pass's), Clip
skip where the model reads it, and the model's own step count where the image records none;
with the notes on what the check's size covers of the sizes the image was drawn at. The check
itself runs in `explanation`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from app.core import hires
from app.core.explain.records import Record
from app.core.families import family_of, generation_defaults

if TYPE_CHECKING:
    from app.core.explain.explanation import Explanation


def _reproduced_precision(record: Record):
    """The precision the image was made with: HalfSafe's record says; another tool ran the
    half precision it uses by default on a GPU (fp16)."""
    from app.core.settings import FIELDS, PrecisionSettings

    values: dict[str, Any] = {"precision": "fp16"}
    for key, value in record.precision.items():
        try:
            values[key] = FIELDS[key].validate(value)
        except (KeyError, ValueError):
            continue
    if values.get("precision") == "auto":
        values["precision"] = "fp16"
    return PrecisionSettings.from_mapping(values)


HIRES_BOUND = 2  # a second pass is checked at up to twice the model's native size


def _probe_size(record: Record, native: int) -> int:
    """The side the check runs at: the image's longer side, but never more than the model's
    native size (the model's own size when the image records none); for a hires fix or a
    second sampler at a larger size, that pass's longer side (where the VAE decoded), up to
    twice the native size. An image records whatever size it claims (`Size: 999999x999999`),
    and even a real 4096 px image would make the check cost many generations, so the work is
    bounded by the model, not by the image; a note says when the check ran smaller."""
    from app.core.settings import FIELDS

    side = max(record.width or 0, record.height or 0)
    bound = native
    if record.hires_size:
        side, bound = max(record.hires_size), HIRES_BOUND * native
    size = FIELDS["width"]
    low, high = size.bounds()
    side = int(min(max(side or native, low), bound, high))
    return side - side % int(size.step or 1)


def _size_notes(record: Record, size: int) -> list[str]:
    """What the check's size covers of the sizes the image was drawn at."""
    if record.hires_size:
        width, height = record.hires_size
        how = f" from {record.hires_upscaler}" if record.hires_upscaler else ""
        notes = [
            f"The image was drawn again at {width}x{height}{how} (a hires fix or second "
            f"sampler): the check ran at {size} px, that pass's size, where its denoiser and "
            "VAE ran."
        ]
        if size < max(width, height):
            notes.append(
                f"{size} px is twice the model's native size, the most a check of an image "
                "runs; overflow that appears only at larger sizes is not tested."
            )
        upscaler = record.hires_upscaler
        if upscaler and _enlarges_pixels(upscaler):
            notes.append(
                f"{upscaler} enlarges pixels: the tool decoded the first picture, enlarged it "
                "and encoded it again, so the check also ran the VAE's encoder at that size, on "
                "the picture the VAE decoded there."
            )
            if hires.key_for(upscaler) is None:  # a model file that enlarges: not the VAE
                notes.append(hires.refusal(upscaler))
        return notes
    if max(record.width or 0, record.height or 0) > size:
        return [
            f"The image records a size of {record.width}x{record.height}; the check ran at "
            f"{size} px, the model's native size, so overflow that appears only at larger "
            "sizes is not tested."
        ]
    return []


def _enlarges_pixels(upscaler: str | None) -> bool:
    """Whether an image's hires upscaler enlarges the decoded picture, which the VAE encodes
    again: a pixel upscaler HalfSafe runs (Lanczos), an upscaler model file (ESRGAN), or
    ComfyUI's image scale ("bislerp (pixels)")."""
    if not upscaler:
        return False
    key = hires.key_for(upscaler)
    if key is not None:
        return hires.enlarges_pixels(key)
    return hires.is_model_upscaler(upscaler) or upscaler.lower().endswith("(pixels)")


def _clip_skip(explanation: Explanation, model) -> int:
    """The image's Clip skip where its model reads it (a note where it does not)."""
    wanted = explanation.record.clip_skip
    if wanted is None or wanted <= 1:
        return 1
    family = family_of(model.pipeline)
    if family.clip_skip_problem(wanted) is not None:
        explanation.notes.append(
            f"The image records Clip skip {wanted}, which {family.title} does not use; the "
            "check read the prompt as the model does."
        )
        return 1
    encoders = [getattr(model.pipeline, n, None) for n in ("text_encoder", "text_encoder_2")]
    layers = min(e.config.num_hidden_layers for e in encoders if e is not None)
    if wanted > layers:
        explanation.notes.append(
            f"The image records Clip skip {wanted}, more than the text encoder's {layers} "
            f"layers; the check read the prompt at {layers}."
        )
        return layers
    return wanted


def _own_steps(model, fallback: int) -> int:
    """The step count a check of an image that records none probes at: the model's own where
    its family states one (Z-Image Turbo's 9), else `fallback` (the check's default)."""
    defaults = generation_defaults(getattr(model, "architecture", None))
    return defaults.steps if defaults is not None else fallback
