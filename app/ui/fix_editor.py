"""The dialog that edits a remembered fix's layer lists (Edit on the Fixes page): each list checked
as any setting is, and against the model's own layers when that model is loaded, before it is
saved."""

from __future__ import annotations

import html
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QLabel,
    QPlainTextEdit,
    QVBoxLayout,
    QWidget,
)

from app.core.fixing import profiles
from app.core.models.summary import ModelSummary
from app.core.settings import FIELDS
from app.core.settings.values import setting_entries
from app.ui import words
from app.ui.fixes_rows import LearnedRow
from app.ui.widgets import label

# The parts of a fix that name a model's own layers: what Edit changes.
LAYER_KEYS = tuple(key for key, f in FIELDS.items() if f.kind == "modules")


class FixEditor(QDialog):
    """Edit the layer lists of one remembered fix: one entry (COMPONENT:PATH) a line per list,
    each checked by the settings schema before anything is saved. `saved(RememberedFix)` is
    emitted once the change is in profiles.json."""

    saved = Signal(object)

    def __init__(
        self, row: LearnedRow, parent: QWidget | None = None, model: ModelSummary | None = None
    ) -> None:
        super().__init__(parent)
        assert row.stored is not None
        self.stored = row.stored
        self.model = model  # the fix's model when it is loaded: its layers are known
        self.setWindowTitle(f"Edit the fix of {row.name}")
        self.resize(640, 480)
        layout = QVBoxLayout(self)
        layout.addWidget(
            label(
                f"On {html.escape(row.device)}. One layer a line, as COMPONENT:PATH (e.g. "
                "vae:decoder.up_blocks.0.resnets.0.conv1). Re-verify afterwards to prove the "
                "changed fix.",
                "muted",
                wrap=True,
            )
        )
        self.editors: dict[str, QPlainTextEdit] = {}
        settings = self.stored.fix.settings
        for key in LAYER_KEYS:
            layout.addWidget(QLabel(FIELDS[key].label))
            editor = QPlainTextEdit("\n".join(setting_entries(settings, key)))
            editor.setToolTip(FIELDS[key].help)
            self.editors[key] = editor
            layout.addWidget(editor)
        self.problem = label("", "invalid", wrap=True)
        self.problem.setTextFormat(Qt.TextFormat.PlainText)
        layout.addWidget(self.problem)
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel
        )
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)

    def settings(self) -> dict[str, Any]:
        """The fix as edited: its other settings kept, each layer list validated (ValueError
        naming the list otherwise), empty lists left out."""
        values = {k: v for k, v in self.stored.fix.settings.items() if k not in LAYER_KEYS}
        for key, editor in self.editors.items():
            entries = [line.strip() for line in editor.toPlainText().splitlines() if line.strip()]
            try:
                checked = FIELDS[key].validate(entries)
            except ValueError as error:
                raise ValueError(f"{FIELDS[key].label}: {error}") from None
            unknown = self.model.unknown_layers(checked) if self.model is not None else []
            if unknown and self.model is not None:
                verb = "is not a layer" if len(unknown) == 1 else "are not layers"
                raise ValueError(
                    f"{FIELDS[key].label}: {', '.join(unknown)} {verb} of {self.model.name}"
                )
            if checked:
                values[key] = checked
        return values

    def accept(self) -> None:
        try:
            settings = self.settings()
            fix = profiles.change_fix(
                self.stored, settings, words.fix_short(settings, self.stored.fix.parts)
            )
        except ValueError as error:
            self.problem.setText(f"Not saved: {error}.")
            return
        except KeyError:
            self.problem.setText("Not saved: this fix was forgotten meanwhile.")
            return
        except OSError as error:
            self.problem.setText(f"Not saved: {error.strerror or error}.")
            return
        self.saved.emit(fix)
        super().accept()
