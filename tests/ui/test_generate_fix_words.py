"""The Generate page's words after a repair, with a fake engine: one record of what ran (the
generation result) and one set of words rendered from it, as the settings and the model's
remembered fix stand when they are read. A fix the model's jobs all run is never "for this
image only", "Make it the setting" is offered only for what no setting or remembered fix holds,
the banner follows the button that makes it the setting, and a red banner names one fix."""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtGui import QColor, QImage

from app.core.fixing.job_fix import JobFix
from app.core.fixing.remembered_fix import RememberedFix
from app.core.models.summary import ModelSummary
from app.core.settings import load_settings
from tests.support import reports
from tests.ui.conftest import load_fake_model

LAYERS = {
    "bf16_modules": [
        "vae:decoder.up_blocks.0.resnets.0.conv1",
        "vae:decoder.up_blocks.0.resnets.0.norm2",
    ]
}
FP16 = {"precision": "fp16", "vae_precision": "fp16"}


def _png(path, colour="steelblue") -> str:
    image = QImage(32, 32, QImage.Format.Format_RGB32)
    image.fill(QColor(colour))
    assert image.save(str(path))
    return str(path)


def _view(window, engines):
    load_fake_model(window, engines)
    window.show_page("Generate")
    view = window.generate_view
    view.prompt.setPlainText("a red circle on a blue background")
    return view


def _black(view, engines, tmp_path, fix, ran, message="") -> None:
    view.generate()
    job = engines.current.last_job("generate")
    black = reports.image(
        _png(tmp_path / "black.png", "black"),
        status="nan",
        component="vae",
        fix=fix,
        message=message,
        settings=ran,
    )
    engines.current.finish(
        job, reports.generation({"images": [black], "settings": ran, "seconds": 1.0})
    )


def _made_again(view, engines, tmp_path, ran, job_fix) -> None:
    again = engines.current.last_job("generate")
    fine = reports.image(_png(tmp_path / "fine.png"), settings=ran)
    engines.current.finish(
        again,
        reports.generation({"images": [fine], "settings": ran, "seconds": 1.0, "job_fix": job_fix}),
    )


def _remember(view, settings) -> None:
    fix = RememberedFix(
        settings=settings, summary="a fix", verified_by="health check", saved_at=1.0
    )
    view.state.set_model(replace(view.state.model, remembered_fix=fix))


def test_a_layer_fix_remembered_after_its_repair_is_not_said_for_this_image_only(
    window, engines, tmp_path
):
    view = _view(window, engines)
    view.state.apply({"precision": "fp16"})
    _black(view, engines, tmp_path, LAYERS, {**FP16})
    view.banner.buttons["Apply fix and regenerate"].click()
    assert "for this image only" not in view.banner.text.text()
    _made_again(view, engines, tmp_path, {**FP16, **LAYERS}, JobFix(dict(LAYERS)))
    remember = engines.current.last_job("remember_fix")
    assert remember.params.settings == LAYERS

    def said() -> str:
        text = view.banner.text.text()
        # Every job with this model runs it now: neither "for this image only" nor an offer
        # to make it the setting, while the engine remembers it and once it has.
        assert "for this image only" not in text and "your settings are unchanged" not in text
        assert "remembered for this model on this device" in text
        assert "Make it the setting" not in view.banner.buttons
        return text

    said()
    assert "made again with a fix" in view.window().precision_status.text()
    summary: ModelSummary = replace(
        view.state.model,
        remembered_fix=RememberedFix(LAYERS, "2 VAE layers", "generation", saved_at=2.0),
    )
    engines.current.finish(remember, summary)
    said()
    assert view._remembering == []
    # The status bar says the next job's precision with it too (no device report yet).
    assert view.window().precision_status.text() == "Precision: fp16, with 2 VAE layers in bf16"


def test_a_plain_fix_made_the_setting_changes_the_banner_that_offered_it(window, engines, tmp_path):
    view = _view(window, engines)
    _black(view, engines, tmp_path, {"vae_precision": "fp32"}, {"precision": "fp16"})
    view.banner.buttons["Apply fix and regenerate"].click()
    ran = {"precision": "fp16", "vae_precision": "fp32"}
    _made_again(view, engines, tmp_path, ran, JobFix({"vae_precision": "fp32"}))
    assert "The fix ran for this image only" in view.banner.text.text()
    view.banner.buttons["Make it the setting"].click()
    assert load_settings().settings["vae_precision"] == "fp32"
    text = view.banner.text.text()
    assert "The fix is now your setting: every job runs with it." in text
    assert "for this image only" not in text and "your settings are unchanged" not in text
    assert view.banner.isVisible() and "Make it the setting" not in view.banner.buttons
    # Set back by hand: the image's banner says so again, with the offer.
    view.state.apply({"vae_precision": "auto"})
    assert "The fix ran for this image only" in view.banner.text.text()
    assert "Make it the setting" in view.banner.buttons


def test_the_remembered_fix_every_job_runs_is_not_offered_as_the_setting(window, engines, tmp_path):
    """A health check remembered a fix after the image was made, and nothing of the user's
    sets it aside: the fix button runs it, and every job runs it from now on anyway."""
    view = _view(window, engines)
    view.state.apply({"precision": "fp16"})
    _black(view, engines, tmp_path, LAYERS, {**FP16})
    _remember(view, {"vae_precision": "bf16"})
    text = view.banner.text.text()
    assert "which every job runs now" in text and "set aside" not in text
    view.banner.buttons["Apply fix and regenerate"].click()
    assert "for this image only" not in view.banner.text.text()
    assert engines.current.last_job("generate").params.fix == {"vae_precision": "bf16"}
    ran = {"precision": "fp16", "vae_precision": "bf16"}
    _made_again(view, engines, tmp_path, ran, JobFix({"vae_precision": "bf16"}))
    text = view.banner.text.text()
    assert "is the fix remembered for this model on this device: every job runs with it" in text
    assert "for this image only" not in text
    assert "Make it the setting" not in view.banner.buttons


def test_the_red_banner_names_the_one_fix_its_button_runs(window, engines, tmp_path):
    """The user's own VAE precision sets the remembered fix aside and the image went NaN: the
    NaN watch's sentence names its quick suggestion, the button runs the remembered fix. The
    banner names that one, and which setting set it aside."""
    view = _view(window, engines)
    view.state.apply(FP16)
    _remember(view, {"vae_precision": "bf16"})
    message = (
        "The VAE went non-finite (NaN) while decoding, so the image came out black; the fix "
        "'keep 2 VAE layers in bf16' passed a quick test."
    )
    _black(view, engines, tmp_path, LAYERS, FP16, message)
    text = view.banner.text.text()
    assert "run the VAE in bf16" in text
    assert "keep 2 VAE layers" not in text, text
    assert "Your own VAE precision fp16 set aside the fix remembered" in text
    view.banner.buttons["Apply fix and regenerate"].click()
    assert engines.current.last_job("generate").params.fix == {"vae_precision": "bf16"}
    text = view.banner.text.text()
    assert "over your own VAE precision fp16, for this image only" in text
    assert "keep 2 VAE layers" not in text
