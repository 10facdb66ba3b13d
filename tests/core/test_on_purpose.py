"""`halfsafe explain` on pictures made on purpose that carry a generation record: normal maps,
pixel art and mosaics, icons, flat designs, seamless textures, tinted and underwater scenes,
dithered art, UI mock-ups (tests/support/on_purpose.py). None is a fault: each that looks like
one is "looks like X, but a picture made so on purpose looks the same", exit 0. And every fault
the suite finds is still found, with the evidence a design cannot show (`designs`).

The default tests run the picture classifier in memory on a sample of each kind, and the
pictures named as false faults through the command; the whole corpus (300 of each kind, each
with an AUTOMATIC1111 and a ComfyUI record) through the classifier and verdict, and every 20th
picture written and explained whole, are marked slow.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from app.cli import main
from app.core.explain.explanation import PROBLEMS, explain_image, verdict
from app.core.explain.image_file import picture_status
from app.core.explain.records import read_record
from app.core.images.finished import to_image
from tests.support import on_purpose
from tests.support.explain_pictures import (
    blocky,
    channels_apart,
    decoded_noise,
    fp16_overflow_decoded,
    nan_pixels_zeroed,
    repeated,
    rgb_static,
)
from tests.support.image_files import a1111_parameters, comfy_prompt

TOOLS = ("a1111", "comfyui")


def records(kind: str, index: int, picture: np.ndarray):
    height, width = picture.shape[:2]
    yield read_record(
        Path("a.png"), {"parameters": on_purpose.a1111_record(kind, index, width, height)}
    )
    yield read_record(
        Path("c.png"), {"prompt": on_purpose.comfy_record(kind, index, width, height)}
    )


def false_faults(pictures) -> list[tuple[str, int, str]]:
    """(kind, index, status) of each picture with a record that the classifier calls a fault."""
    found = []
    for kind, index, picture in pictures:
        status, figures = picture_status(picture)
        for record in records(kind, index, picture):
            said = verdict(record, status, figures)
            if said in PROBLEMS:
                found.append((kind, index, said))
    return found


def test_the_corpus_is_drawn_the_same_from_its_seeds():
    for kind in on_purpose.KINDS:
        first, again = on_purpose.picture(kind, 7), on_purpose.picture(kind, 7)
        assert first.dtype == np.uint8 and first.shape[-1] == 3
        assert min(first.shape[:2]) >= 128 and max(first.shape[:2]) <= 1024
        assert np.array_equal(first, again)


def test_a_sample_of_each_kind_is_no_fault_with_either_record():
    assert false_faults(on_purpose.corpus(every=75)) == []


# The pictures called faults before, through the command -------------------------------------


def red_circle_on_blue(side: int) -> np.ndarray:
    y, x = np.mgrid[0:side, 0:side]
    picture = np.empty((side, side, 3), np.uint8)
    picture[:] = (20, 60, 220)
    picture[(x - side / 2) ** 2 + (y - side / 2) ** 2 < (side * 0.3) ** 2] = (230, 20, 20)
    return picture


def grey_bar() -> np.ndarray:
    picture = np.empty((512, 512, 3), np.uint8)
    picture[:] = (240, 236, 220)
    picture[200 : 200 + 118] = 127  # 23% of the picture
    picture[40:120, 60:300] = (30, 90, 160)
    return picture


def flat_normal_map() -> np.ndarray:
    """Rivets on a flat plate: the flat parts exactly (127, 127, 255)."""
    picture = on_purpose.normal_map(10_001)
    return picture


NAMED = {
    "red circle 128": (red_circle_on_blue(128), "NaN values replaced by zeros"),
    "red circle 256": (red_circle_on_blue(256), "NaN values replaced by zeros"),
    "grey bar": (grey_bar(), "NaN values replaced by zeros"),
    "normal map": (flat_normal_map(), "NaN values replaced by zeros"),
    "pixel art": (on_purpose.picture("pixel_art", 1), "NaN values replaced by zeros"),
    "rippled normal map": (on_purpose.normal_map(10_000), "looks like"),
    "pixel mosaic": (blocky("sharp", 16), "tiled or blocky noise"),
    "brick wall": (on_purpose.seamless_texture(50_010), "tiled or blocky noise"),
    "dithered": (on_purpose.picture("dithered", 0), "an overflow to infinity"),
    "dithered static": (on_purpose.picture("dithered", 10), "RGB static"),
}


@pytest.mark.parametrize("name", list(NAMED))
@pytest.mark.parametrize("tool", TOOLS)
def test_a_picture_made_so_on_purpose_is_said_to_look_so_and_exits_0(
    tmp_path, home, capsys, name, tool
):
    picture, look = NAMED[name]
    path = on_purpose.write(tmp_path, "flat_design", 0, picture, tool)
    code = main(["explain", str(path), "--json", "--device", "cpu"])
    document = json.loads(capsys.readouterr().out)
    assert code == 0, document["message"]
    assert document["image"]["made_by"] in ("a1111", "comfyui")
    message = document["message"]
    assert "a picture made so on purpose looks the same" in message, message
    assert look in message
    assert document["check"] is None and document["fix"] is None
    assert document["pixels"]["design"]["proof"] is None


# Every fault the suite finds is still found ---------------------------------------------------


def _zero_latents() -> np.ndarray:
    import torch

    from tests.support.explain_pictures import decoded

    return decoded(torch.zeros(1, 4, 64, 64))


def faults() -> dict[str, tuple[np.ndarray, dict[str, str]]]:
    """The faults of test_explain_flat, test_signatures and test_looks, each with a record
    that names nothing more than a checkpoint, unless the fault is a design's look that only
    the record's fast path tells (a mosaic of sharp blocks, a smooth tile repeated)."""
    grey, _ = to_image(nan_pixels_zeroed(256))
    plain = {"parameters": a1111_parameters("sdxl", "0123456789")}
    comfy = {"prompt": comfy_prompt("sdxl.safetensors")}
    int8 = {"parameters": a1111_parameters("flux-int8.safetensors", "0123456789")}
    found = {
        "NaN zeroed after decoding": (np.asarray(grey), plain),
        "zero latents decoded": (_zero_latents(), comfy),
        "white": (np.full((512, 512, 3), 255, np.uint8), plain),
        "fp16 overflow": (fp16_overflow_decoded(), comfy),
        "decoded noise": (decoded_noise(), comfy),
        "per-pixel noise": (
            np.random.default_rng(0).integers(0, 256, (512, 512, 3)).astype(np.uint8),
            plain,
        ),
        **{f"static {k}": (rgb_static(k), comfy) for k in ("pure", "eight", "off")},
        **{
            f"false colour {c}": (channels_apart(s, c), comfy)
            for s in (0, 1)
            for c in ((128, 128, 255), (230, 110, 200), (90, 200, 120))
        },
        **{f"blocks grain {p}": (blocky("grain", p), comfy) for p in (8, 16, 64, 128)},
        **{
            f"repeat {k} {p}": (repeated(k, p), comfy)
            for k in ("pixel", "decoded")
            for p in (8, 32)
        },
        "blocks sharp, int8 file": (blocky("sharp", 16), int8),
        "repeat smooth, int8 file": (repeated("smooth", 32), int8),
        "blocks smoothed, int8 file": (blocky("smoothed", 32), int8),
    }
    return found


