"""The image viewer: a gallery image opens large (double-click or Enter) with its parameters,
left and right walk the gallery, Escape closes; a dropped image (HalfSafe's or another tool's)
opens there too, with "Why is it black?" one click away; a file that cannot be read is one
sentence, never a crash."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QColor, QGuiApplication, QImage, QWheelEvent
from PySide6.QtWidgets import QApplication

from app.ui import dialogs as dialogs_module
from app.ui.image_viewer import ZOOM_STEPS, ImageViewer
from app.ui.theme import contrast_ratio, dark_palette
from tests.support import reports
from tests.support.dropped_files import drop
from tests.support.gallery_outputs import NAN_PARAMETERS, NoFileManager, fill, write_png
from tests.support.image_files import (
    a1111_parameters,
    comfy_prompt,
    comfy_workflow,
    png_text,
    png_with,
    text_chunk,
)
from tests.ui.conftest import load_fake_model

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def outputs(tmp_path):
    folder = tmp_path / "outputs"
    write_png(folder, "00001-1.png", age_s=300)
    write_png(folder, "00002-2.png", age_s=100)
    write_png(folder, "00003-4242.png", age_s=10, parameters=NAN_PARAMETERS)
    return folder


@pytest.fixture
def gallery(window, engines, qtbot, outputs):
    window.show_page("Generate")
    fill(window, qtbot, outputs, 3)
    return window.generate_view.gallery


def _double_click(qtbot, gallery, row: int) -> None:
    centre = gallery.visualItemRect(gallery.item(row)).center()
    qtbot.mouseClick(gallery.viewport(), Qt.MouseButton.LeftButton, pos=centre)
    qtbot.mouseDClick(gallery.viewport(), Qt.MouseButton.LeftButton, pos=centre)


def test_a_double_clicked_gallery_image_opens_large_and_the_arrows_walk_the_gallery(
    window, qtbot, gallery, outputs
):
    _double_click(qtbot, gallery, 0)
    viewer = window.image_viewer
    assert viewer is not None and viewer.isVisible() and not viewer.isModal()
    assert viewer.windowTitle() == "00003-4242.png"
    assert viewer.image.pixmap.width() == 64  # the image itself, not its thumbnail
    assert viewer.verdict.text() == "NaN-black in the VAE at step 8."
    lines = viewer.parameters.text().splitlines()
    assert lines[0].startswith("Made by ") and lines[1] == "a red circle on a blue background"
    assert "Precision: fp16 everywhere" in lines

    qtbot.waitUntil(lambda: QApplication.activeWindow() is viewer, timeout=3000)
    qtbot.keyClick(viewer, Qt.Key.Key_Right)
    assert viewer.windowTitle() == "00002-2.png" and gallery.currentRow() == 1
    button = viewer.buttons["Copy parameters"]
    button.setFocus()  # the arrows walk the gallery wherever the focus is in the viewer
    qtbot.keyClick(button, Qt.Key.Key_Right)
    qtbot.keyClick(viewer, Qt.Key.Key_Right)  # past the last image: it stays
    assert viewer.windowTitle() == "00001-1.png"
    assert "The image records no generation parameters." in viewer.parameters.text()
    qtbot.keyClick(viewer, Qt.Key.Key_Left)
    assert viewer.windowTitle() == "00002-2.png"
    # The Generate page shows what the viewer shows.
    assert window.generate_view.current_entry.path == str(outputs / "00002-2.png")

    qtbot.keyClick(viewer, Qt.Key.Key_Escape)
    assert not viewer.isVisible()
    gallery.setFocus()
    gallery.setCurrentRow(0)
    qtbot.keyClick(gallery, Qt.Key.Key_Return)
    assert viewer.isVisible() and viewer.windowTitle() == "00003-4242.png"


def test_send_to_generate_fills_the_form(window, qtbot, gallery):
    window.generate_view.prompt.setPlainText("something else")
    _double_click(qtbot, gallery, 0)
    window.image_viewer.buttons["Send to Generate"].click()
    request = window.generate_view.request()
    assert request["prompt"] == "a red circle on a blue background"
    assert request["negative_prompt"] == "blurry"
    assert (request["steps"], request["cfg"], request["seed"]) == (12, 6.5, 4242)
    assert (request["width"], request["height"], request["scheduler"]) == (
        128,
        96,
        "dpmpp_2m_karras",
    )
    assert window.current_page() == "Generate"
    assert not window.image_viewer.isVisible()


def test_why_is_it_black_opens_the_explanation_of_the_image(window, engines, qtbot, gallery):
    _double_click(qtbot, gallery, 0)
    window.image_viewer.buttons["Why is it black?"].click()
    job = engines.current.last_job("explain")
    assert job.params.path == window.image_viewer.entry.path
    assert window.explain_dialogs and window.explain_dialogs[-1].isVisible()


def test_open_folder_and_copy_parameters(window, qtbot, gallery, outputs, monkeypatch):
    monkeypatch.setattr(dialogs_module, "QDesktopServices", NoFileManager)
    _double_click(qtbot, gallery, 0)
    viewer = window.image_viewer
    viewer.buttons["Copy parameters"].click()
    assert QGuiApplication.clipboard().text() == NAN_PARAMETERS
    viewer.buttons["Open folder"].click()
    assert NoFileManager.opened[-1] == str(outputs)
    window.dialogs.close_all()


def test_a_fresh_image_is_viewed_with_what_only_its_run_knows(window, engines, qtbot, tmp_path):
    load_fake_model(window, engines)
    view = window.generate_view
    view.generate()
    black = write_png(tmp_path, "00009-1234.png", age_s=0)
    result = reports.generation(
        {
            "images": [
                reports.image(
                    str(black),
                    status="nan",
                    component="vae",
                    step=25,
                    message="The VAE overflowed fp16 while decoding.",
                )
            ],
            "warnings": ["The UNet runs in fp16 as you asked; on a CPU fp16 is slow."],
        }
    )
    engines.current.finish(engines.current.last_job("generate"), result)
    view.gallery_view.view(view.gallery.item(0))
    viewer = window.image_viewer
    assert viewer.verdict.text() == "NaN-black in the VAE at step 25."
    assert viewer.diagnosis_text.text().splitlines() == [
        "The VAE overflowed fp16 while decoding.",
        "Note: The UNet runs in fp16 as you asked; on a CPU fp16 is slow.",
    ]
    assert "fp16 as you asked" not in viewer.parameters.text()  # said once, above


def _invoke_metadata() -> str:
    return json.dumps(
        {
            "app_version": "5.6.0",
            "model": {"name": "juggernaut", "hash": "blake3:1234"},
            "positive_prompt": "a lighthouse",
            "scheduler": "euler_a",
            "steps": 30,
            "cfg_scale": 6,
            "seed": 77,
            "width": 64,
            "height": 64,
        }
    )


@pytest.mark.parametrize(
    ("chunks", "made_by", "shown"),
    [
        (
            {"parameters": a1111_parameters("sdxl", "0123456789")},
            "AUTOMATIC1111 web UI v1.10.1",
            "Model hash: 0123456789, Model: sdxl",
        ),
        (
            {"parameters": a1111_parameters("flux", "0123456789", version="f2.0.1v1.10.1")},
            "Stable Diffusion WebUI Forge f2.0.1v1.10.1",
            "Negative prompt: blurry",
        ),
        ({"prompt": comfy_prompt("sd15.safetensors", "vae.pt")}, "ComfyUI", "VAE: vae.pt"),
        ({"workflow": comfy_workflow("sd15.safetensors")}, "ComfyUI", "Model: sd15.safetensors"),
        ({"invokeai_metadata": _invoke_metadata()}, "InvokeAI 5.6.0", "Model: juggernaut"),
    ],
    ids=["a1111", "forge", "comfyui-prompt", "comfyui-workflow", "invokeai"],
)
def test_a_dropped_image_of_another_tool_shows_its_record(
    window, engines, qtbot, tmp_path, chunks, made_by, shown
):
    image = png_text(tmp_path / "theirs.png", chunks)
    drop(window, image)
    qtbot.waitUntil(lambda: window.image_viewer is not None, timeout=3000)
    viewer = window.image_viewer
    lines = viewer.parameters.text().splitlines()
    assert lines[0] == f"Made by {made_by}"
    assert any(shown in line for line in lines), lines
    assert engines.started == []  # nothing was explained or loaded
    assert viewer.buttons["Why is it black?"].isEnabled()
    assert viewer.position.text() == ""  # not the gallery's: the arrows have nothing to walk
    qtbot.keyClick(viewer, Qt.Key.Key_Right)
    assert viewer.entry.path == str(image)
    viewer.buttons["Send to Generate"].click()
    assert window.generate_view.seed.text() == str(viewer.entry.seed)


def _truncated(path: Path) -> None:
    whole = png_text(path, {"parameters": a1111_parameters("sdxl", "0123456789")})
    whole.write_bytes(whole.read_bytes()[:300])


@pytest.mark.parametrize(
    ("write", "words"),
    [
        (_truncated, "truncated"),
        (
            lambda path: png_with(path, [text_chunk("parameters", "a" * (17 << 20), "zTXt")]),
            "inflates past 16 MB",
        ),
        (lambda path: path.write_text("a model renamed, or a note"), "not a PNG, JPEG or WebP"),
    ],
    ids=["truncated", "huge text chunk", "not an image"],
)
def test_an_unreadable_dropped_image_is_one_sentence_in_the_viewer(
    window, engines, qtbot, tmp_path, write, words
):
    image = tmp_path / "bad.png"
    write(image)
    drop(window, image)
    qtbot.waitUntil(lambda: window.image_viewer is not None, timeout=3000)
    viewer = window.image_viewer
    sentence = viewer.parameters.text()
    assert sentence.startswith(f"{image}: ") and words in sentence and "\n" not in sentence
    assert viewer.image.pixmap.isNull() or words == "inflates past 16 MB"
    assert viewer.image.placeholder in (sentence, "")
    assert not viewer.buttons["Why is it black?"].isEnabled()
    assert window.dialogs.shown == [] and engines.started == []
    assert window.isVisible()


# The offscreen platform has no window stacking (nor size hints: conftest's own).
@pytest.mark.qt_log_ignore("propagateSizeHints", "does not support raise")
def test_a_second_drop_shows_in_the_same_viewer(window, qtbot, tmp_path):
    first = png_text(tmp_path / "first.png", {"parameters": a1111_parameters("sd", "0123456789")})
    second = png_text(tmp_path / "second.png", {"prompt": comfy_prompt("sd15.safetensors")})
    drop(window, first)
    qtbot.waitUntil(lambda: window.image_viewer is not None, timeout=3000)
    viewer = window.image_viewer
    drop(window, second)
    qtbot.waitUntil(lambda: viewer.entry.path == str(second), timeout=3000)
    assert window.image_viewer is viewer and viewer.isVisible()


def test_the_viewer_reads_every_tools_image_without_torch(tmp_path):
    image = png_text(tmp_path / "theirs.png", {"prompt": comfy_prompt("sd15.safetensors")})
    code = (
        "import sys, json\n"
        "from app.ui.application import application\n"
        "from app.ui.image_viewer import ImageViewer\n"
        "app = application()\n"
        "viewer = ImageViewer(None, lambda values: None, lambda path: None)\n"
        f"viewer.show_image({str(image)!r}); app.processEvents()\n"
        "print(json.dumps({'torch': 'torch' in sys.modules, 'made_by': viewer.entry.made_by}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env={**__import__("os").environ, "QT_QPA_PLATFORM": "offscreen"},
    ).stdout
    assert json.loads(out.strip().splitlines()[-1]) == {"torch": False, "made_by": "comfyui"}


def test_a_viewer_alone_shows_an_image_in_memory(qtbot, tmp_path):
    png = write_png(tmp_path, "memory.png", age_s=0).read_bytes()
    from app.ui.image_entry import GalleryEntry

    viewer = ImageViewer(None, lambda values: None, lambda path: None)
    qtbot.addWidget(viewer)
    viewer.show_image(GalleryEntry(png=png, seed=3))
    assert viewer.image.pixmap.width() == 64
    assert viewer.windowTitle() == "An image not saved"
    assert not viewer.buttons["Why is it black?"].isEnabled()
    assert not viewer.buttons["Open folder"].isEnabled()


# The picture's frame, the gallery's buttons, the zoom, the labelled parameters ---------------


def _viewer(qtbot) -> ImageViewer:
    """A viewer in the application as HalfSafe sets it up (its theme following the palette),
    whichever test ran before."""
    from app.ui.application import application

    application()
    viewer = ImageViewer(None, lambda values: None, lambda path: None)
    qtbot.addWidget(viewer)
    viewer.resize(1100, 760)
    return viewer


def _active(qtbot, viewer: ImageViewer) -> None:
    """The keys are the window's shortcuts: they work in the window that has the focus."""
    viewer.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is viewer, timeout=3000)


