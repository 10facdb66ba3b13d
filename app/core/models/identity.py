"""Who the loaded weights are: the content digest remembered fixes are keyed by, and the
AUTOMATIC1111 short hash of a single file, both cached for unchanged files."""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from app.core.checkpoint import (
    WeightScan,
    cached_model_hash,
    cached_value,
    files_stamp,
    model_hash,
    store_value,
)
from app.core.errors import CancelledError
from app.core.jobs import CancelToken, ProgressCallback


class Identity:
    """The identity of one load's weights, for remembered fixes: the digest of every tensor the
    model runs (`checkpoint.TensorDigest`, computed by the weight scan), with the architecture
    and prediction type the loader read them as.

    Hashing costs about 1 s per GB, where the NaN/Inf scan alone streams at several GB/s from
    a warm file, so the digest is cached like the A1111 hash: under the model (and separate
    VAE) paths, with the stamp (`checkpoint.file_stamp`) of every file it was read from. A later
    load of unchanged files asks the scan for no digest; a moved file is hashed again and gets
    the same key back.
    """

    def __init__(self, architecture: str, prediction_type: str, parts: list[Path], files) -> None:
        from app.core.families.registry import profile_architecture

        # The name state was saved under: a variant told apart later keeps its family's old
        # name here (`profile_architecture`), so remembered fixes are found again.
        architecture = profile_architecture(architecture)
        self._words = f"{architecture}\0{prediction_type}"
        self._key = json.dumps(["tensors", architecture, *(str(p.resolve()) for p in parts)])
        self._stamp: dict[str, Any] | None = None  # unstamped: never cached, hashed every time
        self.cached: str | None = None
        with contextlib.suppress(OSError):
            self._stamp = files_stamp(files)
            self.cached = cached_value(self._key, self._stamp, "content")

    def recall(self, name: str) -> str | None:
        """Another value cached for these unchanged files (None when none is valid)."""
        if self._stamp is None:
            return None
        with contextlib.suppress(OSError):
            return cached_value(self._key, self._stamp, name)
        return None

    def remember(self, name: str, value: str) -> None:
        if self._stamp is not None:
            with contextlib.suppress(OSError):  # not cached only costs the work again
                store_value(self._key, self._stamp, name, value)

    @property
    def needed(self) -> bool:
        """True when the weight scan must compute the digest (nothing valid is cached)."""
        return self.cached is None

    def profile_key(self, scan: WeightScan | None) -> str:
        """The key for this load, caching a freshly computed digest. The scan must have been
        asked to identify when `needed` was True (and may be None when it was not)."""
        content = self.cached or (scan.content if scan is not None else None)
        if content is None:
            raise ValueError("the weight scan computed no content digest")
        if self.cached is None and self._stamp is not None:
            # A cache that cannot be written only costs hashing again next time.
            with contextlib.suppress(OSError):
                store_value(self._key, self._stamp, "content", content)
        return hashlib.sha256(f"{self._words}\0{content}".encode()).hexdigest()


def file_key(path: Path, cancel: CancelToken | None = None) -> str:
    """The key remembered fixes are stored under for the parts one file holds on its own (a
    transformer file whose text encoders and VAE are other files, a separate VAE file): from
    the file's own bytes (its sha256, cached as the A1111 hash is), so any program that reads
    the same file (HalfSafe's loader, its ComfyUI nodes) names it alike, wherever it lies. Reads
    the whole file on the first call for an unchanged file, nothing after. Raises OSError for a
    file it cannot read."""
    from app.core.checkpoint.hashing import file_sha256

    sha = file_sha256(path, cancel=cancel)
    return hashlib.sha256(f"file\0{sha}".encode()).hexdigest()


def link_own_files(
    profile_key: str, files: Mapping[str, Path], cancel: CancelToken | None = None
) -> None:
    """Note that the model keyed `profile_key` took these components (component -> file) from
    files of their own, each under its `file_key`, so that its remembered fix is also kept for
    a host that loads one of those files alone (`fixing.file_fixes`). A folder, or a file that
    cannot be read, is left out: its part is then remembered with the model only."""
    from app.core.fixing import file_fixes

    keys = {}
    for component, file in files.items():
        if file.is_file():
            with contextlib.suppress(OSError):
                keys[component] = file_key(file, cancel)
    file_fixes.link_files(profile_key, keys)


def vae_files(vae: Path) -> list[Path]:
    """The files a separate VAE is read from (a file, or a folder's files)."""
    if vae.is_dir():
        return sorted(f for f in vae.iterdir() if f.is_file())
    return [vae]


class Hasher:
    """Computes the A1111 short hash on a worker thread while the model loads.

    Only a file's first load hashes it (the result is cached); if the load finishes first,
    `result()` waits and reports the hash's progress, so a multi-GB first load says what it
    is doing.
    """

    STAGE = "Computing the model hash (first load of this file only)"

    def __init__(self, path: Path) -> None:
        self.value: str | None = cached_model_hash(path)
        self.done_bytes = 0
        self._total = max(1, path.stat().st_size)
        self._cancel = CancelToken()
        self._thread: threading.Thread | None = None
        if self.value is None:
            self._thread = threading.Thread(
                target=self._run, args=(path,), daemon=True, name="halfsafe-model-hash"
            )
            self._thread.start()

    def _run(self, path: Path) -> None:
        try:
            self.value = model_hash(path, cancel=self._cancel, on_bytes=self._count)
        except (OSError, CancelledError, ValueError):
            self.value = None

    def _count(self, done: int) -> None:
        self.done_bytes = done

    def result(self, progress: ProgressCallback, cancel: CancelToken | None) -> str | None:
        while self._thread is not None and self._thread.is_alive():
            if cancel is not None and cancel.cancelled:
                self.stop()
                cancel.raise_if_cancelled()
            total_mb = round(self._total / 1e6)
            progress(self.STAGE, min(total_mb, round(self.done_bytes / 1e6)), total_mb)
            self._thread.join(0.25)
        return self.value

    def stop(self) -> None:
        self._cancel.cancel()
