"""The tests' own layout: no file under tests/ imports a test module (a `test_*.py` file). What
more than one test module uses (functions, fixtures, constants, classes) lives in tests/support/,
named for what it holds; a test module imported by another runs twice under two names and ties
the two together.

The checker is first run on a planted violation, so that a checker that found nothing would
fail here rather than pass over the tree."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _is_test_module(name: str) -> bool:
    """Whether the dotted module name names a test module (its last part `test_...`)."""
    return name.rpartition(".")[2].startswith("test_")


def imports_of_test_modules(tree: ast.AST, where: str) -> list[str]:
    """file:line: module of each import of a test module in `tree`, in every form: `import
    tests.core.test_x`, `from tests.core.test_x import a`, `from tests.core import test_x`, the
    bare `from test_x import a` that pytest's rootdir import allows, relative imports, and
    `importlib.import_module` of a literal name."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if _is_test_module(a.name)]
        elif isinstance(node, ast.ImportFrom):
            source = "." * node.level + (node.module or "")
            if node.module and _is_test_module(node.module):
                found.append((node.lineno, source))
            else:
                base = source if source.endswith(".") else source + "."
                found += [
                    (node.lineno, base + a.name) for a in node.names if _is_test_module(a.name)
                ]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, (ast.Attribute, ast.Name))
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id)
            == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and _is_test_module(node.args[0].value)
        ):
            found.append((node.lineno, node.args[0].value))
    return [f"{where}:{line}: {name}" for line, name in sorted(found)]


def imports_of_test_modules_under(root: Path) -> list[str]:
    """Each import of a test module by a Python file under `root`/tests."""
    found = []
    for path in sorted((root / "tests").rglob("*.py")):
        where = path.relative_to(root).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=where)
        found += imports_of_test_modules(tree, where)
    return found


def _plant(root: Path, where: str, source: str) -> None:
    path = root / where
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source, encoding="utf-8")


def test_no_test_module_is_imported_by_another_file_under_tests(tmp_path):
    _plant(
        tmp_path,
        "tests/core/test_planted.py",
        "import pytest\n"
        "from tests.support.tiny_models import build_tiny_sd_pipeline\n"
        "from tests.ui.conftest import DEMO_SUMMARY\n"
        "from tests.core.test_health import loaded, plant\n"
        "from test_signatures import decoded_noise  # noqa: F401\n"
        "from tests.core import test_families as families, tiny\n"
        "import tests.ui.test_gallery\n"
        "from .test_edit import request\n"
        "from . import test_lora\n"
        "def test_it():\n"
        "    from tests.core.test_quantized import flux_gguf\n"
        "    return importlib.import_module('tests.core.test_looks')\n",
    )
    _plant(tmp_path, "tests/support/planted.py", "from tests.core.test_pictures import model\n")
    _plant(tmp_path, "tests/support/honest.py", "from tests.support import testing, tests\n")
    assert imports_of_test_modules_under(tmp_path) == [
        "tests/core/test_planted.py:4: tests.core.test_health",
        "tests/core/test_planted.py:5: test_signatures",
        "tests/core/test_planted.py:6: tests.core.test_families",
        "tests/core/test_planted.py:7: tests.ui.test_gallery",
        "tests/core/test_planted.py:8: .test_edit",
        "tests/core/test_planted.py:9: .test_lora",
        "tests/core/test_planted.py:11: tests.core.test_quantized",
        "tests/core/test_planted.py:12: tests.core.test_looks",
        "tests/support/planted.py:1: tests.core.test_pictures",
    ]

    offenders = imports_of_test_modules_under(ROOT)
    assert not offenders, (
        "a file under tests/ imports a test module (move what it takes to tests/support/, in a "
        "module named for what it holds): " + ", ".join(offenders)
    )
