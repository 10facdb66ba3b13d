"""The Models page's "Which file runs on this device" panel: a family chooser (the selected
model's family unless the user picks another), core's answer (which file to take here, and why),
a table of the stored forms the family is published in (runs here?, card GB, RAM GB, proved by
a check?; each row's tooltip is the form's whole sentence) and, where the self-test has not
tried the int8 kernels other tools run, how to have them tried: the record `halfsafe advise`
prints (`app.core.advice`).

The panel shares the lower part of the page with the loaded model's card, as two tabs
(`lower_tabs`): at 1024x700 the two stacked left the answer a line and a half.

Core's advice module (and the family registry it asks) is imported on the first answer, once
the device report has arrived: never to show the window."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QHBoxLayout,
    QTabWidget,
    QTreeWidgetItem,
    QWidget,
)

from app.ui.state import AppState
from app.ui.widgets import Card, FittedTree, label

if TYPE_CHECKING:
    from app.core.health.saved import SavedReport

TITLE = "Which file runs on this device"
TAB = "Which file runs here"
DETAILS_TAB = "Loaded model"
CHOOSER_TIP = "The model family to advise on: by default the highlighted model's."
WAITING = "Waiting for the device report (the Devices page asks for it)."
COLUMNS = ("Form", "Runs here?", "Card GB", "RAM GB", "Proved by a check?")
ROW_TIP = "Hover a row for what this device does with that form and why."
ROWS_SHOWN = 7  # the table's height holds this many rows; a family with more scrolls
ROWS_AT_LEAST = 2  # and this many where the page is short of room


class AdvicePanel(Card):
    """Shows `advise_on(family, state.hardware, state.device(), saved)` for the chosen family."""

    def __init__(self, state: AppState, parent: QWidget | None = None) -> None:
        super().__init__(TITLE, parent)
        self.title.hide()  # the tab says it: the room goes to the answer
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
        self.answer = label("", wrap=True, selectable=True)
        self.answer.hide()
        self.body.addWidget(self.answer)
        self.table = FittedTree(COLUMNS, shares=(2, 3, 1, 1, 2), give_way=(1, 0))
        self.table.setToolTip(ROW_TIP)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.table.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.table.hide()
        self.body.addWidget(self.table)
        self.kernels = label("", "muted", wrap=True, selectable=True)
        self.kernels.hide()
        self.body.addWidget(self.kernels)
        self.body.addStretch(1)
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

    def rows_shown(self) -> list[tuple[str, ...]]:
        """The table's cells, row by row, as shown."""
        return [
            tuple(item.text(c) for c in range(len(COLUMNS)))
            for item in (self.table.topLevelItem(i) for i in range(self.table.topLevelItemCount()))
            if item is not None
        ]

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
            self._show("", [], "")
            return
        # The answer names the device; its facts are a hover away, the line kept for the answer.
        self.device_text.setText("")
        self.answer.setToolTip(f"{advice.title} on {advice.device_words()}")
        sentences = {form.form: form.sentence for form in advice.forms}
        rows = [(row.cells(), sentences.get(row.form, "")) for row in advice.table]
        self._show(advice.answer, rows, advice.kernels)

    def _show(self, answer: str, rows: list[tuple[tuple[str, ...], str]], kernels: str) -> None:
        self.answer.setText(answer)
        self.answer.setVisible(bool(answer))
        self.table.clear()
        for cells, sentence in rows:
            item = QTreeWidgetItem(list(cells))
            for column in range(len(COLUMNS)):
                item.setToolTip(column, sentence)
            self.table.addTopLevelItem(item)
        self.table.setVisible(bool(rows))
        self._fit_table_height(len(rows))
        self.kernels.setText(kernels)
        self.kernels.setVisible(bool(kernels))
        self._hold_text_height()

    def _fit_table_height(self, count: int) -> None:
        """The table as tall as its rows (ROWS_SHOWN at most) where the page has the room, and
        down to ROWS_AT_LEAST rows (the rest a scroll away) where it has not: the answer above
        it is never the one cut."""
        first = self.table.topLevelItem(0)
        row = self.table.visualItemRect(first).height() if first is not None else 0
        row = row or self.table.fontMetrics().height() + 6
        edges = self.table.header().sizeHint().height() + 2 * self.table.frameWidth() + 2
        rows = min(max(count, 1), ROWS_SHOWN)
        self.table.setMinimumHeight(edges + row * min(rows, ROWS_AT_LEAST))
        self.table.setMaximumHeight(edges + row * rows)

    def resizeEvent(self, event: Any) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        self._hold_text_height()

    def _hold_text_height(self) -> None:
        """A wrapped label's minimum height is its text's at its width: a layout short of room
        would otherwise squeeze the answer to a line and a half."""
        for text in (self.answer, self.kernels):
            wanted = text.heightForWidth(text.width()) if text.text() else 0
            if wanted > 0 and text.minimumHeight() != wanted:
                text.setMinimumHeight(wanted)

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


def lower_tabs(state: AppState, details: QWidget, advice: AdvicePanel) -> QTabWidget:
    """The loaded model's card and the advice panel as two tabs: the advice shows until a
    model is loaded, the loaded model's card from then on (the user may pick either)."""
    tabs = QTabWidget()
    tabs.setDocumentMode(True)
    tabs.addTab(details, DETAILS_TAB)
    tabs.addTab(advice, TAB)
    tabs.setCurrentWidget(advice)
    state.model_changed.connect(
        lambda model: tabs.setCurrentWidget(details if model is not None else advice)
    )
    return tabs
