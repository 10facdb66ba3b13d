"""Remembered fixes: a verified fix stored per model, device and torch version.

A fix is stored only after it was proved by re-running the part that failed (health check or
generation repair). When the same model loads again on the same device and torch, the fix is
offered, and fields the user left on `auto` follow it.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from app.core import paths
from app.core.files import write_atomic
from app.core.settings import FIELDS

PROFILES_FILE = "profiles.json"


@dataclass(frozen=True)
class RememberedFix:
    settings: dict[str, Any]  # settings values that make the model run finite on this device
    summary: str  # one sentence, as the health check wrote it
    verified_by: str  # "health check" or "generation repair"
    saved_at: float


def _key(profile_key: str, device_name: str, torch_version: str) -> str:
    return f"{profile_key}|{device_name}|torch {torch_version}"


def _path() -> Path:
    return paths.data_dir() / PROFILES_FILE


def _load_all() -> dict[str, Any]:
    try:
        data = json.loads(_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # no file yet, or damaged: profiles are a convenience, never a blocker
    return data if isinstance(data, dict) else {}


def _torch_version() -> str:
    import torch

    return torch.__version__


def remembered_fix(
    profile_key: str, device_name: str, torch_version: str | None = None
) -> RememberedFix | None:
    """The fix stored for this model on this device and torch, if any (invalid entries are
    ignored field by field, like settings)."""
    entry = _load_all().get(_key(profile_key, device_name, torch_version or _torch_version()))
    if not isinstance(entry, dict) or not isinstance(entry.get("settings"), dict):
        return None
    settings = {}
    for key, value in entry["settings"].items():
        try:
            settings[key] = FIELDS[key].validate(value)
        except (KeyError, ValueError):
            continue
    if not settings:
        return None
    return RememberedFix(
        settings,
        str(entry.get("summary", "")),
        str(entry.get("verified_by", "")),
        float(entry.get("saved_at", 0)),
    )


def remember_fix(
    profile_key: str,
    device_name: str,
    settings: dict[str, Any],
    summary: str,
    verified_by: str,
    torch_version: str | None = None,
) -> RememberedFix:
    """Store a verified fix (atomic write; other models' entries are kept)."""
    for key, value in settings.items():
        FIELDS[key].validate(value)
    fix = RememberedFix(dict(settings), summary, verified_by, time.time())
    everything = _load_all()
    everything[_key(profile_key, device_name, torch_version or _torch_version())] = asdict(fix)
    write_atomic(_path(), json.dumps(everything, indent=2, sort_keys=True) + "\n")
    return fix


def forget_fix(profile_key: str, device_name: str, torch_version: str | None = None) -> None:
    everything = _load_all()
    if everything.pop(_key(profile_key, device_name, torch_version or _torch_version()), None):
        write_atomic(_path(), json.dumps(everything, indent=2, sort_keys=True) + "\n")
