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
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from app.core import architecture as arch
from app.core import paths, split
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
    format: str = "single_file"  # "single_file" | "diffusers" | "pickle" | "split_files"
    supported: bool = False  # HalfSafe can load it
    detected_because: str | None = None
    # A split transformer file (Flux.1 as ComfyUI keeps it): the companion files found beside
    # it by component (None where missing), and the sentence naming what is missing.
    companions: dict[str, str | None] | None = None
    missing: str | None = None


def default_model_folders() -> list[Path]:
    """The usual model folders of AUTOMATIC1111 (and Forge), ComfyUI and StabilityMatrix that
    exist here, plus HalfSafe's own `models` folder in its data directory."""
    home = Path.home()
    candidates = [
        home / "stable-diffusion-webui" / "models" / "Stable-diffusion",
        home / "stable-diffusion-webui-forge" / "models" / "Stable-diffusion",
        home / "sd.webui" / "webui" / "models" / "Stable-diffusion",
        *(
            comfy / "models" / folder
            for comfy in (
                home / "ComfyUI",
                home / "ComfyUI_windows_portable" / "ComfyUI",
                home / "Documents" / "ComfyUI",
            )
            # Full checkpoints, and the transformer files of split models (Flux.1).
            for folder in ("checkpoints", "diffusion_models", "unet")
        ),
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
        cached = cache.get(key)
        if stamp is not None and isinstance(cached, dict) and cached.get("stamp") == stamp:
            try:
                entry = LibraryEntry(**cached["entry"])
            except TypeError:
                entry = _inspect(path, kind)
        else:
            entry = _inspect(path, kind)
        if stamp is not None:
            fresh[key] = {"stamp": stamp, "entry": asdict(entry)}
        if entry.format == "split_files" and entry.supported:
            entry = _with_companions(entry)  # never cached: companions come and go
        entries.append(entry)
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
    if sidecar.is_file():
        try:
            sidecar_text = sidecar.read_text(encoding="utf-8", errors="replace")[:100_000]
        except OSError:
            sidecar_text = None
    dtype = stored_dtype(header.dtypes().values())
    prefix = split.flux_prefix(header.shapes())
    if prefix is not None:
        try:
            config = split.flux_transformer_config(header.shapes(), prefix)
        except ValueError as error:
            return LibraryEntry(
                str(path),
                "flux",
                dtype if dtype != "none" else None,
                size,
                None,
                format="split_files",
                detected_because=f"a Flux-style transformer HalfSafe cannot build: {error}.",
            )
        architecture, because = split.describe_flux(config, prefix)
        return LibraryEntry(
            str(path),
            architecture,
            dtype if dtype != "none" else None,
            size,
            None,
            format="split_files",
            supported=True,
            detected_because=because,
        )
    detection = arch.detect_architecture(
        header.shapes(), metadata=header.metadata, name=path.name, sidecar_config=sidecar_text
    )
    return LibraryEntry(
        str(path),
        detection.architecture,
        dtype if dtype != "none" else None,
        size,
        None,
        supported=detection.supported,
        detected_because=detection.because,
    )


def _with_companions(entry: LibraryEntry) -> LibraryEntry:
    """A split transformer file's entry with the companions found beside it (headers only)."""
    from dataclasses import replace

    path = Path(entry.path)
    try:
        shapes = read_safetensors_header(path).shapes()
        config = split.flux_transformer_config(shapes, split.flux_prefix(shapes) or "")
    except (BadFileError, ValueError):
        return entry
    needs = {
        "t5_width": config["joint_attention_dim"],
        "clip_width": config["pooled_projection_dim"],
        "latent_channels": config["in_channels"] // 4,
    }
    found = split.find_companions(path, [], None, needs)
    companions = {
        "text_encoder": str(found.clip) if found.clip else None,
        "text_encoder_2": str(found.t5) if found.t5 else None,
        "vae": str(found.vae) if found.vae else None,
    }
    missing = split.missing_sentence(found, path)
    return replace(entry, companions=companions, missing=missing, supported=missing is None)


def _inspect_folder(path: Path) -> LibraryEntry:
    size = 0
    dtypes: list[str] = []
    try:
        index = json.loads((path / "model_index.json").read_text(encoding="utf-8"))
        denoiser = "transformer" if isinstance(index, dict) and "transformer" in index else "unet"
        unet = json.loads((path / denoiser / "config.json").read_text(encoding="utf-8"))
        scheduler_file = path / "scheduler" / "scheduler_config.json"
        scheduler = (
            json.loads(scheduler_file.read_text(encoding="utf-8"))
            if scheduler_file.is_file()
            else {}
        )
        if not all(isinstance(d, dict) for d in (index, unet, scheduler)):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        return LibraryEntry(
            str(path),
            None,
            None,
            0,
            f"{path}: its model_index.json or its unet's or transformer's config.json cannot "
            f"be read ({reason}).",
            format="diffusers",
        )
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


def _index_path() -> Path:
    return paths.data_dir() / INDEX_FILE


def _load_index() -> dict[str, dict]:
    try:
        data = json.loads(_index_path().read_text(encoding="utf-8"))
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
