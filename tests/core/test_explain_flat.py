"""`halfsafe explain` on pictures that are one flat colour: NaN replaced by zeros (Forge Neo,
some ComfyUI nodes and SD.Next settings do it, and torch.compile's Inductor can), told apart from
NaN-black, a dark picture and a solid colour made on purpose; and the torch.compile step a
ComfyUI graph records.

The signatures are made here with HalfSafe's own tiny pipelines, not assumed: all-zero latents
decoded by a tiny VAE, and NaN pixels put through torch.nan_to_num and the usual 8-bit writes.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from app.cli import main
from app.core import explain
from app.core.images.finished import FLAT_SHARE, flat_region, to_image
from tests.support.explain_pictures import decoded, nan_pixels_zeroed
from tests.support.image_files import (
    comfy_prompt,
    comfy_workflow,
    forge_parameters,
    pixels,
    png_text,
)
from tests.support.model_files import save_single_file
from tests.support.planted_sd import plant
from tests.support.tiny_models import build_tiny_sd_pipeline

GREY_SENTENCE = "NaN values replaced by zeros: the picture came out flat grey instead of black"


@pytest.fixture(scope="module")
def zero_latent_picture() -> np.ndarray:
    """What a tool that zeroes NaN latents decodes: all-zero latents at 512 px."""
    import torch

    return decoded(torch.zeros(1, 4, 64, 64))


def solid(colour: tuple[int, int, int], size: int = 64) -> Image.Image:
    return Image.fromarray(np.full((size, size, 3), colour, np.uint8), "RGB")


# The signatures, measured ----------------------------------------------------------------


def test_nan_zeroed_after_decoding_is_exact_mid_grey_in_every_8_bit_write():
    zeros = nan_pixels_zeroed()
    # HalfSafe and diffusers round 127.5 to 128; A1111 and ComfyUI truncate it to 127.
    rounded, _ = to_image(zeros)
    truncated = (np.clip((zeros + 1) / 2, 0, 1) * 255.0).astype(np.uint8)
    for picture, grey in ((np.asarray(rounded), 128), (truncated, 127)):
        flat = flat_region(picture)
        assert flat is not None
        assert flat.colour == (grey, grey, grey) and flat.mid_grey
        assert flat.share == 1.0 and flat.box == (0, 0, 64, 64)


def test_nan_zeroed_in_unit_range_is_black_and_stays_nan_black(tmp_path):
    # A tool working in [0, 1] turns NaN into 0 = black: the all-zero rule already holds it.
    unit = np.clip(nan_pixels_zeroed(), 0, 1)
    picture = (unit * 255).round().astype(np.uint8)
    path = png_text(
        tmp_path / "unit.png", {"parameters": forge_parameters()}, Image.fromarray(picture)
    )
    _, status, figures = explain.read_image(path)
    assert status == "nan" and figures.all_zero and figures.flat is None


def test_zero_latents_decode_to_one_colour_inside_a_band_of_edge_detail(zero_latent_picture):
    flat = flat_region(zero_latent_picture)
    assert flat is not None
    assert not flat.mid_grey  # the VAE's own colour for zero, not 0 in pixel space
    # Measured: 47% of a 512 px picture is exactly one colour; zero padding makes the frame.
    assert 0.3 < flat.share < 0.7
    x0, y0, x1, y1 = flat.box
    assert min(x0, y0) > 16 and max(x1, y1) < 512 - 16
    # Low variance alone would not say it: the picture's brightness still spreads widely.
    assert zero_latent_picture.std() > 10


def test_an_ordinary_decoded_picture_has_no_flat_colour():
    import torch

    torch.manual_seed(0)
    picture = decoded(torch.randn(1, 4, 64, 64))
    assert flat_region(picture) is None


def test_clipped_white_is_not_a_flat_value_but_a_near_white_flat_is():
    white = np.full((32, 32, 3), 255, np.uint8)
    assert flat_region(white) is None
    region = np.random.default_rng(0).integers(0, 256, (32, 32, 3)).astype(np.uint8)
    region[:, :8] = (250, 250, 250)  # a quarter of the picture, one exact colour
    flat = flat_region(region)
    assert flat is not None and flat.colour == (250, 250, 250)
    assert flat.share >= FLAT_SHARE and flat.box == (0, 0, 8, 32)


# explain: the verdicts ----------------------------------------------------------------------


def test_a_flat_grey_forge_image_is_nan_replaced_by_zeros(tmp_path, home, capsys):
    grey, _ = to_image(nan_pixels_zeroed())
    image = png_text(tmp_path / "00001-1234.png", {"parameters": forge_parameters()}, grey)

    assert main(["explain", str(image), "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["image"]["made_by"] == "forge"
    assert document["image"]["status"] == "nan_zeroed"
    assert document["pixels"]["flat"] == {
        "colour": [128, 128, 128],
        "share": 1.0,
        "box": [0, 0, 64, 64],
        "stage": "pixels",
    }
    message = document["message"]
    assert GREY_SENTENCE in message
    assert "Forge" in message and "RGB 128, 128, 128" in message
    # The remedy is the NaN one: find the model and run the check (here: it is not found).
    assert "Settings > Model folders" in message
    assert document["record"]["compiled"] is None

    assert main(["explain", str(image)]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0] == message
    assert "Pixels:  RGB 128, 128, 128 exactly, 100% of the picture (x 0-63, y 0-63)" in out


def test_a_flat_forge_image_whose_model_is_found_gets_the_nan_check_and_forges_fix(
    tmp_path, home, capsys
):
    folder = home / "stable-diffusion-webui-forge" / "models" / "Stable-diffusion"
    folder.mkdir(parents=True)
    model = save_single_file(plant(build_tiny_sd_pipeline(), "vae"), folder / "dreamy.safetensors")
    short = hashlib.sha256(model.read_bytes()).hexdigest()[:10]
    grey, _ = to_image(nan_pixels_zeroed())
    image = png_text(
        tmp_path / "00002-1234.png", {"parameters": forge_parameters(model.stem, short)}, grey
    )

    assert main(["explain", str(image), "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["image"]["status"] == "nan_zeroed"
    assert document["model"]["path"] == str(model)
    assert document["check"]["verdict"] == "fixable"
    assert document["fix"]["for_tool"]["tool"] == "forge"
    assert set(document["fix"]["for_tool"]["flags"]) & {"--vae-in-fp32", "--vae-in-bf16"}
    assert GREY_SENTENCE in document["message"]
    assert "The health check reproduced it" in document["message"]


def test_zero_latents_saved_by_forge_are_nan_zeroed_before_decoding(
    tmp_path, home, capsys, zero_latent_picture
):
    image = png_text(
        tmp_path / "latent.png",
        {"parameters": forge_parameters()},
        Image.fromarray(zero_latent_picture),
    )
    assert main(["explain", str(image), "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["image"]["status"] == "nan_zeroed"
    flat = document["pixels"]["flat"]
    assert flat["stage"] == "latent" and 0.3 < flat["share"] < 0.7
    assert "before decoding" in document["message"]
    assert f"over {flat['share']:.0%} of its pixels" in document["message"]


@pytest.mark.parametrize(("kind", "status"), [("zero", "nan"), ("dark", "black")])
def test_nan_black_and_a_dark_picture_are_still_told_apart(tmp_path, home, capsys, kind, status):
    image = png_text(tmp_path / f"{kind}.png", {"parameters": forge_parameters()}, pixels(kind))
    main(["explain", str(image), "--json"])
    document = json.loads(capsys.readouterr().out)
    assert document["image"]["status"] == status
    assert document["pixels"]["flat"] is None
    assert "replaced by zeros" not in document["message"]


@pytest.mark.parametrize(
    "colour", [(128, 128, 128), (200, 40, 90), (8, 8, 8)], ids=["grey", "red", "dark"]
)
def test_a_solid_colour_without_a_record_is_not_called_nan(tmp_path, home, capsys, colour):
    image = tmp_path / "solid.png"
    solid(colour).save(image)

    assert main(["explain", str(image), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["image"]["made_by"] == "unknown"
    assert document["image"]["status"] == "flat"
    assert document["check"] is None and document["fix"] is None
    message = document["message"]
    assert "looks like" in message and "made flat on purpose" in message
    assert "most likely" not in message and "NaN-black" not in message


def test_a_solid_white_design_is_not_claimed(tmp_path, home, capsys):
    """White in every pixel is what an overflow to infinity looks like once saved
    (test_signatures), and also a white design: without a record nothing is claimed."""
    image = tmp_path / "white.png"
    solid((255, 255, 255)).save(image)
    assert main(["explain", str(image), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["image"]["status"] == "unclaimed"
    assert document["pixels"]["flat"] is None and document["check"] is None


def test_every_status_has_its_words():
    from app.core.generation.records import IMAGE_STATUS_WORDS

    assert set(explain.STATUSES) <= set(IMAGE_STATUS_WORDS) | set(explain.STATUS_WORDS)
    assert set(explain.PROBLEMS) <= set(explain.STATUSES)


# torch.compile ------------------------------------------------------------------------------


def _compiled_prompt(backend: str = "inductor") -> str:
    nodes = json.loads(comfy_prompt("sd15.safetensors"))
    nodes["9"] = {
        "class_type": "TorchCompileModel",
        "inputs": {"model": ["4", 0], "backend": backend},
    }
    nodes["3"]["inputs"]["model"] = ["9", 0]
    return json.dumps(nodes)


def _compiled_workflow(mode: int) -> str:
    workflow = json.loads(comfy_workflow("sd15.safetensors"))
    workflow["nodes"].append(
        {"id": 9, "type": "TorchCompileModel", "mode": mode, "widgets_values": ["inductor"]}
    )
    return json.dumps(workflow)


def test_a_comfyui_graph_that_compiles_the_model_says_so(tmp_path, home, capsys):
    grey, _ = to_image(nan_pixels_zeroed())
    image = png_text(tmp_path / "ComfyUI_00001_.png", {"prompt": _compiled_prompt()}, grey)

    assert main(["explain", str(image), "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["image"]["status"] == "nan_zeroed"
    assert document["record"]["compiled"] == "TorchCompileModel (inductor)"
    assert "compiles the model (TorchCompileModel (inductor))" in document["message"]
    assert any(
        "torch.compile" in note and "eagerly" in note and "183605" in note
        for note in document["notes"]
    )


def test_compile_is_a_note_on_any_image_whose_graph_records_it(tmp_path, home, capsys):
    image = png_text(
        tmp_path / "ComfyUI_00002_.png", {"prompt": _compiled_prompt("cudagraphs")}, pixels("noise")
    )
    assert main(["explain", str(image), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["image"]["status"] == "ok"
    assert any("TorchCompileModel (cudagraphs)" in note for note in document["notes"])


@pytest.mark.parametrize(("mode", "compiled"), [(0, "TorchCompileModel (inductor)"), (4, None)])
def test_a_bypassed_compile_node_in_a_workflow_did_not_run(tmp_path, mode, compiled):
    image = png_text(tmp_path / "wf.png", {"workflow": _compiled_workflow(mode)}, pixels("noise"))
    record, _, _ = explain.read_image(image)
    assert record.made_by == "comfyui" and record.compiled == compiled


def test_a1111_style_records_say_nothing_of_compile(tmp_path):
    image = png_text(tmp_path / "forge.png", {"parameters": forge_parameters()}, pixels("noise"))
    record, _, _ = explain.read_image(image)
    assert record.made_by == "forge" and record.compiled is None


def test_halfsafe_itself_never_compiles_so_its_verdicts_are_eager():
    app = Path(__file__).resolve().parents[2] / "app"
    compiled = [
        str(path.relative_to(app))
        for path in app.rglob("*.py")
        if "torch.compile(" in path.read_text(encoding="utf-8")
        or "torch._dynamo" in path.read_text(encoding="utf-8")
    ]
    assert compiled == []


def test_the_flat_finding_is_documented():
    docs = (Path(__file__).resolve().parents[2] / "docs" / "json.md").read_text(encoding="utf-8")
    for word in ("`nan_zeroed`", "`flat`", "pixels.flat", "record.compiled"):
        assert word in docs
