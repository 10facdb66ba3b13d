"""Asking "why is it black?" of an image (in the viewer a dropped image opens in, or from the
File menu) opens the explanation, never a model load and never a checkpoint error. The fake
engine answers with the real engine's `explain` handler run in this process, so the dialog shows
what core really says about the file."""

from __future__ import annotations

import struct
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from PySide6.QtWidgets import QApplication

from app.core.explain import Explanation
from app.core.explain.matching import ModelMatch
from app.core.explain.pixels import PixelFigures
from app.core.explain.records import Record
from app.core.jobs import CancelToken
from app.core.words.tools import ToolFix
from app.engine import jobs
from app.engine.events import EngineEvent, EventState
from app.engine.failures import describe_exception
from app.engine.server import JobContext, Session
from app.ui.explain_view import ExplainDialog
from tests.support.dropped_files import drop
from tests.support.image_files import a1111_parameters, comfy_prompt, pixels, png_text


def answer_with_the_real_handler(engines, job) -> None:
    """Run the engine's own `explain` job here and send its final event, as the engine would."""
    engine = engines.current

    def send(event: EngineEvent) -> None:
        engine.emit(job, event.state, stage=event.stage, done=event.done, total=event.total)

    context = JobContext(job, Session(), send, CancelToken())
    try:
        result = jobs.explain(context, job.params)
    except Exception as error:  # noqa: BLE001 - the engine turns every failure into ERROR
        failure = describe_exception(error, job.kind)
        engine.emit(
            job,
            EventState.ERROR,
            message=failure.message,
            details=failure.details,
            error_type=failure.error_type,
        )
        return
    engine.finish(job, result)


def open_dialog(window) -> ExplainDialog:
    assert window.explain_dialogs, "no explanation was opened"
    return window.explain_dialogs[-1]


def test_a_dropped_png_is_read_then_explained_never_loaded(window, engines, qtbot, tmp_path):
    image = png_text(
        tmp_path / "00001-42.png", {"parameters": a1111_parameters("lost-model", "0123456789")}
    )
    drop(window, image)
    qtbot.waitUntil(lambda: window.image_viewer is not None, timeout=3000)
    assert window.image_viewer.isVisible()
    assert "Made by AUTOMATIC1111" in window.image_viewer.parameters.text()
    assert engines.started == []  # reading an image needs no engine
    window.image_viewer.buttons["Why is it black?"].click()
    assert engines.current.jobs("load") == []
    job = engines.current.last_job("explain")
    assert job.params.path == str(image)
    dialog = open_dialog(window)
    assert dialog.isVisible()

    answer_with_the_real_handler(engines, job)

    assert window.dialogs.shown == []  # no error, least of all a safetensors one
    assert dialog.explanation is not None and dialog.explanation.status == "nan"
    assert dialog.verdict.level == "bad" and "NaN-black" in dialog.verdict.text.text()
    assert "AUTOMATIC1111" in dialog.verdict.text.text()
    assert "lost-model" in dialog.model_text.text() and "Looked in" in dialog.model_text.text()
    assert not dialog.progress.isVisible()


def test_the_fix_is_shown_in_the_image_tools_terms_and_can_be_copied(
    window, engines, qtbot, tmp_path
):
    dialog = window.explain_image(str(tmp_path / "x.png"))
    job = engines.current.last_job("explain")
    explanation = Explanation(
        path=str(tmp_path / "x.png"),
        made_by="a1111",
        status="nan",
        record=Record(made_by="a1111", model="sd"),
        pixels=PixelFigures(),
        model=ModelMatch(found=True, path="/m/sd.safetensors", looked_in=["/m"]),
        halfsafe_flags=["--vae-precision fp32"],
        tool_fix=ToolFix(
            tool="a1111",
            flags=["--no-half-vae"],
            settings={"upcast_attn": True},
            how="Add the flags to COMMANDLINE_ARGS.",
            notes=[],
            covered=True,
        ),
        message="This image is NaN-black.",
    )
    engines.current.finish(job, explanation)
    assert dialog.fix_card.isVisible()
    assert "--no-half-vae" in dialog.fix_body.text()
    assert "Upcast cross attention layer to float32" in dialog.fix_body.text()
    assert "--vae-precision fp32" in dialog.fix_body.text()
    dialog.copy_fix()
    assert QApplication.clipboard().text() == "--no-half-vae\nupcast_attn = True"


