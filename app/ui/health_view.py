"""The health check page: one click, a card per model part, a chart, and the fix with its cost."""

from __future__ import annotations

import html
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QGraphicsOpacityEffect,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QWidget,
)

from app.core import hires
from app.core.components import Status, Verdict
from app.core.fixing.fix_ranking import CHOSEN_WORDS
from app.core.health import (
    CANDIDATE_COLUMNS,
    RUN_WORDS,
    STATUS_WORDS,
    ComponentReport,
    Fix,
    FixCost,
    HealthReport,
    candidate_rows,
    headroom_words,
    precision_words,
)
from app.core.health.report import CheckResult
from app.core.health.words import FROM_THE_FIX_WORDS, call_words
from app.core.jobs import DONE
from app.core.models.summary import ModelSummary
from app.core.precision.words import plan_words
from app.core.requests.records import CheckRequest, PicturePath
from app.engine.events import EngineEvent, EventState
from app.engine.failures import Failure
from app.ui import folders, words
from app.ui.chart import ActivationChart
from app.ui.check_progress import CheckProgress
from app.ui.dialogs import Dialogs
from app.ui.engine_client import EngineClient
from app.ui.health_fix_row import FixRow
from app.ui.health_words import cost_comparison_words, pictures_words, plain_headline
from app.ui.state import AppState
from app.ui.widgets import (
    Banner,
    Card,
    Chip,
    hline,
    label,
    page_layout,
    primary_button,
    scroll_column,
    show_progress,
)

PROBE_SIZES = (256, 512, 768, 1024)
_SEVERITY = {
    Status.BROKEN_WEIGHTS: 0,
    Status.NAN: 0,
    Status.OVERFLOW: 0,
    Status.AT_RISK: 1,
    Status.OK: 2,
}
_VERDICT_LEVEL = {Verdict.HEALTHY: "good", Verdict.FIXABLE: "warn", Verdict.BROKEN: "bad"}
_BAR_STEPS = 1000


