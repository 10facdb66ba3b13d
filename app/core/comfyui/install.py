"""HalfSafe's ComfyUI node package copied into a ComfyUI's custom_nodes folder, and the one
thing the user must then do: install HalfSafe's core into that ComfyUI's Python, with the exact
pip command for it (ComfyUI portable's python_embeded, ComfyUI Desktop's .venv, a source
install's venv).

A ComfyUI folder is a source or portable install (ComfyUI's main.py beside its comfy package),
the portable build's outer folder (ComfyUI/ and python_embeded/ inside), or ComfyUI Desktop's
base folder (custom_nodes/ beside models/; its code lives in the app). The package is copied
whole, beside the folder first and then renamed into place, so ComfyUI never finds half of it;
an earlier copy of it is replaced, any other folder of that name is left alone. No torch."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from app.core import limits, paths
from app.core.errors import HalfSafeError
from app.core.words.nodes import NODE_WORDS, PACKAGE

CUSTOM_NODES = "custom_nodes"
# The node package's pyproject names it so; a folder of that name without it is not ours.
_PACKAGE_NAME = f'name = "{PACKAGE}"'
_PYPROJECT_BYTES = 64 * 1024
# Each ComfyUI layout's Python, below the ComfyUI folder: (path parts, whether it is the
# portable build's embedded Python, which its own instructions run with -s).
_PYTHONS: tuple[tuple[tuple[str, ...], bool], ...] = (
    (("..", "python_embeded", "python.exe"), True),
    ((".venv", "Scripts", "python.exe"), False),
    ((".venv", "bin", "python"), False),
    (("venv", "Scripts", "python.exe"), False),
    (("venv", "bin", "python"), False),
)


@dataclass(frozen=True)
class Installed:
    """Where the node package now is, and the pip command that installs HalfSafe's core into
    that ComfyUI's Python (`python_known`: the command names that Python's file)."""

    comfyui: Path
    target: Path
    command: list[str]
    python_known: bool

    @property
    def words(self) -> str:
        key = "installed" if self.python_known else "installed_python_unknown"
        return NODE_WORDS[key].format(target=self.target, command=command_line(self.command))

    def to_json(self) -> dict:
        return {
            "comfyui": str(self.comfyui),
            "installed": str(self.target),
            "command": list(self.command),
            "python_known": self.python_known,
            "message": self.words,
        }


def package_folder() -> Path:
    """The node package beside HalfSafe's own folders (the source tree's, or the frozen
    build's bundle, which keeps that layout)."""
    return paths.TREE / PACKAGE


def comfyui_folder(path: Path) -> Path | None:
    """The ComfyUI folder `path` is (see the module's docstring), or None."""
    if not path.is_dir():
        return None
    if limits.is_regular_file(path / "main.py") and (path / "comfy").is_dir():
        return path
    inner = path / "ComfyUI"
    if (path / "python_embeded").is_dir() and limits.is_regular_file(inner / "main.py"):
        return inner
    if (path / CUSTOM_NODES).is_dir() and (path / "models").is_dir():
        return path
    return None


def found_comfyuis(extra: list[str] | None = None) -> list[Path]:
    """The ComfyUI folders the library finds (the usual places and the settings' folders)."""
    from app.core.library.folders import tool_installs

    found = (comfyui_folder(f) for f in tool_installs("comfyui", extra))
    return list(dict.fromkeys(f for f in found if f is not None))


def where_to_install(path: str | Path | None, extra: list[str] | None = None) -> Path:
    """The ComfyUI folder to install into: `path`'s, or the one the library found. Raises
    HalfSafeError with one sentence for a path that is not one, or none or several found."""
    if path is not None:
        root = comfyui_folder(Path(path).expanduser())
        if root is None:
            raise HalfSafeError(NODE_WORDS["not_comfyui"].format(path=path))
        return root
    found = found_comfyuis(extra)
    if not found:
        raise HalfSafeError(NODE_WORDS["none_found"].format(package=PACKAGE))
    if len(found) > 1:
        raise HalfSafeError(NODE_WORDS["several"].format(found=", ".join(map(str, found))))
    return found[0]


def install_nodes(path: str | Path | None = None, extra: list[str] | None = None) -> Installed:
    """Copy the node package into the ComfyUI at `path` (or the one found) and say what the
    user must do next. Raises HalfSafeError with one sentence where it cannot."""
    root = where_to_install(path, extra)
    source = package_folder()
    if not limits.is_regular_file(source / "nodes.py"):
        raise HalfSafeError(NODE_WORDS["no_package"].format(folder=source, package=PACKAGE))
    custom = root / CUSTOM_NODES
    target = custom / PACKAGE
    if target.is_symlink() and target.resolve() == source.resolve():
        return _installed(root, target)  # linked to this very package: nothing to copy
    if (target.exists() or target.is_symlink()) and not _ours(target):
        raise HalfSafeError(NODE_WORDS["taken"].format(target=target))
    try:
        custom.mkdir(exist_ok=True)
        _copy_into_place(source, target)
    except OSError as error:
        problem = error.strerror or str(error)
        raise HalfSafeError(
            NODE_WORDS["not_written"].format(folder=custom, problem=problem)
        ) from None
    return _installed(root, target)


def _ours(target: Path) -> bool:
    """Whether `target` is an earlier copy of the node package (its pyproject names it)."""
    if target.is_symlink() or not target.is_dir():
        return False
    pyproject = target / "pyproject.toml"
    if not limits.is_regular_file(pyproject):
        return False
    try:
        with open(pyproject, "rb") as file:
            head = file.read(_PYPROJECT_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return False
    return _PACKAGE_NAME in head


def _copy_into_place(source: Path, target: Path) -> None:
    """The package copied beside `target`, then renamed onto it (an earlier copy moved aside
    first and removed once the new one is in place)."""
    staging = Path(tempfile.mkdtemp(prefix=".halfsafe-", dir=target.parent))
    try:
        fresh = staging / PACKAGE
        shutil.copytree(source, fresh, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        old = staging / "previous"
        if target.exists():
            os.replace(target, old)
        try:
            os.replace(fresh, target)
        except OSError:
            if old.exists():
                os.replace(old, target)  # the earlier copy back where it was
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _installed(root: Path, target: Path) -> Installed:
    python, embedded = _python_of(root)
    core = _core_source()
    if python is None:
        return Installed(root, target, ["python", "-m", "pip", "install", core], False)
    flags = ["-s"] if embedded else []
    return Installed(root, target, [str(python), *flags, "-m", "pip", "install", core], True)


def _python_of(root: Path) -> tuple[Path | None, bool]:
    """The Python that runs the ComfyUI at `root`, where its layout says (see _PYTHONS)."""
    for parts, embedded in _PYTHONS:
        candidate = root.joinpath(*parts)
        if candidate.is_file():
            return Path(os.path.normpath(candidate)), embedded
    return None, False


def _core_source() -> str:
    """What pip installs as HalfSafe's core: this HalfSafe's own source folder where it runs
    from one (its window is an extra, left out). HalfSafe is not on the package registry, so a
    frozen build, which has no source folder, names the folder for the user to fill in."""
    folder = paths.TREE
    pyproject = folder / "pyproject.toml"
    try:
        named = limits.is_regular_file(pyproject) and 'name = "halfsafe"' in pyproject.read_text(
            encoding="utf-8", errors="replace"
        )
    except OSError:
        named = False
    return str(folder) if named else "<HalfSafe's source folder>"


def command_line(parts: list[str]) -> str:
    """A command as one line to paste in a terminal: parts with spaces quoted."""
    return " ".join(f'"{p}"' if " " in p or not p else p for p in parts)
