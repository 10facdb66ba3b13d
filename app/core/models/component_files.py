"""A component folder's files, checked before diffusers or transformers open them: every
file regular, each config within real models' sizes, the weight files' headers valid."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.core import component_limits, limits
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
    before the folder is handed to them (see component_limits.check_component_files)."""
    try:
        component_limits.check_component_files(folder, component)
    except component_limits.ComponentFileError as error:
        raise BadFileError(error.path, f"{error.reason}.") from None
    check_known_classes(folder)


def check_known_classes(folder: Path) -> None:
    """A config's `model_type` and a tokenizer's `tokenizer_class` are ones transformers has.
    Given an unknown one, transformers' Auto classes look for the model's own code instead (and
    without it fail deep inside); so HalfSafe refuses it first, naming the file. The files
    passed `check_files`' limits."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    config, tokenizer = folder / "config.json", folder / "tokenizer_config.json"
    if config.is_file():
        kind = limits.read_json_object(config).get("model_type")
        if kind is not None and (not isinstance(kind, str) or kind not in CONFIG_MAPPING_NAMES):
            raise BadFileError(
                config,
                f"its model_type {_shown(kind)} is no model transformers knows, so loading it would "
                "need code of the model's own, which HalfSafe never runs.",
            )
    if tokenizer.is_file():
        named = limits.read_json_object(tokenizer, limits.MAX_TOKENIZER_BYTES).get(
            "tokenizer_class"
        )
        if named is not None and not _is_tokenizer(named):
            raise BadFileError(
                tokenizer,
                f"its tokenizer_class {_shown(named)} is no tokenizer transformers knows, so loading "
                "it would need code of the model's own, which HalfSafe never runs.",
            )


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


def _is_tokenizer(name: Any) -> bool:
    """Whether `name` is a tokenizer class transformers has (its tables, or a class of its
    own by that name)."""
    from transformers import PreTrainedTokenizerBase
    from transformers.models.auto.tokenization_auto import tokenizer_class_from_name

    found = tokenizer_class_from_name(name) if isinstance(name, str) else None
    return isinstance(found, type) and issubclass(found, PreTrainedTokenizerBase)


def _shown(value: Any) -> str:
    """A config's value as a sentence quotes it: short."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
