"""How an inpainting job lays its picture out, as A1111's img2img and Krita's canvas have it: the
drawn result blended back into the kept picture through the mask, blurred by `mask_blur`
pixels; "only masked", where only the mask's box (grown by `padding` pixels, then to the
job's proportions) is drawn at the job's size and pasted back into the picture at the
picture's own size, so a small area of a large photo is drawn at the model's full resolution;
and outpainting, the canvas extended on any side and the new area drawn.

The mask the pipeline reads stays hard (white where it is at least half grey); the soft mask (a
soft brush's greys, then the blur) only says how the result is blended in. An extended area
starts as the picture's edge stretched outwards and blurred, so that image-to-image at a
strength below 1 has colours that continue the picture's to start from. Pillow and NumPy only,
on decoded pictures (`pictures` decodes them within bounds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from app.core.errors import HalfSafeError

MASK_BLUR_DEFAULT = 4  # pixels (A1111's default)
PADDING_DEFAULT = 32  # pixels around the mask's box, for "only masked" (A1111's default)
MASK_BLUR_RANGE = (0, 64)
PADDING_RANGE = (0, 1024)
EXTEND_RANGE = (0, 2048)  # pixels added to one side
# How far into the kept picture an extension's mask reaches, so that the seam is drawn anew.
EXTEND_OVERLAP = 16
SIDES = ("left", "top", "right", "bottom")


@dataclass(frozen=True)
class Canvas:
    """An inpainting job's layout. `extend` is the pixels added to the picture's left, top,
    right and bottom (at the picture's own size); any of them makes the job an inpainting one,
    with or without a mask of the user's. The defaults draw the whole picture, blend with a
    4-pixel blur and extend nothing."""

    mask_blur: int = MASK_BLUR_DEFAULT
    only_masked: bool = False
    padding: int = PADDING_DEFAULT
    extend: tuple[int, int, int, int] = (0, 0, 0, 0)

    @property
    def extends(self) -> bool:
        return any(self.extend)

    def checked(self) -> Canvas:
        """This layout, or HalfSafeError in one sentence for a number out of its range."""
        _in_range("Mask blur", self.mask_blur, MASK_BLUR_RANGE)
        _in_range("Masked area padding", self.padding, PADDING_RANGE)
        if not isinstance(self.only_masked, bool):
            raise HalfSafeError(f"Only masked: {self.only_masked!r} is not true or false.")
        if not isinstance(self.extend, (tuple, list)) or len(self.extend) != len(SIDES):
            raise HalfSafeError(
                f"Extend: {self.extend!r} is not four numbers of pixels (left, top, right, bottom)."
            )
        for side, pixels in zip(SIDES, self.extend, strict=True):
            _in_range(f"Extend {side}", pixels, EXTEND_RANGE)
        return self

    def extended_words(self) -> str | None:
        """The extension as the record says it ("right 256, bottom 128"), or None."""
        if not self.extends:
            return None
        return ", ".join(
            f"{side} {pixels}" for side, pixels in zip(SIDES, self.extend, strict=True) if pixels
        )


def _in_range(name: str, value: Any, bounds: tuple[int, int]) -> None:
    low, high = bounds
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise HalfSafeError(
            f"{name}: {value!r} is not a whole number of pixels from {low} to {high}."
        )


@dataclass(frozen=True)
class Paste:
    """Where a drawn result goes back: into `picture` (RGB, the size the saved image has) at
    `box` (left, top, right, bottom), blended through `mask` (greyscale, the picture's size:
    white takes the result, black keeps the picture)."""

    picture: Any
    mask: Any
    box: tuple[int, int, int, int]

    @property
    def size(self) -> tuple[int, int]:
        return self.picture.size

    @property
    def box_share(self) -> float:
        """The share of the saved image the drawn box covers."""
        left, top, right, bottom = self.box
        width, height = self.size
        return (right - left) * (bottom - top) / (width * height)

    def onto(self, drawn: Any) -> Any:
        """The saved image: `drawn` (the job's output, at the job's size) scaled to the box and
        blended into the picture."""
        from PIL import Image

        left, top, right, bottom = self.box
        region = drawn.convert("RGB")
        if region.size != (right - left, bottom - top):
            region = region.resize((right - left, bottom - top), Image.Resampling.LANCZOS)
        out = self.picture.copy()
        out.paste(region, (left, top), self.mask.crop(self.box))
        return out

    def place_box(
        self, box: tuple[int, int, int, int], width: int, height: int
    ) -> tuple[int, int, int, int]:
        """A box of the drawn output (x0, y0, x1, y1 in its `width` x `height` pixels, the
        ends exclusive) where it lies in the saved image: every saved pixel it covers."""
        left, top, right, bottom = self.box
        sx, sy = (right - left) / width, (bottom - top) / height
        x0, y0, x1, y1 = box
        return (
            left + math.floor(x0 * sx),
            top + math.floor(y0 * sy),
            min(right, left + math.ceil(x1 * sx)),
            min(bottom, top + math.ceil(y1 * sy)),
        )


def lay_out(picture: Any, grey: Any, canvas: Canvas, width: int, height: int):
    """An inpainting job's picture and mask as the pipeline draws them, and where the result
    goes back. `picture` (RGB) and `grey` (the mask, L, already at the picture's size) are at
    the picture's own size. Returns (picture, mask), both `width` x `height`, and the Paste."""
    from PIL import Image, ImageFilter

    if canvas.extends:
        picture, grey = extended(picture, grey, canvas.extend)
    if canvas.only_masked:
        box = masked_box(grey, canvas.padding, width / height)
    else:
        picture = fit(picture, width, height)
        if grey.size != (width, height):
            grey = grey.resize((width, height), Image.Resampling.BILINEAR)
        box = (0, 0, width, height)
    soft = grey.filter(ImageFilter.GaussianBlur(canvas.mask_blur)) if canvas.mask_blur else grey
    drawn = fit(picture.crop(box), width, height)
    drawn_mask = grey.crop(box)
    if drawn_mask.size != (width, height):
        drawn_mask = drawn_mask.resize((width, height), Image.Resampling.BILINEAR)
    return drawn, drawn_mask, Paste(picture, soft, box)


def extended_size(size: tuple[int, int], extend: tuple[int, int, int, int]) -> tuple[int, int]:
    left, top, right, bottom = extend
    return size[0] + left + right, size[1] + top + bottom


def extended(picture: Any, grey: Any, extend: tuple[int, int, int, int]):
    """The picture with `extend` pixels added to its left, top, right and bottom, the new area
    the picture's edge stretched outwards and blurred; and the mask grown with it, white over
    the new area and `EXTEND_OVERLAP` pixels into the picture, the user's mask kept inside.
    The caller keeps the size within the image reader's bound (`pictures`)."""
    import numpy as np
    from PIL import Image, ImageChops, ImageFilter

    left, top, right, bottom = extend
    w, h = picture.size
    size = extended_size(picture.size, extend)
    pixels = np.asarray(picture.convert("RGB"))
    stretched = np.pad(pixels, ((top, bottom), (left, right), (0, 0)), mode="edge")
    blur = max(extend) / 4
    out = Image.fromarray(stretched).filter(ImageFilter.GaussianBlur(blur))
    out.paste(picture, (left, top))
    new = Image.new("L", size, 255)
    overlap = EXTEND_OVERLAP
    kept = (
        left + (overlap if left else 0),
        top + (overlap if top else 0),
        left + w - (overlap if right else 0),
        top + h - (overlap if bottom else 0),
    )
    if kept[0] < kept[2] and kept[1] < kept[3]:
        new.paste(0, kept)
    mask = Image.new("L", size, 0)
    mask.paste(grey, (left, top))
    return out, ImageChops.lighter(new, mask)


def masked_box(grey: Any, padding: int, aspect: float) -> tuple[int, int, int, int]:
    """The part of the picture "only masked" draws: the box around the mask's white (at least
    half grey), grown by `padding` pixels on each side, then along its shorter side to the
    job's proportions (`aspect`, width over height), kept inside the picture."""
    hard = grey.point(lambda value: 255 if value >= 128 else 0)
    bounds = hard.getbbox()
    w, h = grey.size
    if bounds is None:
        return (0, 0, w, h)
    x0, y0, x1, y1 = bounds
    x0, y0, x1, y1 = x0 - padding, y0 - padding, x1 + padding, y1 + padding
    box_w, box_h = x1 - x0, y1 - y0
    if box_w / box_h < aspect:
        box_w = round(box_h * aspect)
    else:
        box_h = round(box_w / aspect)
    box_w, box_h = min(box_w, w), min(box_h, h)
    centre_x, centre_y = (x0 + x1) / 2, (y0 + y1) / 2
    left = int(min(max(0, round(centre_x - box_w / 2)), w - box_w))
    top = int(min(max(0, round(centre_y - box_h / 2)), h - box_h))
    return (left, top, left + box_w, top + box_h)


def fit(picture: Any, width: int, height: int) -> Any:
    """A picture at width x height (Lanczos, as a photo is scaled)."""
    from PIL import Image

    if picture.size == (width, height):
        return picture
    return picture.resize((width, height), Image.Resampling.LANCZOS)
