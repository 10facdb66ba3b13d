"""Writing files so that a crash never leaves half of one: settings, profiles, caches, images."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def write_atomic(
    path: Path,
    data: bytes | str | Callable[[BinaryIO], None],
    *,
    keep_backup: bool = False,
    overwrite: bool = True,
) -> Path:
    """Write `data` to `path` through a temp file in the same folder, fsync, then rename.

    `data` is bytes, text (UTF-8) or a function that writes to the open binary file. With
    `keep_backup`, an existing file is copied to `<name>.bak` first. With `overwrite=False` an
    existing file is never replaced: FileExistsError is raised instead (the temp file is
    linked into place, which fails atomically if the name was taken meanwhile).
    """
    path = Path(path)
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
        if keep_backup and path.exists():
            shutil.copy2(path, path.with_name(path.name + ".bak"))
        if overwrite:
            os.replace(tmp_name, path)
        else:
            os.link(tmp_name, path)
            os.unlink(tmp_name)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return path
