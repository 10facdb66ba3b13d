"""The first start: the hint on the Models page and the model-folder step, shown when due (the
app opts in with `start_background(first_start=True)`; the `window` fixture never does), never
again once done, and again from the Help menu; saving folders never loses the user's own."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from app.core.settings import load_settings
from app.engine.events import EventState
from app.ui.first_run import FOLDERS_DONE, HINT_DONE, ModelFolderDialog, merged_folders
from tests.ui.conftest import DEMO_SUMMARY, load_fake_model


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A home folder with a ComfyUI and an AUTOMATIC1111 install, and nothing else around."""
    home = tmp_path / "home"
    for folder in (
        "ComfyUI/models/checkpoints",
        "ComfyUI/models/vae",
        "stable-diffusion-webui/models/Stable-diffusion",
    ):
        (home / folder).mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / ".local" / "share"))
    monkeypatch.delenv("INVOKEAI_ROOT", raising=False)
    return home


def _folder_step(window) -> ModelFolderDialog | None:
    dialog = window.first_start.folder_dialog
    return dialog if dialog is not None and dialog.isVisible() else None


def _found(qtbot, dialog: ModelFolderDialog) -> dict[str, Qt.CheckState]:
    qtbot.waitUntil(lambda: not dialog.finder.running and "Looking" not in dialog.status.text())
    items = [dialog.folders.item(row) for row in range(dialog.folders.count())]
    return {item.data(Qt.ItemDataRole.UserRole): item.checkState() for item in items}


def _skip_folder_step(qtbot, window) -> None:
    dialog = _folder_step(window)
    assert dialog is not None
    _found(qtbot, dialog)
    dialog.reject()


def _help_action(window, text: str):
    return next(
        action
        for menu in window.menuBar().actions()
        if menu.text() == "&Help"
        for action in menu.menu().actions()
        if action.text() == text
    )


def _new_window(qtbot, engines):
    """Another start of the app on the same config folder."""
    from app.ui.application import build_main_window

    window = build_main_window(engines)
    qtbot.addWidget(window)
    window.show()
    qtbot.waitExposed(window)
    return window


def test_the_first_start_shows_the_hint_and_the_folder_step(window, home, qtbot):
    window.start_background(first_start=True)
    hint = window.models_view.first_start_hint
    assert hint.isVisible()
    shown = re.sub(r"<[^>]+>", "", hint.text.text())
    assert shown == "New here? Load the demo model, then press Health check."
    assert set(hint.buttons) == {"Load the demo", "Dismiss"}
    dialog = _folder_step(window)
    assert dialog is not None
    _found(qtbot, dialog)
    dialog.reject()


def test_a_window_that_did_not_opt_in_shows_neither(window, home):
    window.start_background()
    assert window.models_view.first_start_hint.isHidden()
    assert window.findChildren(ModelFolderDialog) == []


def test_the_hint_loads_the_demo_and_opens_the_health_check(window, engines, home):
    window.first_start.show_hint()
    hint = window.models_view.first_start_hint
    hint.buttons["Load the demo"].click()
    job = engines.current.last_job("load")
    assert job.params.source == "demo"
    assert window.current_page() == "Health check"
    # Loaded while the Models page is out of sight: back there, the hint says the next step.
    engines.current.finish(job, DEMO_SUMMARY)
    window.show_page("Models")
    assert re.sub(r"<[^>]+>", "", hint.text.text()).startswith("Next: press Health check")


def test_a_dismissed_hint_never_comes_back(window, engines, home, qtbot):
    window.start_background(first_start=True)
    _skip_folder_step(qtbot, window)
    window.models_view.first_start_hint.buttons["Dismiss"].click()
    assert window.models_view.first_start_hint.isHidden()
    later = _new_window(qtbot, engines)
    later.start_background(first_start=True)
    assert later.models_view.first_start_hint.isHidden()
    assert _folder_step(later) is None


def test_once_a_model_is_loaded_the_hint_says_the_next_step(window, engines, home, qtbot):
    window.start_background(first_start=True)
    _skip_folder_step(qtbot, window)
    window.show_page("Models")
    load_fake_model(window, engines)  # loaded from the list, not by the hint's button
    hint = window.models_view.first_start_hint
    assert hint.isVisible()
    shown = re.sub(r"<[^>]+>", "", hint.text.text())
    assert shown.startswith("Next: press Health check") and "Load the demo" not in shown
    hint.buttons["Open Health check"].click()
    assert window.current_page() == "Health check"


def test_running_a_check_ends_the_hint_for_good(window, engines, home, qtbot):
    window.start_background(first_start=True)
    _skip_folder_step(qtbot, window)
    load_fake_model(window, engines)
    window.health_view.run_check()
    assert window.models_view.first_start_hint.isVisible()  # until the engine takes it
    engines.current.emit(engines.current.last_job("check"), EventState.PROGRESS, stage="Text")
    assert window.models_view.first_start_hint.isHidden()
    assert window.ui_settings.value(HINT_DONE) in (True, "true")
    later = _new_window(qtbot, engines)
    later.start_background(first_start=True)
    assert later.models_view.first_start_hint.isHidden()


def test_the_folder_step_comes_once_and_the_hint_until_it_is_done(window, engines, home, qtbot):
    window.start_background(first_start=True)
    _skip_folder_step(qtbot, window)
    window.save_state()  # closing the window saves its geometry
    later = _new_window(qtbot, engines)
    later.start_background(first_start=True)
    assert _folder_step(later) is None
    assert later.models_view.first_start_hint.isVisible()


