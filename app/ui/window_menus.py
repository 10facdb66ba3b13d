"""The main window's menu bar: File (open a model file or folder, explain an image, quit),
Engine (restart it, show its log), View (a shortcut to each page) and Help (the user guide, the
first-start steps again, About)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QMessageBox, QWidget

from app import __version__
from app.engine.process import log_path

if TYPE_CHECKING:
    from app.ui.main_window import MainWindow


def build_menus(window: MainWindow, pages: tuple[str, ...]) -> QAction:
    """Fill `window`'s menu bar, with a shortcut Ctrl+1… for each of `pages`; returns the
    Engine menu's Restart action."""
    file_menu = window.menuBar().addMenu("&File")
    open_file = QAction("&Open model file…", window)
    open_file.setShortcut(QKeySequence.StandardKey.Open)
    open_file.triggered.connect(
        lambda: (window.show_page("Models"), window.models_view.open_file())
    )
    open_folder = QAction("Open model &folder…", window)
    open_folder.triggered.connect(
        lambda: (window.show_page("Models"), window.models_view.open_folder())
    )
    explain = QAction("&Why is this image black?…", window)
    explain.setToolTip(
        "Open an image made by HalfSafe, AUTOMATIC1111, Forge, SD.Next, ComfyUI, SwarmUI or "
        "InvokeAI: HalfSafe finds its model, checks it, and gives the fix in that tool's terms."
    )
    explain.triggered.connect(window.open_image)
    quit_action = QAction("&Quit", window)
    quit_action.setShortcut(QKeySequence.StandardKey.Quit)
    quit_action.triggered.connect(window.close)
    file_menu.addActions([open_file, open_folder, explain])
    file_menu.addSeparator()
    file_menu.addAction(quit_action)

    engine_menu = window.menuBar().addMenu("&Engine")
    restart_action = QAction("&Restart engine", window)
    restart_action.setToolTip(
        "Stop the engine and start a fresh one; this also clears a GPU left in a bad state."
    )
    restart_action.triggered.connect(window.restart_engine)
    show_log = QAction("Show engine &log", window)
    show_log.triggered.connect(lambda: window.dialogs.open_location(log_path(), "the engine log"))
    engine_menu.addActions([restart_action, show_log])

    view_menu = window.menuBar().addMenu("&View")
    for number, name in enumerate(pages, start=1):
        action = QAction(name, window)
        action.setShortcut(QKeySequence(f"Ctrl+{number}"))
        action.triggered.connect(lambda _checked=False, n=name: window.show_page(n))
        view_menu.addAction(action)

    help_menu = window.menuBar().addMenu("&Help")
    guide = QAction("&User guide", window)
    guide.setShortcut(QKeySequence(Qt.Key.Key_F1))
    guide.triggered.connect(lambda: open_guide(window))
    again = QAction("Show the &first-start steps again", window)
    again.setToolTip("The hint on the Models page and the choice of model folders.")
    again.triggered.connect(window.first_start.show_again)
    about = QAction("&About HalfSafe", window)
    about.triggered.connect(lambda: show_about(window))
    help_menu.addActions([guide, again])
    help_menu.addSeparator()
    help_menu.addAction(about)
    return restart_action


def show_about(parent: QWidget) -> None:
    """The About box: the version, what HalfSafe does, and the families it runs."""
    from app.core.families.registry import families_words

    QMessageBox.about(
        parent,
        "About HalfSafe",
        f"<b>HalfSafe {__version__}</b><br>Finds where an image model overflows fp16's "
        "limit of 65,504, proves the cheapest fix, and never lets a black or NaN image pass "
        f"silently.<br><br>It runs {families_words()}.",
    )


def open_guide(parent: QWidget) -> None:
    """The user guide (its module imported when it first opens)."""
    from app.ui.help_view import show_guide

    show_guide(parent)
