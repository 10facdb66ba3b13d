"""Image-to-image and inpainting on the Generate page, with a fake engine: the input picture,
its mask and the strength reach the request; the size follows the picture; what the loaded
model cannot run is disabled with the sentence why; a bad file is one sentence; the caption,
the gallery and the status bar say what the image was made from."""

from __future__ import annotations

from dataclasses import replace

import pytest
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QColor, QDragEnterEvent, QDropEvent, QImage
from PySide6.QtWidgets import QApplication

from app.core.generation.records import GenerationRequest
from app.core.images.pictures import Mode
from app.core.words import infotext
from app.engine.events import EventState
from app.ui.image_entry import item_text, tooltip
from tests.support import reports
from tests.ui.conftest import DEMO_SUMMARY, load_fake_model

# What the families say of a mode they do not run (`Family.picture_problem`).
NO_IMAGE = "HalfSafe does not run image-to-image for Flux.2 models."
NO_INPAINT = "HalfSafe does not run inpainting for Flux.2 models."


@pytest.fixture
def view(window, engines):
    load_fake_model(window, engines)
    window.show_page("Generate")
    view = window.generate_view
    view.prompt.setPlainText("a lighthouse at dusk")
    return view


def _picture(path, size=(300, 200), colour="steelblue") -> str:
    image = QImage(size[0], size[1], QImage.Format.Format_RGB32)
    image.fill(QColor(colour))
    assert image.save(str(path))
    return str(path)


def status_bar(view) -> str:
    return view.window().message_status.full_text()


def test_the_request_carries_the_picture_the_mask_and_the_strength(view, engines, tmp_path):
    photo = _picture(tmp_path / "photo.png")
    mask = _picture(tmp_path / "mask.png", colour="white")
    view.generate()
    text_job = engines.current.last_job("generate").params.generation
    assert (text_job.images, text_job.mask, text_job.mode_for()) == ([], None, Mode.TEXT)

    assert view.pictures.picture_slot.choose(photo)
    view.pictures.strength.setValue(0.6)
    view.generate()
    picture_job = engines.current.last_job("generate").params.generation
    assert picture_job.images == [photo]
    assert picture_job.mask is None
    assert picture_job.strength == 0.6
    assert picture_job.mode_for() is Mode.IMAGE

    assert view.pictures.mask_slot.choose(mask)
    view.generate()
    inpaint_job = engines.current.last_job("generate").params.generation
    assert (inpaint_job.images, inpaint_job.mask, inpaint_job.mode_for()) == (
        [photo],
        mask,
        Mode.INPAINT,
    )
    # Removing the picture removes its mask with it: text-to-image again.
    view.pictures.picture_slot.remove_button.click()
    assert view.pictures.mask_slot.path == ""
    view.generate()
    again = engines.current.last_job("generate").params.generation
    assert (again.images, again.mask) == ([], None)


def test_a_picture_dropped_on_the_area_is_taken_as_input(view, tmp_path):
    photo = _picture(tmp_path / "dropped.png")
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(photo)])
    slot = view.pictures.picture_slot
    enter = QDragEnterEvent(
        slot.rect().center(),
        Qt.DropAction.CopyAction,
        mime,
        Qt.MouseButton.LeftButton,
        Qt.KeyboardModifier.NoModifier,
    )
    QApplication.sendEvent(slot, enter)
    assert enter.isAccepted()
    drop = QDropEvent(
        QPointF(slot.rect().center()),
        Qt.DropAction.CopyAction,
        mime,
        Qt.MouseButton.LeftButton,
        Qt.KeyboardModifier.NoModifier,
    )
    QApplication.sendEvent(slot, drop)
    assert drop.isAccepted()
    assert view.pictures.images() == [photo]
    assert "dropped" in slot.name.text()
    assert not slot.preview.pixmap().isNull()
    # The window's own drop (the image viewer) is not what ran.
    assert view.window().image_viewer is None


def test_width_and_height_follow_the_picture_unless_the_user_set_them(view, tmp_path):
    # The demo is made for 128 px: a 300x200 picture is drawn at 128x80 (multiples of 16).
    assert (view.width_box.value(), view.height_box.value()) == (128, 128)
    assert view.pictures.picture_slot.choose(_picture(tmp_path / "wide.png", (300, 200)))
    assert (view.width_box.value(), view.height_box.value()) == (128, 80)
    assert "proportions" in view.size_hint.text()
    view.pictures.picture_slot.remove()  # the picture gone, so are its words about the size
    assert "proportions" not in view.size_hint.text()
    assert view.pictures.picture_slot.choose(_picture(tmp_path / "tall.png", (200, 400)))
    assert (view.width_box.value(), view.height_box.value()) == (64, 128)

    view.width_box.setValue(96)  # the user's own size stands from now on
    view.pictures.picture_slot.choose(_picture(tmp_path / "wide2.png", (300, 200)))
    assert (view.width_box.value(), view.height_box.value()) == (96, 128)


