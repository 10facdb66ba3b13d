"""Painting an inpainting mask on the Generate page: strokes of the left button paint what is
drawn again (or erase, with Erase on), the right button does the opposite, Clear and Invert work
on the whole mask, and Undo and Redo step by whole strokes, at most 30 back; the brush is as wide
as its box says in the picture's own pixels, at any zoom, and its outline shows where a soft dab
fades and ends; a brush below 100 % hardness paints and erases a soft edge in greys, never
building up past white nor darkening it; the dialog opens as large as the screen allows, at the
picture's proportions; the mask is saved as an 8-bit greyscale PNG, as painted, in HalfSafe's
data folder at the picture's proportions (at most 1024 px long), taken as the job's mask and read
by the engine's own reader as painted."""

from __future__ import annotations

import io
import math
import os

import numpy as np
import pytest
from PIL import Image
from PySide6.QtCore import QEvent, QPoint, QPointF, QRect, Qt
from PySide6.QtGui import QColor, QImage, QKeySequence, QMouseEvent, QScreen
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication, QDialogButtonBox, QProxyStyle, QPushButton, QStyle

from app.core import paths
from app.core.images.pictures import Mode, read_pictures
from app.ui.mask_painter import MAX_SIDE, MIN_SIDE, MaskHistory, MaskPainter
from tests.ui.conftest import load_fake_model


def _picture(path, size=(400, 300), colour="steelblue") -> str:
    image = QImage(size[0], size[1], QImage.Format.Format_RGB32)
    image.fill(QColor(colour))
    assert image.save(str(path))
    return str(path)


def _stroke(canvas, start: QPoint, end: QPoint, button=Qt.MouseButton.LeftButton) -> None:
    QTest.mousePress(canvas, button, Qt.KeyboardModifier.NoModifier, start)
    steps = 8
    for index in range(1, steps + 1):
        point = start + (end - start) * index / steps
        QTest.mouseMove(canvas, point)
    QTest.mouseRelease(canvas, button, Qt.KeyboardModifier.NoModifier, end)


def _widget_point(canvas, x: float, y: float) -> QPoint:
    """The widget point over the picture's point at (x, y), each a share of its side."""
    target = canvas.target()
    return QPoint(int(target.left() + x * target.width()), int(target.top() + y * target.height()))


def _open(qtbot, picture: QImage) -> MaskPainter:
    dialog = MaskPainter(picture, None, "photo.png")
    qtbot.addWidget(dialog)
    dialog.show()
    qtbot.waitExposed(dialog)
    dialog.activateWindow()  # its shortcuts answer only in the active window
    qtbot.waitActive(dialog)
    return dialog


@pytest.fixture
def painter(qtbot, tmp_path):
    """The painter over a 400x300 picture: its mask is 512x384, 1.28 mask pixels each."""
    return _open(qtbot, QImage(_picture(tmp_path / "photo.png")))


@pytest.fixture
def painter_1to1(qtbot, tmp_path):
    """The painter over a 512x384 picture: its mask is the picture's size, so that the brush's
    width is the same in the picture's pixels and the mask's."""
    return _open(qtbot, QImage(_picture(tmp_path / "photo.png", (512, 384))))


def _saved(dialog, tmp_path) -> np.ndarray:
    path = dialog.save(tmp_path / "masks")
    return np.asarray(Image.open(path))


def at(values: np.ndarray, x: float, y: float) -> int:
    """The mask's value at (x, y), each a share of its side."""
    rows, columns = values.shape
    return int(values[int(y * rows), int(x * columns)])


def test_a_stroke_paints_what_is_drawn_again_and_only_that(painter, tmp_path):
    canvas = painter.canvas
    assert canvas.is_empty() and not painter.use_button.isEnabled()
    assert painter.share.text() == "Nothing painted yet"

    _stroke(canvas, _widget_point(canvas, 0.25, 0.5), _widget_point(canvas, 0.75, 0.5))

    assert painter.use_button.isEnabled()
    assert painter.share.text().endswith("painted again")
    values = _saved(painter, tmp_path)
    assert values.shape == (384, 512)  # the picture's proportions, at least 512 px long
    assert set(np.unique(values).tolist()) == {0, 255}  # hard, as the engine reads it
    assert at(values, 0.5, 0.5) == 255  # on the stroke
    assert at(values, 0.28, 0.5) == 255 and at(values, 0.72, 0.5) == 255
    assert at(values, 0.5, 0.05) == 0 and at(values, 0.5, 0.95) == 0 and at(values, 0.02, 0.5) == 0


