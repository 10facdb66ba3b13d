"""The Generate page and a model's own steps and CFG scale, with a fake engine: a newly loaded
Z-Image Turbo or Base starts at its family's defaults and sends them, the user's change stands,
the saved settings keep every other model's values, and a model that states none starts at
the settings again."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.core.settings import load_settings
from tests.ui.conftest import DEMO_SUMMARY


def _load(window, engines, tmp_path, name: str, architecture: str):
    """Load a model folder `name` that the fake engine says is `architecture`."""
    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    window.models_view.load_path(str(folder))
    job = engines.current.last_job("load")
    summary = replace(
        DEMO_SUMMARY, source=str(folder), name=name, architecture=architecture, native_size=1024
    )
    engines.current.finish(job, summary)
    assert window.state.model is not None and window.state.model.architecture == architecture
    view = window.generate_view
    view.prompt.setPlainText("a lighthouse at dusk")
    return view


def _sent(view, engines) -> tuple[int, float]:
    view.generate()
    generation = engines.current.last_job("generate").params.generation
    return generation.steps, generation.cfg


def test_a_newly_loaded_z_image_turbo_starts_at_its_own_steps_and_cfg_and_sends_them(
    window, engines, tmp_path
):
    window.show_page("Generate")
    view = _load(window, engines, tmp_path, "z-image-turbo", "zimage-turbo")

    assert (view.steps.value(), view.cfg.value()) == (9, 1.0)
    assert (
        "Steps and CFG scale set to 9 steps at CFG scale 1, Z-Image Turbo's defaults."
        in view.size_hint.text()
    )
    assert _sent(view, engines) == (9, 1.0)
    # The settings keep every other model's steps and CFG; the form keeps this model's.
    saved = load_settings().settings
    assert (saved["steps"], saved["cfg"]) == (25, 7.0)
    assert (view.steps.value(), view.cfg.value()) == (9, 1.0)


def test_the_users_change_stands_and_each_new_model_starts_at_its_own_or_the_settings(
    window, engines, tmp_path
):
    window.show_page("Generate")
    view = _load(window, engines, tmp_path, "z-image", "zimage-base")
    assert (view.steps.value(), view.cfg.value()) == (28, 4.0)

    view.steps.setValue(40)
    assert _sent(view, engines) == (40, 4.0)
    assert view.steps.value() == 40  # the user's change stands after the job
    assert load_settings().settings["steps"] == 25

    view = _load(window, engines, tmp_path, "z-image-turbo", "zimage-turbo")
    assert (view.steps.value(), view.cfg.value()) == (9, 1.0)

    view = _load(window, engines, tmp_path, "sd15", "sd1")  # states none: the settings'
    assert (view.steps.value(), view.cfg.value()) == (25, 7.0)
    assert "Steps and CFG scale are your settings' again." in view.size_hint.text()
    view.steps.setValue(30)
    assert _sent(view, engines) == (30, 7.0)
    assert load_settings().settings["steps"] == 30  # an ordinary model's choice is kept


@pytest.mark.parametrize("page_first", [False, True])
def test_the_users_size_outlives_a_restart_with_the_same_model(
    qtbot, engines, tmp_path, page_first
):
    """A newly loaded model starts at its own size, and the user's change stands: after a
    restart too, where the same model loaded again (before or after the page is visited) took
    its own size back over the saved one."""
    from app.ui.application import application, build_main_window
    from tests.ui.conftest import load_fake_model

    application()
    first = build_main_window(engines)
    qtbot.addWidget(first)
    load_fake_model(first, engines)
    view = first.generate_view
    assert (view.width_box.value(), view.height_box.value()) == (128, 128)  # the demo's own
    view.width_box.setValue(256)
    view.height_box.setValue(192)
    view.prompt.setPlainText("a lighthouse at dusk")
    view.generate()
    first.close()
    assert (load_settings().settings["width"], load_settings().settings["height"]) == (256, 192)

    second = build_main_window(engines)
    qtbot.addWidget(second)
    if page_first:
        second.show_page("Generate")
    load_fake_model(second, engines)  # the last model, loaded again
    view = second.generate_view
    assert (view.width_box.value(), view.height_box.value()) == (256, 192)
    assert "made for 128×128" in view.size_hint.text()  # and the model's own is offered
    second.close()

    # Another model starts at its own size, as before.
    third = build_main_window(engines)
    qtbot.addWidget(third)
    view = _load(third, engines, tmp_path, "other", "sd1")
    assert (view.width_box.value(), view.height_box.value()) == (1024, 1024)
    third.close()
