"""The layering rule and the cheap-import promise, checked against the real interpreter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _modules_after_import(module: str) -> set[str]:
    code = f"import sys, {module}; print('\\n'.join(sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return set(out.split())


@pytest.mark.parametrize("module", ["app.core.settings", "app.core.hardware", "app.cli"])
def test_cheap_modules_do_not_import_torch(module):
    loaded = _modules_after_import(module)
    assert "torch" not in loaded
    assert "PySide6" not in loaded


def test_core_never_imports_qt_ui_or_engine():
    offenders = []
    for path in (ROOT / "app" / "core").rglob("*.py"):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            stripped = line.strip()
            if stripped.startswith(("import ", "from ")) and any(
                name in stripped.split()[1]
                for name in ("PySide6", "app.ui", "app.engine", "app.cli")
            ):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {stripped}")
    assert offenders == []


def test_import_linter_contracts_hold():
    lint = Path(sys.executable).with_name("lint-imports")
    if not lint.exists():
        pytest.skip("import-linter is not installed in this environment")
    result = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
