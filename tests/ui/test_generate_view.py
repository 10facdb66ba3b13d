"""The Generate page with a fake engine: progress, preview, NaN banner and its fix, cancel."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QImage

from app.core.fixing.job_fix import JobFix
from app.core.settings import load_settings
from app.engine.events import CancelRequest, EventState
from app.ui import words
from tests.support import reports
from tests.ui.conftest import load_fake_model


@pytest.fixture
def view(window, engines):
    load_fake_model(window, engines)
    window.show_page("Generate")
    view = window.generate_view
    view.prompt.setPlainText("a lighthouse at dusk")
    return view


def _png(path, colour="steelblue") -> str:
    image = QImage(32, 32, QImage.Format.Format_RGB32)
    image.fill(QColor(colour))
    assert image.save(str(path))
    return str(path)


def window_status(view) -> str:
    return view.window().precision_status.text()


def test_generate_sends_the_form_and_the_current_settings(view, engines):
    view.steps.setValue(12)
    view.seed.setText("77")
    view.generate()
    job = engines.current.last_job("generate")
    assert job.params.generation.prompt == "a lighthouse at dusk"
    assert job.params.generation.steps == 12
    assert job.params.generation.seed == 77
    assert job.params.precision.no_half is False
    assert job.params.device == "auto"
    # Last-used values persist in the settings file.
    assert load_settings().settings["steps"] == 12


def test_progress_updates_the_bar_with_an_eta(view, engines):
    view.generate()
    job = engines.current.last_job("generate")
    engines.current.emit(job, EventState.QUEUED, stage="Waiting", total=1)
    engines.current.emit(job, EventState.PROGRESS, stage="Denoising", done=1, total=20)
    engines.current.emit(job, EventState.PROGRESS, stage="Denoising", done=5, total=20)
    assert view.progress.maximum() == 20
    assert view.progress.value() == 5
    assert "Denoising: 5 of 20" in view.progress_label.text()
    assert "left" in view.progress_label.text()


def test_preview_is_shown_live(view, engines):
    view.generate()
    job = engines.current.last_job("generate")
    image = QImage(16, 16, QImage.Format.Format_RGB32)
    image.fill(QColor("red"))
    buffer = io.BytesIO()
    from PySide6.QtCore import QBuffer, QByteArray, QIODevice

    data = QByteArray()
    qbuffer = QBuffer(data)
    qbuffer.open(QIODevice.OpenModeFlag.WriteOnly)
    image.save(qbuffer, "PNG")
    buffer.write(bytes(data))
    engines.current.emit(job, EventState.PREVIEW, done=3, preview_png=buffer.getvalue())
    assert not view.image.pixmap.isNull()
    assert view.image.pixmap.width() == 16


def test_result_lands_in_the_gallery_with_its_parameters(view, engines, tmp_path):
    view.generate()
    job = engines.current.last_job("generate")
    engines.current.finish(
        job,
        reports.generation(
            {
                "images": [reports.image(_png(tmp_path / "a.png"))],
                "settings": {"precision": "fp16"},
                "seconds": 2.0,
                "warnings": ["The UNet runs in fp16 as you asked; on a CPU fp16 is slow."],
            }
        ),
    )
    assert view.gallery.count() == 1
    assert view.progress_label.text() == "Done in 2.0 s."
    assert "Note: The UNet runs in fp16 as you asked" in view.parameters.text()
    assert "Precision: fp16 everywhere" in view.parameters.text()
    assert window_status(view) == "Precision: fp16 everywhere"
    assert "Seed: 1234" in view.parameters.text()
    assert "a lighthouse at dusk" in view.parameters.text()
    assert not view.banner.isVisible()
    assert view.cancel_button.isEnabled() is False


def test_nan_result_shows_the_banner_and_its_fix_regenerates_with_the_fix(view, engines, tmp_path):
    view.generate()
    job = engines.current.last_job("generate")
    fix = {"vae_precision": "fp32"}
    engines.current.finish(
        job,
        reports.generation(
            {
                "images": [
                    reports.image(
                        _png(tmp_path / "black.png", "black"),
                        status="nan",
                        component="vae",
                        step=25,
                        message="The VAE overflowed fp16 while decoding.",
                        fix=fix,
                    )
                ],
                "settings": {},
                "seconds": 3.0,
            }
        ),
    )

    assert view.banner.isVisible()
    text = view.banner.text.text()
    assert "NaN" in text and "the VAE" in text and "step 25" in text
    assert "The VAE overflowed fp16 while decoding." in text
    button = view.banner.buttons["Apply fix and regenerate"]
    button.click()

    again = engines.current.last_job("generate")
    assert again.job_id != job.job_id
    # The request carries the fix, for this job only; the settings stay as they are.
    assert again.params.fix == {"vae_precision": "fp32"}
    assert again.params.precision.vae_precision == "auto"
    assert again.params.generation.seed == 1234
    assert again.params.generation.prompt == "a lighthouse at dusk"
    assert load_settings().settings["vae_precision"] == "auto"
    assert "for this image only" in view.banner.text.text()

    engines.current.finish(
        again,
        reports.generation(
            {
                "images": [reports.image(_png(tmp_path / "fixed.png"))],
                "settings": {"vae_precision": "fp32"},
                "seconds": 3.0,
                "job_fix": JobFix({"vae_precision": "fp32"}),
            }
        ),
    )
    assert view.gallery.count() == 2
    assert view.banner.level == "good"
    text = view.banner.text.text()
    assert "Made again with the fix (run the VAE in fp32)" in text
    assert "The fix ran for this image only; your settings are unchanged" in text
    # What ran, from the image's record (a fix remembered for the model would show here too).
    assert f"running as {words.precision_summary(view.current_entry.settings)};" in text
    assert "VAE in fp32" in text
    assert not button.isVisible()
    # Offered, not done: the fix becomes the setting only when asked.
    view.banner.buttons["Make it the setting"].click()
    assert load_settings().settings["vae_precision"] == "fp32"
    assert "The fix is now your setting" in view.banner.text.text()


def test_the_fix_button_runs_its_fix_over_the_users_own_setting_and_says_so(
    view, engines, tmp_path
):
    """The user chose VAE precision fp16 by hand, which sets the fix remembered for the model
    aside, and the image went NaN: the banner names that fix, the button's job carries it, which the engine runs over the user's choice; the
    banner says it ran for that image only, over which setting, and how to keep it."""
    view.state.apply({"precision": "fp16", "vae_precision": "fp16"})
    _remember(view, {"vae_precision": "bf16"})
    suggested = {"fp32_modules": ["vae:decoder.up_blocks.0.resnets.0.conv1"]}
    _black_with_fix(
        view, engines, tmp_path, suggested, {"precision": "fp16", "vae_precision": "fp16"}
    )
    # The banner names the fix its button runs, and which of the user's settings set it aside.
    assert (
        "Your own VAE precision fp16 set aside the fix remembered for this model on this device "
        "(run the VAE in bf16), so this image ran without it. Apply fix and regenerate makes it "
        "again with that fix, for this image only"
    ) in view.banner.text.text()
    view.banner.buttons["Apply fix and regenerate"].click()
    again = engines.current.last_job("generate")
    assert again.params.fix == {"vae_precision": "bf16"}
    assert again.params.precision.vae_precision == "fp16"  # the user's, unchanged
    ran = {"precision": "fp16", "vae_precision": "bf16"}
    fine = reports.image(_png(tmp_path / "fine.png"), settings=ran)
    engines.current.finish(
        again,
        reports.generation(
            {
                "images": [fine],
                "settings": ran,
                "seconds": 3.0,
                "job_fix": JobFix({"vae_precision": "bf16"}, {"vae_precision": "fp16"}),
            }
        ),
    )
    text = view.banner.text.text()
    assert "for this image only, over your own VAE precision fp16" in text
    assert load_settings().settings["vae_precision"] == "fp16"
    assert "bf16" in window_status(view) and "made again with a fix" in window_status(view)
    view.banner.buttons["Make it the setting"].click()
    assert load_settings().settings["vae_precision"] == "bf16"


def test_fixed_image_says_what_was_fixed(view, engines, tmp_path):
    view.generate()
    job = engines.current.last_job("generate")
    engines.current.finish(
        job,
        reports.generation(
            {
                "images": [
                    reports.image(
                        _png(tmp_path / "ok.png"),
                        status="fixed",
                        component="vae",
                        fixes_applied=["VAE decoded again in fp32"],
                        message="The VAE overflowed; decoded again in fp32.",
                    )
                ],
                "settings": {},
                "seconds": 3.0,
            }
        ),
    )
    assert view.banner.isVisible()
    assert "Fixed automatically" in view.banner.text.text()
    assert "VAE decoded again in fp32" in view.banner.text.text()
    assert "Apply fix and regenerate" not in view.banner.buttons


def test_cancel_sends_cancel_and_esc_does_too(view, engines, qtbot):
    view.generate()
    job = engines.current.last_job("generate")
    engines.current.emit(job, EventState.PROGRESS, stage="Denoising", done=1, total=20)
    view.cancel_button.click()
    assert CancelRequest(job.job_id) in engines.current.sent
    engines.current.emit(job, EventState.CANCELLED, message="Cancelled.")
    assert view.progress_label.text() == "Cancelled."
    assert not view.cancel_button.isEnabled()

    view.generate()
    second = engines.current.last_job("generate")
    view.prompt.setFocus()
    qtbot.keyClick(view.prompt, Qt.Key.Key_Escape)
    assert CancelRequest(second.job_id) in engines.current.sent


def test_ctrl_enter_generates(view, engines, qtbot):
    view.activateWindow()
    view.prompt.setFocus()
    qtbot.keyClick(view.prompt, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    assert len(engines.current.jobs("generate")) == 1
    # The key did not also type a line break into the prompt.
    assert view.prompt.toPlainText() == "a lighthouse at dusk"


def test_random_seed_button_and_reuse(view, engines, tmp_path):
    view.seed.setText("5")
    view.random_seed.click()
    assert view.seed.text() == "-1"
    view.generate()
    job = engines.current.last_job("generate")
    engines.current.finish(
        job,
        reports.generation(
            {"images": [reports.image(_png(tmp_path / "r.png"))], "settings": {}, "seconds": 1}
        ),
    )
    view.reuse_seed.click()
    assert view.seed.text() == "1234"


def test_generate_without_a_model_offers_the_demo(window, engines):
    window.show_page("Generate")
    view = window.generate_view
    assert not view.generate_button.isEnabled()
    assert view.demo_button.isVisible()
    view.demo_button.click()
    assert engines.current.last_job("load").params.source == "demo"
    assert window.current_page() == "Models"


def test_settings_change_applies_to_the_next_job_without_restart(view, window, engines):
    window.state.set_setting("upcast_attention", True)
    view.generate()
    assert engines.current.last_job("generate").params.precision.upcast_attention is True
    assert len(engines.started) == 1


def test_an_image_no_folder_took_stays_in_memory_and_can_be_saved_elsewhere(
    view, engines, tmp_path
):
    png = Path(_png(tmp_path / "memory.png")).read_bytes()
    view.generate()
    job = engines.current.last_job("generate")
    save_error = (
        "Cannot save images in /full (No space left on device). Cannot save images in "
        "/data/unsaved (No space left on device). So 1 generated image was not saved."
    )
    engines.current.finish(
        job,
        reports.generation(
            {
                "images": [reports.image("", png=png)],
                "settings": {},
                "seconds": 1.0,
                "save_error": save_error,
            }
        ),
    )
    assert view.gallery.count() == 1
    assert view.window().dialogs.shown[-1].message == save_error
    assert "Not saved" in view.banner.text.text()
    assert view.save_as_button.isVisibleTo(view)
    assert view.image.pixmap.width() == 32  # shown from memory

    unwritable = tmp_path / "a-file"
    unwritable.write_text("x")
    assert view.save_entry_as(str(unwritable / "no.png")) is None
    assert "could not be saved" in view.window().dialogs.shown[-1].message
    assert "Not saved" in view.banner.text.text()  # still held in memory

    saved = view.save_entry_as(str(tmp_path / "kept.png"))
    assert saved is not None and saved.read_bytes() == png
    assert "Saved to" in view.parameters.text()
    assert not view.save_as_button.isVisibleTo(view)
    assert not view.banner.isVisible()


def test_an_intermittent_nan_offers_to_make_it_again_not_a_setting(view, engines, tmp_path):
    view.seed.setText("77")
    view.generate()
    job = engines.current.last_job("generate")
    settings_before = load_settings().settings.to_dict()
    engines.current.finish(
        job,
        reports.generation(
            {
                "images": [
                    reports.image(
                        _png(tmp_path / "black.png", "black"),
                        status="nan",
                        component="unet",
                        step=3,
                        seed=77,
                        cause="intermittent",
                        message="The UNet went non-finite (NaN) at step 3 of 20; run again "
                        "unchanged, that part came out finite.",
                    )
                ],
                "settings": {},
                "seconds": 3.0,
            }
        ),
    )
    text = view.banner.text.text()
    assert "health check" not in text
    assert set(view.banner.buttons) == {"Make it again"}
    view.banner.buttons["Make it again"].click()
    again = engines.current.last_job("generate")
    assert again.job_id != job.job_id
    assert again.params.generation.seed == 77 and again.params.generation.batch == 1
    assert again.params.precision == job.params.precision
    assert load_settings().settings.to_dict() == settings_before


def test_a_layer_fix_from_the_banner_is_remembered_for_the_model_not_set_for_all(
    view, engines, tmp_path
):
    view.generate()
    job = engines.current.last_job("generate")
    fix = {"fp32_modules": ["vae:decoder.up_blocks.0.resnets.0.conv1"]}
    engines.current.finish(
        job,
        reports.generation(
            {
                "images": [
                    reports.image(
                        _png(tmp_path / "black.png", "black"),
                        status="nan",
                        component="vae",
                        step=25,
                        message="The VAE overflowed fp16 while decoding.",
                        fix=fix,
                    )
                ],
                "settings": {},
                "seconds": 3.0,
            }
        ),
    )
    view.banner.buttons["Apply fix and regenerate"].click()
    assert load_settings().settings["fp32_modules"] == []
    again = engines.current.last_job("generate")
    # The layers run with this job only, and nothing is remembered before they are proved.
    assert again.params.fix == fix
    assert engines.current.jobs("remember_fix") == []
    engines.current.finish(
        again,
        reports.generation(
            {
                "images": [reports.image(_png(tmp_path / "fixed.png"))],
                "settings": {**fix, "precision": "fp16", "vae_precision": "fp16"},
                "seconds": 3.0,
            }
        ),
    )
    remember = engines.current.last_job("remember_fix")
    assert remember.params.settings == fix
    assert remember.params.verified_by == "generation"
    # What it is a fix for: the precision the job proved it at (Re-verify runs it there).
    made_at = remember.params.made_at
    assert made_at["precision"] == "fp16" and made_at["vae_precision"] == "fp16"
    assert made_at["no_half"] is False
    assert "remembered for this model" in view.banner.text.text()


def test_a_layer_fix_that_does_not_repair_the_image_is_not_remembered(view, engines, tmp_path):
    view.generate()
    job = engines.current.last_job("generate")
    fix = {"fp32_modules": ["vae:decoder.up_blocks.0.resnets.0.conv1"]}
    black = reports.image(
        _png(tmp_path / "black.png", "black"), status="nan", component="vae", fix=fix
    )
    engines.current.finish(
        job, reports.generation({"images": [black], "settings": {}, "seconds": 3.0})
    )
    view.banner.buttons["Apply fix and regenerate"].click()
    again = engines.current.last_job("generate")
    engines.current.finish(
        again,
        reports.generation(
            {
                "images": [reports.image(_png(tmp_path / "still.png", "black"), status="nan")],
                "settings": fix,
                "seconds": 3.0,
            }
        ),
    )
    assert engines.current.jobs("remember_fix") == []
    assert load_settings().settings["fp32_modules"] == []


def test_a_preview_replaces_the_last_images_caption_and_cancel_its_banner(view, engines, tmp_path):
    view.generate()
    job = engines.current.last_job("generate")
    engines.current.finish(
        job,
        reports.generation(
            {"images": [reports.image(_png(tmp_path / "old.png"))], "settings": {}, "seconds": 1.0}
        ),
    )
    assert "Seed: 1234" in view.parameters.text()
    view.banner.show_message("good", "<b>Fixed.</b> an earlier image")
    view.generate()
    job = engines.current.last_job("generate")
    preview = Path(_png(tmp_path / "preview.png", "red")).read_bytes()
    engines.current.emit(job, EventState.PREVIEW, done=3, preview_png=preview)
    assert view.parameters.text() == "Preview at step 3: a lighthouse at dusk"
    view.banner.show_message("good", "<b>Fixed.</b> an earlier image")
    engines.current.emit(job, EventState.CANCELLED, message="Cancelled.")
    assert not view.banner.isVisible()


def test_steps_takes_200_as_typed(view, qtbot):
    # The field's top was 150: typing 200 kept "20" without a word.
    view.steps.setFocus()
    view.steps.selectAll()
    qtbot.keyClicks(view.steps, "200")
    assert view.steps.value() == 200


def test_a_job_that_starts_clears_what_spoke_of_the_last_image(view, engines, tmp_path):
    """The last image's banner and caption would read as the new job's until its first
    preview: when the job starts they give way, and come back if it does not finish."""
    view.generate()
    first = engines.current.last_job("generate")
    black = reports.image(_png(tmp_path / "black.png", "black"), status="nan", component="vae")
    engines.current.finish(first, reports.generation({"images": [black]}))
    assert view.banner.isVisible()
    view.prompt.setPlainText("a harbour at night")
    view.generate()
    job = engines.current.last_job("generate")
    engines.current.emit(job, EventState.PROGRESS, stage="Denoising", done=1, total=20)
    assert not view.banner.isVisible()
    assert view.image.pixmap.isNull() and "preview appears" in view.image.placeholder
    assert view.parameters.text() == "Making: a harbour at night"
    engines.current.emit(job, EventState.ERROR, message="It failed.", error_type="ValueError")
    view.window().dialogs.close_all()
    assert not view.image.pixmap.isNull() and view.banner.isVisible()  # the last image again


def test_a_job_the_engine_took_with_it_is_offered_again(view, window, engines):
    from tests.ui.conftest import DEMO_SUMMARY

    view.seed.setText("77")
    view.generate()
    lost = engines.current.last_job("generate")
    engines.current.emit(lost, EventState.PROGRESS, stage="Denoising", done=3, total=20)
    engines.current.crash(returncode=-9)
    assert view.banner.level == "bad" and "Run again" in view.banner.buttons
    assert "the image it was making with it" in view.banner.text.text()
    assert view.run_lost_again() == []  # no model until the engine is back
    assert "restart it" in view.progress_label.text()

    window.engine_banner.buttons["Restart engine"].click()
    engines.current.finish(engines.current.last_job("load"), DEMO_SUMMARY)
    said = view.progress_label.text()
    assert "engine stopped" not in said.lower() and "restart it" not in said  # it is back
    view.banner.buttons["Run again"].click()
    again = engines.current.last_job("generate")
    assert again.params.generation == lost.params.generation
    assert again.params.generation.seed == 77 and view.lost == []
    assert not view.banner.isVisible()


def test_a_loras_trigger_words_offered_go_into_the_prompt(view):
    view.loras.add_to_prompt.emit("inkwash style, mountain")
    assert view.prompt.toPlainText() == "a lighthouse at dusk, inkwash style, mountain"
    view.prompt.setPlainText("")
    view.loras.add_to_prompt.emit("inkwash style")
    assert view.prompt.toPlainText() == "inkwash style"


def test_a_layer_fix_whose_part_ran_wholly_wider_is_not_remembered(view, engines, tmp_path):
    """The image came out finite because the VAE ran in fp32 (a remembered fix, say): that
    proves nothing of two of its layers in fp32, which are not remembered, and the banner says
    why."""
    view.generate()
    job = engines.current.last_job("generate")
    fix = {"fp32_modules": ["vae:decoder.up_blocks.0.resnets.0.conv1"]}
    black = reports.image(
        _png(tmp_path / "black.png", "black"), status="nan", component="vae", fix=fix
    )
    engines.current.finish(
        job, reports.generation({"images": [black], "settings": {}, "seconds": 3.0})
    )
    view.banner.buttons["Apply fix and regenerate"].click()
    again = engines.current.last_job("generate")
    ran = {**fix, "precision": "fp16", "vae_precision": "fp32"}
    fine = reports.image(_png(tmp_path / "fine.png"), settings=ran)
    engines.current.finish(
        again, reports.generation({"images": [fine], "settings": ran, "seconds": 3.0})
    )
    assert engines.current.jobs("remember_fix") == []
    assert "the fix is not remembered" in view.banner.text.text()


@pytest.mark.parametrize(
    ("settings", "ran"),
    [
        ({"precision": "fp16", "vae_precision": "auto"}, True),
        ({"precision": "fp16", "vae_precision": "bf16"}, True),
        ({"precision": "fp16", "vae_precision": "fp32"}, False),
        ({"precision": "fp32", "vae_precision": "auto"}, False),
        ({"precision": "bf16"}, True),
    ],
)
def test_layers_run_only_in_a_part_narrower_than_they_widen_it_to(settings, ran):
    from app.ui.fixes import layers_ran

    assert layers_ran({"fp32_modules": ["vae:a", "vae:b"]}, settings) is ran
    clamp_ran = (
        settings.get("vae_precision", "auto") in ("auto",) and settings["precision"] == "fp16"
    )
    assert layers_ran({"clamp_modules": ["vae:a"]}, settings) is clamp_ran


def _black_with_fix(view, engines, tmp_path, fix, ran):
    """A generation whose image went NaN in the VAE with `fix` suggested, having run `ran`."""
    view.generate()
    job = engines.current.last_job("generate")
    black = reports.image(
        _png(tmp_path / "black.png", "black"), status="nan", component="vae", fix=fix
    )
    engines.current.finish(
        job, reports.generation({"images": [black], "settings": ran, "seconds": 3.0})
    )


def _remember(view, settings):
    from dataclasses import replace

    from app.core.fixing.remembered_fix import RememberedFix

    fix = RememberedFix(
        settings=settings, summary="the VAE in bf16", verified_by="health check", saved_at=1.0
    )
    view.state.set_model(replace(view.state.model, remembered_fix=fix))


def test_a_fix_remembered_since_the_image_is_run_instead_of_the_images_own(view, engines, tmp_path):
    """The health check remembered a fix after the image was made: Apply fix and regenerate
    runs the same image with that fix (which the model's jobs follow from now on), not with
    the image's older suggestion laid on top of it."""
    suggested = {"fp32_modules": ["vae:decoder.up_blocks.0.resnets.0.conv1"]}
    _black_with_fix(view, engines, tmp_path, suggested, {"precision": "fp16"})
    _remember(view, {"vae_precision": "bf16"})
    view.banner.buttons["Apply fix and regenerate"].click()
    again = engines.current.last_job("generate")
    assert again.params.fix == {"vae_precision": "bf16"}
    assert load_settings().settings["fp32_modules"] == []
    text = view.banner.text.text()
    assert "fix remembered for this model" in text and "VAE in bf16" in text


def test_an_image_that_ran_with_the_remembered_fix_is_made_again_with_its_own_fix(
    view, engines, tmp_path
):
    """The image went NaN although it ran with the remembered fix: what is left to try is the
    fix its repair suggested, on top."""
    suggested = {"fp32_modules": ["vae:decoder.up_blocks.0.resnets.0.conv1"]}
    _remember(view, {"vae_precision": "bf16"})
    _black_with_fix(
        view, engines, tmp_path, suggested, {"precision": "fp16", "vae_precision": "bf16"}
    )
    view.banner.buttons["Apply fix and regenerate"].click()
    again = engines.current.last_job("generate")
    assert again.params.fix == suggested
    assert "Making the same image again with the fix</b>" in view.banner.text.text()
