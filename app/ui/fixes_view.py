"""The Fixes page: what HalfSafe has learned, per model and device (every remembered fix and
every saved health report), the selected one said in full below the list, with View, Re-verify,
Edit and Forget, and "Check all my models".

The lists are read from the data folder in this process (`profiles.stored_fixes`,
`saved.saved_reports`: plain files, no torch) each time the page is shown; checks run in the
engine (`CheckModelsRequest`), which keeps each report and loads the user's model again.
"""

from __future__ import annotations

import html
from typing import Any

from PySide6.QtWidgets import QDialog, QWidget

from app.core.fixing import profiles
from app.core.fixing.profiles import RememberedFix
from app.core.health import saved
from app.core.requests.library_check import ModelChecks
from app.core.requests.records import CheckModelsRequest
from app.core.settings import PrecisionSettings
from app.engine.events import EngineEvent, EventState
from app.ui.dialogs import Dialogs
from app.ui.engine_client import EngineClient
from app.ui.fix_editor import FixEditor
from app.ui.fixes_detail import at_words, detail_html, idle_words, reverify_words, run_words
from app.ui.fixes_panels import (
    RowActions,
    RunControls,
    detail_pane,
    fill_learned_table,
    fill_run_table,
    learned_split,
    report_viewer,
)
from app.ui.fixes_rows import _VERDICT_LEVEL, LearnedRow, learned_rows
from app.ui.fixes_state import forget_row, refresh_loaded
from app.ui.state import AppState
from app.ui.widgets import Banner, FittedTree, label, page_layout

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
        controls = RunControls()
        self.check_all_button = controls.check_all_button
        self.cancel_button = controls.cancel_button
        self.progress, self.stage = controls.progress, controls.stage
        self.controls = controls
        self.check_all_button.clicked.connect(self.check_all)
        self.cancel_button.clicked.connect(self.cancel)
        layout.addWidget(controls)

        self.notice = Banner()
        layout.addWidget(self.notice)

        self.table = FittedTree(COLUMNS, COLUMN_SHARES, GIVE_WAY)
        self.table.currentItemChanged.connect(lambda _c, _p: self._selection_changed())
        self.table.itemDoubleClicked.connect(lambda _item, _col: self.view())
        self.detail = detail_pane()
        self.split = learned_split(self.table, self.detail)
        layout.addWidget(self.split, 2)
        self.empty = label(
            "Nothing yet: run a health check on a model, or check all your models.", "muted"
        )
        layout.addWidget(self.empty)

        actions = RowActions()
        self.view_button, self.verify_button = actions.view_button, actions.verify_button
        self.edit_button, self.forget_button = actions.edit_button, actions.forget_button
        self.view_button.clicked.connect(self.view)
        self.verify_button.clicked.connect(self.reverify)
        self.edit_button.clicked.connect(self.edit)
        self.forget_button.clicked.connect(self.forget)
        layout.addWidget(actions)

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
        fill_learned_table(self.table, self.rows, selected)
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
        self.detail.setHtml(
            detail_html(row, self.state.model, self.state.recommended()) if row is not None else ""
        )

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
        viewer = report_viewer(row, self)
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
        device = self.state.device_report()
        idle = idle_words(fix, device)
        if idle:
            self.notice.show_message("warn", html.escape(idle))
            return None
        proved_at = fix.proved_at() if fix is not None else {}
        loaded = self.state.model
        # The precision the fix is for, in words, on this computer.
        fix_at = at_words(proved_at, self.state.recommended(), loaded) if fix is not None else ""
        swapping = loaded is None or loaded.profile_key != row.profile_key
        if swapping and not self.dialogs.confirm(
            "Re-verify",
            f"Load {row.name} to check it again?",
            reverify_words(row, loaded.name if loaded else None, fix, fix_at, device),
            yes="Re-verify",
        ):
            return None
        fixed = {
            **self.state.precision().to_dict(),
            **proved_at,
            **(fix.settings if fix is not None else {}),
        }
        self.verifying = row
        self.verifying_at = fix_at
        at = f" at {self.verifying_at} with its fix" if self.verifying_at else ""
        return self._submit(
            (source,), PrecisionSettings.from_mapping(fixed), f"Re-verifying {row.name}{at}…"
        )

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
        self.controls.start(stage)
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
        self.controls.finish()
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
        fill_run_table(self.run_table, run, self.rows)
        self.run_title.setText(run_words(run, self.state.settings["model_folders"]))
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
        refresh_loaded(self.state, row.stored, fix)
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
            forget_row(self.state, row)
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
