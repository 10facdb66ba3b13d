"""The library's cache (`library.json` in the data folder): rows by path, reused while the
file's size, times and identity are unchanged; a damaged cache or row only costs a rescan.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from pathlib import Path
from typing import Any

from app.core import limits, paths
from app.core.checkpoint import write_json_atomic
from app.core.library.entries import LibraryEntry

INDEX_FILE = "library.json"
# The layout of the cache's rows; what the rows say depends on the families HalfSafe
# recognises too, which `index_version` adds. 7: models outside every family told by their
# file names (MOSS-Image), which rows kept before named by their keys alone.
INDEX_FORMAT = 7
# The cache holds a few hundred bytes per model; 64 MB is some 100,000 models.
INDEX_LIMIT = 64 << 20


def index_version() -> str:
    """The cache's version: its row layout and a digest of the family registry (each family's
    id, detection version and architecture names, in the order they are recognised), so that a
    family added, removed or reordered, or recognising files anew, makes a cache kept before
    it a rescan: its rows would say unsupported, or another family's, where the files now run.
    """
    from app.core.families.registry import FAMILIES

    registry = [
        [str(family.id), family.detection_version, sorted(family.architectures)]
        for family in FAMILIES
    ]
    digest = hashlib.sha256(json.dumps(registry).encode()).hexdigest()[:16]
    return f"{INDEX_FORMAT}-{digest}"


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
    if not isinstance(data, dict) or data.get("version") != index_version():
        return {}
    entries = data.get("entries")
    return entries if isinstance(entries, dict) else {}


def _save_index(entries: dict[str, dict]) -> None:
    # The cache only saves time; a read-only data folder must not fail the scan.
    with contextlib.suppress(OSError):
        write_json_atomic(
            _index_path(), {"version": index_version(), "saved": time.time(), "entries": entries}
        )
