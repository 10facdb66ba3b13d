"""The health check page: one click, per-component cards in plain words, chart, fix, export."""

from __future__ import annotations

from dataclasses import replace

import pytest
from PySide6.QtCore import QPoint, QRect, Qt
from PySide6.QtGui import QGuiApplication, QTextDocument
from PySide6.QtWidgets import QApplication, QLabel, QWidget

from app.core.components import Status, Verdict
from app.core.fixing.quality import Quality
from app.core.health import PrecisionOutcome
from app.core.jobs import DONE
from app.core.precision import PrecisionPlan
from app.core.settings import load_settings
from app.engine.events import CancelRequest, EventState
from app.ui.widgets import Card, Chip
from tests.support import reports
from tests.support.reports import MARKDOWN
from tests.ui.conftest import DEMO_SUMMARY, load_fake_model


def _run_check(window, engines):
    load_fake_model(window, engines)
    window.show_page("Health check")
    view = window.health_view
    assert view.run_button.isEnabled()
    view.run_button.click()
    return view, engines.current.last_job("check")


def test_run_is_one_click_and_sends_the_current_settings(window, engines):
    window.state.set_setting("upcast_attention", True)
    view, job = _run_check(window, engines)
    assert job.params.precision.upcast_attention is True
    assert job.params.size is None  # the model's own size
    engines.current.emit(job, EventState.PROGRESS, stage="Checking the UNet", done=1, total=3)
    assert view.progress.value() / view.progress.maximum() == pytest.approx(1 / 3, abs=0.01)
    assert view.stage.text() == "Stage 2 of 3 — Checking the UNet…"
    assert not view.run_button.isEnabled()


def test_a_phase_without_a_count_shows_a_busy_bar_and_a_counted_one_moves(window, engines):
    view, job = _run_check(window, engines)
    engines.current.emit(job, EventState.PROGRESS, stage="Running the fp32 reference", total=1)
    assert view.progress.maximum() == 0  # busy: never an empty bar that looks stuck
    measuring = "Measuring the fixes for the VAE"
    engines.current.emit(job, EventState.PROGRESS, stage=measuring, done=3, total=12)
    assert (view.progress.value(), view.progress.maximum()) == (3, 12)
    assert measuring in view.stage.text()
    engines.current.emit(job, EventState.PROGRESS, stage=measuring, done=12, total=12)
    assert view.progress.value() == 12 and "Writing" not in view.stage.text()
    engines.current.emit(job, EventState.PROGRESS, stage=DONE, done=3, total=3)
    assert view.progress.maximum() == 0 and view.stage.text() == "Writing the report…"


def test_the_finding_stays_in_the_stage_line_while_fixes_are_proved(window, engines):
    view, job = _run_check(window, engines)
    finding = "The VAE went NaN/Inf in fp16, first at decoder.conv_out; proving a fix."
    engines.current.emit(job, EventState.WARNING, message=finding)
    assert view.stage.text() == finding
    engines.current.emit(job, EventState.PROGRESS, stage="Trying a fix: run the VAE in fp32")
    assert view.stage.text() == f"{finding}\nTrying a fix: run the VAE in fp32…"
    engines.current.finish(job, reports.result(reports.fixable()))
    view.run_button.click()  # the next check starts without the last one's finding
    again = engines.current.last_job("check")
    engines.current.emit(again, EventState.PROGRESS, stage="Checking the VAE", done=2, total=3)
    assert view.stage.text() == "Stage 3 of 3 — Checking the VAE…"


def _filled(view) -> float:
    bar = view.progress
    assert bar.maximum() > 0, "a busy bar, not the stages"
    return bar.value() / bar.maximum()


def _shown_text(widget: QWidget) -> str:
    """Every label the user can see in `widget`, one after another, once the event loop has
    shown what was added to it."""
    QApplication.processEvents()
    return "\n".join(w.text() for w in widget.findChildren(QLabel) if w.isVisible())


def test_the_bar_follows_the_stages_the_text_names(window, engines):
    """The bar is split into the check's stages (the parts of the model, named "k of n" in
    the text); the fixes measured in the last stage fill that stage, never the bar's start."""
    view, job = _run_check(window, engines)
    emit = engines.current.emit
    filled = []

    def step(stage, done=0, total=0):
        emit(job, EventState.PROGRESS, stage=stage, done=done, total=total)
        filled.append(_filled(view))

    step("Checking the text encoder", 0, 3)
    assert view.stage.text() == "Stage 1 of 3 — Checking the text encoder…"
    step("Checking the UNet", 1, 3)
    step("Checking the VAE", 2, 3)
    assert filled[-1] == pytest.approx(2 / 3, abs=0.01)
    emit(job, EventState.WARNING, message="The VAE went NaN/Inf in fp16; proving a fix.")
    step("Running the fp32 reference", 0, 1)
    for tried, words in enumerate(("run the VAE in fp32", "run the VAE in bf16")):
        step(f"Trying a fix: {words}", tried, 2)
    step("Measuring the fixes for the VAE", 1, 20)
    assert "Stage 3 of 3 — Measuring the fixes for the VAE…" in view.stage.text()
    step("Measuring the fixes for the VAE", 19, 20)
    step("Measuring the cost of the fix", 1, 6)
    assert 2 / 3 <= filled[-1] < 1
    assert filled == sorted(filled), f"the bar went back: {filled}"
    assert len(set(filled[2:])) > 3, "the bar stood still through the fixes"


