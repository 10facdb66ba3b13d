"""Small building blocks shared by the views: banners, cards, status chips, section titles."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)


def _restyle(widget: QWidget) -> None:
    style = widget.style()
    style.unpolish(widget)
    style.polish(widget)


def label(
    text: str = "",
    role: str | None = None,
    wrap: bool = False,
    selectable: bool = False,
    rich: bool = False,
) -> QLabel:
    """A QLabel with an optional stylesheet role ("title", "section", "help", "muted").
    `rich`: the text is HTML (a record's words escaped in it), shown as HTML even without a
    tag; Qt otherwise takes tagless text for plain text and shows "fp16&#x27;s" as written."""
    widget = QLabel(text)
    if rich:
        widget.setTextFormat(Qt.TextFormat.RichText)
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
        self, level: str, html: str, actions: list[tuple[str, Callable[[], object]]] | None = None
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


def plain_scroll(content: QWidget, scroll: QScrollArea | None = None) -> QScrollArea:
    """`content` in a borderless scroll area (`scroll`, or a new one) that sizes it to its own
    width and scrolls up and down only: what is too tall scrolls, nothing scrolls sideways."""
    scroll = scroll if scroll is not None else QScrollArea()
    scroll.setProperty("plain", True)
    scroll.setWidgetResizable(True)
    scroll.setFrameShape(QScrollArea.Shape.NoFrame)
    scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
    scroll.setWidget(content)
    return scroll


def scroll_column(parent_layout: QVBoxLayout) -> QVBoxLayout:
    """A borderless, see-through scroll area filling the rest of the page; returns the layout
    to add to (a stretch at its end keeps content at the top)."""
    body = QWidget()
    body.setAutoFillBackground(False)
    scroll = plain_scroll(body)
    scroll.viewport().setAutoFillBackground(False)
    column = QVBoxLayout(body)
    column.setContentsMargins(0, 0, 10, 0)
    column.setSpacing(12)
    column.addStretch(1)
    parent_layout.addWidget(scroll, 1)
    return column


def hline() -> QFrame:
    line = QFrame()
    line.setFrameShape(QFrame.Shape.HLine)
    line.setProperty("role", "line")
    return line


def show_progress(bar: QProgressBar, done: int, total: int) -> None:
    """A phase's progress on `bar`: how far along it is where the phase counts its work, and a
    busy bar where it has no count yet (a phase announced as 0 of 1, or no total), so a long
    phase never sits under an empty bar that looks stuck."""
    if total > 1 or (total == 1 and done >= 1):
        bar.setRange(0, total)
        bar.setValue(min(done, total))
    else:
        bar.setRange(0, 0)
