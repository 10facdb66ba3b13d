"""The user guide: shipped in app/resources/, opened from Help > User guide (F1) beside the window,
with its headings as contents that follow the reading, working links between sections with Back
and Forward, outside links handed to the desktop, find in page, and no sideways scrolling."""

from __future__ import annotations

import re

import pytest
from PySide6.QtCore import QPoint, Qt, QUrl
from PySide6.QtGui import QKeySequence, QTextCursor
from PySide6.QtWidgets import QApplication, QDialogButtonBox

from app.core import paths
from app.ui import help_view
from app.ui.help_view import HelpDialog, anchor_of, guide_path

SECTIONS = (
    "What HalfSafe does",
    "First start",
    "Load a model",
    "Run a health check and read it",
    "Apply a fix",
    "Generate and read the NaN watch's results",
    "Explain a black image from another tool",
    "Settings",
    "The command line",
    "Where HalfSafe keeps its files",
    "Troubleshooting",
)

SMALL_GUIDE = """# Guide

## First part

Go to [the second part](#second-part), read [the site](https://example.org/halfsafe), or
[the notes](notes.md).

## Second part

fp16 tops out at 65504. Say fp16 once more: fp16.
"""


class Desktop:
    """Stands in for QDesktopServices: records what the desktop was asked to open."""

    opened: list[QUrl] = []

    @classmethod
    def openUrl(cls, url: QUrl) -> bool:  # noqa: N802 - Qt's name
        cls.opened.append(url)
        return True


def _guide(qtbot, path=None) -> HelpDialog:
    dialog = HelpDialog(path=path)
    qtbot.addWidget(dialog)
    dialog.show()
    qtbot.waitExposed(dialog)
    return dialog


def _titles(dialog: HelpDialog) -> list[str]:
    return [dialog.contents.item(row).text().strip() for row in range(dialog.contents.count())]


def _in_view(dialog: HelpDialog, title: str) -> bool:
    """Whether the heading `title` is the block under the cursor and inside the visible page."""
    cursor = dialog.browser.textCursor()
    rect = dialog.browser.cursorRect(cursor)
    return cursor.block().text() == title and dialog.browser.viewport().rect().contains(rect)


def _guide_action(window):
    return next(
        action
        for menu in window.menuBar().actions()
        if menu.text() == "&Help"
        for action in menu.menu().actions()
        if action.text() == "&User guide"
    )


def test_the_guide_ships_in_resources_where_the_app_finds_it():
    assert guide_path() == paths.RESOURCES / "user-guide.md"
    assert guide_path().is_file()


def test_the_contents_list_every_section_of_the_shipped_guide(qtbot):
    dialog = _guide(qtbot)
    titles = _titles(dialog)
    assert [t for t in titles if t in SECTIONS] == list(SECTIONS)
    assert "Your model folders" in titles  # a subsection, indented under Settings
    assert "HalfSafe user guide" not in titles  # the title is the window's


def test_the_shipped_guide_renders_without_markdown_left_raw(qtbot):
    # A line that starts with ">" is a quote: "**Engine\n> Show engine log**" showed its **.
    text = _guide(qtbot).browser.document().toPlainText()
    assert "**" not in text and "`" not in text


def test_every_link_between_sections_of_the_shipped_guide_leads_to_one(qtbot):
    dialog = _guide(qtbot)
    text = guide_path().read_text(encoding="utf-8")
    anchors = re.findall(r"\]\(#([^)]+)\)", text)
    assert anchors, "the guide links its sections to each other"
    for anchor in anchors:
        assert dialog.go_to(anchor), anchor
    assert len({h.anchor for h in dialog.sections}) == len(dialog.sections)


def test_anchors_are_made_as_github_makes_them():
    assert anchor_of("Generate and read the NaN watch's results") == (
        "generate-and-read-the-nan-watchs-results"
    )
    assert anchor_of(" Where HalfSafe keeps its files ") == "where-halfsafe-keeps-its-files"


# The offscreen platform cannot raise a window, and says so.
@pytest.mark.qt_log_ignore("does not support raise", "propagateSizeHints")
def test_f1_opens_one_guide_beside_the_window(window, qtbot):
    action = _guide_action(window)
    assert action.shortcut() == QKeySequence("F1")
    action.trigger()
    dialog = window.findChild(HelpDialog)
    assert dialog is not None and dialog.isVisible()
    assert not dialog.isModal()
    assert window.isEnabled()  # the window stays usable beside it
    action.trigger()
    assert window.findChildren(HelpDialog) == [dialog]
    # It fits the screen it opens on, and closes with a button, as the other dialogs do.
    available = dialog.screen().availableGeometry()
    assert dialog.width() <= available.width() and dialog.height() <= available.height()
    (closing,) = dialog.findChildren(QDialogButtonBox)
    closing.button(QDialogButtonBox.StandardButton.Close).click()
    assert not dialog.isVisible()


