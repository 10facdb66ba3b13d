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
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from app.core import architecture as arch
from app.core import limits, paths, split
from app.core.checkpoint import (
    PICKLE_SUFFIXES,
    SAFETENSORS_SUFFIX,
    read_header,
    read_safetensors_header,
    stored_dtype,
    write_json_atomic,
)
from app.core.errors import BadFileError
from app.core.jobs import CancelToken, ProgressCallback, no_progress
from app.core.quantized import SCALED_FP8_MARKER

INDEX_FILE = "library.json"
# 3: SD3.x and Chroma files are read (entries cached before said unsupported); 4: Z-Image and
# Qwen-Image transformer files are (cached before as a Lumina model or unknown).
INDEX_VERSION = 4
# The cache holds a few hundred bytes per model; 64 MB is some 100,000 models.
INDEX_LIMIT = 64 << 20
# How deep below a model folder files are listed (subfolders, symlinked ones included).
MAX_DEPTH = 6
# Directory entries looked at below one model folder: a model folder holds hundreds, a folder
# that is really a whole disk millions. Past this the folder gets a row saying so and the scan
# moves on, so a scan lists at most this many entries per folder (and never stats the rest).
MAX_FOLDER_ENTRIES = 50_000
# ComfyUI's extra_model_paths.yaml is a few KB; anything past this is not one.
MAX_YAML_BYTES = 64 << 10
# Sections of one extra_model_paths.yaml, and folders one key may name.
MAX_YAML_SECTIONS = 64
MAX_YAML_PATHS = 64
# Nesting of such a file: ComfyUI's is two levels (sections of keys), InvokeAI's three.
MAX_YAML_DEPTH = 16
APP_MODELS = "models"
# Single files the library lists: safetensors, also as ComfyUI's short `.sft` (same format), and
# GGUF (quantized transformers kept as split files).
MODEL_SUFFIXES = (SAFETENSORS_SUFFIX, ".sft", ".gguf")
# A1111 pairs `name.vae.safetensors` (or .vae.pt/.vae.ckpt) with the checkpoint `name.*`.
VAE_PAIR_SUFFIXES = (".vae.safetensors", ".vae.sft", ".vae.pt", ".vae.ckpt")

MODEL = "model"
VAE = "vae"


@dataclass(frozen=True)
class LibraryEntry:
    """One checkpoint (or VAE) found in a model folder."""

    path: str
    architecture: str | None  # "sd1", "sd2", "sdxl", "-inpaint" variants, or what else it is
    stored_dtype: str | None  # "fp16", "bf16", "fp32", "mixed"; None when not read
    size_bytes: int
    error: str | None = None  # one sentence when the file is broken
    format: str = "single_file"  # "single_file" | "diffusers" | "pickle" | "split_files"
    supported: bool = False  # HalfSafe can load it
    detected_because: str | None = None
    role: str = MODEL  # "model" | "vae": a VAE is chosen beside a model, never loaded alone
    vae: str | None = None  # the VAE A1111 pairs with this model (`name.vae.safetensors`)
    # A split transformer file (Flux.1, Chroma, SD3.x, Z-Image, Qwen-Image as ComfyUI keeps
    # them): the companion files found beside it by component (None where missing), and the
    # sentence naming what is missing.
    companions: dict[str, str | None] | None = None
    missing: str | None = None


@dataclass(frozen=True)
class ModelFolder:
    """A folder the library lists, and what its files are (models, or VAEs)."""

    path: Path
    role: str = MODEL