def _black_png(path: Path) -> Path:
    Image.new("RGB", (64, 48), (0, 0, 0)).save(path)
    return path


def _pixel(image, x: int, y: int) -> QColor:
    return QColor(image.pixel(x, y))


@pytest.mark.parametrize("scheme", ["light", "dark", "light, then dark"])
def test_a_black_image_sits_in_a_frame_that_shows_against_the_window(qtbot, tmp_path, scheme):
    light = QApplication.palette()
    if scheme == "dark":
        QApplication.setPalette(dark_palette())  # as a dark desktop hands it over
    try:
        viewer = _viewer(qtbot)
        viewer.show_image(str(_black_png(tmp_path / "black.png")))
        qtbot.waitExposed(viewer)
        if scheme == "light, then dark":
            viewer.image.grab()  # painted once in the light scheme
            QApplication.setPalette(dark_palette())  # the desktop turns dark while it shows
        _assert_framed(viewer, "dark" if "dark" in scheme else "light")
    finally:
        QApplication.setPalette(light)


def _assert_framed(viewer: ImageViewer, scheme: str) -> None:
    shot = viewer.image.grab().toImage().convertToFormat(QImage.Format.Format_RGB32)
    pixels = np.frombuffer(shot.constBits(), np.uint32).reshape(shot.height(), -1)
    rows, columns = np.nonzero((pixels[:, : shot.width()] & 0xFFFFFF) == 0)  # the black image
    left, right, top, bottom = columns.min(), columns.max(), rows.min(), rows.max()
    middle_x, middle_y = (left + right) // 2, (top + bottom) // 2
    # The picture keeps the window's colour around it on all four sides, for the frame.
    assert left >= 4 and top >= 4
    assert right <= shot.width() - 5 and bottom <= shot.height() - 5
    window_colour = viewer.image.palette().window().color()
    for outside, frame in (
        ((left - 4, middle_y), (left - 1, middle_y)),
        ((right + 4, middle_y), (right + 1, middle_y)),
        ((middle_x, top - 4), (middle_x, top - 1)),
        ((middle_x, bottom + 4), (middle_x, bottom + 1)),
    ):
        background = _pixel(shot, *outside)
        assert background.rgb() == window_colour.rgb()
        assert contrast_ratio(_pixel(shot, *frame), background) >= 3.0, scheme
    if scheme == "dark":
        assert contrast_ratio(window_colour, "#000000") < 1.5  # why the frame is needed