def test_every_fault_the_suite_finds_is_still_found():
    missed = []
    cases = faults()
    for name, (picture, texts) in cases.items():
        status, figures = picture_status(picture)
        said = verdict(read_record(Path("f.png"), texts), status, figures)
        if said not in PROBLEMS:
            missed.append((name, status, said))
    assert missed == []
    assert len(cases) == 23


# The whole corpus through explain -------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("kind", on_purpose.KINDS)
def test_the_whole_corpus_of_each_kind_is_no_fault_with_either_record(kind):
    """All 300 pictures of a kind, each with both records, through the same classifier and
    verdict `explain` runs (in memory: the PNG round trip is the sample's below)."""
    pictures = (
        (kind, index, on_purpose.picture(kind, index)) for index in range(on_purpose.PER_KIND)
    )
    assert false_faults(pictures) == []


@pytest.mark.slow
@pytest.mark.parametrize("kind", on_purpose.KINDS)
def test_a_sample_of_the_corpus_is_no_fault_through_explain(tmp_path, home, kind):
    """Every 20th picture of a kind written as a PNG with each record and explained whole."""
    called = []
    for index in range(0, on_purpose.PER_KIND, 20):
        picture = on_purpose.picture(kind, index)
        for tool in TOOLS:
            path = on_purpose.write(tmp_path, kind, index, picture, tool)
            explanation = explain_image(path, folders=[str(tmp_path / "models")])
            if explanation.problem:
                called.append((kind, index, tool, explanation.status))
            path.unlink()
    assert called == []
