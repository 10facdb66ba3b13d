"""The health check page: one click, per-component cards in plain words, chart, fix, export."""

from __future__ import annotations

import copy

from PySide6.QtGui import QGuiApplication

from app.core.health import cost_comparison
from app.core.settings import load_settings
from app.engine.events import CancelRequest, EventState
from tests.ui.conftest import load_fake_model

FIXABLE = {
    "halfsafe": "0.1.0",
    "model": {
        "source": "/models/sdxl.safetensors",
        "format": "single_file",
        "architecture": "sdxl",
        "name": "sdxl",
    },
    "device": {"kind": "cuda", "name": "NVIDIA GeForce RTX 3060"},
    "tested": {
        "text_encoder": "fp16",
        "text_encoder_2": "fp16",
        "unet": "fp16",
        "vae": "fp16",
        "upcast_attention": False,
    },
    "weights": {"non_finite": []},
    "components": {
        "text_encoder": {
            "status": "ok",
            "max_abs": 310.0,
            "headroom": 211.3,
            "first_bad_module": None,
            "seconds": 0.02,
            "dtype": "fp16",
            "blocks": [
                {"module": "text_model.embeddings", "max_abs": 2.0, "non_finite": False},
                {"module": "text_model.encoder", "max_abs": 310.0, "non_finite": False},
            ],
        },
        "unet": {
            "status": "at_risk",
            "max_abs": 41000.0,
            "headroom": 1.6,
            "first_bad_module": None,
            "seconds": 0.4,
            "dtype": "fp16",
            "blocks": [
                {"module": "down_blocks.0", "max_abs": 800.0, "non_finite": False},
                {"module": "mid_block", "max_abs": 41000.0, "non_finite": False},
            ],
        },
        "vae": {
            "status": "overflow",
            "max_abs": 131000.0,
            "headroom": 0.5,
            "first_bad_module": "decoder.up_blocks.2.resnets.1.conv2",
            "seconds": 0.3,
            "dtype": "fp16",
            "blocks": [
                {"module": "post_quant_conv", "max_abs": 30.0, "non_finite": False},
                {"module": "decoder.mid_block", "max_abs": 9000.0, "non_finite": False},
                {"module": "decoder.up_blocks.2", "max_abs": None, "non_finite": True},
            ],
        },
    },
    "verdict": "fixable",
    "fix": {
        "text_encoder": "fp16",
        "text_encoder_2": "fp16",
        "unet": "fp16",
        "vae": "fp32",
        "upcast_attention": False,
        "verified": True,
        "summary": "The VAE overflowed; fix: run the VAE in fp32. Verified by re-running it.",
        "settings": {"vae_precision": "fp32"},
        "cost": {
            "fix": {"unet_step_ms": 61.0, "peak_memory_mb": 7100.0, "weights_mb": 5300.0},
            "no_half": {"unet_step_ms": 118.0, "peak_memory_mb": 12900.0, "weights_mb": 10500.0},
            # Written by core, as Fix.to_json writes it.
            "summary": cost_comparison(
                {"fix": {"unet_step_ms": 61.0}, "no_half": {"unet_step_ms": 118.0}}
            ),
        },
    },
    "seconds": 2.4,
    "size": 1024,
    "notes": [],
}
MARKDOWN = "# HalfSafe health check: sdxl\n\n- Verdict: **fixable**\n"


def _run_check(window, engines):
    load_fake_model(window, engines)
    window.show_page("Health check")
    view = window.health_view
    assert view.run_button.isEnabled()
    view.run_button.click()
    return view, engines.current.last_job("check")


def test_run_is_one_click_and_sends_the_current_settings(window, engines):
    window.state.set_setting("upcast_attention", True)
    view, job = _run_check(window, engines)
    assert job.params["precision"]["upcast_attention"] is True
    assert job.params["size"] is None  # the model's own size
    engines.current.emit(job, EventState.PROGRESS, stage="Checking the UNet", done=1, total=3)
    assert view.progress.value() == 1 and view.progress.maximum() == 3
    assert "Checking the UNet" in view.stage.text()
    assert not view.run_button.isEnabled()


def test_probe_size_can_be_chosen(window, engines):
    load_fake_model(window, engines)
    view = window.health_view
    view.size_choice.setCurrentIndex(view.size_choice.findData(768))
    view.run_check()
    assert engines.current.last_job("check").params["size"] == 768


