"""One setting's editor (a check box, a combo box, a spin box, a path or a folder list, as its
schema field says) and the words the settings page shows for a setting: its short explanation,
its tooltip, its choices."""

from __future__ import annotations

import html
import re
from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtGui import QRegularExpressionValidator
from PySide6.QtWidgets import (
    QAbstractSpinBox,
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QHBoxLayout,
    QLineEdit,
    QListWidget,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.core.settings import Field
from app.ui import folders, words
from app.ui.sampler_choice import SamplerChoice

INT32_MAX = 2**31 - 1

# A sentence ends at . ! or ? and a space, except after "e.g." and "i.e.".
_SENTENCE_END = re.compile(r"(?<!\be\.g\.)(?<!\bi\.e\.)(?<=[.!?])\s+(?=\S)")

# The value `auto` where an explanation names it: the page shows it as its combo boxes do.
_AUTO_VALUE = re.compile(r"'auto'|\bauto\b(?!-)")

# A value opening a clause of an explanation that goes through the choices ("off: keep the
# broken image and say why; ask: offer the fix; ..."), capitalised as its combo box shows it.
_CLAUSE_VALUE = re.compile(r"(^|; )(on|off|ask)\b")

# Choice names of one setting where the shared ones (`words.choice_name`) are another's: VAE
# tiling's off is not the NaN setting's "Off: keep it and say why".
_CHOICE_NAMES = {"vae_tiling": {"on": "On", "off": "Off"}}

# An inline explanation longer than this is cut at its first clause ("...: ", "...; ").
SHORT_EXPLANATION = 180


def shown_words(text: str) -> str:
    """An explanation as this page shows it: the value `auto` is "Auto", as in every combo box,
    and a value opening a clause ("off: ...; ask: ...") is capitalised (the schema's text keeps
    the words typed on the command line)."""
    text = _AUTO_VALUE.sub("Auto", text)
    return _CLAUSE_VALUE.sub(lambda m: m.group(1) + m.group(2).capitalize(), text)


def choice_words(key: str, choice: str) -> str:
    """A choice as the setting `key`'s combo box shows it."""
    return _CHOICE_NAMES.get(key, {}).get(choice) or words.choice_name(choice)


def short_explanation(text: str) -> str:
    """The one line shown under a setting: the explanation's first sentence, or, where that is
    long, its first clause followed by an ellipsis (the whole text is the tooltip)."""
    first = _SENTENCE_END.split(shown_words(text).strip(), maxsplit=1)[0]
    if len(first) <= SHORT_EXPLANATION:
        return first
    for clause in re.finditer(r"[:;] ", first):
        if clause.start() >= 20:  # not a leading "off: ..." naming one choice
            return first[: clause.start()] + "…"
    return first


def explanation_tip(text: str) -> str:
    """The whole explanation as a tooltip that wraps (Qt shows plain-text tips on one line)."""
    return f"<p>{html.escape(shown_words(text))}</p>"


def device_words(value: str) -> str:
    """A device setting as the page shows it: `auto` is "Auto", like every other Auto."""
    return "Auto" if value == "auto" else value


class FieldEditor(QWidget):
    """An input for one schema field. `edited(key, value)` fires on user changes only."""

    edited = Signal(str, object)

    def __init__(self, field: Field, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.field = field
        self._layout = QHBoxLayout(self)
        self._layout.setContentsMargins(0, 0, 0, 0)
        # An int too large for a spin box (the seed) is edited as text.
        self._big_int = field.kind == "int" and (field.maximum or 0) > INT32_MAX
        # The widget the field's kind calls for (a check box, combo box, spin box, line edit or
        # list): `value` and `set_value` dispatch on the kind, so it is typed loosely here.
        self.input: Any = self._build()
        self.input.setToolTip(explanation_tip(field.help))
        self.setToolTip(explanation_tip(field.help))

    # Building -------------------------------------------------------------------------------

    def _build(self) -> QWidget:
        f = self.field
        kind = f.kind
        if kind == "bool":
            box = QCheckBox()
            box.toggled.connect(lambda on: self._emit(bool(on)))
            self._layout.addWidget(box)
            self._layout.addStretch(1)
            return box
        if kind == "choice" and f.key == "scheduler":
            # A sampler and its schedule, two short lists (`SamplerChoice`), for one value.
            pair = SamplerChoice()
            pair.changed.connect(self._emit)
            self._layout.addWidget(pair)
            self._layout.addStretch(1)
            return pair
        if kind in ("choice", "device"):
            combo = QComboBox()
            combo.setMinimumWidth(220)
            if kind == "choice":
                for choice in f.choices:
                    combo.addItem(choice_words(f.key, choice), choice)
                combo.currentIndexChanged.connect(lambda _i: self._emit(combo.currentData()))
            else:
                combo.setEditable(True)
                combo.setInsertPolicy(QComboBox.InsertPolicy.NoInsert)
                for choice in ("auto", "cpu"):
                    combo.addItem(device_words(choice), choice)
                combo.activated.connect(lambda _i: self._emit(self.value()))
                line = combo.lineEdit()
                assert line is not None  # an editable combo box always has its line edit
                line.editingFinished.connect(lambda: self._emit(self.value()))
            self._layout.addWidget(combo)
            self._layout.addStretch(1)
            return combo
        if self._big_int:
            edit = QLineEdit()
            edit.setValidator(QRegularExpressionValidator(r"-?\d{0,10}"))
            edit.setMaximumWidth(160)
            edit.editingFinished.connect(self._emit_big_int)
            self._layout.addWidget(edit)
            self._layout.addStretch(1)
            return edit
        if kind == "int":
            spin = QSpinBox()
            spin.setRange(
                int(f.minimum if f.minimum is not None else -INT32_MAX),
                int(f.maximum if f.maximum is not None else INT32_MAX),
            )
            spin.setSingleStep(f.step or 1)
            spin.setKeyboardTracking(False)
            spin.setCorrectionMode(QAbstractSpinBox.CorrectionMode.CorrectToNearestValue)
            spin.setMinimumWidth(110)
            spin.valueChanged.connect(self._emit_int)
            self._layout.addWidget(spin)
            self._layout.addStretch(1)
            return spin
        if kind == "float":
            spin = QDoubleSpinBox()
            low = f.minimum if f.minimum is not None else -1e9
            high = f.maximum if f.maximum is not None else 1e9
            # A narrow range in finer steps: a strength of 0.01 to 1, an upscale of 1 to 4.
            span = high - low
            decimals = 2 if span <= 5 else 1
            spin.setDecimals(decimals)
            spin.setRange(low, high)
            spin.setSingleStep(0.05 if span <= 1 else 0.25 if span <= 5 else 0.5)
            spin.setKeyboardTracking(False)
            spin.setMinimumWidth(110)
            spin.valueChanged.connect(lambda v: self._emit(round(float(v), decimals)))
            self._layout.addWidget(spin)
            self._layout.addStretch(1)
            return spin
        if kind == "text":
            edit = QLineEdit()
            edit.editingFinished.connect(lambda: self._emit(edit.text()))
            self._layout.addWidget(edit)
            return edit
        if kind == "path":
            edit = QLineEdit()
            edit.setPlaceholderText("default")
            edit.editingFinished.connect(lambda: self._emit(edit.text().strip()))
            browse = QPushButton("Choose…")
            browse.clicked.connect(self._browse_path)
            self._layout.addWidget(edit, 1)
            self._layout.addWidget(browse)
            return edit
        if kind == "modules":
            edit = QLineEdit()
            edit.setPlaceholderText("none (COMPONENT:PATH, separated by spaces)")
            edit.editingFinished.connect(lambda: self._emit(edit.text().split()))
            self._layout.addWidget(edit, 1)
            return edit
        if kind == "paths":
            column = QVBoxLayout()
            folders = QListWidget()
            folders.setMaximumHeight(90)
            buttons = QHBoxLayout()
            add = QPushButton("Add folder…")
            add.clicked.connect(self._browse_folder)
            remove = QPushButton("Remove")
            remove.clicked.connect(self.remove_selected)
            buttons.addWidget(add)
            buttons.addWidget(remove)
            buttons.addStretch(1)
            column.addWidget(folders)
            column.addLayout(buttons)
            self._layout.addLayout(column, 1)
            return folders
        raise AssertionError(f"no editor for field kind {kind}")

    # Values ---------------------------------------------------------------------------------

    def value(self) -> Any:
        widget, kind = self.input, self.field.kind
        if kind == "bool":
            return widget.isChecked()
        if isinstance(widget, SamplerChoice):
            return widget.value()
        if kind == "choice":
            return widget.currentData()
        if kind == "device":
            # What is shown ("Auto") stands for what is saved ("auto"); anything else typed is
            # a device name, saved as typed.
            text = widget.currentText().strip()
            for row in range(widget.count()):
                if widget.itemText(row).lower() == text.lower():
                    return widget.itemData(row)
            return text
        if self._big_int:
            text = widget.text().strip()
            return int(text) if text not in ("", "-") else self.field.default
        if kind in ("int", "float"):
            return widget.value()
        if kind in ("text", "path"):
            return widget.text()
        if kind == "paths":
            return [widget.item(i).text() for i in range(widget.count())]
        if kind == "modules":
            return widget.text().split()
        raise AssertionError(kind)

    def set_value(self, value: Any) -> None:
        """Show `value` without reporting it as an edit."""
        widget, kind = self.input, self.field.kind
        widget.blockSignals(True)
        try:
            if kind == "bool":
                widget.setChecked(bool(value))
            elif isinstance(widget, SamplerChoice):
                widget.set_value(value)
            elif kind == "choice":
                widget.setCurrentIndex(max(0, widget.findData(value)))
            elif kind == "device":
                if widget.findData(value) < 0:
                    widget.addItem(device_words(str(value)), value)
                widget.setCurrentIndex(widget.findData(value))
            elif self._big_int:
                widget.setText(str(value))
            elif kind in ("int", "float"):
                widget.setValue(value)
            elif kind in ("text", "path"):
                widget.setText(str(value))
            elif kind == "paths":
                widget.clear()
                widget.addItems([str(v) for v in value])
            elif kind == "modules":
                widget.setText(" ".join(str(v) for v in value))
        finally:
            widget.blockSignals(False)

    def set_devices(self, names: list[str]) -> None:
        """Offer the devices this computer has (device editor only)."""
        if self.field.kind != "device":
            return
        current = self.value()
        self.input.blockSignals(True)
        for name in names:
            if self.input.findData(name) < 0:
                self.input.addItem(device_words(name), name)
        self.input.blockSignals(False)
        self.set_value(current)

    def add_folder(self, folder: str) -> None:
        folders = self.value()
        if folder and folder not in folders:
            self.set_value([*folders, folder])
            self._emit(self.value())

    def remove_selected(self) -> None:
        row = self.input.currentRow()
        if row >= 0:
            self.input.takeItem(row)
            self._emit(self.value())

    # Signals --------------------------------------------------------------------------------

    def _emit(self, value: Any) -> None:
        self.edited.emit(self.field.key, value)

    def _emit_int(self, value: int) -> None:
        step = self.field.step
        if step and value % step:
            value = int(round(value / step) * step)
            self.set_value(value)
        self._emit(int(value))

    def _emit_big_int(self) -> None:
        text = self.input.text().strip()
        if text in ("", "-"):
            self.set_value(self.field.default)
            text = str(self.field.default)
        self._emit(int(text))

    def _browse_path(self) -> None:
        folder = QFileDialog.getExistingDirectory(
            self, self.field.label, self.input.text() or folders.home()
        )
        if folder:
            self.input.setText(folder)
            self._emit(folder)

    def _browse_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Add a model folder", folders.home())
        if folder:
            self.add_folder(folder)
