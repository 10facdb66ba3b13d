"""Small building blocks shared by the views: banners, cards, status chips, section titles."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from PySide6.QtCore import QModelIndex, QPersistentModelIndex, Qt
from PySide6.QtGui import QFontMetrics, QPainter, QResizeEvent
from PySide6.QtWidgets import (
    QApplication,
    QFrame,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QTreeWidget,
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


class ElidedLabel(QLabel):
    """One line of plain text that, where it does not fit, ends in "…" at its width (the whole
    of it in `full_text()` and its tooltip); it never widens its window."""

    def __init__(self, text: str = "", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._full = ""
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.set_full_text(text)

    def set_full_text(self, text: str) -> None:
        self._full = text
        self.setToolTip(text)
        self._fit()

    def full_text(self) -> str:
        return self._full

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._fit()

    def _fit(self) -> None:
        room = self.contentsRect().width()
        shown = self.fontMetrics().elidedText(self._full, Qt.TextElideMode.ElideRight, room)
        if shown != self.text():
            self.setText(shown)


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


# A column that gives way keeps at least this many characters of its text.
FLOOR_CHARS = 12


def elide_words(text: str, metrics: QFontMetrics, width: int) -> str:
    """`text` as it fits `width` pixels: whole, or cut after the last whole word that fits,
    with "…" ("Keep 2 VAE layers…", never "Keep 2 VAE…rs"). A single word (a file name) is cut
    in its middle, keeping its start and its end; a first word too long for the width, at its
    end."""
    if metrics.horizontalAdvance(text) <= width:
        return text
    words_ = text.split(" ")
    for count in range(len(words_) - 1, 0, -1):
        shown = " ".join(words_[:count]).rstrip(" ,;:·-(") + "…"
        if metrics.horizontalAdvance(shown) <= width:
            return shown
    mode = Qt.TextElideMode.ElideMiddle if len(words_) == 1 else Qt.TextElideMode.ElideRight
    return metrics.elidedText(text, mode, width)


class WordElidingDelegate(QStyledItemDelegate):
    """Draws a table cell's text cut at a word boundary where it does not fit
    (`elide_words`), where Qt would cut it in the middle of a word."""

    def shown_text(self, option: QStyleOptionViewItem) -> str:
        """The text the cell shows for `option` (its style option, text and rectangle set)."""
        widget = option.widget  # type: ignore[attr-defined]
        style = widget.style() if widget is not None else QApplication.style()
        room = style.subElementRect(QStyle.SubElement.SE_ItemViewItemText, option, widget)
        margin = style.pixelMetric(QStyle.PixelMetric.PM_FocusFrameHMargin, None, widget) + 1
        return elide_words(option.text, option.fontMetrics, room.width() - 2 * margin)  # type: ignore[attr-defined]

    def paint(
        self,
        painter: QPainter,
        option: QStyleOptionViewItem,
        index: QModelIndex | QPersistentModelIndex,
    ) -> None:
        shown = QStyleOptionViewItem(option)
        self.initStyleOption(shown, index)
        shown.text = self.shown_text(shown)  # type: ignore[attr-defined]
        widget = shown.widget  # type: ignore[attr-defined]
        style = widget.style() if widget is not None else QApplication.style()
        style.drawControl(QStyle.ControlElement.CE_ItemViewItem, shown, painter, widget)


class FittedTree(QTreeWidget):
    """A flat table whose columns share its width as it changes: each gets the width its text
    needs while they all fit, and spare width by `shares`; when they do not fit, the
    `give_way` columns narrow in turn, to FLOOR_CHARS at least, their text cut after its last
    whole word that fits, a single word (a file name) in its middle (`elide_words`; a cell's
    tooltip says it whole). The other columns are never narrowed."""

    def __init__(
        self,
        columns: Sequence[str],
        shares: Sequence[int],
        give_way: Sequence[int],
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.shares = tuple(shares)
        self.give_way = tuple(give_way)
        self.setHeaderLabels(list(columns))
        self.setRootIsDecorated(False)
        self.setAlternatingRowColors(True)
        self.setUniformRowHeights(True)
        self.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        self.setItemDelegate(WordElidingDelegate(self))
        header = self.header()
        header.setStretchLastSection(False)
        header.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        self.setMinimumHeight(100)

    def wanted_widths(self) -> list[int]:
        """The width each column needs to show its header and every cell whole."""
        header = self.header()
        return [
            max(self.sizeHintForColumn(column), header.sectionSizeHint(column))
            for column in range(self.columnCount())
        ]

    def fit_columns(self) -> None:
        widths = self.wanted_widths()
        floor = self.fontMetrics().averageCharWidth() * FLOOR_CHARS
        over = sum(widths) - self.viewport().width()
        for column in self.give_way:
            cut = min(max(over, 0), max(widths[column] - floor, 0))
            widths[column] -= cut
            over -= cut
        if over < 0:
            total = sum(self.shares)
            extra = [-over * share // total for share in self.shares]
            extra[self.shares.index(max(self.shares))] += -over - sum(extra)
            widths = [width + more for width, more in zip(widths, extra, strict=True)]
        for column, width in enumerate(widths):
            self.header().resizeSection(column, width)

    def resizeEvent(self, event: Any) -> None:  # noqa: N802 - Qt's name
        # Also called when the viewport alone changes size (a scroll bar comes or goes).
        super().resizeEvent(event)
        self.fit_columns()
