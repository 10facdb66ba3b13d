"""The core packages export their names lazily (app/core/lazy.py): every name resolves to its
module's own object, the lazy tables say what the `if TYPE_CHECKING:` imports say (what pyright
and readers see), and the records the GUI reads import without the engine's side of core."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.window_imports import BESIDE_THE_RECORDS, ENGINE_SIDE, THIRD_PARTY

ROOT = Path(__file__).resolve().parents[2]

PACKAGES = [
    "app.core.architecture",
    "app.core.checkpoint",
    "app.core.explain",
    "app.core.families",
    "app.core.generation",
    "app.core.hardware",
    "app.core.health",
    "app.core.library",
    "app.core.models",
    "app.core.precision",
    "app.core.settings",
]

# What the window's process imports at launch: the job records, the engine's messages, the
# words and records the pages show.
GUI_RECORDS = [
    "app.engine.events",
    "app.core.requests.records",
    "app.core.models.summary",
    "app.core.health.words",
    "app.core.health.report",
    "app.core.generation.records",
    "app.core.hardware.records",
    "app.core.settings",
    "app.core.formats.weight_findings",
    "app.core.fixing.remembered_fix",
    "app.core.lora.request",
    "app.core.hardware.selftest_records",
    "app.core.identities",
]


def _run(code: str) -> object:
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def _typed_imports(package: str) -> dict[str, tuple[str, str]]:
    """The names the package's `if TYPE_CHECKING:` block imports: {name: (module, original)}."""
    init = ROOT / Path(*package.split(".")) / "__init__.py"
    names = {}
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for imported in node.body:
                assert isinstance(imported, ast.ImportFrom) and imported.module
                for alias in imported.names:
                    names[alias.asname or alias.name] = (imported.module, alias.name)
    return names


def _defined_in_init(package: str) -> set[str]:
    init = ROOT / Path(*package.split(".")) / "__init__.py"
    defined = set()
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            defined |= {target.id for target in node.targets if isinstance(target, ast.Name)}
    return defined


@pytest.mark.parametrize("package", PACKAGES)
def test_every_export_is_its_modules_own_object(package):
    module = importlib.import_module(package)
    typed = _typed_imports(package)
    assert typed, f"{package} has no TYPE_CHECKING imports to check against"
    # __all__ is what the TYPE_CHECKING block imports plus what the __init__ defines itself.
    assert set(module.__all__) == set(typed) | (set(module.__all__) & _defined_in_init(package))
    for name, (source, original) in typed.items():
        assert getattr(module, name) is getattr(importlib.import_module(source), original), name
        assert name in dir(module)
    namespace: dict[str, object] = {}
    exec(f"from {package} import *", namespace)
    assert set(module.__all__) <= set(namespace)


def test_the_lazy_tables_are_the_type_checking_imports():
    # In a fresh process nothing is resolved yet, so the names dir() lists beyond the module's
    # namespace are exactly its lazy table.
    code = (
        "import importlib, json\n"
        f"packages = {PACKAGES!r}\n"
        "tables = {}\n"
        "for name in packages:\n"
        "    module = importlib.import_module(name)\n"
        "    tables[name] = sorted(set(dir(module)) - set(vars(module)))\n"
        "print(json.dumps(tables))\n"
    )
    tables = _run(code)
    assert tables == {package: sorted(_typed_imports(package)) for package in PACKAGES}


def test_an_unknown_name_is_an_attribute_error_naming_the_package():
    health = importlib.import_module("app.core.health")
    with pytest.raises(AttributeError, match="module 'app.core.health' has no attribute 'chek'"):
        _ = health.chek
    with pytest.raises(ImportError, match="chek"):
        exec("from app.core.health import chek", {})
    assert not hasattr(health, "chek")


def test_a_submodule_read_as_an_attribute_is_imported_as_before():
    code = (
        "import json, sys\n"
        "import app.core.library as library\n"
        "before = 'app.core.library.index' in sys.modules\n"
        "found = library.index is sys.modules['app.core.library.index']\n"
        "print(json.dumps([before, found]))\n"
    )
    assert _run(code) == [False, True]


def test_a_patched_export_is_what_callers_read_until_undone(monkeypatch):
    # Callers name the function through the package at call time
    # (`hardware.describe_device(...)`); a test's patch must reach them as with a plain import.
    hardware = importlib.import_module("app.core.hardware")
    original = importlib.import_module("app.core.hardware.devices").describe_device

    def fake(device):
        return "fake"

    with monkeypatch.context() as patch:
        patch.setattr(hardware, "describe_device", fake)
        from app.core.hardware import describe_device

        assert describe_device is fake and hardware.describe_device("cpu") == "fake"
    assert hardware.describe_device is original


def test_the_records_the_gui_reads_leave_the_engine_side_of_core_unimported():
    code = (
        "import json, sys\n"
        f"for name in {GUI_RECORDS!r}:\n"
        "    __import__(name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    loaded = set(_run(code))
    assert loaded & THIRD_PARTY == set()
    assert loaded & ENGINE_SIDE == set()
    assert loaded & BESIDE_THE_RECORDS == set()


def test_the_modules_beside_the_records_exist():
    # A misspelt name would make the check above pass whatever the records import.
    for name in sorted(BESIDE_THE_RECORDS | ENGINE_SIDE):
        assert importlib.util.find_spec(name) is not None, name


@pytest.mark.parametrize(
    ("old", "light", "names"),
    [
        ("app.core.checkpoint.scan", "app.core.formats.weight_findings", ["WeightScan"]),
        ("app.core.checkpoint", "app.core.formats.weight_findings", ["WeightScan"]),
        ("app.core.formats.quantized", "app.core.formats.weight_findings", ["QuantFinding"]),
        ("app.core.fixing.profiles", "app.core.fixing.remembered_fix", ["RememberedFix"]),
        ("app.core.lora.files", "app.core.lora.request", ["LoraRequest"]),
        (
            "app.core.hardware.selftest",
            "app.core.hardware.selftest_records",
            ["OpResult", "SelfTestResult"],
        ),
    ],
)
def test_a_moved_record_is_still_read_where_it_was(old, light, names):
    for name in names:
        assert getattr(importlib.import_module(old), name) is getattr(
            importlib.import_module(light), name
        )
