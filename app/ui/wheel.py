"""The mouse wheel scrolls pages and changes values only in the field the user is working in.

Qt hands the wheel to whatever spin box, combo box or slider is under the pointer, focused or
not: a page scrolled to its end changes the field that happens to arrive under the pointer
(CFG 7 -> 5, Precision fp16 -> Auto), and the settings save at once. Here a field takes the
wheel only when it has the keyboard focus (clicked or tabbed into), as settings-heavy desktop
apps do; otherwise the wheel goes on scrolling the page around it.
"""

from __future__ import annotations

from PySide6.QtCore import QCoreApplication, QEvent, QObject
from PySide6.QtWidgets import QAbstractScrollArea, QAbstractSpinBox, QComboBox, QSlider, QWidget

_FIELDS = (QAbstractSpinBox, QComboBox, QSlider)


class WheelNeedsFocus(QObject):
    """An application-wide event filter (install it once on the QApplication): a wheel event
    over an unfocused field is handed to the scroll bar of the page around it, or dropped."""

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt's name
        if event.type() != QEvent.Type.Wheel or not isinstance(watched, _FIELDS):
            return False
        assert isinstance(watched, QWidget)
        if watched.hasFocus():
            return False
        area = _scroll_area_of(watched)
        if area is not None:
            QCoreApplication.sendEvent(area.verticalScrollBar(), event)
        return True


def _scroll_area_of(widget: QWidget) -> QAbstractScrollArea | None:
    parent = widget.parentWidget()
    while parent is not None:
        if isinstance(parent, QAbstractScrollArea):
            return parent
        parent = parent.parentWidget()
    return None
