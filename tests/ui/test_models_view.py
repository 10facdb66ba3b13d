"""The Models page: loading with progress and cancel, pickle confirmation, separate VAE, the
remembered fix, and what was detected."""

from __future__ import annotations

from dataclasses import replace

from app.core.profiles import RememberedFix
from app.core.requests import LoadRequest
from app.core.settings import load_settings
from app.engine.events import CancelRequest, EventState, StillLoaded
from app.ui.models_view import library_count_words
from tests.ui.conftest import DEMO_SUMMARY


def test_loading_the_demo_shows_progress_then_what_was_detected(window, engines):
    view = window.models_view
    view.load_item(view.library.topLevelItem(0))
    job = engines.current.last_job("load")
    assert job.params == LoadRequest("demo", vae=None, allow_pickle=False, device="auto")
    engines.current.emit(job, EventState.PROGRESS, stage="Building the demo", done=2, total=4)
    assert view.progress.isVisible() and view.progress.value() == 2
    assert view.cancel_button.isEnabled()
    engines.current.finish(job, DEMO_SUMMARY)
    assert "draws coloured shapes" in view.details.title.text()
    text = view.details_text.text()
    assert "Stable Diffusion 1.x" in text
    assert "The built-in demo is an SD 1.x-shaped pipeline." in text
    assert "250 tensors" in text and "all finite" in text
    assert window.model_status.text() == "Model: demo"
    assert not view.progress.isVisible()


def test_cancel_a_load(window, engines):
    view = window.models_view
    view.load_path("demo")
    job = engines.current.last_job("load")
    view.cancel_button.click()
    assert CancelRequest(job.job_id) in engines.current.sent
    engines.current.emit(job, EventState.CANCELLED, message="Cancelled.")
    assert "cancelled" in view.load_status.text()
    assert window.state.model is None


def test_pickle_is_loaded_only_after_the_user_confirms(window, engines, tmp_path):
    checkpoint = tmp_path / "old.ckpt"
    checkpoint.write_bytes(b"PK")
    asked = []
    window.dialogs.confirm = lambda *args, **kwargs: asked.append(args) or True
    view = window.models_view
    view.load_path(str(checkpoint))
    job = engines.current.last_job("load")
    assert job.params.allow_pickle is False
    engines.current.emit(
        job,
        EventState.ERROR,
        error_type="PickleRefusedError",
        message=f"{checkpoint}: pickle files are not opened unless you allow it.",
    )
    assert asked and "old.ckpt" in asked[0][1]
    retry = engines.current.last_job("load")
    assert retry.job_id != job.job_id
    assert retry.params.allow_pickle is True
    assert window.dialogs.shown == []


def test_refused_pickle_is_not_loaded(window, engines, tmp_path):
    checkpoint = tmp_path / "old.ckpt"
    checkpoint.write_bytes(b"PK")
    window.dialogs.confirm = lambda *args, **kwargs: False
    view = window.models_view
    view.load_path(str(checkpoint))
    job = engines.current.last_job("load")
    engines.current.emit(job, EventState.ERROR, error_type="PickleRefusedError", message="x.")
    assert len(engines.current.jobs("load")) == 1
    assert "not opened" in view.load_status.text()


def test_a_bad_file_gets_one_plain_sentence(window, engines, tmp_path):
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(b"\x00" * 10)
    window.models_view.load_path(str(broken))
    job = engines.current.last_job("load")
    engines.current.emit(
        job,
        EventState.ERROR,
        error_type="BadFileError",
        message=f"{broken}: the file is truncated.",
        details="trace",
    )
    assert window.dialogs.shown[-1].message == f"{broken}: the file is truncated."
    assert window.state.model is None


def test_missing_file_is_reported_without_asking_the_engine(window, engines, tmp_path):
    window.models_view.load_path(str(tmp_path / "gone.safetensors"))
    assert engines.started == []
    assert "does not exist" in window.dialogs.shown[-1].message


def test_separate_vae_is_sent_with_the_load(window, engines, tmp_path):
    vae = tmp_path / "sdxl_vae_fp16_fix.safetensors"
    vae.write_bytes(b"{}")
    view = window.models_view
    view.set_vae(str(vae))
    assert view.vae_label.text() == vae.name
    view.load_path("demo")
    assert engines.current.last_job("load").params.vae == str(vae)
    view.clear_vae_button.click()
    view.load_path("demo")
    assert engines.current.last_job("load").params.vae is None


