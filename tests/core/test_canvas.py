"""An inpainting job's layout: the result blended back into the kept picture through the blurred
mask, "only masked" drawing the mask's box at the job's size and pasting it back into the picture
at its own size, and outpainting by extending the canvas. Each checked against pixels computed
here from the input, on a real (tiny) SD pipeline where a generation is involved."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from app.core import generation, health
from app.core.errors import HalfSafeError
from app.core.families import FamilyId
from app.core.health.request import CheckRequest, CheckRun
from app.core.images.canvas import EXTEND_OVERLAP, Canvas, Paste, extended, lay_out, masked_box
from app.core.images.pictures import Mode, mode_of, read_pictures
from app.core.words import infotext
from tests.support.family_helpers import (
    FP16,
    offline,  # noqa: F401 - an autouse fixture: no network
)
from tests.support.family_rows import family_model


def _write(tmp_path, name, array):
    path = tmp_path / name
    Image.fromarray(array).save(path)
    return str(path)


@pytest.fixture
def wide(tmp_path):
    """A 128 x 96 picture of seeded colours and a mask white over x 80-99, y 20-39."""
    rng = np.random.RandomState(1)
    picture = (rng.rand(96, 128, 3) * 255).astype(np.uint8)
    mask = np.zeros((96, 128), np.uint8)
    mask[20:40, 80:100] = 255
    return picture, _write(tmp_path, "wide.png", picture), _write(tmp_path, "hole.png", mask)


def _request(tmp_path, image, mask=None, canvas=None, width=64, height=64):
    return generation.GenerationRequest(
        prompt="a red cube",
        steps=3,
        cfg=4.0,
        seed=5,
        width=width,
        height=height,
        images=[image],
        mask=mask,
        strength=1.0,
        output_dir=str(tmp_path / "out"),
        canvas=canvas or Canvas(),
    )


# --- the layout, computed --------------------------------------------------------------------


def test_the_masked_box_grows_by_the_padding_then_to_the_jobs_proportions():
    grey = Image.new("L", (200, 100), 0)
    grey.paste(255, (90, 40, 110, 50))  # a 20 x 10 mask
    assert masked_box(grey, 0, 1.0) == (90, 35, 110, 55)  # square: the short side grows
    assert masked_box(grey, 5, 2.0) == (80, 35, 120, 55)  # 30 x 20 padded, then 2:1
    # Kept inside the picture: at the left edge it moves right; no larger than the picture.
    grey = Image.new("L", (200, 100), 0)
    grey.paste(255, (0, 0, 10, 10))
    assert masked_box(grey, 10, 1.0) == (0, 0, 30, 30)  # -10..20 moved inside, 30 wide
    assert masked_box(grey, 300, 1.0) == (0, 0, 200, 100)
    # Greys below half are not painted again, so they do not count.
    grey = Image.new("L", (50, 50), 127)
    grey.paste(255, (10, 10, 20, 20))
    assert masked_box(grey, 0, 1.0) == (10, 10, 20, 20)


def test_an_extended_canvas_masks_the_new_area_and_the_seam_and_keeps_the_users_mask():
    picture = Image.fromarray(np.full((40, 60, 3), 200, np.uint8))
    grey = Image.new("L", (60, 40), 0)
    grey.paste(255, (30, 10, 34, 14))  # the user's own small mask, inside
    out, mask = extended(picture, grey, (0, 0, 32, 8))  # right 32, bottom 8
    assert out.size == mask.size == (92, 48)
    pixels, hard = np.asarray(out), np.asarray(mask)
    assert (pixels[:40, :60] == 200).all()  # the picture where it was
    assert (pixels[:, 60:] == 200).all() and (pixels[40:] == 200).all()  # its edge, stretched
    assert (hard[:, 60:] == 255).all() and (hard[40:] == 255).all()  # the new area is drawn
    seam = 60 - EXTEND_OVERLAP
    assert (hard[:, seam:60] == 255).all() and (hard[: 40 - EXTEND_OVERLAP, :seam] == 0).sum()
    assert (hard[10:14, 30:34] == 255).all()  # the user's mask, kept
    assert hard[0, 0] == 0 and hard[20, seam - 1] == 0  # the rest is kept


def test_the_stretched_edge_is_blurred_into_smooth_colour():
    left = np.zeros((32, 32, 3), np.uint8)
    left[::2] = 255  # stripes along the edge: stretched outwards, then blurred
    out, _ = extended(Image.fromarray(left), Image.new("L", (32, 32), 0), (0, 0, 64, 0))
    far = np.asarray(out)[:, 80:].astype(float)
    assert far.std() < np.asarray(left).astype(float).std() / 4


def test_a_layout_out_of_range_is_one_sentence():
    for bad, words in (
        (Canvas(mask_blur=-1), "Mask blur: -1 is not a whole number of pixels from 0 to 64."),
        (Canvas(padding=5000), "Masked area padding: 5000 is not"),
        (Canvas(extend=(0, 0, 99999, 0)), "Extend right: 99999 is not"),
        (Canvas(extend=(1, 2)), "Extend: (1, 2) is not four numbers"),  # type: ignore[arg-type]
        (Canvas(mask_blur=2.5), "Mask blur: 2.5 is not"),  # type: ignore[arg-type]
    ):
        with pytest.raises(HalfSafeError, match=words.replace("(", r"\(").replace(")", r"\)")):
            bad.checked()


def test_extending_needs_a_picture_and_makes_the_job_inpainting():
    assert mode_of(["a.png"], None, extends=True) is Mode.INPAINT
    with pytest.raises(HalfSafeError, match="Extending the canvas needs the picture"):
        mode_of([], None, extends=True)


def test_a_box_of_the_drawn_output_is_placed_where_it_lies_in_the_saved_image():
    paste = Paste(Image.new("RGB", (400, 300)), Image.new("L", (400, 300)), (100, 50, 228, 178))
    # A 64 px output drawn for a 128 px box: each output pixel is two saved pixels.
    # Boxes end exclusive, as the image's `non_finite_box` does.
    assert paste.place_box((0, 0, 64, 64), 64, 64) == (100, 50, 228, 178)
    assert paste.place_box((10, 20, 11, 21), 64, 64) == (120, 90, 122, 92)


def test_the_pipeline_reads_a_hard_mask_of_the_laid_out_picture(wide):
    picture, image, mask = wide
    pictures = read_pictures([image], mask, 64, 64, canvas=Canvas(only_masked=True, padding=0))
    assert pictures is not None and pictures.paste is not None
    assert pictures.paste.box == (80, 20, 100, 40)  # the mask's box, square already
    assert set(np.unique(np.asarray(pictures.mask_image))) == {255}  # all of it is drawn
    # The picture the pipeline starts from is that box of the input, scaled to 64 px.
    expected = np.asarray(Image.fromarray(picture).crop((80, 20, 100, 40)).resize((64, 64), 1))
    drawn = ((pictures.pixels[0].permute(1, 2, 0).numpy() + 1) * 127.5).round()
    assert np.abs(drawn - expected).max() <= 1


# --- generation, on a real pipeline -------------------------------------------------------------


def test_inpainting_keeps_every_pixel_the_mask_keeps(tmp_path, wide):
    _, image, mask = wide
    model = family_model(FamilyId("sd"))
    request = _request(tmp_path, image, mask, Canvas(mask_blur=0), width=128, height=96)
    result = generation.generate(model, request, precision=FP16, device="cpu")
    saved = np.asarray(Image.open(result.images[0].path).convert("RGB"))
    source = np.asarray(Image.open(image).convert("RGB"))
    kept = np.asarray(Image.open(mask)) == 0
    assert saved.shape == source.shape
    assert (saved[kept] == source[kept]).all()
    assert not (saved[~kept] == source[~kept]).all()  # the hole was drawn anew


def test_the_blurred_mask_blends_the_edge(tmp_path, wide):
    _, image, mask = wide
    model = family_model(FamilyId("sd"))
    drawn = {}
    for blur in (0, 4):
        request = _request(tmp_path, image, mask, Canvas(mask_blur=blur), width=128, height=96)
        result = generation.generate(model, request, precision=FP16, device="cpu")
        drawn[blur] = np.asarray(result.images[0].image).astype(int)
    source = np.asarray(Image.open(image).convert("RGB")).astype(int)
    # Two pixels outside the hole: kept exactly without a blur, partly drawn with one.
    assert (drawn[0][30, 77] == source[30, 77]).all()
    assert (drawn[4][30, 77] != source[30, 77]).any()
    # Far from the hole both keep the picture.
    assert (drawn[4][80, 10] == source[80, 10]).all()


def test_only_masked_draws_the_box_and_saves_the_picture_at_its_own_size(tmp_path, wide):
    _, image, mask = wide
    model = family_model(FamilyId("sd"))
    canvas = Canvas(mask_blur=0, only_masked=True, padding=8)
    result = generation.generate(
        model, _request(tmp_path, image, mask, canvas), precision=FP16, device="cpu"
    )
    entry = result.images[0]
    saved = Image.open(entry.path)
    assert saved.size == (128, 96)  # the picture's size, not the job's 64 x 64
    source = np.asarray(Image.open(image).convert("RGB"))
    out = np.asarray(saved.convert("RGB"))
    kept = np.asarray(Image.open(mask)) == 0
    assert (out[kept] == source[kept]).all()
    parsed = infotext.parse(entry.parameters)
    assert parsed.get(infotext.INPAINT_AREA) == "Only masked"
    assert parsed.get(infotext.MASKED_AREA_PADDING) == 8
    assert parsed.get(infotext.MASK_BLUR) == 0
    assert parsed.get(infotext.SIZE) == (64, 64)  # what was drawn, as A1111 records it
    assert result.to_json()["canvas"]["only_masked"] is True


def test_outpainting_extends_the_canvas_without_a_mask(tmp_path, wide):
    picture, image, _ = wide
    model = family_model(FamilyId("sd"))
    canvas = Canvas(mask_blur=0, extend=(0, 0, 32, 0))
    result = generation.generate(
        model, _request(tmp_path, image, None, canvas, 160, 96), precision=FP16, device="cpu"
    )
    assert result.mode is Mode.INPAINT
    entry = result.images[0]
    out = np.asarray(entry.image)
    assert out.shape == (96, 160, 3)
    keep = 128 - EXTEND_OVERLAP
    assert (out[:, :keep] == picture[:, :keep]).all()  # the picture, kept
    assert entry.status == "ok"
    assert infotext.parse(entry.parameters).get(infotext.CANVAS_EXTENDED) == "right 32"
    assert result.to_json()["canvas"]["extend"] == {"left": 0, "top": 0, "right": 32, "bottom": 0}


def test_the_check_probes_an_extended_canvas_as_inpainting(wide):
    _, image, _ = wide
    model = family_model(FamilyId("sd"))
    report = health.check_loaded(
        model,
        CheckRequest(
            precision=FP16,
            device="cpu",
            size=64,
            steps=2,
            images=(image,),
            canvas=Canvas(extend=(16, 0, 0, 0)),
        ),
        run=CheckRun(remember=False, measure_cost=False),
    )
    assert report.mode == "inpaint"
    assert "vae_encoder" in report.components


def test_the_layout_of_a_whole_picture_is_the_job_size():
    picture = Image.new("RGB", (100, 50), (10, 20, 30))
    grey = Image.new("L", (100, 50), 0)
    grey.paste(255, (0, 0, 50, 50))
    drawn, drawn_mask, paste = lay_out(picture, grey, Canvas(), 64, 32)
    assert drawn.size == drawn_mask.size == paste.size == (64, 32)
    assert paste.box == (0, 0, 64, 32)


def test_the_non_finite_share_is_of_the_saved_image(tmp_path, wide):
    from app.core.generation.entry import _pasted
    from app.core.generation.records import ImageResult

    paste = Paste(Image.new("RGB", (400, 300)), Image.new("L", (400, 300)), (100, 50, 228, 178))
    assert paste.box_share == pytest.approx(128 * 128 / (400 * 300))
    entry = ImageResult(
        seed=1, status="nan", image=Image.new("RGB", (64, 64)), non_finite=1.0,
        non_finite_box=(0, 0, 64, 64),
    )  # fmt: skip
    _pasted(entry, paste, _request(tmp_path, "a.png"))
    assert entry.image.size == (400, 300)
    assert entry.non_finite == pytest.approx(paste.box_share)  # all of the box, not all of it
    assert entry.non_finite_box == (100, 50, 228, 178)


def test_a_canvas_extended_past_the_bound_is_one_sentence_naming_the_picture(wide, monkeypatch):
    from app.core.errors import BadFileError

    _, image, _ = wide
    monkeypatch.setattr("app.core.images.finished.MAX_PIXELS", 128 * 96 + 1000)
    with pytest.raises(BadFileError, match=r"wide\.png: is 128x96 pixels; extended it would be "):
        read_pictures([image], None, 64, 64, canvas=Canvas(extend=(0, 0, 64, 0)))
