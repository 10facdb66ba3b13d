"""Image-to-image and inpainting: the input picture and mask read within bounds, every family
that runs them generating from a picture through the VAE's watched encoder, and the
VAE's encoder as a component of its own in the health check and in repairs.

A planted overflow in the encoder (one conv's weights scaled past fp16, finite in fp32) must be
found by the check as `vae_encoder` at its layer, with a verified fix that touches only the VAE,
and repaired by generation; a family without picture pipelines is refused in one sentence.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
import torch
from PIL import Image

from app.core import generation, health
from app.core.errors import BadFileError, HalfSafeError
from app.core.families import FAMILIES, FamilyId, family
from app.core.health.request import CheckRequest, CheckRun
from app.core.images.pictures import (
    Mode,
    check_strength,
    mode_of,
    picture_header,
    picture_size,
    read_pictures,
    steps_run,
)
from app.core.words import infotext
from tests.support.family_helpers import (
    FP16,
    offline,  # noqa: F401 - an autouse fixture: no network
)
from tests.support.family_rows import ROWS, family_model
from tests.support.planted_sd import plant_encoder

PICTURE_FAMILIES = [f.id for f in FAMILIES if Mode.IMAGE in f.picture_pipelines]
INPAINT_FAMILIES = [f.id for f in FAMILIES if Mode.INPAINT in f.picture_pipelines]


@pytest.fixture
def picture(tmp_path):
    """A 64 px picture of seeded colours, and a mask whose middle is white."""
    rng = np.random.RandomState(0)
    path = tmp_path / "input.png"
    Image.fromarray((rng.rand(64, 64, 3) * 255).astype(np.uint8)).save(path)
    mask = np.zeros((64, 64), np.uint8)
    mask[16:48, 16:48] = 255
    mask_path = tmp_path / "mask.png"
    Image.fromarray(mask).save(mask_path)
    return str(path), str(mask_path)


# --- the input, within bounds ------------------------------------------------------------


def test_the_mode_follows_from_what_is_given():
    assert mode_of([], None) is Mode.TEXT
    assert mode_of(["a.png"], None) is Mode.IMAGE
    assert mode_of(["a.png"], "m.png") is Mode.INPAINT
    with pytest.raises(HalfSafeError, match="A mask needs the picture it masks"):
        mode_of([], "m.png")
    with pytest.raises(HalfSafeError, match="2 input pictures were given"):
        mode_of(["a.png", "b.png"], None)


def test_strength_runs_the_last_part_of_the_schedule_and_is_bounded():
    assert steps_run(20, 0.5, Mode.IMAGE) == 10
    assert steps_run(20, 0.5, Mode.TEXT) == 20
    assert steps_run(20, 1.0, Mode.INPAINT) == 20
    for bad in (0.0, -0.1, 1.5, float("nan")):
        with pytest.raises(HalfSafeError, match="Strength"):
            check_strength(20, bad, Mode.IMAGE)
    with pytest.raises(HalfSafeError, match="runs no step"):
        check_strength(4, 0.2, Mode.IMAGE)
    check_strength(4, 0.0, Mode.TEXT)  # text-to-image has no strength to check


def test_the_picture_is_resized_and_the_mask_made_hard(picture):
    image, mask = picture
    pictures = read_pictures([image], mask, 96, 64)
    assert pictures is not None and pictures.mode is Mode.INPAINT
    assert pictures.pixels.shape == (1, 3, 64, 96)
    assert float(pictures.pixels.min()) >= -1.0 and float(pictures.pixels.max()) <= 1.0
    assert set(torch.unique(pictures.mask).tolist()) == {0.0, 1.0}
    masked = pictures.masked_pixels()
    assert float(masked[..., 32, 48].abs().sum()) == 0.0  # the hole is grey (0)
    assert torch.equal(masked[..., 0, 0], pictures.pixels[..., 0, 0])  # the rest is kept
    assert read_pictures([], None, 64, 64) is None


def test_a_file_that_is_no_picture_is_one_sentence_naming_it(tmp_path, picture):
    text = tmp_path / "notes.txt"
    text.write_text("not a picture")
    with pytest.raises(BadFileError, match="notes.txt") as caught:
        read_pictures([str(text)], None, 64, 64)
    assert "\n" not in str(caught.value)
    with pytest.raises(BadFileError, match="no such file"):
        read_pictures([str(tmp_path / "missing.png")], None, 64, 64)
    black = tmp_path / "black.png"
    Image.new("L", (64, 64), 0).save(black)
    with pytest.raises(BadFileError, match="black all over"):
        read_pictures([picture[0]], str(black), 64, 64)


def _png_header_only(path, width, height):
    """A PNG whose header says width x height, with a few bytes of pixels after it: what a
    hostile or enormous file shows before it is decoded."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + data))
        return struct.pack(">I", len(data)) + kind + data + crc

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    body = chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(bytes(64))) + chunk(b"IEND", b"")
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + body)
    return str(path)


