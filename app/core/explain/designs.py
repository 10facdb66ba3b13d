"""What a picture made on purpose cannot show: the evidence a fault verdict needs beyond how a
picture looks. A normal map, pixel art, a logo, a flat poster, a seamless texture, a tinted
scene, dithered art and a UI mock-up can look flat, saturated, noisy, tiled, like static or
like false colour (tests/support/on_purpose.py draws each kind); a record beside them says a
tool made them, not that the tool failed. numpy only.

The figures (measured on the pictures of tests/core/test_on_purpose.py and the faults of
test_looks, test_signatures and test_explain_flat):
- `equal`: the share of neighbouring pixels (along the rows and the columns, the lower) that
  are exactly alike in every channel. Drawn flat colours repeat exactly (pixel art, icons,
  posters, UI: 0.5 and up, dithering enlarged 0.5 and up); a decoded picture varies in its
  last bits (decoded noise 0.013, smooth fields apart 0.000, per-pixel noise 0.000).
- `normal_map`: the share of pixels that are unit vectors with blue (z) up, as a tangent-space
  normal map writes every pixel ((n + 1) / 2 * 255, rounded or truncated: within 0.03 of unit
  length). Every normal map measures 1.0; smooth fields apart around (128, 128, 255) 0.3 at
  most, other false colour and noise 0.05 at most.
- `independent`: the largest correlation, either sign, of pixels 1 to 4 px apart along the
  rows and the columns. Static has none (0.002 at most); dithering has its picture's and its
  pattern's (0.23 and up).
- `band`: one exact colour that fills a box inset from every edge, with varied pixels around
  it, as all-zero latents decode (test_explain_flat: a box inset 56 px and more, filled 0.75 and
  up, neighbours around it alike 0.47 at most); a design's panel sits among flat colours
  (alike 0.9 and up).
- `within`: the steps between neighbouring pixels inside a tile or block (those near its grid
  lines left out): the share that are 0.01 (rms) or more and more colour than brightness.
  Colour grain or latents' noise a kernel writes per tile: 0.48 and up; a texture's grain
  moves in brightness and its edges are few (0.32 at most), a mosaic's cells are flat (0).
- `enlarged`: a picture that is a smaller one enlarged by nearest neighbour (every k x k cell
  one colour) is pixel art; an overflow's clipped specks are no such cells.
- a box of noise (`regions`) drawn in flat colours (`equal` inside it 0.3 or more) is a
  design's, not a pass's decoded noise.
- an exact repeat: a picture that equals itself shifted by a period, pixel for pixel, along
  the rows or the columns is a texture laid as tiles, not noise nor false colour.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.core.images.channels import channel_all, channel_mean, channel_sum, pixel_dot

# Evidence: a fault is claimed only with one of these; the keys name it in the JSON.
WHOLE = 0.99  # of the pixels: one exact colour over the whole picture
EQUAL_DRAWN = 0.3
NORMAL_MAP = 0.98
_UNIT = 0.03
INDEPENDENT = 0.05
BAND_MARGIN = 8  # px, a latent cell
BAND_FILL = 0.7
BAND_ALIKE = 0.7
WITHIN_NOISY = 0.4
WITHIN_STEP = 0.01
REPEAT_FROM = 4  # px, the shortest period of an exact repeat
REPEAT_EXACT = 0.95
_CROP = 1024
# The record's (or the log's) own evidence of the fast path that draws tiles.
RECORDED_PATHS = ("low_bit_file", "inpaint_low_bit", "prefix_cache", "unexpected_keys")
# The statuses of a fault that needs evidence, and what each becomes without it.
NEEDS_EVIDENCE = {
    "nan_zeroed": "flat",
    "saturated": "unclaimed",
    "noise": "unclaimed",
    "tiled_noise": "unclaimed",
    "rgb_static": "unclaimed",
    "false_colour": "unclaimed",
    "noise_region": "unclaimed",
}


@dataclass(frozen=True)
class Design:
    """The figures that tell a fault from a picture made so on purpose, and the evidence found
    (`proof`: a key of PROOF_WORDS in `findings`, or None: nothing a design cannot show)."""

    equal: float
    normal_map: float
    proof: str | None = None
    independent: float | None = None
    within: tuple[float, float] | None = None  # share of noisy steps, median step

    def to_json(self) -> dict[str, Any]:
        return {
            "equal": round(self.equal, 4),
            "normal_map": round(self.normal_map, 4),
            "independent": None if self.independent is None else round(self.independent, 4),
            "within": None if self.within is None else [round(v, 4) for v in self.within],
            "proof": self.proof,
        }


def _centre(rgb):
    height, width = rgb.shape[:2]
    top, left = max(0, (height - _CROP) // 2), max(0, (width - _CROP) // 2)
    return rgb[top : top + _CROP, left : left + _CROP]


def equal_share(rgb) -> float:
    """The share of neighbouring pixels exactly alike, the lower of rows and columns."""
    across = channel_all(rgb[:, 1:] == rgb[:, :-1])
    down = channel_all(rgb[1:] == rgb[:-1])
    if not across.size or not down.size:
        return 1.0
    return float(min(across.mean(), down.mean()))


def normal_share(rgb) -> float:
    """The share of pixels that are unit normals with blue up."""
    import numpy as np

    vectors = rgb.astype(np.float32) / 127.5 - 1.0
    length = np.sqrt(channel_sum(vectors * vectors))
    return float(((np.abs(length - 1.0) <= _UNIT) & (rgb[..., 2] >= 127)).mean())


def independence(rgb) -> float:
    """The largest correlation, either sign, of pixels 1 to 4 px apart."""
    import numpy as np

    unit = rgb.astype(np.float32) / 255.0
    centred = unit - unit.mean(axis=(0, 1))
    variance = pixel_dot(centred, centred)
    if variance <= 0:
        return 1.0
    found = 0.0
    for lag in (1, 2, 3, 4):
        for a, b in ((centred[:, :-lag], centred[:, lag:]), (centred[:-lag], centred[lag:])):
            found = max(found, abs(pixel_dot(a, b) / variance))
    return found


def zero_latent_band(rgb, flat) -> bool:
    """Whether the flat colour fills a box inset from every edge among varied pixels, as
    all-zero latents decode (zero padding leaves a band of detail along the edges)."""
    import numpy as np

    height, width = rgb.shape[:2]
    x0, y0, x1, y1 = flat.box
    if min(x0, y0, width - x1, height - y1) < BAND_MARGIN:
        return False
    if flat.share * height * width < BAND_FILL * (x1 - x0) * (y1 - y0):
        return False
    outside = np.ones((height, width), bool)
    outside[y0:y1, x0:x1] = False
    across = channel_all(rgb[:, 1:] == rgb[:, :-1])[outside[:, 1:] & outside[:, :-1]]
    down = channel_all(rgb[1:] == rgb[:-1])[outside[1:] & outside[:-1]]
    pairs = across.size + down.size
    return pairs > 0 and float(across.sum() + down.sum()) / pairs <= BAND_ALIKE


def _one_clipped_colour(rgb) -> bool:
    """Whether one colour with every channel at 0 or 255 covers the whole picture."""
    import numpy as np

    codes = (rgb[..., 0] // 255) * 4 + (rgb[..., 1] // 255) * 2 + rgb[..., 2] // 255
    clipped = channel_all((rgb == 0) | (rgb == 255))
    counts = np.bincount(codes[clipped].astype(np.int64).ravel(), minlength=8)
    return float(counts.max()) >= WHOLE * clipped.size


def enlarged(rgb) -> bool:
    """Whether the picture is a smaller one enlarged by nearest neighbour (pixel art, dithered
    art enlarged): every k x k cell one colour, for a k of 2 to 16."""
    height, width = rgb.shape[:2]
    for k in range(2, 17):
        rows, columns = height // k * k, width // k * k
        if rows < k or columns < k:
            break
        cut = rgb[:rows, :columns]
        if (cut == cut[::k, ::k].repeat(k, axis=0).repeat(k, axis=1)).all():
            return True
    return False


def within_tiles(rgb, tiled) -> tuple[float, float]:
    """The steps between neighbouring pixels inside a tile (`tiled`: `looks.Tiled`), those
    within reach of a block grid's lines left out: (colour part against brightness part, rms
    step, 0..1)."""
    import numpy as np

    unit = rgb.astype(np.float32) / 255.0
    steps = unit[:, 1:] - unit[:, :-1]
    if tiled.kind == "blocks":
        period = tiled.period
        reach = max(1, period // 8)
        energy = (steps**2).mean(axis=(0, 2))
        usable = len(energy) // period * period
        line = int(energy[:usable].reshape(-1, period).mean(axis=0).argmax())
        offsets = np.arange(steps.shape[1]) % period
        near = np.abs(((offsets - line + period // 2) % period) - period // 2) <= reach
        rows = np.arange(steps.shape[0]) % period
        row_energy = ((unit[1:] - unit[:-1]) ** 2).mean(axis=(1, 2))
        row_line = int(
            row_energy[: len(row_energy) // period * period]
            .reshape(-1, period)
            .mean(axis=0)
            .argmax()
        )
        near_rows = np.abs(((rows - row_line + period // 2) % period) - period // 2) <= reach + 1
        steps = steps[~near_rows][:, ~near]
    if not steps.size:
        return 0.0, 0.0
    brightness = channel_mean(steps)
    colour_part = channel_sum((steps - brightness[..., None]) ** 2)
    brightness_part = 3 * brightness**2
    size = np.sqrt(channel_mean(steps**2))
    noisy = (colour_part > brightness_part) & (size >= WITHIN_STEP)
    return float(noisy.mean()), float(np.median(size))


def repeats_exactly(rgb) -> bool:
    """Whether the picture repeats itself exactly, pixel for pixel, at some period along the
    rows or the columns (a texture laid as tiles), judged on a few rows and columns."""

    rows = rgb[:: max(1, rgb.shape[0] // 16)]
    columns = rgb[:, :: max(1, rgb.shape[1] // 16)].swapaxes(0, 1)
    for lines in (rows, columns):
        length = lines.shape[1]
        for period in range(REPEAT_FROM, length // 2 + 1):
            if (lines[:, period:] == lines[:, :-period]).all(axis=-1).mean() >= REPEAT_EXACT:
                return True
    return False


def design(status: str, rgb, figures) -> Design:
    """The figures of an (H, W, 3) uint8 picture whose pixels show `status` (a NEEDS_EVIDENCE
    key, "flat" for nan_zeroed), and the pixels' own evidence of the fault, if any."""
    import numpy as np

    full = np.asarray(rgb)
    rgb = _centre(full)
    equal, normals = equal_share(rgb), normal_share(rgb)
    drawn = equal >= EQUAL_DRAWN or normals >= NORMAL_MAP
    proof = None
    independent = within = None
    if status == "flat":
        flat = figures.flat
        if flat.mid_grey and flat.share >= WHOLE:
            proof = "whole_grey"
        elif not flat.mid_grey and zero_latent_band(full, flat):
            proof = "zero_latent_band"
    elif status == "saturated":
        single = bool((rgb == rgb[0, 0]).all())
        whole = _one_clipped_colour(rgb) and (single or not enlarged(rgb))
        proof = "one_clipped_colour" if whole else None
    elif status == "noise_region":
        x0, y0, x1, y1 = figures.noise_region.box
        proof = "decoded" if equal_share(full[y0:y1, x0:x1]) < EQUAL_DRAWN else None
    elif status == "rgb_static":
        independent = independence(rgb)
        proof = "independent_pixels" if independent <= INDEPENDENT else None
    elif status in ("noise", "false_colour"):
        proof = None if drawn or repeats_exactly(rgb) else "decoded"
    elif status == "tiled_noise":
        within = within_tiles(rgb, figures.tiled)
        proof = "noise_in_tiles" if within[0] >= WITHIN_NOISY and normals < NORMAL_MAP else None
    return Design(equal, normals, proof, independent, within)


def recorded_path(kinds: list[str]) -> str | None:
    """The first of the look's suspects (their kinds) that the record or the log names, not
    one guessed from a version: the record's own evidence of the fast path."""
    return next((kind for kind in kinds if kind in RECORDED_PATHS), None)
