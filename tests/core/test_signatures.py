"""Failed pictures beyond black and grey (`app.core.explain.signatures`, `halfsafe explain`): white or
saturated (values that overflowed to infinity, clipped when written) and coloured noise, each
named as its own finding with its next step; and the pictures that look alike but are fine
(snow, a white background, a night sky, film grain, fine texture) never flagged.

The natural pictures are 1/f fields, the power spectrum of photographs, made here in code;
the saturated picture is a tiny VAE's fp16 overflow written the way A1111 and ComfyUI write
8-bit pictures (clip, then cast), and the noise is latent-sized noise decoded to pixels.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from app.cli import main
from app.core import explain
from app.core.explain import signatures
from app.core.explain.image_file import pixel_status
from tests.support.drawn import demo_picture, demo_prompts, halfsafe_parameters
from tests.support.explain_pictures import (
    NATURAL,
    PHOTOGRAPHS,
    SIZE,
    a1111_write,
    decoded_noise,
    fp16_overflow_decoded,
    photograph,
    real_noise,
    save,
    starry_sky,
    white_background,
)
from tests.support.image_files import comfy_prompt, forge_parameters

# The figures ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [*NATURAL, "a starry sky", "a white background"])
def test_pictures_are_neither_saturated_nor_coloured_noise(name):
    picture = {"a starry sky": starry_sky(), "a white background": white_background()}.get(
        name, NATURAL.get(name)
    )
    assert signatures.saturated(picture) is None
    figures = signatures.noise(picture)
    assert figures is not None and not figures.coloured_noise, figures


def test_pictures_keep_structure_and_move_in_brightness():
    """The margins the thresholds leave: every 1/f picture, grain included, keeps more
    structure than noise is allowed, and none comes within a factor 3 of the colour noise
    needs (the figure that carries the margin)."""
    for picture in NATURAL.values():
        figures = signatures.noise(picture)
        assert figures.structure > signatures.NOISE_STRUCTURE, figures
        assert figures.colour <= signatures.NOISE_COLOUR / 3, figures


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_decoded_latent_noise_is_coloured_noise(seed):
    figures = signatures.noise(decoded_noise(seed))
    assert figures.coloured_noise, figures
    assert figures.structure <= signatures.NOISE_STRUCTURE / 2
    assert figures.colour >= 1.5 * signatures.NOISE_COLOUR


def test_per_pixel_noise_is_coloured_noise():
    picture = np.random.default_rng(0).integers(0, 256, (SIZE, SIZE, 3)).astype(np.uint8)
    assert signatures.noise(picture).coloured_noise


def test_a_picture_too_small_or_without_variance_gives_no_noise_figures():
    assert signatures.noise(np.zeros((64, 64, 3), np.uint8)) is None
    assert signatures.noise(np.full((SIZE, SIZE, 3), 90, np.uint8)) is None


def test_an_fp16_overflow_written_by_another_tool_is_saturated():
    picture = fp16_overflow_decoded()
    found = signatures.saturated(picture)
    assert found is not None and found.share == 1.0
    assert picture.any()  # not NaN-black: +inf became 255 where it was positive


def test_an_overflow_to_plus_infinity_everywhere_is_white():
    found = signatures.saturated(a1111_write(np.full((SIZE, SIZE, 3), np.inf)))
    assert found is not None and found.white and found.colour == (255, 255, 255)


def test_nan_black_is_not_saturated_but_nan():
    assert signatures.saturated(np.zeros((SIZE, SIZE, 3), np.uint8)) is None


def test_the_figures_are_bounded_on_a_large_picture():
    """A 6000 px picture is measured on its centre (a crop of at most 1536 px)."""
    big = np.zeros((6000, 3000, 3), np.uint8)
    big[2232:3768, :] = np.tile(decoded_noise(), (6, 12, 1))[:1536, :3000]
    assert signatures.noise(big).coloured_noise


# pixel_status and explain ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("picture", "status"),
    [
        (NATURAL["snow"], "ok"),
        (NATURAL["a night scene"], "ok"),
        (NATURAL["heavy grain"], "ok"),
        (decoded_noise(), "noise"),
        (np.full((SIZE, SIZE, 3), 255, np.uint8), "saturated"),
    ],
    ids=["snow", "night", "grain", "noise", "white"],
)
def test_pixel_status_names_each_signature(tmp_path, picture, status):
    assert pixel_status(save(tmp_path, "picture.png", picture))[0] == status


def test_a_white_forge_image_is_an_overflow_with_the_nan_next_steps(tmp_path, home, capsys):
    white = np.full((SIZE, SIZE, 3), 255, np.uint8)
    image = save(tmp_path, "white.png", white, {"parameters": forge_parameters()})

    assert main(["explain", str(image), "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["image"]["status"] == "saturated"
    assert document["pixels"]["saturated"] == {
        "colour": [255, 255, 255],
        "share": 1.0,
        "white": True,
    }
    message = document["message"]
    assert message.startswith("This image (made by Stable Diffusion WebUI Forge) is white")
    assert "overflowed" in message
    # Its model is not in the library: the tool's switches, as for a black image.
    assert document["next_steps"] is not None
    assert "Settings > Model folders" in message

    assert main(["explain", str(image)]) == 1
    assert "Pixels:  every channel at 0 or 255 in 100.0% of the picture" in capsys.readouterr().out


def test_a_saturated_comfyui_image_of_an_fp16_overflow_is_named(tmp_path, home, capsys):
    image = save(tmp_path, "inf.png", fp16_overflow_decoded(), {"prompt": comfy_prompt("x.ckpt")})
    assert main(["explain", str(image), "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["image"]["status"] == "saturated"
    assert "plus or minus infinity" in document["message"] or "is white" in document["message"]


def test_coloured_noise_from_comfyui_is_named_with_its_causes_not_a_precision_fix(
    tmp_path, home, capsys
):
    image = save(tmp_path, "noise.png", decoded_noise(), {"prompt": comfy_prompt("x.ckpt")})
    assert main(["explain", str(image), "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["image"]["status"] == "noise"
    assert document["pixels"]["noise"]["coloured_noise"] is True
    message = document["message"]
    assert "coloured noise, not a picture" in message
    assert "Nothing overflowed" in message and "VAE of another model family" in message
    assert document["next_steps"] is None  # no precision switch is offered for noise
    assert document["fix"] is None


@pytest.mark.parametrize("kind", ["white", "noise"])
def test_a_white_or_noisy_design_without_a_record_is_not_claimed(tmp_path, home, capsys, kind):
    picture = np.full((SIZE, SIZE, 3), 255, np.uint8) if kind == "white" else decoded_noise()
    image = save(tmp_path, f"{kind}.png", picture)
    assert main(["explain", str(image), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["image"]["status"] == "unclaimed"
    assert "does not say which" in document["message"]
    assert document["check"] is None


@pytest.mark.parametrize("name", list(NATURAL))
def test_natural_pictures_with_a_record_are_fine(tmp_path, home, capsys, name):
    image = save(tmp_path, "p.png", NATURAL[name], {"parameters": forge_parameters()})
    assert main(["explain", str(image), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["image"]["status"] == "ok"


def test_the_new_statuses_are_problems_with_words():
    assert {"saturated", "noise"} <= set(explain.PROBLEMS)
    assert "unclaimed" not in explain.PROBLEMS
    assert {"saturated", "noise", "unclaimed"} <= set(explain.STATUS_WORDS)


def test_the_signatures_are_documented():
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[2] / "docs" / "json.md").read_text(encoding="utf-8")
    for word in ("`saturated`", "`noise`", "`unclaimed`", "pixels.saturated", "pixels.noise"):
        assert word in docs


def _tone_figures(rgb: np.ndarray) -> np.ndarray:
    """The figures a negative could be told by: the median over 16 px blocks of the darkest
    and of the brightest channel (natural photographs keep a dark channel near 0), and the
    skew of the brightness (photographs lean to dark tones with few highlights)."""
    unit = rgb.astype(np.float32) / 255.0
    brightness = unit.mean(axis=-1)
    skew = float(((brightness - brightness.mean()) ** 3).mean() / brightness.std() ** 3)
    blocks = unit.reshape(SIZE // 16, 16, SIZE // 16, 16, 3)
    dark = float(np.median(blocks.min(axis=(1, 3, 4))))
    bright = float(np.median(blocks.max(axis=(1, 3, 4))))
    return np.array([dark, bright, skew])


def test_a_negative_is_not_told_from_a_picture_by_its_pixels():
    """Why explain claims no inverted signature: the negative of a night scene has the tone
    figures of snow (and snow's those of a night scene), and no picture's negative is flagged
    by the signatures explain reads."""
    night, snow = NATURAL["a night scene"], NATURAL["snow"]
    assert np.abs(_tone_figures(255 - night) - _tone_figures(snow)).max() < 0.15
    assert np.abs(_tone_figures(255 - snow) - _tone_figures(night)).max() < 0.15
    for name, picture in {**NATURAL, "a white background": white_background()}.items():
        negative = 255 - picture
        assert signatures.saturated(negative) is None, name
        figures = signatures.noise(negative)
        assert figures is not None and not figures.coloured_noise, name


# Thumbnails, icons and the demo's own pictures ------------------------------------------------

SMALL_SIZES = (128, 192, 256)


@pytest.mark.parametrize("size", SMALL_SIZES)
def test_the_demos_pictures_are_never_noise_at_any_small_size(size):
    """A flat shape on a background of another colour (the demo's red circle on blue at 128 px
    has no brightness structure at all over 64 px blocks) is a picture at every size."""
    for grain in (0.0, 6.0):
        for prompt in demo_prompts():
            figures = signatures.noise(demo_picture(*prompt, size, grain))
            assert figures is None or not figures.coloured_noise, (prompt, grain, figures)


@pytest.mark.parametrize("size", SMALL_SIZES)
def test_photographs_spectra_are_never_noise_at_any_small_size(size):
    for seed, alpha, colour in PHOTOGRAPHS:
        figures = signatures.noise(photograph(seed, size, alpha, colour))
        assert figures is not None and not figures.coloured_noise, (seed, alpha, colour, figures)


@pytest.mark.parametrize("size", [*SMALL_SIZES, 512, 1024])
def test_real_noise_is_still_found_small_and_large(size):
    for name, picture in real_noise(size).items():
        figures = signatures.noise(picture)
        assert figures is not None and figures.coloured_noise, (name, figures)


def test_the_correlation_separates_pictures_from_noise_with_room():
    """The margins the thresholds leave at the sizes where they are narrowest: every noise sits
    well below NOISE_CORRELATION (measured: 0.05 at most at 128 px over 300 latents, within
    0.03 from 256 px), and every picture is kept by a figure with room: its colour a third of
    NOISE_COLOUR or less (a photograph's), or its correlation well above the limit (a flat shape
    on another colour: 0.54 and up; a photograph's spectrum with its channels nearly apart:
    0.09 and up at 128 px)."""
    limit = signatures.NOISE_CORRELATION
    for size in SMALL_SIZES:
        noise = [signatures.noise(p).correlation for p in real_noise(size).values()]
        assert max(noise) <= 0.8 * limit, (size, max(noise))
        shapes = [signatures.noise(demo_picture(*p, size)).correlation for p in demo_prompts()]
        assert min(shapes) >= 5 * limit, (size, min(shapes))
        for seed, alpha, colour in PHOTOGRAPHS:
            figures = signatures.noise(photograph(seed, size, alpha, colour))
            kept = (
                figures.colour <= signatures.NOISE_COLOUR / 3 or figures.correlation >= 1.2 * limit
            )
            assert kept, (size, seed, alpha, colour, figures)


@pytest.mark.parametrize("size", SMALL_SIZES)
def test_the_docs_demo_example_is_explained_as_a_fine_picture(tmp_path, home, capsys, size):
    """docs/cli.md's own example, "a red circle on a blue background", as a HalfSafe image."""
    prompt = "a red circle on a blue background"
    picture = demo_picture("circle", "red", "blue", size, grain=3.0)
    image = save(tmp_path, "red.png", picture, {"parameters": halfsafe_parameters(prompt, size)})
    assert main(["explain", str(image), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["image"]["status"] == "ok"
    assert document["pixels"]["noise"]["coloured_noise"] is False
    assert "noise" not in document["message"]
