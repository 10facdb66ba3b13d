"""The lower part of the Models page, below the list: what the highlighted file's metadata says,
the VAE the next load takes, the Load and Cancel buttons with the load's progress and status,
the remembered-fix banner (`remembered_banner`), and the loaded model's card beside the advice
panel (`advice_panel.lower_tabs`); and the question before a pickle checkpoint is opened. The
page connects the buttons and says what to show."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtWidgets import QHBoxLayout, QProgressBar, QPushButton, QVBoxLayout, QWidget

from app.core.demo import DEMO_LABEL, DEMO_MODELS
from app.core.models.summary import ModelSummary
from app.ui.advice_panel import AdvicePanel, lower_tabs
from app.ui.browser import card_lines
from app.ui.dialogs import Dialogs
from app.ui.model_words import NOT_LOADED, architecture_of, model_details, unloadable
from app.ui.remembered_banner import RememberedFixBanner
from app.ui.state import AppState
from app.ui.widgets import Card, label, primary_button, show_progress

DEMO_SOURCE = "demo"
# The page's spacing (`widgets.page_layout`): the panel's rows sit as the rows above them do.
PAGE_SPACING = 10


class LoadPanel(QWidget):
    """The widgets below the Models page's list, and how each shows what the page hands it."""

    def __init__(self, state: AppState, dialogs: Dialogs, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.dialogs = dialogs
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 4, 0, 0)
        layout.setSpacing(PAGE_SPACING)
        # What the highlighted file's metadata says: base model, trigger words, resolution.
        self.card_text = label("", "muted", wrap=True, selectable=True)
        self.card_text.hide()
        layout.addWidget(self.card_text)
        vae_row = QHBoxLayout()
        vae_row.addWidget(label("VAE:", "muted"))
        self.vae_label = label("the model's own", wrap=True)
        vae_row.addWidget(self.vae_label, 1)
        self.choose_vae_button = QPushButton("Use a separate VAE…")
        self.choose_vae_button.setToolTip(
            "Replace the model's VAE with another file, e.g. the fp16-fixed "
            "SDXL VAE. Applies to the next load."
        )
        self.clear_vae_button = QPushButton("Use the model's own")
        self.clear_vae_button.setEnabled(False)
        vae_row.addWidget(self.choose_vae_button)
        vae_row.addWidget(self.clear_vae_button)
        layout.addLayout(vae_row)

        load_row = QHBoxLayout()
        self.load_button = primary_button("Load")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.progress = QProgressBar()
        self.progress.setTextVisible(False)
        self.progress.setMaximumWidth(260)
        self.progress.hide()
        self.load_status = label("", "muted", wrap=True)
        load_row.addWidget(self.load_button)
        load_row.addWidget(self.cancel_button)
        load_row.addWidget(self.progress)
        load_row.addWidget(self.load_status, 1)
        layout.addLayout(load_row)

        self.remembered = RememberedFixBanner(state, dialogs)
        layout.addWidget(self.remembered)
        self.details = Card("No model loaded")
        # The bold model name takes the card's whole width and wraps there, never cut off.
        self.details.title.setWordWrap(True)
        self.details.header.setStretchFactor(self.details.title, 1)
        self.details_text = label(NOT_LOADED, wrap=True, selectable=True)
        self.details.body.addWidget(self.details_text)
        self.advice = AdvicePanel(state)
        self.lower_tabs = lower_tabs(state, self.details, self.advice)
        layout.addWidget(self.lower_tabs)

    def show_entry(self, entry: dict[str, Any] | None, busy: bool) -> None:
        """The highlighted row's library `entry` (None for none): its card's lines, the advice
        for its family, and Load where it can be loaded and no load runs (`busy`), or why not."""
        lines = card_lines((entry or {}).get("card"))
        self.advice.follow(architecture_of(entry or {}))
        self.card_text.setText("; ".join(lines))
        self.card_text.setVisible(bool(lines))
        problem = unloadable(entry or {})
        self.load_button.setEnabled(entry is not None and not problem and not busy)
        if problem:
            self.load_status.setText(problem)
        elif not busy:
            self.load_status.setText("")

    def show_vae(self, path: str | None) -> None:
        """The VAE file the next load takes (`path`), or the model's own (None)."""
        self.vae_label.setText(Path(path).name if path else "the model's own")
        self.vae_label.setToolTip(path or "")
        self.clear_vae_button.setEnabled(path is not None)

    def show_loading(self, name: str) -> None:
        """A load of the model `name` has started: busy bar, Cancel on, Load off."""
        self.load_button.setEnabled(False)
        self.cancel_button.setEnabled(True)
        self.progress.setRange(0, 0)
        self.progress.show()
        self.load_status.setText(f"Loading {name}…")

    def allows_pickle(self, name: str) -> bool:
        """Whether the user lets the pickle checkpoint `name` be opened; says so where not."""
        allowed = self.dialogs.confirm(
            "Open a pickle checkpoint?",
            f"{name} is a pickle checkpoint (.ckpt, .pt or .bin).",
            "Pickle files can carry code that runs when they are opened. HalfSafe opens them "
            "with PyTorch's weights-only loader, which refuses code, but open only files from "
            "a source you trust. A .safetensors version of the same model is always safer.",
            yes="Open it",
            no="Don't open",
        )
        if not allowed:
            self.load_status.setText(f"{name} was not opened.")
        return allowed

    def show_stage(self, done: int, total: int, stage: str) -> None:
        """How far the load has come: `done` of `total` in its `stage`."""
        show_progress(self.progress, done, total)
        if stage:
            self.load_status.setText(f"{stage}…")

    def show_stopped(self) -> None:
        """The load has ended, however it ended."""
        self.progress.hide()
        self.cancel_button.setEnabled(False)

    def show_model(self, model: ModelSummary | None, replaced_vae: str | None) -> None:
        """The loaded `model`'s card (with the VAE file that replaced its own, if any) and its
        remembered fix; the card of no model for None."""
        self.remembered.dismiss()
        if model is None:
            self.details.title.setText("No model loaded")
            self.details_text.setText(NOT_LOADED)
            return
        name = model.name or model.source
        if model.format == "demo" or model.source == DEMO_SOURCE:
            name = DEMO_MODELS.get(model.source or DEMO_SOURCE, DEMO_LABEL)
        self.details.title.setText(f"Loaded: {name}")
        self.details_text.setText(model_details(model, replaced_vae))
        self.remembered.show_loaded(model)