def test_report_shows_cards_in_plain_words_chart_and_fix(window, engines):
    view, job = _run_check(window, engines)
    engines.current.finish(job, {"report": FIXABLE, "markdown": MARKDOWN})

    assert view.verdict.isVisible() and view.verdict.level == "warn"
    assert "Fixable" in view.verdict.text.text()
    assert set(view.cards) == {"text_encoder", "unet", "vae"}
    vae_text = " ".join(w.text() for w in view.cards["vae"].findChildren(type(view.stage)))
    assert "Overflows in fp16" in vae_text
    assert (
        "the second convolution of the second ResNet layer of the third up-sampling block "
        "of the decoder, in the VAE"
    ) in vae_text
    unet_text = " ".join(w.text() for w in view.cards["unet"].findChildren(type(view.stage)))
    assert "Close to the limit" in unet_text and "only 1.6x" in unet_text

    chart = view.charts["vae"]
    assert [b.module for b in chart.blocks] == [
        "post_quant_conv",
        "decoder.mid_block",
        "decoder.up_blocks.2",
    ]
    assert [b.level for b in chart.blocks] == ["good", "warn", "bad"]
    assert "past the limit: decoder.up_blocks.2" in chart.accessibleDescription()
    # The chart paints without errors at its real size.
    assert not chart.grab().isNull()

    fix_text = " ".join(w.text() for w in view.findChildren(type(view.stage)))
    assert "VAE precision: fp32 (full)" in fix_text
    assert "61 ms" in fix_text and "118 ms" in fix_text
    assert "the fix was 1.9x as fast as no-half" in fix_text
    assert "less memory at peak" in fix_text
    assert window.precision_status.text().startswith("Precision: Text encoder fp16")


def test_apply_fix_writes_the_settings(window, engines):
    view, job = _run_check(window, engines)
    engines.current.finish(job, {"report": FIXABLE, "markdown": MARKDOWN})
    view.apply_button.click()
    assert load_settings().settings["vae_precision"] == "fp32"
    assert "Applied" in view.applied_label.text()
    view.run_button.click()
    assert engines.current.last_job("check").params["precision"]["vae_precision"] == "fp32"


def test_export_and_copy_markdown(window, engines, tmp_path):
    view, job = _run_check(window, engines)
    engines.current.finish(job, {"report": FIXABLE, "markdown": MARKDOWN})
    view.copy_button.click()
    assert QGuiApplication.clipboard().text() == MARKDOWN
    target = tmp_path / "report.md"
    view.export_markdown(str(target))
    assert target.read_text(encoding="utf-8") == MARKDOWN


def test_cancel_sends_cancel(window, engines):
    view, job = _run_check(window, engines)
    view.cancel_button.click()
    assert CancelRequest(job.job_id) in engines.current.sent
    engines.current.emit(job, EventState.CANCELLED, message="Cancelled.")
    assert view.stage.text() == "Cancelled."
    assert view.run_button.isEnabled()


def test_healthy_and_broken_verdicts(window, engines):
    view, job = _run_check(window, engines)
    healthy = dict(FIXABLE, verdict="healthy", fix=None)
    engines.current.finish(job, {"report": healthy, "markdown": MARKDOWN})
    assert view.verdict.level == "good"
    view.run_button.click()
    job = engines.current.last_job("check")
    broken = dict(
        FIXABLE,
        verdict="broken",
        fix=None,
        weights={"non_finite": ["first_stage_model.decoder.conv_in.weight"]},
    )
    engines.current.finish(job, {"report": broken, "markdown": MARKDOWN})
    assert view.verdict.level == "bad"
    texts = " ".join(w.text() for w in view.findChildren(type(view.stage)))
    assert "first_stage_model.decoder.conv_in.weight" in texts


def test_a_component_fed_nan_by_another_is_named_as_fed_not_as_failing(window, engines):
    view, job = _run_check(window, engines)
    report = copy.deepcopy(FIXABLE)
    report.update(verdict="broken", fix=None)
    report["weights"] = {"non_finite": ["text_encoder.text_model.encoder.layers.0.mlp.fc1.weight"]}
    report["components"]["text_encoder"].update(status="broken_weights")
    report["components"]["unet"].update(status="ok", fed_by="text_encoder")
    engines.current.finish(job, {"report": report, "markdown": MARKDOWN})
    unet_text = " ".join(w.text() for w in view.cards["unet"].findChildren(type(view.stage)))
    assert "Fed non-finite input by the text encoder" in unet_text
    assert "Produces NaN" not in unet_text and "Close to the limit" not in unet_text


def test_run_needs_a_model(window):
    window.show_page("Health check")
    assert not window.health_view.run_button.isEnabled()
    assert "Load a model" in window.health_view.model_hint.text()


def test_a_report_about_another_model_is_cleared_when_a_new_one_loads(window, engines):
    view, job = _run_check(window, engines)
    engines.current.finish(job, {"report": FIXABLE, "markdown": MARKDOWN})
    assert view.cards
    load_fake_model(window, engines)  # the demo, not /models/sdxl.safetensors
    assert view.report is None and not view.cards
    assert not view.verdict.isVisible() and not view.copy_button.isEnabled()


