"""The Models page's "Which file runs on this device" panel: it follows the highlighted
model's family, lets the user choose another, and shows core's answer and its table of stored
forms (each row's tooltip the form's sentence), the record `halfsafe advise` prints, on the
device the settings pick; the whole answer is in sight at 1024x700. The Devices page says when
the int8 kernels other tools run were not tried."""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest
from PySide6.QtWidgets import QAbstractItemView, QLabel

from app.core.advice import advise_on
from app.core.components import Verdict
from app.core.formats.weight_findings import StoredQuantization
from app.core.health import saved
from app.core.identities import DeviceIdentity
from app.ui.advice_panel import TAB, WAITING
from tests.support import recorded_devices, reports


def _shown(panel) -> list[str]:
    """Each table row's form sentence (its tooltip)."""
    table = panel.table
    return [table.topLevelItem(i).toolTip(0) for i in range(table.topLevelItemCount())]


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
    assert panel.table.topLevelItemCount() == 0 and not panel.answer.text()


def test_the_panel_follows_the_highlighted_model_and_says_what_advise_says(window):
    view, panel = window.models_view, window.models_view.advice
    card = recorded_devices.gtx_1660()
    _scan(view, "flux-dev", "flux2-klein")
    window.state.set_hardware(card)
    view.library.setCurrentItem(view.library.topLevelItem(2))  # the Flux.1 dev file
    assert panel.family.currentData() == "flux-dev"
    expected = advise_on("flux-dev", card, "auto")
    assert panel.answer.text() == expected.answer
    assert _shown(panel) == [form.sentence for form in expected.forms]
    assert panel.rows_shown() == [row.cells() for row in expected.table]
    assert panel.answer.toolTip() == f"Flux.1 dev on {expected.device_words()}"
    assert "NVIDIA GeForce GTX 1660 (cuda, compute capability 7.5" in panel.answer.toolTip()
    view.library.setCurrentItem(view.library.topLevelItem(3))  # the Klein file
    assert panel.family.currentData() == "flux2-klein"
    assert len(_shown(panel)) == 12  # 6 forms x Klein 4B and 9B
    # Read-only: the table takes no edit.
    assert panel.table.editTriggers() == QAbstractItemView.EditTrigger.NoEditTriggers


def test_another_family_can_be_chosen_and_the_demo_is_sd_1(window):
    view, panel = window.models_view, window.models_view.advice
    card = recorded_devices.m1()
    window.state.set_hardware(card)
    view.library.setCurrentItem(view.library.topLevelItem(0))  # the built-in demo
    view._selection_changed()
    assert panel.family.currentData() == "sd1"
    assert len(_shown(panel)) == 1 and "Apple's GPU computes bf16 through fp32" in _shown(panel)[0]
    assert panel.answer.text().startswith("On this Apple GPU (Apple M1, 16 GB of RAM): take the")
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
    [row] = [r for r in panel.rows_shown() if r[0] == "GGUF Q8_0"]
    assert row[4] == "yes, healthy"


def _fully_in_sight(widget: QLabel, window) -> None:
    """The label's whole text is drawn: it is as tall as its wrapped text needs, and no part of
    it is cut off by its parents or the window."""
    assert widget.isVisible()
    assert widget.height() >= widget.heightForWidth(widget.width()), widget.text()
    assert widget.visibleRegion().boundingRect() == widget.rect(), widget.text()
    bottom = widget.mapTo(window, widget.rect().bottomLeft()).y()
    assert bottom <= window.centralWidget().geometry().bottom()


@pytest.mark.parametrize("device", ["gtx_1660_super", "rtx_3060", "cpu_only"])
def test_the_whole_answer_is_in_sight_at_1024_by_700(qtbot, window, monkeypatch, device):
    monkeypatch.setitem(sys.modules, "comfy_kitchen", None)  # a fresh install has none
    window.state.set_hardware(getattr(recorded_devices, device)())
    window.show_page("Models")
    view, panel = window.models_view, window.models_view.advice
    # As on a first start: the hint above the list takes its room too.
    view.first_start_hint.show_message("info", "<b>New here?</b> Load the demo model.", [])
    window.resize(1024, 700)
    assert view.lower_tabs.tabText(view.lower_tabs.currentIndex()) == TAB
    for family in ("zimage-turbo", "flux-dev", "anima", "flux2-klein"):
        panel.family.setCurrentIndex(panel.family.findData(family))
        qtbot.wait(50)
        assert "take the" in panel.answer.text() or "no projection" in panel.answer.text()
        _fully_in_sight(panel.answer, window)
        if panel.kernels.text():
            _fully_in_sight(panel.kernels, window)
        table = panel.table
        assert table.topLevelItemCount() >= 6
        assert table.horizontalScrollBar().maximum() == 0, family
        # Two rows at least in sight, the table inside the window.
        assert table.height() >= table.minimumHeight() > 0
        bottom = table.mapTo(window, table.rect().bottomLeft()).y()
        assert bottom <= window.centralWidget().geometry().bottom()
    if device != "cpu_only":  # Anima is published int8 ConvRot: were its kernels tried?
        panel.family.setCurrentIndex(panel.family.findData("anima"))
        assert "were not tried on this GPU" in panel.kernels.text()


def test_without_the_first_start_hint_every_form_is_in_sight(qtbot, window):
    window.state.set_hardware(recorded_devices.gtx_1660_super())
    window.show_page("Models")
    window.resize(1024, 700)
    panel = window.models_view.advice
    panel.family.setCurrentIndex(panel.family.findData("zimage-turbo"))
    qtbot.wait(50)
    _fully_in_sight(panel.answer, window)
    assert panel.table.verticalScrollBar().maximum() == 0  # all six forms, no scroll bar


def test_the_devices_page_says_the_int8_kernels_were_not_tried(qtbot, window, monkeypatch):
    monkeypatch.setitem(sys.modules, "comfy_kitchen", None)
    window.state.set_hardware(recorded_devices.rtx_3060())
    window.show_page("Devices")
    shown = [w.text() for w in window.gpu_view.findChildren(QLabel) if w.isVisible()]
    [sentence] = [text for text in shown if "were not tried" in text]
    assert "comfy-kitchen is not installed beside HalfSafe" in sentence
    assert '-m pip install "comfy-kitchen==0.2.40"' in sentence
