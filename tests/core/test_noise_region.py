"""Coloured noise in one box of a fine picture (`app.core.explain.regions`): what a second pass
over one region (ADetailer, the Impact Pack's FaceDetailer) leaves when it goes wrong, told from
whole-picture noise and from pictures with a textured or grainy region, reported with its box,
and named as the pass the record shows with its model and denoise; while a NaN-black image of an
fp16 overflow, with the same pass in its record, is still the model's overflow.

The pictures are made here in code as in test_signatures.py (1/f fields, decoded latent-sized
noise); the box is that noise pasted over a picture, as a pass pastes its crop back."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from app.cli import main
from app.core import explain
from app.core.explain import regions
from app.core.explain.image_file import pixel_status
from tests.support.explain_pictures import (
    NATURAL,
    decoded_noise,
    one_over_f,
    save,
    starry_sky,
    white_background,
    written,
)
from tests.support.explain_trees import a1111_black_png, a1111_tree, overflowing_file  # noqa: F401
from tests.support.image_files import a1111_parameters, comfy_prompt

BOX = (160, 96, 352, 288)  # x0, y0, x1, y1: a face-sized box in a 512 px picture


def with_noisy_box(picture: np.ndarray, box=BOX, seed: int = 3) -> np.ndarray:
    x0, y0, x1, y1 = box
    noise = np.asarray(
        Image.fromarray(decoded_noise(seed)).resize((x1 - x0, y1 - y0), Image.Resampling.BILINEAR)
    )
    out = picture.copy()
    out[y0:y1, x0:x1] = noise
    return out


def with_region(picture: np.ndarray, patch: np.ndarray, x0: int = 150, y0: int = 150):
    out = picture.copy()
    out[y0 : y0 + patch.shape[0], x0 : x0 + patch.shape[1]] = patch
    return out


def foliage(side: int = 192) -> np.ndarray:
    """Leaves: a strong fine texture, green, varying in brightness far more than in hue."""
    rng = np.random.default_rng(21)
    leaf = rng.random((side, side, 1))
    rgb = np.concatenate([leaf * 110 + 10, leaf * 190 + 40, leaf * 70 + 5], axis=-1)
    return np.clip(rgb + rng.normal(0, 6, rgb.shape), 0, 255).astype(np.uint8)


def gravel(side: int = 192) -> np.ndarray:
    """Pebbles 4 px wide in warm greys, with grain."""
    rng = np.random.default_rng(22)
    stones = np.repeat(np.repeat(rng.random((side // 4, side // 4, 1)), 4, 0), 4, 1)
    rgb = stones * 255 * np.array([1.0, 0.93, 0.82])
    return np.clip(rgb + rng.normal(0, 8, rgb.shape), 0, 255).astype(np.uint8)


def chroma_noise_sky(sigma: float, side: tuple[int, int] = (200, 300)) -> np.ndarray:
    """A flat sky with a camera's colour noise: every pixel, every channel apart."""
    rng = np.random.default_rng(23)
    return np.clip(150 + rng.normal(0, sigma, (*side, 3)), 0, 255).astype(np.uint8)


FINE = {
    **NATURAL,
    "a starry sky": starry_sky(),
    "a white background": white_background(),
    "foliage in a picture": with_region(written(one_over_f(13), 0.5, 0.2), foliage()),
    "gravel in a picture": with_region(written(one_over_f(14), 0.5, 0.2), gravel()),
    "a night scene with foliage": with_region(
        written(one_over_f(3), 0.06, 0.04), (foliage() * 0.25).astype(np.uint8)
    ),
    "a sky with colour noise": with_region(
        written(one_over_f(15), 0.5, 0.2), chroma_noise_sky(12), 100, 0
    ),
    "a sky with heavy colour noise": with_region(
        written(one_over_f(16), 0.5, 0.2), chroma_noise_sky(20), 100, 0
    ),
}


# The figures ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(FINE))
def test_pictures_with_textured_or_grainy_regions_have_no_noisy_box(name):
    assert regions.noisy_region(FINE[name]) is None


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_a_box_of_decoded_noise_is_found_where_it_is(seed):
    found = regions.noisy_region(with_noisy_box(written(one_over_f(seed), 0.5, 0.2), seed=seed))
    assert found is not None
    x0, y0, x1, y1 = found.box
    # Within one 32 px cell of the pasted box on every side, and inside it.
    assert all(
        0 <= inner - outer <= regions.CELL for inner, outer in zip((x0, y0), BOX[:2], strict=True)
    )
    assert all(
        0 <= outer - inner <= regions.CELL for inner, outer in zip((x1, y1), BOX[2:], strict=True)
    )
    assert found.structure <= 0.1 and found.colour >= 1.0
    assert 0.05 < found.share < 0.2