def test_a_picture_can_be_made_again_and_an_inverted_one_is_named(window, engines, tmp_path):
    from app.core.explain.remake import Remade

    dialog = window.explain_image(str(tmp_path / "x.png"))
    job = engines.current.last_job("explain")
    assert job.params.remake is False
    found = ModelMatch(found=True, path="/m/sd.safetensors", looked_in=["/m"])
    record = Record(made_by="comfyui", model="sd", seed=42, steps=12, scheduler="euler")
    fine = Explanation(str(tmp_path / "x.png"), "comfyui", "ok", record, PixelFigures(), found)
    engines.current.finish(job, fine)
    assert dialog.remake_button.isVisible()  # a picture whose model was found
    dialog.remake_button.click()
    again = engines.current.last_job("explain")
    assert again is not job and again.params.remake is True
    assert not dialog.remake_button.isVisible()
    remade = Remade("inverted", -0.99, "the file is that picture's negative", 42, (64, 64))
    engines.current.finish(again, replace(fine, status="inverted", remade=remade))
    assert dialog.windowTitle() == "Why are the colours of x.png inverted?"
    assert dialog.verdict.level == "bad" and "Inverted colours" in dialog.verdict.text.text()
    assert not dialog.remake_button.isVisible()
    # A NaN-black image is the check's to prove: it is not made again.
    other = window.explain_image(str(tmp_path / "y.png"))
    black = replace(fine, path=str(tmp_path / "y.png"), status="nan")
    engines.current.finish(engines.current.last_job("explain"), black)
    assert not other.remake_button.isVisible()
    # Nor is a picture whose record lacks what made it (here its seed).
    unseeded = window.explain_image(str(tmp_path / "z.png"))
    no_seed = replace(fine, path=str(tmp_path / "z.png"), record=replace(record, seed=None))
    engines.current.finish(engines.current.last_job("explain"), no_seed)
    assert not unseeded.remake_button.isVisible()


def test_halfsafes_own_fix_reads_as_its_flags_and_its_settings_names(window, engines, tmp_path):
    dialog = window.explain_image(str(tmp_path / "x.png"))
    job = engines.current.last_job("explain")
    layers = ["vae:decoder.up_blocks.0.resnets.0.conv1"]
    flags = ["--bf16-modules vae:decoder.up_blocks.0.resnets.0.conv1"]
    explanation = Explanation(
        path=str(tmp_path / "x.png"),
        made_by="halfsafe",
        status="nan",
        record=Record(made_by="halfsafe", model="demo-overflow"),
        pixels=PixelFigures(),
        model=ModelMatch(found=True, path="demo-overflow", looked_in=[]),
        halfsafe_flags=flags,
        tool_fix=ToolFix("halfsafe", flags, {"bf16_modules": layers}, "Add the flags.", [], True),
        message="This image is NaN-black.",
    )
    engines.current.finish(job, explanation)
    body = dialog.fix_body.text()
    assert "bf16_modules" not in body and "Layers in bf16" in body
    assert body.count("--bf16-modules") == 1
    dialog.copy_fix()
    assert QApplication.clipboard().text() == flags[0]


def test_a_hostile_png_explained_is_one_sentence_and_the_window_stays(
    window, engines, qtbot, tmp_path
):
    image = tmp_path / "renamed-checkpoint.png"
    image.write_bytes(struct.pack("<Q", 727905341921) + b"{}")  # what once read as a header
    dialog = window.explain_image(str(image))
    answer_with_the_real_handler(engines, engines.current.last_job("explain"))

    assert len(window.dialogs.shown) == 1
    message = window.dialogs.shown[0].message
    assert str(image) in message and "not a PNG" in message
    assert "header" not in message and "MB" not in message
    assert not dialog.isVisible()
    assert window.isVisible()


def test_closing_the_explanation_cancels_its_job(window, engines, tmp_path):
    dialog = window.explain_image(str(tmp_path / "x.png"))
    job = engines.current.last_job("explain")
    dialog.close()
    assert job.job_id in engines.current.cancels()
    assert dialog not in window.explain_dialogs