def test_a_running_check_shows_its_stages_in_place_of_the_report(window, engines):
    view, job = _run_check(window, engines)
    report_area = view.body.parentWidget()
    assert "Starting" in _shown_text(report_area)  # never a blank page
    engines.current.emit(
        job, EventState.PROGRESS, stage="Checking the text encoder", done=0, total=3
    )
    engines.current.emit(job, EventState.PROGRESS, stage="Checking the UNet", done=1, total=3)
    finding = "The UNet went NaN/Inf in fp16, first at mid_block; proving a fix against fp32."
    engines.current.emit(job, EventState.WARNING, message=finding)
    engines.current.emit(job, EventState.PROGRESS, stage="Trying a fix: run the UNet in bf16")
    shown = _shown_text(report_area)
    assert "✓ Text encoder" in shown
    assert "<b>UNet</b>: Trying a fix: run the UNet in bf16…" in shown
    assert finding in shown and "1 more part to check" in shown
    assert view.running_chip.text() == "Stage 2 of 3"
    engines.current.finish(job, reports.result(reports.fixable()))
    assert "Trying a fix" not in _shown_text(report_area) and view.cards

    view.run_button.click()
    again = engines.current.last_job("check")
    engines.current.emit(again, EventState.PROGRESS, stage="Checking the UNet", done=1, total=3)
    engines.current.emit(again, EventState.CANCELLED, message="Cancelled.")
    # The report from before it comes back (a test below); with none, the card says where
    # the check stopped.
    assert view.stage.text().startswith("Cancelled: the report from before it")
    view.clear_report()
    view.run_button.click()
    third = engines.current.last_job("check")
    engines.current.emit(third, EventState.PROGRESS, stage="Checking the UNet", done=1, total=3)
    engines.current.emit(third, EventState.CANCELLED, message="Cancelled.")
    shown = _shown_text(report_area)
    assert "Check cancelled" in shown and "<b>UNet</b>: stopped" in shown


def _on_screen(widget: QWidget) -> bool:
    """Whether all of `widget` is painted inside its window: none of it scrolled out of a
    scroll area's view or past the window's edge."""
    window = widget.window()
    where = QRect(widget.mapTo(window, QPoint(0, 0)), widget.size())
    unclipped = widget.visibleRegion().boundingRect() == widget.rect()
    return widget.isVisible() and unclipped and window.rect().contains(where)


def test_apply_fix_is_on_screen_at_1024_by_700_after_a_check_with_a_fix(qtbot, window, engines):
    view, job = _run_check(window, engines)
    window.resize(1024, 700)
    engines.current.finish(job, reports.result(reports.islands()))  # every fix tried, listed
    qtbot.wait(50)  # the layouts take the size, the scroll area its range
    assert view.apply_button.text() == "Apply fix"
    assert _on_screen(view.apply_button)
    assert view.apply_button.isEnabled()
    view.apply_button.click()  # it applies this report's fix
    assert "remembered for this model" in view.applied_label.text()
    # A report with no fix has no button to press.
    view.run_button.click()
    engines.current.finish(engines.current.last_job("check"), reports.result(reports.report()))
    assert not view.apply_button.isVisible()


def test_after_the_engine_stops_the_result_is_greyed_and_says_so(window, engines):
    view, job = _run_check(window, engines)
    report = replace(reports.fixable(), model=DEMO_SUMMARY)  # the model loaded
    engines.current.finish(job, reports.result(report))
    assert view.stage.text().startswith("Checked in")
    engines.current.crash()
    assert view.verdict.level == "muted"
    assert "The engine stopped, so this result is from before that" in view.verdict.text.text()
    assert "Checked in" not in view.stage.text()
    assert "Restart engine" in view.model_hint.text()
    assert not view.progress.isVisible()
    assert not view.body.parentWidget().isEnabled() and view.faded.isEnabled()
    assert not view.apply_button.isEnabled()
    window.state.set_setting("steps", 12)  # a settings change does not bring the verdict back
    assert view.verdict.level == "muted"
    # The engine back with the model: the result holds again.
    window.restart_engine()
    engines.current.finish(engines.current.last_job("load"), DEMO_SUMMARY)
    assert view.verdict.level == "warn" and view.body.parentWidget().isEnabled()
    assert view.apply_button.isEnabled() and not view.faded.isEnabled()


