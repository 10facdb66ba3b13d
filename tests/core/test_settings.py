"""The settings schema and its file: every field described, round-trips, recovers from damage."""

from __future__ import annotations

import json
from dataclasses import fields

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
        assert getattr(s.PrecisionSettings(), name) == s.FIELDS[name].default
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
    assert any("Restored" in w for w in loaded.warnings)
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