def _gallery_of(paths: list[Path], start: int):
    """A gallery's step and place over `paths`, `start` current."""
    from app.ui.image_entry import read_image_file

    current = [start]

    def step(delta: int):
        row = current[0] + delta
        if not 0 <= row < len(paths):
            return None
        current[0] = row
        return read_image_file(str(paths[row]))

    return read_image_file(str(paths[start])), step, lambda: (current[0] + 1, len(paths))


@pytest.mark.qt_log_ignore("propagateSizeHints", "does not support raise")
def test_previous_and_next_walk_the_gallery_and_say_where_the_image_is(qtbot, tmp_path):
    paths = [write_png(tmp_path, f"0000{i}-{i}.png", age_s=i) for i in range(1, 4)]
    viewer = _viewer(qtbot)
    entry, step, place = _gallery_of(paths, 1)
    viewer.show_image(entry, step, place)
    previous, following = viewer.buttons["Previous"], viewer.buttons["Next"]
    assert previous.isVisible() and following.isVisible()
    assert viewer.position.text() == "2 of 3"
    assert previous.isEnabled() and following.isEnabled()

    following.click()
    assert viewer.windowTitle() == "00003-3.png" and viewer.position.text() == "3 of 3"
    assert not following.isEnabled() and previous.isEnabled()
    viewer.walk(1)  # → past the end: it stays
    assert viewer.windowTitle() == "00003-3.png" and viewer.position.text() == "3 of 3"
    previous.click()
    previous.click()
    assert viewer.windowTitle() == "00001-1.png" and viewer.position.text() == "1 of 3"
    assert not previous.isEnabled() and following.isEnabled()

    # A file on its own (dropped, opened) has no gallery to walk: no buttons, no place.
    viewer.show_image(str(paths[0]))
    assert not previous.isVisible() and not following.isVisible()
    assert viewer.position.text() == ""