def test_a_check_the_engine_died_under_says_it_did_not_finish(window, engines):
    view, job = _run_check(window, engines)
    engines.current.emit(job, EventState.PROGRESS, stage="Checking the UNet", done=1, total=3)
    engines.current.crash()
    assert "engine stopped" in view.stage.text() and "did not finish" in view.stage.text()
    assert not view.progress.isVisible()
    shown = _shown_text(view.body.parentWidget())
    assert "The check did not finish" in shown and "<b>UNet</b>: stopped" in shown
    assert "1 more part not checked." in shown
    assert "The engine stopped during the check" in shown
    assert not window.dialogs._open  # the window's banner says it once, with Restart


def test_the_banner_says_how_close_the_fix_is_in_words_with_the_figure_in_reach(window, engines):
    view, job = _run_check(window, engines)
    fix = replace(reports.vae_fp32_fix(), quality=Quality(47.3))
    engines.current.finish(job, reports.result(reports.report(verdict=Verdict.FIXABLE, fix=fix)))
    banner = view.verdict.text.text()
    assert "verified fix (matches full precision closely): run the VAE in fp32" in banner
    assert "dB" not in banner
    assert "47.3 dB" in view.verdict.toolTip() and "verified from 20 dB" in view.verdict.toolTip()
    card = _shown_text(view.body.parentWidget())
    assert (
        "Against full precision (fp32): <b>matches full precision closely</b> (its output was "
        "within about 0.43% of an fp32 run of the same inputs (47.3 dB signal-to-noise; a fix "
        "counts as verified from 20 dB, about 10%))"
    ) in card


def test_probe_size_can_be_chosen(window, engines):
    load_fake_model(window, engines)
    view = window.health_view
    view.size_choice.setCurrentIndex(view.size_choice.findData(768))
    view.run_check()
    assert engines.current.last_job("check").params.size == 768


def test_report_shows_cards_in_plain_words_chart_and_fix(window, engines):
    view, job = _run_check(window, engines)
    engines.current.finish(job, reports.result(reports.fixable()))

    assert view.verdict.isVisible() and view.verdict.level == "warn"
    # The headline is core's, as `halfsafe check` prints it.
    assert view.verdict.text.text().startswith(
        "<b>Fixable: at your settings (fp16 everywhere) the VAE overflows 2x; verified fix"
    )
    assert set(view.cards) == {"text_encoder", "unet", "vae"}
    vae_text = " ".join(w.text() for w in view.cards["vae"].findChildren(type(view.stage)))
    assert "Overflows" in vae_text
    # Its largest value is the fixing run's: fp16 held none that large.
    assert "Largest value: <b>131,000</b> (on the run that fixed it)" in vae_text
    assert (
        "the second convolution of the second ResNet layer of the third up-sampling block "
        "of the decoder, in the VAE"
    ) in vae_text
    unet_text = " ".join(w.text() for w in view.cards["unet"].findChildren(type(view.stage)))
    assert "Close to the fp16 limit" in unet_text and "only 1.6x" in unet_text

    chart = view.charts["vae"]
    assert [b.module for b in chart.blocks] == [
        "post_quant_conv",
        "decoder.mid_block",
        "decoder.up_blocks.2",
    ]
    assert [b.level for b in chart.blocks] == ["good", "warn", "bad"]
    assert "past the limit: decoder.up_blocks.2" in chart.accessibleDescription()
    # The chart paints without errors at its real size.
    assert not chart.grab().isNull()

    fix_text = " ".join(w.text() for w in view.findChildren(type(view.stage)))
    assert "VAE precision: fp32 (full)" in fix_text
    assert "61 ms" in fix_text and "118 ms" in fix_text
    assert "the fix was 1.9x as fast as no-half" in fix_text
    assert "less memory at peak" in fix_text
    # The fix is the VAE's: the step times are the UNet as the settings run it against fp32.
    assert "The fix leaves the denoiser as your settings run it" in fix_text
    # A check is no job: the status bar goes on saying what the next job runs.
    assert window.precision_status.text() == "Precision: auto (decided when a job runs)"
    assert window.precision_status.toolTip().startswith("What the next job will use")


def test_apply_fix_writes_the_settings(window, engines):
    view, job = _run_check(window, engines)
    engines.current.finish(job, reports.result(reports.fixable()))
    view.apply_button.click()
    assert load_settings().settings["vae_precision"] == "fp32"
    assert "Applied" in view.applied_label.text()
    view.run_button.click()
    assert engines.current.last_job("check").params.precision.vae_precision == "fp32"


def test_applied_is_taken_back_when_the_user_undoes_the_fix_in_settings(window, engines):
    view, job = _run_check(window, engines)
    engines.current.finish(job, reports.result(reports.fixable()))
    view.apply_button.click()
    assert view.applied_label.text().startswith("Applied (Run the VAE in fp32): written into")
    window.state.set_setting("precision", "fp16")  # not a setting of the fix: still applied
    assert view.applied_label.text().startswith("Applied (")
    window.state.set_setting("vae_precision", "fp16")
    assert view.applied_label.text() == UNDONE
    assert view.apply_button.isEnabled()
    view.apply_button.click()
    assert view.applied_label.text().startswith("Applied (")


UNDONE = (
    "Your settings have changed since this fix was applied: the next job runs without it. "
    "Apply it again to use it."
)


