"""The Generate page's LoRA list: files added with a per-LoRA weight, sent with each job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QDoubleSpinBox,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.ui import folders

# The same bounds core checks (app.core.lora.MIN_WEIGHT/MAX_WEIGHT); the UI never imports
# torch-side modules, and these two numbers are part of the job contract.
MIN_WEIGHT, MAX_WEIGHT = -10.0, 10.0
FILE_FILTER = "LoRA files (*.safetensors *.sft);;All files (*)"


class LoraRow(QWidget):
    """One LoRA: its name (the full path as tooltip), its weight, a remove button."""

    removed = Signal(object)

    def __init__(self, path: str, weight: float, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.path = path
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        name = QLabel(Path(path).stem)
        name.setToolTip(path)
        self.weight = QDoubleSpinBox()
        self.weight.setRange(MIN_WEIGHT, MAX_WEIGHT)
        self.weight.setDecimals(2)
        self.weight.setSingleStep(0.05)
        self.weight.setValue(weight)
        self.weight.setToolTip("How strongly this LoRA applies (1 = as trained).")
        remove = QToolButton()
        remove.setText("✕")
        remove.setToolTip("Remove this LoRA")
        remove.clicked.connect(lambda: self.removed.emit(self))
        row.addWidget(name, 1)
        row.addWidget(self.weight)
        row.addWidget(remove)


class LoraList(QWidget):
    """The LoRAs of the next job. `entries()` is what the engine's generate job takes."""

    changed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.rows: list[LoraRow] = []
        column = QVBoxLayout(self)
        column.setContentsMargins(0, 0, 0, 0)
        self._rows_box = QVBoxLayout()
        column.addLayout(self._rows_box)
        self.add_button = QPushButton("Add LoRA…")
        self.add_button.setToolTip(
            "LoRA files in kohya/A1111 or diffusers/PEFT layout; a prompt's "
            "<lora:name:weight> tags work too."
        )
        self.add_button.clicked.connect(self._choose)
        column.addWidget(self.add_button)

    def add(self, path: str, weight: float = 1.0) -> None:
        """Add a LoRA (a file already listed keeps its row and takes the new weight)."""
        for row in self.rows:
            if row.path == path:
                row.weight.setValue(weight)
                return
        row = LoraRow(path, weight, self)
        row.removed.connect(self._remove)
        row.weight.valueChanged.connect(lambda _value: self.changed.emit())
        self.rows.append(row)
        self._rows_box.addWidget(row)
        self.changed.emit()

    def entries(self) -> list[dict[str, Any]]:
        return [{"path": row.path, "weight": round(row.weight.value(), 2)} for row in self.rows]

    def set_entries(self, entries: Any) -> None:
        """Replace the list; entries that are not {"path": str, "weight": number} are skipped
        (a damaged saved value costs only itself)."""
        for row in list(self.rows):
            self._remove(row)
        for entry in entries if isinstance(entries, list) else []:
            if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
                continue
            weight = entry.get("weight", 1.0)
            if isinstance(weight, bool) or not isinstance(weight, (int, float)):
                continue
            self.add(entry["path"], min(MAX_WEIGHT, max(MIN_WEIGHT, float(weight))))

    def _remove(self, row: LoraRow) -> None:
        if row in self.rows:
            self.rows.remove(row)
            row.setParent(None)
            row.deleteLater()
            self.changed.emit()

    def _choose(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(self, "Add LoRA", folders.models(), FILE_FILTER)
        for path in paths:
            self.add(path)