def test_the_right_button_erases_and_clear_and_invert_work_on_the_whole_mask(painter, tmp_path):
    canvas = painter.canvas
    _stroke(canvas, _widget_point(canvas, 0.2, 0.5), _widget_point(canvas, 0.8, 0.5))
    _stroke(
        canvas,
        _widget_point(canvas, 0.5, 0.2),
        _widget_point(canvas, 0.5, 0.8),
        Qt.MouseButton.RightButton,
    )
    values = _saved(painter, tmp_path)
    assert at(values, 0.5, 0.5) == 0 and at(values, 0.25, 0.5) == 255

    painter.invert_button.click()
    inverted = _saved(painter, tmp_path)
    assert at(inverted, 0.5, 0.5) == 255 and at(inverted, 0.25, 0.5) == 0
    assert at(inverted, 0.02, 0.02) == 255

    painter.clear_button.click()
    assert canvas.is_empty() and not painter.use_button.isEnabled()


def _wheel(canvas, point: QPoint, clicks: int) -> None:
    """Turn the mouse wheel `clicks` notches over `point` (up zooms in)."""
    from PySide6.QtGui import QWheelEvent

    event = QWheelEvent(
        QPointF(point),
        QPointF(canvas.mapToGlobal(point)),
        QPoint(0, 0),
        QPoint(0, 120 * clicks),
        Qt.MouseButton.NoButton,
        Qt.KeyboardModifier.NoModifier,
        Qt.ScrollPhase.NoScrollPhase,
        False,
    )
    canvas.wheelEvent(event)


def test_the_wheel_zooms_about_the_pointer_and_strokes_land_where_they_are_drawn(painter, tmp_path):
    canvas = painter.canvas
    point = _widget_point(canvas, 0.25, 0.25)
    before = canvas.to_mask(QPointF(point))
    _wheel(canvas, point, 4)
    assert canvas.zoom == pytest.approx(1.25**4)
    after = canvas.to_mask(QPointF(point))  # the same spot of the picture stays under the pointer
    assert (after.x(), after.y()) == pytest.approx((before.x(), before.y()), abs=0.5)
    assert canvas.target().width() > canvas.width()  # larger than the window: zoomed in
    # A short stroke zoomed in paints a small patch there, and nothing far from it.
    _stroke(canvas, point, point + QPoint(4, 0))
    values = _saved(painter, tmp_path)
    assert at(values, 0.25, 0.25) == 255
    assert at(values, 0.5, 0.5) == 0 and at(values, 0.32, 0.25) == 0
    # The wheel never zooms out past the whole picture, which it shows centred again.
    _wheel(canvas, point, -40)
    assert canvas.zoom == 1.0 and canvas.offset.x() == 0.0 and canvas.offset.y() == 0.0