def _apply_layers_remembered(window, engines, view, fix_settings):
    """Apply the report's layer fix and answer the engine's remembering job, as it would: the
    loaded model's summary then holds the fix, and the next job's plan runs it."""
    from app.core.fixing.profiles import RememberedFix
    from tests.ui.conftest import DEMO_SUMMARY

    view.apply_button.click()
    remember = engines.current.last_job("remember_fix")
    fix = RememberedFix(dict(fix_settings), remember.params.summary, "health check", 0.0)
    # The same model the report is of, now with the fix remembered for it.
    source = view.report.model.source
    engines.current.finish(remember, replace(DEMO_SUMMARY, source=source, remembered_fix=fix))
    return remember


def test_a_layer_fix_applied_is_taken_back_by_what_replaces_its_layers(window, engines):
    """The layers are remembered for the model. Layer lists of the same kind typed into
    Settings replace them, and the row says the next job runs without the fix; lists of
    another kind run beside them and take nothing back; undone, the row says so again. What is
    remembered keeps its measured agreement."""
    _fp16_card(window)
    view, job = _run_check(window, engines)
    clamp = {"clamp_modules": ["vae:decoder.a.conv1"]}
    report = reports.islands()
    report = replace(report, fix=replace(report.fix, settings=dict(clamp)))
    engines.current.finish(job, reports.result(report))
    remember = _apply_layers_remembered(window, engines, view, clamp)
    assert remember.params.summary == report.fix.summary  # its proof, whole
    applied = view.applied_label.text()
    assert applied.startswith("Applied (") and "remembered for this model" in applied
    window.state.set_setting("bf16_modules", ["vae:decoder.conv_in"])  # another kind: beside it
    assert view.applied_label.text() == applied
    window.state.set_setting("clamp_modules", ["vae:decoder.conv_in"])  # the same kind: replaced
    assert view.applied_label.text() == UNDONE
    view.apply_button.click()  # applied again: the list of the same kind gives way to it
    assert window.state.settings["clamp_modules"] == []
    assert view.applied_label.text().startswith("Applied (")
    window.state.set_setting("clamp_modules", ["vae:decoder.conv_in"])
    assert view.applied_label.text() == UNDONE
    window.state.set_setting("clamp_modules", [])
    assert view.applied_label.text() == applied  # it runs again, and the row says so
    window.state.set_setting("vae_precision", "fp32")  # a clamp in an fp32 VAE does nothing
    assert view.applied_label.text().startswith("Not needed at your settings")


def test_a_fix_applied_instead_is_the_one_the_row_follows(window, engines):
    view, job = _run_check(window, engines)
    engines.current.finish(job, reports.result(reports.islands()))
    (instead,) = view.alternative_buttons
    instead.click()  # run the VAE in fp32: a setting every model uses, and said so
    assert instead.text() == "Applied" and not instead.isEnabled()
    assert view.applied_label.text().startswith(
        "Applied (Run the VAE in fp32): written into Settings, so it holds for every model"
    )
    window.state.set_setting("vae_precision", "fp16")
    assert view.applied_label.text() == UNDONE


def test_a_denoiser_fix_is_not_said_to_leave_the_denoiser():
    from app.ui.health_words import cost_comparison_words

    cost = reports.vae_fp32_fix().cost
    assert cost is not None
    for settings in ({"unet_precision": "bf16"}, {"bf16_modules": ["unet:mid_block.a"]}):
        assert "leaves the denoiser" not in cost_comparison_words(cost, settings)
    assert "leaves the denoiser" in cost_comparison_words(cost, {"vae_precision": "fp32"})


def _checked_and_remembered(window, engines, report):
    """A check on an fp16 card whose fix the check remembered for the loaded demo, as the
    engine sends it: the model's summary after the check comes with the result."""
    from app.core.fixing.profiles import RememberedFix
    from app.core.health.report import CheckResult

    _fp16_card(window)
    view, job = _run_check(window, engines)
    remembered = RememberedFix(dict(report.fix.settings), report.fix.summary, "health check", 0.0)
    model = replace(DEMO_SUMMARY, remembered_fix=remembered)
    report = replace(report, model=model, plan=_demo_plan("fp16"))
    engines.current.finish(job, CheckResult(report, MARKDOWN, model))
    return view


def test_a_fix_the_check_remembered_is_said_in_use_before_any_click(window, engines):
    """The check remembers its fix for the model, so the next job runs it already: the row says
    so and Apply fix has nothing left to do, where it offered a blue "Apply fix" before."""
    view = _checked_and_remembered(window, engines, reports.islands())
    assert "with 2 VAE layers in fp32" in window.precision_status.text()
    assert view.applied_label.text().startswith("In use: the check remembered this fix")
    assert view.apply_button.text() == "In use" and not view.apply_button.isEnabled()
    # Its layers replaced by the user's own list of that kind: it no longer runs, Apply offers
    # it again (and would hand the kind back to it).
    window.state.set_setting("fp32_modules", ["vae:decoder.conv_in"])
    assert view.applied_label.text() == ""
    assert view.apply_button.text() == "Apply fix" and view.apply_button.isEnabled()


