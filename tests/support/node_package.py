"""The ComfyUI node package's modules imported as ComfyUI imports them, without ComfyUI: the
package's folder as a package whose `__init__` is not run (it imports the nodes, which need
ComfyUI), so that a module whose ComfyUI imports sit inside its functions can be tested alone
(the store, the parts' verdicts)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

PACKAGE = Path(__file__).resolve().parents[2] / "comfyui-halfsafe"
NAME = "halfsafe_nodes_under_test"


def node_module(module: str) -> ModuleType:
    """The package's module `module` ("store", "parts")."""
    if NAME not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            NAME, PACKAGE / "__init__.py", submodule_search_locations=[str(PACKAGE)]
        )
        assert spec is not None
        sys.modules[NAME] = importlib.util.module_from_spec(spec)  # its __init__ not run
    return importlib.import_module(f"{NAME}.{module}")
