"""The user guide in the window: the Markdown shipped in app/resources/, a contents list of its
headings that follows the reading, find in page, links between sections with Back and Forward;
a link that leaves the guide opens outside."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QEvent, QObject, QPoint, QSize, Qt, QUrl
from PySide6.QtGui import (
    QDesktopServices,
    QKeySequence,
    QMouseEvent,
    QPalette,
    QShortcut,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
    QTextLength,
    QTextOption,
    QTextTable,
)
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QHBoxLayout,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QSplitter,
    QTextBrowser,
    QTextEdit,
    QVBoxLayout,
    QWidget,
)

from app.core import paths
from app.ui.on_screen import fitting_size
from app.ui.widgets import label

GUIDE_FILE = "user-guide.md"
GUIDE_LIMIT = 1_000_000  # bytes; the guide is a few dozen KB
OUTSIDE_SCHEMES = ("http", "https", "mailto")
MATCHES_MARKED = 1000  # a one-letter search marks this many, not every letter of the guide


def guide_path() -> Path:
    """Where the guide is shipped: `app/resources/user-guide.md`, in a checkout and when installed."""
    return paths.resource(GUIDE_FILE)


def read_guide(path: Path) -> tuple[str, str]:
    """(the guide's Markdown, "") or ("", one sentence naming the file and what is wrong)."""
    try:
        if not path.is_file():
            return "", f"{path}: the user guide is missing from this installation."
        if path.stat().st_size > GUIDE_LIMIT:
            return "", f"{path}: the user guide is larger than 1 MB, so it was not opened."
        return path.read_text(encoding="utf-8"), ""
    except UnicodeDecodeError:
        return "", f"{path}: the user guide is not UTF-8 text."
    except OSError as error:
        return "", f"{path}: the user guide could not be read ({error.strerror or error})."


def anchor_of(title: str) -> str:
    """A heading's anchor as GitHub makes it, so links in the guide work there and here:
    lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


@dataclass(frozen=True)
class Heading:
    level: int  # 1 for "#", 2 for "##", ...
    title: str
    anchor: str
    position: int  # where its block starts in the document


def headings(document: QTextDocument) -> list[Heading]:
    """Every heading of a document built from Markdown, in order."""
    found = []
    block = document.begin()
    while block.isValid():
        level = block.blockFormat().headingLevel()
        if level > 0:
            title = block.text().strip()
            found.append(Heading(level, title, anchor_of(title), block.position()))
        block = block.next()
    return found


class HelpDialog(QDialog):
    """The guide, non-modal: read beside the window it explains. Above it, Back and Forward
    (Alt+Left, Alt+Right) retrace the jumps made by links and the contents, and the find field
    (Ctrl+F) marks every match and selects one: Enter the next, Shift+Enter the one before,
    Escape clears it. The contents select the section being read as the guide scrolls."""

    def __init__(self, parent: QWidget | None = None, path: Path | None = None) -> None:
        super().__init__(parent)
        self.path = path or guide_path()
        self.setWindowTitle("HalfSafe user guide")
        self.setModal(False)
        self.resize(fitting_size(self, QSize(980, 700)))  # within a 1024 x 700 screen too

        self.contents = QListWidget()
        self.contents.setMinimumWidth(200)
        self.contents.setWordWrap(True)  # a long section title wraps, never cut off
        self.contents.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.contents.itemActivated.connect(self._contents_chosen)
        self.contents.itemClicked.connect(self._contents_chosen)
        self.browser = QTextBrowser()
        self.browser.setOpenLinks(False)  # every link goes through `follow`
        self.browser.anchorClicked.connect(self.follow)
        # A word longer than the line (a path in a table cell) breaks rather than pushing the
        # page sideways.
        self.browser.setWordWrapMode(QTextOption.WrapMode.WrapAtWordBoundaryOrAnywhere)
        self.browser.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        self.browser.verticalScrollBar().valueChanged.connect(self._follow_scroll)
        layout = self.browser.document().documentLayout()
        layout.documentSizeChanged.connect(lambda _size: self._follow_scroll())
        self.browser.viewport().installEventFilter(self)

        splitter = QSplitter(Qt.Orientation.Horizontal)
        splitter.addWidget(self.contents)
        splitter.addWidget(self.browser)
        splitter.setStretchFactor(1, 1)
        splitter.setSizes([220, 760])
        layout = QVBoxLayout(self)
        layout.addLayout(self._build_tool_row())
        layout.addWidget(splitter, 1)
        closing = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        closing.rejected.connect(self.close)
        # Enter belongs to the find field (the next match), never to Close.
        closing.button(QDialogButtonBox.StandardButton.Close).setAutoDefault(False)
        layout.addWidget(closing)

        find = QShortcut(QKeySequence.StandardKey.Find, self)
        find.activated.connect(self.open_find)
        back = QShortcut(QKeySequence.StandardKey.Back, self)
        back.activated.connect(self.back)
        forward = QShortcut(QKeySequence.StandardKey.Forward, self)
        forward.activated.connect(self.forward)
        self.sections: list[Heading] = []
        self._listed: list[Heading] = []  # the headings in the contents, row by row
        self._back: list[int] = []  # where each jump left from (a scroll position)
        self._forward: list[int] = []
        self._jumping = False  # a jump is scrolling: the contents row is the one it chose
        self.load()
        self.browser.setFocus()  # the keys scroll the guide; Ctrl+F or a click reaches find

    def _build_tool_row(self) -> QHBoxLayout:
        row = QHBoxLayout()
        self.back_button = QPushButton("Back")
        self.back_button.setToolTip("Back to where the last link or contents entry left (Alt+Left)")
        self.back_button.clicked.connect(self.back)
        self.forward_button = QPushButton("Forward")
        self.forward_button.setToolTip("Forward again after Back (Alt+Right)")
        self.forward_button.clicked.connect(self.forward)
        self.find_bar = QWidget()
        find_row = QHBoxLayout(self.find_bar)
        find_row.setContentsMargins(0, 0, 0, 0)
        self.find_field = QLineEdit()
        self.find_field.setPlaceholderText("Find in the guide")
        self.find_field.setClearButtonEnabled(True)
        self.find_field.setToolTip(
            "Marks every match and selects the next (Ctrl+F; Enter: next, Shift+Enter: the one "
            "before, Escape: clear)"
        )
        self.find_field.returnPressed.connect(self.find_next)
        self.find_field.textChanged.connect(lambda _text: self.find_next(from_start=True))
        previous = QPushButton("Previous")
        previous.clicked.connect(self.find_previous)
        following = QPushButton("Next")
        following.clicked.connect(lambda: self.find_next())
        self.find_status = label("", "muted")
        # As wide as its longest words, so the field does not shrink when a count appears.
        metrics = self.find_status.fontMetrics()
        self.find_status.setMinimumWidth(
            max(metrics.horizontalAdvance(text) for text in ("Not found", "888 of 888"))
        )
        for button in (self.back_button, self.forward_button, previous, following):
            button.setAutoDefault(False)  # Return in the find field is "next", never a button
        for widget in (self.find_field, previous, following, self.find_status):
            find_row.addWidget(widget, 1 if widget is self.find_field else 0)
        row.addWidget(self.back_button)
        row.addWidget(self.forward_button)
        row.addSpacing(12)
        row.addWidget(self.find_bar, 1)
        before = QShortcut(QKeySequence("Shift+Return"), self.find_field)
        before.setContext(Qt.ShortcutContext.WidgetShortcut)
        before.activated.connect(self.find_previous)
        escape = QShortcut(QKeySequence(Qt.Key.Key_Escape), self.find_field)
        escape.setContext(Qt.ShortcutContext.WidgetShortcut)
        escape.activated.connect(self.close_find)
        return row

    # The guide --------------------------------------------------------------------------------

    def load(self) -> None:
        """Read the guide and fill the contents; a guide that cannot be read is one sentence."""
        text, problem = read_guide(self.path)
        if problem:
            self.browser.setPlainText(problem)
        else:
            self.browser.setMarkdown(text)
            _wrap_wide_parts(self.browser.document())
        self.sections = headings(self.browser.document())
        self.contents.clear()
        self._listed = []
        for heading in self.sections:
            if heading.level == 1:
                continue  # the guide's title: the window title says it
            item = QListWidgetItem("    " * (heading.level - 2) + heading.title)
            item.setData(Qt.ItemDataRole.UserRole, heading.anchor)
            self.contents.addItem(item)
            self._listed.append(heading)
        self._back, self._forward = [], []
        self._update_history_buttons()
        self._follow_scroll()

    def _contents_chosen(self, item: QListWidgetItem) -> None:
        self._jump(str(item.data(Qt.ItemDataRole.UserRole)))

    def go_to(self, anchor: str) -> bool:
        """Scroll the section with this anchor to the top; False when there is none."""
        heading = next((h for h in self.sections if h.anchor == anchor), None)
        if heading is None:
            return False
        document = self.browser.document()
        block = document.findBlock(heading.position)
        self.browser.setTextCursor(QTextCursor(block))
        top = document.documentLayout().blockBoundingRect(block).top()
        self._jumping = True
        try:
            self.browser.verticalScrollBar().setValue(int(top))
        finally:
            self._jumping = False
        self._select_in_contents(heading)
        return True

    def follow(self, url: QUrl) -> None:
        """A link: a section of the guide (which Back returns from), or something outside it
        (a web page, a file beside the guide), which the desktop opens."""
        if url.scheme() in OUTSIDE_SCHEMES:
            QDesktopServices.openUrl(url)
        elif not url.scheme() and not url.path() and url.hasFragment():
            self._jump(url.fragment())
        elif not url.scheme() and url.path():
            QDesktopServices.openUrl(QUrl.fromLocalFile(str(self.path.parent / url.path())))
        else:
            QDesktopServices.openUrl(url)

    # Back and forward -------------------------------------------------------------------------

    def _jump(self, anchor: str) -> bool:
        """`go_to`, remembering the place it left for Back."""
        place = self._place()
        if not self.go_to(anchor):
            return False
        if place != self._place():
            self._back.append(place)
            self._forward.clear()
        self._update_history_buttons()
        return True

    def back(self) -> bool:
        """Return to where the last jump left from; False when there is none."""
        if not self._back:
            return False
        self._forward.append(self._place())
        self._show_place(self._back.pop())
        return True

    def forward(self) -> bool:
        """Go again where Back came from; False when there is nowhere."""
        if not self._forward:
            return False
        self._back.append(self._place())
        self._show_place(self._forward.pop())
        return True

    def _place(self) -> int:
        """Where the reader is: how far down the guide is scrolled, in pixels."""
        return self.browser.verticalScrollBar().value()

    def _show_place(self, place: int) -> None:
        self.browser.verticalScrollBar().setValue(place)
        # Find goes on from the top of the page shown, not from where the jump left.
        self.browser.setTextCursor(self.browser.cursorForPosition(QPoint(0, 8)))
        self.browser.verticalScrollBar().setValue(place)
        self._update_history_buttons()

    def _update_history_buttons(self) -> None:
        self.back_button.setEnabled(bool(self._back))
        self.forward_button.setEnabled(bool(self._forward))

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt's name
        """A mouse's back and forward buttons over the guide do what Back and Forward do."""
        if watched is self.browser.viewport() and event.type() == QEvent.Type.MouseButtonPress:
            assert isinstance(event, QMouseEvent)
            if event.button() == Qt.MouseButton.BackButton:
                self.back()
                return True
            if event.button() == Qt.MouseButton.ForwardButton:
                self.forward()
                return True
        return super().eventFilter(watched, event)

    # The contents follow the page -------------------------------------------------------------

    def current_section(self) -> Heading | None:
        """The section being read: the last one whose heading is at or above the top of the
        page (at the end of the guide, above its middle, so the last short sections count)."""
        if not self._listed:
            return None
        bar = self.browser.verticalScrollBar()
        line = bar.value() + 4
        if bar.maximum() > 0 and bar.value() >= bar.maximum():
            line = bar.value() + self.browser.viewport().height() // 2
        layout = self.browser.document().documentLayout()
        for heading in reversed(self._listed):
            block = self.browser.document().findBlock(heading.position)
            if layout.blockBoundingRect(block).top() <= line:
                return heading
        return self._listed[0]  # above the first section: the guide's opening belongs to it

    def _follow_scroll(self, _value: int = 0) -> None:
        if not self._jumping:
            self._select_in_contents(self.current_section())

    def _select_in_contents(self, heading: Heading | None) -> None:
        if heading is None or heading not in self._listed:
            return
        row = self._listed.index(heading)
        if self.contents.currentRow() != row:
            self.contents.setCurrentRow(row)
            self.contents.scrollToItem(self.contents.item(row))

    # Find in page -----------------------------------------------------------------------------

    def open_find(self) -> None:
        self.find_field.setFocus()
        self.find_field.selectAll()

    def close_find(self) -> None:
        """Clear the find field and its marks, and give the keys back to the guide."""
        self.find_field.clear()
        self.browser.setFocus()

    def find_previous(self) -> bool:
        return self.find_next(backwards=True)

    def find_next(self, backwards: bool = False, from_start: bool = False) -> bool:
        """Mark every match of the find field's text, select the next one (wrapping round at
        the end) and say which of how many it is, or "Not found"."""
        text = self.find_field.text()
        matches = self._mark_matches(text)
        if not text:
            self.find_status.setText("")
            return False
        flags = QTextDocument.FindFlag.FindBackward if backwards else QTextDocument.FindFlag(0)
        if from_start:
            self.browser.moveCursor(QTextCursor.MoveOperation.Start)
        found = self.browser.find(text, flags)
        if not found:  # wrap round
            self.browser.moveCursor(
                QTextCursor.MoveOperation.End if backwards else QTextCursor.MoveOperation.Start
            )
            found = self.browser.find(text, flags)
        if not found:
            self.find_status.setText("Not found")
            return False
        start = self.browser.textCursor().selectionStart()
        which = next((n for n, m in enumerate(matches, 1) if m.selectionStart() == start), 0)
        self.find_status.setText(f"{which} of {len(matches)}")
        return True

    def _mark_matches(self, text: str) -> list[QTextCursor]:
        """Give every match of `text` a highlight (the selected one is drawn over it)."""
        matches: list[QTextCursor] = []
        document = self.browser.document()
        if text:
            cursor = document.find(text)
            while not cursor.isNull() and len(matches) < MATCHES_MARKED:
                matches.append(cursor)
                cursor = document.find(text, cursor)
        colour = self.palette().color(QPalette.ColorRole.Highlight)
        colour.setAlpha(70)
        marked = QTextCharFormat()
        marked.setBackground(colour)
        marks = []
        for match in matches:
            mark = QTextEdit.ExtraSelection()
            mark.cursor = match
            mark.format = marked
            marks.append(mark)
        self.browser.setExtraSelections(marks)
        return matches


def _wrap_wide_parts(document: QTextDocument) -> None:
    """Let the parts Markdown makes wider than the page wrap: a code block's lines are
    unbreakable (a long command pushed the guide sideways at the smallest window), and a table
    is given the page's width, its columns wrapping inside it: 99%, as at 100% Qt rounds the
    columns a pixel past the page at some widths."""
    block = document.begin()
    while block.isValid():
        if block.blockFormat().nonBreakableLines():
            wrapping = QTextBlockFormat()
            wrapping.setNonBreakableLines(False)
            QTextCursor(block).mergeBlockFormat(wrapping)
        block = block.next()
    for frame in document.rootFrame().childFrames():
        if isinstance(frame, QTextTable):
            table_format = frame.format()
            table_format.setWidth(QTextLength(QTextLength.Type.PercentageLength, 99))
            frame.setFormat(table_format)


def show_guide(parent: QWidget) -> HelpDialog:
    """Open the guide beside `parent`, or bring back the one already open there."""
    dialog = parent.findChild(HelpDialog)
    if dialog is None:
        dialog = HelpDialog(parent)
    elif dialog.isVisible():
        dialog.raise_()  # it may be behind the window
    dialog.show()
    dialog.activateWindow()
    return dialog
