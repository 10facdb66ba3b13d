"""What happens after the window shows: the device is described, the last model comes back,
and the model list always highlights the model the engine holds."""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel

from app.core.requests.records import HardwareRequest
from app.engine.events import EventState
from tests.support.reports import gtx_1660_super
from tests.ui.conftest import DEMO_SUMMARY


def test_the_window_starts_nothing_until_it_is_shown(window, engines):
    # The fixture never calls start_background: nothing slow happens while building.
    assert engines.started == []


def test_the_device_is_described_at_start_without_visiting_the_gpu_page(window, engines):
    window.show_page("Models")
    window.start_background()
    job = engines.current.last_job("hardware")
    assert job.params == HardwareRequest(self_test=True, retest=False)
    assert window.device_status.text() == "Device: checking…"
    engines.current.emit(job, EventState.RESULT, result=gtx_1660_super())
    assert window.device_status.text() == "Device: NVIDIA GeForce GTX 1660 SUPER"
    assert window.current_page() == "Models"
    # Settings shows this computer's recommendations at once.
    texts = " ".join(w.text() for w in window.settings_view.findChildren(QLabel))
    assert "Recommended for this computer" in texts
    assert window.state.recommended()["no_half"] is True


def test_the_last_model_is_loaded_again_at_start(window, engines, tmp_path):
    checkpoint = tmp_path / "dreamshaper.safetensors"
    checkpoint.write_bytes(b"\0" * 16)
    window.ui_settings.setValue("models/last", str(checkpoint))
    window.start_background()
    load = engines.current.last_job("load")
    assert load.params.source == str(checkpoint)
    assert engines.current.jobs()[0].kind == "hardware"  # the device first, then the model


def test_a_last_model_that_is_gone_is_named_and_not_loaded(window, engines, tmp_path):
    gone = tmp_path / "deleted.safetensors"
    window.ui_settings.setValue("models/last", str(gone))
    window.start_background()
    assert engines.current.jobs("load") == []
    assert str(gone) in window.models_view.load_status.text()


def test_the_demo_comes_back_when_it_was_the_last_model(window, engines):
    window.models_view.load_path("demo")
    engines.current.finish(engines.current.last_job("load"), DEMO_SUMMARY)
    assert window.ui_settings.value("models/last") == "demo"


def _row_paths(view) -> list[str]:
    return [
        (view.library.topLevelItem(i).data(0, Qt.ItemDataRole.UserRole) or {}).get("path")
        for i in range(view.library.topLevelItemCount())
    ]


def test_a_model_opened_from_a_file_joins_the_list_and_is_the_highlighted_row(
    window, engines, tmp_path
):
    view = window.models_view
    checkpoint = tmp_path / "juggernaut.safetensors"
    checkpoint.write_bytes(b"\0" * 16)
    view.load_path("demo")
    engines.current.finish(engines.current.last_job("load"), DEMO_SUMMARY)
    assert view.library.currentItem().data(0, Qt.ItemDataRole.UserRole)["path"] == "demo"

    view.load_path(str(checkpoint))
    summary = replace(
        DEMO_SUMMARY,
        source=str(checkpoint),
        name="juggernaut",
        format="single_file",
        architecture="sdxl",
        stored_dtype="fp16",
    )
    engines.current.finish(engines.current.last_job("load"), summary)
    assert str(checkpoint) in _row_paths(view)
    current = view.library.currentItem()
    assert current.data(0, Qt.ItemDataRole.UserRole)["path"] == str(checkpoint)
    assert current.font(0).bold()
    assert "XL" in current.text(1) and current.text(2) == "fp16"
    assert view.load_button.text() == "Reload"
    # Choosing another row says Load: pressing it is a choice, never a silent swap.
    view.library.setCurrentItem(view.library.topLevelItem(0))
    assert view.load_button.text() == "Load"

    # After a restart the opened model is still listed.
    view._fill_library([])
    assert str(checkpoint) in _row_paths(view)