def test_remembered_fix_is_offered_and_applied(window, engines):
    view = window.models_view
    view.load_path("demo")
    job = engines.current.last_job("load")
    summary = replace(
        DEMO_SUMMARY,
        remembered_fix=RememberedFix(
            {"vae_precision": "fp32"}, "The VAE overflowed; run it in fp32.", "health check", 0.0
        ),
        remembered_on="NVIDIA GeForce RTX 3060",
    )
    engines.current.finish(job, summary)
    assert view.remembered.isVisible()
    assert "RTX 3060" in view.remembered.text.text()
    view.remembered.buttons["Apply to my settings"].click()
    assert load_settings().settings["vae_precision"] == "fp32"


def test_a_damaged_remembered_fixes_file_is_named_when_a_model_loads(window, engines):
    view = window.models_view
    view.load_path("demo")
    note = (
        "/data/profiles.json was damaged (entry 2: 'saved_at' is 'yesterday', not a time); the 4 "
        "remembered fixes that could be read are kept, and the file as it was is kept as "
        "/data/profiles.json.damaged-20260101-000000."
    )
    engines.current.finish(
        engines.current.last_job("load"), replace(DEMO_SUMMARY, profile_notes=(note,))
    )
    assert view.remembered.isVisible()
    assert "profiles.json.damaged-20260101-000000" in view.remembered.text.text()


def test_library_lists_scanned_models_and_marks_damaged_ones(window):
    view = window.models_view
    view._library_scanned(
        [
            {
                "path": "/models/a.safetensors",
                "architecture": "sdxl",
                "stored_dtype": "fp16",
                "size_bytes": 6_938_000_000,
                "error": None,
            },
            {
                "path": "/models/b.safetensors",
                "architecture": None,
                "stored_dtype": None,
                "size_bytes": 12,
                "error": "/models/b.safetensors: the header is cut short.",
            },
        ],
        "",
    )
    assert view.library.topLevelItemCount() == 4
    assert "draws coloured shapes" in view.library.topLevelItem(0).text(0)
    assert "overflows in fp16" in view.library.topLevelItem(1).text(0)
    good, bad = view.library.topLevelItem(2), view.library.topLevelItem(3)
    assert good.text(1) == "SDXL" and good.text(3) == "6.5 GB"
    assert bad.text(1) == "damaged" and "cut short" in bad.toolTip(0)
    assert "1 damaged" in view.library_status.text()
    view.library.setCurrentItem(bad)
    assert not view.load_button.isEnabled()


def test_library_marks_pickles_and_models_it_cannot_run(window):
    view = window.models_view
    view._library_scanned(
        [
            {
                "path": "/models/old.ckpt",
                "architecture": None,
                "stored_dtype": None,
                "size_bytes": 2_000_000_000,
                "error": None,
                "format": "pickle",
                "supported": True,
            },
            {
                "path": "/models/flux.safetensors",
                "architecture": "flux",
                "stored_dtype": "bf16",
                "size_bytes": 23_000_000_000,
                "error": None,
                "format": "single_file",
                "supported": False,
                "detected_because": "Its transformer is a FLUX MMDiT.",
            },
        ],
        "",
    )
    pickle, flux = view.library.topLevelItem(2), view.library.topLevelItem(3)
    assert pickle.text(1) == "pickle checkpoint"
    assert "confirm" in pickle.toolTip(0)
    assert flux.text(1) == "Flux.1 (not supported)"
    view.library.setCurrentItem(flux)
    assert not view.load_button.isEnabled()
    assert (
        "cannot run this kind of model yet (Its transformer is a FLUX MMDiT)."
        in view.load_status.text()
    )
    view.library.setCurrentItem(pickle)
    assert view.load_button.isEnabled()


def test_library_scan_runs_off_the_gui_thread(window, qtbot, tmp_path):
    view = window.models_view
    with qtbot.waitSignal(view.scanner.finished, timeout=20000):
        view.rescan()
    assert view.rescan_button.isEnabled()
    assert view.library.topLevelItemCount() >= 1


