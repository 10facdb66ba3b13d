"""What a tool's failing fast path draws (`app.core.explain.looks`): tiled or blocky noise at a
kernel's tile size, RGB static, false colour; each told apart from the others, from what explain
named before (coloured noise, saturated, flat) and from pictures (photographs' 1/f spectra,
flat illustrations, dark, bright, tinted, grainy and JPEG-compressed pictures): no claim on them.

The faults are made here in code: a tile of noise (per pixel, decoded from latents, or a smooth
psychedelic 1/f tile) repeated; random colour blocks on a tile grid, sharp, smoothed over three
pixels as a decoder smooths them, or with grain; per-pixel static of pure R, G and B (and of
every channel at 0 or 255); normal maps of smooth surfaces and smooth fields whose channels vary
apart around one strong colour. The pictures are test_signatures' own generators.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from app.core.explain import looks, signatures
from app.core.explain.image_file import pixel_status
from tests.support.drawn import demo_picture, demo_prompts
from tests.support.explain_pictures import (
    NATURAL,
    PHOTOGRAPHS,
    SIZE,
    blocky,
    channels_apart,
    decoded_noise,
    fp16_overflow_decoded,
    normal_map,
    one_over_f,
    photograph,
    real_noise,
    repeated,
    rgb_static,
    starry_sky,
    upsampled_noise,
    white_background,
    written,
)


def jpeg(picture: np.ndarray, quality: int) -> np.ndarray:
    buffer = io.BytesIO()
    Image.fromarray(picture).save(buffer, "JPEG", quality=quality)
    return np.asarray(Image.open(buffer).convert("RGB"))


def tinted(seed: int, tint: tuple[float, float, float]) -> np.ndarray:
    picture = written(one_over_f(seed), 0.5, 0.2).astype(float) * np.array(tint)
    return picture.round().astype(np.uint8)


REPEATS = [(kind, p) for kind in ("pixel", "decoded", "smooth", "smoothed") for p in (8, 32, 128)]
BLOCKS = [
    *[(kind, p) for kind in ("sharp", "smoothed", "grain") for p in (8, 16, 64, 128)],
    *[("smoothed wide", p) for p in (16, 32, 128)],
]
STATIC = ("pure", "eight", "off")
FALSE = [
    *[("normal map", seed, strength) for seed in (0, 1) for strength in (15.0, 60.0)],
    *[
        ("apart", seed, colour)
        for seed in (0, 1)
        for colour in ((128, 128, 255), (230, 110, 200), (90, 200, 120))
    ],
]
TINTS = ((0.4, 0.6, 1.0), (1.0, 0.6, 0.3), (0.5, 1.0, 0.5), (1.0, 0.3, 0.8))


def false_picture(kind: str, seed: int, value) -> np.ndarray:
    return normal_map(seed, value) if kind == "normal map" else channels_apart(seed, value)


def pictures() -> dict[str, np.ndarray]:
    """Pictures no look may be claimed on: photographs' spectra (their channels together and
    nearly apart), dark, bright, grainy and tinted ones, JPEG's 8 px blocks, negatives, a
    starry sky, a product shot on white, and flat illustrations (the demo's shapes, with and
    without a VAE's grain)."""
    found = {**NATURAL, "a starry sky": starry_sky(), "a white background": white_background()}
    for size in (128, 512):
        for seed, alpha, colour in PHOTOGRAPHS[::2]:
            found[f"photograph {size} {seed} {alpha} {colour}"] = photograph(
                seed, size, alpha, colour
            )
    for index, prompt in enumerate(demo_prompts()[::5]):
        size = (128, 256, 512)[index % 3]
        for grain in (0.0, 6.0):
            found[f"demo {prompt} {size} {grain}"] = demo_picture(*prompt, size, grain)
    for index, tint in enumerate(TINTS):
        found[f"tinted {tint}"] = tinted(20 + index, tint)
    for quality in (30, 50, 75):
        for name in ("a photograph", "film grain", "a night scene"):
            found[f"jpeg {quality} {name}"] = jpeg(NATURAL[name], quality)
    found["a negative"] = 255 - NATURAL["a photograph"]
    return found


def noises() -> dict[str, np.ndarray]:
    """What explain already names noise or saturated: coloured noise per pixel, enlarged 2 to
    4 times, decoded from latents (also saved as JPEG), and an fp16 overflow written as a tool
    writes it."""
    found = {f"{size} {name}": p for size in (128, 512) for name, p in real_noise(size).items()}
    for quality in (30, 75):
        found[f"jpeg {quality} decoded"] = jpeg(decoded_noise(0), quality)
        found[f"jpeg {quality} per pixel"] = jpeg(
            upsampled_noise(0, SIZE, 1, Image.Resampling.NEAREST), quality
        )
    found["an fp16 overflow"] = fp16_overflow_decoded()
    return found


# Each look is found, at its period -------------------------------------------------------


@pytest.mark.parametrize(("kind", "period"), REPEATS)
def test_a_repeated_tile_is_tiled_at_its_period(kind, period):
    found = looks.tiled(repeated(kind, period))
    assert found is not None and (found.period, found.kind) == (period, "repeat"), found
    assert looks.static(repeated(kind, period)) is None


@pytest.mark.parametrize(("kind", "period"), BLOCKS)
def test_blocks_at_a_tile_size_are_tiled_at_that_size(kind, period):
    picture = blocky(kind, period)
    found = looks.tiled(picture)
    assert found is not None and (found.period, found.kind) == (period, "blocks"), found
    assert looks.static(picture) is None


@pytest.mark.parametrize("size", [256, 1024])
def test_tiles_are_found_small_and_large(size):
    assert looks.tiled(repeated("decoded", 32, size)).period == 32
    assert looks.tiled(blocky("grain", 16, size)).period == 16


@pytest.mark.parametrize("kind", STATIC)
def test_rgb_static_is_static(kind):
    found = looks.static(rgb_static(kind))
    assert found is not None, kind
    assert looks.tiled(rgb_static(kind)) is None


@pytest.mark.parametrize(("kind", "seed", "value"), FALSE)
def test_a_normal_map_and_channels_apart_around_a_colour_are_false_colour(kind, seed, value):
    picture = false_picture(kind, seed, value)
    assert looks.false_colour(picture) is not None, (kind, seed, value)
    assert looks.tiled(picture) is None and looks.static(picture) is None
    noise = signatures.noise(picture)
    assert noise is None or not noise.coloured_noise  # smooth: no coloured noise


# No claim on pictures, nor on what explain already names ------------------------------------


def test_no_look_is_claimed_on_pictures():
    for name, picture in pictures().items():
        assert looks.tiled(picture) is None, name
        assert looks.static(picture) is None, name
        assert looks.false_colour(picture) is None, name


def test_coloured_noise_and_an_overflow_show_no_look():
    for name, picture in noises().items():
        assert looks.tiled(picture) is None, name
        assert looks.static(picture) is None, name
        assert looks.false_colour(picture) is None, name


def test_the_figures_leave_room_on_both_sides():
    """The margins the thresholds leave, measured on these sets (looks.py states them)."""
    unit = looks._centre(repeated("smoothed", 32))
    centred = unit - unit.mean(axis=(0, 1))
    variance = float((centred * centred).sum(axis=-1).mean())
    assert looks._repeat(centred, variance, 32) >= 2 * looks.REPEAT_PEAK
    # Blocks: their edges many times JPEG's, their neighbours unlike.
    for kind, period in BLOCKS:
        unit = looks._centre(blocky(kind, period))
        grid = looks._grid(((unit[:, 1:] - unit[:, :-1]) ** 2).mean(axis=(0, 2)), period)
        assert grid.share >= 1.2 * looks.BLOCK_EDGES and grid.contrast >= 1.8 * looks.BLOCK_CONTRAST
    for quality in (30, 50):
        unit = looks._centre(jpeg(NATURAL["a night scene"], quality))
        energy = ((unit[:, 1:] - unit[:, :-1]) ** 2).mean(axis=(0, 2))
        folded = looks._folded(energy, 8)
        assert folded.max() / np.median(energy) <= looks.BLOCK_CONTRAST / 1.5
    # Static: a starry sky's pixels are as extreme and as apart, but grey; an overflow keeps
    # its shapes.
    for kind in STATIC:
        found = looks.static(rgb_static(kind))
        assert found.coloured >= 1.5 * looks.STATIC_COLOURED
        assert found.neighbours <= looks.STATIC_NEIGHBOURS / 10
    sky = starry_sky()
    assert ((sky <= looks.STATIC_NEAR) | (sky >= 255 - looks.STATIC_NEAR)).mean() >= 0.99
    assert ((sky.max(axis=-1) - sky.min(axis=-1)) >= 128).mean() == 0.0
    # False colour: tinted photographs move in brightness; the demo's shapes along one line.
    for kind, seed, value in FALSE:
        found = looks.false_colour(false_picture(kind, seed, value))
        assert found.hue >= 1.5 * looks.FALSE_HUE and found.spread >= 2 * looks.FALSE_SPREAD
        assert found.cast >= 1.5 * looks.FALSE_CAST


# pixel_status: the order of precedence --------------------------------------------------------


def save(tmp_path, name: str, picture: np.ndarray):
    path = tmp_path / name
    Image.fromarray(picture, "RGB").save(path)
    return path


@pytest.mark.parametrize(
    ("picture", "status"),
    [
        (blocky("sharp", 16), "tiled_noise"),
        (repeated("pixel", 32), "tiled_noise"),
        (rgb_static("pure"), "rgb_static"),
        (rgb_static("eight"), "rgb_static"),  # every channel at 0 or 255: not "saturated"
        (normal_map(0, 15.0), "false_colour"),
        (decoded_noise(), "noise"),
        (fp16_overflow_decoded(), "saturated"),
        (np.full((SIZE, SIZE, 3), 255, np.uint8), "saturated"),
        (NATURAL["a photograph"], "ok"),
        (tinted(20, TINTS[0]), "ok"),
        (255 - NATURAL["a photograph"], "ok"),  # a negative: only --remake tells it
        (np.zeros((SIZE, SIZE, 3), np.uint8), "nan"),
        (np.full((SIZE, SIZE, 3), 128, np.uint8), "flat"),
        (np.full((SIZE, SIZE, 3), (200, 40, 90), np.uint8), "flat"),
        (NATURAL["a night scene"], "ok"),
    ],
    ids=[
        "blocks",
        "repeat",
        "static",
        "static-saturated",
        "normal-map",
        "noise",
        "overflow",
        "white",
        "photo",
        "tinted",
        "inverted",
        "black",
        "grey",
        "flat-colour",
        "night",
    ],
)
def test_pixel_status_names_each_look_apart(tmp_path, picture, status):
    found, figures = pixel_status(save(tmp_path, "p.png", picture))
    assert found == status, figures
    document = figures.to_json()
    assert (document["tiled"] is not None) == (status == "tiled_noise")
    assert (document["static"] is not None) == (status == "rgb_static")
    assert (document["false_colour"] is not None) == (status == "false_colour")


def test_look_of_a_picture_made_again():
    assert looks.look(blocky("sharp", 16)) == "tiled_noise"
    assert looks.look(rgb_static("pure")) == "rgb_static"
    assert looks.look(normal_map(1, 15.0)) == "false_colour"
    assert looks.look(NATURAL["a photograph"]) is None
    assert looks.look(decoded_noise()) is None
