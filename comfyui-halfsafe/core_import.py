"""HalfSafe's core beside ComfyUI's own `app` package.

HalfSafe's core is the package `app.core`; ComfyUI's server has a top-level package named `app`
too (its logger, user and model managers), imported before any custom node. Whichever `app`
Python found first would hide the other, and the nodes could not import the core. So the folder
of HalfSafe's `app` is added to the search path of the `app` that is imported: ComfyUI's own
modules are still found first, and the names only HalfSafe has (`app.core`) are found in
HalfSafe's folder. Imports nothing heavy (no torch)."""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.metadata
import sys
from pathlib import Path

MARK = Path("core", "hooks.py")  # a file only HalfSafe's `app` holds


def join() -> bool:
    """Make `app.core` HalfSafe's core in this process; False where HalfSafe is not installed
    in this Python (the nodes then say so, one sentence, when they run)."""
    folder = _halfsafe_app()
    if folder is None:
        return False
    app = importlib.import_module("app")
    locations = getattr(app, "__path__", None)
    if locations is None:
        return False
    if all(Path(entry).resolve() != folder for entry in locations):
        locations.append(str(folder))
    if not hasattr(app, "__version__"):  # HalfSafe's reports and records name its version
        try:
            app.__version__ = importlib.metadata.version("halfsafe")
        except importlib.metadata.PackageNotFoundError:
            app.__version__ = "0"
    return True


def _halfsafe_app() -> Path | None:
    """The folder of HalfSafe's `app` package, wherever this Python finds packages: on its
    path, or through an installer's own finder (an editable install)."""
    finders = [
        finder.find_spec
        for finder in sys.meta_path
        if finder is not importlib.machinery.PathFinder and hasattr(finder, "find_spec")
    ]
    specs = []
    for find in finders:
        try:
            specs.append(find("app", None))
        except (ImportError, TypeError, ValueError, AttributeError):
            continue  # a finder that cannot answer for a top-level name
    specs += [importlib.machinery.PathFinder.find_spec("app", [str(p)]) for p in sys.path]
    for spec in specs:
        for location in getattr(spec, "submodule_search_locations", None) or []:
            if (Path(location) / MARK).is_file():
                return Path(location).resolve()
    return None