def test_a_box_in_a_large_picture_is_found():
    picture = written(one_over_f(11, size=1024), 0.5, 0.2)
    box = (416, 320, 672, 576)
    found = regions.noisy_region(with_noisy_box(picture, box))
    assert found is not None
    assert abs(found.box[0] - box[0]) <= regions.CELL and abs(found.box[3] - box[3]) <= 32


def test_noise_over_the_whole_picture_is_not_a_box():
    assert regions.noisy_region(decoded_noise()) is None


def test_two_boxes_name_the_larger_and_a_tiny_one_is_not_claimed():
    picture = written(one_over_f(17), 0.5, 0.2)
    tiny = with_noisy_box(picture, (64, 64, 128, 128))
    assert regions.noisy_region(tiny) is None  # 64 px: under the figures' 128 px
    # A second, smaller box outside the first is more noisy cells than a picture has.
    both = with_noisy_box(with_noisy_box(picture, (32, 352, 160, 480), seed=6))
    assert regions.noisy_region(both) is None


@pytest.mark.parametrize(
    ("picture", "status"),
    [
        (with_noisy_box(written(one_over_f(4), 0.5, 0.2)), "noise_region"),
        (FINE["foliage in a picture"], "ok"),
        (decoded_noise(), "noise"),
    ],
    ids=["box", "foliage", "whole"],
)
def test_pixel_status_names_a_noisy_box(tmp_path, picture, status):
    found, figures = pixel_status(save(tmp_path, "p.png", picture))
    assert found == status
    assert (figures.noise_region is not None) is (status == "noise_region")


# The record ----------------------------------------------------------------------------------


ADETAILER = {
    "ADetailer model": "face_yolov8n.pt",
    "ADetailer confidence": 0.3,
    "ADetailer denoising strength": 0.4,
    "ADetailer VAE": "kl-f8-anime2.safetensors",
    "ADetailer use separate VAE": True,
    "ADetailer model 2nd": "hand_yolov8n.pt",
    "ADetailer denoising strength 2nd": 1.0,
    "ADetailer version": "24.11.1",
}


def adetailer_parameters(**extra) -> str:
    return a1111_parameters("dreamy", "0123456789", **{**ADETAILER, **extra})


def test_adetailers_passes_are_read_from_infotext():
    record = explain.records._infotext_record(adetailer_parameters())
    first, second = record.second_passes
    assert (first.name, first.model, first.denoise, first.vae) == (
        "ADetailer",
        "face_yolov8n.pt",
        0.4,
        "kl-f8-anime2.safetensors",
    )
    assert (second.model, second.denoise, second.vae) == ("hand_yolov8n.pt", 1.0, None)
    assert record.to_json()["second_passes"][0]["model"] == "face_yolov8n.pt"


def facedetailer_prompt(ckpt: str) -> str:
    nodes = json.loads(comfy_prompt(ckpt))
    nodes["20"] = {
        "class_type": "UltralyticsDetectorProvider",
        "inputs": {"model_name": "bbox/face_yolov8m.pt"},
    }
    nodes["21"] = {
        "class_type": "FaceDetailer",
        "inputs": {
            "image": ["8", 0],
            "model": ["4", 0],
            "vae": ["4", 2],
            "denoise": 0.5,
            "steps": 20,
            "bbox_detector": ["20", 0],
        },
    }
    return json.dumps(nodes)


def test_the_impact_packs_facedetailer_is_read_with_its_detector():
    (found,) = regions.from_comfy_prompt(json.loads(facedetailer_prompt("x.safetensors")))
    assert (found.name, found.model, found.denoise) == ("FaceDetailer", "bbox/face_yolov8m.pt", 0.5)
    workflow = {"nodes": [{"type": "FaceDetailer", "mode": 0}, {"type": "FaceDetailer", "mode": 4}]}
    assert [p.name for p in regions.from_comfy_workflow(workflow["nodes"])] == ["FaceDetailer"]


