"""The settings schema and its file: every field described, round-trips, recovers from damage."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time
from dataclasses import fields
from pathlib import Path

import pytest

from app.core import settings as s


def test_every_field_is_described_and_its_default_is_valid():
    for f in s.SCHEMA:
        assert f.label.strip(), f.key
        assert len(f.help) > 20, f.key
        assert f.group in s.GROUPS, f.key
        assert f.validate(f.default) == f.default, f.key
        if f.kind == "choice":
            assert f.default in f.choices


def test_precision_dataclass_mirrors_the_schema():
    names = {f.name for f in fields(s.PrecisionSettings)}
    assert names == set(s.PRECISION_KEYS)
    assert names <= set(s.FIELDS)
    for name in names:
        assert s.PrecisionSettings().to_dict()[name] == s.FIELDS[name].default
    # Every precision flag the CLI contract names is a schema field with a CLI flag.
    for key in (
        "precision",
        "unet_precision",
        "vae_precision",
        "text_encoder_precision",
        "no_half",
        "no_half_vae",
        "upcast_attention",
        "attention_backend",
        "allow_tf32",
        "fp16_reduced_precision_reduction",
        "fp16_accumulation",
    ):
        assert s.FIELDS[key].cli, key


def _non_default(f: s.Field):
    if f.kind == "bool":
        return not f.default
    if f.kind == "choice":
        return next(c for c in f.choices if c != f.default)
    if f.kind == "int":
        return int(f.minimum if f.default != f.minimum else f.default + (f.step or 1))
    if f.kind == "float":
        return float(f.maximum)
    if f.kind == "device":
        return "cuda:1"
    if f.kind == "paths":
        return ["/models/a", "/models/b"]
    if f.kind == "modules":
        return ["vae:decoder.conv_in", "unet:mid_block.resnets.0.conv1"]
    return "something else"


@pytest.mark.parametrize("field", s.SCHEMA, ids=lambda f: f.key)
def test_each_field_round_trips_through_the_file(tmp_path, field):
    path = tmp_path / "settings.json"
    settings = s.Settings()
    settings[field.key] = _non_default(field)
    s.save_settings(settings, path)
    loaded = s.load_settings(path)
    assert loaded.warnings == []
    assert loaded.settings[field.key] == settings[field.key]
    assert loaded.settings.to_dict() == settings.to_dict()


def test_file_is_human_readable_and_versioned(tmp_path):
    path = s.save_settings(s.Settings(), tmp_path / "settings.json")
    document = json.loads(path.read_text())
    assert document["schema_version"] == s.SCHEMA_VERSION
    assert document["settings"]["no_half_vae"] is False
    assert "\n  " in path.read_text()  # indented, one field per line


def _saved(tmp_path, **changes):
    settings = s.Settings()
    for key, value in changes.items():
        settings[key] = value
    return s.save_settings(settings, tmp_path / "settings.json")


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        ({"steps": "many"}, "steps"),  # wrong type
        ({"steps": 10_000}, "maximum"),  # out of range
        ({"width": 513}, "multiple of 8"),  # off the grid
        ({"precision": "fp8"}, "one of"),  # not a choice
        ({"no_half": 1}, "true or false"),  # a number is not a bool
        ({"device": "gpu0"}, "cuda:N"),  # not a device
        ({"no_such_setting": True}, "unknown"),  # unknown key
    ],
)
def test_a_damaged_field_falls_back_alone_and_the_file_is_kept_aside(tmp_path, damage, words):
    path = _saved(tmp_path, cfg=9.5, no_half_vae=True)
    document = json.loads(path.read_text())
    document["settings"].update(damage)
    path.write_text(json.dumps(document))

    loaded = s.load_settings(path)
    assert len(loaded.warnings) == 1
    assert words in loaded.warnings[0] and str(path) in loaded.warnings[0]
    assert loaded.settings["cfg"] == 9.5  # the other fields survive
    assert loaded.settings["no_half_vae"] is True
    for key in damage:
        if key in s.FIELDS:
            assert loaded.settings[key] == s.FIELDS[key].default
    assert loaded.kept_aside is not None and loaded.kept_aside.read_text() == path.read_text()


def test_half_written_file_falls_back_to_the_backup(tmp_path):
    path = _saved(tmp_path, steps=40)
    _saved(tmp_path, steps=41)  # the first save is now the .bak
    path.write_text(path.read_text()[:25])  # a crash mid-write
    loaded = s.load_settings(path)
    assert loaded.settings["steps"] == 40
    assert any("not valid JSON" in w for w in loaded.warnings)
    assert any("restored the settings from" in w for w in loaded.warnings)
    assert loaded.summary == s.RESTORED_BACKUP
    assert loaded.kept_aside is not None


@pytest.mark.parametrize("content", [b"", b"\xff\xfe\x00garbage", b"[1, 2, 3]", b"null"])
def test_corrupt_file_without_backup_gives_defaults_and_keeps_the_file(tmp_path, content):
    path = tmp_path / "settings.json"
    path.write_bytes(content)
    loaded = s.load_settings(path)
    assert loaded.settings.to_dict() == s.defaults()
    assert len(loaded.warnings) == 1 and str(path) in loaded.warnings[0]
    assert loaded.kept_aside is not None and loaded.kept_aside.read_bytes() == content


def test_missing_file_is_silent_defaults(tmp_path):
    loaded = s.load_settings(tmp_path / "settings.json")
    assert loaded.warnings == [] and loaded.settings.to_dict() == s.defaults()


def test_a_failed_save_leaves_the_old_file_intact(tmp_path, monkeypatch):
    path = _saved(tmp_path, steps=33)
    before = path.read_text()

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("app.core.files.os.replace", crash)
    settings = s.Settings()
    settings["steps"] = 99
    with pytest.raises(OSError):
        s.save_settings(settings, path)
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".tmp"] == []


def test_config_dir_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("HALFSAFE_CONFIG_DIR", str(tmp_path / "elsewhere"))
    assert s.settings_path() == tmp_path / "elsewhere" / "settings.json"


def test_setting_a_bad_value_in_code_is_refused():
    settings = s.Settings()
    with pytest.raises(ValueError):
        settings["steps"] = 0
    with pytest.raises(KeyError):
        settings["nope"] = 1


# Hostile settings files: each costs only the damaged field, or the file, never the start ------


def _write_raw_steps(tmp_path, raw_steps: str):
    """A saved file whose 'steps' value is the raw JSON text `raw_steps` (json.dumps cannot
    write most of these)."""
    path = _saved(tmp_path, cfg=9.5, no_half_vae=True)
    text = path.read_text()
    path.write_text(text.replace('"steps": 25', f'"steps": {raw_steps}'))
    assert raw_steps in path.read_text()
    return path


@pytest.mark.parametrize(
    ("raw_steps", "words"),
    [
        ("Infinity", "finite"),
        ("-Infinity", "finite"),
        ("NaN", "finite"),
        ("1e400", "finite"),
        ("9" * 5000, "5000 digits"),
        ("-" + "9" * 5000, "5000 digits"),
        ("1" + "0" * 300, "301 digits"),
        ("[" * 500 + "]" * 500, "expected a number"),
        ("30.5", "whole number"),
    ],
    ids=["inf", "-inf", "nan", "1e400", "5000-digit", "-5000-digit", "301-digit", "nested", "30.5"],
)
def test_a_hostile_number_costs_only_its_field(tmp_path, raw_steps, words):
    path = _write_raw_steps(tmp_path, raw_steps)
    started = time.monotonic()
    loaded = s.load_settings(path)
    assert time.monotonic() - started < 2
    assert loaded.settings["steps"] == s.FIELDS["steps"].default
    assert loaded.settings["cfg"] == 9.5 and loaded.settings["no_half_vae"] is True
    assert len(loaded.warnings) == 1
    warning = loaded.warnings[0]
    assert words in warning and "'steps'" in warning and str(path) in warning
    assert "\n" not in warning and len(warning) < len(str(path)) + 200
    assert loaded.summary == s.FIELDS_RESET
    assert loaded.kept_aside is not None and loaded.kept_aside.read_text() == path.read_text()


def test_a_huge_number_set_in_code_is_refused_in_a_short_sentence():
    settings = s.Settings()
    for value in (10**5000, -(10**5000), float("inf"), float("nan")):
        with pytest.raises(ValueError) as error:
            settings["seed"] = value
        assert len(str(error.value)) < 80
    assert settings["seed"] == s.FIELDS["seed"].default


def test_a_nul_byte_in_a_folder_setting_is_refused():
    settings = s.Settings()
    with pytest.raises(ValueError, match="NUL"):
        settings["output_folder"] = "/tmp/out\0put"
    with pytest.raises(ValueError, match="NUL"):
        settings["model_folders"] = ["/models", "/mo\0dels"]


def test_thousands_of_unknown_keys_are_one_warning(tmp_path):
    path = tmp_path / "settings.json"
    junk = {f"key{i}": i for i in range(5000)}
    path.write_text(json.dumps({"schema_version": 1, "settings": {**junk, "steps": 40}}))
    loaded = s.load_settings(path)
    assert loaded.settings["steps"] == 40
    assert len(loaded.warnings) == 1 and "4995 more" in loaded.warnings[0]


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_deeply_nested_file_falls_back_to_the_backup(tmp_path):
    path = _saved(tmp_path, steps=40)
    _saved(tmp_path, steps=41)
    path.write_text(_nested(200_000))
    loaded = s.load_settings(path)
    assert loaded.settings["steps"] == 40
    assert any("nested too deeply" in w for w in loaded.warnings)
    assert loaded.summary == s.RESTORED_BACKUP


def test_deeply_nested_backup_beside_a_truncated_file_resets_and_says_so(tmp_path):
    path = _saved(tmp_path, steps=40)
    path.write_text(path.read_text()[:30])
    path.with_name("settings.json.bak").write_text(_nested(200_000))
    loaded = s.load_settings(path)
    assert loaded.settings.to_dict() == s.defaults()
    assert loaded.summary == s.ALL_RESET
    assert "every setting is back to its default" in loaded.summary
    assert "everything else was kept" not in loaded.summary
    assert len(loaded.warnings) == 1 and "no usable backup" in loaded.warnings[0]
    assert loaded.kept_aside is not None and loaded.kept_aside.read_text() == path.read_text()


def test_truncated_file_without_backup_does_not_claim_anything_was_kept(tmp_path):
    path = _saved(tmp_path, steps=40, cfg=9.5)
    path.write_text(path.read_text()[:40])
    loaded = s.load_settings(path)
    assert loaded.settings.to_dict() == s.defaults()
    assert loaded.summary == s.ALL_RESET


def test_a_folder_where_the_file_should_be_is_moved_aside_and_saving_works(tmp_path):
    path = tmp_path / "settings.json"
    path.mkdir()
    (path / "inside.txt").write_text("the user's")
    loaded = s.load_settings(path)
    assert loaded.settings.to_dict() == s.defaults()
    assert "folder" in loaded.warnings[0] and str(path) in loaded.warnings[0]
    assert loaded.kept_aside is not None
    assert (loaded.kept_aside / "inside.txt").read_text() == "the user's"
    settings = s.Settings()
    settings["steps"] = 42
    s.save_settings(settings, path)
    assert s.load_settings(path).settings["steps"] == 42


def _in_thread(function, timeout: float):
    """Run `function` in a daemon thread; its result, or a failure if it is still blocked."""
    outcome: list = []
    thread = threading.Thread(target=lambda: outcome.append(function()), daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"still blocked after {timeout} s"
    return outcome[0]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are a POSIX thing")
@pytest.mark.parametrize("where", ["file", "backup"])
def test_a_fifo_never_blocks_the_start(tmp_path, where):
    path = _saved(tmp_path, steps=40)
    if where == "file":
        path.unlink()
        os.mkfifo(path)
    else:
        path.write_text("{")
        os.mkfifo(path.with_name("settings.json.bak"))
    loaded = _in_thread(lambda: s.load_settings(path), timeout=5)
    assert loaded.settings.to_dict() == s.defaults()
    assert loaded.summary == s.ALL_RESET
    if where == "file":
        assert "not a regular file" in loaded.warnings[0]
        assert loaded.kept_aside is not None and stat.S_ISFIFO(loaded.kept_aside.lstat().st_mode)
        _in_thread(lambda: s.save_settings(s.Settings(), path), timeout=5)
        assert path.is_file()


def test_a_config_folder_that_is_a_file_costs_the_defaults_not_the_start(tmp_path, monkeypatch):
    blocker = tmp_path / "config"
    blocker.write_text("not a folder")
    monkeypatch.setenv("HALFSAFE_CONFIG_DIR", str(blocker))
    loaded = s.load_settings()  # paths.config_dir() no longer raises
    assert loaded.settings.to_dict() == s.defaults()
    assert loaded.summary == s.FOLDER_UNUSABLE
    assert str(blocker) in loaded.warnings[0] and "is a file" in loaded.warnings[0]
    with pytest.raises(OSError) as error:
        s.save_settings(s.Settings())
    assert "is a file" in (error.value.strerror or "")
    assert blocker.read_text() == "not a folder"


def test_update_keeps_what_another_process_saved_meanwhile(tmp_path):
    path = tmp_path / "settings.json"
    mine = s.load_settings(path).settings  # this process's copy: defaults
    theirs = s.Settings()
    theirs["steps"] = 60
    s.save_settings(theirs, path)  # another process changes steps
    merged = s.update_settings({"cfg": 11.0}, path, base=mine)
    assert merged["steps"] == 60 and merged["cfg"] == 11.0
    assert s.load_settings(path).settings.to_dict() == merged.to_dict()
    with pytest.raises(ValueError):
        s.update_settings({"steps": 0}, path)
    assert s.load_settings(path).settings["steps"] == 60


_WRITER = """
import sys
from pathlib import Path
from app.core import settings as s
key, rounds, path = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
for value in range(1, rounds + 1):
    s.update_settings({key: value if key != "cfg" else float(value)}, path)
