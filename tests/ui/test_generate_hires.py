"""The Generate page's Clip skip and hires fix: sent with the job, kept as settings, taken
from an image's parameters, and Clip skip off for a model that reads no CLIP layers."""

from __future__ import annotations

import dataclasses

import pytest

from app.core.hires import Hires
from app.core.settings import load_settings
from app.core.words import infotext
from app.ui.hires_options import HiresOptions
from app.ui.image_entry import GalleryEntry
from tests.ui.conftest import DEMO_SUMMARY, load_fake_model


@pytest.fixture
def view(window, engines):
    load_fake_model(window, engines)
    window.show_page("Generate")
    view = window.generate_view
    view.prompt.setPlainText("a lighthouse at dusk")
    return view


def test_the_hires_toggle_says_what_is_set(qtbot):
    options = HiresOptions()
    qtbot.addWidget(options)
    assert options.value() == Hires() and options.toggle.text() == "Hires fix: off"
    options.set_first_size(512, 768)
    options.enabled.setChecked(True)
    options.denoise.setValue(0.55)
    options.upscaler.setCurrentIndex(options.upscaler.findData("latent_nearest_exact"))
    assert options.value() == Hires(2.0, 0, 0.55, "latent_nearest_exact")
    assert options.toggle.text() == "Hires fix: 2× Latent (nearest-exact), 0.55 → 1024×1536"
    options.toggle.setChecked(True)
    assert options.toggle.text() == "Hires fix" and options.body.isVisibleTo(options)
    options.enabled.setChecked(False)
    assert not options.scale.isEnabled() and options.value().scale == 1.0


def test_clip_skip_and_the_hires_fix_go_with_the_job_and_are_kept(view, engines):
    view.clip_skip.setValue(2)
    view.hires.enabled.setChecked(True)
    view.hires.scale.setValue(1.5)
    view.hires.steps.setValue(8)
    view.generate()
    job = engines.current.last_job("generate")
    assert job.params.generation.clip_skip == 2
    assert job.params.generation.hires == Hires(1.5, 8, 0.7, "latent")
    saved = load_settings().settings
    assert (saved["clip_skip"], saved["hires_scale"], saved["hires_steps"]) == (2, 1.5, 8)


def test_an_images_clip_skip_and_hires_fix_fill_the_form(view):
    text = infotext.write(
        "a castle",
        "",
        infotext.keyed(
            [
                ("Steps", 20),
                ("Size", (512, 512)),
                ("Clip skip", 2),
                ("Denoising strength", 0.45),
                ("Hires upscale", 2),
                ("Hires steps", 10),
                ("Hires upscaler", "Latent (bicubic)"),
            ]
        ),
    )
    entry = GalleryEntry.from_parameters(text)
    view.use_parameters(entry.generate_values())
    assert view.clip_skip.value() == 2
    assert view.hires.value() == Hires(2.0, 10, 0.45, "latent_bicubic")
    for words, key in (
        ("Lanczos", "lanczos"),
        ("Nearest", "nearest"),
        ("4x-UltraSharp", "lanczos"),
    ):
        recorded = GalleryEntry.from_parameters(text.replace("Latent (bicubic)", words))
        view.use_parameters(recorded.generate_values())
        assert view.hires.value() == Hires(2.0, 10, 0.45, key)  # a model file: the closest
    # An image that records neither was made without them.
    view.use_parameters(GalleryEntry.from_parameters("a castle\nSteps: 20").generate_values())
    assert view.clip_skip.value() == 1 and not view.hires.value().on


def test_clip_skip_is_off_for_a_model_that_reads_no_clip_layers(window, engines):
    flux = dataclasses.replace(DEMO_SUMMARY, architecture="flux-dev")
    load_fake_model(window, engines, flux)
    view = window.generate_view
    view.clip_skip.setValue(2)
    assert not view.clip_skip.isEnabled() and "does not apply" in view.clip_skip.toolTip()
    assert view.request()["clip_skip"] == 1
    load_fake_model(window, engines, DEMO_SUMMARY)
    assert view.clip_skip.isEnabled()