def test_a_picture_too_large_is_refused_before_it_is_decoded(tmp_path, monkeypatch):
    from app.core.images import finished as images

    path = tmp_path / "big.png"
    Image.new("RGB", (200, 100)).save(path)
    monkeypatch.setattr(images, "MAX_PIXELS", 10_000)
    with pytest.raises(BadFileError, match="200x100 pixels"):
        read_pictures([str(path)], None, 64, 64)


@pytest.mark.parametrize(
    ("width", "height", "words"),
    [(10_000, 10_000, "10000x10000 pixels"), (20_000, 20_000, "over 178 million pixels")],
)
def test_a_header_of_too_many_pixels_is_one_sentence_wherever_the_picture_is_read(
    tmp_path, width, height, words
):
    # 400 million pixels is past Pillow's own bomb limit, which raises its own error at open.
    path = _png_header_only(tmp_path / "huge.png", width, height)
    for read in (
        lambda: picture_header(path),
        lambda: picture_size(path, 512),
        lambda: read_pictures([path], None, 64, 64),
    ):
        with pytest.raises(BadFileError, match=words) as caught:
            read()
        assert "huge.png" in str(caught.value)
        assert "million pixels are read" in str(caught.value)


def test_reading_a_pictures_size_decodes_none_of_it(tmp_path):
    # A header saying 8000x8000 (within the bound) over a few bytes of pixels: its size is
    # known without a decode, which would find the pixels missing (Pillow's PNG EXIF lookup
    # decodes the whole picture).
    path = _png_header_only(tmp_path / "large.png", 8000, 8000)
    assert picture_header(path) == (8000, 8000)
    assert picture_size(path, 1024) == (1024, 1024)
    with pytest.raises(BadFileError, match="large.png: the picture cannot be read"):
        read_pictures([path], None, 64, 64)


def test_a_16_bit_picture_keeps_its_tones(tmp_path):
    # Pillow's own conversion of a 16-bit grey picture clips it to white: a quarter grey
    # must stay a quarter grey, and a 16-bit mask's white and black stay apart.
    path = tmp_path / "grey16.png"
    Image.fromarray(np.full((64, 64), 16384, np.uint16)).save(path)
    with Image.open(path) as stored:
        assert stored.mode.startswith("I")
    mask = np.zeros((64, 64), np.uint16)
    mask[:, 32:] = 65535
    mask_path = tmp_path / "mask16.png"
    Image.fromarray(mask).save(mask_path)
    pictures = read_pictures([str(path)], str(mask_path), 64, 64)
    assert pictures is not None and pictures.mask is not None
    assert float(pictures.pixels.mean()) == pytest.approx(64 / 255 * 2 - 1, abs=0.01)
    assert float(pictures.mask[..., :32].max()) == 0.0
    assert float(pictures.mask[..., 32:].min()) == 1.0


def test_the_size_left_out_keeps_the_pictures_proportions(tmp_path):
    path = tmp_path / "wide.png"
    Image.new("RGB", (300, 200)).save(path)
    assert picture_size(str(path), 512) == (512, 336)  # 341.3 -> 336, a multiple of 16
    # One side given: the other follows the picture, not the model's square.
    assert picture_size(str(path), 512, width=768) == (768, 512)
    assert picture_size(str(path), 512, height=256) == (384, 256)
    assert picture_size(str(path), 512, 640, 640) == (640, 640)


def test_the_size_follows_the_picture_as_it_is_shown_turned_by_its_exif(tmp_path):
    path = tmp_path / "portrait.jpg"
    exif = Image.Exif()
    exif[0x0112] = 6  # stored landscape, shown turned a quarter: a portrait photo
    Image.new("RGB", (300, 200)).save(path, exif=exif)
    assert picture_header(path) == (200, 300)
    assert picture_size(str(path), 512) == (336, 512)
    pictures = read_pictures([str(path)], None, 336, 512)
    assert pictures is not None and pictures.pixels.shape == (1, 3, 512, 336)


def test_a_narrow_picture_keeps_its_proportions_above_the_smallest_side(tmp_path):
    strip = tmp_path / "strip.png"
    Image.new("RGB", (2000, 100)).save(strip)
    # At 512 px long its short side would be 26 px; it grows to 64 and the long side with it.
    assert picture_size(str(strip), 512) == (1280, 64)
    thread = tmp_path / "thread.png"
    Image.new("RGB", (10_000, 100)).save(thread)
    with pytest.raises(BadFileError, match="thread.png.*10000x100 pixels.*give the width"):
        picture_size(str(thread), 512)
    assert picture_size(str(thread), 512, 1024, 64) == (1024, 64)  # the user's size is taken


