"""The shipped config folders, made ready for loading offline, and reading a config's JSON."""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
from pathlib import Path
from typing import Any

from app.core import limits, paths
from app.core.errors import BadFileError
from app.core.families.registry import FAMILIES


def config_folder(name: str) -> Path:
    """The ready-to-use diffusers config folder for `name` (a family's `checkpoint_configs`).

    The shipped folder (`app/resources/configs/<name>`) holds the JSON configs; the tokenizer
    folders get the shared CLIP vocabulary and merges (`app/resources/tokenizers/clip`) copied in.
    The result lives in the cache directory, keyed by the content of both, and is built once;
    it is what `from_single_file(..., config=...)` and our own loader read.
    """
    if not any(name in family.checkpoint_configs for family in FAMILIES):
        raise ValueError(f"no shipped config named {name!r}")
    shipped = paths.resource("configs", name)
    vocabulary = paths.resource("tokenizers", "clip")
    digest = hashlib.sha256()
    for file in sorted(shipped.rglob("*.json")):
        digest.update(str(file.relative_to(shipped)).encode())
        digest.update(file.read_bytes())
    for file in ("vocab.json", "merges.txt"):  # 1.5 MB: hashed, as a stamp could be forged
        digest.update(file.encode())
        digest.update((vocabulary / file).read_bytes())
    target = paths.cache_dir() / "configs" / f"{name}-{digest.hexdigest()[:12]}"
    if (target / "model_index.json").is_file():
        return target
    staging = target.with_name(f"{target.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(shipped, staging)
    for tokenizer in staging.glob("tokenizer*"):
        for file in ("vocab.json", "merges.txt"):
            shutil.copyfile(vocabulary / file, tokenizer / file)
    try:
        os.replace(staging, target)
    except OSError:
        # Another process built it first; theirs is identical.
        shutil.rmtree(staging, ignore_errors=True)
    return target


def read_json(path: Path, owner: Path | None = None) -> dict[str, Any]:
    """A config's JSON object; only a regular file, bounded in size and nesting (see limits)."""
    owner = owner or path
    try:
        return limits.read_json_object(path)
    except FileNotFoundError:
        raise BadFileError(owner, f"{path.name} is missing.") from None
    except OSError as error:
        raise BadFileError(path, f"the file cannot be read ({error.strerror or error}).") from None
    except ValueError as error:
        if "not valid JSON" in str(error):
            raise BadFileError(path, "the file is not valid JSON.") from None
        raise BadFileError(path, f"{error}.") from None