# Each tool's model folders below its install folder, and what they hold. ComfyUI's
# `--base-directory` has the same `models/...` layout as an install.
_LAYOUTS: dict[str, tuple[tuple[str, str], ...]] = {
    "a1111": (("models/Stable-diffusion", MODEL), ("models/VAE", VAE)),
    "comfyui": (
        ("models/checkpoints", MODEL),
        ("models/diffusers", MODEL),
        ("models/unet", MODEL),
        ("models/diffusion_models", MODEL),
        ("models/text_encoders", MODEL),
        ("models/clip", MODEL),
        ("models/vae", VAE),
    ),
    "stabilitymatrix": (("Models/StableDiffusion", MODEL), ("Models/VAE", VAE)),
}
# extra_model_paths.yaml keys the library reads (ComfyUI's folder names), and what they hold.
_COMFY_KEYS = {
    "checkpoints": MODEL,
    "diffusers": MODEL,
    "unet": MODEL,
    "diffusion_models": MODEL,
    "text_encoders": MODEL,
    "clip": MODEL,
    "loras": MODEL,
    "vae": VAE,
}
# Where the tools install, below the home folder and below each fixed drive's root on Windows:
# (tool, relative path). A `*` names the one pattern: Forge's one-click package is unpacked as
# webui_forge_cu121_torch231 and the like, found with one listing of the folder.
_INSTALLS: tuple[tuple[str, str], ...] = (
    ("a1111", "stable-diffusion-webui"),
    ("a1111", "stable-diffusion-webui-forge"),
    ("a1111", "sd.webui/webui"),
    ("a1111", "webui_forge_*/webui"),
    ("comfyui", "ComfyUI"),
    ("comfyui", "ComfyUI_windows_portable/ComfyUI"),
    ("comfyui", "Documents/ComfyUI"),
    ("stabilitymatrix", "StabilityMatrix/Data"),
    ("stabilitymatrix", "StabilityMatrix"),
    ("invokeai", "invokeai"),
)
# InvokeAI keeps models as models/<base>/<type>/...; these types are models and VAEs.
_INVOKE_TYPES = {"main": MODEL, "vae": VAE}
# Entries of a home folder or a drive's root looked at for the Forge package pattern.
_MAX_LISTING = 10_000


def default_model_folders() -> list[Path]:
    """The usual model folders of AUTOMATIC1111, Forge, ComfyUI, StabilityMatrix and InvokeAI
    that exist here (under the home folder and, on Windows, each fixed drive; ComfyUI's
    extra_model_paths.yaml included), plus HalfSafe's own `models` folder in its data
    directory. VAE folders are in `default_folders()`."""
    folders, _ = default_folders()
    return [f.path for f in folders if f.role == MODEL]


def default_folders() -> tuple[list[ModelFolder], list[LibraryEntry]]:
    """Every default folder (models and VAEs) that exists, HalfSafe's own last, and a row for
    each configuration file that could not be read (an extra_model_paths.yaml). Stats a few
    candidate paths per place and lists the home folder and each drive's root once; never
    walks a drive."""
    home = Path.home()
    installs: list[tuple[str, Path]] = []
    for base in [home, *_fixed_drives()]:
        installs.extend(_installs_in(base))
    invoke_root = os.environ.get("INVOKEAI_ROOT")
    if invoke_root:
        installs.append(("invokeai", Path(invoke_root).expanduser()))
    for folder in _app_data_folders(home):
        installs.append(("stabilitymatrix", folder / "StabilityMatrix"))
    folders: list[ModelFolder] = []
    problems: list[LibraryEntry] = []
    for tool, root in installs:
        found, trouble = _install_folders(tool, root)
        folders.extend(found)
        problems.extend(trouble)
    own = paths.data_dir() / APP_MODELS
    own.mkdir(parents=True, exist_ok=True)
    return [*_unique(folders), ModelFolder(own)], problems


def _app_data_folders(home: Path) -> list[Path]:
    if sys.platform == "win32":
        appdata = os.environ.get("APPDATA")
        return [Path(appdata)] if appdata else []
    if sys.platform == "darwin":
        return [home / "Library" / "Application Support"]
    return [Path(os.environ.get("XDG_DATA_HOME") or home / ".local" / "share")]


def _fixed_drives() -> list[Path]:
    """The roots of this computer's fixed drives on Windows (C:\\, D:\\, ...); [] elsewhere,
    where other disks are mounted below folders the user names instead."""
    if sys.platform != "win32":
        return []
    import ctypes
    import string

    kernel32 = ctypes.windll.kernel32  # type: ignore[attr-defined]
    mask = kernel32.GetLogicalDrives()
    drives = []
    for number, letter in enumerate(string.ascii_uppercase):
        root = f"{letter}:\\"
        if mask >> number & 1 and kernel32.GetDriveTypeW(root) == 3:  # DRIVE_FIXED
            drives.append(Path(root))
    return drives


