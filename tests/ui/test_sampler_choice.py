"""The sampler as two short lists, a sampler and its schedule, as AUTOMATIC1111 and ComfyUI
offer it (one list of every pair held dozens of entries): the request, the settings file and
the CLI keep the one value (`dpmpp_2m_sde_karras`)."""

from __future__ import annotations

import pytest

from app.core import samplers
from app.core.settings import load_settings
from app.ui.sampler_choice import SamplerChoice
from tests.ui.conftest import load_fake_model


def _choose(pair: SamplerChoice, sampler: str, schedule: str) -> None:
    """Pick as a user does: a sampler by its name, then a schedule by its name."""
    pair.sampler.setCurrentIndex(pair.sampler.findText(sampler))
    pair.schedule.setCurrentIndex(pair.schedule.findText(schedule))


@pytest.fixture
def view(window, engines):
    load_fake_model(window, engines)
    window.show_page("Generate")
    view = window.generate_view
    view.prompt.setPlainText("a lighthouse at dusk")
    return view


def test_the_generate_page_offers_a_sampler_then_its_schedules(view):
    pair = view.form.scheduler
    assert isinstance(pair, SamplerChoice)
    assert [pair.sampler.itemText(i) for i in range(pair.sampler.count())] == [
        s.name for s in samplers.SAMPLERS
    ]
    _choose(pair, "DPM++ 2M SDE", "Karras")
    assert [pair.schedule.itemText(i) for i in range(pair.schedule.count())] == [
        "Automatic",
        "Karras",
        "Exponential",
        "Beta",
        "SGM Uniform",
    ]
    assert pair.value() == "dpmpp_2m_sde_karras"
    # Another sampler keeps the schedule where it runs it, else takes its own.
    _choose(pair, "Heun", "Karras")
    assert pair.value() == "heun_karras"
    pair.sampler.setCurrentIndex(pair.sampler.findText("Euler a"))
    assert pair.schedule.currentText() == "Automatic" and pair.value() == "euler_a"
    assert pair.schedule.count() == 2  # its own, and SGM Uniform


def test_the_pair_is_sent_and_saved_as_the_one_value(view, engines):
    _choose(view.form.scheduler, "DPM++ 2M SDE", "Karras")
    view.generate()
    assert engines.current.last_job("generate").params.generation.scheduler == (
        "dpmpp_2m_sde_karras"
    )
    assert load_settings().settings["scheduler"] == "dpmpp_2m_sde_karras"


def test_every_value_of_the_setting_is_shown_and_read_back(qtbot):
    pair = SamplerChoice()
    qtbot.addWidget(pair)
    for key in samplers.KEYS:
        assert pair.set_value(key)
        assert pair.value() == key
    assert not pair.set_value("dpm_fast") and pair.value() == samplers.KEYS[-1]


def test_the_settings_page_offers_the_same_pair(window):
    window.show_page("Settings")
    pair = window.settings_view.editors["scheduler"].input
    assert isinstance(pair, SamplerChoice)
    _choose(pair, "UniPC", "Beta")
    assert window.state.settings["scheduler"] == "unipc_beta"
    assert load_settings().settings["scheduler"] == "unipc_beta"