def test_a_settings_fix_the_check_remembered_is_in_use_for_this_model_only(window, engines):
    """A fix of plain settings remembered for the model runs in its jobs; Apply fix would write
    it for every model, and the row says which."""
    report = replace(reports.islands(), fix=reports.vae_fp32_fix())
    view = _checked_and_remembered(window, engines, report)
    assert view.applied_label.text().startswith("In use for this model: the check remembered")
    assert view.apply_button.text() == "Apply fix" and view.apply_button.isEnabled()
    view.apply_button.click()
    assert window.state.settings["vae_precision"] == "fp32"
    assert view.apply_button.text() == "Applied" and not view.apply_button.isEnabled()


def test_a_fix_applied_instead_keeps_the_checks_verdict_at_the_plan_it_makes(window, engines):
    """Another verified candidate applied from the table: this check verified the plan it
    makes, so the headline keeps its verdict (it said "Not checked at your settings"); a
    setting changed after that is a plan no check made."""
    view = _checked_and_remembered(window, engines, reports.islands())
    level = view.verdict.level
    (instead,) = view.alternative_buttons
    instead.click()  # the VAE in fp32
    assert instead.text() == "Applied" and not instead.isEnabled()
    assert view.apply_button.text() == "Apply fix" and view.apply_button.isEnabled()
    text = view.verdict.text.text()
    assert "Not checked at your settings" not in text and view.verdict.level == level
    window.state.set_setting("unet_precision", "bf16")
    assert "Not checked at your settings" in view.verdict.text.text()
    window.state.set_setting("unet_precision", "auto")
    assert "Not checked at your settings" not in view.verdict.text.text()


def test_applying_the_chosen_fix_after_another_takes_the_others_settings_back(window, engines):
    """Apply instead (the VAE in fp32), then Apply fix (two VAE layers in bf16): the VAE's
    setting goes back, or the layers would run in an fp32 VAE, moot, while the row said
    "Applied"; the row says what it set back."""
    view = _checked_and_remembered(window, engines, reports.islands())
    (instead,) = view.alternative_buttons
    instead.click()
    assert window.state.settings["vae_precision"] == "fp32"
    view.apply_button.click()
    assert window.state.settings["vae_precision"] == "auto"
    assert "with 2 VAE layers in fp32" in window.precision_status.text()
    text = view.applied_label.text()
    assert text.startswith("Applied (") and "Set back as before: VAE precision" in text
    assert view.apply_button.text() == "Applied" and instead.text() == "Apply instead"
    # A fix applied that the settings then make moot is not said applied, however long, and
    # not offered again: applying it would change nothing.
    window.state.set_setting("vae_precision", "fp32")
    assert view.applied_label.text().startswith("Not needed at your settings")
    assert not view.apply_button.isEnabled()


def test_a_layer_fix_made_moot_by_wider_settings_is_not_offered_in_a_loop(window, engines):
    """At fp32 everywhere the fix's fp32 layers change nothing: Apply is idle and the row says
    why, where it offered Apply and then said the settings had changed, again and again."""
    view = _checked_and_remembered(window, engines, reports.islands())
    window.state.set_setting("precision", "fp32")
    assert view.applied_label.text().startswith("Not needed at your settings: they run the VAE")
    assert view.apply_button.text() == "Not needed" and not view.apply_button.isEnabled()
    window.state.set_setting("precision", "auto")  # fp16 on this card: it runs again
    assert view.applied_label.text().startswith("In use: the check remembered this fix")


def test_a_report_cleared_by_the_next_check_leaves_no_button_behind(window, engines):
    """A new check clears the last report's table: a setting changed while it runs, or its
    report arriving, touches no button of the old one (Qt had deleted them: an error box)."""
    view, job = _run_check(window, engines)
    engines.current.finish(job, reports.result(reports.islands()))
    (instead,) = view.alternative_buttons
    instead.click()
    view.run_button.click()  # the report goes
    assert view.alternative_buttons == []
    window.state.set_setting("unet_precision", "bf16")
    engines.current.finish(engines.current.last_job("check"), reports.result(reports.fixable()))
    window.state.set_setting("unet_precision", "auto")
    assert not window.dialogs.shown


def test_the_export_button_asks_where_to_save(window, engines, tmp_path, monkeypatch):
    """The button itself, not the method: `clicked` passes a flag that is no path."""
    from PySide6.QtWidgets import QFileDialog

    view, job = _run_check(window, engines)
    engines.current.finish(job, reports.result(reports.fixable()))
    target = tmp_path / "report.md"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(target), ""))
    view.export_button.click()
    assert target.read_text(encoding="utf-8") == MARKDOWN
    assert not window.dialogs.shown


def test_export_and_copy_markdown(window, engines, tmp_path):
    view, job = _run_check(window, engines)
    engines.current.finish(job, reports.result(reports.fixable()))
    view.copy_button.click()
    assert QGuiApplication.clipboard().text() == MARKDOWN
    target = tmp_path / "report.md"
    view.export_markdown(str(target))
    assert target.read_text(encoding="utf-8") == MARKDOWN