def test_library_lists_vaes_and_loads_a_model_with_its_paired_vae(window, engines, tmp_path):
    model = tmp_path / "anything.safetensors"
    paired = tmp_path / "anything.vae.safetensors"
    shared = tmp_path / "vae-ft-mse.safetensors"
    for file in (model, paired, shared):
        file.write_bytes(b"{}")
    view = window.models_view
    view._library_scanned(
        [
            {
                "path": str(model),
                "architecture": "sd1",
                "stored_dtype": "fp16",
                "size_bytes": 2_000_000_000,
                "error": None,
                "format": "single_file",
                "supported": True,
                "role": "model",
                "vae": str(paired),
            },
            {
                "path": str(shared),
                "architecture": "vae",
                "stored_dtype": "fp32",
                "size_bytes": 334_000_000,
                "error": None,
                "format": "single_file",
                "supported": False,
                "role": "vae",
                "vae": None,
            },
        ],
        "",
    )
    assert view.library_status.text() == "1 model found in your model folders, 1 VAE."
    with_vae, vae_row = view._item_for(str(model)), view._item_for(str(shared))
    assert with_vae is not None and vae_row is not None
    assert with_vae.text(1) == "Stable Diffusion 1.x + VAE" and str(paired) in with_vae.toolTip(0)
    assert vae_row.text(1) == "VAE"
    view.load_item(with_vae)
    assert engines.current.last_job("load").params.vae == str(paired)
    # Double-clicking a VAE chooses it; the user's choice wins over the pair.
    view.load_item(vae_row)
    assert view.vae_path == str(shared)
    view.load_item(with_vae)
    job = engines.current.last_job("load")
    assert (job.params.source, job.params.vae) == (str(model), str(shared))


def test_library_names_a_transformer_files_companions_or_what_is_missing(window):
    view = window.models_view
    view._library_scanned(
        [
            {
                "path": "/models/diffusion_models/chroma.safetensors",
                "architecture": "chroma",
                "error": None,
                "format": "split_files",
                "supported": True,
                "detected_because": "Chroma: a Flux-shaped transformer.",
                "companions": {
                    "text_encoder": "/models/text_encoders/t5xxl_fp16.safetensors",
                    "vae": "/models/vae/ae.safetensors",
                },
                "missing": None,
            },
            {
                "path": "/models/diffusion_models/sd3.5_large.safetensors",
                "architecture": "sd3",
                "error": None,
                "format": "split_files",
                "supported": False,
                "detected_because": "SD3.5 Large-shaped: an MMDiT.",
                "companions": {"text_encoder": None, "vae": None},
                "missing": "this SD3.5 Large transformer file needs its CLIP-L text encoder.",
            },
        ],
        "",
    )
    chroma, sd3 = view.library.topLevelItem(2), view.library.topLevelItem(3)
    assert chroma.text(1) == "Chroma"
    assert "Loads with: t5xxl_fp16.safetensors, ae.safetensors" in chroma.toolTip(0)
    assert sd3.text(1) == "Stable Diffusion 3.x (incomplete)"
    assert "needs its CLIP-L text encoder" in sd3.toolTip(0)
    view.library.setCurrentItem(sd3)
    assert not view.load_button.isEnabled()
    assert "sd3.5_large.safetensors: this SD3.5 Large transformer file needs" in (
        view.load_status.text()
    )
    assert "cannot run this kind of model" not in view.load_status.text()
    view.library.setCurrentItem(chroma)
    assert view.load_button.isEnabled()


def test_an_empty_library_does_not_say_zero_beside_the_listed_demos():
    assert library_count_words(0, 0, 0) == (
        "No models in your model folders yet; the built-in demos are always listed."
    )
    assert "0 models" not in library_count_words(0, 0, 0)
    assert library_count_words(2, 0, 1) == "2 models found in your model folders, 1 damaged."


def test_a_failed_open_shows_the_model_the_engine_still_holds(window, engines, tmp_path):
    view = window.models_view
    view.load_path("demo")
    demo_job = engines.current.last_job("load")
    engines.current.finish(demo_job, DEMO_SUMMARY)
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(b"\x00" * 10)
    view.load_path(str(broken))
    job = engines.current.last_job("load")
    engines.current.emit(
        job,
        EventState.ERROR,
        error_type="BadFileError",
        message=f"{broken}: the file is truncated.",
        result=StillLoaded(DEMO_SUMMARY, demo_job.params),
    )
    assert window.dialogs.shown[-1].message == f"{broken}: the file is truncated."
    assert window.state.model == DEMO_SUMMARY
    assert window.model_status.text() == "Model: demo"
    assert "demo is still loaded" in view.load_status.text()
    # Cancelling a later load says the same of what is kept.
    view.load_path("demo-overflow")
    job = engines.current.last_job("load")
    engines.current.emit(
        job,
        EventState.CANCELLED,
        message="Cancelled.",
        result=StillLoaded(DEMO_SUMMARY, demo_job.params),
    )
    assert window.state.model == DEMO_SUMMARY
    assert view.load_status.text() == "Loading cancelled; demo is still loaded."
