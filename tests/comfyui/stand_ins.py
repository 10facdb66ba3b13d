"""Import-only stand-ins for torchvision and torchaudio, for tests that drive ComfyUI on a CPU.

ComfyUI imports both at module level (for families and nodes the image families never call),
and the package registry has no CPU build of either for the torch these tests pin (its
torchvision wheels link CUDA torch libraries). Any module under those names imports; anything
in it raises when called, so a test that reached them would fail loudly, never pass quietly.
Tests only: the product never installs this."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

NAMES = ("torchvision", "torchaudio")


class _StandIn:
    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attribute: str) -> _StandIn:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        return _StandIn(f"{self._name}.{attribute}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._name} is an import-only stand-in in HalfSafe's ComfyUI tests")


class _Module(types.ModuleType):
    def __getattr__(self, attribute: str):
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        return _StandIn(f"{self.__name__}.{attribute}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in NAMES:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Module(spec.name)
        module.__path__ = []
        module.__version__ = "0.0+stand-in"
        return module

    def exec_module(self, module) -> None:
        return None


def install() -> None:
    """Put the stand-ins ahead of the real packages (which do not import here)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
