"""What a picture looks like when a tool's fast path fails rather than fp16: tiled or blocky
noise (a low-bit kernel wrong per tile: int8 GEMM on an older card, int8 ConvRot with an
inpainting sampler), RGB static and false colour (paged weights read back wrong: DynamicVRAM on
AMD). numpy only; the words are `findings.LOOK_WORDS`, the causes the record shows `suspects`.

Each is told apart from what `signatures` already names (coloured noise, saturated, flat) and
from pictures by figures measured on generated sets (tests/core/test_looks.py: 1/f fields, the
spectrum of photographs, with grain, colour grain, dark, bright, tinted and with their channels
nearly apart; the demo's flat shapes with and without grain; coloured noise per pixel, enlarged
2 to 4 times and decoded from latents; an fp16 overflow written as a tool writes it):
- tiled: the picture repeats itself at a kernel's tile size (`TILE_PERIODS`) along the rows and
  the columns ("repeat": the correlation at the period against the best a quarter-period either
  side), or its steps between neighbours all fall on a grid of that size ("blocks": the share
  of the step energy near the grid lines) with blocks unlike their neighbours.
  The smallest such period is named (a repeat at 32 px repeats at 64 too; 4 px blocks lie on an
  8 px grid twice per period, which the half-period test refuses).
- RGB static: every pixel its own, saturated colour: almost every channel value near 0 or 255,
  neighbours no more alike than any two pixels, and most pixels far from grey. Coloured noise
  drawn from a VAE's latents has grains (its neighbours alike) and middling values; an overflow
  to infinity (`signatures.saturated`) keeps the shapes of the values that overflowed.
- false colour: a smooth picture (correlation at 16 px of a picture's, not noise's) whose
  colours sit around one strong colour that is no grey (a normal map's (128, 128, 255)), whose
  shapes are drawn in hue rather than brightness and spread over the colour plane rather than
  along one line (two flat colours of a design differ along one).
The figures of a large picture are measured on its centre, at most `_CROP` square.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.core.images.channels import channel_mean, pixel_dot

TILE_PERIODS = (8, 16, 32, 64, 128)
# Repeat: the correlation at the period at least REPEAT, and at least REPEAT_PEAK above the
# higher of the two a quarter-period either side. Measured: repeated tiles (noise per pixel,
# decoded latents, smooth 1/f tiles, smoothed) 0.99 and up at the period, a peak of 0.45 and
# up; pictures, noise, blocks, static and false colour a peak of -0.008 at most wherever they
# correlate at REPEAT or more (a smooth picture correlates as much a quarter-period nearer).
REPEAT = 0.6
REPEAT_PEAK = 0.2
# Blocks, along both axes: at least BLOCK_EDGES of the step energy above the typical column's
# within reach of the grid lines (a pixel, and an eighth of the period on larger grids: a
# decoder smooths a step over more pixels there), at most BLOCK_HALF of that on the lines half
# a period away, no quarter of the lines under BLOCK_EVEN of their mean, the lines' energy at
# least BLOCK_CONTRAST times the typical column's and a step of BLOCK_STEP (rms, 0..1) or more,
# and neighbouring blocks' means correlated at most BLOCK_ALIKE. Measured: blocks of 8 to 128
# px, sharp, smoothed over three pixels or with grain, at 512 and 1024 px: share 0.94 and up,
# half 0.021 at most, contrast 38 and up (15 once saved as JPEG at quality 75), step 0.2 and
# up, alike 0.11 at most; smoothed over about eight pixels (from 16 px up; 8 px blocks so
# smoothed are no longer blocks): share 0.94, contrast 44, step 0.13 and up, alike 0.12 at most.
# JPEG's own 8 px blocks (quality 30 to 75, of photographs and of decoded noise) can put 0.94 of
# the excess on a grid, but at a contrast of 7.2 at most and a step of 0.10 at most, and a
# photograph's blocks are alike (0.73 and up): each fails two of the tests or more.
BLOCK_EDGES = 0.7
BLOCK_HALF = 0.3
BLOCK_EVEN = 0.3
BLOCK_CONTRAST = 12.0
BLOCK_STEP = 0.11
BLOCK_ALIKE = 0.4
# RGB static: at least STATIC_EXTREME of the channel values within STATIC_NEAR of 0 or 255, the
# neighbours' correlation at most STATIC_NEIGHBOURS, and at least STATIC_COLOURED of the pixels
# with channels at least half the range apart. Measured: pure R/G/B static, static of every
# channel at 0 or 255 and pure colours 20 levels off the extremes: 1.0 extreme, neighbours
# 0.001 at most, 0.75 and up coloured. An fp16 overflow written as a tool writes it: 1.0
# extreme but neighbours 0.37 (it keeps the shapes of what overflowed); a starry sky: 1.0
# extreme, neighbours 0.003, but grey (coloured 0.0); a night scene and the demo's shapes on
# white 0.8 to 0.86 extreme, neighbours 0.8 and up; every other picture and noise 0.77
# extreme at most.
STATIC_EXTREME = 0.8
STATIC_NEAR = 24
STATIC_NEIGHBOURS = 0.2
STATIC_COLOURED = 0.4
# False colour: correlation at 16 px at least FALSE_SMOOTH (noise measures 0.05 at most:
# `signatures`), the mean colour's chroma (its highest channel less its lowest, 0..1) at
# least FALSE_CAST, the hue part of the variance at least FALSE_HUE times the brightness part,
# and the second spread of the colours in the hue plane at least FALSE_SPREAD of the first.
# Measured: normal maps of smooth surfaces and smooth fields apart around a strong colour:
# correlation 0.15 and up, cast 0.25 and up (a steep surface's normal map leans to grey, 0.11),
# hue 1.58 and up, spread 0.34 and up. Photographs whose channels are nearly apart have hue
# and spread but a cast of 0.003 at most; tinted photographs a cast but hue 0.33 at most; the
# demo's shapes (a colour on another of the same brightness: hue up to 300) a spread of 0.022
# at most, their colours along one line.
FALSE_SMOOTH = 0.1
FALSE_CAST = 0.1
FALSE_HUE = 1.0
FALSE_SPREAD = 0.1
_CROP = 1024
_MIN_SIDE = 128


@dataclass(frozen=True)
class Tiled:
    """A picture that repeats (`kind` "repeat") or breaks into blocks ("blocks") at `period`
    px; `strength` the figure that found it (the repeat's correlation at the period, or the
    blocks' share of the step energy on the grid)."""

    period: int
    kind: str
    strength: float

    def to_json(self) -> dict[str, Any]:
        return {"period": self.period, "kind": self.kind, "strength": round(self.strength, 4)}


@dataclass(frozen=True)
class Static:
    """RGB static's figures: the share of channel values near 0 or 255, the neighbours'
    correlation, and the share of pixels far from grey."""

    extreme: float
    neighbours: float
    coloured: float

    def to_json(self) -> dict[str, Any]:
        return {
            "extreme": round(self.extreme, 4),
            "neighbours": round(self.neighbours, 4),
            "coloured": round(self.coloured, 4),
        }


@dataclass(frozen=True)
class FalseColour:
    """False colour's figures: the mean colour (0..255) and its chroma, the hue part of the
    variance against the brightness part, the second spread in the hue plane against the
    first, and the correlation at 16 px."""

    mean: tuple[int, int, int]
    cast: float
    hue: float
    spread: float
    correlation: float

    def to_json(self) -> dict[str, Any]:
        return {
            "mean": list(self.mean),
            "cast": round(self.cast, 4),
            "hue": round(self.hue, 4),
            "spread": round(self.spread, 4),
            "correlation": round(self.correlation, 4),
        }


def _centre(rgb):
    """The centre of an (H, W, 3) uint8 picture, at most _CROP square, as 0..1 floats; None
    for one too small to measure."""
    import numpy as np

    rgb = np.asarray(rgb)
    if rgb.ndim != 3 or rgb.shape[-1] != 3 or min(rgb.shape[:2]) < _MIN_SIDE:
        return None
    height, width = rgb.shape[:2]
    top, left = max(0, (height - _CROP) // 2), max(0, (width - _CROP) // 2)
    return rgb[top : top + _CROP, left : left + _CROP].astype(np.float32) / 255.0


def _lagged(centred, lag: int, axis: int, variance: float) -> float:
    """The correlation of the channels `lag` px apart along `axis` (1 rows, 0 columns)."""
    if axis == 1:
        a, b = centred[:, :-lag], centred[:, lag:]
    else:
        a, b = centred[:-lag], centred[lag:]
    return float((a * b).sum()) / (a.shape[0] * a.shape[1]) / variance


def _repeat(centred, variance: float, period: int) -> float:
    """How much more alike pixels `period` apart are than a quarter-period nearer or farther:
    the lower over the rows and the columns; -1 where the correlation at the period is under
    REPEAT."""
    quarter = max(1, period // 4)
    peaks = []
    for axis in (0, 1):
        at = _lagged(centred, period, axis, variance)
        if at < REPEAT:
            return -1.0
        near = max(
            _lagged(centred, period - quarter, axis, variance),
            _lagged(centred, period + quarter, axis, variance),
        )
        peaks.append(at - near)
    return min(peaks)


def _folded(energy, period: int):
    """A step-energy profile folded onto one period: the mean energy at each offset."""
    import numpy as np

    usable = len(energy) // period * period
    return np.asarray(energy[:usable]).reshape(-1, period).mean(axis=0)


@dataclass(frozen=True)
class _Grid:
    """Where a picture's steps along one axis fall on a grid: the share of the step energy
    within reach of the strongest line (a pixel, or an eighth of the period: `share`) and of
    the line half a period away (`half`), that line's offset, the energy within reach of it
    per line (`edge`: a smoothed step is still one step), and how many times the typical
    column's energy the line carries (`contrast`)."""

    share: float = 0.0
    half: float = 0.0
    offset: int = 0
    edge: float = 0.0
    contrast: float = 0.0


def _grid(energy, period: int) -> _Grid:
    """The grid of a step-energy profile at `period`, the energy counted above the typical
    column's (grain steps everywhere; an edge only on its line); an empty one where a quarter
    of the lines or more carry no edge (blocks twice the period leave every other line empty)."""
    import numpy as np

    energy = np.asarray(energy)
    typical = float(np.median(energy))
    excess = np.maximum(energy - typical, 0.0)
    folded = _folded(excess, period)
    total = float(folded.sum())
    if total <= 0:
        return _Grid()
    reach = max(1, period // 8)  # a decoder smooths a step over more pixels on a larger grid
    window = np.sum([np.roll(folded, k) for k in range(-reach, reach + 1)], axis=0)
    offset = int(folded.argmax())
    lines = excess[offset::period]
    if float(np.quantile(lines, 0.25)) < BLOCK_EVEN * float(lines.mean()):
        return _Grid(offset=offset)
    line = float(_folded(energy, period)[offset])
    return _Grid(
        share=float(window[offset]) / total,
        half=float(window[(offset + period // 2) % period]) / total,
        offset=offset,
        edge=float(window[offset]),
        contrast=line / typical if typical > 0 else float("inf"),
    )


def _blocks_alike(brightness, period: int, rows: int, columns: int) -> float:
    """The correlation of neighbouring blocks' mean brightness, the blocks on the grid whose
    lines follow the steps at offsets `rows`, `columns`."""
    import numpy as np

    top, left = (rows + 1) % period, (columns + 1) % period
    cut = brightness[top:, left:]
    h, w = cut.shape[0] // period, cut.shape[1] // period
    if h < 2 or w < 2:
        return 1.0
    means = cut[: h * period, : w * period].reshape(h, period, w, period).mean(axis=(1, 3))
    a = np.concatenate([means[:, :-1].ravel(), means[:-1].ravel()])
    b = np.concatenate([means[:, 1:].ravel(), means[1:].ravel()])
    if a.std() == 0 or b.std() == 0:
        return 1.0
    return float(np.corrcoef(a, b)[0, 1])


def _blocks(unit, steps: tuple[Any, Any], period: int) -> float:
    """The blocks' share of the step energy on a `period` grid (the lower of the two axes), or
    0 where the picture does not break into unlike blocks there. `steps`: the step energy per
    column and per row."""
    across, down = _grid(steps[0], period), _grid(steps[1], period)
    share = min(across.share, down.share)
    if share < BLOCK_EDGES or max(across.half, down.half) > BLOCK_HALF * share:
        return 0.0
    if min(across.edge, down.edge) ** 0.5 < BLOCK_STEP:
        return 0.0
    if min(across.contrast, down.contrast) < BLOCK_CONTRAST:
        return 0.0
    if _blocks_alike(channel_mean(unit), period, down.offset, across.offset) > BLOCK_ALIKE:
        return 0.0
    return share


def tiled(rgb) -> Tiled | None:
    """The tiled signature of an (H, W, 3) uint8 picture at the smallest period of
    TILE_PERIODS where it repeats or breaks into unlike blocks, or None (also for a picture
    under 128 px or without variance). A period is tried only where the picture holds four."""
    unit = _centre(rgb)
    if unit is None:
        return None
    centred = unit - unit.mean(axis=(0, 1))
    variance = pixel_dot(centred, centred)
    if variance < 1e-6:
        return None
    periods = [p for p in TILE_PERIODS if 4 * p <= min(unit.shape[:2])]
    for period in periods:  # a repeat first: a repeated tile's seams also lie on a grid
        if _repeat(centred, variance, period) >= REPEAT_PEAK:
            return Tiled(period, "repeat", _lagged(centred, period, 1, variance))
    steps = (
        ((unit[:, 1:] - unit[:, :-1]) ** 2).mean(axis=(0, 2)),
        ((unit[1:] - unit[:-1]) ** 2).mean(axis=(1, 2)),
    )
    for period in periods:
        share = _blocks(unit, steps, period)
        if share:
            return Tiled(period, "blocks", share)
    return None


def static(rgb) -> Static | None:
    """RGB static's figures of an (H, W, 3) uint8 picture where they are static's, else None."""
    import numpy as np

    rgb = np.asarray(rgb)
    if rgb.ndim != 3 or rgb.shape[-1] != 3 or min(rgb.shape[:2]) < _MIN_SIDE:
        return None
    crop = rgb[:_CROP, :_CROP]
    extreme = float(((crop <= STATIC_NEAR) | (crop >= 255 - STATIC_NEAR)).mean())
    if extreme < STATIC_EXTREME:
        return None
    unit = crop.astype(np.float32) / 255.0
    centred = unit - unit.mean(axis=(0, 1))
    variance = pixel_dot(centred, centred)
    if variance < 1e-6:
        return None
    neighbours = max(_lagged(centred, 1, 1, variance), _lagged(centred, 1, 0, variance))
    spread = crop.max(axis=-1).astype(np.int16) - crop.min(axis=-1)
    coloured = float((spread >= 128).mean())
    if neighbours > STATIC_NEIGHBOURS or coloured < STATIC_COLOURED:
        return None
    return Static(extreme, neighbours, coloured)


def false_colour(rgb) -> FalseColour | None:
    """False colour's figures of an (H, W, 3) uint8 picture where they are false colour's,
    else None."""
    import numpy as np

    from app.core.explain.signatures import correlation

    unit = _centre(rgb)
    if unit is None:
        return None
    mean = unit.mean(axis=(0, 1))
    cast = float(mean.max() - mean.min())
    if cast < FALSE_CAST:
        return None
    pixels = (unit - mean).reshape(-1, 3)
    luminance = channel_mean(pixels)[..., None]
    hue = pixels - luminance
    brightness_part = float((luminance**2).mean()) * 3
    hue_part = pixel_dot(hue, hue)
    ratio = hue_part / brightness_part if brightness_part > 0 else float("inf")
    if ratio < FALSE_HUE:
        return None
    # The hue plane: two axes orthogonal to grey; the spread of the colours along each.
    plane = np.array([[1.0, -1.0, 0.0], [1.0, 1.0, -2.0]]) / np.array([[2**0.5], [6**0.5]])
    eigen = np.linalg.eigvalsh(np.cov((hue @ plane.T).T))
    spread = float(eigen[0] / eigen[1]) if eigen[1] > 0 else 0.0
    if spread < FALSE_SPREAD:
        return None
    smooth = correlation(unit)
    if smooth < FALSE_SMOOTH:
        return None
    shown = tuple(int(round(v * 255)) for v in mean)
    return FalseColour((shown[0], shown[1], shown[2]), cast, ratio, spread, smooth)


def look(rgb) -> str | None:
    """The look of an (H, W, 3) uint8 picture as `image_file.pixel_status` ranks them
    ("rgb_static", "tiled_noise", "false_colour"), or None: for a picture made again from an
    image's record (`remake`), to say whether it draws the same."""
    from app.core.explain.signatures import noise

    if static(rgb) is not None:
        return "rgb_static"
    if tiled(rgb) is not None:
        return "tiled_noise"
    figures = noise(rgb)
    if (figures is None or not figures.coloured_noise) and false_colour(rgb) is not None:
        return "false_colour"
    return None