def test_choosing_a_section_in_the_contents_brings_it_into_view(qtbot):
    dialog = _guide(qtbot)
    for title in ("Troubleshooting", "Load a model", "Your model folders"):
        item = next(
            dialog.contents.item(row)
            for row in range(dialog.contents.count())
            if dialog.contents.item(row).text().strip() == title
        )
        dialog.contents.scrollToItem(item)
        rect = dialog.contents.visualItemRect(item)
        qtbot.mouseClick(dialog.contents.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
        assert _in_view(dialog, title), title


def _click_link(qtbot, dialog: HelpDialog, text: str) -> None:
    cursor = dialog.browser.document().find(text)
    assert not cursor.isNull(), text
    middle = QTextCursor(cursor)
    middle.setPosition(cursor.selectionStart() + len(text) // 2)
    point: QPoint = dialog.browser.cursorRect(middle).center()
    qtbot.mouseClick(dialog.browser.viewport(), Qt.MouseButton.LeftButton, pos=point)


def test_a_link_to_a_section_scrolls_there_and_outside_links_go_to_the_desktop(
    qtbot, tmp_path, monkeypatch
):
    guide = tmp_path / "guide.md"
    guide.write_text(SMALL_GUIDE + "\n".join(["", "More text."] * 80), encoding="utf-8")
    monkeypatch.setattr(help_view, "QDesktopServices", Desktop)
    Desktop.opened = []
    dialog = _guide(qtbot, guide)
    dialog.resize(500, 300)
    QApplication.processEvents()

    _click_link(qtbot, dialog, "the second part")
    assert _in_view(dialog, "Second part")
    assert Desktop.opened == []

    dialog.go_to("first-part")
    _click_link(qtbot, dialog, "the site")
    assert Desktop.opened == [QUrl("https://example.org/halfsafe")]
    _click_link(qtbot, dialog, "the notes")
    assert Desktop.opened[-1] == QUrl.fromLocalFile(str(tmp_path / "notes.md"))


def test_find_is_always_there_marks_every_match_wraps_round_and_says_when_none(qtbot, tmp_path):
    guide = tmp_path / "guide.md"
    guide.write_text(SMALL_GUIDE, encoding="utf-8")
    dialog = _guide(qtbot, guide)
    dialog.activateWindow()
    qtbot.waitUntil(dialog.isActiveWindow)
    assert dialog.find_field.isVisible()  # no shortcut to know first
    assert dialog.find_field.placeholderText() == "Find in the guide"
    dialog.browser.setFocus()
    qtbot.keyClick(dialog.browser, Qt.Key.Key_F, Qt.KeyboardModifier.ControlModifier)
    assert dialog.find_field.hasFocus()

    qtbot.keyClicks(dialog.find_field, "fp16")
    marks = dialog.browser.extraSelections()
    assert [m.cursor.selectedText() for m in marks] == ["fp16"] * 3  # every match is marked
    first = dialog.browser.textCursor().selectionStart()
    assert dialog.browser.textCursor().selectedText() == "fp16"
    assert dialog.find_status.text() == "1 of 3"
    starts = [first]
    for _ in range(3):
        qtbot.keyClick(dialog.find_field, Qt.Key.Key_Return)
        starts.append(dialog.browser.textCursor().selectionStart())
    assert starts[0] < starts[1] < starts[2]  # three matches, in order
    assert starts[3] == starts[0]  # then round to the first again
    qtbot.keyClick(dialog.find_field, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    assert dialog.browser.textCursor().selectionStart() == starts[2]  # backwards, round the start
    assert dialog.find_status.text() == "3 of 3"

    dialog.find_field.clear()
    qtbot.keyClicks(dialog.find_field, "bfloat32")
    assert dialog.find_status.text() == "Not found"
    assert dialog.browser.extraSelections() == []
    qtbot.keyClick(dialog.find_field, Qt.Key.Key_Escape)
    assert dialog.find_field.text() == "" and dialog.find_status.text() == ""
    assert dialog.isVisible()  # Escape cleared the find field, not the guide


@pytest.mark.parametrize("width", [944, 700])
def test_the_shipped_guide_wraps_to_the_window_and_never_scrolls_sideways(qtbot, width):
    # 944 px: the guide beside the smallest window (1024 px, as the screenshots take it); its
    # commands and tables were wider than the page.
    dialog = _guide(qtbot)
    dialog.resize(width, 620)
    qtbot.wait(20)
    browser = dialog.browser
    assert browser.document().size().width() <= browser.viewport().width()
    assert browser.horizontalScrollBar().maximum() == 0
    text = browser.document().toPlainText()
    assert "halfsafe generate demo --prompt" in text  # the commands are all there, wrapped
    assert "~/Library/Application Support/HalfSafe" in text


def _long_guide(tmp_path):
    guide = tmp_path / "guide.md"
    filler = "\n".join(["", "More text to read."] * 40)
    guide.write_text(
        SMALL_GUIDE.replace("## Second part", filler + "\n\n## Second part")
        + filler
        + "\n\n## Third part\n\nBack to [the first part](#first-part)."
        + filler,
        encoding="utf-8",
    )
    return guide


def test_back_and_forward_retrace_the_links_followed_in_the_guide(qtbot, tmp_path):
    dialog = _guide(qtbot, _long_guide(tmp_path))
    dialog.resize(500, 300)
    QApplication.processEvents()
    bar = dialog.browser.verticalScrollBar()
    assert not dialog.back_button.isEnabled() and not dialog.forward_button.isEnabled()

    _click_link(qtbot, dialog, "the second part")
    assert _in_view(dialog, "Second part")
    assert dialog.back_button.isEnabled() and not dialog.forward_button.isEnabled()
    at_second = bar.value()
    dialog.back_button.click()
    assert bar.value() == 0  # where the link was followed
    assert dialog.forward_button.isEnabled() and not dialog.back_button.isEnabled()
    dialog.forward_button.click()
    assert bar.value() == at_second

    # The keys a browser uses do the same.
    dialog.go_to("third-part")
    _click_link(qtbot, dialog, "the first part")
    assert _in_view(dialog, "First part")
    dialog.activateWindow()
    qtbot.waitUntil(dialog.isActiveWindow)
    qtbot.keyClick(dialog.browser, Qt.Key.Key_Left, Qt.KeyboardModifier.AltModifier)
    assert _in_view(dialog, "Third part")  # where the link was
    qtbot.keyClick(dialog.browser, Qt.Key.Key_Right, Qt.KeyboardModifier.AltModifier)
    assert _in_view(dialog, "First part")
    assert not dialog.forward_button.isEnabled()


def _selected(dialog: HelpDialog) -> str:
    item = dialog.contents.currentItem()
    return item.text().strip() if item is not None else ""


def test_the_contents_select_the_section_being_read_as_the_guide_scrolls(qtbot, tmp_path):
    dialog = _guide(qtbot, _long_guide(tmp_path))
    dialog.resize(500, 300)
    QApplication.processEvents()
    browser = dialog.browser
    bar = browser.verticalScrollBar()
    assert _selected(dialog) == "First part"

    def top_of(title: str) -> int:
        heading = next(h for h in dialog.sections if h.title == title)
        block = browser.document().findBlock(heading.position)
        return int(browser.document().documentLayout().blockBoundingRect(block).top())

    bar.setValue(top_of("Second part") + 20)  # as the wheel or the scroll bar does
    assert _selected(dialog) == "Second part"
    bar.setValue(top_of("Second part") - 40)  # the heading is still below the top
    assert _selected(dialog) == "First part"
    bar.setValue(bar.maximum())
    assert _selected(dialog) == "Third part"
    bar.setValue(0)
    assert _selected(dialog) == "First part"


def test_a_guide_missing_from_the_installation_is_one_sentence_naming_it(qtbot, tmp_path):
    missing = tmp_path / "user-guide.md"
    dialog = _guide(qtbot, missing)
    text = dialog.browser.toPlainText()
    assert text == f"{missing}: the user guide is missing from this installation."
    assert dialog.contents.count() == 0


def test_a_guide_that_is_not_text_is_one_sentence_naming_it(qtbot, tmp_path):
    damaged = tmp_path / "user-guide.md"
    damaged.write_bytes(b"\xff\xfe\x00 not text")
    dialog = _guide(qtbot, damaged)
    assert dialog.browser.toPlainText() == f"{damaged}: the user guide is not UTF-8 text."