def test_the_buttons_walk_the_window_gallery_and_stop_at_its_end(window, qtbot, gallery):
    _double_click(qtbot, gallery, 0)
    viewer = window.image_viewer
    following = viewer.buttons["Next"]
    assert following.isVisible() and viewer.buttons["Previous"].isVisible()
    for _ in range(5):
        if not following.isEnabled():
            break
        following.click()
    assert not following.isEnabled()  # at the end, whether told the place or found it
    assert viewer.windowTitle() == "00001-1.png" and gallery.currentRow() == 2
    viewer.buttons["Previous"].click()
    assert viewer.windowTitle() == "00002-2.png" and following.isEnabled()


def _coordinates_png(path: Path, width: int = 1500, height: int = 1000) -> Path:
    """Each pixel's red is its x and its green its y (modulo 256): a screen that shows actual
    pixels shows neighbours one apart."""
    xs = np.arange(width) % 256
    ys = np.arange(height) % 256
    pixels = np.zeros((height, width, 3), dtype=np.uint8)
    pixels[..., 0] = xs[None, :]
    pixels[..., 1] = ys[:, None]
    pixels[..., 2] = 128
    Image.fromarray(pixels).save(path)
    return path


def _wheel(view, at: QPoint, notches: int, modifiers=Qt.KeyboardModifier.ControlModifier):
    event = QWheelEvent(
        QPointF(at),
        QPointF(view.viewport().mapToGlobal(at)),
        QPoint(0, 0),
        QPoint(0, 120 * notches),
        Qt.MouseButton.NoButton,
        modifiers,
        Qt.ScrollPhase.NoScrollPhase,
        False,
    )
    QApplication.sendEvent(view.viewport(), event)


