"""Saved state under a full or read-only disk: the job still ends with its result (a check's
report, a generation's images), a save that cannot be made is one sentence, and nothing already
saved (remembered fixes, a damaged profiles.json) is moved or cut before its replacement is
safely written.

The faults are planted by replacing the write functions (tests may run as root, whom a chmod
does not stop): a full disk takes a new file but not its data (ENOSPC, at the latest when it is
fsynced); a read-only one takes no new file, rename or removal (EROFS).
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from app import cli
from app.core import files, paths
from app.core.fixing import profiles

TORCH = "2.test"
DEVICE = "Test CPU"
FIX = {"vae_precision": "fp32"}
NO_SPACE = os.strerror(errno.ENOSPC)
READ_ONLY = os.strerror(errno.EROFS)


def _inside(path: object, folder: Path) -> bool:
    try:
        return os.path.abspath(os.fspath(path)).startswith(str(folder) + os.sep)  # type: ignore[arg-type]
    except TypeError:  # a file descriptor
        return False


@contextlib.contextmanager
def full_disk(folder: Path) -> Iterator[None]:
    """Files written in `folder` fail as on a full disk: created, but their data is refused."""
    created: set[int] = set()
    real_mkstemp, real_fsync = tempfile.mkstemp, os.fsync

    def mkstemp(*args, **kwargs):
        fd, name = real_mkstemp(*args, **kwargs)
        if _inside(name, folder):
            created.add(fd)
        return fd, name

    def fsync(fd: int) -> None:
        if fd in created:
            created.discard(fd)
            raise OSError(errno.ENOSPC, NO_SPACE)
        real_fsync(fd)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tempfile, "mkstemp", mkstemp)
        patch.setattr(os, "fsync", fsync)
        yield


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[None]:
    """`folder` as on a read-only disk: files open for reading only; nothing is created, renamed
    or removed there."""

    def refused(path: object) -> OSError:
        return OSError(errno.EROFS, READ_ONLY, os.fspath(path))  # type: ignore[arg-type]

    real_open = os.open

    def open_(path, flags, *args, **kwargs):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT) and _inside(path, folder):
            raise refused(path)
        return real_open(path, flags, *args, **kwargs)

    def guard(real):
        def guarded(*names, **kwargs):
            for name in names:
                if _inside(name, folder):
                    raise refused(name)
            return real(*names, **kwargs)

        return guarded

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "open", open_)
        for name in ("replace", "rename", "link", "unlink", "mkdir", "rmdir", "chmod"):
            patch.setattr(os, name, guard(getattr(os, name)))
        yield


FAULTS = {"full disk": (full_disk, NO_SPACE), "read-only disk": (read_only, READ_ONLY)}


def _remember(key: str, warn=None) -> profiles.RememberedFix:
    return profiles.remember_fix(
        key, DEVICE, FIX, f"{key}: the VAE in fp32", "health check", TORCH, warn=warn
    )


def _usable() -> set[str]:
    return {s.profile_key for s in profiles.stored_fixes().fixes}


def _damaged_profiles() -> tuple[Path, bytes]:
    """profiles.json with two readable fixes and an entry cut short after them."""
    _remember("model-a")
    _remember("model-b")
    path = profiles._path()
    text = path.read_text()
    assert text.endswith("}\n}\n")
    path.write_text(text[: -len("}\n")] + ',\n  "model-c|Test CPU|torch 2.test": {\n')
    return path, path.read_bytes()


def _left_over(folder: Path) -> list[str]:
    """Files a failed write may have left beside profiles.json: temp files, copies kept aside."""
    return sorted(p.name for p in folder.iterdir() if ".tmp" in p.name or ".damaged-" in p.name)


@pytest.mark.parametrize("fault", FAULTS)
def test_a_fix_that_cannot_be_saved_is_one_sentence_and_the_saved_ones_are_kept(fault):
    plant, reason = FAULTS[fault]
    _remember("model-a")
    path = profiles._path()
    before = path.read_bytes()
    warned: list[str] = []
    with plant(paths.data_dir()):
        fix = _remember("model-new", warn=warned.append)
        with pytest.raises(OSError):  # the Fixes page says "Not saved: ..."
            profiles.forget_fix("model-a", DEVICE, TORCH)
    assert fix.settings == FIX
    [sentence] = warned
    assert sentence.startswith("The fix was not remembered for the next job: ")
    assert f"{path} could not be written ({reason})" in sentence
    assert sentence.count(". ") == 0 and "\n" not in sentence
    assert path.read_bytes() == before and _left_over(path.parent) == []
    assert _usable() == {"model-a"}


@pytest.mark.parametrize("fault", FAULTS)
def test_a_damaged_profiles_file_is_kept_in_place_until_its_repair_is_written(fault):
    plant, reason = FAULTS[fault]
    path, before = _damaged_profiles()
    warned: list[str] = []
    with plant(paths.data_dir()):
        found = profiles.lookup("model-a", DEVICE, TORCH)
        _remember("model-new", warn=warned.append)
        [stored] = profiles.stored_fixes().fixes[:1]
        with pytest.raises(OSError):  # not "forgotten meanwhile": the file is still there
            profiles.change_fix(stored, {"vae_precision": "bf16"}, "edited")
    # Both readable fixes are used, and the file is as it was: nothing moved, cut or left over.
    assert found.fix is not None and found.fix.settings == FIX
    [note] = found.notes
    assert note.startswith(f"{path} is damaged (")
    assert "the 2 remembered fixes that could be read are used" in note
    assert note.endswith(f"could not be written in its place ({reason}).")
    assert [f"{path} could not be written ({reason})" in w for w in warned] == [True]
    assert path.read_bytes() == before and _left_over(path.parent) == []
    assert _usable() == {"model-a", "model-b"}  # this read repairs it: the disk has room again
    [aside] = [p for p in path.parent.iterdir() if ".damaged-" in p.name]
    assert aside.read_bytes() == before
    assert profiles.lookup("model-a", DEVICE, TORCH).notes == []


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_a_replacement_that_cannot_be_renamed_into_place_leaves_the_old_one(tmp_path, kind):
    path = tmp_path / "profiles.json"
    if kind == "file":
        path.write_text("the old file")
    else:
        path.mkdir()
        (path / "inside").write_text("kept")
    real_replace = os.replace

    def replace(source, target):
        if Path(target) == path and ".tmp" in os.fspath(source):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_replace(source, target)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "replace", replace)
        with pytest.raises(OSError):
            files.replace_keeping_aside(path, "the new file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["profiles.json"]
    if kind == "file":
        assert path.read_text() == "the old file"
    else:
        assert (path / "inside").read_text() == "kept"
    assert files.replace_keeping_aside(path, "the new file") is not None
    assert path.read_text() == "the new file"


def test_check_on_a_read_only_data_folder_prints_its_report(capsys):
    with read_only(paths.data_dir()):
        status = cli.main(["check", "demo-overflow", "--precision", "fp16", "--size", "64"])
    out, err = capsys.readouterr()
    assert status == 1  # fixable: the check ran and found the overflow
    assert "Traceback" not in out + err and "profiles.json.lock" not in out + err
    assert "Apply:" in out
    [note] = [line for line in out.splitlines() if "not remembered" in line]
    assert f"{profiles._path()} could not be written ({READ_ONLY})" in note
    assert not profiles._path().exists()


def test_generate_repairing_on_a_full_data_disk_saves_its_images(tmp_path, capsys):
    out_folder = tmp_path / "out"
    with full_disk(paths.data_dir()):
        status = cli.main(
            [
                "generate",
                "demo-overflow",
                "--precision",
                "fp16",
                "--steps",
                "2",
                "--width",
                "64",
                "--height",
                "64",
                "--out",
                str(out_folder),
            ]
        )
    out, err = capsys.readouterr()
    assert status == 0 and "Traceback" not in out + err
    assert "fixed" in out
    [saved] = out_folder.iterdir()
    assert saved.suffix == ".png"
    [warning] = [line for line in out.splitlines() if "not remembered" in line]
    assert warning.startswith("Warning:  The fix was not remembered")
    assert f"({NO_SPACE})" in warning
    assert not profiles._path().exists()


def test_the_engine_says_a_fix_it_cannot_remember_as_a_warning():
    from app.core.jobs import CancelToken
    from app.core.models import load_model
    from app.core.requests.records import RememberFixRequest
    from app.engine import jobs
    from app.engine.events import EventState, JobRequest
    from app.engine.server import JobContext, Session

    session = Session(model=load_model("demo"))
    sent: list = []
    request = RememberFixRequest(FIX, "the VAE in fp32", "health check")
    context = JobContext(JobRequest(1, request), session, sent.append, CancelToken())
    with read_only(paths.data_dir()):
        summary = jobs.remember_fix(context, request)
    assert summary.remembered_fix is None
    [warning] = [e.message for e in sent if e.state is EventState.WARNING]
    assert "not remembered" in warning and READ_ONLY in warning