"""

_BACKUP_READER = """
import json, sys, time
from pathlib import Path
backup, done = Path(sys.argv[1]), Path(sys.argv[2])
reads = 0
while not done.exists():
    try:
        text = backup.read_text()
    except FileNotFoundError:
        continue
    json.loads(text)  # a half-copied backup fails here and the process exits non-zero
    reads += 1
print(reads)
"""


def test_processes_saving_at_once_lose_nothing_and_the_backup_is_always_whole(tmp_path):
    path = tmp_path / "settings.json"
    s.save_settings(s.Settings(), path)
    rounds = 15
    done = tmp_path / "done"
    keys = ("steps", "batch", "cfg", "seed")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    reader = subprocess.Popen(
        [sys.executable, "-c", _BACKUP_READER, str(path) + ".bak", str(done)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, key, str(rounds), str(path)],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for key in keys
    ]
    try:
        for writer in writers:
            _, errors = writer.communicate(timeout=120)
            assert writer.returncode == 0, errors
        done.touch()
        reads, reader_errors = reader.communicate(timeout=10)
    finally:
        for process in (*writers, reader):
            process.kill()
    assert reader.returncode == 0, reader_errors  # never read a half-written backup
    assert int(reads) > 0
    loaded = s.load_settings(path)
    assert loaded.warnings == []
    # Every writer's last change is there: none overwrote another's with a stale copy.
    assert [loaded.settings[key] for key in keys] == [rounds, rounds, float(rounds), rounds]
    backup = json.loads((tmp_path / "settings.json.bak").read_text())
    assert backup["schema_version"] == s.SCHEMA_VERSION


def test_an_oversized_file_is_not_read_into_memory(tmp_path):
    path = _saved(tmp_path, steps=40)
    _saved(tmp_path, steps=41)
    with path.open("a") as handle:
        handle.write(" " * (s.MAX_SETTINGS_BYTES + 1))
    loaded = s.load_settings(path)
    assert loaded.settings["steps"] == 40  # from the .bak
    assert "larger than" in loaded.warnings[0]
