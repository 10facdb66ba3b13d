"""A model file's hashes: the sha256 of its bytes, and AUTOMATIC1111's short model hash cached
per file (see `cache`)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

from app.core.checkpoint.cache import cached_value, file_stamp, store_value
from app.core.jobs import CancelToken


def sha256_file(
    path: str | Path,
    *,
    cancel: CancelToken | None = None,
    on_bytes: Callable[[int], None] | None = None,
    chunk_bytes: int = 16 << 20,
) -> str:
    """sha256 of a whole file, read in chunks (hashlib releases the GIL on large updates, so
    this can run on a worker thread while the model loads). `on_bytes(total_so_far)` is called
    after each chunk, on the hashing thread."""
    digest = hashlib.sha256()
    buffer = bytearray(chunk_bytes)
    view = memoryview(buffer)
    done = 0
    with open(path, "rb", buffering=0) as handle:
        while True:
            if cancel is not None:
                cancel.raise_if_cancelled()
            read = handle.readinto(view)
            if not read:
                break
            digest.update(view[:read])
            done += read
            if on_bytes is not None:
                on_bytes(done)
    return digest.hexdigest()


def cached_model_hash(path: str | Path) -> str | None:
    """The short hash if the cache already has it for this exact file, else None (no reading)."""
    path = Path(path).resolve()
    try:
        stamp = file_stamp(path)
    except OSError:
        return None
    sha = cached_value(str(path), stamp, "sha256")
    return sha[:10] if sha is not None else None


def model_hash(
    path: str | Path,
    *,
    cancel: CancelToken | None = None,
    on_bytes: Callable[[int], None] | None = None,
) -> str:
    """AUTOMATIC1111's short model hash: the first 10 hex digits of the file's sha256
    (`file_sha256`, cached)."""
    cached = cached_model_hash(path)
    if cached is not None:
        return cached
    return file_sha256(path, cancel=cancel, on_bytes=on_bytes)[:10]


def file_sha256(
    path: str | Path,
    *,
    cancel: CancelToken | None = None,
    on_bytes: Callable[[int], None] | None = None,
) -> str:
    """The file's whole sha256 in hex. Reading a multi-GB file takes seconds, so it is cached
    in `paths.cache_dir()/model_hashes.json`, keyed by absolute path and `file_stamp`: only the
    first call for an unchanged file reads it."""
    path = Path(path).resolve()
    stamp = file_stamp(path)
    sha = cached_value(str(path), stamp, "sha256")
    if sha is not None:
        return sha
    sha = sha256_file(path, cancel=cancel, on_bytes=on_bytes)
    if file_stamp(path) == stamp:  # a file rewritten while it was hashed is hashed next time
        store_value(str(path), stamp, "sha256", sha)
    return sha
