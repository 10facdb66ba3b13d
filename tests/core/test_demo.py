"""The built-in demo draws what its prompt says, and `demo-overflow` shows the NaN repair.

Pictures are judged as a user would: the colour in the middle of the picture (where the shape
is) and in the four corners (background), each named by the nearest colour of the demo's
palette, which must be the prompted one and close to it.
"""

from __future__ import annotations

import importlib.util
import shutil

import numpy as np
import pytest

from app.core import demo, paths
from app.core.errors import BadFileError
from app.core.generation import GenerationRequest, generate
from app.core.models import load_model
from app.core.settings import PrecisionSettings

ROOT = paths.TREE
# A prompt's colours must come out within this distance (RGB, 0-255) of the palette colour.
TOLERANCE = 90.0
PROMPTS = [
    ("circle", "red", "blue"),
    ("square", "yellow", "purple"),
    ("triangle", "white", "green"),
    ("circle", "green", "white"),
    ("square", "blue", "yellow"),
    ("triangle", "purple", "red"),
]


def colour_name(rgb: np.ndarray) -> tuple[str, float]:
    """The palette colour nearest to `rgb` (0-255) and its distance."""
    distances = {
        name: float(np.linalg.norm(rgb - np.asarray(value, dtype=np.float64)))
        for name, value in demo.DEMO_COLOURS.items()
    }
    name = min(distances, key=distances.__getitem__)
    return name, distances[name]


