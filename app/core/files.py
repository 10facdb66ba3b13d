"""Files that HalfSafe writes and reads back: settings, profiles, caches, images.

Writing: a crash never leaves half of a file (temp file, fsync, rename), and a backup copy is
put in place the same way. A file kept aside (damaged) is kept only once its replacement is
safely written, so a full or read-only disk never leaves neither. Reading a file of our own: only a regular file is opened, so a FIFO
or a folder at that name can never block or crash the app. Read-modify-write across processes:
`locked` holds a lock file.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from app.core import limits

LOCK_TIMEOUT_S = 10.0


def write_atomic(
    path: Path,
    data: bytes | str | Callable[[BinaryIO], None],
    *,
    keep_backup: bool = False,
    overwrite: bool = True,
    shared: bool = False,
) -> Path:
    """Write `data` to `path` through a temp file in the same folder, fsync, then rename.

    `data` is bytes, text (UTF-8) or a function that writes to the open binary file. With
    `keep_backup`, an existing file is copied to `<name>.bak` first, itself atomically (a reader
    never sees half a backup). With `overwrite=False` an existing file is never replaced:
    FileExistsError is raised instead (the temp file is linked into place, which fails
    atomically if the name was taken meanwhile). The temp file is owner-only (0600) while it is
    written; with `shared` the finished file gets the permissions any new file of the user's
    gets (0666 less the umask), as images must for other programs and users to open them.
    """
    path = Path(path)
    tmp_name = _staged(path, data, shared=shared)
    try:
        if keep_backup and path.exists():
            _copy_atomic(path, path.with_name(path.name + ".bak"))
        if overwrite:
            os.replace(tmp_name, path)
        else:
            os.link(tmp_name, path)
            os.unlink(tmp_name)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return path


def replace_keeping_aside(
    path: Path, data: bytes | str | Callable[[BinaryIO], None], *, label: str = "damaged"
) -> Path | None:
    """Put `data` at `path` and keep what held that name before as `aside_name(path, label)`,
    in the order that never loses either of them: the new file is written and fsynced beside
    `path` first (when that fails, on a full or read-only disk, OSError is raised with nothing
    moved); then the old one is kept aside, a regular file by a hard link (`path` never goes
    missing) and anything else (a folder, a FIFO, a link) by a rename; only then is the new
    file renamed over `path`. A failure in those renames puts the old one back. Returns where
    the old one is kept, or None when there was none.
    """
    path = Path(path)
    tmp_name = _staged(path, data)
    try:
        target = _keep_aside(path, label)
        try:
            os.replace(tmp_name, path)
        except BaseException:
            if target is not None:
                _put_back(target, path)
            raise
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return None if target is None else target[0]


def _keep_aside(path: Path, label: str) -> tuple[Path, bool] | None:
    """Keep what holds `path` under a free name beside it: (that name, whether it was linked
    rather than moved), or None when nothing holds `path`."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    target = aside_name(path, label)
    if stat.S_ISREG(mode):
        try:
            os.link(path, target)
            return target, True
        except OSError:  # no hard links on this file system (FAT, some network shares)
            pass
    os.replace(path, target)
    return target, False


def _put_back(kept: tuple[Path, bool], path: Path) -> None:
    """Undo `_keep_aside`: a link is dropped (the original never left `path`), a moved thing
    goes back. Best effort: if even that fails, it is still kept under the other name."""
    target, linked = kept
    with contextlib.suppress(OSError):
        if linked:
            os.unlink(target)
        else:
            os.replace(target, path)


def _staged(
    path: Path, data: bytes | str | Callable[[BinaryIO], None], *, shared: bool = False
) -> str:
    """A temp file in `path`'s folder holding `data`, flushed and fsynced; its name. On any
    failure (a full disk, a read-only folder) nothing is left behind and the error is raised."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as tmp:
            if callable(data):
                data(tmp)
            else:
                tmp.write(data.encode("utf-8") if isinstance(data, str) else data)
            tmp.flush()
            os.fsync(tmp.fileno())
        if shared:
            os.chmod(tmp_name, 0o666 & ~current_umask())
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return tmp_name


_UMASK_LOCK = threading.Lock()


def current_umask() -> int:
    """The process's umask, read without changing it where the system allows (Linux's
    /proc/self/status); elsewhere set and restored at once, under a lock."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    with _UMASK_LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def _copy_atomic(source: Path, target: Path) -> None:
    """Copy `source` over `target` so that `target` is always either the old or the new copy."""
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as tmp, source.open("rb") as original:
            shutil.copyfileobj(original, tmp)
            tmp.flush()
            os.fsync(tmp.fileno())
        shutil.copystat(source, tmp_name)
        os.replace(tmp_name, target)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


