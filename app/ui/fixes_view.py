"""The Fixes page: what HalfSafe has learned, per model and device (every remembered fix and
every saved health report), the selected one said in full below the list, with View, Re-verify,
Edit and Forget, and "Check all my models".

The lists are read from the data folder in this process (`profiles.stored_fixes`,
`saved.saved_reports`: plain files, no torch) each time the page is shown; checks run in the
engine (`CheckModelsRequest`), which keeps each report and loads the user's model again.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QHBoxLayout,
    QProgressBar,
    QPushButton,
    QSplitter,
    QTextBrowser,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.core.components import COMPONENTS, Verdict
from app.core.fixing import profiles
from app.core.fixing.profiles import RememberedFix, StoredFix
from app.core.fixing.quality import plain_figures
from app.core.health import saved
from app.core.precision import idle_settings
from app.core.requests.library_check import ModelChecks
from app.core.requests.records import CheckModelsRequest
from app.core.settings import FIELDS, PrecisionSettings
from app.engine.events import EngineEvent, EventState
from app.ui import words
from app.ui.dialogs import Dialogs
from app.ui.engine_client import EngineClient
from app.ui.fix_editor import LAYER_KEYS, FixEditor
from app.ui.fixes_rows import (
    _VERDICT_LEVEL,
    FP32_ONLY_WORDS,
    LearnedRow,
    _first_quality,
    cells,
    fix_quality,
    learned_rows,
    no_fix_cell,
    no_fix_words,
    place_of,
    quality_words,
    ran_only_in_fp32,
    report_words,
    same_row,
    tips,
    torch_of,
    verdict_words,
    verified_words,
)
from app.ui.state import AppState
from app.ui.widgets import Banner, FittedTree, label, page_layout, primary_button

COLUMNS = ("Model", "Device", "Fix", "Verified by", "Last check")
# How the spare width of a wide window is shared (the Fix column gets the most, the short
# device name none), and which columns give way, in turn, when the window is narrow: the
# model's name first (elided, whole in its tooltip), the Fix column never.
COLUMN_SHARES = (1, 0, 4, 1, 1)
GIVE_WAY = (0, 3, 4, 1)
RUN_COLUMNS = ("Model", "Verdict", "Fix, or why it was not checked")
RUN_SHARES = (1, 0, 3)
RUN_GIVE_WAY = (0, 2)


class FixesView(QWidget):
    """The Fixes page; see the module docstring."""

    def __init__(
        self, state: AppState, client: EngineClient, dialogs: Dialogs, parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self.state = state
        self.client = client
        self.dialogs = dialogs
        self.rows: list[LearnedRow] = []
        self.job_id: int | None = None
        self.verifying: LearnedRow | None = None
        self.verifying_at = ""  # the precision a Re-verify runs the fix at, in words
        self.windows: list[QDialog] = []  # open viewers and editors

        layout = page_layout(
            self,
            "Fixes",
            "What HalfSafe has learned about your models on each device: the fixes it "
            "remembers (used when a precision setting is left on Auto) and the last health "
            "check of each model. Re-verify runs the check again with the fix.",
        )
        controls = QHBoxLayout()
        self.check_all_button = primary_button("Check all my models")
        self.check_all_button.setToolTip(
            "Load each model in your model folders in turn and run the health check on it; "
            "the model you have loaded is loaded again at the end."
        )
        self.check_all_button.clicked.connect(self.check_all)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setToolTip(
            "Stop the run: the models checked so far keep their reports, and your model is "
            "loaded again."
        )
        self.cancel_button.clicked.connect(self.cancel)
        self.cancel_button.setEnabled(False)
        self.progress = QProgressBar()
        self.progress.setTextVisible(False)
        self.progress.setMaximumWidth(220)
        self.progress.hide()
        self.stage = label("", "muted", wrap=True)
        controls.addWidget(self.check_all_button)
        controls.addWidget(self.cancel_button)
        controls.addWidget(self.progress)
        controls.addWidget(self.stage, 1)
        layout.addLayout(controls)

        self.notice = Banner()
        layout.addWidget(self.notice)

        self.table = FittedTree(COLUMNS, COLUMN_SHARES, GIVE_WAY)
        self.table.currentItemChanged.connect(lambda _c, _p: self._selection_changed())
        self.table.itemDoubleClicked.connect(lambda _item, _col: self.view())
        # The selected row in full: the table says each fix in a few words, this says which
        # layers, at what precision, what proved it and how well.
        self.detail = QTextBrowser()
        self.detail.setObjectName("fix-detail")
        self.detail.setOpenLinks(False)
        self.detail.setMinimumHeight(120)
        self.detail.document().setDefaultStyleSheet(
            "h3 { margin-top: 0px; margin-bottom: 6px; } p { margin-top: 0px; margin-bottom: 6px; }"
            " ul { margin-top: 0px; margin-bottom: 6px; }"
        )
        self.split = QSplitter(Qt.Orientation.Vertical)
        self.split.setChildrenCollapsible(False)
        self.split.addWidget(self.table)
        self.split.addWidget(self.detail)
        self.split.setStretchFactor(0, 2)
        self.split.setStretchFactor(1, 3)
        layout.addWidget(self.split, 2)
        self.empty = label(
            "Nothing yet: run a health check on a model, or check all your models.", "muted"
        )
        layout.addWidget(self.empty)

        actions = QHBoxLayout()
        self.view_button = QPushButton("View")
        self.view_button.setToolTip("Open the saved health report and the fix in a window.")
        self.view_button.clicked.connect(self.view)
        self.verify_button = QPushButton("Re-verify")
        self.verify_button.clicked.connect(self.reverify)
        self.edit_button = QPushButton("Edit…")
        self.edit_button.setToolTip("Change the layers a fix keeps wider.")
        self.edit_button.clicked.connect(self.edit)
        self.forget_button = QPushButton("Forget…")
        self.forget_button.clicked.connect(self.forget)
        for button in (self.view_button, self.verify_button, self.edit_button, self.forget_button):
            actions.addWidget(button)
        actions.addStretch(1)
        layout.addLayout(actions)

        self.run_title = label("Last run", "muted")
        self.run_table = FittedTree(RUN_COLUMNS, RUN_SHARES, RUN_GIVE_WAY)
        layout.addWidget(self.run_title)
        layout.addWidget(self.run_table, 1)
        self.run_title.hide()
        self.run_table.hide()

        state.model_changed.connect(lambda _m: self._selection_changed())
        self._selection_changed()

    def showEvent(self, event: Any) -> None:  # noqa: N802 - Qt's name
        # Read when looked at: a check on another page may have added to the lists. What the
        # page said of its last action (saved, forgot, re-verified) is of then, not now.
        self.notice.dismiss()
        self.refresh()
        super().showEvent(event)

    # The list -----------------------------------------------------------------------------

    def refresh(self) -> None:
        """Read the remembered fixes and saved reports again and fill the table, keeping the
        selected row where it still exists."""
        fixes = profiles.stored_fixes()
        reports = saved.saved_reports()
        selected = self.selected()
        self.rows = learned_rows(fixes.fixes, reports.reports, self.state.model)
        # A model on one device under two torch versions: the cells say which is which.
        places = [(row.profile_key, row.device) for row in self.rows]
        self.table.clear()
        for row in self.rows:
            item = QTreeWidgetItem(cells(row, with_torch=places.count(place_of(row)) > 1))
            for column, tip in enumerate(tips(row)):
                item.setToolTip(column, tip)
            self.table.addTopLevelItem(item)
            if selected is not None and same_row(row, selected):
                self.table.setCurrentItem(item)
        first = self.table.topLevelItem(0)
        if self.table.currentItem() is None and first is not None:
            self.table.setCurrentItem(first)
        self.table.fit_columns()
        self.empty.setVisible(not self.rows)
        self.detail.setVisible(bool(self.rows))
        notes = fixes.notes + reports.notes
        if notes:
            more = f" (and {len(notes) - 1} more)" if len(notes) > 1 else ""
            self.notice.show_message("warn", html.escape(notes[0]) + more)
        self._selection_changed()

    def selected(self) -> LearnedRow | None:
        item = self.table.currentItem()
        index = self.table.indexOfTopLevelItem(item) if item is not None else -1
        return self.rows[index] if 0 <= index < len(self.rows) else None

    def _selection_changed(self) -> None:
        row = self.selected()
        running = self.job_id is not None
        self.view_button.setEnabled(row is not None)
        self.verify_button.setEnabled(row is not None and bool(self._source(row)) and not running)
        self.verify_button.setToolTip(
            "Check this model again, with its fix, on the device you use now."
            if row is None or self._source(row)
            else "HalfSafe does not know where this model's file is: load it on the Models "
            "page, then re-verify."
        )
        self.edit_button.setEnabled(row is not None and row.stored is not None)
        self.forget_button.setEnabled(row is not None)
        self.check_all_button.setEnabled(not running)
        self.detail.setHtml(self._detail_html(row) if row is not None else "")

    def _detail_html(self, row: LearnedRow) -> str:
        """The row in full: its fix's parts (each layer by name), the precision it was proved
        at, what proved it and when, how close it came to fp32, and the last check."""
        stored, report = row.stored, row.report
        torch = torch_of(row)
        parts = [
            f"<h3>{html.escape(row.name)}</h3>",
            _para("On", row.device + (f", torch {torch}" if torch else "")),
        ]
        if row.source and row.source != row.name:  # a built-in demo's source is its name
            parts.append(_para("File", row.source))
        if stored is None:
            parts.append(_para("Fix", no_fix_words(report)))
            if report is not None and report.fix_summary:
                parts.append(_para("The check found", report.fix_summary))
                quality = quality_words(report.fix_quality or _first_quality(report.fix_summary))
                if quality:
                    parts.append(_para("How well it worked", quality))
        else:
            fix = stored.fix
            said = words.fix_short(fix.settings, fix.parts or self._components_of(row))
            parts.append(_para("Fix", said or fix.summary, bold=True))
            parts.extend(self._fix_parts(row, fix.settings))
            at = self._at_words(fix.proved_at())
            parts.append(
                _para(
                    "Proved at",
                    f"{at}, the precision it is a fix for"
                    + ("" if fix.made_at else " (assumed: it was saved without it)")
                    + "; Re-verify runs it there.",
                )
            )
            parts.append(_para("Proved by", f"the {verified_words(fix)}."))
            parts.append(_para("How well it worked", fix_quality(fix)))
            # The sentence it was saved with, unless it only lists the settings said above.
            if fix.summary and fix.summary not in (
                said,
                words.fix_short(fix.settings, fix.parts),
                words.settings_listed(fix.settings),
            ):
                said = f"In the words of the {fix.verified_by}"
                parts.append(_para(said, fix.summary, quoted=True))
        if report is not None:
            headline = plain_figures(report.headline)
            # The verdict once: most headlines begin with it ("Fixable: at your settings ...").
            said = report_words(report)
            verdict = words.first_upper(report.verdict.value)
            if headline.startswith(verdict) and verdict == verdict_words(report):
                said = said.removeprefix(f"{verdict}, ")
            if ran_only_in_fp32(report):
                headline += " " + FP32_ONLY_WORDS
            parts.append(_para("Last check", f"{said}: {headline}"))
        else:
            parts.append(_para("Last check", "none kept for this model on this device."))
        return "".join(parts)

    def _components_of(self, row: LearnedRow) -> tuple[str, ...]:
        """The row's model's components where it is the loaded model (they say its fixes: a
        transformer's, not a UNet's), else none known."""
        model = self.state.model
        mine = model is not None and model.profile_key == row.profile_key
        return tuple(model.components) if model is not None and mine else ()

    def _fix_parts(self, row: LearnedRow, settings: Mapping[str, Any]) -> list[str]:
        """Which components a fix is about, what they do, each layer list by name, and the
        fix's other settings."""
        model = self.state.model
        mine = model is not None and model.profile_key == row.profile_key
        parts = []
        components = _fix_components(settings, model.components if model and mine else ())
        if components:
            where = "; ".join(
                f"{words.component_phrase(c)}, which {words.COMPONENT_ROLES.get(c, '')}"
                if words.COMPONENT_ROLES.get(c)
                else words.component_phrase(c)
                for c in components
            )
            parts.append(_para("Where", where + "."))
        for key in LAYER_KEYS:
            entries = [str(entry) for entry in settings.get(key) or ()]
            if not entries:
                continue
            parts.append(f"<p><b>{html.escape(FIELDS[key].label)}</b> ({len(entries)}):</p><ul>")
            for entry in entries:
                component, _, path = entry.partition(":")
                said = words.describe_module(component, path).removesuffix(
                    f", in {words.component_phrase(component)}"
                )
                parts.append(
                    f"<li><code>{html.escape(words.breakable(path or entry))}</code>"
                    + (f" in {html.escape(words.component_phrase(component))}" if path else "")
                    + (f": {html.escape(said)}" if said else "")
                    + "</li>"
                )
            parts.append("</ul>")
        others = {k: v for k, v in settings.items() if k not in LAYER_KEYS}
        if others:
            parts.append(_para("Settings it changes", words.settings_listed(others)))
        return parts

    def _source(self, row: LearnedRow) -> str:
        loaded, request = self.state.model, self.state.model_request
        if loaded is not None and request is not None and loaded.profile_key == row.profile_key:
            return request.source
        return row.source

    # View -------------------------------------------------------------------------------------

    def view(self) -> QDialog | None:
        """Show the row's saved report (its Markdown) and its fix's details."""
        row = self.selected()
        if row is None:
            return None
        parts = []
        if row.stored is not None:
            parts.append(_fix_markdown(row))
        if row.report is not None:
            parts.append(row.report.markdown)
        else:
            parts.append("No health check of this model on this device has been kept.")
        viewer = QDialog(self)
        viewer.setWindowTitle(f"{row.name} on {row.device}")
        viewer.resize(760, 640)
        layout = QVBoxLayout(viewer)
        text = QTextBrowser()
        text.setMarkdown("\n\n---\n\n".join(parts))
        layout.addWidget(text)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(viewer.reject)
        layout.addWidget(buttons)
        self._open(viewer)
        return viewer

    def _open(self, dialog: QDialog) -> None:
        self.windows.append(dialog)
        dialog.finished.connect(lambda _r, d=dialog: self._closed(d))
        dialog.open()

    def _closed(self, dialog: QDialog) -> None:
        if dialog in self.windows:
            self.windows.remove(dialog)
        dialog.deleteLater()

    # Re-verify and Check all ------------------------------------------------------------------

    def reverify(self) -> int | None:
        """Check the selected model again with its fix, at the precision the fix is for (a
        fix for fp16 checked at the fp32 of a CPU's Auto would pass without running), loading
        it in place of the user's model for the check after saying so; a fix this device
        cannot run is said, not checked."""
        row = self.selected()
        source = self._source(row) if row is not None else ""
        if row is None or not source or self.job_id is not None:
            return None
        fix = row.stored.fix if row.stored is not None else None
        idle = self._idle_here(fix)
        if idle:
            self.notice.show_message("warn", html.escape(idle))
            return None
        proved_at = fix.proved_at() if fix is not None else {}
        loaded = self.state.model
        swapping = loaded is None or loaded.profile_key != row.profile_key
        if swapping and not self.dialogs.confirm(
            "Re-verify",
            f"Load {row.name} to check it again?",
            _swap_words(loaded.name if loaded else None, row.name)
            + self._fix_words(fix, proved_at)
            + self._device_words(row),
            yes="Re-verify",
        ):
            return None
        fixed = {
            **self.state.precision().to_dict(),
            **proved_at,
            **(fix.settings if fix is not None else {}),
        }
        self.verifying = row
        self.verifying_at = self._at_words(proved_at) if fix is not None else ""
        at = f" at {self.verifying_at} with its fix" if self.verifying_at else ""
        return self._submit(
            (source,), PrecisionSettings.from_mapping(fixed), f"Re-verifying {row.name}{at}…"
        )

    def _at_words(self, proved_at: dict[str, Any]) -> str:
        """'fp16 everywhere': the precision a fix is for, on this computer."""
        model = self.state.model
        return words.precision_summary(
            proved_at, self.state.recommended(), model.components if model is not None else ()
        )

    def _fix_words(self, fix: RememberedFix | None, proved_at: dict[str, Any]) -> str:
        if fix is None:
            return ""
        at = self._at_words(proved_at)
        assumed = (
            ""
            if fix.made_at
            else " (it was saved without the precision it was proved at: fp16 is what "
            "HalfSafe's fixes are for)"
        )
        emulated = ""
        device = self.state.device_report()
        if device is not None and device.kind == "cpu" and "fp16" in at:
            emulated = " A CPU computes fp16 slowly, so this check takes longer than on a GPU."
        return (
            f" The check runs it at {at}, the precision the fix is for{assumed}, with the fix: "
            f"{words.first_lower(words.fix_short(fix.settings, fix.parts)) or 'none'}.{emulated}"
        )

    def _idle_here(self, fix: RememberedFix | None) -> str:
        """The sentence saying this device cannot prove `fix` (every setting it changes does
        nothing here); "" when it can."""
        device = self.state.device_report()
        if fix is None or device is None or not fix.settings:
            return ""
        idle = idle_settings(fix.settings, device.kind)
        if len(idle) < len(fix.settings):
            return ""
        return (
            f"This fix ({words.first_lower(words.fix_short(fix.settings, fix.parts))}) changes "
            f"only what a CUDA GPU runs, so a check on {device.name} cannot prove it: re-verify "
            "it on the GPU it was found on."
        )

    def _device_words(self, row: LearnedRow) -> str:
        device = self.state.device_report()
        if device is None or device.name == row.device:
            return ""
        return f" The check runs on {device.name}, the device you use now, not on {row.device}."

    def check_all(self) -> int | None:
        """Check every model in the library in turn (after saying what that does)."""
        if self.job_id is not None:
            return None
        loaded = self.state.model
        if not self.dialogs.confirm(
            "Check all my models",
            "Check every model in your model folders?",
            "HalfSafe loads each model in turn and runs the health check on it at its own size, "
            "which can take a while for large models; each report is kept here. "
            + (
                f"{loaded.name} is unloaded meanwhile and loaded again at the end."
                if loaded is not None
                else ""
            ),
            yes="Check all",
        ):
            return None
        self.verifying = None
        return self._submit(None, self.state.precision(), "Looking for models…")

    def _submit(
        self, models: tuple[str, ...] | None, precision: PrecisionSettings, stage: str
    ) -> int:
        request = CheckModelsRequest(
            models=models,
            folders=tuple(str(f) for f in self.state.settings["model_folders"]),
            precision=precision,
            device=self.state.device(),
            steps=int(self.state.settings["steps"]),
            scheduler=str(self.state.settings["scheduler"]),
        )
        self.stage.setText(stage)
        self.progress.setRange(0, 0)
        self.progress.show()
        self.cancel_button.setEnabled(True)
        self.job_id = self.client.submit(request, self._on_event)
        self._selection_changed()
        return self.job_id

    def cancel(self) -> None:
        if self.job_id is not None:
            self.stage.setText("Cancelling…")
            self.client.cancel(self.job_id)

    def _on_event(self, event: EngineEvent) -> None:
        if event.state == EventState.PROGRESS:
            if event.total > 0:
                self.progress.setRange(0, event.total)
                self.progress.setValue(event.done)
            if event.stage:
                self.stage.setText(f"{event.stage}…")
        elif event.state == EventState.RESULT:
            self._finish()
            self._show_run(event.result_as(ModelChecks))
        elif event.state == EventState.CANCELLED:
            self._finish()
            self.stage.setText("Cancelled.")
        elif event.state == EventState.ERROR:
            self._finish()
            self.stage.setText("The check did not finish.")
            self.dialogs.job_failed(event)

    def _finish(self) -> None:
        self.job_id = None
        self.progress.hide()
        self.cancel_button.setEnabled(False)
        self._selection_changed()

    def _show_run(self, run: ModelChecks) -> None:
        """The run's summary table, what it says of itself, the lists read again, and the
        model the engine holds now."""
        if (run.loaded, run.loaded_request) != (self.state.model, self.state.model_request):
            self.state.set_model(run.loaded, run.loaded_request)
        verifying, self.verifying = self.verifying, None
        if verifying is not None and len(run.rows) == 1:
            self._show_verified(verifying.name, run)
        self.refresh()  # the reports this run saved, which say what each check ran at
        newest: dict[str, saved.SavedReport] = {}
        for learned in self.rows:
            report = learned.report
            if report is not None and (
                report.source not in newest or report.saved_at > newest[report.source].saved_at
            ):
                newest[report.source] = report
        self.run_table.clear()
        for row in run.rows:
            verdict = words.first_upper(row.verdict.value) if row.verdict else "Not checked"
            detail = plain_figures(row.fix if row.verdict is not None else row.words)
            saved = newest.get(row.source)
            if saved is not None and saved.verdict is row.verdict:
                verdict, detail = verdict_words(saved), detail or no_fix_cell(saved)
            item = QTreeWidgetItem([row.name, verdict, detail or "None needed"])
            item.setToolTip(0, row.source)
            # The cell may be elided: the tooltip says it whole, and the check's headline.
            said = (detail, plain_figures(row.words))
            item.setToolTip(2, "\n".join(t for t in dict.fromkeys(said) if t))
            self.run_table.addTopLevelItem(item)
        self.run_title.setText(_run_words(run, self.state.settings["model_folders"]))
        self.run_title.show()
        self.run_table.setVisible(bool(run.rows))
        self.run_table.fit_columns()
        self.stage.setText("")

    def _show_verified(self, name: str, run: ModelChecks) -> None:
        row = run.rows[0]
        level = _VERDICT_LEVEL[row.verdict] if row.verdict is not None else "bad"
        at = f" at {self.verifying_at} with its fix" if self.verifying_at else ""
        self.notice.show_message(
            level,
            f"<b>Re-verified {html.escape(name)}{html.escape(at)}:</b> {html.escape(row.words)}",
        )

    # Edit and Forget --------------------------------------------------------------------------

    def edit(self) -> FixEditor | None:
        """Open the selected fix's layer lists for editing; saved only when valid."""
        row = self.selected()
        if row is None or row.stored is None:
            return None
        model = self.state.model  # the loaded model's layers check the edit, when it is this one
        if model is not None and model.profile_key != row.stored.profile_key:
            model = None
        editor = FixEditor(row, self, model)
        editor.saved.connect(lambda fix, r=row: self._edited(r, fix))
        self._open(editor)
        return editor

    def _edited(self, row: LearnedRow, fix: RememberedFix) -> None:
        assert row.stored is not None
        self._refresh_loaded(row.stored, fix)
        self.notice.show_message("good", f"Saved the fix of {html.escape(row.name)}.")
        self.refresh()

    def forget(self) -> bool:
        """Forget the selected row's fix and report, after asking."""
        row = self.selected()
        if row is None:
            return False
        what = " and ".join(
            thing
            for thing, there in (
                ("the remembered fix", row.stored is not None),
                ("the saved health report", row.report is not None),
            )
            if there
        )
        if not self.dialogs.confirm(
            "Forget",
            f"Forget {what} of {row.name} on {row.device}?",
            "Jobs with this model then run with your settings alone; the next health check "
            "finds and remembers a fix again."
            if row.stored is not None
            else "",
            yes="Forget",
        ):
            return False
        try:
            # Both forgotten before any page is told: the loaded model's summary changing
            # would have the Health check page read the saved report again, still there.
            if row.stored is not None:
                stored = row.stored
                profiles.forget_fix(stored.profile_key, stored.device, stored.torch_version)
            if row.report is not None:
                saved.forget_report(row.profile_key, row.device)
            if row.stored is not None:
                self._refresh_loaded(row.stored, None)
            self.state.forgotten.emit(row.profile_key)
        except OSError as error:
            self.dialogs.error(f"It could not be forgotten ({error.strerror or error}).")
        else:
            # What the page said of it (saved, re-verified) no longer holds: neither does the
            # last run's summary, whose rows were checked with what is now forgotten.
            self.notice.show_message(
                "info", f"Forgot {html.escape(what)} of {html.escape(row.name)}."
            )
            self.run_title.hide()
            self.run_table.hide()
        self.refresh()
        return True

    def _refresh_loaded(self, stored: StoredFix, fix: RememberedFix | None) -> None:
        """The loaded model's summary, when `stored` is its remembered fix, with `fix` instead
        (None: forgotten), as the engine's next summary of it would say. A fix forgotten also
        ends the status bar's account of the last job, which ran with it: the bar says what
        the next job will run with."""
        model = self.state.model
        if model is None or not self._is_loaded_models(stored):
            return
        changed = replace(
            model, remembered_fix=fix, remembered_on=stored.device if fix is not None else ""
        )
        self.state.set_model(changed, self.state.model_request)
        if fix is None and self.state.effective is not None:
            self.state.set_effective(None)

    def _is_loaded_models(self, stored: StoredFix) -> bool:
        """Whether `stored` is the fix the loaded model's next job looks up: its model, on
        the device and under the torch the engine runs. The summary's own fix may be older
        than the store's (a generation's repair is remembered after the load), so it is not
        what tells; it does where the engine's device or torch is not known yet."""
        model = self.state.model
        if model is None or model.profile_key != stored.profile_key:
            return False
        device = self.state.device_report()
        hardware = self.state.hardware
        if device is None or hardware is None:
            return model.remembered_on == stored.device and model.remembered_fix == stored.fix
        return device.name == stored.device and hardware.torch == stored.torch_version


