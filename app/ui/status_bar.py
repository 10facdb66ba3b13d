"""The main window's status bar: the engine's state, the device, the loaded model, the
precision of the next job (or of the last one, once it ran), and the last thing a page said."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtWidgets import QLabel, QStatusBar

from app.core.precision.words import plan_words
from app.ui import words
from app.ui.engine_client import EngineClient
from app.ui.state import AppState
from app.ui.widgets import ElidedLabel


class StatusLine:
    """The status bar's permanent parts, read from `state` and `client` on `update`.
    `checking_device` says whether the device is being described now (the Devices page's
    job), without building that page."""

    def __init__(
        self,
        bar: QStatusBar,
        state: AppState,
        client: EngineClient,
        checking_device: Callable[[], bool],
    ) -> None:
        self.state = state
        self.client = client
        self._checking_device = checking_device
        self.engine_status = QLabel()
        self.device_status = QLabel()
        self.model_status = QLabel()
        self.precision_status = QLabel()
        for widget in (
            self.engine_status,
            self.device_status,
            self.model_status,
            self.precision_status,
        ):
            widget.setContentsMargins(6, 0, 6, 0)
            bar.addPermanentWidget(widget)
        # The last thing a page said (what the last image was made as, a file that could not
        # be read): it takes the room left and is cut, never widening the window.
        self.message_status = ElidedLabel()
        self.message_status.setContentsMargins(6, 0, 6, 0)
        bar.addPermanentWidget(self.message_status, 1)

    def say(self, sentence: str) -> None:
        """One sentence in the status bar, ending in "…" where it is cut (the whole of it in
        its tooltip)."""
        self.message_status.set_full_text(sentence)

    def update(self) -> None:
        """Read the engine, the device, the model and the precision again."""
        engine = self.client.state
        self.engine_status.setText(f"Engine: {engine}")
        device = self.state.device_report()
        if device is not None:
            self.device_status.setText(f"Device: {device.name}")
        else:
            chosen = self.state.device()
            self.device_status.setText(
                (
                    "Device: checking…"
                    if self._checking_device()
                    else "Device: auto (not checked yet)"
                )
                if chosen == "auto"
                else f"Device: {chosen}"
            )
        model = self.state.model
        if model is None:
            self.model_status.setText("Model: none loaded")
        else:
            self.model_status.setText(f"Model: {model.name or model.source}")
        if self.state.effective:
            self.precision_status.setText(f"Precision: {self.state.effective}")
            self.precision_status.setToolTip("What the last job actually ran with.")
        else:
            plan = self.state.expected_plan()
            self.precision_status.setText(
                "Precision: "
                + (plan_words(plan) if plan is not None else self._settings_with_remembered())
            )
            self.precision_status.setToolTip(
                "What the next job will use: your settings with Auto resolved for this "
                "computer and the loaded model (its needs and its remembered fix)."
            )

    def _settings_with_remembered(self) -> str:
        """The next job's precision while the device is not known: the settings, with the
        loaded model's remembered fix where they leave its fields to it (Auto, off, empty),
        as a job lays it over them; the banner under a repaired image says the same fix."""
        values = self.state.settings.to_dict()
        model = self.state.model
        fix = model.remembered_fix if model is not None else None
        for key, value in (fix.settings if fix is not None else {}).items():
            if values.get(key) in ("auto", False, None, []):
                values[key] = value
        return words.precision_summary(values, parts=self.state.components())
