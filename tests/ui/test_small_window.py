"""Every page at the smallest size the app is made for, 1024x700: nothing scrolls sideways,
and the buttons keep their size while a job runs."""

from __future__ import annotations

import pytest
from PySide6.QtGui import QColor, QImage
from PySide6.QtWidgets import QAbstractButton, QScrollArea, QWidget

from app.engine.events import EventState
from tests.support import reports
from tests.ui.conftest import load_fake_model

SMALL = (1024, 700)


def _settle(qtbot, window) -> None:
    window.resize(*SMALL)
    qtbot.wait(50)  # let the layouts take the size and the scroll bars their ranges


def _no_sideways_scrolling(page: QWidget) -> None:
    for scroll in page.findChildren(QScrollArea):
        if not scroll.isVisible():
            continue
        bar = scroll.horizontalScrollBar()
        assert bar.maximum() == 0, f"{scroll.objectName() or scroll} scrolls {bar.maximum()} px"


def _buttons_uncrushed(page: QWidget) -> None:
    for button in page.findChildren(QAbstractButton):
        if button.isVisible() and button.text():
            hint = button.minimumSizeHint().width()
            assert button.width() >= hint, f"{button.text()!r} is {button.width()} of {hint} px"


def _png(path) -> str:
    image = QImage(64, 64, QImage.Format.Format_RGB32)
    image.fill(QColor("steelblue"))
    assert image.save(str(path))
    return str(path)


@pytest.mark.parametrize("page", ["Models", "Devices", "Settings"])
def test_a_page_fits_1024_by_700(qtbot, window, engines, page):
    load_fake_model(window, engines)
    window.state.set_hardware(reports.gtx_1660_super())
    window.show_page(page)
    _settle(qtbot, window)
    _no_sideways_scrolling(window.pages.currentWidget())
    _buttons_uncrushed(window.pages.currentWidget())


def test_the_health_check_fits_while_it_runs_and_with_every_fix_tried(qtbot, window, engines):
    load_fake_model(window, engines)
    window.show_page("Health check")
    view = window.health_view
    view.run_button.click()
    job = engines.current.last_job("check")
    stage = "Trying a fix: keep 2 layers of the VAE in fp32 and the rest in fp16"
    engines.current.emit(job, EventState.PROGRESS, stage=stage, done=1, total=4)
    _settle(qtbot, window)
    _buttons_uncrushed(view)
    engines.current.finish(job, reports.result(reports.islands()))
    _settle(qtbot, window)
    _no_sideways_scrolling(view)
    _buttons_uncrushed(view)
    # "Apply instead" is inside the page, not past its right edge.
    (instead,) = view.alternative_buttons
    right = instead.mapTo(view, instead.rect().topRight()).x()
    assert right <= view.width()


def test_generate_fits_with_an_image_and_its_caption(qtbot, window, engines, tmp_path):
    load_fake_model(window, engines)
    window.show_page("Generate")
    view = window.generate_view
    view.generate()
    job = engines.current.last_job("generate")
    image = reports.image(
        _png(tmp_path / "a.png"), status="fixed", component="vae", settings={"precision": "fp16"}
    )
    notes = ["The text encoder and UNet run in fp16 as you asked; on a CPU fp16 is slow."] * 2
    engines.current.finish(
        job, reports.generation({"images": [image], "seconds": 2.0, "warnings": notes})
    )
    _settle(qtbot, window)
    _no_sideways_scrolling(view)
    _buttons_uncrushed(view)
    # With a banner above it, the image gives way to its caption: they never overlap, and the
    # caption shows its notes and more.
    assert view.banner.isVisible()
    image_box, caption_box = view.image.geometry(), view.caption.geometry()
    assert image_box.bottom() < caption_box.top()
    lines = caption_box.height() / view.parameters.fontMetrics().lineSpacing()
    assert lines >= 4, lines


def test_generate_fits_with_an_input_picture_and_its_mask(qtbot, window, engines, tmp_path):
    load_fake_model(window, engines)
    window.show_page("Generate")
    view = window.generate_view
    long_name = "a_photo_of_the_lighthouse_on_the_cliff_at_dusk_taken_from_the_beach_below.png"
    assert view.pictures.picture_slot.choose(_png(tmp_path / long_name))
    assert view.pictures.mask_slot.choose(_png(tmp_path / "mask.png"))
    _settle(qtbot, window)
    _no_sideways_scrolling(view)
    _buttons_uncrushed(view)
    # The parameters scroll; Generate stays in sight below them.
    bottom = view.generate_button.mapTo(view, view.generate_button.rect().bottomLeft()).y()
    assert view.generate_button.isVisible() and bottom <= view.height()


def test_the_fixes_page_shows_each_fix_whole_at_1024(qtbot, window):
    from tests.support.remembered_fixes import remember, save

    remember()
    save()
    window.show_page("Fixes")
    _settle(qtbot, window)
    table = window.fixes_view.table
    fix = [table.headerItem().text(c) for c in range(table.columnCount())].index("Fix")
    text = table.topLevelItem(0).text(fix)
    assert text == "Keep 1 VAE layer in fp32"
    assert table.columnWidth(fix) >= table.fontMetrics().horizontalAdvance(text)
    assert table.horizontalScrollBar().maximum() == 0
    row = table.topLevelItem(0)  # the device by its short name, whole; the full name in its tip
    assert row.text(1) == "RTX 3060" and row.toolTip(1).startswith("NVIDIA GeForce RTX 3060")
    assert table.columnWidth(1) >= table.fontMetrics().horizontalAdvance(row.text(1))