def _fix_components(settings: Mapping[str, Any], loaded: Sequence[str] = ()) -> list[str]:
    """The components a fix's settings are about, in run order: those its layer lists name and
    those its per-component precisions set (the UNet or the transformer by `loaded`, the
    loaded model's components, when they are known)."""
    named: set[str] = set()
    for key, value in settings.items():
        if key in LAYER_KEYS:
            named.update(str(entry).partition(":")[0] for entry in value or ())
            continue
        if key == "no_half_vae" and value:
            named.add("vae")
        # A part that borrows its setting (Anima's text conditioner) is named after its owner.
        owners = [
            c.name
            for c in sorted(COMPONENTS.values(), key=lambda c: c.borrows_setting)
            if c.setting == key and c.part_of is None
        ]
        present = [name for name in owners if name in loaded]
        named.update((present or owners)[:1])
    return [name for name in COMPONENTS if name in named] + sorted(named - set(COMPONENTS))


def _para(title: str, text: str, bold: bool = False, quoted: bool = False) -> str:
    """One line of the detail pane: 'Title: text', the text in bold (what matters most) or in
    italics (a sentence quoted as it was saved)."""
    body = html.escape(text)
    body = f"<b>{body}</b>" if bold else f"<i>{body}</i>" if quoted else body
    return f"<p><b>{html.escape(title)}:</b> {body}</p>"


