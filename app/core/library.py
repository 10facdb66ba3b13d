"""The model library: checkpoints found in the user's model folders, read from headers only.

Scans the folders from settings plus the usual AUTOMATIC1111, ComfyUI and StabilityMatrix model
folders that exist on this computer and HalfSafe's own, and lists every checkpoint with its
architecture, stored dtype and size. Only safetensors headers and folder configs are read, never
weights; pickles are listed but not opened. A broken file is listed with its problem and the
scan goes on. Results are cached by path, size and modification time, so a rescan only reads
what changed. No torch here.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from app.core import architecture as arch
from app.core import limits, paths
from app.core.checkpoint import (
    PICKLE_SUFFIXES,
    SAFETENSORS_SUFFIX,
    read_safetensors_header,
    stored_dtype,
    write_json_atomic,
)
from app.core.errors import BadFileError
from app.core.jobs import CancelToken, ProgressCallback, no_progress

INDEX_FILE = "library.json"
INDEX_VERSION = 1
# The cache holds a few hundred bytes per model; 64 MB is some 100,000 models.
INDEX_LIMIT = 64 << 20
MAX_DEPTH = 6
APP_MODELS = "models"


@dataclass(frozen=True)
class LibraryEntry:
    """One checkpoint found in a model folder."""

    path: str
    architecture: str | None  # "sd1", "sd2", "sdxl", "-inpaint" variants, or what else it is
    stored_dtype: str | None  # "fp16", "bf16", "fp32", "mixed"; None when not read
    size_bytes: int
    error: str | None = None  # one sentence when the file is broken
    format: str = "single_file"  # "single_file" | "diffusers" | "pickle"
    supported: bool = False  # HalfSafe can load it
    detected_because: str | None = None


def default_model_folders() -> list[Path]:
    """The usual model folders of AUTOMATIC1111 (and Forge), ComfyUI and StabilityMatrix that
    exist here, plus HalfSafe's own `models` folder in its data directory."""
    home = Path.home()
    candidates = [
        home / "stable-diffusion-webui" / "models" / "Stable-diffusion",
        home / "stable-diffusion-webui-forge" / "models" / "Stable-diffusion",
        home / "sd.webui" / "webui" / "models" / "Stable-diffusion",
        home / "ComfyUI" / "models" / "checkpoints",
        home / "ComfyUI_windows_portable" / "ComfyUI" / "models" / "checkpoints",
        home / "Documents" / "ComfyUI" / "models" / "checkpoints",
        home / "StabilityMatrix" / "Data" / "Models" / "StableDiffusion",
        home / "StabilityMatrix" / "Models" / "StableDiffusion",
    ]
    if sys.platform == "win32":
        appdata = os.environ.get("APPDATA")
        if appdata:
            candidates.append(Path(appdata) / "StabilityMatrix" / "Models" / "StableDiffusion")
    elif sys.platform == "darwin":
        candidates.append(
            home
            / "Library"
            / "Application Support"
            / "StabilityMatrix"
            / "Models"
            / "StableDiffusion"
        )
    else:
        data_home = Path(os.environ.get("XDG_DATA_HOME") or home / ".local" / "share")
        candidates.append(data_home / "StabilityMatrix" / "Models" / "StableDiffusion")
    found = [c for c in candidates if c.is_dir()]
    own = paths.data_dir() / APP_MODELS
    own.mkdir(parents=True, exist_ok=True)
    return [*found, own]


def library_folders(extra: list[str] | None = None) -> list[Path]:
    """The folders a scan covers: the settings' model folders (or `extra`), then the defaults;
    each once."""
    if extra is None:
        from app.core.settings import load_settings

        extra = load_settings().settings["model_folders"]
    folders: list[Path] = []
    for folder in [*(Path(f).expanduser() for f in extra), *default_model_folders()]:
        resolved = folder.resolve() if folder.exists() else folder
        if resolved not in folders:
            folders.append(resolved)
    return folders


def scan_library(
    folders: list[str] | None = None,
    *,
    include_defaults: bool = True,
    use_cache: bool = True,
    on_progress: ProgressCallback | None = None,
    cancel: CancelToken | None = None,
) -> list[LibraryEntry]:
    """List the checkpoints under `folders` (None: the settings' model folders), plus the
    default folders (`default_model_folders()`) unless `include_defaults` is False.

    Safetensors files get architecture and stored dtype from their header; diffusers folders
    (with model_index.json) from their configs; pickles are listed unopened. A folder that does
    not exist or cannot be read is skipped. Sorted by path. The index is cached in
    `paths.data_dir()/library.json`; entries whose file size and time are unchanged are reused.
    Runs on the calling thread and checks `cancel` between files.
    """
    progress = on_progress or no_progress
    if include_defaults:
        roots = library_folders([str(f) for f in folders] if folders is not None else None)
    else:
        roots = [Path(f).expanduser() for f in folders or []]
    cache = _load_index() if use_cache else {}
    candidates: list[tuple[Path, str]] = []
    for root in roots:
        candidates.extend(_candidates(root))
    entries: list[LibraryEntry] = []
    fresh: dict[str, dict] = {}
    for done, (path, kind) in enumerate(candidates):
        if cancel is not None:
            cancel.raise_if_cancelled()
        progress("Scanning model folders", done, len(candidates))
        key = str(path)
        stamp = _stamp(path, kind)
        entry = _cached_entry(cache.get(key), stamp, key)
        if entry is None:
            entry = _inspect_one(path, kind)
        entries.append(entry)
        if stamp is not None:
            fresh[key] = {"stamp": stamp, "entry": asdict(entry)}
    progress("Scanning model folders", len(candidates), len(candidates))
    if use_cache:
        _save_index(fresh)
    return sorted(entries, key=lambda e: e.path)


