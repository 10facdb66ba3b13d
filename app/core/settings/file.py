"""The settings file: loading forgiving field by field (a damaged file kept aside, each problem
one line, a summary of what it cost), saving atomically with a `.bak` under a lock, and
updating without losing another process's changes.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.core import paths
from app.core.files import (
    aside_name,
    clear_non_regular,
    is_regular_file,
    locked,
    read_regular_file,
    write_atomic,
)
from app.core.settings.schema import FIELDS
from app.core.settings.validation import Field, _parse_int, shown
from app.core.settings.values import Settings

SCHEMA_VERSION = 1
SETTINGS_FILE = "settings.json"


@dataclass
class LoadResult:
    """Settings as loaded, plus one plain line for each thing that was wrong with the file.

    `summary` is one sentence saying what the damage cost (a few fields, the latest change, or
    everything), for the headline above the `warnings`; empty when nothing was wrong.
    """

    settings: Settings
    warnings: list[str] = field(default_factory=list)
    kept_aside: Path | None = None
    summary: str = ""


# Words for LoadResult.summary: what the user lost, said plainly.
FIELDS_RESET = (
    "Some saved settings could not be read and were reset to their defaults; everything else "
    "was kept."
)
RESTORED_BACKUP = (
    "The settings file could not be read, so the copy from the save before it was restored; "
    "the latest change may be missing."
)
ALL_RESET = (
    "The settings file could not be read and there was no usable backup copy, so every "
    "setting is back to its default."
)
FOLDER_UNUSABLE = "The settings folder cannot be used, so the defaults apply for this session."

# A settings file is a few kB; anything past this is not ours.
MAX_SETTINGS_BYTES = 1024 * 1024
# A field list longer than this in one warning helps nobody.
_NAMES_SHOWN = 5


def settings_path() -> Path:
    return paths.config_dir() / SETTINGS_FILE


def load_settings(path: Path | None = None) -> LoadResult:
    """Read the settings file, recovering field by field from any damage.

    A missing file gives the defaults silently. An unreadable or non-JSON file (or a folder, a
    FIFO: only a regular file is opened) falls back to the `.bak` left by the last save, else to
    the defaults. An unknown key is dropped; a value of the wrong type or out of range (inf,
    NaN, a number of thousands of digits) falls back to that field's default. Whenever anything
    was wrong, the damaged file is kept aside (`settings.json.damaged-<time>`; a folder or FIFO
    is moved there so the next save can write the file), each problem is one line in
    `warnings`, and `summary` says what it cost. Never raises for a bad file or folder.
    """
    path = path or settings_path()
    folder_problem = _folder_problem(path.parent)
    if folder_problem:
        return LoadResult(Settings(), [folder_problem], None, FOLDER_UNUSABLE)
    if not os.path.lexists(path):
        return LoadResult(Settings())

    warnings: list[str] = []
    summary = FIELDS_RESET
    raw, problem = _read_json_object(path)
    if raw is None:
        backup = path.with_name(path.name + ".bak")
        raw, _ = _read_json_object(backup) if os.path.lexists(backup) else (None, None)
        if raw is not None:
            warnings.append(f"{path}: {problem}; restored the settings from {backup}.")
            summary = RESTORED_BACKUP
        else:
            warnings.append(f"{path}: {problem}; no usable backup, so the defaults apply.")
            summary = ALL_RESET
            raw = {}

    settings, field_warnings = _settings_from(raw, path)
    warnings += field_warnings
    if not warnings:
        return LoadResult(settings)
    return LoadResult(settings, warnings, _keep_aside(path), summary)


def _settings_from(raw: dict[str, Any], path: Path) -> tuple[Settings, list[str]]:
    """The fields of a parsed settings document, each validated alone, and what was wrong."""
    warnings: list[str] = []
    version = raw.get("schema_version", SCHEMA_VERSION)
    stored = raw.get("settings", {})
    if not isinstance(stored, dict):
        warnings.append(f"{path}: 'settings' is not an object; using the defaults.")
        stored = {}
    if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
        warnings.append(
            f"{path} was written by a newer HalfSafe (schema {shown(version)}); "
            "reading the fields this version knows."
        )
    settings = Settings()
    unknown = [key for key in stored if key not in FIELDS]
    if unknown:
        names = ", ".join(f"'{shown(key)[1:-1]}'" for key in unknown[:_NAMES_SHOWN])
        more = f" and {len(unknown) - _NAMES_SHOWN} more" if len(unknown) > _NAMES_SHOWN else ""
        noun = "setting" if len(unknown) == 1 else "settings"
        warnings.append(f"{path}: ignored unknown {noun} {names}{more}.")
    for key, value in stored.items():
        if key not in FIELDS:
            continue
        try:
            settings[key] = value
        except ValueError as error:
            warnings.append(f"{path}: setting '{key}': {error}; using the default.")
    return settings, warnings


def save_settings(settings: Settings, path: Path | None = None) -> Path:
    """Write every field of `settings` atomically: temp file, fsync, keep the old file as
    `.bak` (itself written atomically), rename; under the settings lock, so that saves from
    two processes never interleave.

    A crash at any point leaves either the old file or the new one in place, never half of one.
    Raises OSError (with a plain `strerror`) when the file cannot be written.
    """
    path = path or settings_path()
    with _settings_lock(path):
        return _write(settings, path)


def update_settings(
    changes: Mapping[str, Any], path: Path | None = None, *, base: Settings | None = None
) -> Settings:
    """Save `changes` without losing what another process saved meanwhile, and return the
    settings now in the file.

    Under the settings lock: read the file as it is now, lay `changes` over it, write it. A
    field the file lacks or holds damaged comes from `base` (the caller's copy; else the
    default). Validates `changes` first (ValueError, nothing written); OSError if the file
    cannot be written.
    """
    path = path or settings_path()
    checked = {key: _field(key).validate(value) for key, value in changes.items()}
    with _settings_lock(path):
        merged = Settings(dict((base or Settings()).values))
        if os.path.lexists(path):
            raw, _ = _read_json_object(path)
            stored = (raw or {}).get("settings")
            for key, value in (stored if isinstance(stored, dict) else {}).items():
                with contextlib.suppress(KeyError, ValueError):
                    merged[key] = value
        for key, value in checked.items():
            merged[key] = value
        _write(merged, path)
    return merged


def _field(key: str) -> Field:
    if key not in FIELDS:
        raise ValueError(f"unknown setting {key!r}")
    return FIELDS[key]


def _settings_lock(path: Path) -> contextlib.AbstractContextManager[None]:
    problem = _folder_problem(path.parent)
    if problem:
        raise NotADirectoryError(errno.ENOTDIR, problem)
    return locked(path)


def _write(settings: Settings, path: Path) -> Path:
    document = {"schema_version": SCHEMA_VERSION, "settings": settings.to_dict()}
    # Only a readable file is worth keeping as the backup: never replace a good .bak with junk.
    keep = _read_json_object(path)[0] is not None if os.path.lexists(path) else False
    return write_atomic(
        path, json.dumps(document, indent=2, sort_keys=True) + "\n", keep_backup=keep
    )


def _folder_problem(folder: Path) -> str | None:
    """One sentence when the settings folder is a file (or cannot be looked at), else None."""
    try:
        if not folder.exists() or folder.is_dir():
            return None
    except OSError as error:
        return f"The settings folder {folder} cannot be used ({error.strerror or error})."
    return (
        f"{folder} should be HalfSafe's settings folder but it is a file; changes cannot be "
        "saved until it is moved or HALFSAFE_CONFIG_DIR names a folder."
    )


def _read_json_object(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """The JSON object in `path`, or None and a phrase saying what is wrong with the file."""
    try:
        text = read_regular_file(path, MAX_SETTINGS_BYTES).decode("utf-8")
    except OSError as error:
        return None, f"cannot be read ({error.strerror or error})"
    except UnicodeDecodeError:
        return None, "is not text"
    try:
        data = json.loads(text, parse_int=_parse_int)
    except json.JSONDecodeError as error:
        return None, f"is not valid JSON (line {error.lineno}: {error.msg})"
    except RecursionError:
        return None, "is nested too deeply to be a settings file"
    if not isinstance(data, dict):
        return None, "does not hold a JSON object"
    return data, None


def _keep_aside(path: Path) -> Path | None:
    """Keep the damaged file as `<name>.damaged-<time>`: a copy of a regular file, or the thing
    itself moved out of the way (a folder or FIFO would block every later save)."""
    if not is_regular_file(path):
        return clear_non_regular(path)
    target = aside_name(path)
    try:
        shutil.copy2(path, target)
    except OSError:
        return None
    return target
