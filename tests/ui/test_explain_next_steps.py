"""The explanation dialog fits its answer and offers the next step: a model it could not find
gets "Add model folder…", which adds the folder and looks again."""

from __future__ import annotations

from PySide6.QtWidgets import QLabel

from app.core.explain import Explanation
from app.core.explain.matching import ModelMatch
from app.core.explain.pixels import PixelFigures
from app.core.explain.records import Record
from app.core.settings import load_settings
from app.core.words.tools import ToolFix

LONG_NOTE = (
    "The image's workflow names a LoRA that is not in the install's Lora folder, so the check "
    "ran without it; a LoRA that overflows would not show here."
)


def _explanation(path: str, found: bool) -> Explanation:
    looked = [f"/models/folder-{n}/Stable-diffusion" for n in range(8)]
    return Explanation(
        path=path,
        made_by="a1111",
        status="nan",
        record=Record(made_by="a1111", model="lost-model"),
        pixels=PixelFigures(),
        model=ModelMatch(
            found=found, path="/m/lost-model.safetensors" if found else None, looked_in=looked
        ),
        halfsafe_flags=["--vae-precision fp32"],
        tool_fix=ToolFix(
            tool="a1111",
            flags=["--no-half-vae"],
            settings={"upcast_attn": True},
            how="Add the flags to COMMANDLINE_ARGS in webui-user.bat (or webui-user.sh).",
            notes=[],
            covered=True,
        )
        if found
        else None,
        message="This image is NaN-black: every pixel was NaN when it was saved. " * 3,
        notes=[LONG_NOTE] * 4,
    )


def test_the_dialog_grows_to_its_answer_and_clips_no_text(window, engines, qtbot, tmp_path):
    dialog = window.explain_image(str(tmp_path / "x.png"))
    qtbot.waitExposed(dialog)
    engines.current.finish(engines.current.last_job("explain"), _explanation("x.png", True))
    qtbot.waitUntil(lambda: dialog.height() > 400, timeout=2000)
    assert dialog.answer.horizontalScrollBar().maximum() == 0
    screen = dialog.screen().availableGeometry().height()
    if dialog.height() < screen - 80:  # all of it fits on the screen: nothing scrolls
        assert dialog.answer.verticalScrollBar().maximum() == 0
    for text in dialog.findChildren(QLabel):
        if text.isVisible() and text.wordWrap() and text.text():
            assert text.height() >= text.heightForWidth(text.width()), text.text()[:40]


def test_a_missing_model_offers_to_add_its_folder_and_looks_again(window, engines, qtbot, tmp_path):
    dialog = window.explain_image(str(tmp_path / "x.png"))
    engines.current.finish(engines.current.last_job("explain"), _explanation("x.png", False))
    assert dialog.add_folder_button.isVisible()
    assert "lost-model was not found" in dialog.model_text.text()
    folder = tmp_path / "more models"
    folder.mkdir()
    kept = list(load_settings().settings["model_folders"])

    dialog.use_model_folder(str(folder))

    assert load_settings().settings["model_folders"] == [*kept, str(folder)]
    assert len(engines.current.jobs("explain")) == 2  # it looks again, there too
    assert not dialog.add_folder_button.isVisible()
    engines.current.finish(engines.current.last_job("explain"), _explanation("x.png", True))
    assert "Found /m/lost-model.safetensors" in dialog.model_text.text()
    assert dialog.fix_card.isVisible()