def test_a_mask_whose_white_vanishes_when_scaled_says_so(tmp_path, picture):
    path = tmp_path / "speck.png"
    speck = np.zeros((1024, 1024), np.uint8)
    speck[500:502, 500:502] = 255
    Image.fromarray(speck).save(path)
    with pytest.raises(BadFileError, match="speck.png.*too small.*1024x1024 to 64x64"):
        read_pictures([picture[0]], str(path), 64, 64)
    pictures = read_pictures([picture[0]], str(path), 1024, 1024)  # kept at its own size
    assert pictures is not None and pictures.mask is not None
    assert float(pictures.mask.sum()) == 4.0


# --- every family with picture pipelines ---------------------------------------------------


def _request(tmp_path, image, mask=None, strength=0.5):
    return generation.GenerationRequest(
        prompt="a red cube",
        steps=4,
        cfg=4.0,
        seed=3,
        width=64,
        height=64,
        images=[image],
        mask=mask,
        strength=strength,
        output_dir=str(tmp_path / "out"),
    )


@pytest.mark.parametrize("family_id", PICTURE_FAMILIES)
def test_image_to_image_makes_a_finite_picture_from_the_input(family_id, picture, tmp_path):
    model = family_model(family_id)
    result = generation.generate(
        model, _request(tmp_path, picture[0]), precision=FP16, device="cpu"
    )
    assert [image.status for image in result.images] == ["ok"]
    assert "Denoising strength: 0.5" in result.images[0].parameters
    assert "Input picture: input.png" in result.images[0].parameters
    document = result.to_json()
    assert (document["mode"], document["pictures"]) == ("img2img", [picture[0]])


@pytest.mark.parametrize("family_id", INPAINT_FAMILIES)
def test_inpainting_keeps_what_the_mask_keeps(family_id, picture, tmp_path):
    model = family_model(family_id)
    result = generation.generate(
        model, _request(tmp_path, *picture, strength=1.0), precision=FP16, device="cpu"
    )
    assert [image.status for image in result.images] == ["ok"]
    assert result.to_json()["pictures"] == list(picture)  # the picture, then the mask
    parsed = infotext.parse(result.images[0].parameters)
    assert parsed.get(infotext.DENOISING_STRENGTH) == 1.0
    assert parsed.get(infotext.INPUT_PICTURE) == "input.png"
    assert parsed.get(infotext.MASK) == "mask.png"


def test_the_same_seed_and_picture_make_the_same_image(picture, tmp_path):
    model = family_model(FamilyId("sd"))  # quick
    request = _request(tmp_path, picture[0])
    first = generation.generate(model, request, precision=FP16, device="cpu").images[0]
    again = generation.generate(model, request, precision=FP16, device="cpu").images[0]
    assert np.array_equal(np.asarray(first.image), np.asarray(again.image))


@pytest.mark.parametrize("family_id", PICTURE_FAMILIES)
def test_a_planted_encoder_overflow_is_found_at_its_layer_and_fixed_in_the_vae(
    family_id, picture, tmp_path
):
    model = family_model(family_id)
    layer = plant_encoder(model.pipeline)
    report = health.check_loaded(
        model,
        CheckRequest(precision=FP16, device="cpu", size=64, images=(picture[0],)),
        run=CheckRun(remember=False, measure_cost=False),
    )
    encoder = report.components["vae_encoder"]
    assert (report.to_json()["mode"], report.to_json()["pictures"]) == ("img2img", [picture[0]])
    if "vae" in ROWS[family_id].fp32:  # its own config runs the VAE in fp32: nothing overflows
        assert report.verdict == "healthy" and not encoder.status.failed
        return
    assert encoder.status.failed and encoder.first_bad_module == layer
    assert report.verdict == "fixable" and report.fix is not None and report.fix.verified
    changed = {
        name
        for name, dtype in report.fix.plan.dtypes.items()
        if dtype != report.plan.dtypes[name]
        or report.fix.plan.islands(name) != report.plan.islands(name)
    }
    assert changed == {"vae"}, report.fix.summary
    assert report.fix.summary.startswith("The VAE encoder overflowed")
    # The decoder ran after it and is reported on its own.
    assert not report.components["vae"].status.failed
    assert report.to_json()["components"]["vae_encoder"]["first_bad_module"] == layer