def shape_and_background(image) -> tuple[tuple[str, float], tuple[str, float]]:
    """The named colours of the picture's centre (24 px square) and of its corners (14 px)."""
    array = np.asarray(image.convert("RGB"), dtype=np.float64)
    size = array.shape[0]
    middle = array[size // 2 - 12 : size // 2 + 12, size // 2 - 12 : size // 2 + 12]
    c = 14
    corners = np.concatenate(
        [
            array[:c, :c].reshape(-1, 3),
            array[:c, -c:].reshape(-1, 3),
            array[-c:, :c].reshape(-1, 3),
            array[-c:, -c:].reshape(-1, 3),
        ]
    )
    return colour_name(middle.reshape(-1, 3).mean(0)), colour_name(corners.mean(0))


def draw(model, prompt: str, tmp_path, seed: int = 7, **precision):
    request = GenerationRequest(
        prompt=prompt,
        seed=seed,
        width=demo.DEMO_SIZE,
        height=demo.DEMO_SIZE,
        output_dir=str(tmp_path / "out"),
    )
    settings = PrecisionSettings(**{"precision": "fp32", **precision})
    return generate(model, request, precision=settings, device="cpu")


@pytest.fixture(scope="module")
def demo_model():
    return load_model("demo")


def load_training_script():
    spec = importlib.util.spec_from_file_location("train_demo", ROOT / "tools" / "train_demo.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_training_pictures_are_judged_by_the_same_regions():
    """Every drawn scene (any shape, colours, jitter) reads as its caption, so the checks on
    generated pictures below ask exactly what the demo was taught."""
    train = load_training_script()
    rng = np.random.default_rng(0)
    combos = train.captions()
    assert len(combos) == len(demo.DEMO_SHAPES) * 6 * 5
    for shape, colour, background in combos[::7]:
        for _ in range(3):
            scene = train.draw_scene(shape, colour, background, rng)
            (middle, d1), (corners, d2) = shape_and_background(scene)
            assert (middle, corners) == (colour, background)
            assert d1 < 30 and d2 < 1  # a triangle's tip may leave a corner of the middle


def test_demo_models_load_with_their_own_profile_keys():
    plain = load_model("demo")
    overflowing = load_model("demo-overflow")
    assert plain.profile_key == f"demo-{demo.DEMO_VERSION}"
    assert overflowing.profile_key == f"demo-overflow-{demo.DEMO_VERSION}"
    assert (overflowing.name, overflowing.source, overflowing.format) == (
        "demo-overflow",
        "demo-overflow",
        "demo",
    )
    assert "overflows in fp16" in overflowing.detected_because
    assert overflowing.weights.non_finite == []
    # Only the planted layer differs, and it still fits in fp16.
    layer = demo.OVERFLOW_LAYER
    for name, tensor in overflowing.pipeline.vae.state_dict().items():
        same = plain.pipeline.vae.state_dict()[name]
        if name.startswith(layer + "."):
            assert float(tensor.abs().max()) <= 65504
            assert float(tensor.abs().max()) > 1000 * float(same.abs().max())
        else:
            assert bool((tensor == same).all()), name


def test_building_the_demo_counts_its_parts():
    """A demo load says how far along it is: each part built and each weights file read is a
    step of one count, ending complete (the window's bar moves instead of sitting at 0 of 1)."""
    heard: list[tuple[str, int, int]] = []
    load_model("demo", on_progress=lambda *event: heard.append(event))
    building = [(done, total) for stage, done, total in heard if stage == demo.DEMO_STAGE]
    total = building[-1][1]
    assert total > 1
    assert building == [(done, total) for done in range(total + 1)]


@pytest.mark.parametrize("damage", ["missing", "truncated", "wrong tensors", "bad summary"])
def test_damaged_demo_weights_are_named_in_one_sentence(tmp_path, monkeypatch, damage):
    folder = tmp_path / "resources" / demo.DEMO_WEIGHTS
    shutil.copytree(paths.resource(demo.DEMO_WEIGHTS), folder)
    monkeypatch.setattr(
        demo,
        "resource",
        lambda *parts: folder if parts == (demo.DEMO_WEIGHTS,) else paths.resource(*parts),
    )
    unet = folder / "unet.safetensors"
    if damage == "missing":
        unet.unlink()
    elif damage == "truncated":
        unet.write_bytes(unet.read_bytes()[:5000])
    elif damage == "wrong tensors":
        shutil.copy(folder / "vae.safetensors", unet)
    else:
        unet = folder / "demo.json"
        unet.write_text('{"scaling_factor": "a lot"}')
    with pytest.raises(BadFileError) as caught:
        load_model("demo")
    message = str(caught.value)
    assert str(unet) in message and "\n" not in message and "reinstall" in message


@pytest.mark.slow
def test_demo_draws_the_prompted_shape_and_background(demo_model, tmp_path):
    """At the app's default steps, sampler and CFG (25, DPM++ 2M Karras, 7) and a fixed seed,
    every prompt here gives its colours: each palette colour as shape and as background."""
    for shape, colour, background in PROMPTS:
        prompt = demo.demo_prompt(shape, colour, background)
        (entry,) = draw(demo_model, prompt, tmp_path).images
        assert entry.status == "ok"
        (middle, d1), (corners, d2) = shape_and_background(entry.image)
        assert (middle, corners) == (colour, background), prompt
        assert d1 < TOLERANCE and d2 < TOLERANCE, (prompt, d1, d2)


def test_demo_pictures_are_the_same_for_the_same_seed(demo_model, tmp_path):
    prompt = demo.demo_prompt("circle", "red", "blue")
    first = np.asarray(draw(demo_model, prompt, tmp_path, seed=3).images[0].image)
    again = np.asarray(draw(demo_model, prompt, tmp_path, seed=3).images[0].image)
    other = np.asarray(draw(demo_model, prompt, tmp_path, seed=4).images[0].image)
    assert np.array_equal(first, again)
    assert not np.array_equal(first, other)


@pytest.mark.slow
def test_demo_overflow_goes_black_in_fp16_and_is_repaired_into_the_same_picture(
    demo_model, tmp_path
):
    overflowing = load_model("demo-overflow")
    prompt = demo.demo_prompt("circle", "red", "blue")
    (black,) = draw(overflowing, prompt, tmp_path, precision="fp16", auto_fix="off").images
    assert (black.status, black.component) == ("nan", "vae")
    assert np.asarray(black.image).max() == 0

    (fixed,) = draw(overflowing, prompt, tmp_path, precision="fp16", auto_fix="auto").images
    assert (fixed.status, fixed.component) == ("fixed", "vae")
    assert fixed.first_bad_module == demo.OVERFLOW_LAYER
    assert np.asarray(fixed.image, dtype=np.float64).std() > 20  # a picture, not a flat field

    # The same picture as the healthy demo in fp16 with its VAE where the repair put it.
    vae_precision = fixed.settings["vae_precision"]
    (healthy,) = draw(
        demo_model, prompt, tmp_path, precision="fp16", vae_precision=vae_precision
    ).images
    difference = np.abs(
        np.asarray(fixed.image, dtype=np.float64) - np.asarray(healthy.image, dtype=np.float64)
    )
    assert difference.mean() < 3, difference.mean()

    # In fp32 the overflowing demo draws what the demo draws.
    (plain,) = draw(overflowing, prompt, tmp_path).images
    (reference,) = draw(demo_model, prompt, tmp_path).images
    assert plain.status == "ok"
    difference = np.abs(
        np.asarray(plain.image, dtype=np.float64) - np.asarray(reference.image, dtype=np.float64)
    )
    assert difference.mean() < 1, difference.mean()
