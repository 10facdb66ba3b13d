"""The Devices page: asks the engine on first view, shows quirks with sources, applies the
recommendation."""

from __future__ import annotations

from PySide6.QtWidgets import QLabel

from app.core.requests.records import HardwareRequest
from app.core.settings import PRECISION_KEYS, load_settings
from app.engine.events import EventState
from tests.support.reports import gtx_1660_super


def _texts(widget) -> str:
    return " ".join(label.text() for label in widget.findChildren(QLabel))


def test_first_view_starts_the_engine_and_shows_the_report(window, engines):
    assert engines.started == []
    window.show_page("Devices")
    job = engines.current.last_job("hardware")
    assert job.params == HardwareRequest(self_test=True, retest=False)
    engines.current.emit(job, EventState.RESULT, result=gtx_1660_super())

    view = window.gpu_view
    text = _texts(view)
    assert "NVIDIA GeForce GTX 1660 SUPER" in text
    assert "unreliable here (known to give NaN)" in text
    assert "GTX 16xx cards can return NaN from fp16 convolutions." in text
    assert "https://github.com/pytorch/pytorch/issues/58123" in text
    assert "fp16: fail" in text
    assert "conv2d 4->320 in fp16" in text
    assert "This card returns NaN from fp16 convolutions" in text
    assert window.device_status.text() == "Device: NVIDIA GeForce GTX 1660 SUPER"
    # Seeing the page again does not ask again.
    window.show_page("Models")
    window.show_page("Devices")
    assert len(engines.current.jobs("hardware")) == 1


def test_apply_recommended_writes_every_precision_setting(window, engines):
    window.show_page("Devices")
    job = engines.current.last_job("hardware")
    engines.current.emit(job, EventState.RESULT, result=gtx_1660_super())
    button, recommended = window.gpu_view.apply_buttons[0]
    assert button.isEnabled()
    button.click()
    saved = load_settings().settings
    for key in PRECISION_KEYS:
        assert saved[key] == recommended[key], key
    assert not button.isEnabled()
    assert button.text() == "Recommended settings in use"


def test_self_test_again_asks_for_a_retest(window, engines):
    window.show_page("Devices")
    first = engines.current.last_job("hardware")
    engines.current.emit(first, EventState.RESULT, result=gtx_1660_super())
    window.gpu_view.self_test_button.click()
    assert engines.current.last_job("hardware").params.retest is True
