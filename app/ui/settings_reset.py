"""The Settings page's reset row: "Reset to recommended" puts the device, precision,
attention, accumulation and NaN settings back to what HalfSafe recommends for this computer
(after the user confirms the list of what changes), the notice beside it says what happened,
and Undo puts back what the last reset changed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PySide6.QtWidgets import QHBoxLayout, QPushButton, QWidget

from app.core.settings import FIELDS
from app.ui.dialogs import Dialogs
from app.ui.state import AppState
from app.ui.widgets import label


class ResetBar(QWidget):
    """The reset button, its notice and Undo. `request_hardware(then)` asks for the hardware
    report and calls `then` once it is in (None: the reset goes on from the defaults when no
    report is in yet)."""

    def __init__(
        self,
        state: AppState,
        dialogs: Dialogs,
        request_hardware: Callable[[Callable[[], None]], None] | None,
    ) -> None:
        super().__init__()
        self.state = state
        self.dialogs = dialogs
        self._request_hardware = request_hardware
        top = QHBoxLayout(self)
        top.setContentsMargins(0, 0, 0, 0)
        top.setSpacing(10)  # as between the page's own rows (`page_layout`)
        self.reset_button = QPushButton("Reset to recommended")
        self.reset_button.setToolTip(
            "Put the device, precision, attention, accumulation and NaN settings back to what "
            "HalfSafe recommends for this computer. Generation values and folders stay."
        )
        self.reset_button.clicked.connect(self.reset_to_recommended)
        top.addWidget(self.reset_button)
        self.notice = label("", "muted", wrap=True)
        top.addWidget(self.notice, 1)
        self.undo_button = QPushButton("Undo")
        self.undo_button.setToolTip("Put back the settings as they were before the reset.")
        self.undo_button.clicked.connect(self.undo_reset)
        self.undo_button.hide()
        top.addWidget(self.undo_button)
        self._before_reset: dict[str, Any] = {}

    def reset_to_recommended(self) -> None:
        if self.state.hardware is None and self._request_hardware is not None:
            self.reset_button.setEnabled(False)
            self.notice.setText("Checking this computer to find the recommended settings…")
            self._request_hardware(self._finish_reset)
            return
        self._finish_reset()

    def _finish_reset(self) -> None:
        self.reset_button.setEnabled(True)
        target = self.state.recommended_settings()
        differ = [key for key, value in target.items() if self.state.settings[key] != value]
        source = (
            "recommended for this computer"
            if self.state.recommended()
            else "the defaults (no recommendation is available yet)"
        )
        if not differ:
            self.notice.setText(f"Already at {source}.")
            return
        names = ", ".join(FIELDS[k].label for k in differ)
        if not self.dialogs.confirm(
            "Reset to recommended?",
            f"This changes {len(differ)} setting{'s' if len(differ) != 1 else ''}: {names}.",
            "Settings left on Auto stay on Auto, so a fix remembered for a model still applies. "
            "Undo puts everything back.",
            yes="Reset",
        ):
            self.notice.setText("Nothing was changed.")
            return
        before = {key: self.state.settings[key] for key in differ}
        changed = self.state.reset_to_recommended()
        self._before_reset = {key: before[key] for key in changed if key in before}
        self.notice.setText(f"Reset to {source}. Changed: {names}.")
        self.undo_button.setVisible(bool(self._before_reset))

    def undo_reset(self) -> None:
        """Put back what the last reset changed."""
        before, self._before_reset = self._before_reset, {}
        self.undo_button.hide()
        if before:
            self.state.apply(before)
            self.notice.setText("The reset was undone.")