def test_the_middle_button_moves_the_picture_and_fit_shows_it_whole(painter, tmp_path):
    canvas = painter.canvas
    centre = QPoint(canvas.width() // 2, canvas.height() // 2)
    _wheel(canvas, centre, 3)
    left = canvas.target().left()
    _stroke(canvas, centre, centre + QPoint(60, 0), Qt.MouseButton.MiddleButton)
    assert canvas.target().left() == pytest.approx(left + 60, abs=1)
    assert canvas.is_empty()  # moving paints nothing
    # With Space held, the left button moves it too.
    QTest.keyPress(canvas, Qt.Key.Key_Space)
    _stroke(canvas, centre, centre + QPoint(0, 30))
    QTest.keyRelease(canvas, Qt.Key.Key_Space)
    assert canvas.is_empty()
    painter.fit_button.click()
    assert canvas.zoom == 1.0 and canvas.target().width() <= canvas.width()


def test_each_save_is_a_new_file_in_the_data_folder(painter, tmp_path, monkeypatch):
    monkeypatch.setenv("HALFSAFE_DATA_DIR", str(tmp_path / "data"))
    canvas = painter.canvas
    _stroke(canvas, _widget_point(canvas, 0.4, 0.4), _widget_point(canvas, 0.6, 0.6))
    first, second = painter.save(), painter.save()
    assert first != second
    assert first.parent == second.parent == paths.data_dir() / "masks"
    assert first.name.startswith("photo-mask-") and first.suffix == ".png"


@pytest.mark.parametrize(
    ("size", "painted"), [((3000, 2000), (MAX_SIDE, 683)), ((64, 128), (MIN_SIDE // 2, MIN_SIDE))]
)
def test_the_mask_is_painted_in_the_pictures_proportions_within_bounds(
    qtbot, tmp_path, size, painted
):
    picture = QImage(_picture(tmp_path / "picture.png", size))
    dialog = MaskPainter(picture, None, "picture.png")
    qtbot.addWidget(dialog)
    mask = dialog.canvas.mask_image
    assert (mask.width(), mask.height()) == painted
    assert dialog.brush.value() == round(max(size) / 12)  # a twelfth, in the picture's pixels


def test_the_painter_starts_from_the_mask_the_job_has(qtbot, tmp_path):
    values = np.zeros((150, 200), np.uint8)
    values[:, :100] = 255  # the left half, at half the picture's size
    Image.fromarray(values).save(tmp_path / "half.png")
    dialog = MaskPainter(
        QImage(_picture(tmp_path / "photo.png")), QImage(str(tmp_path / "half.png")), "photo.png"
    )
    qtbot.addWidget(dialog)
    saved = _saved(dialog, tmp_path)
    assert at(saved, 0.1, 0.5) == 255 and at(saved, 0.9, 0.5) == 0
    assert dialog.use_button.isEnabled()


def test_the_generate_page_paints_a_mask_and_the_job_inpaints_with_it(
    window, engines, tmp_path, qtbot
):
    load_fake_model(window, engines)
    window.show_page("Generate")
    view = window.generate_view
    view.prompt.setPlainText("a red door")
    pictures = view.pictures
    photo = _picture(tmp_path / "photo.png")
    assert not pictures.paint_button.isEnabled()  # no picture, no mask to paint
    assert pictures.picture_slot.choose(photo)
    assert pictures.paint_button.isEnabled()

    pictures.paint_button.click()
    dialog = pictures.painter
    assert dialog is not None
    qtbot.waitExposed(dialog)
    canvas = dialog.canvas
    _stroke(canvas, _widget_point(canvas, 0.3, 0.3), _widget_point(canvas, 0.7, 0.7))
    dialog.use_button.click()
    qtbot.waitUntil(lambda: pictures.painter is None)

    mask = pictures.mask_slot.path
    assert mask and mask.startswith(str(paths.data_dir() / "masks"))
    view.generate()
    job = engines.current.last_job("generate").params.generation
    assert (job.images, job.mask, job.mode_for()) == ([photo], mask, Mode.INPAINT)
    # The engine's own reader takes it: the stroke is painted again, the corners are kept.
    read = read_pictures([photo], mask, 64, 48)
    assert read is not None and read.mask is not None
    hard = read.mask[0, 0].numpy()
    assert hard[24, 32] == 1.0 and hard[2, 2] == 0.0 and hard[45, 61] == 0.0


def test_cancel_keeps_the_mask_the_job_had(window, engines, tmp_path, qtbot):
    load_fake_model(window, engines)
    window.show_page("Generate")
    pictures = window.generate_view.pictures
    assert pictures.picture_slot.choose(_picture(tmp_path / "photo.png"))
    mask = _picture(tmp_path / "mask.png", colour="white")
    assert pictures.mask_slot.choose(mask)
    pictures.paint_button.click()
    dialog = pictures.painter
    qtbot.waitExposed(dialog)
    assert not dialog.canvas.is_empty()  # it starts from the job's mask
    dialog.canvas.clear()
    dialog.reject()
    qtbot.waitUntil(lambda: pictures.painter is None)
    assert pictures.mask_slot.path == mask


def test_a_photo_turned_by_its_exif_is_painted_on_upright(window, engines, tmp_path, qtbot):
    # A phone's portrait photo: stored 400x300, shown (and read by the engine) 300x400.
    exif = Image.Exif()
    exif[0x0112] = 6  # turned a quarter
    photo = tmp_path / "phone.jpg"
    Image.new("RGB", (400, 300), "steelblue").save(photo, exif=exif.tobytes())
    load_fake_model(window, engines)
    window.show_page("Generate")
    pictures = window.generate_view.pictures
    assert pictures.picture_slot.choose(str(photo))
    pictures.paint_button.click()
    dialog = pictures.painter
    qtbot.waitExposed(dialog)
    assert (dialog.canvas.picture.width(), dialog.canvas.picture.height()) == (384, 512)
    dialog.canvas.invert()
    dialog.use_button.click()
    qtbot.waitUntil(lambda: pictures.painter is None)
    with Image.open(pictures.mask_slot.path) as mask:
        assert mask.size == (384, 512)


def test_a_mask_painted_for_a_picture_since_replaced_is_not_used(window, engines, tmp_path, qtbot):
    load_fake_model(window, engines)
    window.show_page("Generate")
    view = window.generate_view
    pictures = view.pictures
    assert pictures.picture_slot.choose(_picture(tmp_path / "photo.png"))
    pictures.paint_button.click()
    dialog = pictures.painter
    qtbot.waitExposed(dialog)
    dialog.canvas.invert()
    # Another window sends a picture of the same shape while the painter is open.
    assert view.set_input_picture(_picture(tmp_path / "other.png", (800, 600)))
    dialog.use_button.click()
    qtbot.waitUntil(lambda: pictures.painter is None)
    assert pictures.mask_slot.path == ""
    assert "photo.png" in view.progress_label.text() and "mask" in view.progress_label.text()


def _mask_point(canvas, point: QPoint) -> tuple[int, int]:
    """The mask's (column, row) under the widget point `point`."""
    spot = canvas.to_mask(QPointF(point))
    return round(spot.x()), round(spot.y())


def _click(canvas, point: QPoint, button=Qt.MouseButton.LeftButton) -> None:
    QTest.mouseClick(canvas, button, Qt.KeyboardModifier.NoModifier, point)


def test_the_hardness_box_sets_the_brush_and_at_100_percent_strokes_stay_hard(painter, tmp_path):
    canvas = painter.canvas
    assert painter.hardness.value() == 100 and painter.hardness.suffix() == " %"
    assert canvas.hardness == 1.0
    painter.hardness.setValue(20)
    assert canvas.hardness == pytest.approx(0.2)
    painter.hardness.setValue(100)
    assert canvas.hardness == 1.0

    _stroke(canvas, _widget_point(canvas, 0.25, 0.5), _widget_point(canvas, 0.75, 0.5))
    values = _saved(painter, tmp_path)
    assert set(np.unique(values).tolist()) == {0, 255}  # a hard edge: no greys


def test_a_soft_stroke_fades_from_white_at_its_middle_to_black_at_its_edge(painter_1to1, tmp_path):
    painter = painter_1to1  # widths in the picture's pixels are the mask's here
    canvas = painter.canvas
    painter.brush.setValue(40)  # a radius of 20 mask pixels
    painter.hardness.setValue(20)  # full within 4 of them
    start = _widget_point(canvas, 0.25, 0.5)
    _stroke(canvas, start, _widget_point(canvas, 0.75, 0.5))
    values = _saved(painter, tmp_path)
    column, row = _mask_point(canvas, _widget_point(canvas, 0.5, 0.5))
    across = values[row - 30 : row + 31, column].astype(int)  # across the stroke, 30 px each way
    centre = 30
    assert across[centre - 2 : centre + 3].tolist() == [255] * 5
    for distance in (8, 12, 16):  # within the fading ring, on both sides
        assert 0 < across[centre - distance] < 255 and 0 < across[centre + distance] < 255
    assert across[centre + 8] > across[centre + 12] > across[centre + 16]  # fading outwards
    assert across[: centre - 22].max() == 0 and across[centre + 23 :].max() == 0
    assert at(values, 0.5, 0.1) == 0 and at(values, 0.1, 0.5) == 0


def test_a_soft_erase_only_ever_darkens_the_mask(painter, tmp_path):
    canvas = painter.canvas
    painter.brush.setValue(80)
    painter.hardness.setValue(30)
    _stroke(canvas, _widget_point(canvas, 0.2, 0.5), _widget_point(canvas, 0.8, 0.5))
    before = _saved(painter, tmp_path).astype(int)
    assert ((before > 0) & (before < 255)).any()  # it has soft edges to erase across

    painter.brush.setValue(60)
    painter.hardness.setValue(20)
    _stroke(
        canvas,
        _widget_point(canvas, 0.5, 0.2),
        _widget_point(canvas, 0.5, 0.8),
        Qt.MouseButton.RightButton,
    )
    after = _saved(painter, tmp_path).astype(int)
    assert (after <= before).all()  # nothing was raised, not even the soft edges' greys
    assert (after < before).sum() > 1000
    assert at(after, 0.5, 0.5) == 0 and at(after, 0.25, 0.5) == 255
    column, row = _mask_point(canvas, _widget_point(canvas, 0.5, 0.5))
    assert 0 < after[row, column + 18] < 255  # the erased band's edge is soft too


def test_soft_dabs_never_build_up_and_leave_white_white(painter, tmp_path):
    canvas = painter.canvas
    painter.brush.setValue(40)
    painter.hardness.setValue(20)
    point = _widget_point(canvas, 0.3, 0.5)
    _click(canvas, point)
    once = _saved(painter, tmp_path)
    for _ in range(10):
        _click(canvas, point)
    again = _saved(painter, tmp_path)
    assert ((once > 0) & (once < 255)).sum() > 100  # a soft dab, greys around its middle
    assert (again == once).all()  # dabbing again does not harden it: the lighter value is kept

    # A soft dab inside a white patch leaves the patch white.
    painter.brush.setValue(160)
    painter.hardness.setValue(100)
    patch = _widget_point(canvas, 0.7, 0.5)
    _click(canvas, patch)
    painter.brush.setValue(40)
    painter.hardness.setValue(20)
    _click(canvas, patch)
    values = _saved(painter, tmp_path)
    column, row = _mask_point(canvas, patch)
    assert (values[row - 50 : row + 51, column - 50 : column + 51] == 255).all()


def test_the_saved_mask_keeps_its_soft_edge_in_greys(painter, tmp_path):
    canvas = painter.canvas
    painter.hardness.setValue(10)
    _stroke(canvas, _widget_point(canvas, 0.3, 0.5), _widget_point(canvas, 0.7, 0.5))
    with Image.open(painter.save(tmp_path / "masks")) as image:
        assert image.format == "PNG" and image.mode == "L"
        values = np.asarray(image)
    greys = np.unique(values[(values > 0) & (values < 255)])
    assert len(greys) > 20  # a ramp of greys, not a threshold
    assert values.max() == 255 and at(values, 0.5, 0.05) == 0


def test_a_mask_with_nothing_as_light_as_half_grey_paints_nothing(qtbot, tmp_path):
    Image.new("L", (200, 150), 100).save(tmp_path / "faint.png")
    dialog = MaskPainter(
        QImage(_picture(tmp_path / "photo.png")), QImage(str(tmp_path / "faint.png")), "photo.png"
    )
    qtbot.addWidget(dialog)
    assert dialog.canvas.is_empty() and not dialog.use_button.isEnabled()
    assert dialog.share.text() == "Nothing painted yet"


def test_a_click_with_the_hard_brush_paints_a_round_dab(painter_1to1, tmp_path):
    painter = painter_1to1  # widths in the picture's pixels are the mask's here
    canvas = painter.canvas
    painter.brush.setValue(40)
    point = _widget_point(canvas, 0.5, 0.5)
    _click(canvas, point)
    values = _saved(painter, tmp_path)
    column, row = _mask_point(canvas, point)
    assert values[row, column] == 255 and values[row + 17, column] == 255
    assert values[row + 23, column] == 0 and values[row, column - 23] == 0
    assert (values == 255).sum() == pytest.approx(np.pi * 20**2, rel=0.1)


# Undo and Redo ----------------------------------------------------------------------------


def _mask(canvas) -> np.ndarray:
    """The mask as it would be saved now."""
    return np.asarray(Image.open(io.BytesIO(canvas.png())))


def _key(dialog, sequence: str) -> None:
    """Press `sequence` ("Ctrl+Z", "E") with the canvas focused, as a user would."""
    QTest.keySequence(dialog.canvas, QKeySequence(sequence))


def test_undo_and_redo_step_by_whole_strokes_and_clear_is_undone_too(painter):
    canvas = painter.canvas
    assert not painter.undo_button.isEnabled() and not painter.redo_button.isEnabled()
    _stroke(canvas, _widget_point(canvas, 0.2, 0.3), _widget_point(canvas, 0.8, 0.3))
    first = _mask(canvas)
    _stroke(canvas, _widget_point(canvas, 0.2, 0.7), _widget_point(canvas, 0.8, 0.7))
    second = _mask(canvas)
    painter.clear_button.click()
    assert canvas.is_empty() and painter.undo_button.isEnabled()

    _key(painter, "Ctrl+Z")  # the Clear
    assert (_mask(canvas) == second).all() and painter.redo_button.isEnabled()
    painter.undo_button.click()  # the whole second stroke, its many dabs at once
    assert (_mask(canvas) == first).all()
    _key(painter, "Ctrl+Z")
    assert canvas.is_empty() and not painter.undo_button.isEnabled()
    assert not painter.use_button.isEnabled() and painter.share.text() == "Nothing painted yet"

    _key(painter, "Ctrl+Shift+Z")
    assert (_mask(canvas) == first).all() and painter.use_button.isEnabled()
    painter.redo_button.click()
    assert (_mask(canvas) == second).all()
    _key(painter, "Ctrl+Y")  # the Clear again
    assert canvas.is_empty() and not painter.redo_button.isEnabled()

    # A new stroke after an Undo forgets what was undone.
    _key(painter, "Ctrl+Z")
    _stroke(canvas, _widget_point(canvas, 0.5, 0.1), _widget_point(canvas, 0.5, 0.9))
    assert not painter.redo_button.isEnabled()
    _key(painter, "Ctrl+Y")
    assert at(_mask(canvas), 0.5, 0.5) == 255


def test_undo_goes_back_thirty_strokes_and_no_further(painter):
    canvas = painter.canvas
    painter.brush.setValue(6)
    spots = [_widget_point(canvas, 0.05 + 0.025 * index, 0.5) for index in range(36)]
    states = []
    for spot in spots:
        _click(canvas, spot)
        states.append(_mask(canvas))
    assert len({state.tobytes() for state in states}) == 36  # each click painted a new dot
    for _ in range(40):
        painter.undo_button.click()
    assert not painter.undo_button.isEnabled()
    assert (_mask(canvas) == states[5]).all()  # the 30 newest undone; the six oldest kept
    _key(painter, "Ctrl+Y")
    assert (_mask(canvas) == states[6]).all()


def test_a_stroke_that_changes_nothing_is_no_step_to_undo(painter):
    canvas = painter.canvas
    _stroke(canvas, _widget_point(canvas, 0.2, 0.3), _widget_point(canvas, 0.8, 0.3))
    painted = _mask(canvas)
    # Erasing where nothing is painted: an Undo after it takes back the stroke before it.
    _stroke(
        canvas,
        _widget_point(canvas, 0.2, 0.8),
        _widget_point(canvas, 0.8, 0.8),
        Qt.MouseButton.RightButton,
    )
    assert (_mask(canvas) == painted).all()
    painter.undo_button.click()
    assert canvas.is_empty()


def test_the_history_keeps_compressed_masks_within_its_memory_budget(qtbot, tmp_path):
    # Steps of a painted 1024x683 mask are kept compressed: far below its 683 KiB of pixels.
    dialog = _open(qtbot, QImage(_picture(tmp_path / "photo.png", (3000, 2000))))
    canvas = dialog.canvas
    dialog.hardness.setValue(30)
    for row in (0.2, 0.4, 0.6, 0.8):
        _stroke(canvas, _widget_point(canvas, 0.1, row), _widget_point(canvas, 0.9, row))
    dialog.invert_button.click()
    assert canvas.history.size() < 5 * 100_000
    # States that do not compress are forgotten, oldest first, to stay within the budget.
    history = MaskHistory(steps=30, budget=10_000)
    states = [os.urandom(4000) for _ in range(5)]
    for state in states:
        history.record(state)
    assert history.size() <= 10_000
    undone = []
    while (state := history.undo(b"")) is not None:
        undone.append(state)
    assert undone == states[::-1][:2]


# Paint and Erase ----------------------------------------------------------------------------


def test_the_erase_toggle_makes_the_left_button_erase_and_the_right_one_paint(painter):
    canvas = painter.canvas
    assert painter.paint_button.isChecked() and not painter.erase_button.isChecked()
    _stroke(canvas, _widget_point(canvas, 0.2, 0.5), _widget_point(canvas, 0.8, 0.5))

    painter.erase_button.click()
    assert painter.erase_button.isChecked() and not painter.paint_button.isChecked()
    _stroke(canvas, _widget_point(canvas, 0.5, 0.2), _widget_point(canvas, 0.5, 0.8))
    _stroke(
        canvas,
        _widget_point(canvas, 0.2, 0.15),
        _widget_point(canvas, 0.8, 0.15),
        Qt.MouseButton.RightButton,
    )
    values = _mask(canvas)
    assert at(values, 0.5, 0.5) == 0 and at(values, 0.3, 0.5) == 255  # the left button erased
    assert at(values, 0.3, 0.15) == 255  # the right button painted

    # B paints, E erases, X swaps; the pair shows which, and says so in its tooltips.
    for key, erasing in (("B", False), ("X", True), ("X", False), ("E", True)):
        _key(painter, key)
        assert painter.erase_button.isChecked() == erasing
        assert painter.paint_button.isChecked() == (not erasing)
    _stroke(canvas, _widget_point(canvas, 0.7, 0.3), _widget_point(canvas, 0.7, 0.7))
    assert at(_mask(canvas), 0.7, 0.5) == 0
    assert "(B" in painter.paint_button.toolTip() and "(E" in painter.erase_button.toolTip()
    assert all("X swaps" in b.toolTip() for b in (painter.paint_button, painter.erase_button))


# The brush's width and outline ------------------------------------------------------------


def _dab_width(values: np.ndarray, column: int, row: int) -> int:
    """The painted run's width, in mask pixels, along the row through (column, row)."""
    line = values[row] > 0
    left = right = column
    while left > 0 and line[left - 1]:
        left -= 1
    while right < len(line) - 1 and line[right + 1]:
        right += 1
    return right - left + 1


def test_the_brush_is_as_wide_as_its_box_says_in_the_pictures_pixels_at_any_zoom(qtbot, tmp_path):
    dialog = _open(qtbot, QImage(_picture(tmp_path / "photo.png", (2000, 1500))))
    canvas = dialog.canvas
    assert canvas.mask_image.width() == 1024  # 0.512 mask pixels per picture pixel
    dialog.brush.setValue(200)
    spots = []
    for x, zoom in ((0.25, 0), (0.75, 6)):  # at the fitted size, then 1.25**6 (3.8) times it
        point = _widget_point(canvas, x, 0.5)
        _wheel(canvas, point, zoom)
        _click(canvas, point)
        spots.append(_mask_point(canvas, point))
    assert canvas.zoom == pytest.approx(1.25**6)
    values = _mask(canvas)
    for column, row in spots:
        assert _dab_width(values, column, row) * 2000 / 1024 == pytest.approx(200, abs=4)
    # And the box says which pixels those are.
    assert "picture" in dialog.brush_label.text()
    tip = dialog.brush.toolTip()
    assert "picture's own pixels" in tip and "2000 × 1500" in tip and "zoom" in tip


def _ring(before: QImage, after: QImage, centre: QPoint) -> list[float]:
    """How far from `centre` (widget pixels) the pixels that differ between two grabs lie, in
    widget pixels."""
    ratio = before.width() / max(1, round(before.deviceIndependentSize().width()))
    return [
        math.hypot(column / ratio - centre.x(), row / ratio - centre.y())
        for row in range(0, before.height(), 2)
        for column in range(0, before.width(), 2)
        if before.pixel(column, row) != after.pixel(column, row)
    ]


def test_the_outline_shows_where_a_soft_dab_fades_and_ends_at_any_zoom(qtbot, tmp_path):
    dialog = _open(qtbot, QImage(_picture(tmp_path / "photo.png", (2000, 1500))))
    canvas = dialog.canvas
    centre = QPoint(canvas.width() // 2, canvas.height() // 2)
    _wheel(canvas, centre, 3)  # zoomed in, about twice the fitted size
    dialog.brush.setValue(300)
    dialog.hardness.setValue(40)
    _click(canvas, centre)
    # Where the painted dab starts to fade and where it ends, on screen.
    values = _mask(canvas)
    column, row = _mask_point(canvas, centre)
    across = values[row, column:]
    on_screen = canvas.target().width() / canvas.mask_image.width()
    fades = int(np.argmax(across < 255)) * on_screen
    ends = int(np.argmax(across == 0)) * on_screen
    assert 30 < fades < ends * 0.5

    canvas.leaveEvent(QEvent(QEvent.Type.Leave))
    bare = canvas.grab().toImage()
    # The move is sent to the canvas itself: QTest's goes through the window system, which
    # may send no event for a move to where the pointer already was (the click), and then the
    # outline would not come back (it failed so in parallel runs).
    QApplication.sendEvent(
        canvas,
        QMouseEvent(
            QEvent.Type.MouseMove,
            QPointF(centre),
            QPointF(canvas.mapToGlobal(centre)),
            Qt.MouseButton.NoButton,
            Qt.MouseButton.NoButton,
            Qt.KeyboardModifier.NoModifier,
        ),
    )
    soft = canvas.grab().toImage()
    dialog.hardness.setValue(100)
    hard = canvas.grab().toImage()
    outline = _ring(bare, hard, centre)
    dashed = _ring(hard, soft, centre)
    assert outline and dashed
    assert all(abs(distance - ends) < 4 for distance in outline)
    assert all(abs(distance - fades) < 4 for distance in dashed)


# The dialog -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("available", "size"),
    [((1920, 1040), (400, 300)), ((1920, 1040), (300, 1200)), ((1024, 700), (400, 300))],
)
def test_the_dialog_opens_as_large_as_the_screen_allows_at_the_pictures_proportions(
    qtbot, tmp_path, monkeypatch, available, size
):
    monkeypatch.setattr(QScreen, "availableGeometry", lambda _screen: QRect(0, 0, *available))
    dialog = _open(qtbot, QImage(_picture(tmp_path / "photo.png", size)))
    canvas = dialog.canvas
    most_width, most_height = available[0] * 0.8, available[1] * 0.8
    assert dialog.height() <= most_height + 1
    assert dialog.width() <= max(most_width + 1, dialog.minimumSizeHint().width())
    shown = canvas.target()
    # The picture takes the height it is given: no band above or below it...
    assert shown.height() == pytest.approx(canvas.height(), abs=2)
    assert shown.height() > most_height - 200
    # ...and, unless the tools need the width, none beside it either.
    if dialog.width() > dialog.minimumSizeHint().width():
        assert shown.width() == pytest.approx(canvas.width(), abs=2)


def test_no_button_has_an_icon_where_the_style_gives_cancel_one(qtbot, tmp_path):
    class Icons(QProxyStyle):
        def styleHint(self, hint, option=None, widget=None, returnData=None):  # noqa: N802, N803
            if hint == QStyle.StyleHint.SH_DialogButtonBox_ButtonsHaveIcons:
                return 1
            return super().styleHint(hint, option, widget, returnData)

    app = QApplication.instance()
    assert isinstance(app, QApplication)
    style = app.style().name()
    app.setStyle(Icons(style))
    try:
        plain = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel)
        assert not plain.buttons()[0].icon().isNull()  # this style does give Cancel an icon
        plain.deleteLater()
        dialog = MaskPainter(QImage(_picture(tmp_path / "photo.png")), None, "photo.png")
        qtbot.addWidget(dialog)
        buttons = dialog.findChildren(QPushButton)
        assert [b.text() for b in buttons if not b.icon().isNull()] == []
        assert {"Use this mask", "Cancel", "Undo", "Paint"} <= {b.text() for b in buttons}
    finally:
        app.setStyle(style)