def test_cancel_sends_cancel(window, engines):
    view, job = _run_check(window, engines)
    view.cancel_button.click()
    assert CancelRequest(job.job_id) in engines.current.sent
    engines.current.emit(job, EventState.CANCELLED, message="Cancelled.")
    assert view.stage.text() == "Cancelled."
    assert view.run_button.isEnabled()


def test_a_cancelled_check_gives_back_the_report_shown_before_it(window, engines):
    view, job = _run_check(window, engines)
    engines.current.finish(job, reports.result(reports.islands()))
    shown = view.report
    view.run_button.click()
    assert view.report is None  # this check's, while it runs: none yet
    engines.current.emit(engines.current.last_job("check"), EventState.CANCELLED, message="x")
    assert view.report is shown and view.cards and view.alternative_buttons
    assert view.stage.text() == "Cancelled: the report from before it is shown again."
    assert view.copy_button.isEnabled()


def test_healthy_and_broken_verdicts(window, engines):
    view, job = _run_check(window, engines)
    engines.current.finish(job, reports.result(reports.report()))
    assert view.verdict.level == "good"
    view.run_button.click()
    engines.current.finish(engines.current.last_job("check"), reports.result(reports.broken()))
    assert view.verdict.level == "bad"
    assert "Broken: the weights hold NaN or Inf values" in view.verdict.text.text()
    texts = " ".join(w.text() for w in view.findChildren(type(view.stage)))
    assert "first_stage_model.decoder.conv_in.weight" in texts


def test_a_component_fed_nan_by_another_is_named_as_fed_not_as_failing(window, engines):
    view, job = _run_check(window, engines)
    parts = reports.components()
    parts["text_encoder"] = replace(parts["text_encoder"], status=Status.BROKEN_WEIGHTS)
    parts["unet"] = replace(parts["unet"], status=Status.OK, fed_by="text_encoder")
    report = reports.report(
        verdict=Verdict.BROKEN,
        weights_non_finite=["text_encoder.text_model.encoder.layers.0.mlp.fc1.weight"],
        components=parts,
    )
    engines.current.finish(job, reports.result(report))
    unet_text = " ".join(w.text() for w in view.cards["unet"].findChildren(type(view.stage)))
    assert "Fed non-finite input by the text encoder" in unet_text
    assert "Goes NaN" not in unet_text and "Close to the fp16 limit" not in unet_text


def test_run_needs_a_model(window):
    window.show_page("Health check")
    assert not window.health_view.run_button.isEnabled()
    assert "Load a model" in window.health_view.model_hint.text()


def test_a_report_about_another_model_is_cleared_when_a_new_one_loads(window, engines):
    view, job = _run_check(window, engines)
    engines.current.finish(job, reports.result(reports.fixable()))
    assert view.cards
    load_fake_model(window, engines)  # the demo, not /models/sdxl.safetensors
    assert view.report is None and not view.cards
    assert not view.verdict.isVisible() and not view.copy_button.isEnabled()


def test_check_probes_the_sampler_the_user_generates_with(window, engines):
    load_fake_model(window, engines)
    window.state.apply({"steps": 12, "scheduler": "euler"})
    window.health_view.run_check()
    params = engines.current.last_job("check").params
    assert (params.steps, params.scheduler) == (12, "euler")


def test_a_check_under_autocast_says_so_in_words(window, engines):
    view, job = _run_check(window, engines)
    report = reports.fixable()
    report = replace(report, plan=replace(report.plan, autocast=True))
    engines.current.finish(job, reports.result(report))
    text = view.verdict.text.text()
    assert "fp16 everywhere, under autocast" in text
    assert "autocast True" not in text and "Autocast" not in text


def test_candidates_are_listed_and_another_verified_one_can_be_applied(window, engines):
    view, job = _run_check(window, engines)
    engines.current.finish(job, reports.result(reports.islands()))
    text = " ".join(w.text() for w in view.findChildren(type(view.stage)))
    assert "Runs as: <b>fp16, with 2 VAE layers in fp32</b>" in text
    assert "Layers in fp32: 2 layers (vae:decoder.a.conv1, vae:decoder.a.norm2)" in text
    assert "rejected: differs from fp32" in text and "4.2 dB" in text
    assert "no-half" in text and "81.0 (80.0-83.0)" in text
    # Only the verified candidate that was not chosen offers to be applied instead.
    (instead,) = view.alternative_buttons
    view.apply_button.click()
    # One model's layer names never go into the settings every model uses: the engine
    # remembers them for the loaded model, ahead of the next job.
    assert load_settings().settings["fp32_modules"] == []
    remember = engines.current.last_job("remember_fix")
    assert remember.params.settings == reports.ISLAND_SETTINGS
    assert "remembered for this model" in view.applied_label.text()
    instead.click()
    assert load_settings().settings["vae_precision"] == "fp32"
    assert len(engines.current.jobs("remember_fix")) == 1