def _installs_in(base: Path) -> list[tuple[str, Path]]:
    """The tools' install folders directly below `base` (a home folder or a drive's root)."""
    found: list[tuple[str, Path]] = []
    listing: list[str] | None = None
    for tool, relative in _INSTALLS:
        head, _, rest = relative.partition("/")
        if "*" in head:
            if listing is None:
                listing = _listing(base)
            prefix = head.split("*")[0].lower()
            heads = [name for name in listing if name.lower().startswith(prefix)]
        else:
            heads = [head]
        for name in heads:
            candidate = base / name / rest if rest else base / name
            if candidate.is_dir():
                found.append((tool, candidate))
    return found


def _listing(folder: Path) -> list[str]:
    names: list[str] = []
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                names.append(entry.name)
                if len(names) >= _MAX_LISTING:
                    break
    except OSError:
        return []
    return sorted(names)


def tool_of(folder: Path) -> str | None:
    """Which tool's install (or ComfyUI `--base-directory`) layout `folder` has, if any."""
    if limits.is_regular_file(folder / "invokeai.yaml"):
        return "invokeai"
    for tool, layout in _LAYOUTS.items():
        if (folder / layout[0][0]).is_dir():
            return tool
    return None


def _install_folders(tool: str, root: Path) -> tuple[list[ModelFolder], list[LibraryEntry]]:
    """The model and VAE folders of one install that exist, and a row for each configuration
    file of it that could not be read."""
    if tool == "invokeai":
        return _invoke_folders(root)
    folders = [
        ModelFolder(root / relative, role)
        for relative, role in _LAYOUTS[tool]
        if (root / relative).is_dir()
    ]
    problems: list[LibraryEntry] = []
    if tool == "comfyui":
        extra, problems = extra_model_paths(root / "extra_model_paths.yaml")
        folders.extend(f for f in extra if f.path.is_dir())
    return folders, problems


def _invoke_folders(root: Path) -> tuple[list[ModelFolder], list[LibraryEntry]]:
    """InvokeAI's models/<base>/main and models/<base>/vae folders (sd-1, sdxl, flux, ...),
    below the `models_dir` its invokeai.yaml names (default `models`, relative to the root)."""
    settings, problems = _read_yaml(root / "invokeai.yaml")
    chosen = settings.get("models_dir") if isinstance(settings, dict) else None
    models = root / "models"
    if isinstance(chosen, str) and chosen.strip():
        models = root / Path(os.path.expandvars(chosen.strip())).expanduser()
    folders = []
    for base in _listing(models)[:64]:
        for kind, role in _INVOKE_TYPES.items():
            folder = models / base / kind
            if not base.startswith(".") and folder.is_dir():
                folders.append(ModelFolder(folder, role))
    return folders, problems


def extra_model_paths(file: Path) -> tuple[list[ModelFolder], list[LibraryEntry]]:
    """The folders ComfyUI's extra_model_paths.yaml adds (its sections' base_path plus the
    checkpoints, unet, diffusion_models, vae, clip, text_encoders, loras ... keys, one folder
    per line of a multi-line value), and one row naming the file when it cannot be read.
    A missing file is no problem. Bounded as `_read_yaml` says."""
    document, problems = _read_yaml(file)
    if problems or document is None:
        return [], problems
    if not isinstance(document, dict):
        return [], [_file_problem(file, "it holds no sections of model folders")]
    folders: list[ModelFolder] = []
    for section in list(document.values())[:MAX_YAML_SECTIONS]:
        if not isinstance(section, dict):
            continue
        base = section.get("base_path")
        base_path = file.parent
        if isinstance(base, str) and base.strip():
            base_path = file.parent / Path(os.path.expandvars(base.strip())).expanduser()
        for key, role in _COMFY_KEYS.items():
            value = section.get(key)
            lines = value.splitlines() if isinstance(value, str) else []
            for line in [x.strip() for x in lines if x.strip()][:MAX_YAML_PATHS]:
                folders.append(
                    ModelFolder(base_path / Path(os.path.expandvars(line)).expanduser(), role)
                )
    return _unique(folders), []