def _saved_report_card(markdown: str) -> Card:
    """The last check's report as it was saved (its Markdown: every part's figures, the fix,
    the candidates), shown after a restart; its own title line is the card's."""
    card = Card("The last report, as saved")
    body = markdown.split("\n", 1)[1] if markdown.startswith("# ") else markdown
    text = QLabel()
    text.setTextFormat(Qt.TextFormat.MarkdownText)
    text.setText(body.strip())
    text.setWordWrap(True)
    text.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    card.body.addWidget(text)
    return card


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
        controls = QHBoxLayout()
        self.run_button = primary_button("Run health check")
        self.run_button.clicked.connect(self.run_check)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.clicked.connect(self.cancel)
        self.cancel_button.setEnabled(False)
        self.progress = QProgressBar()
        self.progress.setTextVisible(False)
        self.progress.setMaximumWidth(220)
        self.progress.hide()
        self.stage = label("", "muted")
        self.headlines: dict[int, str] = {}  # a running check's first finding, by job
        self.export_button = QPushButton("Export Markdown…")
        # Not connected directly: `clicked` passes its `checked` flag, which is no path.
        self.export_button.clicked.connect(lambda: self.export_markdown())
        self.copy_button = QPushButton("Copy report")
        self.copy_button.setToolTip(
            "Copy the report as Markdown, ready to paste into a bug report."
        )
        self.copy_button.clicked.connect(self.copy_markdown)
        for button in (self.export_button, self.copy_button):
            button.setEnabled(False)
        self.size_choice = QComboBox()
        self.size_choice.setToolTip(
            "The image size the check runs at. Activations grow with size, so check at the "
            "largest size you generate at; smaller is quicker."
        )
        self.size_choice.addItem("At the model's size", None)
        for size in PROBE_SIZES:
            self.size_choice.addItem(f"At {size}×{size} px", size)
        controls.addWidget(self.run_button)
        controls.addWidget(self.size_choice)
        controls.addWidget(self.cancel_button)
        controls.addStretch(1)
        controls.addWidget(self.export_button)
        controls.addWidget(self.copy_button)
        layout.addLayout(controls)
        # Progress has a row of its own, so a long stage never crushes the buttons.
        running = QHBoxLayout()
        running.addWidget(self.progress)
        running.addWidget(self.stage, 1)
        layout.addLayout(running)

        self.model_hint = label("", "muted", wrap=True)
        layout.addWidget(self.model_hint)
        self.verdict = Banner()
        layout.addWidget(self.verdict)
        # The fix's button sits above the scrolling report, with the verdict it acts on: at
        # 1024×700 the fix card's tables would push it out of sight.
        self.fix_actions = QWidget()
        actions = QHBoxLayout(self.fix_actions)
        actions.setContentsMargins(0, 0, 0, 0)
        self.apply_button = primary_button("Apply fix")
        self.apply_button.setToolTip(
            "Use this fix from the next job on: layer lists are remembered for this model, "
            "other settings are written into your settings."
        )
        self.apply_button.clicked.connect(lambda: self.apply_fix(self._fix_settings))
        self.applied_label = label("", "muted", wrap=True)
        actions.addWidget(self.apply_button)
        actions.addWidget(self.applied_label, 1)
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
        self.running_card: Card | None = None
        # The shown result was made before the engine stopped: greyed until the model is back.
        self.stale = False

        # The headline shown, and the precisions it holds at (the check's, its fix's): shown as
        # a verdict only while the next job runs at one of them.
        self._headline: tuple[str, str, tuple[str, ...]] | None = None

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
        if model is None:
            self.model_hint.setText(
                "Load a model on the Models page first; the demo model works on any computer."
            )
        else:
            self.model_hint.setText(
                f"Model: {model.name or model.source} "
                f"({words.architecture_name(model.architecture)})."
            )
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
        for button in (self.export_button, self.copy_button):
            button.setEnabled(False)

    def run_check(self) -> None:
        if self.job_id is not None or self.state.model is None:
            return
        # The shown report, its banner and its fix are the last check's: not this one's. Kept
        # aside, to come back if this one is cancelled.
        self._before_check = (self.report, self.markdown)
        self.clear_report()
        self.run_button.setEnabled(False)
        self.cancel_button.setEnabled(True)
        self.progress.setRange(0, 0)
        self.progress.show()
        self.stage.setText("Starting…")
        self._show_running(CheckProgress())
        images, mask, canvas = self.input_pictures()
        request = CheckRequest(
            precision=self.state.precision(),
            device=self.state.device(),
            size=self.size_choice.currentData(),
            # The denoiser is probed at the ends of the sampler schedule the user generates with.
            steps=int(self.state.settings["steps"]),
            scheduler=str(self.state.settings["scheduler"]),
            clip_skip=int(self.state.settings["clip_skip"]),  # the prompt read as jobs read it
            images=images,
            mask=mask,
            canvas=canvas,
            # A hires fix from a pixel upscaler runs the VAE's encoder at the final size.
            pixel_upscale=hires.Hires(
                scale=float(self.state.settings["hires_scale"]),
                upscaler=str(self.state.settings["hires_upscaler"]),
            ).pixels,
        )
        self.job_id = self.client.submit(request, self._on_event)
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
        self.cancel_button.setEnabled(False)
        self.run_button.setEnabled(self.state.model is not None)
        self.progress.hide()
        self.stage.setText(text)

    def _on_event(self, event: EngineEvent) -> None:
        running = self.running
        if event.state == EventState.QUEUED:
            self.stage.setText("Waiting for the engine…")
        elif event.state == EventState.PROGRESS:
            if event.stage == DONE:
                # The last step is counted before the report is written: a full bar and
                # "Done" would claim the check finished while it still runs.
                self.progress.setRange(0, 0)
                self.stage.setText("Writing the report…")
                if running is not None:
                    running.writing()
            else:
                stage = event.stage or "Working"
                if running is not None:
                    running.advance(stage, event.done, event.total)
                if running is not None and running.count:
                    self.progress.setRange(0, _BAR_STEPS)
                    self.progress.setValue(round(running.filled * _BAR_STEPS))
                    stage = f"Stage {running.index + 1} of {running.count} — {stage}"
                else:  # no stage named yet: the phase's own count, or a busy bar
                    show_progress(self.progress, event.done, event.total)
                found = self.headlines.get(event.job_id)
                self.stage.setText(f"{found}\n{stage}…" if found else f"{stage}…")
            self._update_running()
        elif event.state == EventState.WARNING:
            # The check's headline (what failed, where) stays above the stages that follow it.
            self.headlines = {event.job_id: event.message}
            self.stage.setText(event.message)
            if running is not None:
                running.found(event.message)
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
        """A card in place of the report while a check runs: its stages, where it is, and
        what it found so far, so the page is never blank."""
        self.running = running
        card = Card("Checking the model")
        self.running_chip = Chip("Starting", "muted")
        card.header.addWidget(self.running_chip)
        self.running_text = label("", wrap=True)
        card.body.addWidget(self.running_text)
        self.running_note = label(
            "A card for each part, its chart and the fix, if one is needed, appear here when "
            "the check ends.",
            "muted",
            wrap=True,
        )
        card.body.addWidget(self.running_note)
        self.running_card = card
        self.body.insertWidget(0, card)
        self._update_running()

    def _update_running(self) -> None:
        running = self.running
        if running is None or self.running_card is None:
            return
        self.running_text.setText("<br>".join(running.lines()))
        if running.count:
            self.running_chip.setText(
                f"Stage {min(running.index + 1, running.count)} of {running.count}"
            )

    def _stop_running(self, title: str, level: str, why: str) -> None:
        """The running card, once the check stopped without a report: where it stopped, why."""
        running, card = self.running, self.running_card
        self.running = None
        if running is None or card is None:
            return
        running.stopped()
        card.title.setText(title)
        self.running_chip.set_level(level, "Stopped")
        self.running_text.setText("<br>".join(running.lines()))
        self.running_note.setText(html.escape(why) if why and why != "Cancelled." else "")
        self.running_note.setVisible(bool(self.running_note.text()))

    # The engine stopping ----------------------------------------------------------------------

    def _engine_stopped(self, _failure: Failure) -> None:
        """The engine died. A check it was running has already said so (its ERROR event comes
        first); a result shown stays readable, greyed, and says it is from before."""
        self.progress.hide()
        shown = self._headline is not None or self.report is not None
        if shown or self.running_card is not None:  # a model was loaded: the restart reloads it
            self.model_hint.setText(
                "The engine stopped, and the model with it: Restart engine, at the top of the "
                "window, loads it again."
            )
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
        from app.core.health.saved import last_report, when_words

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
        for button in (self.export_button, self.copy_button):
            button.setEnabled(True)
        ran_at = f" at {html.escape(saved.ran_at)}" if saved.ran_at else ""
        headline, figures = plain_headline(saved.headline)
        self.verdict.setToolTip(figures)
        self._saved_fix_runs_at = saved.fix_runs_at
        self._headline = (
            _VERDICT_LEVEL[saved.verdict],
            f"<b>{html.escape(headline)}</b><br>The last check, on "
            f"{html.escape(saved.device)}{ran_at} on {when_words(saved.saved_at)}: its report "
            "as saved is below; run the health check for each part's chart and the fix's "
            "buttons.",
            tuple(t for t in (saved.ran_at, saved.fix_runs_at) if t),
        )
        self._show_headline()
        self.body.insertWidget(0, _saved_report_card(saved.markdown))

    def _show_headline(self) -> None:
        """The shown check's headline, as its verdict while the next job runs at the precision
        it was made at (or its fix runs at); otherwise a plain note of that, with no verdict:
        a green "Safe" made at other settings says nothing of the next job."""
        if self._headline is None:
            return
        level, text, holds_at = self._headline
        self._show_applied()
        if self.stale:
            self.verdict.show_message(
                "muted",
                "<b>The engine stopped, so this result is from before that.</b> It holds again "
                f"once the model is loaded again.<br>The last result: {text}",
            )
            return
        plan = self.state.expected_plan()
        next_job = plan_words(plan) if plan is not None else None
        if next_job is None or not holds_at or next_job in (*holds_at, *self._verified_plans):
            if self._saved_fix_runs_at and next_job == self._saved_fix_runs_at:
                text += " The fix it proved is in use: your next job runs with it."
            self.verdict.show_message(level, text)
            return
        self.verdict.show_message(
            "info",
            f"<b>Not checked at your settings.</b> The last check of this model ran at "
            f"{html.escape(holds_at[0])}; the next job runs at {html.escape(next_job)}. Run "
            "the health check to check that.",
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
        for button in (self.export_button, self.copy_button):
            button.setEnabled(bool(markdown))
        self._show_fix_actions(report.fix)
        level = _VERDICT_LEVEL[report.verdict]
        if report.advice is not None and report.advice.overflowing:
            level = "warn"  # safe as run, but not in the fp16 the user is likely to move to
        tested = plan_words(report.plan)
        headline, figures = plain_headline(report.headline)
        self.verdict.setToolTip(figures)
        self._headline = (
            level,
            f"<b>{html.escape(headline)}</b><br>"
            f"Tested on {html.escape(report.device.name)} with {html.escape(tested)}"
            + (f" at {report.size}×{report.size} px" if report.size else "")
            + "."
            + html.escape(pictures_words(pictures, report)),
            # It holds at what it ran at, at its fix's, and at the next job's as the settings
            # are now (the fix it remembered, resolved as jobs resolve it): until they change.
            (tested, *([plan_words(report.fix.plan)] if report.fix is not None else []))
            + ((plan_words(plan),) if (plan := self.state.expected_plan()) else ()),
        )
        self._show_headline()

        position = 0
        if report.fix is not None:
            self.body.insertWidget(position, self._fix_card(report.fix))
            position += 1
        bad_weights = report.weights_non_finite
        if bad_weights:
            card = Card("Damaged weights")
            card.header.addWidget(Chip("Broken file", "bad"))
            shown = ", ".join(bad_weights[:5]) + (" …" if len(bad_weights) > 5 else "")
            card.body.addWidget(
                label(
                    f"{len(bad_weights)} stored tensors hold NaN or infinite values ({shown}). "
                    "The file is damaged; no precision setting can repair it. Download it again.",
                    wrap=True,
                    selectable=True,
                )
            )
            self.body.insertWidget(position, card)
            position += 1
        # The part that failed first: that is what the user came to see. Otherwise pipeline order.
        components = sorted(report.components.items(), key=lambda item: _SEVERITY[item[1].status])
        for name, component in components:
            card = self._component_card(name, component)
            self.cards[name] = card
            self.body.insertWidget(position, card)
            position += 1
        if report.notes:
            self.body.insertWidget(
                position,
                label("<br>".join(f"• {html.escape(n)}" for n in report.notes), "muted", wrap=True),
            )

    def _component_card(self, name: str, component: ComponentReport) -> Card:
        status = component.status
        card = Card(words.component_name(name))
        role = words.COMPONENT_ROLES.get(name)
        if role:
            card.header.insertWidget(1, label(f"— {role}", "muted"))
        dtype = component.dtype
        fp16 = component.precisions.get("fp16")
        if component.fed_by and not status.failed:  # not its own fault
            chip = Chip(words.fed_by_words(component.fed_by), "muted")
        elif status is Status.OK and dtype != "fp16" and fp16 is not None and fp16.status.failed:
            # Fine as run, but not in the precision most users move to: never a plain green Ok.
            chip = Chip(f"Ok in {dtype}; fp16 {STATUS_WORDS[fp16.status]}", "warn")
        else:
            chip = Chip(words.first_upper(STATUS_WORDS[status]), words.STATUS_LEVEL[status])
        card.header.addWidget(chip)
        if component.wider_max_abs is not None:
            largest = (
                f"Largest value held in fp16: <b>{words.big_number(component.max_abs)}</b> — the "
                "fp16 limit is 65,504. The layers kept wider reached "
                f"{words.big_number(component.wider_max_abs)}, which their precision holds."
            )
        else:
            # A part that went non-finite has its largest value from the run that fixed it:
            # its own run in fp16 held no finite one that large.
            run = FROM_THE_FIX_WORDS if status.failed else f"run in {dtype}"
            largest = (
                f"Largest value: <b>{words.big_number(component.max_abs)}</b>"
                + (f" ({run})" if dtype else "")
                + " — the fp16 limit is 65,504."
            )
        facts = [largest, html.escape(headroom_words(component.headroom, status))]
        first_bad = component.first_bad_module
        if first_bad:
            facts.append(
                f"First layer to go wrong: {html.escape(words.describe_module(name, first_bad))}"
                f" (<code>{html.escape(first_bad)}</code>)."
            )
        if component.precisions:
            kept = len(self.report.plan.islands(name)) if self.report is not None else 0
            said = precision_words(component, kept)
            facts.append("In each half precision: " + html.escape(said) + ".")
        predicted = component.precisions.get("fp16")
        if predicted is not None and not predicted.measured and predicted.status is not Status.OK:
            where = component.predicted_first_bad_module
            facts.append(
                f"Tested in {dtype}; in fp16 it would "
                + (
                    "overflow"
                    if predicted.status is Status.OVERFLOW
                    else "come close to overflowing"
                )
                + (f", first at {html.escape(words.describe_module(name, where))}" if where else "")
                + "."
            )
        text = label("<br>".join(facts), wrap=True)
        card.body.addWidget(text)
        if component.blocks:
            chart = ActivationChart()
            chart.set_blocks(component.blocks)
            self.charts[name] = chart
            card.body.addWidget(chart)
        return card

    def _fix_card(self, fix: Fix) -> Card:
        card = Card("The fix")
        card.header.addWidget(
            Chip(
                "Verified" if fix.verified else "Not verified",
                "good" if fix.verified else "warn",
            )
        )
        quality = fix.quality
        if quality is None:
            card.body.addWidget(label(html.escape(fix.summary), wrap=True, rich=True))
        else:
            # The check's data, said in the one table's words (`quality.Quality`).
            words_, figure = quality.plain_words(), quality.figure_words()
            summary = fix.summary.replace(quality.words(), words_)
            card.body.addWidget(label(html.escape(summary), wrap=True, rich=True))
            card.body.addWidget(
                label(
                    f"Against full precision (fp32): <b>{words_}</b> ({html.escape(figure)})",
                    wrap=True,
                )
            )
        card.body.addWidget(
            label(f"Runs as: <b>{html.escape(plan_words(fix.plan))}</b>", wrap=True)
        )
        settings = dict(fix.settings)
        if settings:
            card.body.addWidget(
                label(
                    "Settings it changes: <b>"
                    + html.escape(words.settings_listed(settings))
                    + "</b>",
                    wrap=True,
                )
            )
        if fix.cost:
            card.body.addWidget(hline())
            card.body.addWidget(label("Measured cost", "muted"))
            card.body.addLayout(self._cost_grid(fix.cost))
            comparison = cost_comparison_words(fix.cost, fix.settings)
            if comparison:
                card.body.addWidget(label(comparison, wrap=True))
        if fix.candidates:
            card.body.addWidget(hline())
            card.body.addWidget(
                label(
                    "Every fix tried, judged against fp32 and measured on this device "
                    f"({CHOSEN_WORDS}; any other verified one can be applied instead). Times "
                    f"are in {RUN_WORDS}.",
                    "muted",
                    wrap=True,
                )
            )
            card.body.addLayout(self._candidate_grid(fix))
        return card

    def _candidate_grid(self, fix: Fix) -> QGridLayout:
        """The candidates table (core's rows, the CLI's and the report's), with an "Apply
        instead" button on each verified candidate that was not chosen."""
        grid = QGridLayout()
        grid.setHorizontalSpacing(16)
        for column, text in enumerate(CANDIDATE_COLUMNS):
            grid.addWidget(label(text, "muted", wrap=True), 0, column)
        candidates = iter(fix.candidates)
        self.alternative_buttons: list[Any] = []
        for row, cells in enumerate(candidate_rows(fix.candidates, fix.baselines), start=1):
            for column, text in enumerate(cells):
                cell = QLabel(words.breakable(text))
                cell.setWordWrap(True)  # a timing's range goes under it: the table fits 1024 px
                grid.addWidget(cell, row, column)
            if cells[4] == "baseline":
                continue
            candidate = next(candidates)
            if candidate.verified and not candidate.chosen:
                button = QPushButton("Apply instead")
                button.setToolTip(words.settings_listed(candidate.settings))
                settings = dict(candidate.settings)
                button.clicked.connect(lambda _=False, s=settings: self.apply_fix(s))
                button.setProperty("fix_settings", settings)
                grid.addWidget(button, row, len(CANDIDATE_COLUMNS))
                self.alternative_buttons.append(button)
        grid.setColumnStretch(1, 1)
        return grid

    def _cost_grid(self, cost: FixCost) -> QGridLayout:
        grid = QGridLayout()
        grid.setHorizontalSpacing(24)
        headers = ("", f"Time per {call_words(cost.fix)}", "Peak GPU memory", "Weights")
        for column, text in enumerate(headers):
            header = label(text, "muted")
            grid.addWidget(header, 0, column)
        rows = (("With the fix", cost.fix), ("Everything in fp32 (no-half)", cost.no_half))
        for row, (name, values) in enumerate(rows, start=1):
            grid.addWidget(QLabel(name), row, 0)
            grid.addWidget(QLabel(words.milliseconds(values.step_ms)), row, 1)
            grid.addWidget(QLabel(words.megabytes(values.peak_memory_mb)), row, 2)
            grid.addWidget(QLabel(words.megabytes(values.weights_mb)), row, 3)
        grid.setColumnStretch(4, 1)
        return grid

    # Export -----------------------------------------------------------------------------------

    def copy_markdown(self) -> None:
        if self.markdown:
            QGuiApplication.clipboard().setText(self.markdown)
            self.stage.setText("Report copied to the clipboard.")

    def export_markdown(self, path: str | None = None) -> None:
        if not self.markdown:
            return
        if path is None:
            name = (self.report.model.name if self.report else None) or "model"
            path, _ = QFileDialog.getSaveFileName(
                self,
                "Export health report",
                str(Path(folders.documents()) / f"halfsafe-health-{name}.md"),
                "Markdown (*.md);;All files (*)",
            )
            if not path:
                return
        try:
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(self.markdown)
        except OSError as error:
            self.dialogs.error(
                f"{path}: the report could not be written ({error.strerror or error})."
            )
            return
        self.stage.setText(f"Report saved to {path}.")
