"""Pictures people make on purpose, drawn in code: what `explain` must never call a fault, even
with a generation record beside them. Eight kinds, each drawn from a seed (the same seed, the
same picture), at 128 to 1024 px:

- normal maps: flat parts exactly (127, 127, 255) or (128, 128, 255) with bumps, rivets and
  bevelled bricks, and rippled water over the whole picture;
- pixel art and mosaics: a sprite, a landscape or a mosaic of cells on a small canvas, enlarged
  by nearest neighbour;
- icons and logos: shapes, rings and letters on a plain background, edges smoothed or not;
- flat-colour designs: the red circle on blue, a mid-grey bar over 23% of a picture, stripes,
  flags and posters of solid blocks;
- seamless textures: brick walls and tiles, repeated at their tile size, with grain;
- tinted and underwater scenes: a graded photograph's spectrum, and a scene under water
  (depth haze, caustics, fish and weed);
- dithered few-colour art: a picture reduced to 2 to 16 colours with Floyd-Steinberg or
  ordered dithering, sometimes enlarged;
- UI mock-ups: windows, bars, buttons, cards and lines of text as blocks.

Each picture is written as a PNG with an AUTOMATIC1111 or a ComfyUI record (`write`). numpy and
Pillow only; nothing is downloaded.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

SIZES = (128, 160, 192, 256, 320, 384, 512, 640, 768, 1024)
KINDS = (
    "normal_map",
    "pixel_art",
    "icon",
    "flat_design",
    "seamless_texture",
    "tinted_scene",
    "dithered",
    "ui_mockup",
)
PER_KIND = 300

Rng = np.random.Generator


def size_of(rng: Rng) -> tuple[int, int]:
    """A side from SIZES, mostly square, sometimes 3:4 or 4:3 within 128..1024."""
    side = int(rng.choice(SIZES, p=_SIZE_WEIGHTS))
    shape = rng.random()
    if shape < 0.15:
        return side, max(128, side * 3 // 4)
    if shape < 0.3:
        return max(128, side * 3 // 4), side
    return side, side


_SIZE_WEIGHTS = np.array([4, 2, 2, 4, 2, 3, 4, 2, 2, 1], float) / 26


def _colour(rng: Rng, pure: bool = False) -> tuple[int, int, int]:
    if pure:
        return tuple(int(v) for v in rng.choice([0, 255], 3))  # type: ignore[return-value]
    return tuple(int(v) for v in rng.integers(0, 256, 3))  # type: ignore[return-value]


def _field(rng: Rng, height: int, width: int, power: float = 1.0) -> np.ndarray:
    """A smooth random field (1/f^power spectrum), zero mean, unit spread."""
    fy, fx = np.fft.fftfreq(height)[:, None], np.fft.fftfreq(width)[None, :]
    radius = np.hypot(fy, fx)
    radius[0, 0] = 1.0
    field = np.fft.ifft2(np.fft.fft2(rng.standard_normal((height, width))) / radius**power).real
    field -= field.mean()
    return field / (field.std() or 1.0)


def _smooth(image: Image.Image, size: tuple[int, int]) -> np.ndarray:
    """A picture drawn large, reduced with a filter: the soft edges of a drawing program."""
    return np.asarray(image.resize(size, Image.Resampling.LANCZOS).convert("RGB"))


# --- normal maps --------------------------------------------------------------------------------


def _normals(height: np.ndarray, strength: float, rng: Rng) -> np.ndarray:
    """A height field's tangent-space normal map, (n + 1) / 2 written rounded or truncated (flat
    becomes 128, 128, 255 or 127, 127, 255)."""
    dy, dx = np.gradient(height)
    normals = np.stack([-dx * strength, -dy * strength, np.ones_like(height)], axis=-1)
    normals /= np.linalg.norm(normals, axis=-1, keepdims=True)
    unit = (normals + 1) / 2 * 255
    written = np.floor(unit) if rng.random() < 0.5 else np.round(unit)
    return np.clip(written, 0, 255).astype(np.uint8)


def normal_map(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    width, height = size_of(rng)
    y, x = np.mgrid[0:height, 0:width].astype(float)
    variant = seed % 4
    if variant == 0:  # rippled water: rings and waves over the whole picture
        surface = np.zeros((height, width))
        for _ in range(rng.integers(1, 5)):
            cx, cy = rng.uniform(0, width), rng.uniform(0, height)
            wavelength = rng.uniform(8, 60)
            distance = np.hypot(x - cx, y - cy)
            surface += np.sin(2 * np.pi * distance / wavelength) * np.exp(-distance / (width * 2))
        angle = rng.uniform(0, np.pi)
        surface += 0.5 * np.sin((x * np.cos(angle) + y * np.sin(angle)) / rng.uniform(4, 20))
        return _normals(surface, rng.uniform(0.5, 4), rng)
    surface = np.zeros((height, width))
    if variant == 1:  # rivets and domes on a flat plate
        for _ in range(rng.integers(3, 30)):
            cx, cy = rng.uniform(0, width), rng.uniform(0, height)
            radius = rng.uniform(4, max(6, min(width, height) / 8))
            surface += np.sqrt(np.clip(1 - ((x - cx) ** 2 + (y - cy) ** 2) / radius**2, 0, 1))
        surface *= rng.uniform(3, 20)
    elif variant == 2:  # bevelled bricks or panels
        brick_h = int(rng.choice([16, 32, 64]))
        brick_w = brick_h * int(rng.choice([1, 2]))
        bevel = rng.uniform(2, brick_h / 4)
        row = (y // brick_h).astype(int)
        shifted = x + (row % 2) * brick_w / 2
        u, v = shifted % brick_w, y % brick_h
        edge = np.minimum(np.minimum(u, brick_w - u), np.minimum(v, brick_h - v))
        surface = np.clip(edge / bevel, 0, 1) * bevel
    else:  # a stamped emblem: a raised disc or square in the middle, flat around it
        cx, cy = width / 2, height / 2
        radius = min(width, height) * rng.uniform(0.15, 0.4)
        if rng.random() < 0.5:
            inside = np.clip(radius - np.hypot(x - cx, y - cy), 0, None)
        else:
            inside = np.clip(radius - np.maximum(abs(x - cx), abs(y - cy)), 0, None)
        surface = np.minimum(inside, rng.uniform(3, 12))
    return _normals(surface, rng.uniform(0.5, 2.0), rng)


# --- pixel art and mosaics --------------------------------------------------------------------


def _palette(rng: Rng, count: int) -> np.ndarray:
    return rng.integers(0, 256, (count, 3)).astype(np.uint8)


def pixel_art(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    width, height = size_of(rng)
    scale = int(rng.choice([2, 4, 8, 16, 32]))
    cw, ch = max(4, width // scale), max(4, height // scale)
    variant = seed % 3
    palette = _palette(rng, int(rng.integers(3, 17)))
    if variant == 0:  # a mosaic: one palette colour per cell
        canvas = palette[rng.integers(0, len(palette), (ch, cw))]
    elif variant == 1:  # a symmetric sprite on a plain background
        canvas = np.empty((ch, cw, 3), np.uint8)
        canvas[:] = palette[0]
        half = rng.integers(0, len(palette), (ch, (cw + 1) // 2))
        mask = rng.random((ch, (cw + 1) // 2)) < 0.45
        sprite = np.where(mask[..., None], palette[half], palette[0])
        canvas[:] = np.concatenate([sprite, sprite[:, ::-1][:, cw % 2 :]], axis=1)[:, :cw]
        border = max(1, min(cw, ch) // 6)
        canvas[:border], canvas[-border:], canvas[:, :border], canvas[:, -border:] = (
            palette[0],
            palette[0],
            palette[0],
            palette[0],
        )
    else:  # a landscape: sky bands, hills, a sun
        canvas = np.empty((ch, cw, 3), np.uint8)
        bands = rng.integers(2, 6)
        for index in range(bands):
            canvas[index * ch // (2 * bands) :] = palette[index % len(palette)]
        ground = ch // 2 + (np.sin(np.arange(cw) / rng.uniform(2, 6)) * ch / 8).astype(int)
        rows = np.arange(ch)[:, None]
        canvas[rows >= ground[None, :]] = palette[-1]
        sun = (rows - ch // 4) ** 2 + (np.arange(cw)[None, :] - cw * 3 // 4) ** 2 < (ch // 8) ** 2
        canvas[sun] = palette[1 % len(palette)]
    image = Image.fromarray(canvas).resize((cw * scale, ch * scale), Image.Resampling.NEAREST)
    picture = np.asarray(image)[:height, :width]
    if picture.shape[0] < height or picture.shape[1] < width:
        pad = ((0, height - picture.shape[0]), (0, width - picture.shape[1]), (0, 0))
        picture = np.pad(picture, pad, mode="edge")
    return picture


# --- icons and logos, flat-colour designs -----------------------------------------------------


def _shape(draw: ImageDraw.ImageDraw, rng: Rng, box, colour, kind: int) -> None:
    x0, y0, x1, y1 = box
    if kind == 0:
        draw.ellipse(box, fill=colour)
    elif kind == 1:
        draw.rounded_rectangle(box, radius=(x1 - x0) / 5, fill=colour)
    elif kind == 2:
        cx, cy, r = (x0 + x1) / 2, (y0 + y1) / 2, (x1 - x0) / 2
        points = int(rng.integers(3, 9))
        star = rng.random() < 0.5
        corners = []
        for index in range(points * (2 if star else 1)):
            radius = r * (0.45 if star and index % 2 else 1.0)
            angle = np.pi * index / (points if star else points / 2) - np.pi / 2
            corners.append((cx + radius * np.cos(angle), cy + radius * np.sin(angle)))
        draw.polygon(corners, fill=colour)
    else:
        width = max(2, int((x1 - x0) / 8))
        draw.ellipse(box, outline=colour, width=width)


def icon(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    width, height = size_of(rng)
    pure = rng.random() < 0.3
    factor = 1 if rng.random() < 0.3 else 4  # drawn as is, or large and reduced
    big = (width * factor, height * factor)
    background = (255, 255, 255) if rng.random() < 0.4 else _colour(rng, pure)
    image = Image.new("RGB", big, background)
    draw = ImageDraw.Draw(image)
    side = min(big)
    for layer in range(int(rng.integers(1, 4))):
        r = side * rng.uniform(0.15, 0.42) * (0.7**layer)
        cx = big[0] / 2 + rng.uniform(-0.1, 0.1) * side
        cy = big[1] / 2 + rng.uniform(-0.1, 0.1) * side
        _shape(
            draw, rng, (cx - r, cy - r, cx + r, cy + r), _colour(rng, pure), int(rng.integers(4))
        )
    if rng.random() < 0.5:  # a monogram or a name under the mark
        letters = "".join(chr(int(c)) for c in rng.integers(65, 91, int(rng.integers(1, 6))))
        font_size = max(10, side // 10)
        draw.text(
            (big[0] * 0.3, big[1] * 0.82), letters, fill=_colour(rng, pure), font_size=font_size
        )
    return _smooth(image, (width, height)) if factor > 1 else np.asarray(image)


def flat_design(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    variant = seed % 5
    if variant == 0:  # the demo's red circle on blue, at a small size as often as a large one
        side = int(rng.choice([128, 256, 128, 256, 512, 1024]))
        red = (int(rng.integers(200, 256)), int(rng.integers(0, 40)), int(rng.integers(0, 40)))
        blue = (int(rng.integers(0, 40)), int(rng.integers(0, 90)), int(rng.integers(180, 256)))
        factor = int(rng.choice([1, 4]))
        image = Image.new("RGB", (side * factor, side * factor), blue)
        r = side * factor * rng.uniform(0.2, 0.35)
        c = side * factor / 2
        ImageDraw.Draw(image).ellipse((c - r, c - r, c + r, c + r), fill=red)
        return _smooth(image, (side, side)) if factor > 1 else np.asarray(image)
    width, height = size_of(rng)
    picture = np.empty((height, width, 3), np.uint8)
    picture[:] = _colour(rng)
    if variant == 1:  # a mid-grey bar over about a quarter of the picture
        grey = int(rng.choice([127, 128]))
        share = rng.uniform(0.15, 0.35)
        if rng.random() < 0.5:
            top = int(rng.uniform(0, 1 - share) * height)
            picture[top : top + int(share * height)] = grey
        else:
            left = int(rng.uniform(0, 1 - share) * width)
            picture[:, left : left + int(share * width)] = grey
        for _ in range(int(rng.integers(0, 4))):
            x0, y0 = int(rng.integers(0, width)), int(rng.integers(0, height))
            picture[y0 : y0 + height // 8, x0 : x0 + width // 6] = _colour(rng)
    elif variant == 2:  # stripes or a flag
        count = int(rng.integers(2, 8))
        colours = [_colour(rng, rng.random() < 0.3) for _ in range(count)]
        along = height if rng.random() < 0.5 else width
        for index in range(count):
            part = slice(index * along // count, (index + 1) * along // count)
            if along == height:
                picture[part] = colours[index]
            else:
                picture[:, part] = colours[index]
    elif variant == 3:  # a poster of solid blocks
        for _ in range(int(rng.integers(2, 9))):
            x0, y0 = int(rng.integers(0, width)), int(rng.integers(0, height))
            w, h = int(rng.integers(width // 10, width)), int(rng.integers(height // 10, height))
            picture[y0 : y0 + h, x0 : x0 + w] = _colour(rng, rng.random() < 0.2)
    else:  # circles and triangles on a plain background, smoothed
        image = Image.fromarray(picture).resize((width * 2, height * 2))
        draw = ImageDraw.Draw(image)
        for _ in range(int(rng.integers(1, 6))):
            r = min(width, height) * rng.uniform(0.1, 0.4)
            cx, cy = rng.uniform(0, width * 2), rng.uniform(0, height * 2)
            _shape(draw, rng, (cx - r, cy - r, cx + r, cy + r), _colour(rng), int(rng.integers(3)))
        picture = _smooth(image, (width, height))
    return picture


# --- seamless textures ----------------------------------------------------------------------


def seamless_texture(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    width, height = size_of(rng)
    variant = seed % 3
    tile = int(rng.choice([16, 32, 64, 128, 256]))
    tile = min(tile, min(width, height) // 2)
    y, x = np.mgrid[0:tile, 0:tile]
    mortar = np.array(_colour(rng), float)
    if variant == 0:  # a brick wall: two courses per tile, the second shifted half a brick
        course = tile // 2
        joint = max(1, tile // 16)
        colours = np.array([_colour(rng) for _ in range(4)], float)
        base = colours[((y // course) * 2 + ((x + (y // course) * tile // 2) // tile)) % 4]
        joints = ((y % course) < joint) | (((x + (y // course) * tile // 2) % tile) < joint)
        unit = np.where(joints[..., None], mortar, base)
    elif variant == 1:  # square tiles with grout, some a second colour
        grout = max(1, tile // 12)
        face = np.array(_colour(rng), float)
        other = np.array(_colour(rng), float)
        half = tile // 2
        checker = ((y // half + x // half) % 2 == 1)[..., None]
        unit = (
            np.where(checker, other, face)
            if rng.random() < 0.5
            else np.broadcast_to(face, (tile, tile, 3)).copy()
        )
        lines = ((y % half) < grout) | ((x % half) < grout)
        unit = np.where(lines[..., None], mortar, unit)
    else:  # planks: stripes of wood grain, periodic across the tile
        grain = np.sin(2 * np.pi * (x / tile * rng.integers(1, 4) + np.sin(2 * np.pi * y / tile)))
        wood = np.array(_colour(rng), float)
        unit = wood * (0.8 + 0.2 * grain[..., None])
        unit[(y % max(4, tile // 4)) == 0] = mortar
    # Grain of the material, the same in every tile (the tile is what repeats).
    amount = rng.uniform(0, 18)
    texture = rng.normal(0, amount, (tile, tile, 1)) + rng.normal(0, amount / 4, (tile, tile, 3))
    unit = np.clip(unit + texture, 0, 255).astype(np.uint8)
    times = (height // tile + 1, width // tile + 1, 1)
    return np.tile(unit, times)[:height, :width]


# --- tinted and underwater scenes --------------------------------------------------------------


def tinted_scene(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    width, height = size_of(rng)
    shared = _field(rng, height, width)
    colour = np.stack([_field(rng, height, width) for _ in range(3)], axis=-1)
    scene = shared[..., None] + rng.uniform(0.1, 0.6) * colour
    if seed % 2 == 0:  # a graded photograph: sepia, teal and orange, night blue, a duotone
        tint = rng.uniform(0.2, 1.0, 3)
        unit = np.clip(0.5 + 0.18 * scene, 0, 1) * tint / tint.max()
        if rng.random() < 0.3:  # teal shadows, orange highlights
            light = np.clip(0.5 + 0.18 * shared, 0, 1)[..., None]
            unit = light * np.array([1.0, 0.65, 0.35]) + (1 - light) * np.array([0.0, 0.3, 0.35])
        return (np.clip(unit, 0, 1) * 255).round().astype(np.uint8)
    # Under water: the colour of the water deepening downwards, light from above, caustics,
    # haze, and a few fish and fronds of weed in their own colours.
    y, x = np.mgrid[0:height, 0:width].astype(float)
    depth = y / height
    top = np.array([rng.uniform(0.2, 0.5), rng.uniform(0.6, 0.9), rng.uniform(0.7, 1.0)])
    bottom = np.array([0.0, rng.uniform(0.1, 0.3), rng.uniform(0.2, 0.5)])
    water = top * (1 - depth[..., None]) + bottom * depth[..., None]
    caustics = np.abs(np.sin(x / rng.uniform(6, 20) + 2 * _field(rng, height, width, 2.0)))
    light = 1 + 0.25 * (1 - depth[..., None]) * (caustics[..., None] ** 4)
    unit = water * light * (1 + 0.08 * scene)
    image = Image.fromarray((np.clip(unit, 0, 1) * 255).round().astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(0, 12))):
        cx, cy = rng.uniform(0, width), rng.uniform(0, height)
        r = rng.uniform(4, min(width, height) / 10)
        fish = tuple(int(v) for v in rng.integers(100, 256, 3))
        draw.ellipse((cx - 2 * r, cy - r, cx + 2 * r, cy + r), fill=fish)
    for _ in range(int(rng.integers(0, 8))):
        x0 = rng.uniform(0, width)
        green = (int(rng.integers(0, 80)), int(rng.integers(80, 200)), int(rng.integers(30, 120)))
        points = [(x0 + 10 * np.sin(t / 9), height - t) for t in range(0, height // 2, 4)]
        draw.line(points, fill=green, width=max(2, width // 80))
    return np.asarray(image.filter(ImageFilter.GaussianBlur(rng.uniform(0, 1.5))))


# --- dithered few-colour art -----------------------------------------------------------------

_BAYER = np.array([[0, 8, 2, 10], [12, 4, 14, 6], [3, 11, 1, 9], [15, 7, 13, 5]]) / 16


def _source(rng: Rng, height: int, width: int) -> np.ndarray:
    """What is dithered: a smooth scene, a gradient, or shapes; 0..255 floats."""
    choice = rng.random()
    if choice < 0.4:
        scene = _field(rng, height, width)[..., None] + 0.5 * np.stack(
            [_field(rng, height, width) for _ in range(3)], axis=-1
        )
        return np.clip(128 + 60 * scene, 0, 255)
    if choice < 0.7:
        y, x = np.mgrid[0:height, 0:width] / max(height, width)
        a, b = np.array(_colour(rng), float), np.array(_colour(rng), float)
        t = ((x + y) / 2)[..., None]
        return a * (1 - t) + b * t
    image = Image.new("RGB", (width, height), _colour(rng))
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(2, 8))):
        r = min(width, height) * rng.uniform(0.1, 0.4)
        cx, cy = rng.uniform(0, width), rng.uniform(0, height)
        _shape(draw, rng, (cx - r, cy - r, cx + r, cy + r), _colour(rng), int(rng.integers(3)))
    return np.asarray(image.filter(ImageFilter.GaussianBlur(min(width, height) / 20)), float)


def dithered(seed: int) -> np.ndarray:
    """Dithered art; a source the palette leaves one colour (a blank page) is drawn again from
    the next seed."""
    for attempt in range(8):
        picture = _dithered(seed + 1_000_000 * attempt)
        if not (picture == picture[0, 0]).all():
            break
    return picture


def _dithered(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    width, height = size_of(rng)
    scale = int(rng.choice([1, 1, 2, 4]))
    w, h = max(32, width // scale), max(32, height // scale)
    source = _source(rng, h, w)
    choice = rng.random()
    if choice < 0.5:  # the eight corners of the colour cube: 3-bit art
        palette = np.array([[r, g, b] for r in (0, 255) for g in (0, 255) for b in (0, 255)])
    elif choice < 0.7:  # four greens of a handheld, or black and white
        palette = np.array([[15, 56, 15], [48, 98, 48], [139, 172, 15], [155, 188, 15]])
        if rng.random() < 0.5:
            palette = np.array([[0, 0, 0], [255, 255, 255]])
    else:
        palette = _palette(rng, int(rng.integers(4, 17))).astype(int)
    if seed % 2 == 0:  # Floyd-Steinberg, as an image editor does it
        holder = Image.new("P", (1, 1))
        flat = palette.astype(np.uint8).ravel().tolist()
        holder.putpalette(flat + flat[:3] * (256 - len(palette)))
        small = Image.fromarray(source.astype(np.uint8)).quantize(
            palette=holder, dither=Image.Dither.FLOYDSTEINBERG
        )
        picture = np.asarray(small.convert("RGB"))
    else:  # ordered (Bayer) dithering
        threshold = (np.tile(_BAYER, (h // 4 + 1, w // 4 + 1))[:h, :w] - 0.5)[..., None]
        spread = 255 / max(1, round(len(palette) ** (1 / 3)))
        nudged = source + threshold * spread
        distance = ((nudged[:, :, None, :] - palette[None, None]) ** 2).sum(axis=-1)
        picture = palette[distance.argmin(axis=-1)].astype(np.uint8)
    if scale > 1:
        picture = np.asarray(
            Image.fromarray(picture).resize((w * scale, h * scale), Image.Resampling.NEAREST)
        )
    return np.ascontiguousarray(_fit(picture, height, width))


def _fit(picture: np.ndarray, height: int, width: int) -> np.ndarray:
    picture = picture[:height, :width]
    pad = ((0, height - picture.shape[0]), (0, width - picture.shape[1]), (0, 0))
    return np.pad(picture, pad, mode="edge") if any(p[1] for p in pad) else picture


# --- UI mock-ups ----------------------------------------------------------------------------


def ui_mockup(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    width, height = size_of(rng)
    dark = rng.random() < 0.35
    background = (30, 32, 36) if dark else (int(rng.integers(235, 256)),) * 3
    panel = (45, 47, 52) if dark else (255, 255, 255)
    grey = int(rng.choice([127, 128, 200, 96]))
    accent = _colour(rng)
    image = Image.new("RGB", (width, height), background)
    draw = ImageDraw.Draw(image)
    bar = max(12, height // 14)
    draw.rectangle((0, 0, width, bar), fill=accent if rng.random() < 0.5 else panel)
    sidebar = int(width * rng.uniform(0.15, 0.3)) if rng.random() < 0.6 else 0
    if sidebar:
        draw.rectangle((0, bar, sidebar, height), fill=panel)
        for row in range(int(rng.integers(3, 10))):
            y0 = bar + 10 + row * bar
            draw.rectangle((8, y0, sidebar - 8, y0 + bar // 3), fill=(grey, grey, grey))
    left = sidebar + 10
    cards = int(rng.integers(1, 7))
    columns = int(rng.integers(1, 4))
    card_w = max(20, (width - left - 10 * (columns + 1)) // columns)
    card_h = max(20, int(height * rng.uniform(0.15, 0.35)))
    for index in range(cards):
        x0 = left + (index % columns) * (card_w + 10)
        y0 = bar + 10 + (index // columns) * (card_h + 10)
        draw.rounded_rectangle((x0, y0, x0 + card_w, y0 + card_h), radius=6, fill=panel)
        for line in range(int(rng.integers(1, 5))):
            ly = y0 + 10 + line * 12
            length = int(card_w * rng.uniform(0.3, 0.9))
            draw.rectangle((x0 + 8, ly, x0 + 8 + length, ly + 5), fill=(grey, grey, grey))
        if rng.random() < 0.5:
            bx = x0 + card_w - 60
            draw.rounded_rectangle((bx, y0 + card_h - 28, bx + 50, y0 + card_h - 8), 4, accent)
            draw.text((bx + 6, y0 + card_h - 26), "OK", fill=(255, 255, 255))
    if rng.random() < 0.3:  # a modal dialog over a dimmed page
        picture = (np.asarray(image).astype(float) * 0.5).astype(np.uint8)
        image = Image.fromarray(picture)
        draw = ImageDraw.Draw(image)
        draw.rounded_rectangle(
            (width * 0.25, height * 0.3, width * 0.75, height * 0.7), radius=8, fill=panel
        )
    return np.asarray(image)


DRAWERS: dict[str, Callable[[int], np.ndarray]] = {
    "normal_map": normal_map,
    "pixel_art": pixel_art,
    "icon": icon,
    "flat_design": flat_design,
    "seamless_texture": seamless_texture,
    "tinted_scene": tinted_scene,
    "dithered": dithered,
    "ui_mockup": ui_mockup,
}
# Each kind's seeds start apart, so that no two kinds share a seed.
_FIRST_SEED = {kind: 10_000 * (index + 1) for index, kind in enumerate(KINDS)}


def picture(kind: str, index: int) -> np.ndarray:
    """The `index`th picture of `kind`: an (H, W, 3) uint8 array."""
    return DRAWERS[kind](_FIRST_SEED[kind] + index)


def corpus(per_kind: int = PER_KIND, every: int = 1) -> Iterator[tuple[str, int, np.ndarray]]:
    """(kind, index, picture) for each kind, indexes 0, every, 2*every, ... below per_kind."""
    for kind in KINDS:
        for index in range(0, per_kind, every):
            yield kind, index, picture(kind, index)


# --- records --------------------------------------------------------------------------------

_PROMPTS = {
    "normal_map": "stone surface, top view, detailed",
    "pixel_art": "a knight in a castle, 16-bit game",
    "icon": "app icon, minimal, centered",
    "flat_design": "geometric poster, bauhaus",
    "seamless_texture": "old wall, texture",
    "tinted_scene": "a harbour at dusk, cinematic",
    "dithered": "retro computer art",
    "ui_mockup": "dashboard web app, clean",
}


def a1111_record(kind: str, index: int, width: int, height: int) -> str:
    """AUTOMATIC1111's infotext for a picture of `kind` (shape of its writer; made-up values)."""
    pairs = {
        "Steps": 20 + index % 15,
        "Sampler": "DPM++ 2M",
        "Schedule type": "Karras",
        "CFG scale": 7,
        "Seed": 1000 + index,
        "Size": f"{width}x{height}",
        "Model hash": "31e35c80fc",
        "Model": "sd_xl_base_1.0",
        "Version": "v1.10.1",
    }
    line = ", ".join(f"{k}: {v}" for k, v in pairs.items())
    return f"{_PROMPTS[kind]}\nNegative prompt: blurry, lowres\n{line}"