def _read_yaml(file: Path) -> tuple[Any, list[LibraryEntry]]:
    """A tool's small YAML settings file: (document, []) or (None, [a row naming the file and
    the problem]); (None, []) when there is no such file.

    A file over MAX_YAML_BYTES is refused unread. Its events are then walked before anything
    is built (`_check_yaml_events`): aliases are refused, because merge keys (`<<: [*a, *a]`)
    copy what they name while the document is built, so a few hundred bytes of nested aliases
    cost minutes and gigabytes; so is nesting past MAX_YAML_DEPTH. Only then does the safe
    loader run (no tags, no code)."""
    import yaml

    if not file.exists():
        return None, []
    try:
        raw = limits.read_regular(file, MAX_YAML_BYTES)
        problem = _check_yaml_events(raw)
        if problem is not None:
            return None, [_file_problem(file, problem)]
        return yaml.load(raw, Loader=yaml.SafeLoader), []  # noqa: S506 - the safe loader
    except (limits.FileTooLargeError, limits.NotRegularFileError) as error:
        return None, [_file_problem(file, str(error.strerror))]
    except OSError as error:
        return None, [_file_problem(file, f"it cannot be read ({error.strerror or error})")]
    except RecursionError:
        return None, [_file_problem(file, "it is nested too deeply to be a real one")]
    except (yaml.YAMLError, ValueError, TypeError) as error:
        return None, [_file_problem(file, f"it is not valid YAML ({_yaml_problem(error)})")]


def _check_yaml_events(raw: bytes) -> str | None:
    """Why a small YAML file must not be built (aliases, nesting past MAX_YAML_DEPTH), or None.
    Walks the parser's events, which take time and memory in proportion to the file."""
    import yaml

    depth = 0
    for event in yaml.parse(raw, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.AliasEvent):
            return (
                "it uses YAML aliases (*name), which a file of model folders does not need and "
                "which can expand to billions of entries, so it is not read"
            )
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_YAML_DEPTH:
                return f"it is nested too deeply to be a real one (over {MAX_YAML_DEPTH} levels)"
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
    return None


def _yaml_problem(error: Exception) -> str:
    """What PyYAML found wrong, and where, in a few words (its own text runs to lines)."""
    problem = getattr(error, "problem", None) or type(error).__name__
    mark = getattr(error, "problem_mark", None)
    where = f" on line {mark.line + 1}" if mark is not None else ""
    return f"{str(problem)[:160]}{where}"


def _file_problem(file: Path, reason: str) -> LibraryEntry:
    return LibraryEntry(str(file), None, None, 0, f"{file}: {reason}.", format="config")


def _unique(folders: list[ModelFolder]) -> list[ModelFolder]:
    seen: set[Path] = set()
    unique = []
    for folder in folders:
        resolved = folder.path.resolve() if folder.path.exists() else folder.path
        if resolved not in seen:
            seen.add(resolved)
            unique.append(ModelFolder(resolved, folder.role))
    return unique


def _expand(folder: Path) -> tuple[list[ModelFolder], list[LibraryEntry]]:
    """A folder from the settings: an install (or ComfyUI `--base-directory`) is read as that
    tool's layout, any other folder is listed as a model folder."""
    tool = tool_of(folder) if folder.is_dir() else None
    if tool is None:
        return [ModelFolder(folder)], []
    return _install_folders(tool, folder)


def _plan(
    extra: list[str] | None, include_defaults: bool
) -> tuple[list[ModelFolder], list[LibraryEntry]]:
    if extra is None:
        from app.core.settings import load_settings

        extra = list(load_settings().settings["model_folders"] or [])
    folders: list[ModelFolder] = []
    problems: list[LibraryEntry] = []
    for given in extra or []:
        found, trouble = _expand(Path(given).expanduser())
        folders.extend(found)
        problems.extend(trouble)
    if include_defaults:
        found, trouble = default_folders()
        folders.extend(found)
        problems.extend(trouble)
    return _unique(folders), problems


def library_folders(extra: list[str] | None = None) -> list[Path]:
    """The model folders a scan covers: the settings' model folders (or `extra`; an install
    or ComfyUI base directory among them as its model folders), then the defaults; each once."""
    folders, _ = _plan(extra, True)
    return [f.path for f in folders if f.role == MODEL]


def library_roots(extra: list[str] | None = None) -> list[Path]:
    """Every folder the library lists, models and VAEs alike: the only folders where a name
    that comes from an image or a prompt may resolve (`limits.find_in_folders`)."""
    folders, _ = _plan(extra, True)
    return [f.path for f in folders]


