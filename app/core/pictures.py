"""The pictures a job starts from: image-to-image's input picture and inpainting's mask, read
within bounds and made into what the pipeline and the VAE's encoder take.

A job's mode follows from what it is given and what the model is: no picture is
text-to-image, a picture is image-to-image, a picture and a mask is inpainting (white in the
mask is painted again, black is kept, as every tool has it); an editing model (Flux.1 Kontext,
Qwen-Image-Edit, Flux.2) given pictures alone edits them, its prompt saying how, with no
strength; a control model (Flux.1 Depth, Canny) given a picture follows it (a depth map or an
edge picture) while it draws from noise, with no strength either. The picture is resized to
the job's size; the mask to the same size, then made hard (0 or 1) at half grey. PIL is
imported inside the functions, so that naming a mode stays cheap (the GUI does).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from app.core.errors import BadFileError, HalfSafeError


class Mode(str, Enum):
    """What a job makes its pictures from. The value is the word the JSON and the PNG use."""

    TEXT = "txt2img"
    IMAGE = "img2img"
    INPAINT = "inpaint"
    EDIT = "edit"
    CONTROL = "control"

    @property
    def words(self) -> str:
        return _MODE_WORDS[self]


_MODE_WORDS = {
    Mode.TEXT: "text-to-image",
    Mode.IMAGE: "image-to-image",
    Mode.INPAINT: "inpainting",
    Mode.EDIT: "editing",
    Mode.CONTROL: "drawing after a control picture",
}

# The modes that draw from noise with every step, whatever the strength.
FROM_NOISE = (Mode.TEXT, Mode.EDIT, Mode.CONTROL)

STRENGTH_DEFAULT = 0.75  # how much of the picture is drawn again (A1111's "denoising strength")

# Why no strength applies to a picture job that draws from noise with every step, by mode (the
# Generate page's caption, and the sentence when a strength was asked for anyway).
NO_STRENGTH_BECAUSE = {
    Mode.EDIT: "an edit draws the whole picture anew from noise with every step",
    Mode.CONTROL: "a control model draws from noise with every step, after the picture",
    Mode.INPAINT: "this model draws the masked area from noise with every step",
}


def mode_of(
    images: Sequence[str], mask: str | None, references: int = 0, control: bool = False
) -> Mode:
    """The mode of a job given these input pictures and this mask, for a model that edits up
    to `references` pictures (0: a model that does not edit), or with `control` a control model.
    A picture and a mask inpaint (whether this model inpaints is its family's to say,
    `Family.picture_problem`); pictures alone are what an editing model edits, the picture a
    control model follows, and image-to-image's one picture for any other model. A mask
    without a picture to mask, a mask with several pictures, more pictures than an editing
    model takes, or several for any other model is refused."""
    if mask is not None and not images:
        raise HalfSafeError("A mask needs the picture it masks: give the input picture too.")
    if mask is not None:
        # A control model takes no mask at all: its family says so (`Family.picture_problem`)
        # whatever the number of pictures.
        if len(images) > 1 and not control:
            raise HalfSafeError(
                f"{len(images)} input pictures were given with a mask; inpainting starts from one."
            )
        return Mode.INPAINT
    if control and images:
        if len(images) > 1:
            raise HalfSafeError(
                f"{len(images)} pictures were given; a control model follows one (a depth map "
                "or an edge picture)."
            )
        return Mode.CONTROL
    if references > 0 and images:
        if len(images) > references:
            takes = "one picture" if references == 1 else f"at most {references} pictures"
            raise HalfSafeError(
                f"{len(images)} pictures were given; this editing model takes {takes}."
            )
        return Mode.EDIT
    if len(images) > 1:
        raise HalfSafeError(
            f"{len(images)} input pictures were given; image-to-image and inpainting start "
            "from one (only an editing model takes several)."
        )
    return Mode.IMAGE if images else Mode.TEXT


def check_flags(images: Sequence[str], mask: str | None) -> None:
    """What can be refused before the model is known: a mask without a picture."""
    if mask is not None and not images:
        raise HalfSafeError("A mask needs the picture it masks: give the input picture too.")


def steps_run(steps: int, strength: float, mode: Mode) -> int:
    """How many of `steps` the pipeline runs: all for text-to-image, editing and a control
    picture (each draws the whole picture anew from noise); for a picture, the last `strength`
    of the schedule (as every diffusers picture pipeline counts them)."""
    if mode in FROM_NOISE:
        return steps
    return min(int(steps * strength), steps)


def check_strength(steps: int, strength: float, mode: Mode) -> None:
    """Refuse a strength outside (0, 1], or one so small that no step runs."""
    if mode in FROM_NOISE:
        return
    if not isinstance(strength, (int, float)) or not 0.0 < strength <= 1.0:
        raise HalfSafeError(
            f"Strength: {strength!r} is not between 0 and 1 (0.75 redraws three quarters)."
        )
    if steps_run(steps, strength, mode) < 1:
        raise HalfSafeError(
            f"Strength: {strength:g} of {steps} steps runs no step; raise the strength or the "
            "steps."
        )


@dataclass(frozen=True)
class Pictures:
    """A job's input, made ready: `pixels` (N, 3, H, W) float32 in [-1, 1] (one picture; for
    editing, one row per reference) and, for inpainting, `mask` (1, 1, H, W) float32, 1 where
    the picture is painted again, with `mask_image` the same as a greyscale PIL image (what a
    pipeline's mask processor takes). `references` are the pictures as RGB PIL images (what an
    editing model's text encoder reads beside the prompt). All on the CPU; `sources` are the
    files they came from."""

    mode: Mode
    pixels: Any
    mask: Any | None
    mask_image: Any | None
    sources: tuple[str, ...]
    references: tuple[Any, ...] = ()

    def masked_pixels(self) -> Any:
        """The picture with the part to paint again set to grey (0), as inpainting models
        take it."""
        if self.mask is None:
            raise ValueError("only an inpainting job's pictures have a mask")
        return self.pixels * (self.mask < 0.5)


def read_pictures(
    images: Sequence[str],
    mask: str | None,
    width: int,
    height: int,
    references: int = 0,
    control: bool = False,
) -> Pictures | None:
    """The input pictures (and mask) at `width` x `height`, or None for text-to-image;
    `references` and `control` as `mode_of` takes them. A file that is not a readable picture
    within the bounds is one sentence naming it."""
    import numpy as np
    import torch

    mode = mode_of(images, mask, references, control)
    if mode is Mode.TEXT:
        return None
    opened = [_open(Path(image).expanduser(), "RGB", width, height) for image in images]
    unit = np.stack([np.asarray(picture, dtype=np.float32) for picture in opened]) / 255.0
    pixels = torch.from_numpy(unit).permute(0, 3, 1, 2) * 2.0 - 1.0
    mask_tensor = mask_image = None
    sources = tuple(str(image) for image in images)
    if mask is not None:
        grey = _open(Path(mask).expanduser(), "L", width, height)
        hard = (np.asarray(grey, dtype=np.float32) >= 128.0).astype(np.float32)
        if not hard.any():
            raise BadFileError(
                mask, "the mask is black all over, so nothing would be painted (white is painted)."
            )
        mask_tensor = torch.from_numpy(hard)[None, None]
        from PIL import Image

        mask_image = Image.fromarray((hard * 255).astype(np.uint8), "L")
        sources += (str(mask),)
    kept = tuple(opened) if mode is Mode.EDIT else ()
    return Pictures(mode, pixels.contiguous(), mask_tensor, mask_image, sources, kept)


def picture_size(path: str, native: int, step: int = 16) -> tuple[int, int]:
    """The size to draw a picture at when the user gave none: its own proportions, its longer
    side the model's native size, each side a multiple of `step` (every family's grid
    divides 16). Reads the file's header only; a file that is no picture is one sentence."""
    from PIL import Image, UnidentifiedImageError

    from app.core.images import read_head

    file = Path(path).expanduser()
    read_head(file)
    try:
        with Image.open(file) as image:
            w, h = image.size
    except UnidentifiedImageError:
        raise BadFileError(file, "not a picture HalfSafe can read (PNG, JPEG or WebP).") from None
    except (OSError, ValueError) as error:
        raise BadFileError(file, f"the picture cannot be read ({error}).") from None
    if not w or not h:
        raise BadFileError(file, f"says it is {w}x{h} pixels.")
    scale = native / max(w, h)
    return tuple(max(step, round(side * scale / step) * step) for side in (w, h))  # type: ignore[return-value]


def _open(path: Path, kind: str, width: int, height: int):
    """A picture file decoded as `kind` ("RGB" or "L") at width x height, within the bounds
    of the image reader (file size and pixel count checked before it is decoded)."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    from app.core.images import MAX_PIXELS, read_head

    read_head(path)  # a file, and not larger than a picture can be
    try:
        with Image.open(path) as image:
            w, h = image.size
            if not w or not h or w * h > MAX_PIXELS:
                raise BadFileError(
                    path,
                    f"says it is {w}x{h} pixels; input pictures of 1 to "
                    f"{MAX_PIXELS // 1_000_000} million pixels are read.",
                )
            image.load()
            upright = ImageOps.exif_transpose(image) or image
            converted = upright.convert(kind)
    except BadFileError:
        raise
    except UnidentifiedImageError:
        raise BadFileError(path, "not a picture HalfSafe can read (PNG, JPEG or WebP).") from None
    except (OSError, ValueError, Image.DecompressionBombError) as error:
        raise BadFileError(path, f"the picture cannot be read ({error}).") from None
    if converted.size != (width, height):
        resample = Image.Resampling.LANCZOS if kind == "RGB" else Image.Resampling.BILINEAR
        converted = converted.resize((width, height), resample)
    return converted