def _swap_words(loaded: str | None, name: str) -> str:
    if loaded is None:
        return f"HalfSafe loads {name}, runs the health check with its fix, and unloads it again."
    return (
        f"HalfSafe unloads {loaded}, loads {name} and runs the health check with its fix, then "
        f"loads {loaded} again."
    )


def _fix_markdown(row: LearnedRow) -> str:
    assert row.stored is not None
    stored = row.stored
    lines = [
        f"# The fix remembered for {row.name}",
        "",
        f"- **Device:** {stored.device} (torch {stored.torch_version})",
        f"- **What it does:** {stored.fix.summary}",
        f"- **Verified by:** {verified_words(stored.fix)}",
        "- **Settings:**",
    ]
    for key, value in stored.fix.settings.items():
        lines.append(f"    - {words.setting_label(key)}: {words.setting_value(key, value)}")
    return "\n".join(lines)


def _run_words(run: ModelChecks, folders: Sequence[str] = ()) -> str:
    """'Checked 3 models: 1 fixable, 2 healthy; 1 not checked.' and what else the run says; a
    run that found no model says why (no model folder, or none in them: the built-in demos are
    not among "my models")."""
    checked = [row for row in run.rows if row.verdict is not None]
    counts = {v: sum(1 for row in checked if row.verdict is v) for v in Verdict}
    parts = ", ".join(f"{n} {v.value}" for v, n in counts.items() if n)
    text = f"Checked {len(checked)} model{'s' if len(checked) != 1 else ''}"
    text += f": {parts}" if parts else ""
    skipped = len(run.rows) - len(checked) + run.not_checked
    if skipped:
        text += f"; {skipped} not checked"
    text += "."
    if not run.rows and not run.not_checked and not run.cancelled:
        text = text.removesuffix(".") + (
            ": no model folder is set. Add the folders that hold your models in Settings > "
            "Folders; the built-in demos are not checked here."
            if not folders
            else ": none was found in your model folders (" + ", ".join(folders) + "). The "
            "built-in demos are not checked here."
        )
    if run.cancelled:
        text += " Cancelled before the end."
    if run.restore_problem:
        text += f" {run.restore_problem}"
    return text
