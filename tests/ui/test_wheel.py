"""The mouse wheel changes a field only when the field has the focus: scrolling a page past a
spin box or a combo box under the pointer scrolls the page, and no setting changes."""

from __future__ import annotations

from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QWheelEvent
from PySide6.QtWidgets import QAbstractSpinBox, QApplication, QComboBox, QSlider, QWidget

from app.ui.wheel import _scroll_area_of


def _wheel(widget, clicks: int = -3) -> None:
    """Turn the wheel over `widget`'s middle (negative: towards the user, scrolling down)."""
    middle = QPointF(widget.rect().center())
    event = QWheelEvent(
        middle,
        QPointF(widget.mapToGlobal(middle.toPoint())),
        QPoint(0, 0),
        QPoint(0, 120 * clicks),
        Qt.MouseButton.NoButton,
        Qt.KeyboardModifier.NoModifier,
        Qt.ScrollPhase.NoScrollPhase,
        False,
    )
    QApplication.sendEvent(widget, event)


def test_the_wheel_over_unfocused_fields_scrolls_the_page_and_changes_no_setting(window, qtbot):
    window.show_page("Settings")
    view = window.settings_view
    window.resize(1024, 700)
    precision = view.editors["precision"].input
    before = window.state.settings["precision"]
    window.navigation.setFocus()
    assert not precision.hasFocus()
    page = _scroll_area_of(precision)
    assert page is not None and page.verticalScrollBar().maximum() > 0
    scrolled = page.verticalScrollBar().value()
    _wheel(precision)
    assert window.state.settings["precision"] == before
    assert page.verticalScrollBar().value() > scrolled  # the page moved instead


def test_generate_fields_change_only_when_focused(window, qtbot):
    window.show_page("Generate")
    view = window.generate_view
    view.steps.setValue(10)
    view.cfg.setValue(7.0)
    window.navigation.setFocus()
    _wheel(view.steps)
    _wheel(view.cfg)
    assert (view.steps.value(), view.cfg.value()) == (10, 7.0)
    # Clicked into, the field takes the wheel as before.
    view.steps.setFocus()
    qtbot.waitUntil(view.steps.hasFocus)
    _wheel(view.steps, clicks=1)
    assert view.steps.value() == 11


def test_no_field_on_any_page_can_take_the_focus_from_the_wheel(window, qtbot):
    """A real wheel event gives a `WheelFocus` field the focus before any event filter sees
    it (a synthetic one, as above, skips that step): the field would then count as clicked
    into and take the wheel. No widget the window builds keeps that policy."""
    from app.ui.main_window import PAGES

    fields = 0
    for page in PAGES:
        window.show_page(page)
        for widget in window.findChildren(QWidget):
            widget.ensurePolished()  # as before it first shows
            assert widget.focusPolicy() != Qt.FocusPolicy.WheelFocus, (
                f"{page}: {type(widget).__name__} {widget.objectName()!r} takes the wheel's focus"
            )
            fields += isinstance(widget, (QAbstractSpinBox, QComboBox, QSlider))
    assert fields > 20  # Precision, UNet precision, CFG scale, steps... were all walked