def test_hostile_pass_values_are_bounded():
    pairs = {"ADetailer model": "x" * 5000, "ADetailer denoising strength": "9e999"}
    (found,) = regions.from_infotext(pairs)
    assert len(found.model or "") == 200 and found.denoise is None
    assert (
        regions.from_comfy_prompt({"1": {"class_type": "FaceDetailer", "inputs": 7}})[0].denoise
        is None
    )


# explain ------------------------------------------------------------------------------------


def test_an_adetailer_box_is_named_as_that_pass_with_its_next_step(tmp_path, home, capsys):
    picture = with_noisy_box(written(one_over_f(4), 0.5, 0.2))
    image = save(tmp_path, "00001.png", picture, {"parameters": adetailer_parameters()})
    assert main(["explain", str(image), "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["image"]["status"] == "noise_region"
    x0, y0, x1, y1 = document["pixels"]["noise_region"]["box"]
    assert BOX[0] <= x0 < x1 <= BOX[2] and BOX[1] <= y0 < y1 <= BOX[3]
    assert document["check"] is None  # the first pass's check proves nothing of the box
    message = document["message"]
    assert "a box of coloured noise at x 160-" in message and "the rest is a picture" in message
    assert "ADetailer (detector face_yolov8n.pt, denoise 0.4, VAE kl-f8-anime2.safetensors)" in (
        message
    )
    assert "--no-half-vae" in message and "denoise (0.4, 1" in message
    assert "not the model's first pass" in message

    assert main(["explain", str(image)]) == 1
    text = capsys.readouterr().out
    assert "Pixels:  coloured noise in x 160-" in text and "Pass:    ADetailer" in text


def test_a_facedetailer_box_in_a_comfyui_image_is_named(tmp_path, home, capsys):
    picture = with_noisy_box(written(one_over_f(5), 0.5, 0.2), seed=5)
    image = save(tmp_path, "ComfyUI_00001_.png", picture, {"prompt": facedetailer_prompt("x.ckpt")})
    assert main(["explain", str(image), "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["image"]["status"] == "noise_region"
    assert "FaceDetailer (detector bbox/face_yolov8m.pt, denoise 0.5)" in document["message"]
    assert "--fp32-vae" in document["message"]


def test_a_box_with_no_pass_recorded_says_what_leaves_one(tmp_path, home, capsys):
    picture = with_noisy_box(written(one_over_f(4), 0.5, 0.2))
    image = save(tmp_path, "p.png", picture, {"parameters": a1111_parameters("m", "0123456789")})
    assert main(["explain", str(image), "--json"]) == 1
    message = json.loads(capsys.readouterr().out)["message"]
    assert "names no second pass" in message and "ADetailer or FaceDetailer" in message


def test_a_box_without_a_record_is_not_claimed(tmp_path, home, capsys):
    image = save(tmp_path, "p.png", with_noisy_box(written(one_over_f(4), 0.5, 0.2)))
    assert main(["explain", str(image), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["image"]["status"] == "unclaimed"
    assert "does not say which" in document["message"] and "box" in document["message"]


@pytest.mark.parametrize("name", list(FINE))
def test_fine_pictures_with_a_second_pass_recorded_stay_ok(tmp_path, home, capsys, name):
    image = save(tmp_path, "p.png", FINE[name], {"parameters": adetailer_parameters()})
    assert main(["explain", str(image), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["image"]["status"] == "ok"


def test_a_nan_black_image_with_a_pass_recorded_is_still_the_models_overflow(
    tmp_path,
    a1111_tree,  # noqa: F811
    capsys,
):
    image = a1111_black_png(tmp_path, a1111_tree, **ADETAILER)
    assert main(["explain", str(image), "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["image"]["status"] == "nan"
    assert document["check"]["components"]["vae"]["status"] in ("overflow", "nan")
    assert document["fix"]["for_tool"]["flags"] == ["--no-half-vae"]
    assert "The health check reproduced it" in document["message"]
    assert "second pass" not in document["message"]


def test_the_region_status_has_words_and_is_documented():
    from pathlib import Path

    assert "noise_region" in explain.STATUSES and "noise_region" in explain.PROBLEMS
    assert "noise_region" in explain.STATUS_WORDS
    docs = (Path(__file__).resolve().parents[2] / "docs" / "json.md").read_text(encoding="utf-8")
    for word in ("`noise_region`", "pixels.noise_region", "record.second_passes"):
        assert word in docs
