"""What a failed picture looks like beyond NaN-black and one flat colour: saturated (white, or
every channel at 0 or 255: values that overflowed to infinity, clipped when the image was
written) and coloured noise (latents never denoised, or decoded by a VAE they were not made
for, or a quantised file read wrongly). numpy only.

Each signature is chosen so that a genuine picture does not show it. A white picture (snow, a
white background) still carries the VAE's noise in its last bits; only an overflow writes 255
in every channel of almost every pixel. Noise is told from a picture by two figures that a
picture keeps and noise does not (measured on 1/f^alpha fields, the spectrum of photographs,
with grain and colour grain added, dark and bright, on stars and on photos; on the demo's own
pictures, a flat shape of one colour on another, at 128 to 512 px; and on noise per pixel,
upsampled 2 to 16 times and decoded from latent-sized noise: tests/core/test_signatures.py):
- correlation: how alike pixels 16 px apart are (the correlation of the three channels' values
  at that distance, along the rows, the columns and both diagonals), and also 32 px apart in a
  picture of 512 px and more, the lower of the two. Noise's grains are independent beyond their
  width (a latent cell decodes to 8 px, noise upsampled 2-4 times is 2-4 px wide), so it
  measures 0 give or take its sampling: -0.05 to 0.05 at 128 px, where a 16x16 latent is few
  grains, and within 0.03 from 256 px. A picture's shapes are wider than 16 px: a thumbnail of
  one shape on a background measures 0.54 and up, a 1/f photograph 0.09 and up at 128 px and
  0.17 and up from 256 px. The distance is fixed in pixels, not a share of the picture, because
  noise's grain is (the VAE's 8 px at any size), and 32 px joins it where a picture is large
  enough to keep its correlation there (0.17 and up) and noise of a second pass's 16 px grain
  must not pass.
- colour: the colour part of the differences between neighbouring pixels, against their
  brightness part. In a photograph, even with coloured grain, neighbours differ mostly in
  brightness (0.02 to 0.30); in decoded random latents the channels vary apart (1.6 and up).
  A picture of flat colours (the demo's red circle on blue, an icon) differs in colour at its
  edges (up to 300): there the correlation carries the margin.
A fine texture (stars, gravel, a knit) has no correlation at 16 px either but is mostly
brightness, so only noise that fails both is called noise; grey or brown noise is not told from
such a texture by its pixels and is not claimed from them (a box of it a pass drew is, against
the picture made again: `remake.pass_box`).

`structure` (the share of the brightness variance that survives averaging over 64 px blocks) is
kept for a box of noise (`regions`, `remake.pass_box`), which is at least 128 px and compared
with the picture beside it: it is not the whole picture's test, since a picture under 512 px
with a centred subject in colours of one brightness keeps none (the demo's red circle on blue
at 128 px: 0.0003), however much a picture it is.

Inverted colours (the picture's negative, as a faulty decode can write it) have no signature
here: a negative is as natural a picture by every figure above and by the tone figures that
could tell one (the darkest and brightest channel over 16 px blocks, the skew of the
brightness): a night scene's negative has a snow scene's figures, a product shot's on white
one on black, a starry sky's a drawing's (tests/core/test_signatures.py measures it). Only the
picture made again from its record, beside the file, tells: `remake` (`explain --remake`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.core.images.channels import channel_all, channel_mean, pixel_dot

# Saturated: at least this share of the pixels has every channel at 0 or 255, and not all are
# 0 (that is NaN-black). A clipped white background, however large, leaves the subject.
SATURATED_SHARE = 0.999
_CLIPPED = (0, 255)
# Coloured noise: correlation at most this (noise measured 0.05 at most at 128 px, pictures
# 0.09 and up there, 0.17 and up from 256 px) with colour at least this (photographs measured
# 0.30 at most with heavy coloured grain, noise 1.6 and up).
NOISE_CORRELATION = 0.075
NOISE_COLOUR = 1.0
# A box of noise (`regions`, `remake.pass_box`): structure at most this (pictures measured 0.12
# and up at 512 px, noise 0.05 at most).
NOISE_STRUCTURE = 0.1
_BLOCK = 64
# The distances of the correlation, px: the first always, the second from _FAR_SIDE up.
_NEAR, _FAR, _FAR_SIDE = 16, 32, 512
# The figures are measured on the centre of a large picture: a crop of at most this side keeps
# the work and memory bounded (a 1536 px crop is a few tens of MB of floats).
_CROP = 1536
_MIN_SIDE = 2 * _BLOCK


@dataclass(frozen=True)
class Saturated:
    """Almost every pixel has every channel at 0 or 255: `colour` is the most common one."""

    colour: tuple[int, int, int]
    share: float  # of the pixels, with every channel at 0 or 255

    @property
    def white(self) -> bool:
        return self.colour == (255, 255, 255)

    def to_json(self) -> dict[str, Any]:
        return {"colour": list(self.colour), "share": round(self.share, 4), "white": self.white}


@dataclass(frozen=True)
class Noise:
    """The figures that tell noise from a picture (see the module's words)."""

    structure: float
    colour: float
    correlation: float = 1.0

    @property
    def coloured_noise(self) -> bool:
        return self.correlation <= NOISE_CORRELATION and self.colour >= NOISE_COLOUR

    def to_json(self) -> dict[str, Any]:
        return {
            "structure": round(self.structure, 4),
            "colour": round(self.colour, 4),
            "correlation": round(self.correlation, 4),
            "coloured_noise": self.coloured_noise,
        }


def saturated(rgb) -> Saturated | None:
    """The saturated signature of an (H, W, 3) uint8 picture, or None."""
    import numpy as np

    rgb = np.asarray(rgb)
    if rgb.ndim != 3 or rgb.shape[-1] != 3 or not rgb.size:
        return None
    clipped = channel_all((rgb == 0) | (rgb == 255))
    share = float(clipped.mean())
    if share < SATURATED_SHARE or not rgb.any():
        return None
    pixels = rgb[clipped].reshape(-1, 3)
    codes = (pixels[:, 0] // 255) * 4 + (pixels[:, 1] // 255) * 2 + pixels[:, 2] // 255
    code = int(np.bincount(codes.astype(np.int64), minlength=8).argmax())
    colour = tuple(_CLIPPED[(code >> shift) & 1] for shift in (2, 1, 0))
    return Saturated((colour[0], colour[1], colour[2]), share)


def noise(rgb) -> Noise | None:
    """The noise figures of an (H, W, 3) uint8 picture (its centre, at most _CROP square), or
    None for a picture too small to measure or with no variance at all (flat: another rule)."""
    import numpy as np

    rgb = np.asarray(rgb)
    if rgb.ndim != 3 or rgb.shape[-1] != 3 or min(rgb.shape[:2]) < _MIN_SIDE:
        return None
    height, width = rgb.shape[:2]
    top, left = max(0, (height - _CROP) // 2), max(0, (width - _CROP) // 2)
    crop = rgb[top : top + _CROP, left : left + _CROP].astype(np.float32) / 255.0
    rows, columns = (crop.shape[0] // _BLOCK) * _BLOCK, (crop.shape[1] // _BLOCK) * _BLOCK
    crop = crop[:rows, :columns]
    brightness = channel_mean(crop)
    variance = float(brightness.var())
    if variance < 1e-8:
        return None
    blocks = brightness.reshape(rows // _BLOCK, _BLOCK, columns // _BLOCK, _BLOCK).mean((1, 3))
    structure = float(blocks.var()) / variance
    steps = np.diff(crop, axis=1)
    step_brightness = channel_mean(steps)
    colour_steps = steps - step_brightness[..., None]
    colour_part = pixel_dot(colour_steps, colour_steps)
    brightness_part = float((step_brightness**2).mean()) * 3
    colour = colour_part / brightness_part if brightness_part > 0 else 0.0
    return Noise(structure, colour, correlation(crop))


def correlation(unit) -> float:
    """How alike the pixels of an (H, W, 3) 0..1 float picture are _NEAR px apart, and _FAR px
    apart where its short side is at least _FAR_SIDE: the lower of the two, each the mean over
    the rows, the columns and both diagonals of the channels' products against their variance
    (-1..1; 0 for a picture without variance)."""
    centred = unit - unit.mean(axis=(0, 1))
    variance = pixel_dot(centred, centred)
    if variance <= 0:
        return 0.0
    side = min(centred.shape[:2])
    found = []
    for lag in (_NEAR, _FAR) if side >= _FAR_SIDE else (_NEAR,):
        step = round(lag / 2**0.5)  # a diagonal neighbour as far away
        pairs = (
            (centred[:, :-lag], centred[:, lag:]),
            (centred[:-lag], centred[lag:]),
            (centred[:-step, :-step], centred[step:, step:]),
            (centred[:-step, step:], centred[step:, :-step]),
        )
        products = [pixel_dot(a, b) for a, b in pairs]
        found.append(sum(products) / len(products) / variance)
    return min(found)
