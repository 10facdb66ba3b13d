"""The fix button with the REAL engine and the overflowing demo: Precision and VAE precision set
to fp16 by hand, a health check remembers the fix, the image comes out black, and "Apply fix
and regenerate" makes it finite on the first press, saying that the fix overrode the user's
own setting for that one job."""

from __future__ import annotations

import pytest
from PySide6.QtWidgets import QComboBox

from app.core.components import Verdict
from app.core.settings import load_settings, save_settings

LONG = 240_000  # ms; the engine imports torch and checks the demo: a while on 2 cores
pytestmark = pytest.mark.slow


@pytest.fixture
def real_window(qtbot, tmp_path):
    from app.ui.application import application, build_main_window

    loaded = load_settings().settings
    loaded["output_folder"] = str(tmp_path / "images")
    loaded["steps"] = 4
    loaded["auto_fix"] = "ask"  # the image stays black, with the fix offered
    save_settings(loaded)
    application()
    window = build_main_window()
    qtbot.addWidget(window)
    window.show()
    yield window
    window.close()


def _wait(qtbot, window, condition) -> None:
    def check() -> None:
        assert window.dialogs.shown == [], window.dialogs.shown[0]
        assert condition()

    qtbot.waitUntil(check, timeout=LONG)


def _choose(window, key: str, value: str) -> None:
    """Pick `value` in the Settings page's field for `key`, as a user does."""
    window.show_page("Settings")
    box = window.settings_view.editors[key].input
    assert isinstance(box, QComboBox)
    box.setCurrentIndex(box.findData(value))


def _remember_the_whole_part_fix(qtbot, window) -> None:
    """The check chooses between its verified candidates by their measured time as well, so it
    remembers either the VAE in bf16 or fp32, which the user's own VAE precision overrides, or
    2 of its layers in bf16, which it does not. Where it chose the layers, the VAE's own
    candidate it verified is remembered in their place, as its report offers it."""
    from app.ui.fixes import remember_for_model

    fix = window.health_view.report.fix
    if set(window.state.model.remembered_fix.settings) == {"vae_precision"}:
        return
    whole = next(c for c in fix.candidates if c.verified and set(c.settings) == {"vae_precision"})
    remember_for_model(window.state, window.client, whole.settings, fix.summary, "health check")
    _wait(
        qtbot, window, lambda: set(window.state.model.remembered_fix.settings) == {"vae_precision"}
    )


def test_apply_fix_and_regenerate_runs_the_fix_over_the_users_own_setting(qtbot, real_window):
    window = real_window
    window.models_view.load_path("demo-overflow")
    _wait(qtbot, window, lambda: window.state.model is not None)
    _choose(window, "precision", "fp16")
    _choose(window, "vae_precision", "fp16")
    assert load_settings().settings["vae_precision"] == "fp16"

    window.show_page("Health check")
    window.health_view.run_button.click()
    _wait(qtbot, window, lambda: window.health_view.report is not None)
    assert window.health_view.report.verdict is Verdict.FIXABLE
    _wait(qtbot, window, lambda: window.state.model.remembered_fix is not None)
    _remember_the_whole_part_fix(qtbot, window)
    remembered = dict(window.state.model.remembered_fix.settings)
    assert set(remembered) == {"vae_precision"} and remembered["vae_precision"] != "fp16"

    window.show_page("Generate")
    view = window.generate_view
    view.prompt.setPlainText("a red circle on a blue background")
    view.batch.setValue(1)
    view.generate()
    _wait(qtbot, window, lambda: view.gallery.count() == 1)
    black = view.current_entry
    assert black.status == "nan"
    assert "Apply fix and regenerate" in view.banner.buttons
    # The one fix its button runs, and the setting that set it aside: not also the NaN watch's
    # quick suggestion, which the button does not run.
    red = view.banner.text.text()
    assert "Your own VAE precision fp16 set aside the fix remembered for this model" in red, red
    assert "passed a quick test" not in red, red

    view.banner.buttons["Apply fix and regenerate"].click()
    _wait(qtbot, window, lambda: view.gallery.count() == 2)
    fixed = view.current_entry
    assert fixed.status == "ok", fixed.message
    assert fixed.seed == black.seed
    assert fixed.settings["vae_precision"] == remembered["vae_precision"]
    # The user's own setting is unchanged: the fix ran for that job only, and the words say so.
    assert load_settings().settings["vae_precision"] == "fp16"
    banner = view.banner.text.text()
    assert "for this image only, over your own VAE precision fp16" in banner, banner
    assert "Make it the setting" in view.banner.buttons
    caption = view.parameters.text()
    # Where the fix stands is the banner's to say (it follows the settings); the caption keeps
    # what the image's record says, which no later click makes stale.
    assert "this job only" not in caption, caption
    assert "your settings override it, so this job ran without it" not in caption
    assert "Precision:" in window.precision_status.text()
