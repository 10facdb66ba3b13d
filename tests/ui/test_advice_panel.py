"""The Models page's "Which file runs on this device" panel: it follows the highlighted
model's family, lets the user choose another, and lists core's sentence for each stored form,
the same record `halfsafe advise` prints, on the device the settings pick."""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QAbstractItemView

from app.core.advice import advise_on
from app.core.components import Verdict
from app.core.formats.weight_findings import StoredQuantization
from app.core.health import saved
from app.core.identities import DeviceIdentity
from app.ui.advice_panel import WAITING
from tests.support import recorded_devices, reports


def _shown(panel) -> list[str]:
    return [panel.sentences.item(i).text() for i in range(panel.sentences.count())]


def _scan(view, *architectures: str) -> None:
    view._library_scanned(
        [
            {
                "path": f"/models/{name}.safetensors",
                "architecture": name,
                "stored_dtype": "bf16",
                "size_bytes": 1000,
                "error": None,
            }
            for name in architectures
        ],
        "",
    )


def test_the_panel_waits_for_the_device_report(window):
    panel = window.models_view.advice
    assert window.state.hardware is None
    assert panel.device_text.text() == WAITING
    assert panel.sentences.count() == 0


def test_the_panel_follows_the_highlighted_model_and_says_what_advise_says(window):
    view, panel = window.models_view, window.models_view.advice
    card = recorded_devices.gtx_1660()
    _scan(view, "flux-dev", "flux2-klein")
    window.state.set_hardware(card)
    view.library.setCurrentItem(view.library.topLevelItem(2))  # the Flux.1 dev file
    assert panel.family.currentData() == "flux-dev"
    expected = advise_on("flux-dev", card, "auto")
    assert _shown(panel) == [form.sentence for form in expected.forms]
    assert panel.device_text.text() == f"Flux.1 dev on {expected.device_words()}"
    assert "NVIDIA GeForce GTX 1660 (cuda, compute capability 7.5" in panel.device_text.text()
    view.library.setCurrentItem(view.library.topLevelItem(3))  # the Klein file
    assert panel.family.currentData() == "flux2-klein"
    assert len(_shown(panel)) == 6
    # Read-only: the list takes no edit.
    assert panel.sentences.editTriggers() == QAbstractItemView.EditTrigger.NoEditTriggers
    assert not panel.sentences.item(0).flags() & Qt.ItemFlag.ItemIsEditable


def test_another_family_can_be_chosen_and_the_demo_is_sd_1(window):
    view, panel = window.models_view, window.models_view.advice
    card = recorded_devices.m1()
    window.state.set_hardware(card)
    view.library.setCurrentItem(view.library.topLevelItem(0))  # the built-in demo
    view._selection_changed()
    assert panel.family.currentData() == "sd1"
    assert len(_shown(panel)) == 1 and "Apple's GPU computes bf16 through fp32" in _shown(panel)[0]
    panel.family.setCurrentIndex(panel.family.findData("zimage-turbo"))
    assert _shown(panel) == [f.sentence for f in advise_on("zimage-turbo", card).forms]
    assert any(s.startswith("int8 ConvRot: ") for s in _shown(panel))


def test_a_saved_check_on_this_device_shows_as_proved(window, qtbot):
    view, panel = window.models_view, window.models_view.advice
    card = recorded_devices.rtx_2060()
    model = replace(
        reports.SDXL,
        architecture="flux-dev",
        quantization=StoredQuantization("gguf", ("Q8_0",), ("flux.gguf",), "bf16"),
    )
    health = reports.report(
        model=model, device=DeviceIdentity("cuda", card.devices[0].name), verdict=Verdict.HEALTHY
    )
    saved.save_report("c" * 64, reports.result(health))
    _scan(view, "flux-dev")  # lists the library: the saved reports are read again
    window.state.set_hardware(card)
    view.library.setCurrentItem(view.library.topLevelItem(2))
    qtbot.waitUntil(lambda: any("proved sdxl in this form healthy" in s for s in _shown(panel)))
    [proved] = [s for s in _shown(panel) if "proved" in s]
    assert proved.startswith("GGUF Q8_0: ")
