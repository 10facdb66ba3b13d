"""The Models page: loading with progress and cancel, pickle confirmation, separate VAE, the
remembered fix, and what was detected; the library's metadata, search, family filter, health
columns and previews."""

from __future__ import annotations

from dataclasses import replace

from app.core.fixing.profiles import RememberedFix
from app.core.library.metadata import card_from_metadata
from app.core.requests.records import LoadRequest
from app.core.settings import load_settings
from app.engine.events import CancelRequest, EventState, StillLoaded
from app.ui.browser import card_dict
from app.ui.library_scan import library_count_words
from app.ui.model_list import FIX, HEALTH, SIZE, TYPE
from tests.support.model_cards import KOHYA_SDXL, lora_file, png_file, raw_header
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
    assert good.text(TYPE) == "SDXL" and good.text(SIZE) == "6.5 GB"
    assert bad.text(TYPE) == "damaged" and "cut short" in bad.toolTip(0)
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
    assert pickle.text(TYPE) == "pickle checkpoint"
    assert "confirm" in pickle.toolTip(0)
    assert flux.text(TYPE) == "Flux.1 (not supported)"
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
    with_vae, vae_row = view.library.item_for(str(model)), view.library.item_for(str(shared))
    assert with_vae is not None and vae_row is not None
    assert with_vae.text(TYPE) == "Stable Diffusion 1.x + VAE" and str(paired) in with_vae.toolTip(
        0
    )
    assert vae_row.text(TYPE) == "VAE"
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
    assert chroma.text(TYPE) == "Chroma"
    assert "Loads with: t5xxl_fp16.safetensors, ae.safetensors" in chroma.toolTip(0)
    assert sd3.text(TYPE) == "Stable Diffusion 3.x (incomplete)"
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
    # The engine dies: nothing is loaded any more, and nothing on the page says otherwise.
    engines.current.crash()
    assert window.state.model is None
    assert view.details.title.text() == "No model loaded"
    assert "still loaded" not in view.load_status.text()


# The browser: metadata, search and family filter, health, previews ----------------------------


def _scan(window, qtbot, folder) -> None:
    view = window.models_view
    with qtbot.waitSignal(view.scanner.finished, timeout=20000):
        window.state.set_setting("model_folders", [str(folder)])


def _row(view, name: str):
    for index in range(view.library.topLevelItemCount()):
        item = view.library.topLevelItem(index)
        if item.text(0) == name:
            return item
    raise AssertionError(f"{name} is not listed")


def test_the_library_shows_what_each_files_metadata_says(window, qtbot, tmp_path):
    lora_file(tmp_path / "inkwash.safetensors", KOHYA_SDXL)
    raw_header(tmp_path / "hostile.safetensors", b'{"__metadata__": {"a": 1}}')
    _scan(window, qtbot, tmp_path)
    view = window.models_view
    ink = _row(view, "inkwash.safetensors")
    assert "Base model: SDXL (trained from sd_xl_base_1.0.safetensors)" in ink.toolTip(0)
    view.library.setCurrentItem(ink)
    assert view.card_text.isVisible()
    assert "Trigger words: 1girl, inkwash style, mountain" in view.card_text.text()
    assert "Trained at 1024×1024" in view.card_text.text()
    hostile = _row(view, "hostile.safetensors")
    assert hostile.text(TYPE) == "damaged" and "__metadata__" in hostile.toolTip(0)
    view.library.setCurrentItem(hostile)
    assert not view.card_text.isVisible()


def _two_models(view) -> None:
    view._library_scanned(
        [
            {
                "path": "/models/anime_xl.safetensors",
                "architecture": "sdxl",
                "size_bytes": 6_900_000_000,
                "supported": True,
                "card": card_dict(card_from_metadata(KOHYA_SDXL)),
            },
            {
                "path": "/models/flux_dev.safetensors",
                "architecture": "flux-dev",
                "size_bytes": 23_000_000_000,
                "supported": True,
            },
            {"path": "/models/sdxl_vae.safetensors", "architecture": "vae", "role": "vae"},
        ],
        "",
    )


def _shown(view) -> list[str]:
    return [
        view.library.topLevelItem(i).text(0)
        for i in range(view.library.topLevelItemCount())
        if not view.library.topLevelItem(i).isHidden()
    ]


def test_search_finds_names_and_trigger_words_and_the_family_filter_narrows(window):
    view = window.models_view
    _two_models(view)
    assert len(_shown(view)) == 5
    view.search.setText("inkwash")  # a trigger word, not in the file's name
    assert _shown(view) == ["anime_xl.safetensors"]
    view.search.setText("FLUX")
    assert _shown(view) == ["flux_dev.safetensors"]
    assert view.library.currentItem().text(0) == "flux_dev.safetensors"  # Load loads what shows
    view.search.clear()
    families = [view.family.itemText(i) for i in range(view.family.count())]
    assert families == ["All families", "Flux.1", "SDXL", "Stable Diffusion 1.x", "VAEs"]
    view.family.setCurrentText("SDXL")
    assert _shown(view) == ["anime_xl.safetensors"]
    view.family.setCurrentText("Stable Diffusion 1.x")  # the built-in demos
    assert len(_shown(view)) == 2 and all("demo" in n.lower() for n in _shown(view))
    view.family.setCurrentText("All families")
    assert len(_shown(view)) == 5