def scan_library(
    folders: list[str] | None = None,
    *,
    include_defaults: bool = True,
    use_cache: bool = True,
    on_progress: ProgressCallback | None = None,
    cancel: CancelToken | None = None,
) -> list[LibraryEntry]:
    """List the checkpoints and VAEs under `folders` (None: the settings' model folders), plus
    the default folders (`default_folders()`) unless `include_defaults` is False.

    Safetensors files (`.safetensors`, `.sft`) get architecture and stored dtype from their
    header; diffusers folders (with model_index.json) from their configs; pickles are listed
    unopened. Files in VAE folders, named `*.vae.*`, or holding only a VAE are rows with role
    "vae"; a model with an A1111 `name.vae.*` beside it carries that VAE in `vae`. Symlinked
    subfolders are followed, each real folder once, at most MAX_DEPTH deep and
    MAX_FOLDER_ENTRIES entries per folder (a folder past that gets a row saying so). A folder
    that does not exist or cannot be read is skipped; a configuration file that cannot be read
    is a row. Sorted by path. The index is cached in `paths.data_dir()/library.json`; entries
    whose file size and time are unchanged are reused. Runs on the calling thread and checks
    `cancel` between files.
    """
    progress = on_progress or no_progress
    given = [str(f) for f in folders] if folders is not None else None
    if not include_defaults and given is None:
        given = []
    roots, problems = _plan(given, include_defaults)
    cache = _load_index() if use_cache else {}
    candidates: list[tuple[Path, str, str]] = []
    visited: set[tuple[int, int]] = set()
    listed: set[str] = set()
    for root in roots:
        found, overflow = _candidates(root.path, visited)
        for path, kind in found:
            if str(path) not in listed:
                listed.add(str(path))
                candidates.append((path, kind, root.role))
        if overflow:
            problems.append(
                LibraryEntry(
                    str(root.path),
                    None,
                    None,
                    0,
                    f"{root.path}: it holds more than {MAX_FOLDER_ENTRIES:,} files and folders, "
                    "so HalfSafe listed only the first ones; add the folders that hold your "
                    "models instead.",
                    format="folder",
                )
            )
    entries: list[LibraryEntry] = []
    fresh: dict[str, dict] = {}
    for done, (path, kind, role) in enumerate(candidates):
        if cancel is not None:
            cancel.raise_if_cancelled()
        progress("Scanning model folders", done, len(candidates))
        key = str(path)
        stamp = _stamp(path, kind)
        entry = _cached_entry(cache.get(key), stamp, key)
        if entry is None:
            entry = _inspect_one(path, kind)
        if stamp is not None:
            fresh[key] = {"stamp": stamp, "entry": asdict(entry)}
        if entry.format == "split_files" and entry.supported:
            entry = _with_companions(entry)  # never cached: companions come and go
        vae = role == VAE or _is_paired_vae_name(path.name) or entry.architecture == "vae"
        entries.append(replace(entry, role=VAE if vae else MODEL, vae=None))
    progress("Scanning model folders", len(candidates), len(candidates))
    if use_cache:
        _save_index(fresh)
    return sorted(_pair_vaes(entries) + problems, key=lambda e: e.path)


def _is_paired_vae_name(name: str) -> bool:
    return name.lower().endswith(VAE_PAIR_SUFFIXES)


def _pair_vaes(entries: list[LibraryEntry]) -> list[LibraryEntry]:
    """Give each single-file model the `name.vae.*` file beside it, as A1111 does
    (safetensors first, then the pickles, which load only when pickles are allowed)."""
    vaes = {e.path.lower(): e.path for e in entries if e.role == VAE and e.error is None}
    paired = []
    for entry in entries:
        if entry.role == MODEL and entry.format in ("single_file", "pickle"):
            path = Path(entry.path)
            stem = str(path.with_suffix(""))
            match = next(
                (vaes[(stem + s).lower()] for s in VAE_PAIR_SUFFIXES if (stem + s).lower() in vaes),
                None,
            )
            entry = replace(entry, vae=match)
        paired.append(entry)
    return paired