def test_strength_and_mask_need_a_picture(view, tmp_path):
    pictures = view.pictures
    assert not pictures.strength.isEnabled()
    assert not pictures.mask_slot.isEnabled()
    assert pictures.strength.value() == 0.75
    assert pictures.picture_slot.choose(_picture(tmp_path / "photo.png"))
    assert pictures.strength.isEnabled()
    assert pictures.mask_slot.isEnabled()
    pictures.picture_slot.remove()
    assert not pictures.strength.isEnabled()


def test_a_model_that_runs_no_picture_mode_disables_the_area_with_one_sentence(
    window, engines, tmp_path
):
    photo = _picture(tmp_path / "photo.png")
    load_fake_model(window, engines)
    view = window.generate_view
    view.prompt.setPlainText("a lighthouse")
    assert view.pictures.picture_slot.choose(photo)
    load_fake_model(
        window,
        engines,
        replace(DEMO_SUMMARY, picture_modes={Mode.IMAGE: NO_IMAGE, Mode.INPAINT: NO_INPAINT}),
    )
    pictures = view.pictures
    assert not pictures.picture_slot.isEnabled()
    assert not pictures.strength.isEnabled()
    assert (
        pictures.note.text()
        == "HalfSafe does not run image-to-image or inpainting for Flux.2 models."
    )
    assert not pictures.note.isHidden()
    # The picture chosen before is kept but not sent: this model draws from the prompt alone.
    view.generate()
    assert engines.current.last_job("generate").params.generation.images == []
    assert not view.set_input_picture(photo)
    assert status_bar(view) == pictures.note.text()


def test_a_model_without_inpainting_disables_the_mask_with_its_sentence(window, engines, tmp_path):
    load_fake_model(
        window,
        engines,
        replace(DEMO_SUMMARY, picture_modes={Mode.IMAGE: "", Mode.INPAINT: NO_INPAINT}),
    )
    view = window.generate_view
    pictures = view.pictures
    assert pictures.picture_slot.choose(_picture(tmp_path / "photo.png"))
    assert pictures.strength.isEnabled()
    assert not pictures.mask_slot.isEnabled()
    assert pictures.mask_slot.toolTip() == NO_INPAINT
    assert pictures.note.text() == NO_INPAINT


def test_a_mode_the_model_refuses_or_a_strength_that_runs_no_step_is_not_sent(
    window, engines, tmp_path
):
    # An inpainting model paints only with a mask.
    refusal = "Its denoiser takes a mask beside the picture; give it a mask to inpaint."
    load_fake_model(
        window,
        engines,
        replace(DEMO_SUMMARY, picture_modes={Mode.IMAGE: refusal, Mode.INPAINT: ""}),
    )
    view = window.generate_view
    assert view.pictures.picture_slot.choose(_picture(tmp_path / "photo.png"))
    view.generate()
    assert engines.current.jobs("generate") == []
    assert status_bar(view) == refusal
    assert view.pictures.mask_slot.choose(_picture(tmp_path / "mask.png", colour="white"))
    view.steps.setValue(2)
    view.pictures.strength.setValue(0.2)
    view.generate()
    assert engines.current.jobs("generate") == []
    assert status_bar(view).startswith("Strength: 0.2 of 2 steps runs no step")
    view.pictures.strength.setValue(0.5)
    view.generate()
    assert engines.current.last_job("generate").params.generation.mode_for() is Mode.INPAINT


# What Flux.2 Klein's summary says: it edits up to 4 pictures and inpaints one with a mask.
KLEIN_SUMMARY = replace(
    DEMO_SUMMARY,
    name="klein",
    architecture="flux2-klein",
    picture_modes={Mode.IMAGE: "", Mode.INPAINT: ""},
    references=4,
    draws_from_noise=(Mode.EDIT,),
)


