"""The Models page's "Which file runs on this device" panel: a family chooser (the selected
model's family unless the user picks another) and, read-only, core's sentence for each stored
form the family is published in (`app.core.advice`, the record `halfsafe advise` prints).

Core's advice module (and the family registry it asks) is imported on the first answer, once
the device report has arrived: never to show the window."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QAbstractItemView, QComboBox, QHBoxLayout, QListWidget, QWidget

from app.ui.state import AppState
from app.ui.widgets import Card, label

if TYPE_CHECKING:
    from app.core.health.saved import SavedReport

TITLE = "Which file runs on this device"
CHOOSER_TIP = "The model family to advise on: by default the highlighted model's."
WAITING = "Waiting for the device report (the Devices page asks for it)."
LIST_HEIGHT = 150  # pixels: about five wrapped sentences, the rest a scroll away


class AdvicePanel(Card):
    """Shows `advise_on(family, state.hardware, state.device(), saved)` for the chosen family."""

    def __init__(self, state: AppState, parent: QWidget | None = None) -> None:
        super().__init__(TITLE, parent)
        self.state = state
        self.saved: list[SavedReport] = []
        self._wanted: str | None = None  # the highlighted model's architecture
        row = QHBoxLayout()
        self.family = QComboBox()
        self.family.setToolTip(CHOOSER_TIP)
        self.family.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.family.currentIndexChanged.connect(lambda _index: self.refresh())
        self.device_text = label(WAITING, "muted", wrap=True)
        row.addWidget(self.family)
        row.addWidget(self.device_text, 1)
        self.body.addLayout(row)
        self.sentences = QListWidget()
        self.sentences.setWordWrap(True)
        self.sentences.setAlternatingRowColors(True)  # where one form's sentence ends
        self.sentences.setSpacing(2)
        self.sentences.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.sentences.setVerticalScrollMode(QAbstractItemView.ScrollMode.ScrollPerPixel)
        self.sentences.setMaximumHeight(LIST_HEIGHT)
        self.body.addWidget(self.sentences)
        state.hardware_changed.connect(lambda _report: self.refresh())
        state.settings_changed.connect(lambda keys: self.refresh() if "device" in keys else None)

    def follow(self, architecture: str | None) -> None:
        """Advise on the family of `architecture` (the highlighted model's), when it has one."""
        self._wanted = architecture or None
        self.refresh()

    def set_saved(self, reports: Sequence[SavedReport]) -> None:
        """The saved check reports, read off the GUI thread: what the check proved here."""
        self.saved = list(reports)
        self.refresh()

    def refresh(self) -> None:
        hardware = self.state.hardware
        if hardware is None:
            return
        from app.core.advice import advise_on
        from app.core.errors import HalfSafeError

        self._fill_chooser()
        name = self.family.currentData()
        if not name:
            return
        try:
            advice = advise_on(name, hardware, self.state.device(), self.saved)
        except HalfSafeError as error:
            self.device_text.setText(str(error))
            self.sentences.clear()
            return
        self.device_text.setText(f"{advice.title} on {advice.device_words()}")
        self.sentences.clear()
        for form in advice.forms:
            self.sentences.addItem(form.sentence)
            item = self.sentences.item(self.sentences.count() - 1)
            if item is not None:
                item.setToolTip(form.sentence)
                item.setData(Qt.ItemDataRole.UserRole, form.form)

    def _fill_chooser(self) -> None:
        """The families, filled once; the chosen one moved to the wanted model's family."""
        if self.family.count() == 0:
            from app.core.advice import architecture_choices

            self.family.blockSignals(True)
            for name, title in architecture_choices():
                self.family.addItem(title, name)
            self.family.blockSignals(False)
        if self._wanted is None:
            return
        wanted, self._wanted = self._wanted, None
        for name in (wanted, wanted.split("-")[0]):
            index = self.family.findData(name)
            if index >= 0:
                self.family.blockSignals(True)
                self.family.setCurrentIndex(index)
                self.family.blockSignals(False)
                return
