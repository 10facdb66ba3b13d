"""The launchers themselves: no display, no Python, the desktop entry, the Windows and macOS files."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import time

import pytest
from installer_bootstrap import ROOT
from installer_bootstrap import bootstrap as bs

INSTALLER = ROOT / "installer"


def headless_env(tmp_path):
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")
    }
    env["HALFSAFE_LOG_DIR"] = str(tmp_path / "logs")
    env["HALFSAFE_VENV"] = str(tmp_path / "venv")
    return env


@pytest.mark.skipif(sys.platform == "win32", reason="the shell launcher is for Linux and macOS")
def test_no_display_says_so_and_points_to_the_command_line(tmp_path):
    started = time.monotonic()
    result = subprocess.run(
        ["sh", str(INSTALLER / "halfsafe.sh")],
        env=headless_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == bs.EXIT_CANNOT_RUN
    assert "no display" in result.stderr
    assert "check demo" in result.stderr and " gpu" in result.stderr
    assert "Traceback" not in result.stderr
    # It stops before any setup: no environment, no log.
    assert not (tmp_path / "venv").exists()
    assert not (tmp_path / "logs").exists()
    assert time.monotonic() - started < 30


def test_no_display_check_imports_neither_qt_nor_torch(tmp_path):
    result = subprocess.run(
        [sys.executable, "-X", "importtime", str(INSTALLER / "bootstrap.py")],
        env={**headless_env(tmp_path), "PYTHONPATH": ""},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == bs.EXIT_CANNOT_RUN
    imported = {
        line.split("|")[-1].strip()
        for line in result.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert "json" in imported  # the import log is really there
    assert not any(name.split(".")[0] in ("PySide6", "torch", "app") for name in imported)


def test_display_problem_only_on_systems_that_need_one():
    assert bs.display_problem("Linux", {}, "x") is not None
    assert bs.display_problem("FreeBSD", {}, "x") is not None
    assert bs.display_problem("Linux", {"WAYLAND_DISPLAY": "wayland-0"}, "x") is None
    assert bs.display_problem("Linux", {"DISPLAY": ":0"}, "x") is None
    assert bs.display_problem("Linux", {"QT_QPA_PLATFORM": "offscreen"}, "x") is None
    assert bs.display_problem("Darwin", {}, "x") is None
    assert bs.display_problem("Windows", {}, "x") is None


@pytest.mark.skipif(sys.platform == "win32", reason="the shell launcher is for Linux and macOS")
def test_no_python_is_one_sentence(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "dirname").symlink_to(shutil.which("dirname"))
    result = subprocess.run(
        ["/bin/sh", str(INSTALLER / "halfsafe.sh"), "gpu"],
        env={"PATH": str(bin_dir), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == bs.EXIT_SETUP_FAILED
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("HalfSafe needs Python 3.10 or newer and none was found")
    assert "python.org" in lines[0]


@pytest.mark.skipif(sys.platform == "win32", reason="the shell launcher is for Linux and macOS")
def test_where_and_setup_help_need_no_setup(tmp_path):
    env = headless_env(tmp_path)
    where = subprocess.run(
        ["sh", str(INSTALLER / "halfsafe.sh"), "--where"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert where.returncode == 0
    assert where.stdout.strip() == str(tmp_path / "venv")
    usage = subprocess.run(
        ["sh", str(INSTALLER / "halfsafe.sh"), "--setup-help"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert usage.returncode == 0
    assert "--setup-only" in usage.stdout and "HALFSAFE_TORCH_SPEC" in usage.stdout
    assert not (tmp_path / "venv").exists()


def test_desktop_entry_has_absolute_paths_and_the_icon(tmp_path):
    env = {"HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path / "share")}
    entry = bs.install_desktop_entry(ROOT, env)
    assert entry == tmp_path / "share" / "applications" / "halfsafe.desktop"
    fields = dict(line.split("=", 1) for line in entry.read_text().splitlines() if "=" in line)
    assert fields["Type"] == "Application"
    assert fields["Terminal"] == "false"
    icon = fields["Icon"]
    assert os.path.isabs(icon) and os.path.exists(icon) and icon.endswith(".png")
    launcher = fields["Exec"].strip('"').replace("\\\\", "\\")
    assert launcher == str(INSTALLER / "halfsafe.sh") or fields["Exec"].startswith('"')
    assert "@" not in fields["Exec"] + icon
    validate = shutil.which("desktop-file-validate")
    if validate:
        result = subprocess.run([validate, str(entry)], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr


def test_desktop_exec_quoting_follows_the_specification():
    assert (
        bs.desktop_exec_quote("/opt/halfsafe/installer/halfsafe.sh")
        == "/opt/halfsafe/installer/halfsafe.sh"
    )
    # Quoted for the Exec rules, then each backslash doubled for the file's string escaping.
    assert bs.desktop_exec_quote("/home/a b/halfsafe.sh") == '"/home/a b/halfsafe.sh"'
    assert bs.desktop_exec_quote('/home/$x"y/h.sh') == '"/home/\\\\$x\\\\"y/h.sh"'


def test_launchers_are_executable_and_have_their_line_endings():
    for name in ("halfsafe.sh", "HalfSafe.command", "run-tests.sh"):
        path = INSTALLER / name
        assert path.stat().st_mode & stat.S_IXUSR, name
        assert b"\r\n" not in path.read_bytes(), name
        assert path.read_text().startswith("#!"), name
    cmd = (INSTALLER / "HalfSafe.cmd").read_bytes()
    assert cmd.count(b"\r\n") == cmd.count(b"\n"), "batch files need CRLF line endings"
    text = cmd.decode()
    # The GUI is started detached (pythonw / the halfsafe-gui script), so the console can close.
    assert 'bootstrap.py" --detach %*' in text
    assert "3, 10" in text


def test_windows_gui_start_uses_the_console_free_entry_point(tmp_path, monkeypatch):
    monkeypatch.setattr(bs.os, "name", "nt")
    scripts = tmp_path / "Scripts"
    scripts.mkdir()
    assert bs.app_command(tmp_path, [], gui=True)[0].endswith("pythonw.exe")
    (scripts / "halfsafe-gui.exe").write_bytes(b"")
    assert bs.app_command(tmp_path, [], gui=True) == [str(scripts / "halfsafe-gui.exe")]
    (scripts / "halfsafe.exe").write_bytes(b"")
    assert bs.app_command(tmp_path, ["gpu"], gui=False) == [str(scripts / "halfsafe.exe"), "gpu"]


def test_macos_launcher_detaches_and_knows_where_python_installers_put_python():
    text = (INSTALLER / "HalfSafe.command").read_text()
    assert 'bootstrap.py" --detach "$@"' in text
    assert "/opt/homebrew/bin/python3" in text
    assert "Python.framework" in text


@pytest.mark.skipif(sys.platform == "win32", reason="the shell launcher is for Linux and macOS")
def test_test_mode_hands_over_to_the_test_script(tmp_path):
    """`halfsafe.sh --test` must reach run-tests.sh (checked with a stand-in copy of the folder)."""
    copy = tmp_path / "installer"
    copy.mkdir()
    shutil.copy(INSTALLER / "halfsafe.sh", copy / "halfsafe.sh")
    (copy / "run-tests.sh").write_text('echo "tests with: $*"\n')
    result = subprocess.run(
        ["sh", str(copy / "halfsafe.sh"), "--test", "-k", "gpu"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0
    assert result.stdout.strip() == "tests with: -k gpu"


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "installer/halfsafe.sh --test" in ci
    assert "```\ninstaller/halfsafe.sh --test\n```" in readme


def test_test_script_keeps_its_guarantees():
    script = (INSTALLER / "run-tests.sh").read_text()
    assert "apt-get install" in script
    assert 'HALFSAFE_TORCH_SPEC="${HALFSAFE_TORCH_SPEC:-torch==2.13.0}"' in script
    assert "halfsafe.sh --setup-only --dev" in script
    assert "ruff" in script and "lint-imports" in script and "pytest" in script
    assert "-eq 5" in script