def test_an_image_opened_as_a_model_is_explained_instead(window, engines, tmp_path):
    image = png_text(tmp_path / "opened.png", {"parameters": "a cat"})
    window.models_view.load_path(str(image))
    assert engines.current.jobs("load") == []
    assert engines.current.last_job("explain").params.path == str(image)
    assert open_dialog(window).isVisible()


def _explain_in_the_window(window, engines, image: Path) -> ExplainDialog:
    window.explain_image(str(image))
    answer_with_the_real_handler(engines, engines.current.last_job("explain"))
    assert window.dialogs.shown == []
    return open_dialog(window)


def test_a_flat_grey_forge_image_is_shown_as_nan_replaced_by_zeros(window, engines, tmp_path):
    grey = Image.fromarray(np.full((64, 64, 3), 128, np.uint8), "RGB")
    parameters = a1111_parameters("lost-model", "0123456789", version="f2.0.1v1.10.1")
    image = png_text(tmp_path / "00003-42.png", {"parameters": parameters}, grey)

    dialog = _explain_in_the_window(window, engines, image)

    assert dialog.explanation is not None and dialog.explanation.status == "nan_zeroed"
    assert dialog.verdict.level == "bad"
    assert "NaN replaced by zeros" in dialog.verdict.text.text()
    assert "flat grey instead of black" in dialog.message.text()
    assert dialog.windowTitle() == "Why is 00003-42.png grey?"  # the title follows the image


def test_a_solid_colour_without_a_record_is_shown_modestly(window, engines, tmp_path):
    image = tmp_path / "solid.png"
    Image.fromarray(np.full((64, 64, 3), (200, 40, 90), np.uint8), "RGB").save(image)

    dialog = _explain_in_the_window(window, engines, image)

    assert dialog.explanation is not None and dialog.explanation.status == "flat"
    assert dialog.verdict.level == "warn"
    assert "One flat colour" in dialog.verdict.text.text()
    assert "looks like" in dialog.message.text()
    assert "NaN-black" not in dialog.verdict.text.text()
    assert dialog.windowTitle() == "Why is solid.png one flat colour?"


@pytest.mark.parametrize(
    ("colour", "look"),
    [(255, "white"), (0, "black"), (128, "grey")],
    ids=["white", "black", "grey"],
)
def test_a_flat_image_is_titled_by_how_it_looks(window, engines, tmp_path, colour, look):
    image = tmp_path / "flat.png"
    Image.fromarray(np.full((64, 64, 3), colour, np.uint8), "RGB").save(image)

    dialog = _explain_in_the_window(window, engines, image)

    assert dialog.explanation is not None
    assert dialog.windowTitle() == f"Why is flat.png {look}?"


def test_a_missing_model_shows_the_tools_next_steps_beside_add_folder(window, engines, tmp_path):
    parameters = a1111_parameters("lost-model", "0123456789")
    image = png_text(tmp_path / "00004-42.png", {"parameters": parameters})

    dialog = _explain_in_the_window(window, engines, image)

    assert dialog.add_folder_button.isVisible()  # the step that lets the check prove it stays
    assert dialog.steps_card.isVisible() and not dialog.fix_card.isVisible()
    assert dialog.steps_card.title.text() == "What to try in AUTOMATIC1111 web UI"
    steps = dialog.steps_body.text()
    assert "Likely, not proven:" in steps
    assert "1. Start AUTOMATIC1111 web UI with <code>--no-half-vae</code>" in steps
    assert "Upcast cross attention layer to float32" in steps
    assert steps.index("--no-half-vae") < steps.index("--no-half</code>")
    assert "COMMANDLINE_ARGS" in steps and "Add model folder" in steps


def test_a_tools_vae_default_shows_its_switch_last_and_only_if_changed(window, engines, tmp_path):
    image = png_text(tmp_path / "ComfyUI_00003_.png", {"prompt": comfy_prompt("lost.safetensors")})

    dialog = _explain_in_the_window(window, engines, image)

    steps = dialog.steps_body.text()
    assert "1. Start ComfyUI with <code>--force-upcast-attention</code>" in steps
    assert "Only if it is started with --fp16-vae: start ComfyUI with <code>--fp32-vae</code>" in (
        steps
    )