def _candidates(root: Path, visited: set[tuple[int, int]]) -> tuple[list[tuple[Path, str]], bool]:
    """The model files and diffusers folders below `root`, and whether the listing stopped at
    MAX_FOLDER_ENTRIES. Symlinked folders are followed as A1111, Forge and ComfyUI do; each
    real folder (device and inode, shared across roots through `visited`) is listed once, so a
    link loop ends, and nothing deeper than MAX_DEPTH is listed."""
    found: list[tuple[Path, str]] = []
    looked = 0
    pending: list[tuple[Path, int]] = [(root, 0)]
    while pending:
        here, depth = pending.pop()
        try:
            info = os.stat(here)
        except OSError:
            continue
        identity = (info.st_dev, info.st_ino) if info.st_ino else (0, hash(os.path.realpath(here)))
        if identity in visited:
            continue
        visited.add(identity)
        children = []
        try:
            with os.scandir(here) as listing:
                for child in listing:
                    looked += 1
                    if looked > MAX_FOLDER_ENTRIES:
                        return found, True
                    children.append(child)
        except OSError:
            continue  # an unreadable subfolder is left out; the rest of the scan goes on
        children.sort(key=lambda c: c.name)
        if any(c.name == "model_index.json" for c in children):
            found.append((here, "diffusers"))
            continue
        folders = []
        for child in children:
            if child.name.startswith("."):
                continue
            try:
                is_folder = child.is_dir()  # follows a symlink
            except OSError:
                continue
            lowered = child.name.lower()
            if is_folder:
                if depth < MAX_DEPTH:
                    folders.append(Path(child.path))
            elif lowered.endswith(MODEL_SUFFIXES):
                found.append((Path(child.path), "single_file"))
            elif lowered.endswith(PICKLE_SUFFIXES):
                found.append((Path(child.path), "pickle"))
        pending.extend((folder, depth + 1) for folder in reversed(folders))
    return found, False


def _stamp(path: Path, kind: str) -> list[int] | None:
    try:
        target = path / "model_index.json" if kind == "diffusers" else path
        stat = target.stat()
    except OSError:
        return None
    # As checkpoint.file_stamp: bytes copied over a file with its mtime restored change ctime.
    return [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_dev, stat.st_ino]


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
    "role": (str,),
    "vae": (str, type(None)),
    "companions": (dict, type(None)),
    "missing": (str, type(None)),
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
        header = read_header(path)
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
    # ComfyUI's `scaled_fp8` marker is bookkeeping, not a weight: a bf16 file with it is bf16.
    dtype = stored_dtype(d for n, d in header.dtypes().items() if n != SCALED_FP8_MARKER)
    layout = split.find_layout(header.shapes())
    transformer = None
    if layout is not None:
        try:
            transformer = split.read_model(header.shapes())
        except ValueError as error:
            return LibraryEntry(
                str(path),
                layout[0],
                dtype if dtype != "none" else None,
                size,
                None,
                format="split_files",
                detected_because=(
                    f"this {split.layout_words(header.shapes())} is not one HalfSafe can build: "
                    f"{error}."
                ),
            )
    if transformer is not None:
        return LibraryEntry(
            str(path),
            transformer.architecture,
            dtype if dtype != "none" else None,
            size,
            None,
            # A transformer file with companions, or an SD3.x file that holds them all.
            format="split_files" if transformer.companions else "single_file",
            supported=True,
            detected_because=transformer.because,
        )
    detection = arch.detect_architecture(
        header.shapes(), metadata=header.metadata, name=path.name, sidecar_config=sidecar_text
    )
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


def _with_companions(entry: LibraryEntry) -> LibraryEntry:
    """A split transformer file's entry with the companions found beside it (headers only).
    Whatever goes wrong on the way costs this row only: it then says so and is not loadable."""
    path = Path(entry.path)
    try:
        transformer = split.read_model(read_header(path).shapes())
        if transformer is None:
            return entry
        found = split.find_companions(path, transformer, [], None)
        missing = split.missing_sentence(transformer, found, path)
    except (BadFileError, ValueError):
        return entry
    except Exception as error:  # the promise is per row, as in `_inspect_one`
        return replace(
            entry,
            supported=False,
            missing=f"{path}: HalfSafe could not look for its text encoders and VAE "
            f"({type(error).__name__}).",
        )
    companions = {c: str(p) if p else None for c, p in found.found.items()}
    return replace(entry, companions=companions, missing=missing, supported=missing is None)


def _inspect_folder(path: Path) -> LibraryEntry:
    size = 0
    dtypes: list[str] = []
    try:
        index = _folder_config(path / "model_index.json")
        denoiser = "transformer" if "transformer" in index else "unet"
        unet = _folder_config(
            path / denoiser / "config.json",
            limits.check_unet_config if denoiser == "unet" else None,
        )
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
    for count, file in enumerate(path.rglob("*")):
        if count >= MAX_FOLDER_ENTRIES:
            break  # a real pipeline folder holds some 20 files; the size stays a lower bound
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
