"""The files of one diffusers component folder, checked before any loader opens one: regular
files only, JSON bounded in size and depth, each config within real models' sizes
(config_limits), tokenizer vocabularies and merges well formed. No torch here.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from app.core.config_limits import (
    check_component_config,
    check_no_custom_code,
    check_tokenizer_config,
)
from app.core.limits import (
    MAX_CONFIG_BYTES,
    MAX_MERGES,
    MAX_TOKENIZER_BYTES,
    MAX_VOCAB,
    file_kind,
    parse_json,
    read_regular,
    shown_value,
)


def check_vocabulary(path: str | os.PathLike[str]) -> None:
    """A BPE vocabulary (vocab.json): an object of token -> id, at most MAX_VOCAB entries."""
    vocabulary = parse_json(read_regular(path, MAX_TOKENIZER_BYTES))
    if not isinstance(vocabulary, dict):
        raise ValueError("its vocabulary is not a JSON object of tokens to ids")
    if len(vocabulary) > MAX_VOCAB:
        raise ValueError(
            f"its vocabulary has {len(vocabulary)} entries, more than the {MAX_VOCAB:,} of any "
            "real tokenizer (CLIP has 49,408)"
        )
    for token, number in vocabulary.items():
        if isinstance(number, bool) or not isinstance(number, int) or not 0 <= number < MAX_VOCAB:
            raise ValueError(
                f"its vocabulary gives token {shown_value(token)} the id {shown_value(number)} where a "
                f"whole number from 0 to {MAX_VOCAB - 1} belongs"
            )


def check_merges(path: str | os.PathLike[str]) -> None:
    """BPE merges (merges.txt): UTF-8 lines of two tokens each, after an optional #version."""
    try:
        text = read_regular(path, MAX_TOKENIZER_BYTES).decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("its merges file is not UTF-8 text") from None
    lines = text.split("\n")
    if len(lines) > MAX_MERGES + 2:
        raise ValueError(
            f"it has {len(lines)} merges, more than the {MAX_MERGES:,} of any real tokenizer"
        )
    for number, line in enumerate(lines, start=1):
        line = line.rstrip("\r")
        if not line or (number == 1 and line.startswith("#version")):
            continue
        if len(line.split()) != 2:
            raise ValueError(
                f"line {number} of its merges is {shown_value(line)}, where two tokens belong"
            )


def check_component_files(folder: Path, component: str | None = None) -> None:
    """Every file a loader may open in one diffusers component folder: regular files only,
    JSON bounded in size and depth, tokenizer vocabularies and merges well formed.

    `component` (default: the folder's name) says which config checks apply. Raises
    ComponentFileError, which names the file and the reason.
    """
    component = component or folder.name
    try:
        entries = sorted(folder.iterdir())
    except OSError as error:
        raise ComponentFileError(folder, error.strerror or str(error)) from None
    for entry in entries:
        try:
            mode = os.stat(entry).st_mode
        except OSError:
            continue  # a dangling link: no loader can open it either
        if stat.S_ISDIR(mode):
            continue
        if not stat.S_ISREG(mode):
            raise ComponentFileError(entry, f"it is {file_kind(mode)}, not a regular file")
        try:
            _check_component_file(component, entry)
        except (OSError, ValueError) as error:
            reason = error.strerror if isinstance(error, OSError) else str(error)
            raise ComponentFileError(entry, reason or str(error)) from None


class ComponentFileError(ValueError):
    """One file of a component folder failed its check; `path` says which."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(reason)


def _check_component_file(component: str, path: Path) -> None:
    name = path.name
    if name == "vocab.json" and component.startswith("tokenizer"):
        check_vocabulary(path)
    elif name == "merges.txt":
        check_merges(path)
    elif name.endswith(".json"):
        configs = ("config.json", "scheduler_config.json")
        limit = MAX_CONFIG_BYTES if name in configs else MAX_TOKENIZER_BYTES
        document = parse_json(read_regular(path, limit))
        if name != "tokenizer.json":  # the tokenizers library's own format: no loader's config
            check_no_custom_code(document)
        if name in configs:
            if not isinstance(document, dict):
                raise ValueError("it holds JSON but not an object")
            check_component_config(component, document)
        elif name == "tokenizer_config.json" and isinstance(document, dict):
            check_tokenizer_config(document)