def test_an_editing_model_gets_a_slot_per_picture_it_edits_and_no_strength(
    window, engines, tmp_path
):
    load_fake_model(window, engines, KLEIN_SUMMARY)
    view = window.generate_view
    view.prompt.setPlainText("make the cube red")
    pictures = view.pictures
    assert "This model edits up to 4 pictures" in pictures.picture_slot.name.text()
    assert [slot.isHidden() for slot in pictures.more_slots] == [True, True, True]

    first, second = _picture(tmp_path / "a.png"), _picture(tmp_path / "b.png", colour="red")
    assert pictures.picture_slot.choose(first)
    # One further slot at a time, each once the one before it holds a picture.
    assert [slot.isHidden() for slot in pictures.more_slots] == [False, True, True]
    assert pictures.mode() is Mode.EDIT
    assert not pictures.strength.isEnabled()
    assert pictures.strength_caption.text() == (
        "An edit draws the whole picture anew from noise with every step: no strength."
    )
    assert pictures.mask_slot.isEnabled()  # Klein inpaints one picture with a mask
    assert pictures.more_slots[0].choose(second)
    assert [slot.isHidden() for slot in pictures.more_slots] == [False, False, True]
    assert not pictures.mask_slot.isEnabled()  # inpainting starts from one picture
    assert "remove the others" in pictures.mask_slot.toolTip()

    view.generate()
    job = engines.current.last_job("generate").params.generation
    assert job.images == [first, second]
    assert job.mode_for(4) is Mode.EDIT
    assert job.strength == 0.75  # what a job carries unasked: an edit runs every step

    # A model that does not edit takes one picture; the others are kept for the next editor.
    load_fake_model(window, engines)
    assert [slot.isHidden() for slot in pictures.more_slots] == [True, True, True]
    assert pictures.images() == [first] and pictures.mode() is Mode.IMAGE
    assert pictures.strength.isEnabled()
    load_fake_model(window, engines, KLEIN_SUMMARY)
    assert pictures.images() == [first, second]


def test_flux_fill_inpaints_with_no_strength_and_says_why(window, engines, tmp_path):
    fill = replace(
        DEMO_SUMMARY,
        name="fill",
        architecture="flux-fill",
        picture_modes={
            Mode.IMAGE: "this is Flux.1 Fill, an inpainting model: give it a mask with the "
            "picture (white where it paints).",
            Mode.INPAINT: "",
        },
        draws_from_noise=(Mode.INPAINT,),
    )
    load_fake_model(window, engines, fill)
    view = window.generate_view
    view.prompt.setPlainText("a red door")
    pictures = view.pictures
    assert pictures.picture_slot.choose(_picture(tmp_path / "photo.png"))
    view.steps.setValue(1)  # a strength would run no step of one; Fill runs it
    assert pictures.mask_slot.choose(_picture(tmp_path / "mask.png", colour="white"))
    assert pictures.mode() is Mode.INPAINT
    assert not pictures.strength.isEnabled()
    assert pictures.strength_caption.text() == (
        "This model draws the masked area from noise with every step: no strength."
    )
    view.generate()
    job = engines.current.last_job("generate").params.generation
    assert job.mode_for() is Mode.INPAINT and job.strength == 0.75


def test_a_control_model_takes_its_picture_alone_with_no_strength_and_no_mask(
    window, engines, tmp_path
):
    control = replace(
        DEMO_SUMMARY,
        name="depth",
        architecture="flux-control",
        picture_modes={
            Mode.IMAGE: "",
            Mode.INPAINT: "this is a control model: it takes no mask; give only the control "
            "picture (a depth map or an edge picture).",
        },
        control=True,
        draws_from_noise=(Mode.CONTROL,),
    )
    load_fake_model(window, engines, control)
    view = window.generate_view
    view.prompt.setPlainText("a quiet room")
    pictures = view.pictures
    assert "drop or choose the depth map" in pictures.picture_slot.name.text()
    depth = _picture(tmp_path / "depth.png", colour="grey")
    assert pictures.picture_slot.choose(depth)
    assert pictures.mode() is Mode.CONTROL
    assert not pictures.strength.isEnabled()
    assert pictures.strength_caption.text() == (
        "A control model draws from noise with every step, after the picture: no strength."
    )
    assert not pictures.mask_slot.isEnabled()
    assert "it takes no mask" in pictures.mask_slot.toolTip()
    view.generate()
    job = engines.current.last_job("generate").params.generation
    assert job.images == [depth] and job.mask is None
    assert job.mode_for(control=True) is Mode.CONTROL