def test_each_model_shows_its_last_verdict_and_remembered_fix(window, qtbot, tmp_path):
    from app.core.fixing import profiles
    from app.core.health import saved
    from tests.support import reports

    model = lora_file(tmp_path / "sdxl.safetensors")
    checked = replace(reports.fixable(), model=replace(reports.SDXL, source=str(model)))
    saved.save_report("key-sdxl", reports.result(checked))
    profiles.remember_fix(
        "key-sdxl",
        reports.RTX_3060.name,
        {"vae_precision": "fp32"},
        "The VAE overflowed; fix: run the VAE in fp32.",
        "health check",
        torch_version="2.5.1",
    )
    view = window.models_view
    with qtbot.waitSignal(view.health_reader.read, timeout=10000):
        view._library_scanned(
            [
                {"path": str(model), "architecture": "sdxl", "size_bytes": 10, "supported": True},
                {"path": "/models/other.safetensors", "architecture": "sdxl", "size_bytes": 10},
            ],
            "",
        )
    row = _row(view, "sdxl.safetensors")
    assert row.text(HEALTH) == "Fixable"
    assert row.text(FIX) == "Run the VAE in fp32"
    assert "NVIDIA GeForce RTX 3060" in row.toolTip(HEALTH)
    other = _row(view, "other.safetensors")
    assert other.text(HEALTH) == "not checked" and other.text(FIX) == ""


def test_a_preview_beside_a_model_becomes_its_icon_and_a_bad_one_a_sentence(
    window, qtbot, tmp_path
):
    good = lora_file(tmp_path / "good.safetensors")
    png_file(tmp_path / "good.preview.png", (300, 200))
    bad = lora_file(tmp_path / "bad.safetensors")
    (tmp_path / "bad.png").write_bytes(b"GIF89a but not really a picture")
    plain = lora_file(tmp_path / "plain.safetensors")
    view = window.models_view
    paths = [good, bad, plain]
    view._library_scanned(
        [{"path": str(p), "architecture": "sd1", "size_bytes": 10} for p in paths], ""
    )
    assert view.previews.wait_idle(10)
    qtbot.waitUntil(lambda: str(good) in view.thumbnails, timeout=5000)
    qtbot.waitUntil(lambda: "not a PNG, JPEG or WebP" in _row(view, "bad.safetensors").toolTip(0))
    assert not view.thumbnails[str(good)].isNull()
    assert max(view.thumbnails[str(good)].width(), view.thumbnails[str(good)].height()) <= 96
    assert str(bad) not in view.thumbnails and str(plain) not in view.thumbnails
    # Every row gets a square, so that names line up; only the good one shows a picture.
    icon = _row(view, "good.safetensors").icon(0).pixmap(32, 32).toImage()
    blank = _row(view, "plain.safetensors").icon(0).pixmap(32, 32).toImage()
    assert icon.pixelColor(16, 16).alpha() == 255 and blank.pixelColor(16, 16).alpha() == 0


def test_the_banner_shows_the_fix_remembered_now_not_the_one_the_load_found(window, engines):
    """A generation that repaired an image remembered its repair: once the saved fixes are read
    again, the banner names that one, not the fix the model was loaded with."""
    from app.ui.browser import ModelHealth, health_key

    view = window.models_view
    view.load_path("demo")
    here = "NVIDIA GeForce RTX 3060"
    old = RememberedFix({"vae_precision": "fp32"}, "The old fix.", "health check", 0.0)
    engines.current.finish(
        engines.current.last_job("load"),
        replace(DEMO_SUMMARY, remembered_fix=old, remembered_on=here),
    )
    assert "The old fix." in view.remembered.text.text()
    new = {"bf16_modules": ["vae:decoder.up_blocks.0.resnets.0.conv1"]}
    view._health_read(
        {
            health_key(view.loaded_source()): ModelHealth(
                fix="1 VAE layer in bf16",
                fix_summary="The new fix.",
                fix_on=here,
                fix_settings=new,
            )
        }
    )
    assert "The new fix." in view.remembered.text.text()
    assert "The old fix." not in view.remembered.text.text()
    # The same fix as the load's, or another device's: the banner stays as it is.
    view._health_read(
        {
            health_key(view.loaded_source()): ModelHealth(
                fix_summary="Another device's.", fix_on="Some other GPU", fix_settings=new
            )
        }
    )
    assert "The new fix." in view.remembered.text.text()
    view._show_remembered(new, "", here)  # said by its settings alone: still a sentence
    assert "Keep 1 VAE layer in bf16. Settings left on Auto" in view.remembered.text.text()