def test_a_new_check_does_not_show_the_last_ones_verdict_while_it_runs(window, engines):
    view, job = _run_check(window, engines)
    engines.current.finish(job, reports.result(reports.fixable()))
    assert view.verdict.isVisible() and view.cards
    view.run_button.click()
    assert not view.verdict.isVisible()
    assert view.cards == {} and view.report is None


# Headlines that hold only at the settings they were made at ---------------------------------


def _fp16_card(window):
    """An fp16-capable GPU whose Auto is fp16 everywhere."""
    from app.core.settings import FIELDS, PRECISION_KEYS

    recommended = {key: FIELDS[key].default for key in PRECISION_KEYS}
    recommended.update(
        precision="fp16", unet_precision="fp16", vae_precision="fp16", text_encoder_precision="fp16"
    )
    card = replace(
        reports.gtx_1660_super().devices[0],
        name=reports.RTX_3060.name,
        fp16="fast",
        quirks=(),
        recommended=recommended,
        reasons={},
    )
    window.state.set_hardware(replace(reports.gtx_1660_super(), devices=[card]))


def _demo_plan(dtype: str) -> PrecisionPlan:
    """A plan of the demo's three parts, each in `dtype`."""
    return PrecisionPlan(
        device="cuda", dtypes=dict.fromkeys(("text_encoder", "unet", "vae"), dtype)
    )


def test_a_saved_headline_made_at_other_settings_is_no_verdict_after_a_restart(window, engines):
    """Saved at no-half, shown after a restart while the next job runs in fp16: no green
    "Safe", but what it was made at and what the next job runs; back when they agree."""
    from app.core.health import saved
    from tests.ui.conftest import DEMO_SUMMARY

    _fp16_card(window)
    fp32 = _demo_plan("fp32")
    saved.save_report(DEMO_SUMMARY.profile_key, reports.result(reports.report(plan=fp32)))
    load_fake_model(window, engines)
    page = window.health_view
    assert page.verdict.level == "info"
    text = page.verdict.text.text()
    assert "Not checked at your settings" in text and "Healthy" not in text
    assert "ran at fp32 everywhere; the next job runs at fp16 everywhere" in text
    assert window.precision_status.text() == "Precision: fp16 everywhere"

    window.state.set_setting("no_half", True)
    assert page.verdict.level == "good"
    assert "at fp32 everywhere" in page.verdict.text.text()
    assert "Healthy" in page.verdict.text.text()


def test_after_a_restart_the_last_report_is_shown_in_full_as_saved(window, engines):
    """Not only its headline: every part's figures, the fix and its candidates, from the
    Markdown saved with it; a check run now replaces it."""
    from app.core.health import saved
    from tests.ui.conftest import DEMO_SUMMARY

    markdown = (
        "# HalfSafe health check: demo\n\n**Fixable: the VAE overflows.**\n\n"
        "| component | dtype | status |\n|---|---|---|\n| vae | fp16 | overflows |\n"
    )
    saved.save_report(
        DEMO_SUMMARY.profile_key, reports.result(reports.fixable(), markdown=markdown)
    )
    load_fake_model(window, engines)
    page = window.health_view
    (card,) = [c for c in page.findChildren(Card) if c.isVisibleTo(page)]
    (shown,) = [
        w for w in card.findChildren(QLabel) if w.textFormat() == Qt.TextFormat.MarkdownText
    ]
    assert "| vae | fp16 | overflows |" in shown.text()
    assert not shown.text().startswith("# HalfSafe")  # the card's title says it
    assert "its report as saved is below" in page.verdict.text.text()
    page.run_check()
    assert not card.isVisibleTo(page)


def test_a_saved_report_whose_fix_is_in_use_says_so(window, engines):
    """After a restart the saved "Fixable" headline says the fix it proved is what the next
    job runs (the status bar said so; the page did not)."""
    from app.core.fixing.profiles import RememberedFix
    from app.core.health import saved
    from app.core.precision.words import plan_words

    _fp16_card(window)
    report = reports.islands()
    fix = report.fix
    assert fix is not None
    remembered = RememberedFix(dict(fix.settings), fix.summary, "health check", 0.0)
    summary = replace(DEMO_SUMMARY, remembered_fix=remembered)
    window.state.set_model(summary, None)
    expected = window.state.expected_plan()
    assert expected is not None
    fix = replace(fix, plan=expected)  # the fix's plan as the next job resolves it
    saved.save_report(summary.profile_key, reports.result(replace(report, fix=fix)))
    window.state.set_model(None, None)
    load_fake_model(window, engines, summary)
    text = window.health_view.verdict.text.text()
    assert plan_words(expected) in window.precision_status.text()
    assert "The fix it proved is in use: your next job runs with it." in text
    window.state.set_setting("fp32_modules", ["vae:decoder.conv_in"])  # replaces its layers
    assert "The fix it proved is in use" not in window.health_view.verdict.text.text()


