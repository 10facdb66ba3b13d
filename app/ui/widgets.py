"""Small building blocks shared by the views: banners, cards, status chips, section titles."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

STYLE_SHEET = """
QLabel[role="title"] { font-size: 17pt; font-weight: 600; }
QLabel[role="section"] { font-size: 12pt; font-weight: 600; margin-top: 8px; }
QLabel[role="help"] { color: #5f6368; }
QLabel[role="muted"] { color: #5f6368; }
QLabel[role="resolved"] { color: #0b57d0; }
QLabel[role="invalid"] { color: #b3261e; }
QFrame[card="true"] {
    background: palette(base); border: 1px solid #d9dce1; border-radius: 8px;
}
QScrollArea[plain="true"] { background: transparent; border: none; }
QFrame[level="good"] { background: #e7f4ea; border: 1px solid #a8d5b2; border-radius: 6px; }
QFrame[level="warn"] { background: #fff4de; border: 1px solid #f0cf8e; border-radius: 6px; }
QFrame[level="bad"] { background: #fdecea; border: 1px solid #f2b8b5; border-radius: 6px; }
QFrame[level="info"] { background: #e8f0fe; border: 1px solid #b6cdf7; border-radius: 6px; }
QLabel[chip="good"] { background: #1e7b34; color: white; border-radius: 9px; padding: 2px 9px; }
QLabel[chip="warn"] { background: #a35f00; color: white; border-radius: 9px; padding: 2px 9px; }
QLabel[chip="bad"] { background: #b3261e; color: white; border-radius: 9px; padding: 2px 9px; }
QLabel[chip="info"] { background: #0b57d0; color: white; border-radius: 9px; padding: 2px 9px; }
QLabel[chip="muted"] { background: #80868b; color: white; border-radius: 9px; padding: 2px 9px; }
QPushButton[primary="true"] {
    background: #0b57d0; color: white; border: none; border-radius: 5px; padding: 6px 16px;
    font-weight: 600;
}
QPushButton[primary="true"]:disabled { background: #9bb6e6; }
QPushButton[primary="true"]:hover { background: #0a4cb8; }
QListWidget#navigation { border: none; background: palette(window); font-size: 11pt; }
QListWidget#navigation::item { padding: 10px 14px; }
QListWidget#navigation::item:selected { background: #d3e3fd; color: black; border-radius: 6px; }
"""


def _restyle(widget: QWidget) -> None:
    style = widget.style()
    style.unpolish(widget)
    style.polish(widget)


def label(
    text: str = "", role: str | None = None, wrap: bool = False, selectable: bool = False
) -> QLabel:
    """A QLabel with an optional stylesheet role ("title", "section", "help", "muted")."""
    widget = QLabel(text)
    if role:
        widget.setProperty("role", role)
    widget.setWordWrap(wrap)
    if selectable:
        widget.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    return widget


def primary_button(text: str) -> QPushButton:
    button = QPushButton(text)
    button.setProperty("primary", True)
    return button


class Chip(QLabel):
    """A small coloured status word: good, warn, bad, info or muted."""

    def __init__(self, text: str = "", level: str = "muted", parent: QWidget | None = None) -> None:
        super().__init__(text, parent)
        self.set_level(level)
        self.setSizePolicy(QSizePolicy.Policy.Maximum, QSizePolicy.Policy.Fixed)

    def set_level(self, level: str, text: str | None = None) -> None:
        if text is not None:
            self.setText(text)
        self.setProperty("chip", level)
        self.level = level
        _restyle(self)


class Card(QFrame):
    """A framed box with a title row (title, optional chip) and a body layout."""

    def __init__(self, title: str = "", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setProperty("card", True)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(14, 12, 14, 12)
        outer.setSpacing(6)
        header = QHBoxLayout()
        self.title = label(title, "section")
        self.title.setStyleSheet("margin-top: 0px;")
        header.addWidget(self.title)
        header.addStretch(1)
        self.header = header
        outer.addLayout(header)
        self.body = QVBoxLayout()
        self.body.setSpacing(6)
        outer.addLayout(self.body)


class Banner(QFrame):
    """A coloured strip with a message and action buttons; hidden until `show_message`."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(12, 8, 12, 8)
        layout.setSpacing(10)
        self.text = label("", wrap=True)
        self.text.setTextFormat(Qt.TextFormat.RichText)
        self.text.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        layout.addWidget(self.text, 1)
        self._buttons = QHBoxLayout()
        layout.addLayout(self._buttons)
        self.buttons: dict[str, QPushButton] = {}
        self.level = "info"
        self.hide()

    def show_message(
        self, level: str, html: str, actions: list[tuple[str, Callable[[], None]]] | None = None
    ) -> None:
        self.level = level
        self.setProperty("level", level)
        _restyle(self)
        self.text.setText(html)
        self.clear_actions()
        for text, callback in actions or []:
            button = QPushButton(text)
            button.clicked.connect(lambda _checked=False, act=callback: act())
            self._buttons.addWidget(button)
            self.buttons[text] = button
        self.show()

    def clear_actions(self) -> None:
        for button in self.buttons.values():
            self._buttons.removeWidget(button)
            # Hidden now: deletion waits for the event loop, and the old button must not linger.
            button.hide()
            button.deleteLater()
        self.buttons = {}

    def dismiss(self) -> None:
        self.clear_actions()
        self.hide()


def page_layout(widget: QWidget, title: str, intro: str = "") -> QVBoxLayout:
    """Give a view its layout, a title and a one-line introduction."""
    widget.setObjectName("page")
    layout = QVBoxLayout(widget)
    layout.setContentsMargins(20, 16, 20, 16)
    layout.setSpacing(10)
    layout.addWidget(label(title, "title"))
    if intro:
        layout.addWidget(label(intro, "muted", wrap=True))
    return layout


def scroll_column(parent_layout: QVBoxLayout) -> QVBoxLayout:
    """A borderless, see-through scroll area filling the rest of the page; returns the layout
    to add to (a stretch at its end keeps content at the top)."""
    scroll = QScrollArea()
    scroll.setProperty("plain", True)
    scroll.setWidgetResizable(True)
    scroll.setFrameShape(QScrollArea.Shape.NoFrame)
    body = QWidget()
    body.setAutoFillBackground(False)
    scroll.viewport().setAutoFillBackground(False)
    column = QVBoxLayout(body)
    column.setContentsMargins(0, 0, 10, 0)
    column.setSpacing(12)
    column.addStretch(1)
    scroll.setWidget(body)
    parent_layout.addWidget(scroll, 1)
    return column


def hline() -> QFrame:
    line = QFrame()
    line.setFrameShape(QFrame.Shape.HLine)
    line.setStyleSheet("color: #d9dce1;")
    return line
