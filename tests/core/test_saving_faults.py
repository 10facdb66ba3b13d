"""Generated images are never lost silently: a folder name no file system takes, and an output
folder and a rescue folder that both refuse the images (the `halfsafe generate` command, and the
engine's generate job that hands unsaved images to the window in memory)."""

from __future__ import annotations

import io
import os
import stat

import pytest
from PIL import Image

from app import cli
from app.core import paths
from app.core.images import finished as images
from app.core.images.finished import ImageSaveError

FAST = ["--steps", "2", "--width", "64", "--height", "64", "--seed", "7"]


def _blocked(tmp_path, name: str):
    """A path under a plain file: no folder can ever be created there."""
    blocker = tmp_path / f"{name}-is-a-file"
    blocker.write_text("a file where a folder should be")
    return blocker / name


def test_a_nul_byte_in_the_folder_name_is_a_sentence_not_a_crash(tmp_path):
    image = Image.new("RGB", (8, 8))
    with pytest.raises(ImageSaveError) as caught:
        images.save_png(image, str(tmp_path / "out\0put"), 7)
    message = str(caught.value)
    assert "NUL" in message and "\0" not in message and "\n" not in message


def test_cli_with_a_nul_byte_in_the_output_folder_rescues_the_images(tmp_path, capsys):
    status = cli.main(["generate", "demo", *FAST, "--out", str(tmp_path / "out\0put")])
    assert status == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and "\0" not in err
    rescue = paths.data_dir() / "unsaved"
    assert str(rescue) in err and "saved to" in err
    (saved,) = rescue.iterdir()
    with Image.open(saved) as picture:
        assert picture.size == (64, 64)


def test_cli_says_plainly_when_no_folder_took_the_images(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HALFSAFE_DATA_DIR", str(_blocked(tmp_path, "data")))
    status = cli.main(
        ["generate", "demo", *FAST, "--batch", "2", "--out", str(_blocked(tmp_path, "out"))]
    )
    assert status == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("halfsafe: ") and "Traceback" not in err
    assert "2 generated images were not saved" in err
    assert "kept" not in err  # the process ends: nothing is kept, and it must not say so


def _generate_job(tmp_path, output_dir: str):
    """The engine's generate handler, in-process, on the demo model."""
    from app.core.generation import GenerationRequest
    from app.core.jobs import CancelToken
    from app.core.models import load_model
    from app.core.requests.records import GenerateRequest
    from app.engine import jobs
    from app.engine.events import JobRequest
    from app.engine.server import JobContext, Session

    generation = GenerationRequest(
        "a boat", steps=2, width=64, height=64, seed=7, output_dir=output_dir
    )
    request = GenerateRequest(generation, device="cpu")
    session = Session(model=load_model("demo"))
    sent: list = []
    context = JobContext(JobRequest(1, request), session, sent.append, CancelToken())
    return jobs.generate(context, request)


def test_engine_hands_images_no_folder_took_to_the_window_in_memory(tmp_path, monkeypatch):
    monkeypatch.setenv("HALFSAFE_DATA_DIR", str(_blocked(tmp_path, "data")))
    result = _generate_job(tmp_path, str(_blocked(tmp_path, "out")))
    assert "1 generated image was not saved" in result.save_error
    (image,) = result.images
    assert image.path == "" and image.png is not None and image.image is None
    with Image.open(io.BytesIO(image.png)) as picture:
        assert picture.size == (64, 64)
        assert picture.info["parameters"].startswith("a boat")


def test_engine_result_names_the_rescue_folder_when_it_took_the_images(tmp_path):
    result = _generate_job(tmp_path, str(_blocked(tmp_path, "out")))
    rescue = paths.data_dir() / "unsaved"
    assert str(rescue) in result.save_error
    (image,) = result.images
    assert image.path.startswith(str(rescue)) and image.png is None


@pytest.mark.skipif(not hasattr(os, "umask") or os.name == "nt", reason="POSIX permissions")
@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_saved_images_get_the_users_usual_permissions(tmp_path, umask):
    previous = os.umask(umask)
    try:
        path = images.save_png(Image.new("RGB", (8, 8)), str(tmp_path), 7)
    finally:
        os.umask(previous)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o666 & ~umask
