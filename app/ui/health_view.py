"""The health check page: one click, a card per model part, a chart, and the fix with its cost."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QGraphicsOpacityEffect, QWidget

from app.core.health import HealthReport
from app.core.health.report import CheckResult
from app.core.models.summary import ModelSummary
from app.core.precision.words import plan_words
from app.core.requests.records import PicturePath
from app.engine.events import EngineEvent, EventState
from app.engine.failures import Failure
from app.ui.chart import ActivationChart
from app.ui.check_progress import CheckProgress
from app.ui.dialogs import Dialogs
from app.ui.engine_client import EngineClient
from app.ui.health_cards import report_cards, saved_report_card
from app.ui.health_controls import CheckControls, FixActions, export_path, write_markdown
from app.ui.health_fix_row import FixRow
from app.ui.health_headline import (
    MODEL_GONE_WORDS,
    Headline,
    banner_words,
    model_words,
    report_headline,
    saved_headline,
)
from app.ui.health_running import RunningCard, check_request, progress_words
from app.ui.state import AppState
from app.ui.widgets import Banner, Card, label, page_layout, scroll_column


class HealthView(QWidget, FixRow):
    """Runs `check` jobs on the loaded model and shows the `HealthReport` it sends back."""

    def __init__(
        self, state: AppState, client: EngineClient, dialogs: Dialogs, parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self.state = state
        self.client = client
        self.dialogs = dialogs
        self.job_id: int | None = None
        self.report: HealthReport | None = None
        self.markdown = ""
        self.cards: dict[str, Card] = {}
        self.charts: dict[str, ActivationChart] = {}
        # The Generate page's input picture and mask (none: text-to-image): a check probes
        # the path the next image takes, the VAE's encoder included.
        self.input_pictures: Callable[[], PicturePath] = PicturePath
        self._checked_pictures: dict[int, tuple[tuple[str, ...], str | None]] = {}

        layout = page_layout(
            self,
            "Health check",
            "Runs the loaded model briefly with your precision settings and watches every layer "
            "for values past fp16's limit of 65,504. If something overflows, HalfSafe finds the "
            "cheapest setting that fixes it and proves it by running that part again.",
        )
        controls = CheckControls(layout.spacing())
        self.run_button, self.cancel_button = controls.run_button, controls.cancel_button
        self.progress, self.stage = controls.progress, controls.stage
        self.export_button, self.copy_button = controls.export_button, controls.copy_button
        self.size_choice = controls.size_choice
        self.controls = controls
        self.run_button.clicked.connect(self.run_check)
        self.cancel_button.clicked.connect(self.cancel)
        # Not connected directly: `clicked` passes its `checked` flag, which is no path.
        self.export_button.clicked.connect(lambda: self.export_markdown())
        self.copy_button.clicked.connect(self.copy_markdown)
        layout.addWidget(controls)
        self.headlines: dict[int, str] = {}  # a running check's first finding, by job

        self.model_hint = label("", "muted", wrap=True)
        layout.addWidget(self.model_hint)
        self.verdict = Banner()
        layout.addWidget(self.verdict)
        self.fix_actions = FixActions()
        self.apply_button = self.fix_actions.apply_button
        self.applied_label = self.fix_actions.applied_label
        self.apply_button.clicked.connect(lambda: self.apply_fix(self._fix_settings))
        layout.addWidget(self.fix_actions)
        self.alternative_buttons = []
        self._show_fix_actions(None)  # the row's own state (`FixRow`), hidden
        # The report a check replaces, given back if it is cancelled; a saved report's fix, as
        # the plan it runs at.
        self._before_check: tuple[HealthReport | None, str] = (None, "")
        self._saved_fix_runs_at = ""

        self.body = scroll_column(layout)
        content = self.body.parentWidget()
        assert content is not None  # the scroll area's own widget
        self.body_content: QWidget = content
        self.faded = QGraphicsOpacityEffect(self.body_content)
        self.faded.setOpacity(0.45)
        self.faded.setEnabled(False)
        self.body_content.setGraphicsEffect(self.faded)
        # While a check runs: a card saying which stage it is at, in place of the report.
        self.running: CheckProgress | None = None
        self.running_card: RunningCard | None = None
        # The shown result was made before the engine stopped: greyed until the model is back.
        self.stale = False

        # The headline shown, and the precisions it holds at (the check's, its fix's): shown as
        # a verdict only while the next job runs at one of them.
        self._headline: Headline | None = None

        state.model_changed.connect(self._model_changed)
        state.model_changed.connect(self.show_saved_report)
        state.forgotten.connect(self._forgotten)
        for signal in (state.settings_changed, state.hardware_changed, state.model_changed):
            signal.connect(lambda _value: self._show_headline())
        client.died.connect(self._engine_stopped)
        self._model_changed(state.model)

    # Running ----------------------------------------------------------------------------------

    def _model_changed(self, model: ModelSummary | None) -> None:
        running = self.job_id is not None
        self.run_button.setEnabled(model is not None and not running)
        self.model_hint.setText(model_words(model))
        if model is not None:
            if self.report is not None and self.report.model.source != model.source:
                self.clear_report()
            elif self.stale:  # the engine is back with this model: the result holds again
                self._grey(False)
                self.stage.setText("")

    def clear_report(self) -> None:
        """Forget the shown report (it was about another model)."""
        self._clear()
        self.report = None
        self.markdown = ""
        self._headline = None
        self._saved_fix_runs_at = ""
        self.verdict.dismiss()
        self.stage.setText("")
        self._grey(False)
        self._show_fix_actions(None)
        self.controls.set_exportable(False)

    def run_check(self) -> None:
        if self.job_id is not None or self.state.model is None:
            return
        # The shown report, its banner and its fix are the last check's: not this one's. Kept
        # aside, to come back if this one is cancelled.
        self._before_check = (self.report, self.markdown)
        self.clear_report()
        self.controls.start()
        self._show_running(CheckProgress())
        pictures = self.input_pictures()
        request = check_request(self.state, self.size_choice.currentData(), pictures)
        self.job_id = self.client.submit(request, self._on_event)
        images, mask, _canvas = pictures
        self._checked_pictures = {self.job_id: (images, mask)} if images else {}

    def _show_before_check(self) -> None:
        """A cancelled check gives back the report shown before it (this session's, or the one
        saved), with the stage saying the check was cancelled."""
        report, markdown = self._before_check
        self._before_check = (None, "")
        if report is not None:
            self.show_report(report, markdown)
        elif markdown:
            self.show_saved_report(self.state.model)
        else:
            return
        self.stage.setText("Cancelled: the report from before it is shown again.")

    def cancel(self) -> None:
        if self.job_id is not None:
            self.stage.setText("Cancelling…")
            self.client.cancel(self.job_id)

    def _finish(self, text: str) -> None:
        self.job_id = None
        self.controls.finish(text, self.state.model is not None)

    def _on_event(self, event: EngineEvent) -> None:
        if event.state == EventState.QUEUED:
            self.stage.setText("Waiting for the engine…")
        elif event.state == EventState.PROGRESS:
            found = self.headlines.get(event.job_id)
            self.stage.setText(progress_words(event, self.progress, self.running, found))
            self._update_running()
        elif event.state == EventState.WARNING:
            # The check's headline (what failed, where) stays above the stages that follow it.
            self.headlines = {event.job_id: event.message}
            self.stage.setText(event.message)
            if self.running is not None:
                self.running.found(event.message)
            self._update_running()
        elif event.state == EventState.RESULT:
            result = event.result_as(CheckResult)
            self._finish(f"Checked in {result.report.seconds:.1f} s.")
            if result.model is not None and result.model != self.state.model:
                # The fix the check remembered: the next job runs with it, and says so now
                # (the report is this page's before then, so the saved one is not shown).
                self.report = result.report
                self.state.set_model(result.model, self.state.model_request)
            self.show_report(
                result.report, result.markdown, self._checked_pictures.pop(event.job_id, None)
            )
        elif event.state == EventState.CANCELLED:
            self._finish("Cancelled.")
            self._stop_running("Check cancelled", "muted", event.message)
            self._show_before_check()
        elif event.state == EventState.ERROR:
            if event.error_type == "EngineDied":
                self._finish("The engine stopped, so the health check did not finish.")
                self._stop_running(
                    "The check did not finish",
                    "bad",
                    "The engine stopped during the check. Restart it from the banner at the top "
                    "of the window, then run the check again.",
                )
            else:
                self._finish("The health check did not finish.")
                self._stop_running("The check did not finish", "bad", event.message)
            self.dialogs.job_failed(event)

    def _show_running(self, running: CheckProgress) -> None:
        """A card in place of the report while a check runs (`RunningCard`)."""
        self.running = running
        self.running_card = RunningCard(running)
        self.running_chip = self.running_card.chip
        self.body.insertWidget(0, self.running_card)

    def _update_running(self) -> None:
        if self.running is not None and self.running_card is not None:
            self.running_card.refresh()

    def _stop_running(self, title: str, level: str, why: str) -> None:
        """The running card, once the check stopped without a report: where it stopped, why."""
        running, card = self.running, self.running_card
        self.running = None
        if running is not None and card is not None:
            card.stop(title, level, why)

    # The engine stopping ----------------------------------------------------------------------

    def _engine_stopped(self, _failure: Failure) -> None:
        """The engine died. A check it was running has already said so (its ERROR event comes
        first); a result shown stays readable, greyed, and says it is from before."""
        self.progress.hide()
        shown = self._headline is not None or self.report is not None
        if shown or self.running_card is not None:  # a model was loaded: the restart reloads it
            self.model_hint.setText(MODEL_GONE_WORDS)
        if self.job_id is not None or not shown:
            return
        self._grey(True)
        self.stage.setText("")  # "Checked in 0.7 s." is the check's, not the engine's state
        self._show_headline()

    def _grey(self, stale: bool) -> None:
        """Grey the shown result and its actions (`stale`), or give them back."""
        self.stale = stale
        self.body_content.setEnabled(not stale)
        self.faded.setEnabled(stale)
        self.fix_actions.setEnabled(not stale)

    # Showing ----------------------------------------------------------------------------------

    def _forgotten(self, profile_key: str) -> None:
        """The loaded model's saved report forgotten: one shown as saved goes (a check shown
        from this session stays: it is no saved state)."""
        model = self.state.model
        if model is not None and model.profile_key == profile_key and self.report is None:
            self.show_saved_report(model)

    def show_saved_report(self, model: ModelSummary | None) -> None:
        """When a model is loaded (and no check of it is shown or running), show its last
        saved report: the headline, when and where it was checked, and its Markdown to copy
        or export. A check run now replaces it."""
        from app.core.health.saved import last_report

        # A report still shown is this model's: `_model_changed` cleared another model's. A
        # check that stopped (the engine died under it, unloading the model) keeps its card.
        if self.job_id is not None or self.report is not None:
            return
        if model is None and self.running_card is not None:
            return
        self.clear_report()
        self.verdict.setToolTip("")
        device = self.state.device_report()
        saved = last_report(model.profile_key, device.name if device else None) if model else None
        if saved is None:
            return
        self.markdown = saved.markdown
        self.controls.set_exportable(True)
        self._headline, figures = saved_headline(saved)
        self.verdict.setToolTip(figures)
        self._saved_fix_runs_at = saved.fix_runs_at
        self._show_headline()
        self.body.insertWidget(0, saved_report_card(saved.markdown))

    def _show_headline(self) -> None:
        """The shown check's headline, as its verdict while the next job runs at the precision
        it was made at (or its fix runs at); otherwise a plain note of that, with no verdict:
        a green "Safe" made at other settings says nothing of the next job (`banner_words`)."""
        if self._headline is None:
            return
        self._show_applied()
        plan = None if self.stale else self.state.expected_plan()
        next_job = plan_words(plan) if plan is not None else None
        self.verdict.show_message(
            *banner_words(
                self._headline, self.stale, next_job, self._verified_plans, self._saved_fix_runs_at
            )
        )

    def _clear(self) -> None:
        while self.body.count() > 1:
            item = self.body.takeAt(0)
            widget = item.widget() if item is not None else None
            if widget is not None:
                widget.hide()  # deletion waits for the event loop: gone from the page now
                widget.deleteLater()
        self.cards = {}
        self.charts = {}
        self.running_card = None
        self.alternative_buttons = []  # the report's table went with it

    def show_report(
        self,
        report: HealthReport,
        markdown: str = "",
        pictures: tuple[tuple[str, ...], str | None] | None = None,
    ) -> None:
        """Show a check's report; `pictures` the input picture and mask it was run with."""
        self._clear()
        self._saved_fix_runs_at = ""  # a live report has its fix's own row
        self.running = None
        self._grey(False)
        self.report = report
        self.markdown = markdown
        self.controls.set_exportable(bool(markdown))
        self._show_fix_actions(report.fix)
        self._headline, figures = report_headline(report, pictures, self.state.expected_plan())
        self.verdict.setToolTip(figures)
        self._show_headline()
        # Not `self.apply_fix` itself: it is looked up when a button is clicked.
        built = report_cards(report, lambda settings: self.apply_fix(settings))
        for position, widget in enumerate(built.widgets):
            self.body.insertWidget(position, widget)
        self.cards, self.charts = built.cards, built.charts
        self.alternative_buttons = built.alternative_buttons

    # Export -----------------------------------------------------------------------------------

    def copy_markdown(self) -> None:
        if self.markdown:
            QGuiApplication.clipboard().setText(self.markdown)
            self.stage.setText("Report copied to the clipboard.")

    def export_markdown(self, path: str | None = None) -> None:
        if not self.markdown:
            return
        if path is None:
            path = export_path(self, (self.report.model.name if self.report else None) or "model")
            if not path:
                return
        problem = write_markdown(path, self.markdown)
        if problem:
            self.dialogs.error(problem)
            return
        self.stage.setText(f"Report saved to {path}.")
