"""Where a file dialog opens: the folder the user's files of that kind live in (pictures, the
model folders, documents), never the folder HalfSafe happened to be started from."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any


def _first_existing(candidates) -> str:
    for candidate in candidates:
        if candidate and Path(candidate).expanduser().is_dir():
            return str(Path(candidate).expanduser())
    return str(Path.home())


def _settings() -> Mapping[str, Any]:
    from app.core.settings import load_settings

    return load_settings().settings.values  # never raises: a damaged file gives defaults


def pictures() -> str:
    """Images: the output folder, else the user's Pictures, else home."""
    import platformdirs

    return _first_existing([_settings().get("output_folder"), platformdirs.user_pictures_dir()])


def models() -> str:
    """Checkpoints, LoRAs and VAEs: the first model folder that exists, else home."""
    return _first_existing(list(_settings().get("model_folders") or []))


def documents() -> str:
    """Reports: the user's Documents, else home."""
    import platformdirs

    return _first_existing([platformdirs.user_documents_dir()])


def home() -> str:
    return str(Path.home())
