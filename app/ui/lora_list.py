"""The Generate page's LoRA list: files added with a per-LoRA weight, sent with each job; a
LoRA picked in the browser offers its trigger words to the prompt (a button, never silently)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import SIGNAL, Signal
from PySide6.QtGui import QGuiApplication
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

# The same bounds core checks (app.core.lora.files.MIN_WEIGHT/MAX_WEIGHT); the UI never imports
# torch-side modules, and these two numbers are part of the job contract.
MIN_WEIGHT, MAX_WEIGHT = -10.0, 10.0
FILE_FILTER = "LoRA files (*.safetensors *.sft);;All files (*)"


class LoraRow(QWidget):
    """One LoRA: its name (the full path as tooltip), its weight, a remove button, and for a
    LoRA with trigger words a button that adds them to the prompt."""

    removed = Signal(object)
    words_asked = Signal(str)

    def __init__(
        self,
        path: str,
        weight: float,
        trigger_words: tuple[str, ...] = (),
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.path = path
        self.trigger_words = trigger_words
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
        self.words_button = QToolButton()
        self.words_button.setText("+ words")
        self.words_button.setToolTip(
            "Add this LoRA's trigger words to the prompt: " + ", ".join(trigger_words)
        )
        self.words_button.clicked.connect(lambda: self.words_asked.emit(", ".join(trigger_words)))
        self.words_button.setVisible(bool(trigger_words))
        row.addWidget(self.words_button)
        row.addWidget(self.weight)
        row.addWidget(remove)


class LoraList(QWidget):
    """The LoRAs of the next job. `entries()` is what the engine's generate job takes.

    `add_to_prompt(str)` carries a LoRA's trigger words when the user asks for them; with
    nothing connected they are copied to the clipboard instead. `model_folders` and
    `model_family`, when the page sets them, say where the browser looks and which family it
    shows first."""

    changed = Signal()
    add_to_prompt = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.rows: list[LoraRow] = []
        self.model_folders: Callable[[], list[str] | None] | None = None
        self.model_family: Callable[[], str | None] | None = None
        self.browser: Any = None  # the LoRA browser while it is open
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
        self.browse_button = QPushButton("Browse LoRAs…")
        self.browse_button.setToolTip(
            "The LoRAs in the Lora folders beside your model folders, with their previews, "
            "base model and trigger words."
        )
        self.browse_button.clicked.connect(self.browse)
        buttons = QHBoxLayout()
        buttons.addWidget(self.browse_button)
        buttons.addWidget(self.add_button)
        column.addLayout(buttons)

    def add(self, path: str, weight: float = 1.0, trigger_words: tuple[str, ...] = ()) -> None:
        """Add a LoRA (a file already listed keeps its row and takes the new weight)."""
        for row in self.rows:
            if row.path == path:
                row.weight.setValue(weight)
                return
        row = LoraRow(path, weight, tuple(trigger_words), self)
        row.removed.connect(self._remove)
        row.words_asked.connect(self._offer_words)
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

    def browse(self) -> QWidget:
        """Open the LoRA browser (one at a time); the LoRA chosen there joins the list."""
        from app.ui.browser import LoraBrowser  # the readers it starts: not needed at launch

        if self.browser is not None:
            self.browser.raise_()
            self.browser.activateWindow()
            return self.browser
        folders = self.model_folders() if self.model_folders is not None else None
        family = self.model_family() if self.model_family is not None else None
        self.browser = LoraBrowser(folders, family, self.window())
        self.browser.chosen.connect(lambda path, words: self.add(path, 1.0, tuple(words)))
        self.browser.finished.connect(self._browser_closed)
        self.browser.open()
        return self.browser

    def _browser_closed(self, _result: int) -> None:
        if self.browser is not None:
            self.browser.deleteLater()
        self.browser = None

    def _offer_words(self, text: str) -> None:
        if self.receivers(SIGNAL("add_to_prompt(QString)")) > 0:
            self.add_to_prompt.emit(text)
            return
        clipboard = QGuiApplication.clipboard()
        if clipboard is not None:
            clipboard.setText(text)
        for row in self.rows:
            if row.trigger_words and ", ".join(row.trigger_words) == text:
                row.words_button.setToolTip(f"Copied to the clipboard: {text}")

    def _choose(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(self, "Add LoRA", folders.models(), FILE_FILTER)
        for path in paths:
            self.add(path)
