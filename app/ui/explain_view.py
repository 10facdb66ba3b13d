""" "Why was this image black?": a dialog that runs an `explain` job on a dropped or opened
image and shows the answer, the model it found (or where it looked, with a button to add the
folder it is in and look again, and meanwhile what to try in the tool that made the image, said
as likely), and the fix in the terms of that tool, ready to copy. The dialog grows to its
answer, up to the screen; past that the answer scrolls."""

from __future__ import annotations

import html
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QSize, Qt, QTimer
from PySide6.QtGui import QGuiApplication
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

from app.core.errors import HalfSafeError
from app.core.explain import STATUS_WORDS, Explanation, findings, remake
from app.core.explain.next_steps import NextSteps, Switch, likely_words, rule_out_words
from app.core.explain.node_fix import NodeFix
from app.core.explain.remake import REMADE_STATUSES
from app.core.generation.records import IMAGE_STATUS_WORDS
from app.core.requests.records import ExplainRequest
from app.core.words.nodes import NODE_WORDS
from app.core.words.tools import TOOLS, ToolFix, setting_words
from app.engine.events import EngineEvent, EventState
from app.ui import folders, words
from app.ui.dialogs import Dialogs
from app.ui.engine_client import EngineClient
from app.ui.on_screen import keep_on_screen
from app.ui.widgets import Banner, Card, label, plain_scroll, show_progress

_STATUS_WORDS = {**IMAGE_STATUS_WORDS, **STATUS_WORDS}  # a generated image's, and explain's own
_LEVELS = {
    "nan": "bad",
    "nan_zeroed": "bad",
    "flat": "warn",
    "saturated": "bad",
    "noise": "bad",
    "noise_region": "bad",
    "inverted": "bad",
    "tiled_noise": "bad",
    "rgb_static": "bad",
    "false_colour": "bad",
    "unclaimed": "warn",
    "safety_checker": "warn",
    "black": "info",
    "ok": "good",
}
WIDTH = 680  # wide enough for a model path and a tool's flags on one line
MARGIN = 80  # what the dialog leaves free of the screen's height


