"""Painting an inpainting mask on the Generate page: strokes of the left button paint what is
drawn again, the right button erases, Clear and Invert work on the whole mask; a brush below
100 % hardness paints and erases a soft edge in greys, never building up past white nor
darkening it; the mask is saved as an 8-bit greyscale PNG, as painted, in HalfSafe's data folder
at the picture's proportions (at most 1024 px long), taken as the job's mask and read by the
engine's own reader as painted."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QColor, QImage
from PySide6.QtTest import QTest

from app.core import paths
from app.core.pictures import Mode, read_pictures
from app.ui.mask_painter import MAX_SIDE, MIN_SIDE, MaskPainter
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


@pytest.fixture
def painter(qtbot, tmp_path):
    picture = QImage(_picture(tmp_path / "photo.png"))
    dialog = MaskPainter(picture, None, "photo.png")
    qtbot.addWidget(dialog)
    dialog.show()
    qtbot.waitExposed(dialog)
    return dialog


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
    assert dialog.brush.value() == round(max(painted) / 12)


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


def test_a_soft_stroke_fades_from_white_at_its_middle_to_black_at_its_edge(painter, tmp_path):
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


def test_a_soft_brush_shows_where_its_edge_starts_to_fade(painter):
    canvas = painter.canvas
    painter.brush.setValue(200)
    centre = QPoint(canvas.width() // 2, canvas.height() // 2)
    QTest.mouseMove(canvas, centre)
    hard = canvas.grab().toImage()
    painter.hardness.setValue(50)
    soft = canvas.grab().toImage()
    ratio = hard.width() / canvas.width()  # the grab's device pixels per widget pixel
    radius = 100 * canvas.target().width() / canvas.mask_image.width() * ratio
    x, y = centre.x() * ratio, centre.y() * ratio
    changed = [
        (column, row)
        for row in range(0, hard.height(), 2)
        for column in range(0, hard.width(), 2)
        if hard.pixel(column, row) != soft.pixel(column, row)
    ]
    assert changed  # a second circle is drawn
    distances = [((column - x) ** 2 + (row - y) ** 2) ** 0.5 for column, row in changed]
    assert all(abs(distance - radius / 2) < 4 * ratio for distance in distances)


def test_a_click_with_the_hard_brush_paints_a_round_dab(painter, tmp_path):
    canvas = painter.canvas
    painter.brush.setValue(40)
    point = _widget_point(canvas, 0.5, 0.5)
    _click(canvas, point)
    values = _saved(painter, tmp_path)
    column, row = _mask_point(canvas, point)
    assert values[row, column] == 255 and values[row + 17, column] == 255
    assert values[row + 23, column] == 0 and values[row, column - 23] == 0
    assert (values == 255).sum() == pytest.approx(np.pi * 20**2, rel=0.1)
