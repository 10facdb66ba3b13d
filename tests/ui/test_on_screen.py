"""Windows open and grow within their screen: at 1024 x 700 the image viewer opened at
1100 x 760 with its buttons off the screen, and the Explain dialog grew down past the screen's
bottom when its answer came, taking Close with it."""

from __future__ import annotations

from PySide6.QtCore import QSize
from PySide6.QtWidgets import QApplication, QDialog

from app.ui.image_viewer import ImageViewer
from app.ui.on_screen import SCREEN_MARGIN, fitting_size, keep_on_screen


def _available():
    screen = QApplication.primaryScreen()
    assert screen is not None
    return screen.availableGeometry()


def test_the_image_viewer_opens_within_the_screen(qtbot):
    viewer = ImageViewer(None, lambda values: None, lambda path: None)
    qtbot.addWidget(viewer)
    available = _available()
    assert available.width() < 1100 or available.height() < 760  # the test screen is small
    assert viewer.width() <= available.width() - SCREEN_MARGIN
    assert viewer.height() <= available.height() - SCREEN_MARGIN


def test_a_size_that_fits_is_kept():
    dialog = QDialog()
    assert fitting_size(dialog, QSize(300, 200)) == QSize(300, 200)


def test_a_dialog_grown_past_the_bottom_moves_up_to_keep_its_buttons_on_the_screen(qtbot):
    available = _available()
    dialog = QDialog()
    qtbot.addWidget(dialog)
    dialog.resize(400, 200)
    dialog.show()
    qtbot.waitExposed(dialog)
    dialog.move(available.x() + 50, available.y() + available.height() - 250)
    dialog.resize(400, available.height() - 100)  # the answer came: it grew downwards

    keep_on_screen(dialog)

    frame = dialog.frameGeometry()
    assert frame.y() >= available.y()
    assert frame.y() + frame.height() <= available.y() + available.height()
    assert frame.x() == available.x() + 50  # moved up only


def test_the_first_window_opens_within_the_screen(qtbot, engines):
    """The first start (no saved geometry) asked for 1180 x 800 whatever the screen: on a
    1024 x 700 one "Load the demo" and the status bar were off it."""
    from app.ui.application import application, build_main_window
    from app.ui.main_window import FIRST_SIZE

    application()
    window = build_main_window(engines)
    qtbot.addWidget(window)
    available = _available()
    assert available.width() < FIRST_SIZE.width()  # the test screen is smaller than it
    assert window.width() <= available.width() - SCREEN_MARGIN
    assert window.height() <= available.height() - SCREEN_MARGIN
    window.show()
    qtbot.waitExposed(window)
    window.show_page("Generate")
    button = window.generate_view.demo_button
    bottom_right = button.mapToGlobal(button.rect().bottomRight())
    assert available.contains(bottom_right)
    window.dialogs.close_all()
