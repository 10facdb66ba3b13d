"""The Generate page's LoRA list: each LoRA with its own weight goes with the job and is
remembered; a damaged saved list costs only its damaged entries."""

from __future__ import annotations

import json

import pytest

from app.core.lora import LoraRequest
from tests.ui.conftest import load_fake_model


@pytest.fixture
def view(window, engines):
    load_fake_model(window, engines)
    window.show_page("Generate")
    view = window.generate_view
    view.prompt.setPlainText("a lighthouse at dusk")
    return view


def test_each_lora_goes_with_the_job_at_its_own_weight(view, engines):
    view.loras.add("/models/Lora/ink.safetensors", 0.7)
    view.loras.add("/models/Lora/grain.safetensors")
    view.loras.rows[1].weight.setValue(-0.5)
    view.generate()
    job = engines.current.last_job("generate")
    assert job.params.loras == (
        LoraRequest("/models/Lora/ink.safetensors", 0.7),
        LoraRequest("/models/Lora/grain.safetensors", -0.5),
    )
    assert json.loads(view.ui_settings.value("generate/loras")) == [
        {"path": "/models/Lora/ink.safetensors", "weight": 0.7},
        {"path": "/models/Lora/grain.safetensors", "weight": -0.5},
    ]


def test_removing_a_lora_leaves_it_out_of_the_next_job(view, engines):
    view.loras.add("/a.safetensors", 0.3)
    view.loras.add("/b.safetensors", 0.6)
    view.loras.rows[0].removed.emit(view.loras.rows[0])
    view.generate()
    assert engines.current.last_job("generate").params.loras == (
        LoraRequest("/b.safetensors", 0.6),
    )


def test_a_damaged_saved_list_keeps_what_is_usable(view):
    view.loras.set_entries(
        [
            {"path": "/ok.safetensors", "weight": 99},
            {"path": 3},
            "junk",
            {"path": "/w", "weight": "x"},
        ]
    )
    assert view.loras.entries() == [{"path": "/ok.safetensors", "weight": 10.0}]
