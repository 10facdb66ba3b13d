"""Lazy re-exports for the core packages' `__init__`s, so that importing one small module does
not import the whole package.

Why: importing `app.core.health.words` runs `app/core/health/__init__.py` first. When that file
imported every module it re-exports, the GUI, which reads a handful of records and word tables,
imported most of `app.core` before its window could show, against its launch budget (the window
within 0.2 s of a bare PySide6 one, `benchmarks/gui_launch.py`). Each package's `__init__` now
lists its exports here and a module is imported the first time one of its names is read (PEP
562's module `__getattr__`). The same names are imported under `if TYPE_CHECKING:` for pyright
and for readers, and `__getattr__` is defined under `if not TYPE_CHECKING:`, since pyright
accepts any name from a module that has one. Those imports keep the static import graph that
import-linter checks as it was: imports still point only down.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def lazy_exports(
    namespace: dict[str, Any], exports: Mapping[str, Iterable[str]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The `__getattr__` and `__dir__` of a package whose `__init__` passes its `globals()` and
    `exports`: each module (absolute, or relative to the package as ".check") with the names
    taken from it, written as in an import statement ("Runner as _Runner" for an alias).

    A name is imported on first read and kept in the package's namespace, so later reads, and a
    test's `monkeypatch.setattr` on the package, behave as with a plain import. A submodule not
    yet imported is imported when read as an attribute (`library.index`), as when the `__init__`
    imported every module. Any other name raises AttributeError naming the package. Thread-safe
    as imports are; no side effects beyond the imports.
    """
    package = namespace["__name__"]
    sources: dict[str, tuple[str, str]] = {}
    for module, names in exports.items():
        for entry in names:
            original, _, alias = entry.partition(" as ")
            sources[alias or original] = (module, original)

    def __getattr__(name: str) -> Any:
        if name in sources:
            module, original = sources[name]
            value = getattr(importlib.import_module(module, package), original)
        elif name.isidentifier() and importlib.util.find_spec(f"{package}.{name}") is not None:
            value = importlib.import_module(f"{package}.{name}")
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *sources})

    return __getattr__, __dir__