def _under(view, at: QPoint) -> tuple[int, int]:
    colour = _pixel(view.viewport().grab().toImage(), at.x(), at.y())
    return colour.red(), colour.green()


def test_the_image_fits_then_zooms_to_actual_pixels_and_pans(qtbot, tmp_path):
    viewer = _viewer(qtbot)
    viewer.show_image(str(_coordinates_png(tmp_path / "big.png")))
    qtbot.waitExposed(viewer)
    _active(qtbot, viewer)
    view = viewer.image
    fitted = re.fullmatch(r"Fit · (\d+) %", viewer.zoom.text())
    assert fitted and 20 < int(fitted.group(1)) < 100, viewer.zoom.text()
    assert viewer.buttons["Fit"].isChecked() and not viewer.buttons["1:1"].isChecked()
    assert view.horizontalScrollBar().maximum() == 0  # all of it in view

    viewer.buttons["1:1"].click()
    assert viewer.zoom.text() == "100 %" and viewer.buttons["1:1"].isChecked()
    assert not viewer.buttons["Fit"].isChecked()
    centre = view.viewport().rect().center()
    red, green = _under(view, centre)
    assert _under(view, centre + QPoint(1, 0)) == ((red + 1) % 256, green)
    assert _under(view, centre + QPoint(0, 1)) == (red, (green + 1) % 256)
    horizontal, vertical = view.horizontalScrollBar(), view.verticalScrollBar()
    assert horizontal.maximum() > 0 and vertical.maximum() > 0  # larger than the view
    before = (horizontal.value(), vertical.value())
    qtbot.mousePress(view.viewport(), Qt.MouseButton.LeftButton, pos=centre)
    qtbot.mouseMove(view.viewport(), centre - QPoint(60, 40))
    qtbot.mouseRelease(view.viewport(), Qt.MouseButton.LeftButton, pos=centre - QPoint(60, 40))
    assert (horizontal.value(), vertical.value()) == (before[0] + 60, before[1] + 40)

    # Ctrl+wheel zooms a step about the pointer: the pixel under it stays under it.
    pointer = centre + QPoint(-150, 90)
    under = _under(view, pointer)
    _wheel(view, pointer, 1)
    assert viewer.zoom.text() == "150 %"
    after = _under(view, pointer)
    assert abs(after[0] - under[0]) <= 1 and abs(after[1] - under[1]) <= 1
    scrolled = vertical.value()
    _wheel(view, pointer, -1, Qt.KeyboardModifier.NoModifier)  # the plain wheel scrolls
    assert viewer.zoom.text() == "150 %" and vertical.value() > scrolled
    _wheel(view, pointer, -2)
    assert viewer.zoom.text() == "67 %"

    qtbot.keyClick(viewer, Qt.Key.Key_Plus)
    assert viewer.zoom.text() == "100 %"
    qtbot.keyClick(viewer, Qt.Key.Key_Plus)
    assert viewer.zoom.text() == "150 %"
    qtbot.keyClick(viewer, Qt.Key.Key_Minus)
    assert viewer.zoom.text() == "100 %"
    qtbot.keyClick(viewer, Qt.Key.Key_0)
    assert viewer.zoom.text() == fitted.group(0) and viewer.buttons["Fit"].isChecked()
    assert horizontal.maximum() == 0
    viewer.buttons["Zoom in"].click()  # the next step up from Fit's scale
    larger = next(step for step in ZOOM_STEPS if step * 100 > int(fitted.group(1)) + 0.5)
    assert viewer.zoom.text() == f"{larger * 100:.0f} %"
    viewer.buttons["Fit"].click()
    assert viewer.zoom.text() == fitted.group(0)
    viewer.buttons["Fit"].click()  # Fit again stays Fit, checked
    assert viewer.buttons["Fit"].isChecked()


