"""How a model is chosen on the Models page besides its list: the row of Open file, Open folder
and Rescan folders with what the last scan found, the file dialogs (opened in the user's model
folder), and what the UI settings keep of the models loaded: the models opened from a file or
folder, listed after the scanned ones, newest first."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QFileDialog, QHBoxLayout, QLabel, QPushButton, QWidget

from app.core.demo import DEMO_MODELS
from app.ui import folders
from app.ui.widgets import label

OPENED_KEPT = 20  # models opened from a file or folder that stay in the list
CHECKPOINT_FILTER = (
    "Checkpoints (*.safetensors *.ckpt *.pt *.pth *.bin);;"
    "Safetensors (*.safetensors);;All files (*)"
)


def choice_row(
    open_file: Callable[[], object], open_folder: Callable[[], object], rescan: Callable[[], object]
) -> tuple[QHBoxLayout, QPushButton, QLabel]:
    """The row of Open file, Open folder and Rescan folders (each calling its function), and
    the library's status; returns the row, its Rescan button and the status."""
    row = QHBoxLayout()
    open_file_button = QPushButton("Open file…")
    open_file_button.clicked.connect(open_file)
    open_folder_button = QPushButton("Open folder…")
    open_folder_button.clicked.connect(open_folder)
    rescan_button = QPushButton("Rescan folders")
    rescan_button.setToolTip("Look again in your model folders (set them in Settings).")
    rescan_button.clicked.connect(rescan)
    status = label("", "muted")
    row.addWidget(open_file_button)
    row.addWidget(open_folder_button)
    row.addWidget(rescan_button)
    row.addWidget(status, 1)
    return row, rescan_button, status


def ask_checkpoint(parent: QWidget, title: str) -> str:
    """The checkpoint file the user picks in a dialog titled `title`; empty for none."""
    path, _ = QFileDialog.getOpenFileName(parent, title, folders.models(), CHECKPOINT_FILTER)
    return path


def ask_model_folder(parent: QWidget) -> str:
    """The diffusers model folder the user picks; empty for none."""
    return QFileDialog.getExistingDirectory(
        parent, "Open a diffusers model folder", folders.models()
    )


def opened_models(ui_settings: QSettings) -> list[str]:
    """Models opened from a file or folder, newest first."""
    value = ui_settings.value("models/opened", [])
    if isinstance(value, str):
        value = [value]
    return [str(v) for v in value if v] if isinstance(value, list) else []


def with_opened(entries: list[dict[str, Any]], ui_settings: QSettings) -> list[dict[str, Any]]:
    """The scanned library `entries`, then the models opened from a file or folder that they do
    not list."""
    listed = {str(Path(e["path"])) for e in entries}
    return list(entries) + [
        {"path": path, "error": None, "opened": True}
        for path in opened_models(ui_settings)
        if str(Path(path)) not in listed
    ]


def remember_opened(ui_settings: QSettings, source: str) -> bool:
    """Put the loaded model `source` first among the opened ones, unless it is a built-in demo;
    whether it was put there."""
    if source in DEMO_MODELS:
        return False
    kept = [source] + [p for p in opened_models(ui_settings) if p != source]
    ui_settings.setValue("models/opened", kept[:OPENED_KEPT])
    return True