def test_the_caption_says_how_an_inpainting_was_laid_out():
    from app.ui.image_entry import GalleryEntry, mode_words

    def said(*pairs):
        text = infotext.write(
            "a beach",
            "",
            [(infotext.MODE, "inpaint"), (infotext.INPUT_PICTURE, "photo.png"), *pairs],
        )
        return mode_words(GalleryEntry.from_parameters(text, made_by="halfsafe"))

    assert said((infotext.MASK, "m.png")) == "inpainting photo.png where m.png is white"
    assert said((infotext.CANVAS_EXTENDED, "right 256")) == (
        "outpainting photo.png extended right 256"
    )
    assert said(
        (infotext.DENOISING_STRENGTH, 0.6),
        (infotext.INPAINT_AREA, "Only masked"),
        (infotext.MASK, "m.png"),
        (infotext.CANVAS_EXTENDED, "top 64"),
    ) == (
        "inpainting photo.png where m.png is white, extended top 64, only the masked area, strength 0.6"
    )


@pytest.mark.parametrize(
    ("mode", "pictures", "said"),
    [
        ("edit", "a.png, b.png", "Editing a.png, b.png"),
        ("control", "depth.png", "Drawn after the control picture depth.png"),
    ],
)
def test_the_caption_says_the_mode_the_image_records(mode, pictures, said):
    from app.ui.image_entry import GalleryEntry, parameter_text

    text = infotext.write(
        "make it red",
        "",
        [
            (infotext.STEPS, 4),
            (infotext.MODE, mode),
            (infotext.INPUT_PICTURE, pictures),
        ],
    )
    entry = GalleryEntry.from_parameters(text, made_by="halfsafe")
    assert entry.mode.value == mode
    caption = parameter_text(entry)
    assert said in caption
    assert "image-to-image" not in caption.lower() and "strength" not in caption.lower()


def test_a_file_that_is_no_picture_is_one_sentence_and_never_taken(view, engines, tmp_path):
    fake = tmp_path / "notes.png"
    fake.write_text("these are my notes, not a picture")
    assert not view.pictures.picture_slot.choose(str(fake))
    assert view.pictures.images() == []
    assert str(fake) in status_bar(view)
    assert "not a picture" in status_bar(view)
    assert view.window().dialogs.shown == []


def test_a_picture_the_engine_cannot_read_is_one_sentence_and_the_model_stays(
    view, engines, tmp_path
):
    photo = _picture(tmp_path / "photo.png")
    assert view.pictures.picture_slot.choose(photo)
    view.generate()
    job = engines.current.last_job("generate")
    sentence = f"{photo}: the picture cannot be read (image file is truncated)."
    engines.current.emit(job, EventState.ERROR, message=sentence, error_type="BadFileError")
    assert status_bar(view) == sentence
    assert view.progress_label.text() == sentence
    assert view.window().dialogs.shown == []
    assert view.window().state.model is not None
    assert view.generate_button.isEnabled()


def _picture_result(tmp_path, request: GenerationRequest, with_parameters: bool):
    image = reports.image(_picture(tmp_path / "out.png", (64, 64)), settings={"precision": "fp16"})
    if with_parameters:
        # The very text the PNG holds (core's writer of the format): what the file records.
        image.parameters = infotext.write(
            request.prompt,
            "",
            [
                (infotext.STEPS, request.steps),
                (infotext.SEED, image.seed),
                (infotext.DENOISING_STRENGTH, request.strength),
                (infotext.INPUT_PICTURE, "photo.png"),
                (infotext.MASK, "mask.png" if request.mask else None),
            ],
        )
    result = reports.generation({"images": [image], "seconds": 1.0})
    result.request, result.mode = request, request.mode_for()
    return result


@pytest.mark.parametrize("with_parameters", [True, False], ids=["from its text", "from the run"])
def test_the_caption_the_gallery_and_the_status_bar_say_the_mode(
    view, engines, tmp_path, with_parameters
):
    photo, mask = str(tmp_path / "photo.png"), str(tmp_path / "mask.png")
    view.generate()
    job = engines.current.last_job("generate")
    request = GenerationRequest(prompt="a lighthouse at dusk", images=[photo], strength=0.6)
    engines.current.finish(job, _picture_result(tmp_path, request, with_parameters))
    assert "Image-to-image from photo.png, strength 0.6" in view.parameters.text()
    item = view.gallery.item(0)
    assert item.text() == "a lighthouse at dusk\nimg2img · seed 1234"
    assert "Image-to-image from photo.png, strength 0.6" in item.toolTip()
    assert status_bar(view) == "Last image: image-to-image from photo.png, strength 0.6."

    view.generate()
    job = engines.current.last_job("generate")
    request = replace(request, mask=mask, strength=0.75)
    engines.current.finish(job, _picture_result(tmp_path, request, with_parameters))
    entry = view.current_entry
    assert entry.mode is Mode.INPAINT
    assert "Inpainting photo.png where mask.png is white, strength 0.75" in view.parameters.text()
    assert item_text(entry) == "a lighthouse at dusk\ninpaint · seed 1234"
    assert "Inpainting photo.png" in tooltip(entry)
    assert status_bar(view).startswith("Last image: inpainting photo.png")


