"""Windows that open and grow within the screen they are on: a dialog sized for a large
desktop opens smaller on a 1024 x 700 screen, and one that grows after it showed moves up so
that its buttons stay in reach."""

from __future__ import annotations

from PySide6.QtCore import QSize
from PySide6.QtWidgets import QWidget

# What a window leaves free of the screen's available area, each way (room for a title bar).
SCREEN_MARGIN = 40


def fitting_size(window: QWidget, wanted: QSize) -> QSize:
    """`wanted`, made no larger than the available area of the screen `window` is on (its
    parent's until it shows) less SCREEN_MARGIN each way."""
    parent = window.parentWidget()
    screen = (parent.screen() if parent is not None else None) or window.screen()
    if screen is None:
        return wanted
    available = screen.availableGeometry().size()
    room = QSize(available.width() - SCREEN_MARGIN, available.height() - SCREEN_MARGIN)
    return wanted.boundedTo(room)


def keep_on_screen(window: QWidget) -> None:
    """Move `window` up (or left) as far as it must for its whole frame to lie within the
    available area of its screen, never past that area's top-left corner."""
    screen = window.screen()
    if screen is None:
        return
    available = screen.availableGeometry()
    frame = window.frameGeometry()
    x = min(frame.x(), available.x() + available.width() - frame.width())
    y = min(frame.y(), available.y() + available.height() - frame.height())
    x, y = max(x, available.x()), max(y, available.y())
    if (x, y) != (frame.x(), frame.y()):
        window.move(x, y)