def test_a_shown_check_stops_being_a_verdict_when_the_settings_change(window, engines):
    _fp16_card(window)
    view, job = _run_check(window, engines)
    fp16 = _demo_plan("fp16")
    engines.current.finish(job, reports.result(reports.report(plan=fp16)))
    assert view.verdict.level == "good"
    window.state.set_setting("precision", "fp32")
    assert view.verdict.level == "info"
    assert "the next job runs at fp32 everywhere" in view.verdict.text.text()
    window.state.set_setting("precision", "auto")
    assert view.verdict.level == "good"


def test_the_fix_a_check_remembered_shows_in_the_status_bar_at_once(window, engines):
    """The check remembered a fix: the status bar says the next job runs with it, before any
    job, and the check's headline still holds (the fix is what it found)."""
    from app.core.fixing.profiles import RememberedFix
    from tests.ui.conftest import DEMO_SUMMARY

    _fp16_card(window)
    view, job = _run_check(window, engines)
    assert window.precision_status.text() == "Precision: fp16 everywhere"
    fix = RememberedFix({"fp32_modules": ["vae:decoder.a.conv1"]}, "", "health check", 0.0)
    remembered = replace(DEMO_SUMMARY, remembered_fix=fix, remembered_on=reports.RTX_3060.name)
    fixable = reports.report(
        plan=_demo_plan("fp16"),
        verdict=Verdict.FIXABLE,
        fix=reports.vae_fp32_fix(),
    )
    engines.current.finish(job, replace(reports.result(fixable), model=remembered))
    assert window.state.model == remembered
    assert window.precision_status.text() == "Precision: fp16, with 1 VAE layer in fp32"
    assert view.verdict.level == "warn" and view.report is not None


def test_a_fix_whose_words_hold_an_apostrophe_shows_it_not_its_entity(window, engines):
    """A clamp's summary says "fp16's range": escaped for the card, it must still be shown as
    an apostrophe (a tagless label is taken for plain text and showed "fp16&#x27;s")."""
    view, job = _run_check(window, engines)
    report = reports.fixable()
    assert report.fix is not None
    words = "The VAE overflowed; fix: clamp 1 VAE layer to fp16's range. Verified."
    report = replace(report, fix=replace(report.fix, summary=words, quality=None))
    engines.current.finish(job, reports.result(report))
    QApplication.processEvents()

    shown = [w for w in view.findChildren(QLabel) if "fp16" in w.text() and "range" in w.text()]
    assert shown
    for widget in shown:
        document = QTextDocument()
        if widget.textFormat() == Qt.TextFormat.RichText:
            document.setHtml(widget.text())
        else:
            document.setPlainText(widget.text())
        assert "fp16's range" in document.toPlainText()


def test_a_part_fine_as_run_but_not_in_fp16_is_never_a_plain_green_ok(window, engines):
    """The VAE ran in fp32 and would overflow in fp16: its chip says both, as a warning, beside
    'fp16 would overflow'. The UNet ran in fp16 with layers kept in bf16: its largest value is
    fp16's, and the bf16 layers' larger one is said apart (never '(run in fp16)' past 65,504)."""
    view, job = _run_check(window, engines)
    parts = reports.components()
    vae = replace(
        parts["vae"],
        dtype="fp32",
        status=Status.OK,
        first_bad_module=None,
        max_abs=387513.0,
        headroom=65504 / 387513.0,
        precisions={
            "fp16": PrecisionOutcome(Status.OVERFLOW, False),
            "bf16": PrecisionOutcome(Status.OK, False),
        },
    )
    unet = replace(
        parts["unet"], status=Status.OK, max_abs=20000.0, headroom=3.3, wider_max_abs=387072.0
    )
    report = reports.report(
        plan=reports.plan(dtypes={"vae": "fp32"}), components={**parts, "vae": vae, "unet": unet}
    )
    engines.current.finish(job, reports.result(report))

    def shown(name):
        return " ".join(w.text() for w in view.cards[name].findChildren(QLabel))

    (chip,) = [c for c in view.cards["vae"].findChildren(Chip) if "Ok" in c.text()]
    assert chip.text() == "Ok in fp32; fp16 overflows" and chip.level == "warn"
    assert "fp16 would overflow" in shown("vae")
    unet_text = shown("unet")
    assert "Largest value held in fp16: <b>20,000</b>" in unet_text
    assert "The layers kept wider reached 387,072, which their precision holds" in unet_text
    assert "(run in fp16)" not in unet_text


def test_a_hires_fix_from_a_pixel_upscaler_has_the_check_probe_the_vae_encoder(window, engines):
    """The Generate page's hires fix enlarges the decoded picture with Lanczos: the check is
    asked to run the VAE's encoder too; a latent upscaler, or no hires fix, does not ask it."""
    view, job = _run_check(window, engines)
    asked = [job.params.pixel_upscale]
    window.state.set_setting("hires_scale", 2.0)
    for upscaler in ("latent", "lanczos"):
        engines.current.finish(job, reports.result(reports.fixable()))
        window.state.set_setting("hires_upscaler", upscaler)
        view.run_check()
        job = engines.current.last_job("check")
        asked.append(job.params.pixel_upscale)
    assert asked == [False, False, True]
