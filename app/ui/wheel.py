"""The mouse wheel scrolls pages and changes values only in the field the user is working in.

Qt hands the wheel to whatever spin box, combo box or slider is under the pointer, focused or
not: a page scrolled to its end changes the field that happens to arrive under the pointer
(CFG 7 -> 5, Precision fp16 -> Auto), and the settings save at once. Here a field takes the
wheel only when it has the keyboard focus (clicked or tabbed into), as settings-heavy desktop
apps do; otherwise the wheel goes on scrolling the page around it.

Two halves, both needed. Qt gives a field whose focus policy is `WheelFocus` (every combo box
and spin box has it by default) the focus for a real wheel event before any event filter sees
the event, so the filter alone would find the field focused; every widget is therefore polished
with `StrongFocus` instead (click and Tab, never the wheel). Without the filter, an unfocused
field would still take the wheel's value change.
"""

from __future__ import annotations

from PySide6.QtCore import QCoreApplication, QEvent, QObject, Qt
from PySide6.QtWidgets import QAbstractScrollArea, QAbstractSpinBox, QComboBox, QSlider, QWidget

_FIELDS = (QAbstractSpinBox, QComboBox, QSlider)


class WheelNeedsFocus(QObject):
    """An application-wide event filter (install it once on the QApplication): no widget takes
    the focus from the wheel, and a wheel event over an unfocused field is handed to the scroll
    bar of the page around it, or dropped."""

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt's name
        kind = event.type()
        if kind == QEvent.Type.Polish and isinstance(watched, QWidget):
            no_wheel_focus(watched)
            return False
        if kind != QEvent.Type.Wheel or not isinstance(watched, _FIELDS):
            return False
        assert isinstance(watched, QWidget)
        if watched.hasFocus():
            return False
        area = _scroll_area_of(watched)
        if area is not None:
            QCoreApplication.sendEvent(area.verticalScrollBar(), event)
        return True


def no_wheel_focus(widget: QWidget) -> None:
    """Give `widget` the focus by click and Tab only, where the wheel could give it too."""
    if widget.focusPolicy() == Qt.FocusPolicy.WheelFocus:
        widget.setFocusPolicy(Qt.FocusPolicy.StrongFocus)


def _scroll_area_of(widget: QWidget) -> QAbstractScrollArea | None:
    parent = widget.parentWidget()
    while parent is not None:
        if isinstance(parent, QAbstractScrollArea):
            return parent
        parent = parent.parentWidget()
    return None
