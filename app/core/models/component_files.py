"""A component folder's files, checked before diffusers or transformers open them: every
file regular, each config within real models' sizes, the weight files' headers valid."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.core import limits
from app.core.checkpoint.header import read_safetensors_header
from app.core.checkpoint.pickles import refuse_pickle
from app.core.errors import BadFileError


def check_config(path: Path, check, config: dict[str, Any]) -> None:
    """`check` a config against real models' sizes before anything reads a size from it."""
    try:
        check(config)
    except ValueError as error:
        raise BadFileError(path, f"{error}.") from None


def check_files(folder: Path, component: str | None = None) -> None:
    """Every file diffusers or transformers would open in a component folder is a regular
    file, and each config, vocabulary and merges file is well formed and within real sizes,
    before the folder is handed to them (see limits.check_component_files)."""
    try:
        limits.check_component_files(folder, component)
    except limits.ComponentFileError as error:
        raise BadFileError(error.path, f"{error.reason}.") from None


def weight_files(folder: Path, allow_pickle: bool, owner: Path) -> list[Path]:
    """The weight files of one component folder, each safetensors header validated."""
    files = sorted(f for f in folder.glob("*.safetensors") if f.is_file())
    if files:
        for file in files:
            read_safetensors_header(file)
        return files
    pickles = sorted(
        f
        for f in folder.iterdir()
        if f.is_file() and f.suffix.lower() in (".bin", ".ckpt", ".pt", ".pth")
    )
    if pickles:
        if not allow_pickle:
            refuse_pickle(pickles[0])
        return pickles
    raise BadFileError(folder, f"the {folder.name} folder of {owner.name} has no weights file.")