def title_for(name: str, result: Explanation) -> str:
    """The dialog's title, by what the image looks like: black, grey, white, saturated, noise,
    one flat colour, or nothing wrong."""
    if result.status == "nan_zeroed":
        return f"Why is {name} grey?"
    if result.status == "inverted":
        return f"Why are the colours of {name} inverted?"
    pixels = result.pixels
    saturated = pixels.saturated
    if saturated:
        return f"Why is {name} {'white' if saturated.white else 'saturated'}?"
    look = findings.look_figures(pixels)
    if look is not None:  # tiled noise, RGB static, false colour (`looks`)
        return f"Why is {name} {findings.LOOK_NAMES[look[0]]}?"
    if pixels.noise_region or result.status == "noise_region":
        return f"Why is part of {name} noise?"
    if result.status in ("noise", "unclaimed"):
        return f"Why is {name} noise?"
    if pixels.clipped_white:
        return f"Why is {name} white?"  # clipped white is never "flat": read it here
    flat = pixels.flat
    if flat:
        low, high = min(flat.colour), max(flat.colour)
        look = (
            "white"
            if low >= 245
            else "black"
            if high <= 10
            else "grey"
            if high - low <= 8
            else "one flat colour"
        )
        return f"Why is {name} {look}?"
    if result.status == "ok":
        return f"{name}: nothing went wrong"
    return f"Why is {name} black?"


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
        self.fix_text = ""
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
        self.fix_card = Card("Fix")
        self.fix_body = label("", wrap=True, selectable=True)
        self.fix_body.setTextFormat(Qt.TextFormat.RichText)
        self.fix_card.body.addWidget(self.fix_body)
        self.copy_button = QPushButton("Copy the fix")
        self.copy_button.clicked.connect(self.copy_fix)
        # For a ComfyUI user: the image's workflow with HalfSafe Fix, and the nodes themselves.
        self.save_workflow_button = QPushButton("Save workflow…")
        self.save_workflow_button.setToolTip(
            "Save the image's workflow with HalfSafe Check and HalfSafe Fix placed after its "
            "model loader, to drop into ComfyUI."
        )
        self.save_workflow_button.clicked.connect(self.save_workflow)
        self.install_nodes_button = QPushButton("Install HalfSafe's nodes…")
        self.install_nodes_button.setToolTip(
            "Copy HalfSafe's node package into your ComfyUI's custom_nodes folder."
        )
        self.install_nodes_button.clicked.connect(self.install_nodes)
        fix_buttons = QHBoxLayout()
        for button in (self.copy_button, self.save_workflow_button, self.install_nodes_button):
            fix_buttons.addWidget(button)
        fix_buttons.addStretch(1)
        self.fix_card.body.addLayout(fix_buttons)
        self.installed_text = label("", "muted", wrap=True, selectable=True)
        self.installed_text.hide()
        self.fix_card.body.addWidget(self.installed_text)
        self.fix_card.hide()
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
        status, made_by = result.status, result.made_by
        tool = TOOLS[made_by].name if made_by in TOOLS else "an unknown tool"
        self.verdict.show_message(
            _LEVELS.get(status, "info"),
            f"<b>{html.escape(words.first_upper(_STATUS_WORDS.get(status, status)))}</b>"
            " · made by "
            f"{html.escape(tool)}",
        )
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
            self._show_next_steps(result.next_steps)
        self.fix_card.setVisible(result.tool_fix is not None)
        if result.tool_fix is not None:
            self._show_fix(result.tool_fix, result.halfsafe_flags)
            self._show_node_fix(result.node_fix)
        self.notes.setText("\n".join(result.notes))
        QTimer.singleShot(0, self.fit_to_answer)  # once the new text has its layout

    def _show_fix(self, for_tool: ToolFix, halfsafe_flags: list[str]) -> None:
        tool_key = for_tool.tool
        tool = TOOLS[tool_key].name if tool_key in TOOLS else tool_key
        lines: list[str] = []
        plain: list[str] = []
        flags = " ".join(for_tool.flags)
        if flags:
            lines.append(f"Start {html.escape(tool)} with <code>{html.escape(flags)}</code>")
            plain.append(flags)
        if tool_key == "halfsafe" and for_tool.settings:
            # HalfSafe's own settings by the names its Settings page shows them.
            lines.append("Or in Settings: " + html.escape(words.settings_listed(for_tool.settings)))
        else:
            for key, value in for_tool.settings.items():
                shown = setting_words(tool_key, key)
                setting = f"{key} = {value}" + (f" (“{shown}”)" if shown else "")
                lines.append(f"Set {html.escape(setting)}")
                plain.append(f"{key} = {value}")
        lines.append(html.escape(for_tool.how))
        if tool_key != "halfsafe" and halfsafe_flags:
            lines.append("In HalfSafe: <code>" + html.escape(" ".join(halfsafe_flags)) + "</code>")
        self.fix_card.title.setText(f"Fix in {tool}")
        self.fix_body.setText("<br>".join(lines))
        self.fix_text = "\n".join(plain)
        self.fix_card.show()

    def _show_node_fix(self, node_fix: NodeFix | None) -> None:
        """For a ComfyUI user: HalfSafe Fix first, the flags shown above as its fallback."""
        self.save_workflow_button.setVisible(node_fix is not None)
        self.install_nodes_button.setVisible(node_fix is not None)
        if node_fix is None:
            return
        lines = [
            f"<b>{html.escape(NODE_WORDS['title'])}</b> {html.escape(node_fix.workflow.how)}",
            html.escape(node_fix.fallback_words),
        ]
        if node_fix.also:
            also = NODE_WORDS["also"].format(flags=" ".join(node_fix.also))
            lines.append(html.escape(words.first_upper(also)) + ".")
        self.fix_body.setText("<br>".join([*lines, self.fix_body.text()]))

    def save_workflow(self) -> None:
        node_fix = self.explanation.node_fix if self.explanation is not None else None
        if node_fix is None:
            return
        suggested = str(Path(self.path).with_name(node_fix.file_name))
        path, _ = QFileDialog.getSaveFileName(
            self, "Save workflow", suggested, "ComfyUI workflow (*.json)"
        )
        if path:
            self.save_workflow_to(path)

    def save_workflow_to(self, path: str) -> None:
        """Write the workflow with HalfSafe Fix to `path`; a failure is one sentence."""
        node_fix = self.explanation.node_fix if self.explanation is not None else None
        if node_fix is None:
            return
        try:
            node_fix.save(path)
        except HalfSafeError as error:
            self.dialogs.error(str(error))
            return
        self._said(NODE_WORDS["saved"].format(path=path))

    def install_nodes(self) -> None:
        """Copy HalfSafe's nodes into the ComfyUI HalfSafe found; where it found none or
        several, say so and let the user name the folder."""
        from app.core.comfyui.install import found_comfyuis, where_to_install

        try:
            root = where_to_install(None)
        except HalfSafeError as error:
            self._said(str(error))
            found = found_comfyuis()
            start = str(found[0]) if found else folders.models()
            chosen = QFileDialog.getExistingDirectory(self, "Your ComfyUI folder", start)
            if chosen:
                self.install_nodes_into(chosen)
            return
        self.install_nodes_into(str(root))

    def install_nodes_into(self, folder: str) -> None:
        """Copy HalfSafe's nodes into the ComfyUI at `folder` and say what the user must then
        do; a folder that is not one is one sentence."""
        from app.core.comfyui.install import install_nodes

        try:
            installed = install_nodes(folder)
        except HalfSafeError as error:
            self.dialogs.error(str(error))
            return
        self._said(installed.words)

    def _said(self, text: str) -> None:
        self.installed_text.setText(text)
        self.installed_text.show()

    def _show_next_steps(self, steps: NextSteps) -> None:
        """What to try in the image's tool while its model is not found: likely, not proven."""
        tool = TOOLS[steps.tool].name
        why = "the model was not found" if steps.add_folder else "the image names no model"
        lines = [
            f"<b>Likely, not proven:</b> {why}, so nothing was reproduced. "
            + html.escape(likely_words(steps))
        ]
        rule_out = rule_out_words(steps)
        if rule_out:
            lines.append(html.escape(rule_out))
        number = 0
        for switch in steps.switches:
            step = _switch_html(steps.tool, switch)
            if switch.only_if:
                lines.append(f"Only if {html.escape(switch.only_if)}: {step[0].lower()}{step[1:]}")
            else:
                number += 1
                lines.append(f"{number}. {'' if number == 1 else 'Still black? '}{step}")
        if steps.switches:
            lines.append(html.escape(steps.how))
        if steps.add_folder:
            where = (
                "<b>Add model folder…</b> above"
                if self.add_model_folder is not None
                else "Settings &gt; Model folders"
            )
            lines.append(
                f"To know rather than guess: add the folder that holds the model ({where}) and "
                "the health check reproduces the image and verifies a fix."
            )
        self.steps_card.title.setText(f"What to try in {tool}")
        self.steps_body.setText("<br>".join(lines))

    def copy_fix(self) -> None:
        QGuiApplication.clipboard().setText(self.fix_text)


def _switch_html(tool_key: str, switch: Switch) -> str:
    """One switch in the tool's terms: its flags as code, its settings by the tool's labels."""
    parts = []
    if switch.flags:
        verb = "Run" if tool_key == "halfsafe" else "Start"
        tool = html.escape(TOOLS[tool_key].name)
        parts.append(f"{verb} {tool} with <code>{html.escape(' '.join(switch.flags))}</code>")
    for key, value in switch.settings.items():
        shown = setting_words(tool_key, key)
        setting = f"{key} = {value}" + (f" (“{shown}”)" if shown else "")
        parts.append(f"Set {html.escape(setting)}")
    words = " and ".join(parts)
    return f"{words} ({html.escape(switch.note)})" if switch.note else words