def test_a_dark_picture_whose_model_is_missing_gets_no_switch(window, engines, tmp_path):
    parameters = a1111_parameters("lost-model", "0123456789")
    image = png_text(tmp_path / "00005-42.png", {"parameters": parameters}, pixels("dark"))

    dialog = _explain_in_the_window(window, engines, image)

    assert dialog.explanation is not None and dialog.explanation.status == "black"
    assert not dialog.steps_card.isVisible()
    assert "--no-half" not in dialog.message.text()


def test_an_image_that_names_no_model_is_checked_with_the_one_the_user_names(
    window, engines, tmp_path
):
    """A black PNG without a record: the dialog offers the loaded model and a file, and the
    check then runs with the one the user names, saying whose word it was."""
    from tests.ui.conftest import DEMO_SUMMARY

    window.models_view.load_path("demo-overflow")
    loading = engines.current.last_job("load")
    engines.current.finish(loading, replace(DEMO_SUMMARY, name="demo-overflow"))
    image = tmp_path / "black.png"
    Image.fromarray(np.zeros((64, 64, 3), np.uint8), "RGB").save(image)
    dialog = _explain_in_the_window(window, engines, image)
    assert dialog.explanation is not None and not dialog.explanation.model.found
    assert dialog.choose_model_button.isVisible()
    assert dialog.loaded_button.isVisible()
    assert dialog.loaded_button.text() == "Check with demo-overflow"

    dialog.loaded_button.click()
    job = engines.current.last_job("explain")
    assert job.params.model == "demo-overflow"
    answer_with_the_real_handler(engines, job)
    result = dialog.explanation
    assert result.model.found and result.model.matched_by == "named by you"
    assert result.check is not None and result.check.fix is not None  # its VAE overflows
    assert "The check ran with the model you named (demo-overflow)." in dialog.notes.text()
    assert not dialog.choose_model_button.isVisible() and not dialog.loaded_button.isVisible()


def test_a_model_named_for_an_image_that_is_not_there_is_one_sentence(tmp_path):
    from app.core.errors import BadFileError
    from app.core.explain import explain_image

    image = tmp_path / "black.png"
    Image.fromarray(np.zeros((64, 64, 3), np.uint8), "RGB").save(image)
    with pytest.raises(BadFileError, match="there is no such file or folder"):
        explain_image(image, device="cpu", model=str(tmp_path / "gone.safetensors"))


def test_a_small_demo_picture_is_a_picture_that_can_be_made_again(window, engines, tmp_path):
    """docs/cli.md's own example at 128 px, a red circle on a blue background: a picture (not
    coloured noise), so the explanation offers to make it again and compare."""
    from tests.support.drawn import demo_picture, halfsafe_parameters

    picture = Image.fromarray(demo_picture("circle", "red", "blue", 128, grain=3.0), "RGB")
    prompt = "a red circle on a blue background"
    image = png_text(
        tmp_path / "red.png", {"parameters": halfsafe_parameters(prompt, 128)}, picture
    )
    dialog = _explain_in_the_window(window, engines, image)
    assert dialog.verdict.level != "bad"
    assert "noise" not in dialog.verdict.text.text().lower()
    assert dialog.remake_button.isVisible()


def test_tiled_noise_from_an_int8_file_is_shown_as_a_tool_fault(window, engines, tmp_path):
    rng = np.random.default_rng(16)
    cells = rng.integers(0, 256, (16, 16, 3)).astype(np.uint8)
    blocks = Image.fromarray(cells).resize((256, 256), Image.Resampling.NEAREST)
    parameters = a1111_parameters("krea2-int8.safetensors", "0123456789")
    image = png_text(tmp_path / "tiles.png", {"parameters": parameters}, blocks)

    dialog = _explain_in_the_window(window, engines, image)

    assert dialog.explanation is not None and dialog.explanation.status == "tiled_noise"
    assert dialog.verdict.level == "bad"
    assert "Tiled or blocky noise" in dialog.verdict.text.text()
    assert "bf16, fp8 or GGUF" in dialog.message.text()
    assert dialog.windowTitle() == "Why is tiles.png tiled or blocky noise?"
