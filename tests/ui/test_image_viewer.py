"""The image viewer: a gallery image opens large (double-click or Enter) with its parameters,
left and right walk the gallery, Escape closes; a dropped image (HalfSafe's or another tool's)
opens there too, with "Why is it black?" one click away; a file that cannot be read is one
sentence, never a crash."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QApplication

from app.ui import dialogs as dialogs_module
from app.ui.image_viewer import ImageViewer
from tests.support import reports
from tests.support.image_files import (
    a1111_parameters,
    comfy_prompt,
    comfy_workflow,
    png_text,
    png_with,
    text_chunk,
)
from tests.ui.conftest import load_fake_model
from tests.ui.test_explain_view import drop
from tests.ui.test_gallery import NAN_PARAMETERS, NoFileManager, _fill, _write

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def outputs(tmp_path):
    folder = tmp_path / "outputs"
    _write(folder, "00001-1.png", age_s=300)
    _write(folder, "00002-2.png", age_s=100)
    _write(folder, "00003-4242.png", age_s=10, parameters=NAN_PARAMETERS)
    return folder


@pytest.fixture
def gallery(window, engines, qtbot, outputs):
    window.show_page("Generate")
    _fill(window, qtbot, outputs, 3)
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
    lines = viewer.parameters.text().splitlines()
    assert lines[0].startswith("Made by ") and lines[1] == "NaN-black in the VAE at step 8."
    assert "a red circle on a blue background" in lines
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
    black = _write(tmp_path, "00009-1234.png", age_s=0)
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
    text = window.image_viewer.parameters.text()
    assert "NaN-black in the VAE at step 25." in text
    assert "The VAE overflowed fp16 while decoding." in text
    assert "Note: The UNet runs in fp16 as you asked" in text


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
    png = _write(tmp_path, "memory.png", age_s=0).read_bytes()
    from app.ui.image_entry import GalleryEntry

    viewer = ImageViewer(None, lambda values: None, lambda path: None)
    qtbot.addWidget(viewer)
    viewer.show_image(GalleryEntry(png=png, seed=3))
    assert viewer.image.pixmap.width() == 64
    assert viewer.windowTitle() == "An image not saved"
    assert not viewer.buttons["Why is it black?"].isEnabled()
    assert not viewer.buttons["Open folder"].isEnabled()
