"""Starting the desktop app: Qt application, settings, the engine client, the main window.

The window is shown before anything slow happens; the engine process (and with it torch)
starts only when a page first needs it.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import traceback
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import cast

from PySide6.QtCore import QSettings, QTimer
from PySide6.QtGui import QIcon
from PySide6.QtWidgets import QApplication

from app.core import paths
from app.core.files import clear_non_regular
from app.core.settings import load_settings
from app.engine.process import EngineTransport
from app.ui.engine_client import EngineClient
from app.ui.main_window import MainWindow
from app.ui.state import AppState
from app.ui.theme import ThemeFollower

UI_STATE_FILE = "window.ini"


def ui_settings() -> QSettings:
    """Window geometry and last-used values, next to the settings file. A FIFO or folder at
    that name is moved aside first: Qt would wait on a FIFO forever, before any window shows."""
    path = paths.config_dir() / UI_STATE_FILE
    moved = clear_non_regular(path)
    if moved is not None:
        logging.getLogger("halfsafe").warning("%s was not a file; moved it to %s", path, moved)
    return QSettings(str(path), QSettings.Format.IniFormat)


def application(argv: Sequence[str] = ()) -> QApplication:
    app = cast(QApplication | None, QApplication.instance())
    if app is None:
        app = QApplication(["halfsafe", *argv])
    app.setApplicationName("HalfSafe")
    # No application display name: Qt would append it to every window title, and the main
    # window's title already starts with HalfSafe.
    if app.findChild(ThemeFollower) is None:
        ThemeFollower(app)  # the style sheet follows the system palette, light or dark
    icon = paths.resource("icons", "halfsafe-256.png")
    if icon.exists():
        app.setWindowIcon(QIcon(str(icon)))
    return app  # type: ignore[return-value]


def build_main_window(
    transport_factory: Callable[[], EngineTransport] | None = None,
) -> MainWindow:
    """Settings, state, engine client and window; nothing is started, nothing is shown."""
    loaded = load_settings()
    state = AppState(loaded.settings)
    client = EngineClient(transport_factory) if transport_factory else EngineClient()
    warnings = list(loaded.warnings)
    if loaded.kept_aside is not None:
        warnings.append(f"The damaged file was kept as {loaded.kept_aside}.")
    window = MainWindow(state, client, ui_settings(), warnings, loaded.summary)
    client.setParent(window)
    state.setParent(window)
    return window


def _log_to_file() -> None:
    handler = logging.FileHandler(paths.cache_dir() / "gui.log", encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("halfsafe")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def _install_excepthook(window: MainWindow) -> None:
    """A bug in a slot must not end the app silently: it goes to the one error dialog."""
    previous = sys.excepthook

    def hook(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
        if issubclass(kind, KeyboardInterrupt):
            previous(kind, error, tb)
            return
        details = "".join(traceback.format_exception(kind, error, tb))
        window.dialogs.error(
            "Something went wrong in the window; it keeps running, and the details say what.",
            details + f"\n\nLog: {paths.cache_dir() / 'gui.log'}",
        )

    sys.excepthook = hook


def run_gui(argv: Sequence[str] = ()) -> int:
    """Open the window and run until it is closed; returns the exit status."""
    app = application(argv)
    with contextlib.suppress(OSError):  # no log file is no reason not to start
        _log_to_file()
    window = build_main_window()
    _install_excepthook(window)
    window.show()
    # Everything slow waits until the window is on screen; so do the first-start steps.
    QTimer.singleShot(0, lambda: window.start_background(first_start=True))
    return app.exec()
