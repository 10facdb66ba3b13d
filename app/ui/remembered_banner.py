"""The Models page's banner for the loaded model's remembered fix: what the load found (or, where
a generation has repaired an image since, the fix remembered now; never an old one), with a
button that applies it to the settings, and, said once by the load that found it, that the
remembered fixes' file was damaged and kept aside."""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

from PySide6.QtWidgets import QWidget

from app.core.models.summary import ModelSummary
from app.ui.browser import ModelHealth, health_key
from app.ui.dialogs import Dialogs
from app.ui.model_words import applied_words, remembered_words
from app.ui.state import AppState
from app.ui.widgets import Banner


class RememberedFixBanner(Banner):
    """Shows a model's remembered fix; its button applies the fix to the shared state."""

    def __init__(self, state: AppState, dialogs: Dialogs, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state = state
        self.dialogs = dialogs

    def show_loaded(self, model: ModelSummary) -> None:
        """What the load of `model` found: its remembered fix, and the damaged file's notes."""
        fix = model.remembered_fix
        # The remembered fixes' file was damaged and kept aside: said once, by this load.
        damage = "".join(f"<br>{html.escape(n)}" for n in model.profile_notes)
        if fix is not None and fix.settings:
            self.show_fix(fix.settings, fix.summary, model.remembered_on, damage)
        elif damage:
            self.show_message("warn", damage.removeprefix("<br>"))

    def show_fix(
        self, settings: dict[str, Any], summary: str, on: str | None, damage: str = ""
    ) -> None:
        model = self.state.model
        parts = model.components if model is not None else ()
        self.show_message(
            "warn" if damage else "info",
            remembered_words(settings, summary, on, parts) + damage,
            [("Apply to my settings", lambda s=settings: self.apply(s))],
        )

    def refresh(self, health: Mapping[str, ModelHealth], source: str | None, loading: bool) -> None:
        """The loaded model's (from `source`) remembered fix as saved now (`health`), where it
        is not the one its load found (a generation that repaired an image remembers its
        repair): never an old fix, nothing while a load runs."""
        model = self.state.model
        if model is None or not source or loading:
            return
        device = self.state.device_report()
        here = device.name if device is not None else model.remembered_on
        saved = health.get(health_key(source))
        if saved is None or not saved.fix_settings or saved.fix_on != here:
            return
        known = model.remembered_fix
        if known is not None and dict(known.settings) == saved.fix_settings:
            return
        self.show_fix(saved.fix_settings, saved.fix_summary, saved.fix_on)

    def apply(self, settings: dict[str, Any]) -> None:
        try:
            self.state.apply(settings)
        except ValueError as error:
            self.dialogs.error(f"The remembered fix could not be applied: {error}.")
            return
        self.show_message("good", applied_words(settings, self.state.components()))