@pytest.mark.qt_log_ignore("propagateSizeHints", "does not support raise")
def test_walking_keeps_the_zoom_and_a_new_image_opens_fitted(qtbot, tmp_path):
    paths = [_coordinates_png(tmp_path / f"{name}.png") for name in ("a", "b")]
    viewer = _viewer(qtbot)
    entry, step, place = _gallery_of(paths, 0)
    viewer.show_image(entry, step, place)
    _active(qtbot, viewer)
    qtbot.keyClick(viewer, Qt.Key.Key_1)
    assert viewer.zoom.text() == "100 %"
    qtbot.keyClick(viewer, Qt.Key.Key_Right)
    assert viewer.windowTitle() == "b.png" and viewer.zoom.text() == "100 %"
    viewer.show_image(str(paths[0]))
    assert viewer.zoom.text().startswith("Fit · ")


def test_the_parameters_have_a_heading_under_the_diagnosis(window, qtbot, gallery):
    window.resize(1024, 700)
    _double_click(qtbot, gallery, 0)
    viewer = window.image_viewer
    viewer.resize(944, 620)  # the smallest screen's viewer (tools/screenshots.py)
    qtbot.waitExposed(viewer)
    heading = viewer.parameters_heading
    assert heading.text() == "Parameters" and heading.isVisible()
    assert viewer.diagnosis.isVisible() and viewer.verdict.isVisible()

    def top(widget) -> int:
        return widget.mapTo(viewer, QPoint(0, 0)).y()

    assert top(viewer.verdict) < top(heading) < top(viewer.parameters)
    # The verdict and the parameters each say their part once.
    assert "NaN-black" not in viewer.parameters.text()
    verdict = viewer.verdict
    assert verdict.wordWrap() and verdict.height() >= verdict.heightForWidth(verdict.width())
    assert verdict.font().bold()
    assert viewer.diagnosis.property("level") == "bad"  # the theme's red box

    # A fine image has no diagnosis box; its parameters keep their heading.
    viewer.buttons["Next"].click()
    assert viewer.windowTitle() == "00002-2.png"
    assert not viewer.diagnosis.isVisible() and heading.isVisible()


