"""The Linux launcher for real: a copy of the app in a temporary folder, set up from nothing.

One real install (torch from HALFSAFE_TORCH_SPEC=torch==2.13.0, the rest from pip's indexes and
cache), then the starts a user makes afterwards: a plain restart, the health check, a restart
after damage and after an interrupted install. About a minute and a half on two cores.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from installer_bootstrap import ROOT
from installer_bootstrap import bootstrap as bs

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sys.platform == "win32", reason="runs the Linux/macOS shell launcher"),
]

SPEC = os.environ.get("HALFSAFE_TEST_TORCH_SPEC", "torch==2.13.0")


def copy_app(target: Path) -> None:
    """The app's files as a fresh checkout would have them (tracked and new files, no build output)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=False,
    )
    if listed.returncode == 0:
        for name in filter(None, listed.stdout.decode().split("\0")):
            source = ROOT / name
            if source.is_file():
                (target / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target / name)
    else:  # not a git checkout (an unpacked archive)
        shutil.copytree(
            ROOT,
            target,
            dirs_exist_ok=True,
            ignore=shutil.ignore_patterns(
                ".git", ".venv", "*.egg-info", "__pycache__", ".*_cache", "build"
            ),
        )


class Launcher:
    def __init__(self, app: Path, home: Path) -> None:
        self.app = app
        self.logs = home / "logs"
        self.env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith("HALFSAFE_") and key not in ("VIRTUAL_ENV", "PYTHONPATH")
        }
        self.env.update(
            HALFSAFE_TORCH_SPEC=SPEC,
            HALFSAFE_LOG_DIR=str(self.logs),
            HALFSAFE_CONFIG_DIR=str(home / "config"),
            HALFSAFE_DATA_DIR=str(home / "data"),
            HALFSAFE_CACHE_DIR=str(home / "cache"),
            HF_HOME=str(home / "hf"),
            HF_HUB_OFFLINE="1",
            HALFSAFE_NO_DESKTOP_ENTRY="1",
        )

    def run(self, *args: str, timeout: float = 600) -> tuple[subprocess.CompletedProcess, float]:
        started = time.monotonic()
        result = subprocess.run(
            ["sh", str(self.app / "installer" / "halfsafe.sh"), *args],
            cwd=self.app,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        return result, time.monotonic() - started

    def last_log_section(self) -> str:
        return (self.logs / "setup.log").read_text().rsplit("\n=== ", 1)[-1]

    @property
    def venv(self) -> Path:
        return self.app / ".venv"


@pytest.fixture(scope="module")
def launcher(tmp_path_factory):
    app = tmp_path_factory.mktemp("app")
    copy_app(app)
    launcher = Launcher(app, tmp_path_factory.mktemp("home"))
    result, seconds = launcher.run("--version")
    launcher.first = (result, seconds, launcher.last_log_section())
    print(f"first start (full install): {seconds:.0f} s")
    return launcher


def test_first_start_sets_up_and_runs_the_command(launcher):
    result, seconds, log = launcher.first
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"halfsafe {bs.read_app_version(launcher.app)}"
    # Setup talks on stderr only, so `--json` output stays clean.
    assert "Installing PyTorch" in result.stderr
    assert "running pip" in log and "--index-url" not in log
    marker = bs.read_marker(launcher.venv)
    assert marker["torch_installed"].startswith(SPEC.split("==")[-1])
    assert marker["app_dir"] == str(launcher.app)
    # The app runs from the copy (editable install), so app/resources/ is found next to it.
    where = subprocess.run(
        [
            str(launcher.venv / "bin" / "python"),
            "-c",
            "import app.core.paths as p; print(p.RESOURCES)",
        ],
        capture_output=True,
        text=True,
        cwd="/",
        env=launcher.env,
        check=True,
    )
    assert Path(where.stdout.strip()) == launcher.app / "app" / "resources"


def test_second_start_is_a_no_op(launcher):
    marker = launcher.venv / bs.MARKER_NAME
    before = marker.stat().st_mtime_ns
    result, seconds = launcher.run("--version")
    print(f"second start: {seconds:.2f} s")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("halfsafe ")
    assert result.stderr == ""
    log = launcher.last_log_section()
    assert "ready, nothing to install" in log
    assert "running pip" not in log
    assert marker.stat().st_mtime_ns == before
    assert seconds < 20, f"a start with nothing to install took {seconds:.1f} s"


def test_check_demo_runs_through_the_launcher(launcher):
    if not (launcher.app / "app" / "core" / "health" / "__init__.py").exists():
        pytest.skip("app/core/health/ (the `check` command's core) is not in this checkout yet")
    result, seconds = launcher.run("check", "demo", "--json")
    print(f"check demo: {seconds:.1f} s")
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert report["verdict"] == "healthy"
    assert report["model"]["format"] == "demo"
    assert "running pip" not in launcher.last_log_section()


def test_damaged_package_is_repaired_on_the_next_start(launcher):
    purelib = subprocess.run(
        [
            str(launcher.venv / "bin" / "python"),
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    damaged = Path(purelib) / "safetensors" / "__init__.py"
    damaged.unlink()
    result, seconds = launcher.run("--version")
    print(f"start with a damaged package: {seconds:.1f} s")
    assert result.returncode == 0, result.stderr
    assert "Repairing damaged packages: safetensors" in result.stderr
    assert damaged.exists()
    assert "--force-reinstall" in launcher.last_log_section()


def test_interrupted_install_is_finished_on_the_next_start(launcher):
    (launcher.venv / bs.MARKER_NAME).unlink()  # what an install stopped half-way leaves behind
    result, seconds = launcher.run("--version")
    print(f"start after an interrupted install: {seconds:.1f} s")
    assert result.returncode == 0, result.stderr
    assert "interrupted" in result.stderr
    pip_runs = [
        shlex.split(line.split("running pip: ", 1)[1])
        for line in launcher.last_log_section().splitlines()
        if "running pip: " in line
    ]
    assert pip_runs, "the install was not finished"
    # torch was already there and fits: it is pinned as installed, never asked for again.
    assert all(SPEC not in command for command in pip_runs)
    assert any("-e" in command for command in pip_runs)
    assert bs.read_marker(launcher.venv) is not None
    again, _ = launcher.run("--version")
    assert again.returncode == 0 and "running pip" not in launcher.last_log_section()
