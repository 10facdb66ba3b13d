"""The user guide in the window: the Markdown shipped in resources/, a contents list of its
headings, find in page, links between sections; a link that leaves the guide opens outside."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QDesktopServices, QKeySequence, QShortcut, QTextCursor, QTextDocument
from PySide6.QtWidgets import (
    QDialog,
    QHBoxLayout,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QSplitter,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from app.core import paths
from app.ui.widgets import label

GUIDE_FILE = "user-guide.md"
GUIDE_LIMIT = 1_000_000  # bytes; the guide is a few dozen KB
OUTSIDE_SCHEMES = ("http", "https", "mailto")


def guide_path() -> Path:
    """Where the guide is shipped: `resources/user-guide.md`, in a checkout and when installed."""
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
    """The guide, non-modal: read beside the window it explains. Ctrl+F finds in the page;
    Enter finds the next match, Shift+Enter the one before, Escape closes the find bar."""

    def __init__(self, parent: QWidget | None = None, path: Path | None = None) -> None:
        super().__init__(parent)
        self.path = path or guide_path()
        self.setWindowTitle("HalfSafe user guide")
        self.setModal(False)
        self.resize(980, 700)

        self.contents = QListWidget()
        self.contents.setMinimumWidth(200)
        self.contents.setWordWrap(True)  # a long section title wraps, never cut off
        self.contents.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.contents.itemActivated.connect(self._contents_chosen)
        self.contents.itemClicked.connect(self._contents_chosen)
        self.browser = QTextBrowser()
        self.browser.setOpenLinks(False)  # every link goes through `follow`
        self.browser.anchorClicked.connect(self.follow)

        splitter = QSplitter(Qt.Orientation.Horizontal)
        splitter.addWidget(self.contents)
        right = QWidget()
        column = QVBoxLayout(right)
        column.setContentsMargins(0, 0, 0, 0)
        column.addWidget(self._build_find_bar())
        column.addWidget(self.browser, 1)
        splitter.addWidget(right)
        splitter.setStretchFactor(1, 1)
        splitter.setSizes([220, 760])
        layout = QVBoxLayout(self)
        layout.addWidget(splitter)

        find = QShortcut(QKeySequence.StandardKey.Find, self)
        find.activated.connect(self.open_find)
        self.sections: list[Heading] = []
        self.load()

    def _build_find_bar(self) -> QWidget:
        self.find_bar = QWidget()
        row = QHBoxLayout(self.find_bar)
        row.setContentsMargins(0, 0, 0, 0)
        self.find_field = QLineEdit()
        self.find_field.setPlaceholderText("Find in the guide")
        self.find_field.returnPressed.connect(self.find_next)
        self.find_field.textEdited.connect(lambda _text: self.find_next(from_start=True))
        previous = QPushButton("Previous")
        previous.clicked.connect(self.find_previous)
        following = QPushButton("Next")
        following.clicked.connect(lambda: self.find_next())
        done = QPushButton("Close")
        done.clicked.connect(self.close_find)
        self.find_status = label("", "muted")
        for button in (previous, following, done):
            button.setAutoDefault(False)  # Return in the find field is "next", never a button
        for widget in (self.find_field, previous, following, self.find_status, done):
            row.addWidget(widget, 1 if widget is self.find_field else 0)
        back = QShortcut(QKeySequence("Shift+Return"), self.find_field)
        back.setContext(Qt.ShortcutContext.WidgetShortcut)
        back.activated.connect(self.find_previous)
        escape = QShortcut(QKeySequence(Qt.Key.Key_Escape), self.find_bar)
        escape.setContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
        escape.activated.connect(self.close_find)
        self.find_bar.hide()
        return self.find_bar

    # The guide --------------------------------------------------------------------------------

    def load(self) -> None:
        """Read the guide and fill the contents; a guide that cannot be read is one sentence."""
        text, problem = read_guide(self.path)
        if problem:
            self.browser.setPlainText(problem)
        else:
            self.browser.setMarkdown(text)
        self.sections = headings(self.browser.document())
        self.contents.clear()
        for heading in self.sections:
            if heading.level == 1:
                continue  # the guide's title: the window title says it
            item = QListWidgetItem("    " * (heading.level - 2) + heading.title)
            item.setData(Qt.ItemDataRole.UserRole, heading.anchor)
            self.contents.addItem(item)

    def _contents_chosen(self, item: QListWidgetItem) -> None:
        self.go_to(str(item.data(Qt.ItemDataRole.UserRole)))

    def go_to(self, anchor: str) -> bool:
        """Scroll the section with this anchor to the top; False when there is none."""
        heading = next((h for h in self.sections if h.anchor == anchor), None)
        if heading is None:
            return False
        document = self.browser.document()
        block = document.findBlock(heading.position)
        self.browser.setTextCursor(QTextCursor(block))
        top = document.documentLayout().blockBoundingRect(block).top()
        self.browser.verticalScrollBar().setValue(int(top))
        return True

    def follow(self, url: QUrl) -> None:
        """A link: a section of the guide, or something outside it (a web page, a file beside
        the guide), which the desktop opens."""
        if url.scheme() in OUTSIDE_SCHEMES:
            QDesktopServices.openUrl(url)
        elif not url.scheme() and not url.path() and url.hasFragment():
            self.go_to(url.fragment())
        elif not url.scheme() and url.path():
            QDesktopServices.openUrl(QUrl.fromLocalFile(str(self.path.parent / url.path())))
        else:
            QDesktopServices.openUrl(url)

    # Find in page -----------------------------------------------------------------------------

    def open_find(self) -> None:
        self.find_bar.show()
        self.find_field.setFocus()
        self.find_field.selectAll()

    def close_find(self) -> None:
        self.find_bar.hide()
        self.find_status.setText("")
        self.browser.setFocus()

    def find_previous(self) -> bool:
        return self.find_next(backwards=True)

    def find_next(self, backwards: bool = False, from_start: bool = False) -> bool:
        """Select the next match of the find field's text (wrapping round at the end); says
        "Not found" when there is none."""
        text = self.find_field.text()
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
        self.find_status.setText("" if found else "Not found")
        return found


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
