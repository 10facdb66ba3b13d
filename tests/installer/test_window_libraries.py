"""The first start on a desktop without the system libraries Qt's window platform loads: the
launcher finds them missing before Qt starts (Qt itself aborts with 'Could not load the Qt
platform plugin', naming no library), installs their packages when the user at a terminal
agrees, and otherwise names the exact packages and the command in one sentence."""

from __future__ import annotations

from pathlib import Path

import pytest
from installer_bootstrap import bootstrap as bs
from installer_bootstrap import fixture_text

LDD_LACKING = fixture_text("ldd-libqxcb-debian12-no-icccm-keysyms.txt")
LDD_COMPLETE = "\n".join(line for line in LDD_LACKING.splitlines() if "not found" not in line)
DEBIAN = 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\n'
UBUNTU = "ID=ubuntu\nID_LIKE=debian\n"
FEDORA = "ID=fedora\nVERSION_ID=41\n"
X11 = {"DISPLAY": ":0"}


@pytest.fixture
def venv(tmp_path) -> Path:
    """An environment holding PySide6's X11 and Wayland plugins (empty files: ldd is faked)."""
    platforms = tmp_path / "venv/lib/python3.11/site-packages/PySide6/Qt/plugins/platforms"
    platforms.mkdir(parents=True)
    for name in ("xcb", "wayland", "offscreen"):
        (platforms / f"libq{name}.so").write_bytes(b"")
    return tmp_path / "venv"


def _installed_after(run_log: list[list[str]]):
    """An ldd that reports the libraries missing until a package install has run."""
    return lambda _plugin: LDD_COMPLETE if run_log else LDD_LACKING


def test_ldd_report_names_each_missing_library_once():
    assert bs.parse_ldd_missing(LDD_LACKING) == ("libxcb-icccm.so.4", "libxcb-keysyms.so.1")
    assert bs.parse_ldd_missing(LDD_COMPLETE) == ()


def test_a_debian_desktop_without_them_is_told_the_packages_and_the_command(venv):
    problem = bs.ensure_window_libraries(
        venv,
        X11,
        "installer/halfsafe.sh",
        print,
        ask=None,
        ldd=lambda _p: LDD_LACKING,
        os_release=DEBIAN,
    )
    assert problem is not None and "\n" not in problem
    assert "Qt's X11 (xcb) platform needs libxcb-icccm4 and libxcb-keysyms1" in problem
    assert "'sudo apt-get install -y libxcb-icccm4 libxcb-keysyms1'" in problem
    assert "'installer/halfsafe.sh check demo'" in problem


@pytest.mark.parametrize(
    ("release", "words"),
    [
        (UBUNTU, "apt-get install -y libxcb-icccm4 libxcb-keysyms1"),
        (FEDORA, "dnf install -y xcb-util-wm xcb-util-keysyms"),
        ("ID=arch\n", "pacman -S --needed --noconfirm xcb-util-wm xcb-util-keysyms"),
    ],
)
def test_each_known_distribution_gets_its_own_package_names(venv, monkeypatch, release, words):
    monkeypatch.setattr(bs.shutil, "which", lambda program: f"/usr/bin/{program}")
    found = bs.missing_window_libraries(venv, X11, lambda _p: LDD_LACKING, release, lambda _p: True)
    assert found is not None
    assert words in bs.shlex.join(found.install_command() or [])


def test_an_unknown_system_is_told_the_library_files(venv):
    problem = bs.ensure_window_libraries(
        venv, X11, "x", print, ask=None, ldd=lambda _p: LDD_LACKING, os_release="ID=gentoo\n"
    )
    assert problem is not None
    assert "needs libxcb-icccm.so.4 and libxcb-keysyms.so.1" in problem
    assert "install the packages of your system that hold them" in problem


