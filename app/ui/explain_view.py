""" "Why was this image black?": a dialog that runs an `explain` job on a dropped or opened
image and shows the answer, the model it found (or where it looked, with a button to add the
folder it is in and look again, and meanwhile what to try in the tool that made the image, said
as likely), and the fix in the terms of that tool, ready to copy. The dialog grows to its
answer, up to the screen; past that the answer scrolls. What it says is `explain_words`', and
its Fix card (copy, save the ComfyUI workflow, install the nodes) is `explain_fix`'s."""

from __future__ import annotations

import html
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QSize, Qt, QTimer
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QHBoxLayout,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.core.explain import Explanation, remake
from app.core.explain.remake import REMADE_STATUSES
from app.core.requests.records import ExplainRequest
from app.engine.events import EngineEvent, EventState
from app.ui import folders
from app.ui.dialogs import Dialogs
from app.ui.engine_client import EngineClient
from app.ui.explain_fix import FixCard
from app.ui.explain_words import next_steps_words, title_for, verdict
from app.ui.on_screen import keep_on_screen
from app.ui.widgets import Banner, Card, label, plain_scroll, show_progress

WIDTH = 680  # wide enough for a model path and a tool's flags on one line
MARGIN = 80  # what the dialog leaves free of the screen's height


class ExplainDialog(QDialog):
    """One image's explanation. Submits the `explain` job when built; the engine does the work
    (reading the file, the library scan, the check), the dialog only shows the result. A job
    that fails (a bad or hostile file) closes the dialog and its one sentence goes to `Dialogs`.
    """

    def __init__(
        self,
        path: str,
        client: EngineClient,
        dialogs: Dialogs,
        device: str,
        parent: QWidget,
        add_model_folder: Callable[[str], None] | None = None,
        loaded: tuple[str, str] | None = None,
    ) -> None:
        super().__init__(parent)
        self.path = path
        # The model the engine holds, as (source, name): offered for an image that names no
        # model it can find. `model` is the one the user chose for this image, if any.
        self.loaded = loaded
        self.model: str | None = None
        self.remake = False  # make the image again from its record and compare (`remake`)
        self.client = client
        self.dialogs = dialogs
        self.device = device
        self.add_model_folder = add_model_folder
        self.explanation: Explanation | None = None
        self.closed = False
        self.setWindowTitle(f"What went wrong with {Path(path).name}?")  # until it is read
        self.setMinimumWidth(WIDTH)
        self.outer = outer = QVBoxLayout(self)
        self.body = body = QWidget()
        layout = QVBoxLayout(body)
        layout.setContentsMargins(0, 0, 0, 0)
        self.answer = plain_scroll(body)
        outer.addWidget(self.answer, 1)
        layout.addWidget(label(html.escape(Path(path).name), "section", rich=True))
        self.verdict = Banner()
        layout.addWidget(self.verdict)
        progress_row = QHBoxLayout()
        self.progress = QProgressBar()
        self.progress.setRange(0, 0)
        self.progress.setTextVisible(False)
        self.progress.setMaximumWidth(200)
        self.stage = label("Reading the image…", "muted")
        progress_row.addWidget(self.progress)
        progress_row.addWidget(self.stage, 1)
        layout.addLayout(progress_row)
        self.message = label("", wrap=True, selectable=True)
        layout.addWidget(self.message)
        self.model_card = Card("Model")
        self.model_text = label("", wrap=True, selectable=True)
        self.model_card.body.addWidget(self.model_text)
        self.add_folder_button = QPushButton("Add model folder…")
        self.add_folder_button.setToolTip(
            "Add the folder that holds this model to HalfSafe's model folders and look again."
        )
        self.add_folder_button.clicked.connect(self.choose_model_folder)
        self.add_folder_button.hide()
        model_buttons = QHBoxLayout()
        model_buttons.addWidget(self.add_folder_button)
        self.loaded_button = QPushButton()
        self.loaded_button.clicked.connect(lambda: self.check_with(self.loaded and self.loaded[0]))
        self.loaded_button.hide()
        model_buttons.addWidget(self.loaded_button)
        self.choose_model_button = QPushButton("Check with a model file…")
        self.choose_model_button.setToolTip(
            "The image does not lead to its model: name the file that made it, and the health "
            "check reproduces the image with it."
        )
        self.choose_model_button.clicked.connect(self.choose_model)
        self.choose_model_button.hide()
        model_buttons.addWidget(self.choose_model_button)
        self.remake_button = QPushButton("Make it again and compare")
        self.remake_button.setToolTip(
            "Make the image again from its record with this model and compare the two: tells "
            "colours inverted after the picture was made (a model kept loaded in the tool's "
            "memory) from a picture the model makes so. Nothing is saved."
        )
        self.remake_button.clicked.connect(self.make_again)
        self.remake_button.hide()
        model_buttons.addWidget(self.remake_button)
        model_buttons.addStretch(1)
        self.model_card.body.addLayout(model_buttons)
        self.model_card.hide()
        layout.addWidget(self.model_card)
        self.steps_card = Card("What to try")
        self.steps_body = label("", wrap=True, selectable=True)
        self.steps_body.setTextFormat(Qt.TextFormat.RichText)
        self.steps_card.body.addWidget(self.steps_body)
        self.steps_card.hide()
        layout.addWidget(self.steps_card)
        self.fix_card = FixCard(path, dialogs)
        # The card's parts, reachable as the dialog's own.
        self.fix_body = self.fix_card.fix_body
        self.copy_button = self.fix_card.copy_button
        self.save_workflow_button = self.fix_card.save_workflow_button
        self.install_nodes_button = self.fix_card.install_nodes_button
        self.installed_text = self.fix_card.installed_text
        layout.addWidget(self.fix_card)
        self.notes = label("", "muted", wrap=True, selectable=True)
        layout.addWidget(self.notes)
        layout.addStretch(1)
        self.buttons = buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        self.cancel_button = buttons.addButton("Cancel", QDialogButtonBox.ButtonRole.ActionRole)
        self.cancel_button.clicked.connect(self.cancel)
        buttons.rejected.connect(self.close)
        outer.addWidget(buttons)
        self.job_id: int | None = None
        self.explain()

    def explain(self) -> None:
        """Submit the `explain` job (again, after a model folder was added)."""
        self.progress.show()
        self.progress.setRange(0, 0)
        self.cancel_button.setEnabled(True)
        self.stage.setText("Reading the image…")
        request = ExplainRequest(self.path, self.device, self.model, remake=self.remake)
        self.job_id = self.client.submit(request, self._on_event)

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        """As tall as the answer at the dialog's width, up to the screen's height."""
        body = self.body
        margins = self.outer.contentsMargins()
        width = max(self.width(), WIDTH)
        inner = width - margins.left() - margins.right()
        wanted = body.heightForWidth(inner) if body.hasHeightForWidth() else -1
        if wanted < 0:
            wanted = body.sizeHint().height()
        buttons = self.buttons.sizeHint().height() + self.outer.spacing()
        height = wanted + margins.top() + margins.bottom() + buttons
        screen = self.screen().availableGeometry().height() if self.screen() else 900
        return QSize(width, min(height, screen - MARGIN))

    def fit_to_answer(self) -> None:
        """Grow (never shrink) to the answer's height: it arrives after the dialog showed."""
        hint = self.sizeHint()
        if hint.height() > self.height():
            self.resize(self.width(), hint.height())
            keep_on_screen(self)  # grown downwards: its buttons stay on the screen

    def choose_model_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(
            self, "The folder that holds this model", folders.models()
        )
        if folder:
            self.use_model_folder(folder)

    def choose_model(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self,
            "The model that made this image",
            folders.models(),
            "Models (*.safetensors *.gguf *.ckpt *.pt *.sft);;All files (*)",
        )
        if path:
            self.check_with(path)

    def check_with(self, model: str | None) -> None:
        """Explain the image again, checking it with `model` (a file or a built-in demo)."""
        if not model:
            return
        self.model = model
        for button in (self.loaded_button, self.choose_model_button, self.add_folder_button):
            button.hide()
        self.explain()

    def make_again(self) -> None:
        """Explain the image again, making it again from its record and comparing."""
        self.remake = True
        self.remake_button.hide()
        self.explain()

    def use_model_folder(self, folder: str) -> None:
        """Add `folder` to the model folders and explain the image again, looking there too."""
        if self.add_model_folder is None:
            return
        self.add_model_folder(folder)
        self.add_folder_button.hide()
        self.explain()

    def cancel(self) -> None:
        if self.job_id is not None:
            self.stage.setText("Cancelling…")
            self.client.cancel(self.job_id)

    def done(self, result: int) -> None:  # closing the dialog cancels its job
        job_id, self.job_id = self.job_id, None
        self.closed = True  # the job's last events may still come; nobody is here to see them
        if job_id is not None:
            self.client.cancel(job_id)
        super().done(result)

    def _finished(self, text: str) -> None:
        self.job_id = None
        self.progress.hide()
        self.cancel_button.setEnabled(False)
        self.stage.setText(text)

    def _on_event(self, event: EngineEvent) -> None:
        if self.closed:
            return
        if event.state == EventState.PROGRESS:
            show_progress(self.progress, event.done, event.total)
            self.stage.setText(f"{event.stage}…" if event.stage else "Working…")
        elif event.state == EventState.RESULT:
            self._finished("")
            self.show_result(event.result_as(Explanation))
        elif event.state == EventState.CANCELLED:
            self._finished("Cancelled.")
        elif event.state == EventState.ERROR:
            self._finished("The image could not be explained.")
            self.dialogs.job_failed(event)
            self.close()

    # Showing ----------------------------------------------------------------------------------

    def show_result(self, result: Explanation) -> None:
        self.explanation = result
        self.setWindowTitle(title_for(Path(self.path).name, result))
        self.verdict.show_message(*verdict(result))
        self.message.setText(result.message)
        model, record = result.model, result.record
        named = record.model or record.unet
        missing = not model.found and bool(named or record.model_hash)
        if model.found:
            self.model_text.setText(f"Found {model.path} (by {model.matched_by}).")
        elif missing:
            looked = "\n".join(model.looked_in) or "no model folders"
            self.model_text.setText(
                f"{named or record.model_hash} was not found. Looked in:\n{looked}"
            )
        else:
            self.model_text.setText("The image does not say which model made it.")
        self.add_folder_button.setVisible(missing and self.add_model_folder is not None)
        self.choose_model_button.setVisible(not model.found)
        if self.loaded is not None and not model.found:
            self.loaded_button.setText(f"Check with {self.loaded[1]}")
            self.loaded_button.setToolTip(
                "Reproduce the image with the model loaded now, if it is the one that made it."
            )
        self.loaded_button.setVisible(self.loaded is not None and not model.found)
        # A picture (not a NaN-black or flat image, which the check proves) whose record holds
        # what made it can be made again.
        self.remake_button.setVisible(
            model.found
            and not self.remake
            and result.status in REMADE_STATUSES
            and remake.missing(record) is None
        )
        self.model_card.show()
        self.steps_card.setVisible(result.next_steps is not None)
        if result.next_steps is not None:
            title, text = next_steps_words(result.next_steps, self.add_model_folder is not None)
            self.steps_card.title.setText(title)
            self.steps_body.setText(text)
        self.fix_card.node_fix = result.node_fix
        self.fix_card.setVisible(result.tool_fix is not None)
        if result.tool_fix is not None:
            self.fix_card.show_fix(result.tool_fix, result.halfsafe_flags)
        self.notes.setText("\n".join(result.notes))
        QTimer.singleShot(0, self.fit_to_answer)  # once the new text has its layout

    # The Fix card's actions, as the dialog's own --------------------------------------------

    @property
    def fix_text(self) -> str:
        """The fix as copied: the flags and the settings, one a line."""
        return self.fix_card.fix_text

    def copy_fix(self) -> None:
        self.fix_card.copy_fix()

    def save_workflow(self) -> None:
        self.fix_card.save_workflow()

    def save_workflow_to(self, path: str) -> None:
        """Write the workflow with HalfSafe Fix to `path`; a failure is one sentence."""
        self.fix_card.save_workflow_to(path)

    def install_nodes(self) -> None:
        self.fix_card.install_nodes()

    def install_nodes_into(self, folder: str) -> None:
        """Copy HalfSafe's nodes into the ComfyUI at `folder` (`FixCard.install_nodes_into`)."""
        self.fix_card.install_nodes_into(folder)