def test_someone_who_used_halfsafe_before_these_steps_sees_neither(window, engines, home, qtbot):
    window.save_state()  # a window.ini from before: geometry, no first-start flags
    assert not window.ui_settings.contains(FOLDERS_DONE)
    later = _new_window(qtbot, engines)
    later.start_background(first_start=True)
    assert later.models_view.first_start_hint.isHidden()
    assert _folder_step(later) is None


def test_the_help_menu_shows_both_steps_again(window, home, qtbot):
    window.start_background(first_start=True)
    _skip_folder_step(qtbot, window)
    window.models_view.first_start_hint.buttons["Dismiss"].click()
    window.show_page("Settings")
    _help_action(window, "Show the &first-start steps again").trigger()
    assert window.current_page() == "Models"
    assert window.models_view.first_start_hint.isVisible()
    dialog = _folder_step(window)
    assert dialog is not None
    _found(qtbot, dialog)
    dialog.reject()


def test_the_folder_step_lists_the_tools_model_folders_ticked(window, home, qtbot):
    dialog = window.first_start.open_folder_step()
    found = _found(qtbot, dialog)
    assert found == {
        str(home / "ComfyUI/models/checkpoints"): Qt.CheckState.Checked,
        str(home / "stable-diffusion-webui/models/Stable-diffusion"): Qt.CheckState.Checked,
    }  # not the VAE folder (a model folder would list its VAEs as models), not HalfSafe's own
    assert "Found 2 model folders" in dialog.status.text()
    dialog.reject()


def test_saving_adds_the_ticked_folders_after_the_users_own(window, home, qtbot, tmp_path):
    own = str(tmp_path / "unplugged-drive" / "models")  # not there now: still the user's
    window.state.apply({"model_folders": [own]})
    extra = tmp_path / "my models"
    extra.mkdir()
    dialog = window.first_start.open_folder_step()
    found = _found(qtbot, dialog)
    assert found[own] == Qt.CheckState.Checked
    kept = dialog.folders.item(0)
    assert not kept.flags() & Qt.ItemFlag.ItemIsUserCheckable  # removed in Settings, not here

    a1111 = str(home / "stable-diffusion-webui/models/Stable-diffusion")
    row = next(r for r in range(dialog.folders.count()) if dialog.folders.item(r).text() == a1111)
    dialog.folders.item(row).setCheckState(Qt.CheckState.Unchecked)
    dialog.choose_folder = lambda: str(extra)
    add = next(
        b for b in dialog.findChildren(type(dialog.save_button)) if b.text() == "Add folder…"
    )
    add.click()
    dialog.save_button.click()

    expected = [own, str(home / "ComfyUI/models/checkpoints"), str(extra)]
    assert window.state.settings["model_folders"] == expected
    assert load_settings().settings["model_folders"] == expected
    assert not dialog.isVisible()


def test_skip_changes_no_folder(window, home, qtbot, tmp_path):
    window.state.apply({"model_folders": [str(tmp_path)]})
    dialog = window.first_start.open_folder_step()
    _found(qtbot, dialog)
    skip = next(b for b in dialog.findChildren(type(dialog.save_button)) if b.text() == "Skip")
    skip.click()
    assert window.state.settings["model_folders"] == [str(tmp_path)]
    assert not dialog.isVisible()


def test_a_folder_that_is_not_there_is_one_sentence_and_not_added(window, home, qtbot, tmp_path):
    dialog = window.first_start.open_folder_step()
    _found(qtbot, dialog)
    count = dialog.folders.count()
    gone = tmp_path / "gone"
    dialog.add_folder(str(gone))
    assert window.dialogs.shown[-1].message == f"{gone}: this folder does not exist."
    assert dialog.folders.count() == count
    window.dialogs.close_all()
    dialog.reject()


def test_a_folder_already_listed_is_ticked_not_listed_twice(window, home, qtbot):
    dialog = window.first_start.open_folder_step()
    _found(qtbot, dialog)
    comfy = str(home / "ComfyUI/models/checkpoints")
    row = next(r for r in range(dialog.folders.count()) if dialog.folders.item(r).text() == comfy)
    dialog.folders.item(row).setCheckState(Qt.CheckState.Unchecked)
    dialog.add_folder(comfy + "/")
    assert [dialog.folders.item(r).text() for r in range(dialog.folders.count())].count(comfy) == 1
    assert comfy in dialog.ticked()
    dialog.reject()


def test_merged_folders_keep_every_folder_of_the_user_in_its_place():
    assert merged_folders(["/b", "/a"], ["/a", "/c", "/b/"]) == ["/b", "/a", "/c"]


def test_folders_saved_while_a_scan_runs_are_scanned_after_it(window, qtbot, tmp_path):
    view = window.models_view
    folder = tmp_path / "saved during the scan"
    folder.mkdir()
    (folder / "broken.safetensors").write_bytes(b"not a model")
    view.scanner.running = True  # the start-up scan is still going
    window.state.apply({"model_folders": [str(folder)]})
    view.scanner.running = False
    view.scanner.finished.emit([], "")  # the start-up scan ends, without the new folder

    def listed() -> list[str]:
        return [
            view.library.topLevelItem(i).text(0) for i in range(view.library.topLevelItemCount())
        ]

    qtbot.waitUntil(lambda: "broken.safetensors" in listed(), timeout=20000)