def test_the_window_gallery_tells_the_viewer_where_it_is(window, tmp_path):
    """Opened from the real gallery, the viewer shows "n of N" from the gallery's place."""
    from PySide6.QtGui import QIcon

    from app.ui.image_entry import GalleryEntry
    from tests.support.image_files import png_text

    gallery = window.generate_view.gallery_view
    for index in range(3):
        path = png_text(tmp_path / f"0000{index}-1.png", {"parameters": f"image {index}"})
        gallery.add(GalleryEntry(path=str(path), prompt=f"image {index}"), QIcon())
    count = gallery.widget.count()
    gallery.widget.setCurrentRow(1)
    gallery.view(gallery.widget.item(1))
    assert gallery.place() == (2, count)
    assert window.image_viewer is not None
    assert f"2 of {count}" in window.image_viewer.position.text()


def test_an_rgba_result_is_shown_with_its_alpha(qtbot, tmp_path):
    """Qwen-Image 2.1 saves RGBA: the viewer shows it with its transparency, from the file or
    from memory (an image no folder took)."""
    from app.core.images.finished import png_bytes
    from app.ui.image_entry import GalleryEntry
    from app.ui.image_viewer import load_pixmap

    rgba = np.zeros((32, 48, 4), np.uint8)
    rgba[..., 0] = 200
    rgba[:, 24:, 3] = 255
    image = Image.fromarray(rgba, "RGBA")
    path = tmp_path / "00001-1.png"
    path.write_bytes(png_bytes(image, "a cat\nSteps: 2, Seed: 1, Size: 48x32"))
    for entry in (GalleryEntry(path=str(path)), GalleryEntry(png=png_bytes(image))):
        pixmap, problem = load_pixmap(entry)
        assert problem == "" and pixmap.hasAlphaChannel()
        shown = pixmap.toImage()
        assert shown.pixelColor(2, 2).alpha() == 0
        assert (shown.pixelColor(40, 2).red(), shown.pixelColor(40, 2).alpha()) == (200, 255)


def test_a_hires_images_size_clip_skip_and_hires_fix_are_shown(qtbot, tmp_path):
    """A 256x256 file made with a 2x hires fix from 128x128 at Clip skip 2: the panel said
    "Size: 128x128" (AUTOMATIC1111 records the first pass's size) and left out the hires fix
    and Clip skip."""
    text = a1111_parameters(
        "sd15",
        "abcdef1234",
        **{
            "Size": "128x128",
            "Clip skip": 2,
            "Denoising strength": 0.55,
            "Hires upscale": 2,
            "Hires steps": 10,
            "Hires upscaler": "Latent",
        },
    )
    path = png_text(
        tmp_path / "hires.png", {"parameters": text}, Image.new("RGB", (256, 256), "navy")
    )
    viewer = _viewer(qtbot)
    viewer.show_image(str(path))
    shown = viewer.parameters.text()
    assert "Size: 256x256" in shown and "Size: 128x128" not in shown
    assert "Clip skip: 2" in shown
    assert (
        "Hires upscale: 2 (from 128x128), Hires steps: 10, Hires upscaler: Latent, "
        "Denoising strength: 0.55"
    ) in shown
    assert viewer.image.pixmap.width() == 256
    # Send to Generate still takes the first pass's size with the fix.
    values = viewer.entry.generate_values()
    assert (values["width"], values["height"]) == (128, 128) and values["clip_skip"] == 2
