"""Which folders the library lists: the usual AUTOMATIC1111, Forge, ComfyUI, StabilityMatrix
and InvokeAI model and VAE folders found on this computer (home folder and fixed drives, by
candidate paths, never a walk), the folders ComfyUI's extra_model_paths.yaml adds, the folders
from the settings, and HalfSafe's own.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from app.core import limits, paths
from app.core.library.entries import MODEL, VAE, LibraryEntry, ModelFolder
from app.core.library.yaml_files import (
    MAX_YAML_PATHS,
    MAX_YAML_SECTIONS,
    _file_problem,
    _read_yaml,
)

APP_MODELS = "models"

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


def tool_installs(tool: str, extra: list[str] | None = None) -> list[Path]:
    """The install folders of `tool` ("comfyui", ...) the library finds: the settings' model
    folders (or `extra`) that have its layout, then the usual places; each once."""
    if extra is None:
        from app.core.settings import load_settings

        extra = list(load_settings().settings["model_folders"] or [])
    given = [Path(f).expanduser() for f in extra or []]
    found = [f for f in given if f.is_dir() and tool_of(f) == tool]
    for base in [Path.home(), *_fixed_drives()]:
        found.extend(root for kind, root in _installs_in(base) if kind == tool)
    unique: dict[Path, None] = {}
    for folder in found:
        unique.setdefault(folder.resolve(), None)
    return list(unique)


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