def test_a_text_to_image_caption_says_no_mode_and_a_hires_strength_stays_a_parameter(view):
    from app.ui.image_entry import GalleryEntry, parameter_text

    text = infotext.write("a cat", "", [(infotext.STEPS, 20), (infotext.DENOISING_STRENGTH, 0.4)])
    entry = GalleryEntry.from_parameters(text, made_by="a1111")
    assert entry.mode is Mode.TEXT
    caption = parameter_text(entry)
    assert "Denoising strength: 0.4" in caption
    assert "image-to-image" not in caption.lower()


def test_the_fix_makes_the_same_image_again_from_its_own_picture(view, engines, tmp_path):
    photo = _picture(tmp_path / "photo.png")
    assert view.pictures.picture_slot.choose(photo)
    view.generate()
    job = engines.current.last_job("generate")
    image = reports.image(
        _picture(tmp_path / "nan.png", (64, 64)),
        status="nan",
        component="vae",
        fix={"vae_precision": "fp32"},
    )
    result = reports.generation({"images": [image], "seconds": 1.0})
    result.request = GenerationRequest(prompt="a lighthouse", images=[photo], strength=0.5)
    result.mode = Mode.IMAGE
    engines.current.finish(job, result)
    view.pictures.picture_slot.remove()  # the form moved on; the image's own picture stands
    view.banner.buttons["Apply fix and regenerate"].click()
    again = engines.current.last_job("generate").params.generation
    assert (again.images, again.strength) == ([photo], 0.5)


def test_the_image_viewer_offers_an_image_as_the_input_picture(window, engines, tmp_path):
    load_fake_model(window, engines)
    photo = _picture(tmp_path / "made.png")
    viewer = window.view_image(photo)
    button = viewer.buttons["Use as input picture"]
    assert button.isEnabled()
    assert viewer.buttons["Send to Generate"].isVisible()  # both, side by side
    button.click()
    assert window.current_page() == "Generate"
    assert window.generate_view.pictures.images() == [photo]
    assert not viewer.isVisible()


def test_the_health_check_probes_the_input_picture_and_says_so(window, engines, tmp_path):
    load_fake_model(window, engines)
    photo = _picture(tmp_path / "photo.png")
    mask = _picture(tmp_path / "mask.png", colour="white")
    window.generate_view.pictures.picture_slot.choose(photo)
    window.generate_view.pictures.mask_slot.choose(mask)
    window.show_page("Health check")
    view = window.health_view
    view.run_button.click()
    job = engines.current.last_job("check")
    assert (job.params.images, job.params.mask) == ((photo,), mask)
    components = reports.components()
    components["vae_encoder"] = replace(components["vae"], name="vae_encoder")
    engines.current.finish(job, reports.result(reports.report(components=components)))
    assert (
        "Checked with the input picture photo.png and the mask mask.png: the VAE encoder "
        "included." in view.verdict.text.text()
    )

    # Without a picture the check runs the text-to-image path, and says nothing of one.
    window.generate_view.pictures.picture_slot.remove()
    view.run_button.click()
    job = engines.current.last_job("check")
    assert (job.params.images, job.params.mask) == ((), None)
    engines.current.finish(job, reports.result(reports.report()))
    assert "input picture" not in view.verdict.text.text()


def _paint_all(pictures, qtbot) -> str:
    """Paint the whole picture again in the mask painter, and use that mask."""
    pictures.paint_button.click()
    dialog = pictures.painter
    qtbot.waitExposed(dialog)
    dialog.canvas.invert()
    dialog.use_button.click()
    qtbot.waitUntil(lambda: pictures.painter is None)
    return pictures.mask_slot.path


