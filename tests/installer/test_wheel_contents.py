"""HalfSafe installed as a wheel (how a ComfyUI environment gets its core) carries every file
shipped in app/resources/: the quirks table, configs, vocabularies, demo weights and guide that
a checkout reads in place. Without them the nodes' checks ended in "No such file" once the
check tried to remember its fix."""

from __future__ import annotations

import subprocess
import sys
import zipfile

import pytest

from app.core import paths

pytestmark = pytest.mark.slow


def test_the_wheel_ships_every_resource(tmp_path):
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(paths.TREE), "--no-deps"]
        + ["--no-build-isolation", "-q", "-w", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = tmp_path.glob("halfsafe-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        inside = set(archive.namelist())
    shipped = {
        p.relative_to(paths.TREE).as_posix()
        for p in paths.RESOURCES.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert "app/resources/quirks.json" in shipped
    assert shipped <= inside, sorted(shipped - inside)[:10]
