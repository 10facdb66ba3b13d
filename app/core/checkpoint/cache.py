"""The cache of values computed from files' bytes (a file's sha256, a model's tensor digest):
one JSON file under `paths.cache_dir()`, each value kept with the stamps of the files it was
computed from and reused only while they still match; and the atomic JSON write it uses.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from app.core.limits import parse_json, read_regular

# What was computed from a file's bytes (its sha256, its tensors' digest) is cached in one JSON
# file, each entry under a key with the stamp of the files it was computed from: a value is
# reused only while every one of those files has the same stamp (`file_stamp`).
_HASH_CACHE = "model_hashes.json"


def file_stamp(path: Path) -> dict[str, Any]:
    """One file's stamp, as cache entries record them: size, modification time, inode and
    change time.

    Size and modification time alone can be forged by accident: another model's bytes copied
    over the file with its time restored (`touch -r`, `cp -p`, a sync tool) keep both. The
    change time (st_ctime_ns) is set by the system on every write, and restoring the
    modification time sets it again; no call sets it back. A rewrite into a new file changes
    the inode. A chmod or a rename also changes the change time: that costs hashing once more.
    """
    stat = path.stat()
    return {
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "ctime_ns": stat.st_ctime_ns,
        "inode": [stat.st_dev, stat.st_ino],
    }


def files_stamp(files: Iterable[Path]) -> dict[str, Any]:
    """The stamp of several files: each one's absolute path and `file_stamp`."""
    stamps = []
    for file in files:
        file = file.resolve()
        stat = file.stat()
        stamps.append(
            [str(file), stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_dev, stat.st_ino]
        )
    return {"files": sorted(stamps)}


def cached_value(key: str, stamp: Mapping[str, Any], name: str) -> str | None:
    """The cached text `name` of entry `key`, if the entry's stamp is `stamp`; else None."""
    from app.core import paths

    entry = _read_json_dict(paths.cache_dir() / _HASH_CACHE).get(key)
    if not isinstance(entry, dict) or any(entry.get(k) != v for k, v in stamp.items()):
        return None
    value = entry.get(name)
    return value if isinstance(value, str) else None


def store_value(key: str, stamp: Mapping[str, Any], name: str, value: str) -> None:
    """Cache `value` as `name` of entry `key` (atomic write). Other values in the entry stay
    while its stamp still holds; a stamp that changed starts the entry afresh."""
    from app.core import paths

    cache_file = paths.cache_dir() / _HASH_CACHE
    cache = _read_json_dict(cache_file)  # another process may have added entries meanwhile
    entry = cache.get(key)
    if not isinstance(entry, dict) or any(entry.get(k) != v for k, v in stamp.items()):
        entry = dict(stamp)
    entry[name] = value
    cache[key] = entry
    write_json_atomic(cache_file, cache)


def _read_json_dict(path: Path) -> dict[str, Any]:
    """A cache file's object, or {} when it is missing or damaged (nested, huge, not a file):
    a cache only saves time, so a bad one must never stop a model from loading."""
    try:
        data = parse_json(read_regular(path, _CACHE_LIMIT))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


# The hash cache holds some 150 bytes per model file.
_CACHE_LIMIT = 64 << 20


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON to a temp file beside `path`, then rename over it (never half a file)."""
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=1, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
