"""The Health check page's controls above its report: Run, the probe size, Cancel, Export and
Copy in one row, the check's bar and stage line in the row under it, and the fix's row (Apply fix,
and what it says of the next job). The page connects their signals to its own slots."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.ui import folders
from app.ui.widgets import label, primary_button

PROBE_SIZES = (256, 512, 768, 1024)


class CheckControls(QWidget):
    """The two rows over the report: the buttons and the probe size, then the bar and the
    stage line; they space as the page's own rows do (`spacing`)."""

    def __init__(self, spacing: int, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.run_button = primary_button("Run health check")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.progress = QProgressBar()
        self.progress.setTextVisible(False)
        self.progress.setMaximumWidth(220)
        self.progress.hide()
        self.stage = label("", "muted")
        self.export_button = QPushButton("Export Markdown…")
        self.copy_button = QPushButton("Copy report")
        self.copy_button.setToolTip(
            "Copy the report as Markdown, ready to paste into a bug report."
        )
        self.set_exportable(False)
        self.size_choice = QComboBox()
        self.size_choice.setToolTip(
            "The image size the check runs at. Activations grow with size, so check at the "
            "largest size you generate at; smaller is quicker."
        )
        self.size_choice.addItem("At the model's size", None)
        for size in PROBE_SIZES:
            self.size_choice.addItem(f"At {size}×{size} px", size)

        rows = QVBoxLayout(self)
        rows.setContentsMargins(0, 0, 0, 0)
        rows.setSpacing(spacing)
        controls = QHBoxLayout()
        controls.addWidget(self.run_button)
        controls.addWidget(self.size_choice)
        controls.addWidget(self.cancel_button)
        controls.addStretch(1)
        controls.addWidget(self.export_button)
        controls.addWidget(self.copy_button)
        rows.addLayout(controls)
        # Progress has a row of its own, so a long stage never crushes the buttons.
        running = QHBoxLayout()
        running.addWidget(self.progress)
        running.addWidget(self.stage, 1)
        rows.addLayout(running)

    def start(self) -> None:
        """A check started: Run idle, Cancel usable, the bar busy."""
        self.run_button.setEnabled(False)
        self.cancel_button.setEnabled(True)
        self.progress.setRange(0, 0)
        self.progress.show()
        self.stage.setText("Starting…")

    def finish(self, text: str, can_run: bool) -> None:
        """The check ended, as `text` says: Cancel idle, Run usable again if `can_run`."""
        self.cancel_button.setEnabled(False)
        self.run_button.setEnabled(can_run)
        self.progress.hide()
        self.stage.setText(text)

    def set_exportable(self, exportable: bool) -> None:
        """Export and Copy, usable while a report's Markdown is shown."""
        for button in (self.export_button, self.copy_button):
            button.setEnabled(exportable)


class FixActions(QWidget):
    """Apply fix, beside what the row says of the next job (`FixRow` says it). It sits above
    the scrolling report, with the verdict it acts on: at 1024×700 the fix card's tables would
    push it out of sight."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        actions = QHBoxLayout(self)
        actions.setContentsMargins(0, 0, 0, 0)
        self.apply_button = primary_button("Apply fix")
        self.apply_button.setToolTip(
            "Use this fix from the next job on: layer lists are remembered for this model, "
            "other settings are written into your settings."
        )
        self.applied_label = label("", "muted", wrap=True)
        actions.addWidget(self.apply_button)
        actions.addWidget(self.applied_label, 1)


def export_path(parent: QWidget, model_name: str) -> str:
    """Where to save the report of `model_name`, asked in a save dialog ("" if cancelled)."""
    path, _ = QFileDialog.getSaveFileName(
        parent,
        "Export health report",
        str(Path(folders.documents()) / f"halfsafe-health-{model_name}.md"),
        "Markdown (*.md);;All files (*)",
    )
    return path


def write_markdown(path: str, markdown: str) -> str:
    """Write `markdown` to `path`; the sentence saying why it could not be, or ""."""
    try:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(markdown)
    except OSError as error:
        return f"{path}: the report could not be written ({error.strerror or error})."
    return ""