@pytest.mark.parametrize("made", ["painted", "chosen"])
def test_a_mask_made_for_one_picture_is_not_stretched_onto_another(
    view, engines, qtbot, tmp_path, made
):
    pictures = view.pictures
    assert pictures.picture_slot.choose(_picture(tmp_path / "photo.png", (300, 200)))
    if made == "painted":
        mask = _paint_all(pictures, qtbot)
    else:
        mask = _picture(tmp_path / "mask.png", (300, 200), colour="white")
        assert pictures.mask_slot.choose(mask)
    said = status_bar(view)
    # An edited copy of the same size keeps the mask: it covers what it was made over.
    assert pictures.picture_slot.choose(_picture(tmp_path / "edited.png", (300, 200), "tomato"))
    assert pictures.mask_slot.path == mask
    assert status_bar(view) == said

    # A picture of another size: the mask is removed, and one sentence says so.
    tall = _picture(tmp_path / "tall.png", (200, 400))
    assert pictures.picture_slot.choose(tall)
    assert pictures.mask_slot.path == ""
    sentence = status_bar(view)
    assert view.progress_label.text() == sentence
    assert "mask" in sentence and "300×200" in sentence and "200×400" in sentence
    assert sentence.endswith(".") and ". " not in sentence
    view.generate()
    job = engines.current.last_job("generate").params.generation
    assert (job.images, job.mask, job.mode_for()) == ([tall], None, Mode.IMAGE)


def test_a_mask_file_of_another_shape_than_the_picture_is_refused_with_one_sentence(view, tmp_path):
    pictures = view.pictures
    assert pictures.picture_slot.choose(_picture(tmp_path / "photo.png", (300, 200)))
    square = _picture(tmp_path / "square.png", (200, 200), colour="white")
    assert not pictures.mask_slot.choose(square)
    assert pictures.mask_slot.path == ""
    sentence = status_bar(view)
    assert sentence.startswith(f"{square}: ") and "200×200" in sentence and "300×200" in sentence
    assert ". " not in sentence
    # The picture's proportions at another size (as the painter saves a large picture's mask)
    # are scaled evenly, not stretched: taken.
    half = _picture(tmp_path / "half.png", (150, 100), colour="white")
    assert pictures.mask_slot.choose(half)
    assert pictures.mask_path() == half


def test_inpaintings_layout_reaches_the_job_and_the_check(window, engines, tmp_path):
    from app.core.images.canvas import Canvas

    load_fake_model(window, engines)
    window.show_page("Generate")
    view = window.generate_view
    pictures = view.pictures
    options = pictures.canvas_options
    assert options.isHidden()  # no picture: nothing to lay out
    photo = _picture(tmp_path / "photo.png", (300, 200))
    assert pictures.picture_slot.choose(photo)
    assert not options.isHidden() and options.body.isHidden()  # closed, saying what is set
    assert options.toggle.text() == "Inpainting: blur 4 px · whole picture"
    options.toggle.click()
    assert not options.body.isHidden()
    assert not options.padding.isEnabled()  # the padding is Only masked's
    options.blur.setValue(9)
    options.only_masked.setChecked(True)
    assert options.padding.isEnabled()
    options.padding.setValue(48)
    options.extend["right"].setValue(300)
    # Extended, the picture is inpainted without a mask, and the size follows the canvas:
    # 600 x 200, its short side at the smallest, 64 px.
    assert pictures.mode() is Mode.INPAINT and pictures.strength.isEnabled()
    assert (view.width_box.value(), view.height_box.value()) == (192, 64)
    view.generate()
    job = engines.current.last_job("generate").params.generation
    assert job.canvas == Canvas(9, True, 48, (0, 0, 300, 0))
    assert (job.mask, job.mode_for()) == (None, Mode.INPAINT)
    options.toggle.click()
    assert options.toggle.text() == (
        "Inpainting: blur 9 px · only masked (+48 px) · extended right 300"
    )
    # The health check probes the same layout.
    window.show_page("Health check")
    window.health_view.run_button.click()
    check = engines.current.last_job("check").params
    assert (check.images, check.mask, check.canvas) == ((photo,), None, job.canvas)


def test_a_model_without_inpainting_has_no_layout_to_set(window, engines, tmp_path):
    from app.core.images.canvas import Canvas

    load_fake_model(
        window,
        engines,
        replace(DEMO_SUMMARY, picture_modes={Mode.IMAGE: "", Mode.INPAINT: NO_INPAINT}),
    )
    view = window.generate_view
    pictures = view.pictures
    pictures.canvas_options.extend["left"].setValue(64)  # set before: not sent
    assert pictures.picture_slot.choose(_picture(tmp_path / "photo.png"))
    assert pictures.canvas_options.isHidden()
    assert pictures.canvas() == Canvas() and pictures.mode() is Mode.IMAGE