def _candidates(root: Path) -> list[tuple[Path, str]]:
    found: list[tuple[Path, str]] = []
    if not root.is_dir():
        return found
    root_depth = len(root.parts)

    def skip(error: OSError) -> None:
        pass  # an unreadable subfolder is left out; the rest of the scan goes on

    for current, dirs, files in os.walk(root, onerror=skip, followlinks=False):
        here = Path(current)
        if "model_index.json" in files:
            found.append((here, "diffusers"))
            dirs[:] = []
            continue
        dirs[:] = sorted(
            d for d in dirs if not d.startswith(".") and len(here.parts) - root_depth < MAX_DEPTH
        )
        for name in sorted(files):
            lowered = name.lower()
            if lowered.endswith(SAFETENSORS_SUFFIX):
                found.append((here / name, "single_file"))
            elif lowered.endswith(PICKLE_SUFFIXES):
                found.append((here / name, "pickle"))
    return found


def _stamp(path: Path, kind: str) -> list[int] | None:
    try:
        target = path / "model_index.json" if kind == "diffusers" else path
        stat = target.stat()
    except OSError:
        return None
    return [stat.st_size, stat.st_mtime_ns]


def _inspect_one(path: Path, kind: str) -> LibraryEntry:
    """One row, whatever the file holds: a file that trips a fault HalfSafe did not foresee
    costs its own row (with the fault named), never the rest of the library."""
    try:
        return _inspect(path, kind)
    except Exception as error:  # the promise is per row; the GUI shows the text
        words = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
        return LibraryEntry(
            str(path),
            None,
            None,
            0,
            f"{path}: HalfSafe could not read it ({type(error).__name__}"
            f"{': ' + words if words else ''}).",
            format="diffusers" if kind == "diffusers" else kind,
        )


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
}


def _inspect(path: Path, kind: str) -> LibraryEntry:
    if kind == "diffusers":
        return _inspect_folder(path)
    try:
        size = path.stat().st_size
    except OSError as error:
        return LibraryEntry(
            str(path),
            None,
            None,
            0,
            f"{path}: the file cannot be read ({error.strerror or error}).",
            format=kind,
        )
    if kind == "pickle":
        return LibraryEntry(
            str(path),
            None,
            None,
            size,
            None,
            format="pickle",
            detected_because="a pickle checkpoint: not opened (it could run "
            "code); load it with --allow-pickle to inspect it",
        )
    try:
        header = read_safetensors_header(path)
    except BadFileError as error:
        return LibraryEntry(str(path), None, None, size, str(error))
    sidecar = path.with_suffix(".yaml")
    sidecar_text = None
    if limits.is_regular_file(sidecar):
        try:
            raw = limits.read_regular(sidecar, limits.MAX_CONFIG_BYTES)
            sidecar_text = raw.decode("utf-8", errors="replace")
        except OSError:
            sidecar_text = None
    detection = arch.detect_architecture(
        header.shapes(), metadata=header.metadata, name=path.name, sidecar_config=sidecar_text
    )
    dtype = stored_dtype(header.dtypes().values())
    problem = arch.shape_problem(header.shapes(), detection) if detection.supported else None
    return LibraryEntry(
        str(path),
        detection.architecture,
        dtype if dtype != "none" else None,
        size,
        f"{path}: this looks like {detection.looks_like}, but {problem}." if problem else None,
        supported=detection.supported and problem is None,
        detected_because=detection.because,
    )


def _inspect_folder(path: Path) -> LibraryEntry:
    size = 0
    dtypes: list[str] = []
    try:
        index = _folder_config(path / "model_index.json")
        unet = _folder_config(path / "unet" / "config.json", limits.check_unet_config)
        scheduler_file = path / "scheduler" / "scheduler_config.json"
        scheduler = (
            _folder_config(scheduler_file, limits.check_scheduler_config)
            if scheduler_file.exists()
            else {}
        )
        for component in _components(path, index):
            limits.check_component_files(component)
    except limits.ComponentFileError as error:
        return LibraryEntry(
            str(path), None, None, 0, f"{error.path}: {error.reason}.", format="diffusers"
        )
    except BadFileError as error:
        return LibraryEntry(str(path), None, None, 0, str(error), format="diffusers")
    for file in path.rglob("*"):
        try:
            if file.is_file():
                size += file.stat().st_size
        except OSError:
            continue
        if file.suffix == SAFETENSORS_SUFFIX and file.parent.name in index:
            try:
                dtypes.extend(read_safetensors_header(file).dtypes().values())
            except BadFileError as error:
                return LibraryEntry(str(path), None, None, size, str(error), format="diffusers")
    detection = arch.detect_from_configs(index, unet, scheduler)
    dtype = stored_dtype(dtypes)
    return LibraryEntry(
        str(path),
        detection.architecture,
        dtype if dtype != "none" else None,
        size,
        None,
        format="diffusers",
        supported=detection.supported,
        detected_because=detection.because,
    )


def _components(path: Path, index: dict) -> list[Path]:
    """The component folders model_index.json names that exist (the loader reads those)."""
    return [
        path / name
        for name in sorted(index)
        if not name.startswith("_") and isinstance(index[name], list) and (path / name).is_dir()
    ]


def _folder_config(file: Path, check: Callable[[dict], None] | None = None) -> dict:
    """One JSON config of a diffusers folder, read as the loader reads it (regular files only,
    bounded size and nesting) and checked against real models' sizes; BadFileError names it."""
    try:
        config = limits.read_json_object(file)
        if check is not None:
            check(config)
    except OSError as error:
        raise BadFileError(file, f"the file cannot be read ({error.strerror or error}).") from None
    except ValueError as error:
        raise BadFileError(file, f"{error}.") from None
    return config


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