def comfy_record(kind: str, index: int, width: int, height: int) -> str:
    """ComfyUI's API prompt for a picture of `kind`: a checkpoint, a sampler, a decode, a save."""
    nodes = {
        "3": {
            "class_type": "KSampler",
            "inputs": {
                "seed": 1000 + index,
                "steps": 20,
                "cfg": 7.0,
                "sampler_name": "euler",
                "scheduler": "normal",
                "denoise": 1.0,
                "model": ["4", 0],
                "positive": ["6", 0],
                "negative": ["7", 0],
                "latent_image": ["5", 0],
            },
        },
        "4": {
            "class_type": "CheckpointLoaderSimple",
            "inputs": {"ckpt_name": "sd_xl_base_1.0.safetensors"},
        },
        "5": {
            "class_type": "EmptyLatentImage",
            "inputs": {"width": width, "height": height, "batch_size": 1},
        },
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": _PROMPTS[kind], "clip": ["4", 1]}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "blurry", "clip": ["4", 1]}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
        "9": {"class_type": "SaveImage", "inputs": {"images": ["8", 0]}},
    }
    return json.dumps(nodes)


def write(folder: Path, kind: str, index: int, drawn: np.ndarray, tool: str) -> Path:
    """`drawn` as a PNG in `folder` with the record `tool` ("a1111" or "comfyui") writes."""
    from PIL.PngImagePlugin import PngInfo

    height, width = drawn.shape[:2]
    info = PngInfo()
    if tool == "a1111":
        info.add_text("parameters", a1111_record(kind, index, width, height))
        name = f"{index:05d}-{1000 + index}-{kind}.png"
    else:
        info.add_text("prompt", comfy_record(kind, index, width, height))
        name = f"ComfyUI_{kind}_{index:05d}_.png"
    path = folder / name
    Image.fromarray(drawn, "RGB").save(path, pnginfo=info, compress_level=1)
    return path
