"""The sampler setting as two choices, as AUTOMATIC1111 (Sampler, Schedule type) and ComfyUI
(sampler_name, scheduler) offer it: a dozen samplers, then the schedules the one chosen runs,
instead of one list of every pair. The setting keeps its one value (`dpmpp_2m_karras`), which
the request, the CLI and the settings file take as before."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QWidget

from app.core import samplers


class SamplerChoice(QWidget):
    """A sampler and its schedule. `changed(value)` fires on the user's changes only, with the
    setting's value for the pair. `note(sentence)` fires when a sampler the user picks does not
    run the schedule chosen: it runs its own instead, and the chosen one comes back with a
    sampler that runs it."""

    changed = Signal(str)
    note = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        self.sampler = QComboBox()
        self.sampler.setObjectName("sampler")
        for sampler in samplers.SAMPLERS:
            self.sampler.addItem(sampler.name, sampler.key)
        self.schedule = QComboBox()
        self.schedule.setObjectName("schedule")
        # Side by side, the two lists give way to a narrow form (their text elided) rather than
        # widen it past a small window.
        for combo in (self.sampler, self.schedule):
            combo.setSizeAdjustPolicy(
                QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon
            )
            combo.setMinimumContentsLength(8)
        self.setFocusProxy(self.sampler)  # a label's buddy, Tab: the sampler first
        row.addWidget(self.sampler, 3)
        row.addWidget(self.schedule, 2)
        self._setting = False
        # The schedule the user chose (None: the sampler's own), kept while a sampler that
        # does not run it is shown.
        self._wanted: str | None = None
        self._fill_schedules(None)
        self.sampler.currentIndexChanged.connect(self._sampler_changed)
        self.schedule.currentIndexChanged.connect(self._schedule_changed)

    def value(self) -> str:
        """The setting's value for the pair shown."""
        schedule = self.schedule.currentData()
        return samplers.join(str(self.sampler.currentData()), schedule or None)

    def set_value(self, value: object) -> bool:
        """Show the pair `value` names, without reporting it as the user's change; False (and
        nothing changed) for a value the table does not hold."""
        try:
            sampler, schedule = samplers.split(str(value))
        except KeyError:
            return False
        self._setting = True
        try:
            self.sampler.setCurrentIndex(self.sampler.findData(sampler.key))
            self._wanted = schedule.key if schedule else None
            self._fill_schedules(self._wanted)
        finally:
            self._setting = False
        return True

    def _fill_schedules(self, chosen: str | None) -> None:
        """The schedules the shown sampler runs, `chosen` selected where it runs it (else
        its own)."""
        sampler = samplers.BY_KEY[str(self.sampler.currentData())]
        blocked = self.schedule.blockSignals(True)
        try:
            self.schedule.clear()
            self.schedule.addItem(samplers.OWN_SCHEDULE_WORDS, "")
            for key in sampler.schedules:
                self.schedule.addItem(samplers.SCHEDULE_BY_KEY[key].name, key)
            self.schedule.setCurrentIndex(max(0, self.schedule.findData(chosen or "")))
        finally:
            self.schedule.blockSignals(blocked)

    def _sampler_changed(self, _index: int) -> None:
        if self._setting:
            return
        # The schedule chosen stays where the new sampler runs it (Karras from DPM++ 2M to
        # Euler), else it is the sampler's own, said, and comes back with one that runs it.
        wanted = self._wanted
        self._fill_schedules(wanted)
        sampler = samplers.BY_KEY[str(self.sampler.currentData())]
        if wanted is not None and wanted not in sampler.schedules:
            schedule = samplers.SCHEDULE_BY_KEY[wanted].name
            said = (
                f"{sampler.name} does not run the {schedule} schedule, so it runs its own "
                f"({samplers.OWN_SCHEDULE_WORDS}); {schedule} comes back with a sampler that "
                "runs it."
            )
            self.schedule.setToolTip(said)
            self.note.emit(said)
        else:
            self.schedule.setToolTip("")
        self.changed.emit(self.value())

    def _schedule_changed(self, _index: int) -> None:
        if not self._setting:
            self._wanted = self.schedule.currentData() or None
            self.schedule.setToolTip("")
            self.changed.emit(self.value())