def test_the_step_cache_is_on_only_for_a_model_it_runs_on_and_goes_with_the_job(window, engines):
    """The demo (a UNet) computes every step: its Step cache is off and sends 0; a Flux.1
    model takes it, sends it with the job, keeps it as a setting, and an image recording
    one puts it back in the form."""
    view = window.generate_view
    load_fake_model(window, engines, DEMO_SUMMARY)
    view.step_cache.setValue(0.1)
    assert not view.step_cache.isEnabled() and "every step" in view.step_cache.toolTip()
    assert view.request()["step_cache"] == 0.0
    load_fake_model(window, engines, dataclasses.replace(DEMO_SUMMARY, architecture="flux-dev"))
    window.show_page("Generate")
    view.prompt.setPlainText("a lighthouse at dusk")
    assert view.step_cache.isEnabled()
    view.generate()
    assert engines.current.last_job("generate").params.generation.step_cache == 0.1
    assert load_settings().settings["step_cache"] == 0.1
    view.use_parameters(GalleryEntry.from_parameters("a castle\nSteps: 20").generate_values())
    assert view.step_cache.value() == 0.0  # recorded none: made without one
    recorded = infotext.write(
        "a castle",
        "",
        infotext.keyed([("Steps", 20), ("Size", (512, 512)), ("First block cache", 0.12)]),
    )
    view.use_parameters(GalleryEntry.from_parameters(recorded).generate_values())
    assert view.step_cache.value() == 0.12


def test_the_prompt_cache_is_on_only_for_a_model_that_keeps_one_and_goes_with_the_job(
    window, engines
):
    """The demo's pipeline keeps no prompt cache: its box is off and sends False; a Qwen-Image
    2.1 model takes it, sends it with the job, keeps it as a setting, and an image recording
    it puts it back in the form."""
    view = window.generate_view
    load_fake_model(window, engines, DEMO_SUMMARY)
    view.prompt_cache.setChecked(True)
    assert not view.prompt_cache.isEnabled() and "no prompt cache" in view.prompt_cache.toolTip()
    assert view.request()["prompt_cache"] is False
    load_fake_model(window, engines, dataclasses.replace(DEMO_SUMMARY, architecture="qwenimage21"))
    window.show_page("Generate")
    view.prompt.setPlainText("a lighthouse at dusk")
    assert view.prompt_cache.isEnabled() and view.prompt_cache.isChecked()
    view.generate()
    assert engines.current.last_job("generate").params.generation.prompt_cache is True
    assert load_settings().settings["prompt_cache"] is True
    view.use_parameters(GalleryEntry.from_parameters("a castle\nSteps: 20").generate_values())
    assert not view.prompt_cache.isChecked()  # recorded none: made without it
    recorded = infotext.write(
        "a castle",
        "",
        infotext.keyed([("Steps", 20), ("Size", (512, 512)), ("Prompt cache", "on")]),
    )
    view.use_parameters(GalleryEntry.from_parameters(recorded).generate_values())
    assert view.prompt_cache.isChecked()


def test_an_images_schedule_halfsafe_does_not_run_takes_the_closest_and_says_so(view):
    """Send to Generate: an image made with ComfyUI's Simple schedule fills the form with the
    closest sampler HalfSafe runs, and the page says which in one sentence."""
    text = "a castle\nSteps: 20, Sampler: Euler, Schedule type: Simple, Size: 512x512"
    view.use_parameters(GalleryEntry.from_parameters(text).generate_values())
    assert view.form.scheduler.value() == "euler_sgm_uniform"
    assert view.progress_label.text() == (
        "Parameters taken from the image; press Generate. HalfSafe does not run the schedule "
        "Simple; the closest it runs is Euler SGM Uniform."
    )
    own = "a castle\nSteps: 20, Sampler: DPM++ 2M, Schedule type: Karras, Size: 512x512"
    view.use_parameters(GalleryEntry.from_parameters(own).generate_values())
    assert view.form.scheduler.value() == "dpmpp_2m_karras"
    assert view.progress_label.text() == "Parameters taken from the image; press Generate."


def test_a_final_picture_past_the_bound_is_said_and_not_sent(view, engines):
    view.width_box.setValue(4096)
    view.height_box.setValue(4096)
    view.hires.enabled.setChecked(True)
    view.hires.scale.setValue(4.0)
    view.generate()
    assert engines.current.jobs("generate") == []
    said = view.window().message_status.full_text()
    assert said.startswith("4096x4096 upscaled 4x by the hires fix is a 16384x16384 picture")


def test_the_prompt_upsampler_setting_goes_with_the_job(view, window):
    """On by default (as a model's own pipeline runs its upsampler); turned off on the Settings
    page, the job encodes the prompt as written."""
    assert view.request()["upsample_prompt"] is True
    window.state.apply({"upsample_prompt": False})
    assert view.request()["upsample_prompt"] is False
