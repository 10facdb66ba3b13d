"""The one place the window shows errors and asks questions.

Every error reaches the user as one plain sentence; the traceback and the log path sit in the
dialog's folded-away details. Everything shown is also written to the GUI log.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Qt, QUrl, Signal
from PySide6.QtGui import QDesktopServices, QGuiApplication
from PySide6.QtWidgets import QMessageBox, QWidget

log = logging.getLogger("halfsafe.ui")


@dataclass(frozen=True)
class ShownError:
    message: str
    details: str


class Dialogs(QObject):
    """Shows errors (non-blocking) and asks yes/no questions for the main window.

    `error_shown` is emitted (GUI thread) for every error, after its dialog opened.
    """

    error_shown = Signal(object)

    def __init__(self, parent_window: QWidget) -> None:
        super().__init__(parent_window)
        self._window = parent_window
        self.shown: list[ShownError] = []
        self._open: list[QMessageBox] = []

    def error(self, message: str, details: str = "", title: str = "HalfSafe") -> None:
        """Show one plain sentence, with `details` folded away behind "Show Details..."."""
        log.warning("%s%s", message, f"\n{details}" if details else "")
        box = QMessageBox(
            QMessageBox.Icon.Warning, title, message, QMessageBox.StandardButton.Ok, self._window
        )
        if details:
            box.setDetailedText(details)
        box.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        box.setWindowModality(Qt.WindowModality.WindowModal)
        box.finished.connect(lambda _result, b=box: self._closed(b))
        self._open.append(box)
        box.open()
        shown = ShownError(message, details)
        self.shown.append(shown)
        self.error_shown.emit(shown)

    def open_location(self, path: str | Path, what: str = "this") -> bool:
        """Open a file or folder with the desktop's own program. Where none answers (no file
        manager, a bare window manager), the path is shown and copied instead of nothing
        happening. Returns whether a program took it."""
        if QDesktopServices.openUrl(QUrl.fromLocalFile(str(path))):
            return True
        QGuiApplication.clipboard().setText(str(path))
        self.error(
            f"No program on this computer opened {what}. It is here (copied to the clipboard):"
            f"\n{path}",
            title="Where it is",
        )
        return False

    def job_failed(self, event: Any) -> None:
        """A job's ERROR event. When the engine itself died the window's banner already says
        so, once, with the restart button; a dialog per job would only repeat it."""
        if event.error_type == "EngineDied":
            log.info("job %s ended with the engine: %s", event.job_id, event.message)
            return
        self.error(event.message, event.details)

    def _closed(self, box: QMessageBox) -> None:
        if box in self._open:
            self._open.remove(box)
        box.deleteLater()

    def close_all(self) -> None:
        for box in list(self._open):
            box.done(0)

    def confirm(
        self, title: str, question: str, explanation: str = "", yes: str = "Yes", no: str = "Cancel"
    ) -> bool:
        """Ask and wait for the answer; True means the user chose `yes`."""
        box = QMessageBox(
            QMessageBox.Icon.Question,
            title,
            question,
            QMessageBox.StandardButton.NoButton,
            self._window,
        )
        if explanation:
            box.setInformativeText(explanation)
        yes_button = box.addButton(yes, QMessageBox.ButtonRole.AcceptRole)
        box.addButton(no, QMessageBox.ButtonRole.RejectRole)
        box.exec()
        return box.clickedButton() is yes_button
