"""Pictures with an alpha channel: Qwen-Image 2.1's VAE decodes RGBA, and HalfSafe saves the
picture as its pipeline makes it (alpha included, the PNG's parameters as before), judges it by
its colours as it judges an RGB picture, and `halfsafe explain` reads such a picture by what
shows, so that a transparent background is never taken for black or one flat colour."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from app.cli import main
from app.core import generation
from app.core.explain.image_file import pixel_status
from app.core.images.finished import read_parameters, to_image
from app.core.settings import PrecisionSettings
from tests.support.family_helpers import in_memory, offline  # noqa: F401 - autouse: no network
from tests.support.tiny_models import build_tiny_qwenimage21_pipeline

SIZE = 256


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A tiny Qwen-Image 2.1's picture as HalfSafe saves it (fp32), and the same picture as
    diffusers' own pipeline hands it back (output_type="np": RGBA in 0..1)."""
    pipeline = build_tiny_qwenimage21_pipeline()
    folder = tmp_path_factory.mktemp("rgba")
    request = generation.GenerationRequest(
        prompt="a red cat", steps=2, cfg=1.0, seed=3, width=64, height=64, output_dir=str(folder)
    )
    result = generation.generate(
        in_memory(pipeline, "qwenimage21-alpha", "qwenimage21"),
        request,
        precision=PrecisionSettings(precision="fp32"),
    )
    theirs = pipeline(
        prompt="a red cat",
        num_inference_steps=2,
        height=64,
        width=64,
        generator=torch.Generator().manual_seed(3),
        output_type="np",
    ).images[0]
    return result.images[0], theirs


def test_qwenimage21_saves_its_vaes_alpha_as_its_pipeline_makes_it(made):
    entry, theirs = made
    with Image.open(entry.path) as image:
        assert image.mode == "RGBA"
        saved = np.asarray(image)
    assert theirs.shape == (64, 64, 4)
    assert np.array_equal(saved, (theirs * 255).round().astype(np.uint8))
    assert saved[..., 3].min() < saved[..., 3].max()  # the VAE's alpha, not a filled-in 255
    assert entry.status == "ok"
    parameters = read_parameters(entry.path)
    assert parameters is not None and parameters.startswith("a red cat\n")
    assert "Steps: 2, Sampler: Euler, CFG scale: 1, Seed: 3, Size: 64x64" in parameters


def test_the_alpha_is_judged_by_nothing_and_a_non_finite_alpha_is_opaque():
    rng = np.random.default_rng(0)
    colours = rng.uniform(-1.0, -0.99, (8, 8, 3)).astype(np.float32)  # near-black
    alpha = rng.uniform(-1.0, 1.0, (8, 8, 1)).astype(np.float32)
    alpha[0, 0, 0] = np.nan
    colours[7, 7, 1] = np.nan

    image, stats = to_image(np.concatenate([colours, alpha], axis=-1))
    rgb_image, rgb_stats = to_image(colours)

    assert image.mode == "RGBA" and rgb_image.mode == "RGB"
    assert stats == rgb_stats  # the NaN count, brightness and its box: the colours' alone
    assert stats.non_finite == 1 / 64 and stats.non_finite_box == (7, 7, 8, 8)
    assert stats.near_black is False  # one NaN pixel: never near-black, as for RGB
    pixels = np.asarray(image)
    assert np.array_equal(pixels[..., :3], np.asarray(rgb_image))
    assert pixels[0, 0, 3] == 255  # a NaN alpha is written opaque: the pixel shows as judged
    expected = (np.clip(alpha[1:, :, 0] / 2 + 0.5, 0, 1) * 255).round().astype(np.uint8)
    assert np.array_equal(pixels[1:, :, 3], expected)


def test_a_qwenimage21_picture_explains_as_fine(made, home, capsys):
    entry, _ = made
    main(["explain", entry.path, "--json"])
    document = json.loads(capsys.readouterr().out)
    assert document["image"]["made_by"] == "halfsafe"
    assert document["image"]["status"] == "ok"
    assert document["pixels"]["transparent"] == 0.0  # its alpha is low, never exactly 0 here


def _picture(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    smooth = Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8), "RGB")
    return np.asarray(smooth.resize((SIZE, SIZE), Image.Resampling.BICUBIC))


def _rgba(rgb: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    return np.concatenate([rgb, alpha[..., None]], axis=-1).astype(np.uint8)


def _save(tmp_path, name: str, rgba: np.ndarray):
    path = tmp_path / name
    Image.fromarray(rgba, "RGBA").save(path)
    return path


def test_a_small_cut_out_on_a_transparent_black_background_is_not_black(tmp_path):
    """A sticker: a few hundred opaque pixels, the rest transparent and written 0 (as most
    tools write a transparent pixel). By its colours alone it is near-black and flat."""
    rgb = np.zeros((SIZE, SIZE, 3), np.uint8)
    alpha = np.zeros((SIZE, SIZE), np.uint8)
    rgb[100:110, 100:110] = np.random.default_rng(1).integers(40, 220, (10, 10, 3))
    alpha[100:110, 100:110] = 255
    path = _save(tmp_path, "sticker.png", _rgba(rgb, alpha))

    status, figures = pixel_status(path)

    assert status == "ok"
    assert figures.transparent == round(1 - 100 / SIZE**2, 4)
    assert figures.mean > 0.1  # the sticker's own brightness, not the background's 0


def test_a_transparent_background_written_in_one_grey_is_not_flat(tmp_path):
    """A cut-out whose transparent half is written exact mid-grey: what a NaN replaced by zeros
    after decoding looks like, were it shown."""
    rgb = _picture(2).copy()
    alpha = np.full((SIZE, SIZE), 255, np.uint8)
    rgb[:, : SIZE // 2] = 127
    alpha[:, : SIZE // 2] = 0
    path = _save(tmp_path, "cut-out.png", _rgba(rgb, alpha))

    status, figures = pixel_status(path)

    assert status == "ok" and figures.flat is None
    # The same grey showing is still one flat colour.
    assert pixel_status(_save(tmp_path, "shown.png", _rgba(rgb, np.full_like(alpha, 255))))[0] == (
        "flat"
    )


@pytest.mark.parametrize("alpha", [0, 255], ids=["zeros-everywhere", "halfsafe-nan"])
def test_nan_black_with_an_alpha_is_still_nan(tmp_path, alpha):
    """NaN written as 0 in every channel (another tool), or HalfSafe's NaN pixels (black,
    opaque): both NaN-black."""
    rgba = np.zeros((64, 64, 4), np.uint8)
    rgba[..., 3] = alpha
    assert pixel_status(_save(tmp_path, "nan.png", rgba))[0] == "nan"
