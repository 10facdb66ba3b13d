"""The library's cache (`library.json` in the data folder): rows by path, reused while the
file's size, times and identity are unchanged; a damaged cache or row only costs a rescan.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

from app.core import limits, paths
from app.core.checkpoint import write_json_atomic
from app.core.library.entries import LibraryEntry

INDEX_FILE = "library.json"
# 3: SD3.x and Chroma files are read (entries cached before said unsupported); 4: Z-Image and
# Qwen-Image transformer files are (cached before as a Lumina model or unknown); 5: Flux.2,
# Qwen-Image 2.1 and Krea 2 files are (cached before as another family's or unknown); 6: Flux.1
# Fill, Depth and Canny files run and a Kontext file is told by its name (cached before as
# refused, or as Flux.1 dev).
INDEX_VERSION = 6
# The cache holds a few hundred bytes per model; 64 MB is some 100,000 models.
INDEX_LIMIT = 64 << 20


def _stamp(path: Path, kind: str) -> list[int] | None:
    try:
        target = path / "model_index.json" if kind == "diffusers" else path
        stat = target.stat()
    except OSError:
        return None
    # As checkpoint.file_stamp: bytes copied over a file with its mtime restored change ctime.
    return [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_dev, stat.st_ino]


def _cached_entry(cached: Any, stamp: list[int] | None, key: str) -> LibraryEntry | None:
    """The cached row for `key` if the file is unchanged and the row is well formed: the cache
    is a file on disk like any other, and a damaged one only costs a rescan."""
    if stamp is None or not isinstance(cached, dict) or cached.get("stamp") != stamp:
        return None
    row = cached.get("entry")
    if not isinstance(row, dict) or set(row) != _ENTRY_TYPES.keys() or row.get("path") != key:
        return None
    for name, types in _ENTRY_TYPES.items():
        value = row[name]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            return None
    return LibraryEntry(**row)


# What each LibraryEntry field may hold, for checking rows read back from the cache.
_ENTRY_TYPES: dict[str, tuple[type, ...]] = {
    "path": (str,),
    "architecture": (str, type(None)),
    "stored_dtype": (str, type(None)),
    "size_bytes": (int,),
    "error": (str, type(None)),
    "format": (str,),
    "supported": (bool,),
    "detected_because": (str, type(None)),
    "role": (str,),
    "vae": (str, type(None)),
    "companions": (dict, type(None)),
    "missing": (str, type(None)),
}


def _index_path() -> Path:
    return paths.data_dir() / INDEX_FILE


def _load_index() -> dict[str, dict]:
    # Damaged, nested, huge or not a file at all: the cache is only rebuilt, never fatal.
    try:
        data = limits.parse_json(limits.read_regular(_index_path(), INDEX_LIMIT))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != INDEX_VERSION:
        return {}
    entries = data.get("entries")
    return entries if isinstance(entries, dict) else {}


def _save_index(entries: dict[str, dict]) -> None:
    # The cache only saves time; a read-only data folder must not fail the scan.
    with contextlib.suppress(OSError):
        write_json_atomic(
            _index_path(), {"version": INDEX_VERSION, "saved": time.time(), "entries": entries}
        )
