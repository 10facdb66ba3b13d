"""The window itself: it opens fast without torch, survives the engine dying, and persists."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import QApplication

from app.engine.events import EventState
from tests.support import reports
from tests.support.window_imports import ENGINE_SIDE, THIRD_PARTY
from tests.ui.conftest import DEMO_SUMMARY, load_fake_model

ROOT = Path(__file__).resolve().parents[2]


def test_window_opens_with_title_pages_and_status_bar(window, engines):
    assert window.windowTitle().startswith("HalfSafe")
    assert window.isVisible()
    assert [window.navigation.item(i).text() for i in range(window.navigation.count())] == [
        "Models",
        "Health check",
        "Fixes",
        "Generate",
        "Devices",
        "Settings",
    ]
    assert window.model_status.text() == "Model: none loaded"
    assert window.device_status.text().startswith("Device:")
    assert window.precision_status.text().startswith("Precision:")
    # Nothing needed the engine yet, so it was not started.
    assert engines.started == []
    assert window.engine_status.text() == "Engine: not started"


def test_gui_process_never_imports_torch_nor_the_engine_side_of_core():
    watched = sorted(THIRD_PARTY | ENGINE_SIDE)
    code = (
        "import sys, json\n"
        "from app.ui.application import application, build_main_window\n"
        "app = application()\n"
        "window = build_main_window()\n"
        "window.show(); app.processEvents()\n"
        "for page in range(window.pages.count()):\n"
        "    window.navigation.setCurrentRow(page); app.processEvents()\n"
        "window.client.shutdown()\n"
        f"imported = [name for name in {watched!r} if name in sys.modules]\n"
        "print(json.dumps({'imported': imported, 'visible': window.isVisible()}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result == {"imported": [], "visible": True}


def test_demo_model_is_always_listed_as_the_built_in_demo(window):
    first = window.models_view.library.topLevelItem(0)
    assert "draws coloured shapes" in first.text(0)


def test_engine_crash_shows_restart_offer_keeps_images_and_restart_works(window, engines, tmp_path):
    load_fake_model(window, engines)
    view = window.generate_view
    image = tmp_path / "saved.png"
    _write_png(image)
    view.add_result(
        reports.generation({"images": [reports.image(str(image), seed=5)]}),
        {"prompt": "a cat", "steps": 4},
    )
    window.show_page("Generate")
    view.generate()
    running = engines.current.last_job("generate")

    engines.current.crash(returncode=-9)

    assert window.engine_banner.isVisible()
    assert "killed" in window.engine_banner.text.text()
    assert "image already saved is kept" in window.engine_banner.text.text()
    assert "Restart engine" in window.engine_banner.buttons
    assert window.engine_status.text() == "Engine: stopped"
    # The job the engine held ended, and the saved image is still in the gallery.
    assert running.job_id not in view.jobs
    assert view.gallery.count() == 1
    assert window.state.model is None

    window.engine_banner.buttons["Restart engine"].click()

    assert len(engines.started) == 2
    assert engines.started[0].stopped or not engines.started[0].running
    assert not window.engine_banner.isVisible() or window.engine_banner.level == "info"
    # The model that was loaded is loaded again in the fresh engine.
    reload = engines.current.last_job("load")
    assert reload.params.source == "demo"
    engines.current.finish(reload, DEMO_SUMMARY)
    assert window.state.model is not None
    assert view.gallery.count() == 1


def test_restart_from_menu_kills_a_stuck_engine_and_cancels_its_jobs(window, engines):
    load_fake_model(window, engines)
    window.health_view.run_check()
    stuck = engines.current
    window.restart_action.trigger()
    assert stuck.stopped
    assert window.health_view.job_id is None
    assert len(engines.started) == 2


def test_drag_and_drop_of_a_file_loads_it(window, engines, tmp_path, qtbot):
    checkpoint = tmp_path / "dreamy.safetensors"
    checkpoint.write_bytes(b"{}")
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(checkpoint))])
    target = window.rect().center()  # QDragEnterEvent takes a QPoint, QDropEvent a QPointF
    enter = QDragEnterEvent(
        target,
        Qt.DropAction.CopyAction,
        mime,
        Qt.MouseButton.LeftButton,
        Qt.KeyboardModifier.NoModifier,
    )
    QApplication.sendEvent(window, enter)
    assert enter.isAccepted()
    drop = QDropEvent(
        QPointF(target),
        Qt.DropAction.CopyAction,
        mime,
        Qt.MouseButton.LeftButton,
        Qt.KeyboardModifier.NoModifier,
    )
    QApplication.sendEvent(window, drop)

    qtbot.waitUntil(lambda: bool(engines.started and engines.current.jobs("load")), timeout=3000)
    job = engines.current.last_job("load")
    assert job.params.source == str(checkpoint)
    assert window.current_page() == "Models"
    engines.current.emit(job, EventState.PROGRESS, stage="Reading weights", done=1, total=4)
    assert window.models_view.progress.value() == 1
    assert "Reading weights" in window.models_view.load_status.text()


def test_drag_of_plain_text_is_refused(window):
    mime = QMimeData()
    mime.setText("not a file")
    enter = QDragEnterEvent(
        window.rect().center(),
        Qt.DropAction.CopyAction,
        mime,
        Qt.MouseButton.LeftButton,
        Qt.KeyboardModifier.NoModifier,
    )
    QApplication.sendEvent(window, enter)
    assert not enter.isAccepted()


def test_geometry_page_and_prompt_persist(qtbot, engines):
    from app.ui.application import application, build_main_window

    application()
    first = build_main_window(engines)
    qtbot.addWidget(first)
    first.show()
    first.resize(781, 563)
    first.show_page("Settings")
    first.generate_view.prompt.setPlainText("a lighthouse at dusk")
    first.close()

    second = build_main_window(engines)
    qtbot.addWidget(second)
    second.show()
    assert second.current_page() == "Settings"
    assert (second.width(), second.height()) == (781, 563)
    assert second.generate_view.prompt.toPlainText() == "a lighthouse at dusk"
    second.close()


def test_damaged_settings_file_is_reported_in_plain_words(qtbot, engines):
    from app.core.settings import settings_path
    from app.ui.application import application, build_main_window

    path = settings_path()
    path.write_text(json.dumps({"schema_version": 1, "settings": {"steps": "many"}}))
    application()
    window = build_main_window(engines)
    qtbot.addWidget(window)
    window.show()
    assert window.notice_banner.isVisible()
    assert "steps" in window.notice_banner.text.text()
    window.close()


def _window_on(qtbot, engines):
    from app.ui.application import application, build_main_window

    application()
    window = build_main_window(engines)
    qtbot.addWidget(window)
    window.show()
    return window


def test_a_truncated_settings_file_without_backup_says_everything_was_reset(qtbot, engines):
    from app.core.settings import ALL_RESET, settings_path

    settings_path().write_text('{"schema_version": 1, "settings": {"steps": 4')
    window = _window_on(qtbot, engines)
    banner = window.notice_banner.text.text()
    assert window.notice_banner.isVisible()
    assert "every setting is back to its default" in banner and ALL_RESET[:40] in banner
    assert "everything else was kept" not in banner
    window.close()


def test_a_config_folder_that_is_a_file_still_opens_the_window(
    qtbot, engines, tmp_path, monkeypatch
):
    blocker = tmp_path / "config-file"
    blocker.write_text("keep me")
    monkeypatch.setenv("HALFSAFE_CONFIG_DIR", str(blocker))
    window = _window_on(qtbot, engines)
    assert window.notice_banner.isVisible()
    assert "is a file" in window.notice_banner.text.text()
    # A change still applies to this session, and the user is told it was not saved.
    window.state.set_setting("steps", 33)
    assert window.state.settings["steps"] == 33
    assert "could not be saved" in window.dialogs.shown[-1].message
    assert blocker.read_text() == "keep me"
    window.close()


def test_a_change_saved_by_another_halfsafe_is_kept_when_this_window_saves(window):
    from app.core.settings import load_settings, update_settings

    update_settings({"steps": 61})  # another process, after this window loaded its settings
    window.state.set_setting("cfg", 11.5)
    saved = load_settings().settings
    assert saved["steps"] == 61 and saved["cfg"] == 11.5
    assert window.state.settings["steps"] == 61  # the window shows what the file holds


def test_errors_go_through_one_dialog_with_details_folded_away(window, engines):
    load_fake_model(window, engines)
    window.health_view.run_check()
    job = engines.current.last_job("check")
    engines.current.emit(
        job,
        EventState.ERROR,
        message="The GPU ran out of memory while running the health check.",
        details="Traceback (most recent call last): ...",
    )
    shown = window.dialogs.shown[-1]
    assert shown.message.startswith("The GPU ran out of memory")
    assert "Traceback" in shown.details
    box = window.dialogs._open[-1]
    assert box.text() == shown.message
    assert "Traceback" in box.detailedText()
    assert "Traceback" not in box.text()


def _write_png(path: Path) -> None:
    from PySide6.QtGui import QColor, QImage

    image = QImage(16, 16, QImage.Format.Format_RGB32)
    image.fill(QColor("steelblue"))
    assert image.save(str(path))


_OPEN_WINDOW = """
from app.ui.application import application, build_main_window
application()
window = build_main_window()
window.show()
print(window.notice_banner.text.text())
"""


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are a POSIX thing")
def test_fifos_where_the_settings_and_window_files_should_be_never_block_the_start(tmp_path):
    from app.core.settings import settings_path

    config = settings_path().parent
    os.mkfifo(config / "settings.json")
    os.mkfifo(config / "window.ini")
    done = subprocess.run(
        [sys.executable, "-c", _OPEN_WINDOW],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,  # a blocked open would wait forever
    )
    assert done.returncode == 0, done.stderr
    assert "every setting is back to its default" in done.stdout
    assert "not a regular file" in done.stdout
    names = sorted(p.name for p in config.iterdir())
    assert any(n.startswith("window.ini.damaged-") for n in names)
    assert any(n.startswith("settings.json.damaged-") for n in names)


def test_about_names_every_family_from_the_registry(window, monkeypatch):
    from PySide6.QtWidgets import QMessageBox

    from app.core.families import FAMILIES

    shown: list[str] = []
    monkeypatch.setattr(QMessageBox, "about", lambda parent, title, text: shown.append(text))
    window._about()
    (text,) = shown
    assert "Stable Diffusion model" not in text
    assert all(family.title in text for family in FAMILIES)


def test_file_dialogs_open_where_the_users_files_are(window, monkeypatch, tmp_path):
    from PySide6.QtWidgets import QFileDialog

    from app.core.settings import load_settings, save_settings
    from app.ui import folders

    pictures, models = tmp_path / "pictures", tmp_path / "models"
    pictures.mkdir()
    models.mkdir()
    settings = load_settings().settings
    settings["output_folder"] = str(pictures)
    settings["model_folders"] = [str(tmp_path / "gone"), str(models)]
    save_settings(settings)
    assert (folders.pictures(), folders.models()) == (str(pictures), str(models))

    opened: list[str] = []
    monkeypatch.setattr(
        QFileDialog,
        "getOpenFileName",
        lambda parent, title, start, *a: opened.append(start) or ("", ""),
    )
    window.open_image()  # "Why is this image black?"
    window.models_view.open_file()
    assert opened == [str(pictures), str(models)]
    # Neither set nor there: home, never the folder HalfSafe was started from.
    settings["output_folder"], settings["model_folders"] = str(tmp_path / "gone"), []
    save_settings(settings)
    monkeypatch.setattr("platformdirs.user_pictures_dir", lambda: str(tmp_path / "no-pictures"))
    assert folders.pictures() == folders.models() == str(Path.home())


def test_a_long_status_message_ends_in_an_ellipsis_where_it_is_cut(window, engines):
    sentence = "Last image: inpainting 00002-354156698.png where the mask was painted, " * 3
    window.say(sentence)
    shown = window.message_status
    shown.resize(200, shown.height())
    assert shown.full_text() == sentence == shown.toolTip()
    assert shown.text().endswith("…") and len(shown.text()) < len(sentence)
    assert shown.fontMetrics().horizontalAdvance(shown.text()) <= shown.contentsRect().width()
    shown.resize(4000, shown.height())
    assert shown.text() == sentence
