"""Layout and words a user trips over: settings controls in one column that never jumps, what
no-half and a CPU mean for the recommendations, a check that is not "Done" before it is, the
title, and the engine log's path when no program opens it."""

from __future__ import annotations

from PySide6.QtCore import QPoint
from PySide6.QtWidgets import QApplication, QLabel

from app.core.hardware import HardwareReport
from app.engine.events import EventState
from app.ui import dialogs as dialogs_module
from tests.support.gallery_outputs import NoFileManager
from tests.support.reports import gtx_1660_super, on_a_cpu
from tests.ui.conftest import load_fake_model


def _cpu_hardware() -> HardwareReport:
    return on_a_cpu(gtx_1660_super(), attention_backend="flash", no_half=True, no_half_vae=True)


def test_settings_controls_start_at_the_same_x_in_every_group(window):
    window.show_page("Settings")
    QApplication.processEvents()
    view = window.settings_view
    xs = {editor.mapTo(view, QPoint(0, 0)).x() for editor in view.editors.values()}
    assert len(xs) == 1, xs


def test_toggling_a_setting_never_moves_it_under_the_pointer(window):
    # Narrow: the explanations above No-half wrap, so swapping them changes their height.
    window.show_page("Settings")
    window.resize(800, 600)
    QApplication.processEvents()
    view = window.settings_view
    area = view._scroll_area()
    editor = view.editors["no_half"]
    area.ensureWidgetVisible(editor, 0, 200)
    QApplication.processEvents()
    before = editor.mapTo(area.viewport(), QPoint(0, 0)).y()
    for value in (True, False, True):
        view._edited("no_half", value)
        QApplication.processEvents()
        assert editor.mapTo(area.viewport(), QPoint(0, 0)).y() == before


def test_with_no_half_on_the_vae_and_precisions_say_fp32_not_a_recommendation(window):
    window.state.set_hardware(gtx_1660_super())
    window.state.apply({"no_half": True, "no_half_vae": False})
    view = window.settings_view
    for key in ("no_half_vae", "vae_precision", "precision"):
        text = view.resolution_text(key)
        assert "No-half is on" in text and "Recommended" not in text


def test_on_a_cpu_no_flash_attention_is_recommended_and_auto_never_means_auto(window):
    window.state.set_hardware(_cpu_hardware())
    view = window.settings_view
    text = view.resolution_text("attention_backend")
    assert "Flash" not in text and "CPU" in text
    window.show_page("Devices")
    gpu_texts = " ".join(w.text() for w in window.gpu_view.findChildren(QLabel))
    assert "Flash attention" not in gpu_texts and "fused CPU kernel" in gpu_texts
    window.state.apply({"attention_backend": "math"})
    assert "Flash" not in view.resolution_text("attention_backend")
    report = on_a_cpu(_cpu_hardware(), attention_backend="auto")
    window.state.apply({"attention_backend": "auto"})
    window.state.set_hardware(report)
    for key in view.editors:
        assert "Auto means Auto" not in view.resolution_text(key)


def test_the_check_is_not_done_before_its_report_arrives(window, engines):
    load_fake_model(window, engines)
    view = window.health_view
    view.run_check()
    job = engines.current.last_job("check")
    engines.current.emit(job, EventState.PROGRESS, stage="Checking the VAE", done=2, total=4)
    assert view.progress.value() / view.progress.maximum() == 0.5  # two stages of four done
    engines.current.emit(job, EventState.PROGRESS, stage="Done", done=4, total=4)
    assert "Done" not in view.stage.text()
    assert view.progress.maximum() == 0  # busy, not a full bar
    assert not view.progress.isHidden()


def test_the_title_says_halfsafe_once(window):
    assert window.windowTitle().count("HalfSafe") == 1
    assert QApplication.applicationDisplayName() in ("HalfSafe", "halfsafe")


def test_show_engine_log_without_a_file_manager_shows_its_path(window, monkeypatch):
    monkeypatch.setattr(dialogs_module, "QDesktopServices", NoFileManager)
    from app.engine.process import log_path

    action = next(
        a for m in window.menuBar().actions() for a in m.menu().actions() if "log" in a.text()
    )
    action.trigger()
    assert str(log_path()) in window.dialogs.shown[-1].message
    window.dialogs.close_all()