@pytest.mark.parametrize("family_id", [FamilyId("sd"), FamilyId("flux")])
def test_generation_repairs_a_planted_encoder_overflow(family_id, picture, tmp_path):
    model = family_model(family_id)
    layer = plant_encoder(model.pipeline)
    result = generation.generate(
        model, _request(tmp_path, picture[0]), precision=FP16, device="cpu"
    )
    image = result.images[0]
    assert image.status == "fixed" and image.component == "vae_encoder"
    assert image.first_bad_module == layer
    assert image.fixes_applied and "VAE" in image.fixes_applied[0]
    assert "NaN component: vae_encoder" in image.parameters


def test_image_to_image_runs_the_denoiser_in_the_precision_asked(picture, tmp_path):
    # A UNet that overflows in fp16 must overflow in an fp16 image-to-image job too: the
    # picture pipeline runs on the placed fp16 copy, not on one widened to fp32 on the way.
    model = family_model(FamilyId("sd"))
    plant = ROWS[FamilyId("sd")].plants["unet"]
    with torch.no_grad():
        model.pipeline.unet.get_submodule(plant.layer).weight.mul_(plant.factor)
    result = generation.generate(
        model, _request(tmp_path, picture[0]), precision=FP16, device="cpu"
    )
    image = result.images[0]
    assert (image.status, image.component) == ("fixed", "unet")
    assert image.first_bad_module == plant.layer


def test_a_family_without_picture_pipelines_is_refused_in_one_sentence():
    zimage = family(next(f.id for f in FAMILIES if f.picture_pipelines.keys() == {Mode.IMAGE}))
    problem = zimage.picture_problem(None, Mode.INPAINT)
    assert problem == f"HalfSafe does not run inpainting for {zimage.title} models."


def test_an_inpainting_model_needs_a_mask(picture, tmp_path):
    sd = family_model(FamilyId("sd"))
    unet = sd.pipeline.unet
    unet.register_to_config(in_channels=9)  # what an inpainting UNet says of itself
    with pytest.raises(HalfSafeError, match="give it a mask to inpaint"):
        generation.generate(sd, _request(tmp_path, picture[0]), precision=FP16, device="cpu")


# --- pictures checked in full before a model is loaded -------------------------------------------


@pytest.fixture
def no_model_loads(monkeypatch):
    """`load_model` refused: a picture the job would refuse must be refused before it."""
    from app.core import models

    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded before the pictures were checked")

    monkeypatch.setattr(models, "load_model", no_load)


@pytest.mark.parametrize("command", ["generate", "check"])
@pytest.mark.parametrize(
    ("case", "words"),
    [
        ("cut.png", "cut.png: the picture cannot be read: the file ends before its pixels do"),
        ("cut.jpg", "cut.jpg: the picture cannot be read: the file ends before its pixels do"),
        ("black-mask", "black.png: the mask is black all over, so nothing would be painted"),
    ],
)
def test_a_truncated_picture_or_a_black_mask_is_refused_before_the_model_loads(
    tmp_path, capsys, picture, no_model_loads, command, case, words
):
    from app.cli import main
    from tests.support.cli_output import without_progress
    from tests.support.image_files import truncated

    image, mask = picture
    if case == "black-mask":
        mask = str(tmp_path / "black.png")
        Image.new("L", (64, 64), 0).save(mask)
    else:
        image = str(truncated(tmp_path / case, "PNG" if case.endswith(".png") else "JPEG"))
    assert picture_header(image) == (64, 64)  # its header alone says nothing is wrong
    code = main([command, "demo", "--device", "cpu", "--image", image, "--mask", mask])
    err = without_progress(capsys.readouterr().err)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("halfsafe: ") and words in err


def test_checking_the_picture_files_decodes_each_and_reads_the_masks_content(tmp_path, picture):
    from app.core.images.pictures import check_picture_files
    from tests.support.image_files import truncated

    image, mask = picture
    check_picture_files([image], mask)  # whole pictures and a mask with white pass
    check_picture_files([image], None)
    cut = truncated(tmp_path / "cut.png", keep=0.9)
    with pytest.raises(BadFileError, match="cut.png: the picture cannot be read") as caught:
        check_picture_files([image, str(cut)], None)
    assert "\n" not in str(caught.value)
    with pytest.raises(BadFileError, match="cut.png: the picture cannot be read"):
        check_picture_files([image], str(cut))  # a mask is a picture too
    grey = tmp_path / "grey.png"
    Image.new("L", (64, 64), 127).save(grey)  # nothing as light as half grey: nothing painted
    with pytest.raises(BadFileError, match="grey.png: the mask is black all over"):
        check_picture_files([image], str(grey))
