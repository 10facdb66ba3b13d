"""Pages are built on their first visit: the window starts with only the page on screen built
and without importing the other pages' modules (nor the readers and stores that the records it
reads once lived beside); visiting a page builds it once; a page built late shows what happened
before it existed."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from app.ui.main_window import PAGES
from tests.support import reports
from tests.support.window_imports import BESIDE_THE_RECORDS
from tests.ui.conftest import load_fake_model

ROOT = Path(__file__).resolve().parents[2]

# What each page imports that the window needs only once that page (or one of its dialogs) is
# built; the Models page is the one on screen at a first start.
OTHER_PAGES_MODULES = [
    "app.ui.health_view",
    "app.ui.fixes_view",
    "app.ui.generate_view",
    "app.ui.gpu_view",
    "app.ui.settings_view",
    "app.ui.gallery",
    "app.ui.explain_view",
    "app.ui.image_viewer",
    "app.ui.help_view",
    "app.core.families.registry",
]
# What the window needs only on one later path, not to show: the image reader (an image dropped
# or opened) and the demo's tokenizer (the engine builds the demo). With the modules the records
# it reads once lived beside (`BESIDE_THE_RECORDS`), what its launch must not import.
LATER_PATHS = ["app.core.explain.image_file", "app.core.encoders.tokenizers"]
NOT_AT_LAUNCH = OTHER_PAGES_MODULES + LATER_PATHS + sorted(BESIDE_THE_RECORDS)


def test_only_the_page_on_screen_is_built_at_start(window):
    assert window.current_page() == "Models"
    assert window.built_pages() == ["Models"]
    assert window.pages.currentWidget() is window.page_hosts["Models"]
    # Reading the status bar's device line did not build the Devices page.
    assert window.device_status.text().startswith("Device:")
    assert not window.page_hosts["Devices"].built


def test_visiting_each_page_builds_it_once(window):
    built = {}
    for name in PAGES:
        window.show_page(name)
        host = window.page_hosts[name]
        assert host.built and host.page.isVisible()
        assert window.pages.currentWidget() is host
        built[name] = host.page
    assert window.built_pages() == list(PAGES)
    for name in reversed(PAGES):  # a second visit finds the same page, and only it
        window.show_page(name)
        host = window.page_hosts[name]
        assert host.page is built[name]
        assert host.layout().count() == 1
    assert window.health_view is built["Health check"]
    assert window.generate_view is built["Generate"]


def test_reading_a_page_attribute_builds_that_page_alone(window):
    view = window.generate_view
    assert window.built_pages() == ["Models", "Generate"]
    assert window.page_hosts["Generate"].page is view
    assert window.current_page() == "Models"  # built, not shown


def test_the_window_restores_another_page_and_builds_only_it(qtbot, engines):
    from app.ui.application import application, build_main_window, ui_settings

    application()
    saved = ui_settings()
    saved.setValue("window/page", "Settings")
    saved.sync()
    main = build_main_window(engines)
    qtbot.addWidget(main)
    main.show()
    qtbot.waitExposed(main)
    assert main.current_page() == "Settings"
    assert main.built_pages() == ["Settings"]
    assert main.settings_view.isVisible()
    main.dialogs.close_all()


def test_a_page_built_late_shows_what_came_before_it(window, engines):
    load_fake_model(window, engines)
    window.state.set_hardware(reports.gtx_1660_super())
    assert not window.page_hosts["Devices"].built
    window.show_page("Devices")
    assert "found" in window.gpu_view.status.text()  # the report, not "not checked yet"
    window.show_page("Health check")
    assert window.health_view.run_button.isEnabled()  # the loaded model can be checked


def test_the_health_check_asks_no_unbuilt_generate_page_for_input_pictures(window, engines):
    load_fake_model(window, engines)
    window.health_view.run_check()
    job = engines.current.last_job("check")
    assert "Generate" not in window.built_pages()
    assert not job.params.images and job.params.mask is None


def test_closing_without_visiting_generate_keeps_the_saved_prompt(window):
    window.ui_settings.setValue("generate/prompt", "a lighthouse at dusk")
    window.save_state()
    assert "Generate" not in window.built_pages()
    assert window.ui_settings.value("generate/prompt") == "a lighthouse at dusk"
    assert window.generate_view.prompt.toPlainText() == "a lighthouse at dusk"


def test_showing_the_window_imports_only_what_showing_it_needs():
    code = (
        "import sys, json\n"
        "from app.ui.application import application, build_main_window\n"
        "app = application()\n"
        "window = build_main_window()\n"
        "window.show(); app.processEvents()\n"
        f"watched = {NOT_AT_LAUNCH!r}\n"
        "at_start = [name for name in watched if name in sys.modules]\n"
        "shown = window.current_page()\n"
        "for page in range(window.pages.count()):\n"
        "    window.navigation.setCurrentRow(page); app.processEvents()\n"
        "visited = [name for name in watched if name in sys.modules]\n"
        "window.client.shutdown()\n"
        "print(json.dumps({'shown': shown, 'at_start': at_start, 'visited': visited}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["shown"] == "Models"
    assert result["at_start"] == []
    # The watch list is real: visiting every page imports the pages' own modules.
    assert {
        "app.ui.health_view",
        "app.ui.fixes_view",
        "app.ui.generate_view",
        "app.ui.gpu_view",
        "app.ui.settings_view",
        "app.ui.gallery",
    } <= set(result["visited"])
    for name in LATER_PATHS:
        assert importlib.util.find_spec(name) is not None, name
