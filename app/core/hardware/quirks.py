"""The quirks table (`app/resources/quirks.json`): every known fault or limit of a device, read and
checked entry by entry, and cached while the file is unchanged.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

from app.core import paths
from app.core.hardware.records import BF16_CLASSES, FP16_CLASSES, Quirk, QuirkMatch
from app.core.settings import FIELDS, PRECISION_KEYS

QUIRKS_FILE = "quirks.json"
_CLASS_EFFECTS = {"fp16": FP16_CLASSES, "bf16": BF16_CLASSES}


def load_quirks(path: Path | None = None) -> tuple[Quirk, ...]:
    """Read and check the quirks table; a malformed entry raises ValueError naming it."""
    path = path or paths.resource(QUIRKS_FILE)
    info = path.stat()
    stamp = (info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_dev, info.st_ino)
    return _load_quirks_cached(str(path), stamp)


@functools.lru_cache(maxsize=4)
def _load_quirks_cached(path: str, _stamp: tuple[int, ...]) -> tuple[Quirk, ...]:
    document = json.loads(Path(path).read_text(encoding="utf-8"))
    quirks: list[Quirk] = []
    seen: set[str] = set()
    for number, entry in enumerate(document["quirks"]):
        name = entry.get("id", f"entry {number}")
        try:
            quirk = Quirk(
                id=entry["id"],
                summary=entry["summary"],
                source=entry["source"],
                match=QuirkMatch.read(entry["match"]),
                effects=dict(entry["effects"]),
            )
            _check_quirk(quirk)
        except (KeyError, TypeError, ValueError, re.error) as error:
            raise ValueError(f"{path}: quirk '{name}' is malformed: {error}") from error
        if quirk.id in seen:
            raise ValueError(f"{path}: quirk id '{quirk.id}' appears twice")
        seen.add(quirk.id)
        quirks.append(quirk)
    return tuple(quirks)


def _check_quirk(quirk: Quirk) -> None:
    if not quirk.summary.strip() or "\n" in quirk.summary:
        raise ValueError("summary must be one non-empty line")
    if not quirk.source.startswith("https://"):
        raise ValueError("source must be an https:// address")
    if not quirk.effects:
        raise ValueError("effects must not be empty")
    for key, value in quirk.effects.items():
        if key in _CLASS_EFFECTS:
            if value not in _CLASS_EFFECTS[key]:
                raise ValueError(f"{key} effect must be one of {_CLASS_EFFECTS[key]}")
        elif key == "tf32":
            if value is not False:
                raise ValueError("a tf32 effect can only turn TF32 off")
        elif key in PRECISION_KEYS:
            if value == "auto":
                raise ValueError(f"{key} effect must be resolved, not 'auto'")
            FIELDS[key].validate(value)
        else:
            raise ValueError(f"unknown effect {key!r}")
