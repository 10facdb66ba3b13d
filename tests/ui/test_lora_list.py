"""The Generate page's LoRA list: each LoRA with its own weight goes with the job and is
remembered; a damaged saved list costs only its damaged entries. The LoRA browser lists the Lora
folders with what each file says, searched and filtered, and offers trigger words by a button."""

from __future__ import annotations

import json

import pytest

from app.core.lora.files import LoraRequest
from tests.support.model_cards import KOHYA_SDXL, MODELSPEC_SD1, lora_file, png_file, raw_header
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


# The LoRA browser ------------------------------------------------------------------------------


@pytest.fixture
def lora_folders(tmp_path):
    """An A1111 install: a model folder, and LoRAs beside it in models/Lora and models/LyCORIS,
    one with a preview picture, one with a preview that is not a picture, one hostile."""
    models = tmp_path / "webui" / "models"
    (models / "Stable-diffusion").mkdir(parents=True)
    lora_file(models / "Lora" / "inkwash.safetensors", KOHYA_SDXL)
    png_file(models / "Lora" / "inkwash.preview.png")
    lora_file(models / "LyCORIS" / "paper.safetensors", MODELSPEC_SD1)
    (models / "LyCORIS" / "paper.png").write_bytes(b"\x89PNG\r\n\x1a\n but cut short")
    raw_header(models / "Lora" / "hostile.safetensors", b"\xff\xfe" * 100)
    return models


def _browse(view, qtbot, models, family: str | None = None):
    """Open the browser on `models`, filtered to `family` (None: every family)."""
    view.loras.model_folders = lambda: [str(models / "Stable-diffusion")]
    view.loras.model_family = lambda: family
    browser = view.loras.browse()
    qtbot.waitUntil(lambda: browser.tree.topLevelItemCount() == 3, timeout=20000)
    return browser


def _listed(browser) -> list[str]:
    return [
        browser.tree.topLevelItem(i).text(0)
        for i in range(browser.tree.topLevelItemCount())
        if not browser.tree.topLevelItem(i).isHidden()
    ]


def test_the_browser_lists_the_lora_folders_with_what_each_file_says(view, qtbot, lora_folders):
    browser = _browse(view, qtbot, lora_folders)
    assert _listed(browser) == ["hostile", "inkwash", "Paper Cut"]
    hostile, ink, paper = (browser.tree.topLevelItem(i) for i in range(3))
    assert ink.text(1) == "SDXL" and ink.text(2) == "1girl, inkwash style, mountain"
    assert ink.text(3) == "1024×1024"
    assert paper.text(1) == "Stable Diffusion 1.x" and paper.text(3) == "512×512"
    assert hostile.text(1) == "damaged" and "not text" in hostile.toolTip(0)
    browser.tree.setCurrentItem(hostile)  # a damaged file is said, never added
    assert "not text" in browser.details.text() and not browser.add_button.isEnabled()
    browser.add_current()
    assert view.loras.entries() == [] and browser.isVisible()
    browser.tree.setCurrentItem(ink)
    assert browser.add_button.isEnabled()
    assert browser.details.text() == (
        "inkwash.safetensors: Base model: SDXL (trained from sd_xl_base_1.0.safetensors); "
        "Trigger words: 1girl, inkwash style, mountain; Trained at 1024×1024; Rank 32, alpha 16."
    )
    assert "3 LoRAs found" in browser.status.text()
    # Previews are made on a worker: a picture becomes the icon, a broken one a sentence.
    assert browser.previews.wait_idle(10)
    qtbot.waitUntil(lambda: "not a PNG, JPEG or WebP" in paper.toolTip(0), timeout=5000)
    qtbot.waitUntil(lambda: ink.icon(0).pixmap(40, 40).toImage().pixelColor(20, 20).alpha() == 255)
    assert paper.icon(0).pixmap(40, 40).toImage().pixelColor(20, 20).alpha() == 0


def test_the_browser_searches_trigger_words_and_filters_by_family(view, qtbot, lora_folders):
    browser = _browse(view, qtbot, lora_folders)
    browser.search.setText("layered")  # a trigger phrase of Paper Cut
    assert _listed(browser) == ["Paper Cut"]
    assert browser.current_lora()["path"].endswith("paper.safetensors")
    browser.search.setText("nothing like it")
    assert _listed(browser) == [] and not browser.add_button.isEnabled()
    browser.search.clear()
    families = [browser.family.itemText(i) for i in range(browser.family.count())]
    assert families == ["All families", "SDXL", "Stable Diffusion 1.x", "Other"]
    browser.family.setCurrentText("SDXL")
    assert _listed(browser) == ["inkwash"]


def test_a_lora_chosen_in_the_browser_joins_the_list_and_offers_its_words(
    view, qtbot, lora_folders, engines
):
    browser = _browse(view, qtbot, lora_folders)
    browser.search.setText("inkwash")
    browser.add_button.click()
    assert view.loras.browser is None  # the dialog closed
    path = str(lora_folders / "Lora" / "inkwash.safetensors")
    assert view.loras.entries() == [{"path": path, "weight": 1.0}]
    assert view.prompt.toPlainText() == "a lighthouse at dusk"  # never silently
    row = view.loras.rows[0]
    qtbot.waitUntil(row.words_button.isVisible)
    offered = []
    view.loras.add_to_prompt.connect(offered.append)
    row.words_button.click()
    assert offered == ["1girl, inkwash style, mountain"]
    view.generate()
    assert engines.current.last_job("generate").params.loras == (LoraRequest(path, 1.0),)


def test_trigger_words_go_to_the_clipboard_when_nothing_takes_them(qtbot):
    from PySide6.QtGui import QGuiApplication

    from app.ui.lora_list import LoraList

    loras = LoraList()  # alone: the Generate page's takes them into its prompt
    qtbot.addWidget(loras)
    loras.show()
    loras.add("/models/Lora/x.safetensors", 0.8, ("xstyle", "ink"))
    loras.add("/models/Lora/plain.safetensors")
    row, plain = loras.rows
    qtbot.waitUntil(row.words_button.isVisible)
    assert not plain.words_button.isVisible()
    row.words_button.click()
    assert QGuiApplication.clipboard().text() == "xstyle, ink"
    assert "Copied" in row.words_button.toolTip()


def test_the_browser_opens_on_the_loaded_models_family_when_the_page_says_it(
    view, qtbot, lora_folders
):
    browser = _browse(view, qtbot, lora_folders, "Stable Diffusion 1.x")
    assert browser.family.currentText() == "Stable Diffusion 1.x"
    assert _listed(browser) == ["Paper Cut"]
