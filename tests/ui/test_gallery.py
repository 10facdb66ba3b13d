"""The gallery lasts: the output folder's images after a restart, newest first, thumbnails made
lazily and cached, and the context menu (view, open, open folder, copy and reuse the parameters,
the diagnosis, move to the trash)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from PySide6.QtGui import QGuiApplication

from app.core.words.infotext import join_text
from app.ui import dialogs as dialogs_module
from app.ui.gallery import ENTRY, REQUESTED, thumbnail_cache_path
from tests.support import reports
from tests.support.gallery_outputs import NAN_PARAMETERS, NoFileManager, fill, write_png
from tests.ui.conftest import load_fake_model

LIGHTHOUSE_PARAMETERS = join_text(
    "a lighthouse on a cliff at dusk, oil painting <lora:ink:0.8>",
    "",
    [("Steps", 20), ("Sampler", "Euler a"), ("CFG scale", "7"), ("Seed", 2), ("Size", "64x48")],
)


@pytest.fixture
def outputs(tmp_path):
    folder = tmp_path / "outputs"
    write_png(folder, "00001-1.png", age_s=300)
    write_png(folder, "00003-4242.png", age_s=10, parameters=NAN_PARAMETERS)
    write_png(folder, "00002-2.png", age_s=100)
    (folder / "notes.txt").write_text("not an image")
    return folder


def test_after_a_restart_the_output_folder_is_shown_newest_first(window, engines, qtbot, outputs):
    window.state.apply({"output_folder": str(outputs)})
    window.generate_view.gallery.clear()  # a fresh start: nothing from this session
    window.start_background()
    gallery = window.generate_view.gallery
    qtbot.waitUntil(lambda: gallery.count() == 3, timeout=5000)
    names = [Path(gallery.item(i).data(ENTRY).path).name for i in range(3)]
    assert names == ["00003-4242.png", "00002-2.png", "00001-1.png"]
    # Thumbnails are made on the worker and cached on disk for the next start.
    window.generate_view.gallery_view.worker.wait_idle()
    qtbot.waitUntil(
        lambda: all(
            thumbnail_cache_path(str(outputs / n), *_stamp(outputs / n)).is_file() for n in names
        ),
        timeout=5000,
    )


def _stamp(path: Path) -> tuple[int, int]:
    info = path.stat()
    return info.st_mtime_ns, info.st_size


def test_an_image_copied_over_another_with_its_mtime_restored_gets_its_own_thumbnail(tmp_path):
    image = tmp_path / "00001-1.png"
    image.write_bytes(b"first image " * 10)
    before = image.stat()
    cached = thumbnail_cache_path(str(image), *_stamp(image))
    image.write_bytes(b"other image " * 10)  # same size, same inode
    os.utime(image, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert _stamp(image) == (before.st_mtime_ns, before.st_size)
    assert thumbnail_cache_path(str(image), *_stamp(image)) != cached


def test_thumbnails_are_made_only_for_what_is_in_view(window, engines, qtbot, tmp_path):
    folder = tmp_path / "many"
    for index in range(60):
        write_png(folder, f"{index:05d}-{index}.png", age_s=index)
    window.show_page("Generate")
    fill(window, qtbot, folder, 60)
    gallery = window.generate_view.gallery
    requested = sum(1 for i in range(60) if gallery.item(i).data(REQUESTED))
    assert 0 < requested < 30
    gallery.scrollToItem(gallery.item(59))
    qtbot.waitUntil(lambda: bool(gallery.item(59).data(REQUESTED)), timeout=3000)


def test_the_diagnosis_and_parameters_come_from_the_png(window, engines, qtbot, outputs):
    window.show_page("Generate")
    fill(window, qtbot, outputs, 3)
    view = window.generate_view
    item = view.gallery.item(0)
    menu = view.gallery_view.menu_for(item)
    actions = {a.text(): a for a in menu.actions() if a.text()}
    assert list(actions) == [
        "View",
        "Open",
        "Open folder",
        "Copy parameters",
        "Send parameters to Generate",
        "Show the diagnosis",
        "Move to trash",
    ]
    actions["Show the diagnosis"].trigger()
    assert view.banner.isVisible() and view.banner.level == "bad"
    assert "NaN in the VAE" in view.banner.text.text() and "step 8" in view.banner.text.text()
    assert "a red circle on a blue background" in view.parameters.text()

    actions["Copy parameters"].trigger()
    assert QGuiApplication.clipboard().text() == NAN_PARAMETERS

    view.prompt.setPlainText("something else")
    actions["Send parameters to Generate"].trigger()
    request = view.request()
    assert request["prompt"] == "a red circle on a blue background"
    assert request["negative_prompt"] == "blurry"
    assert (request["steps"], request["cfg"], request["seed"]) == (12, 6.5, 4242)
    assert (request["width"], request["height"]) == (128, 96)
    assert request["scheduler"] == "dpmpp_2m_karras"


def test_move_to_trash_takes_the_image_out_and_keeps_it_in_the_trash(
    window, engines, qtbot, outputs, tmp_path, monkeypatch
):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    fill(window, qtbot, outputs, 3)
    view = window.generate_view
    item = view.gallery.item(1)
    path = Path(item.data(ENTRY).path)
    assert view.gallery_view.move_to_trash(item)
    assert not path.exists()
    assert view.gallery.count() == 2
    trashed = list((tmp_path / "xdg").rglob(path.name))
    assert trashed, "the image should be in the trash, restorable"


def test_open_without_a_file_manager_shows_and_copies_the_path(
    window, engines, qtbot, outputs, monkeypatch
):
    monkeypatch.setattr(dialogs_module, "QDesktopServices", NoFileManager)
    fill(window, qtbot, outputs, 3)
    view = window.generate_view
    view.gallery_view.open_folder(view.gallery.item(0))
    shown = window.dialogs.shown[-1].message
    assert str(outputs) in shown and "No program" in shown
    assert QGuiApplication.clipboard().text() == str(outputs)
    window.dialogs.close_all()


def test_a_damaged_png_in_the_folder_is_listed_without_harm(window, engines, qtbot, outputs):
    (outputs / "00004-9.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 40)
    window.show_page("Generate")
    fill(window, qtbot, outputs, 4)
    view = window.generate_view
    view.gallery_view.worker.wait_idle()
    damaged = next(
        view.gallery.item(i)
        for i in range(4)
        if view.gallery.item(i).data(ENTRY).path.endswith("00004-9.png")
    )
    view.gallery.setCurrentItem(damaged)
    assert view.current_entry.path.endswith("00004-9.png")
    # One sentence names the file and what is wrong with it, in the caption.
    assert f"{outputs / '00004-9.png'}: " in view.parameters.text()
    assert "Copy parameters" in [a.text() for a in view.gallery_view.menu_for(damaged).actions()]
    assert window.dialogs.shown == []


def _labels(gallery) -> list[str]:
    return [gallery.item(i).text() for i in range(gallery.count())]


@pytest.mark.parametrize("first", ["the folder's listing", "the job's result"])
def test_after_a_restart_each_image_is_shown_once_labelled_by_what_it_shows(
    window, engines, qtbot, tmp_path, first
):
    folder = tmp_path / "outputs"
    write_png(folder, "00001-2.png", age_s=100, parameters=LIGHTHOUSE_PARAMETERS)
    newest = write_png(folder, "00002-4242.png", age_s=10, parameters=NAN_PARAMETERS)
    window.state.apply({"output_folder": str(folder)})
    load_fake_model(window, engines)
    window.show_page("Generate")
    view = window.generate_view
    gallery = view.gallery
    gallery.clear()  # a fresh start: nothing from this session

    def job_result() -> None:
        # A job saved the newest image; its result reaches the window before or after the listing.
        view.generate()
        image = reports.image(str(newest), status="nan", seed=4242, parameters=NAN_PARAMETERS)
        result = reports.generation({"images": [image]})
        engines.current.finish(engines.current.last_job("generate"), result)

    if first == "the job's result":
        job_result()
    # A restart lists the folder from the window's start and from the page's first visit.
    window.start_background()
    view.gallery_view.refresh()
    qtbot.waitUntil(lambda: gallery.count() == 2 and all(_labels(gallery)), timeout=5000)
    if first == "the folder's listing":
        job_result()

    assert gallery.count() == 2
    assert [gallery.item(i).data(ENTRY).path for i in range(2)] == [
        str(newest),
        str(folder / "00001-2.png"),
    ]
    # Each image is labelled by its prompt's start and its seed (or what went wrong), read from
    # its own record; its file's name is in the tooltip, not on the label.
    assert _labels(gallery) == [
        "a red circle on a…\nNaN-black",
        "a lighthouse on a…\nseed 2",
    ]
    for index, name in enumerate(["00002-4242.png", "00001-2.png"]):
        assert name in gallery.item(index).toolTip()
    assert gallery.currentRow() == 0