def test_check_probes_the_sampler_the_user_generates_with(window, engines):
    load_fake_model(window, engines)
    window.state.apply({"steps": 12, "scheduler": "euler"})
    window.health_view.run_check()
    params = engines.current.last_job("check").params
    assert (params["steps"], params["scheduler"]) == (12, "euler")


def test_a_check_under_autocast_says_so_in_words(window, engines):
    view, job = _run_check(window, engines)
    report = dict(FIXABLE, tested={**FIXABLE["tested"], "autocast": True})
    engines.current.finish(job, {"report": report, "markdown": MARKDOWN})
    text = view.verdict.text.text()
    assert "fp16 parts under autocast" in text
    assert "autocast True" not in text and "Autocast" not in text


ISLANDS = copy.deepcopy(FIXABLE)
ISLANDS["fix"].update(
    {
        "vae": "fp16",
        "summary": "The VAE overflowed; fix: keep 2 layers of the VAE in fp32. Verified.",
        "precision_words": "fp16, with 2 VAE layers in fp32",
        "settings": {"fp32_modules": ["vae:decoder.a.conv1", "vae:decoder.a.norm2"]},
        "modules": {"vae": {"decoder.a.conv1": "fp32", "decoder.a.norm2": "fp32"}},
        "candidates": [
            {
                "component": "vae",
                "kind": "islands",
                "words": "keep 2 layers of the VAE in fp32",
                "settings": {"fp32_modules": ["vae:decoder.a.conv1", "vae:decoder.a.norm2"]},
                "modules": 2,
                "finite": True,
                "quality": {"metric": "snr_db", "value": 55.3, "threshold": 20.0},
                "verified": True,
                "chosen": True,
                "cost": {"step_ms": 40.0, "step_ms_range": [39.0, 41.0], "weights_mb": 5310.0},
            },
            {
                "component": "vae",
                "kind": "component_fp32",
                "words": "run the VAE in fp32",
                "settings": {"vae_precision": "fp32"},
                "modules": 0,
                "finite": True,
                "quality": {"metric": "snr_db", "value": 200.0, "threshold": 20.0},
                "verified": True,
                "chosen": False,
                "cost": {"step_ms": 80.0, "step_ms_range": [79.0, 82.0], "weights_mb": 5460.0},
            },
            {
                "component": "vae",
                "kind": "clamp",
                "words": "clamp the fp16 output of 1 layer of the VAE to +-65504",
                "settings": {"clamp_modules": ["vae:decoder.a.conv1"]},
                "modules": 1,
                "finite": True,
                "quality": {"metric": "snr_db", "value": 4.2, "threshold": 20.0},
                "verified": False,
                "chosen": False,
                "cost": {"weights_mb": 5300.0},
            },
        ],
        "baselines": {
            "vae": {
                "as_tested": {"step_ms": 39.0, "step_ms_range": [38.0, 40.0], "weights_mb": 5300.0},
                "no_half": {"step_ms": 81.0, "step_ms_range": [80.0, 83.0], "weights_mb": 10500.0},
            }
        },
    }
)


def test_candidates_are_listed_and_another_verified_one_can_be_applied(window, engines):
    view, job = _run_check(window, engines)
    engines.current.finish(job, {"report": ISLANDS, "markdown": MARKDOWN})
    text = " ".join(w.text() for w in view.findChildren(type(view.stage)))
    assert "Runs as: <b>fp16, with 2 VAE layers in fp32</b>" in text
    assert "Layers in fp32: 2 layers (vae:decoder.a.conv1, vae:decoder.a.norm2)" in text
    assert "rejected: differs from fp32" in text and "4.2 dB" in text
    assert "no-half" in text and "81.0 (80.0-83.0)" in text
    # Only the verified candidate that was not chosen offers to be applied instead.
    (instead,) = view.alternative_buttons
    view.apply_button.click()
    # One model's layer names never go into the settings every model uses: the engine
    # remembers them for the loaded model, ahead of the next job.
    assert load_settings().settings["fp32_modules"] == []
    remember = engines.current.last_job("remember_fix")
    assert remember.params["settings"] == {
        "fp32_modules": ISLANDS["fix"]["settings"]["fp32_modules"]
    }
    assert "remembered for this model" in view.applied_label.text()
    instead.click()
    assert load_settings().settings["vae_precision"] == "fp32"
    assert len(engines.current.jobs("remember_fix")) == 1


def test_a_new_check_does_not_show_the_last_ones_verdict_while_it_runs(window, engines):
    view, job = _run_check(window, engines)
    engines.current.finish(job, {"report": FIXABLE, "markdown": MARKDOWN})
    assert view.verdict.isVisible() and view.cards
    view.run_button.click()
    assert not view.verdict.isVisible()
    assert view.cards == {} and view.report is None