class NotRegularFileError(OSError):
    """A name we expected to be a file is a folder, a FIFO, a device or a socket."""


def read_regular_file(path: Path, max_bytes: int) -> bytes:
    """The bytes of `path`, which must be a regular file of at most `max_bytes`.

    The file is opened without blocking and checked through the open descriptor (no race
    between a check and the open), so a FIFO never waits for a writer. Raises
    NotRegularFileError for anything that is not a regular file, and OSError (EFBIG) for a
    file larger than `max_bytes`.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    fd = os.open(path, flags)
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = "a folder" if stat.S_ISDIR(info.st_mode) else "not a regular file"
            raise NotRegularFileError(errno.EINVAL, f"it is {kind}", str(path))
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise OSError(errno.EFBIG, f"it is larger than {max_bytes} bytes", str(path))
    return data


def read_saved_object(path: Path, max_bytes: int) -> dict[str, Any] | None:
    """The JSON object HalfSafe saved at `path` (a cache), or None when there is none or it is
    damaged in any way: not a regular file (a FIFO is never waited on), larger than `max_bytes`
    (checked before reading, so a sparse file of gigabytes costs nothing), not UTF-8 JSON,
    nested deeper than `limits.MAX_JSON_DEPTH`, or not an object. A cache only saves time, so
    damage costs a re-run, never a hang or a traceback; the caller still checks each field."""
    try:
        document = limits.parse_json(limits.read_regular(path, max_bytes))
    except (OSError, ValueError):
        return None
    return document if isinstance(document, dict) else None


def aside_name(path: Path, label: str = "damaged") -> Path:
    """A free name beside `path` to keep a damaged file under: `<name>.<label>-<time>`."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = path.with_name(f"{path.name}.{label}-{stamp}")
    number = 1
    while os.path.lexists(target):
        target = path.with_name(f"{path.name}.{label}-{stamp}-{number}")
        number += 1
    return target


def clear_non_regular(path: Path) -> Path | None:
    """If a folder, FIFO or socket holds the name of a file we keep, move it aside (nothing of
    the user's is deleted) so the file can be read and written again; a FIFO left in place
    would block whoever opens it. Returns where it went, or None when nothing was moved."""
    if not os.path.lexists(path) or is_regular_file(path):
        return None
    target = aside_name(path)
    try:
        os.replace(path, target)
    except OSError:
        return None
    return target


def is_regular_file(path: Path) -> bool:
    """True when `path` is a regular file (following a link); never opens it."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


@contextlib.contextmanager
def locked(path: Path, timeout: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold an exclusive lock on `<path>.lock` for a read-modify-write of `path`.

    Works across processes (fcntl.flock on POSIX, msvcrt.locking on Windows); the OS releases
    the lock if the holder dies, so a crash never leaves the file locked. The lock file is never
    deleted: deleting it would let two processes lock two different files. Raises TimeoutError
    (an OSError) if another process holds the lock for `timeout` seconds.
    """
    path = Path(path)
    lock_path = path.with_name(path.name + ".lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NONBLOCK", 0)
    fd = os.open(lock_path, flags, 0o644)
    try:
        deadline = time.monotonic() + timeout
        while not _try_lock(fd):
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    errno.ETIMEDOUT, f"another program kept {path.name} locked for {timeout:g} s"
                )
            time.sleep(0.02)
        try:
            yield
        finally:
            _unlock(fd)
    finally:
        os.close(fd)


if os.name == "nt":
    import msvcrt

    def _try_lock(fd: int) -> bool:
        os.lseek(fd, 0, os.SEEK_SET)
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True

    def _unlock(fd: int) -> None:
        os.lseek(fd, 0, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)

else:
    import fcntl

    def _try_lock(fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def _unlock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)
