"""What a stage that starts from a picture hands the VAE's encoder, written once for the check
and generation: a hires fix's enlarged picture (`pixels`), an edit's references, or the input
picture and, for inpainting, the picture with its hole grey (as an inpainting model takes it
beside the mask)."""

from __future__ import annotations

from typing import Any

from app.core.images.pictures import Mode, Pictures


def encoded(
    family,
    vae,
    device,
    pictures: Pictures | None = None,
    references: list[Any] | None = None,
    pixels: Any = None,
) -> list[Any]:
    """The latents of each part, in order: `pixels` (B, C, H, W) in [-1, 1]; else each of an
    edit's `references` (as the caller's path reads them from `pictures`); else the input
    picture, and for inpainting the picture with its hole."""
    if pixels is not None:
        return [family.encode_pixels(vae, pixels.to(device))]
    if references is not None:
        return [family.encode_pixels(vae, part.to(device)) for part in references]
    assert pictures is not None  # only a path that starts from a picture encodes one
    parts = [family.encode_pixels(vae, pictures.pixels.to(device))]
    if pictures.mode is Mode.INPAINT:
        parts.append(family.encode_pixels(vae, pictures.masked_pixels().to(device)))
    return parts