def test_at_a_terminal_the_packages_are_installed_when_the_user_agrees(venv, monkeypatch):
    monkeypatch.setattr(bs.shutil, "which", lambda program: f"/usr/bin/{program}")
    ran: list[list[str]] = []
    questions: list[str] = []
    said: list[str] = []

    def agree(question: str) -> bool:
        questions.append(question)
        return True

    def run(command: list[str]) -> int:
        ran.append(command)
        return 0

    problem = bs.ensure_window_libraries(
        venv,
        X11,
        "x",
        said.append,
        ask=agree,
        run=run,
        ldd=_installed_after(ran),
        os_release=DEBIAN,
    )
    assert problem is None
    assert len(questions) == 1 and "libxcb-icccm4 and libxcb-keysyms1" in questions[0]
    assert ran and ran[0][-2:] == ["libxcb-icccm4", "libxcb-keysyms1"]
    assert "apt-get" in ran[0]
    assert said == ["Installed libxcb-icccm4 and libxcb-keysyms1."]


def test_a_refusal_or_a_failed_install_ends_in_the_sentence(venv, monkeypatch):
    monkeypatch.setattr(bs.shutil, "which", lambda program: f"/usr/bin/{program}")
    ran: list[list[str]] = []
    refused = bs.ensure_window_libraries(
        venv,
        X11,
        "x",
        print,
        ask=lambda _q: False,
        run=lambda c: ran.append(c) or 0,
        ldd=lambda _p: LDD_LACKING,
        os_release=DEBIAN,
    )
    assert refused is not None and "libxcb-icccm4" in refused and not ran
    said: list[str] = []
    failed = bs.ensure_window_libraries(
        venv,
        X11,
        "x",
        said.append,
        ask=lambda _q: True,
        run=lambda _c: 100,
        ldd=lambda _p: LDD_LACKING,
        os_release=DEBIAN,
    )
    assert failed is not None and "libxcb-keysyms1" in failed
    assert said == ["Installing libxcb-icccm4 and libxcb-keysyms1 failed (exit 100)."]


def test_a_platform_that_loads_is_enough(venv):
    def ldd(plugin: Path) -> str:
        return LDD_COMPLETE if "wayland" in plugin.name else LDD_LACKING

    wayland = {"WAYLAND_DISPLAY": "wayland-0", "DISPLAY": ":0"}
    assert bs.qt_platforms(wayland) == ["wayland", "xcb"]
    assert bs.missing_window_libraries(venv, wayland, ldd, DEBIAN, lambda _p: True) is None
    # X11 alone lacks them.
    assert bs.missing_window_libraries(venv, X11, ldd, DEBIAN, lambda _p: True) is not None


def test_what_cannot_be_told_never_stops_the_window(venv, tmp_path):
    lacking = lambda _p: LDD_LACKING  # noqa: E731
    # A platform that needs no system library, no ldd, no plugin installed.
    assert (
        bs.missing_window_libraries(venv, {"QT_QPA_PLATFORM": "offscreen"}, lacking, DEBIAN, bool)
        is None
    )
    assert bs.missing_window_libraries(venv, X11, lambda _p: None, DEBIAN, bool) is None
    assert bs.missing_window_libraries(tmp_path / "none", X11, lacking, DEBIAN, bool) is None


def test_the_launcher_checks_before_starting_the_window_and_exits_2(venv, monkeypatch, capsys):
    started: list[object] = []
    monkeypatch.setattr(bs, "ensure_environment", lambda *a, **k: False)
    monkeypatch.setattr(bs, "choose_layout", lambda *a: bs.Layout(venv=venv, editable=True))
    monkeypatch.setattr(bs, "run_ldd", lambda _p: LDD_LACKING)
    monkeypatch.setattr(bs, "_read_os_release", lambda: DEBIAN)
    monkeypatch.setattr(bs, "start_app", lambda *a, **k: started.append(a) or 0)
    monkeypatch.setattr(bs.platform, "system", lambda: "Linux")
    monkeypatch.setattr(bs.sys, "stdin", None)  # started from the applications menu
    status = bs.main([], {**X11, "HALFSAFE_LOG_DIR": str(venv.parent / "logs")})
    assert status == bs.EXIT_CANNOT_RUN and not started
    assert "libxcb-icccm4 and libxcb-keysyms1" in capsys.readouterr().err
