"""The marker, the repair logic and the pip calls, without running pip."""

from __future__ import annotations

import importlib.util
import os
import site
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from installer_bootstrap import ROOT
from installer_bootstrap import bootstrap as bs

PINNED = bs.choose_torch(
    bs.MachineFacts(system="Linux"), "torch>=2.6,<3", {"HALFSAFE_TORCH_SPEC": "torch==2.13.0"}
)
CPU = bs.choose_torch(bs.MachineFacts(system="Linux"), "torch>=2.6,<3", {})
CUDA = bs.choose_torch(
    bs.MachineFacts(
        system="Linux",
        nvidia=bs.NvidiaInfo("570.124.04", (12, 8), ("NVIDIA GeForce RTX 4090",), ((8, 9),)),
    ),
    "torch>=2.6,<3",
    {},
)
LAYOUT = bs.Layout(ROOT / ".venv", editable=True)


def expected(choice=PINNED, extras=()):
    return bs.expected_marker(ROOT, list(extras), choice, LAYOUT)


def finished_marker(choice=PINNED, torch="2.13.0+cpu", extras=()):
    return {**expected(choice, extras), "torch_installed": torch}


def state(torch="2.13.0+cpu", damaged=(), **extra):
    dists = {"halfsafe": "0.1.0", "safetensors": "0.8.0", "numpy": "2.4.6", **extra}
    if torch:
        dists["torch"] = torch
    return bs.VenvState((3, 11, 7), dists, tuple(damaged))


def test_marker_matching_an_intact_environment_means_nothing_to_do():
    plan = bs.make_plan(expected(), finished_marker(), state(), PINNED, venv_exists=True)
    assert not plan.runs_pip
    assert not plan.update_marker


def test_first_start_creates_everything():
    plan = bs.make_plan(expected(), None, None, PINNED, venv_exists=False)
    assert plan.create_venv and plan.install_torch and plan.install_app
    assert not plan.recreate_venv


def test_environment_without_a_working_python_is_rebuilt():
    plan = bs.make_plan(expected(), finished_marker(), None, PINNED, venv_exists=True)
    assert plan.recreate_venv and plan.install_torch and plan.install_app
    old_python = bs.VenvState((3, 8, 10), {"torch": "2.4.0"})
    assert bs.make_plan(
        expected(), finished_marker(), old_python, PINNED, venv_exists=True
    ).recreate_venv


def test_interrupted_install_is_finished_and_torch_that_fits_is_kept():
    """No marker but packages present: pip stopped half-way last time."""
    plan = bs.make_plan(expected(), None, state(), PINNED, venv_exists=True)
    assert plan.install_app
    assert not plan.install_torch
    assert plan.update_marker
    assert any("interrupted" in reason for reason in plan.reasons)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("app_version", "0.0.9"),
        ("requirements", "0123456789abcdef"),
        ("app_dir", "/elsewhere"),
        ("editable", False),
    ],
)
def test_a_changed_app_is_reinstalled_but_torch_is_not(field, value):
    marker = {**finished_marker(), field: value}
    plan = bs.make_plan(expected(), marker, state(), PINNED, venv_exists=True)
    assert plan.install_app
    assert not plan.install_torch


def test_asking_for_the_test_tools_reinstalls_the_app():
    plan = bs.make_plan(
        expected(extras=["dev"]), finished_marker(), state(), PINNED, venv_exists=True
    )
    assert plan.install_app and not plan.install_torch


def test_test_tools_installed_once_are_kept_by_later_starts():
    marker = finished_marker(extras=["dev"])
    extras = bs.effective_extras([], marker, ROOT)
    assert extras == ["dev"]
    plan = bs.make_plan(expected(extras=extras), marker, state(), PINNED, venv_exists=True)
    assert not plan.runs_pip
    assert bs.effective_extras(["dev"], None, ROOT) == ["dev"]
    assert bs.effective_extras([], {**marker, "app_dir": "/elsewhere"}, ROOT) == []


def test_new_torch_choice_that_the_installed_torch_fits_only_updates_the_marker():
    """Say the driver was updated: the CUDA 12.6 torch already installed still runs."""
    old_choice = bs.TorchChoice(
        "torch>=2.6,<3", bs.PYTORCH_WHEELS + "cu124", "cuda", "cu124", "older driver"
    )
    marker = finished_marker(old_choice, torch="2.13.0+cu126")
    plan = bs.make_plan(expected(CUDA), marker, state("2.13.0+cu126"), CUDA, venv_exists=True)
    assert not plan.runs_pip
    assert plan.update_marker


def test_cpu_torch_is_replaced_when_an_nvidia_gpu_turns_up():
    plan = bs.make_plan(
        expected(CUDA), finished_marker(CPU), state("2.13.0+cpu"), CUDA, venv_exists=True
    )
    assert plan.install_torch and plan.install_app


def test_missing_app_or_torch_is_installed():
    no_app = state()
    del no_app.dists["halfsafe"]
    assert bs.make_plan(expected(), finished_marker(), no_app, PINNED, venv_exists=True).install_app
    no_torch = bs.make_plan(
        expected(), finished_marker(), state(torch=None), PINNED, venv_exists=True
    )
    assert no_torch.install_torch


def test_damaged_packages_are_reinstalled_from_scratch():
    plan = bs.make_plan(
        expected(), finished_marker(), state(damaged=["safetensors"]), PINNED, venv_exists=True
    )
    assert plan.reinstall == ["safetensors==0.8.0"]
    assert plan.install_app and not plan.install_torch
    torch_damaged = bs.make_plan(
        expected(), finished_marker(), state(damaged=["torch"]), PINNED, venv_exists=True
    )
    assert torch_damaged.install_torch


def test_repair_option_rebuilds_everything():
    plan = bs.make_plan(
        expected(), finished_marker(), state(), PINNED, venv_exists=True, repair=True
    )
    assert plan.recreate_venv and plan.install_torch and plan.install_app


def test_requirements_hash_follows_dependencies_not_tool_settings(tmp_path):
    app = tmp_path / "app"
    (app / "app").mkdir(parents=True)
    (app / "app" / "__init__.py").write_text('__version__ = "1.2.3"\n')
    base = '[project]\nname = "halfsafe"\ndependencies = ["torch>=2.6,<3", "numpy"]\n'
    (app / "pyproject.toml").write_text(base + "[tool.ruff]\nline-length = 100\n")
    first = bs.requirements_hash(app)
    (app / "pyproject.toml").write_text(base + "[tool.ruff]\nline-length = 120\n")
    assert bs.requirements_hash(app) == first
    (app / "pyproject.toml").write_text(base.replace('"numpy"', '"numpy>=2"') + "[tool.ruff]\n")
    assert bs.requirements_hash(app) != first
    assert bs.read_app_version(app) == "1.2.3"


def test_dependencies_are_read_with_and_without_tomllib():
    text = (ROOT / "pyproject.toml").read_text()
    regex = bs._toml_string_array(text, "dependencies", "project")
    assert regex == bs.app_dependencies(ROOT, ())
    assert any(r.startswith("torch") for r in regex)
    assert bs._toml_string_array(text, "dev", "project.optional-dependencies")[0].startswith(
        "pytest"
    )


# --- Carrying out a plan, with pip replaced by a recorder -------------------------------------------


class Recorder:
    """Stands in for pip and for the environment's state."""

    def __init__(self, venv_state, fail_on=None):
        self.calls = []
        self.state = venv_state
        self.fail_on = fail_on

    def pip(self, arguments, what, install=True):
        self.calls.append(list(arguments))
        if self.fail_on and self.fail_on in arguments:
            raise bs.SetupError("pip could not install it")


@pytest.fixture
def setup_with_recorder(tmp_path, monkeypatch):
    logs = []

    def make(venv_state, fail_on=None, layout=None):
        recorder = Recorder(venv_state, fail_on)
        venv = tmp_path / "venv"
        venv.mkdir(exist_ok=True)
        layout = layout or bs.Layout(venv, editable=True)
        monkeypatch.setattr(bs.Setup, "pip", recorder.pip)
        monkeypatch.setattr(bs.Setup, "verify", lambda self: recorder.state.torch)
        monkeypatch.setattr(
            bs.Setup, "create_venv", lambda self, clear: recorder.calls.append(["venv", clear])
        )
        monkeypatch.setattr(bs, "read_venv_state", lambda path: recorder.state)
        # pip is recorded, nothing is written: the machine's free space is not this test's.
        monkeypatch.setattr(
            bs.shutil, "disk_usage", lambda path: SimpleNamespace(free=int(500 * bs.GIB))
        )
        monkeypatch.setattr(
            bs.Setup, "compile_app", lambda self: recorder.calls.append(["compile"])
        )
        log = bs.Log(tmp_path / "logs" / "setup.log")
        logs.append(log)
        setup = bs.Setup(ROOT, layout, log, [], {}, lambda text: None)
        return setup, recorder, venv

    yield make
    for log in logs:
        log.close()


def test_pinned_torch_is_installed_without_an_index_and_the_app_pins_it(setup_with_recorder):
    setup, recorder, venv = setup_with_recorder(state(torch="2.13.0+cpu"))
    plan = bs.make_plan(expected(), None, None, PINNED, venv_exists=False)
    assert setup.run(plan, PINNED, expected()) == "2.13.0+cpu"
    venv_call, torch_call, app_call, compile_call = recorder.calls
    assert venv_call == ["venv", False]
    assert compile_call == ["compile"]
    assert torch_call == ["install", "torch==2.13.0"]
    assert "--index-url" not in torch_call
    assert app_call == ["install", "-e", str(ROOT), "torch==2.13.0+cpu"]
    marker = bs.read_marker(venv)
    assert marker["torch_installed"] == "2.13.0+cpu"
    assert marker["torch"] == PINNED.key()


def test_cuda_torch_comes_from_its_index_after_the_wrong_build_is_removed(setup_with_recorder):
    setup, recorder, _ = setup_with_recorder(state(torch="2.13.0+cpu"))
    plan = bs.make_plan(
        expected(CUDA), finished_marker(CPU), state("2.13.0+cpu"), CUDA, venv_exists=True
    )
    setup.run(plan, CUDA, expected(CUDA))
    assert recorder.calls[0] == ["uninstall", "--yes", "torch"]
    assert recorder.calls[1] == [
        "install",
        "torch>=2.6,<3",
        "--index-url",
        "https://download.pytorch.org/whl/cu126",
    ]


def test_dev_extras_go_into_the_editable_install(setup_with_recorder):
    setup, recorder, _ = setup_with_recorder(state())
    setup.extras = ["dev"]
    setup.run(bs.Plan(install_app=True), PINNED, expected(extras=["dev"]))
    assert recorder.calls == [["install", "-e", f"{ROOT}[dev]", "torch==2.13.0+cpu"], ["compile"]]


def test_the_app_is_compiled_at_setup_so_the_first_launch_reads_bytecode(tmp_path):
    app_dir = tmp_path / "HalfSafe"
    (app_dir / "app" / "ui").mkdir(parents=True)
    module = app_dir / "app" / "ui" / "window.py"
    module.write_text("SHOWN = True\n")
    venv = tmp_path / "venv"
    python = bs.venv_python(venv)
    python.parent.mkdir(parents=True)
    python.symlink_to(sys.executable)
    log = bs.Log(tmp_path / "setup.log")
    setup = bs.Setup(app_dir, bs.Layout(venv, editable=True), log, [], {}, lambda text: None)
    setup.compile_app()
    log.close()
    assert Path(importlib.util.cache_from_source(str(module))).is_file()
    assert "compileall" in (tmp_path / "setup.log").read_text()


def test_setup_and_the_app_import_nothing_from_the_folder_the_launcher_was_started_in(
    tmp_path, monkeypatch
):
    """Python puts the working folder first on sys.path for `-m`: modules there named as
    compileall, argparse or the app itself would run in their place."""
    started_in, marker = tmp_path / "downloads", tmp_path / "ran"
    for name in ("compileall.py", "argparse.py", "pip/__init__.py", "app/__init__.py"):
        (started_in / name).parent.mkdir(parents=True, exist_ok=True)
        (started_in / name).write_text(f"open({str(marker)!r}, 'a').write(__name__)\n")
    (tmp_path / "HalfSafe" / "app").mkdir(parents=True)
    module = tmp_path / "HalfSafe" / "app" / "window.py"
    module.write_text("SHOWN = True\n")
    venv = tmp_path / "venv"
    python = bs.venv_python(venv)
    python.parent.mkdir(parents=True)
    python.symlink_to(sys.executable)
    log = bs.Log(tmp_path / "setup.log")
    setup = bs.Setup(module.parents[1], bs.Layout(venv, editable=True), log, [], {}, print)
    monkeypatch.chdir(started_in)

    setup.compile_app()
    log.close()
    # The venv has no halfsafe script here: the app is started as a module (its libraries are
    # this Python's).
    started = subprocess.run(
        bs.app_command(venv, ["--help"], gui=False),
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *site.getsitepackages()])},
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert Path(importlib.util.cache_from_source(str(module))).is_file()
    assert started.returncode == 0 and started.stdout.startswith("usage: halfsafe"), started
    assert not marker.exists(), marker.read_text()


def test_a_failed_compile_is_logged_and_setup_goes_on(tmp_path):
    log = bs.Log(tmp_path / "setup.log")
    venv = tmp_path / "no-venv"  # no Python there
    setup = bs.Setup(tmp_path, bs.Layout(venv, editable=True), log, [], {}, lambda text: None)
    setup.compile_app()
    log.close()
    assert "compiling the app's modules failed" in (tmp_path / "setup.log").read_text()


def test_a_failed_install_leaves_no_marker_so_the_next_start_repairs(setup_with_recorder):
    setup, recorder, venv = setup_with_recorder(state(), fail_on="-e")
    bs.write_marker(venv, finished_marker())
    plan = bs.make_plan(
        expected(), {**finished_marker(), "app_version": "0.0.1"}, state(), PINNED, venv_exists=True
    )
    with pytest.raises(bs.SetupError):
        setup.run(plan, PINNED, expected())
    assert bs.read_marker(venv) is None
    again = bs.make_plan(expected(), bs.read_marker(venv), state(), PINNED, venv_exists=True)
    assert again.install_app


def test_damaged_package_is_force_reinstalled_at_its_version(setup_with_recorder):
    setup, recorder, _ = setup_with_recorder(state())
    plan = bs.make_plan(
        expected(), finished_marker(), state(damaged=["safetensors"]), PINNED, venv_exists=True
    )
    setup.run(plan, PINNED, expected())
    assert ["install", "--force-reinstall", "--no-deps", "safetensors==0.8.0"] in recorder.calls


def test_read_only_app_folder_gets_its_libraries_without_editable_install(
    setup_with_recorder, monkeypatch
):
    venv_state = state()
    setup, recorder, venv = setup_with_recorder(venv_state, layout=None)
    setup.layout = bs.Layout(venv, editable=False)
    monkeypatch.setattr(bs.Setup, "link_source", lambda self: recorder.calls.append(["link"]))
    setup.run(bs.Plan(install_app=True), PINNED, expected())
    install, link = recorder.calls
    assert "-e" not in install
    assert "diffusers" in " ".join(install)
    assert not any(arg.startswith("torch>") for arg in install)
    assert install[-1] == "torch==2.13.0+cpu"
    assert link == ["link"]


def test_not_enough_disk_space_is_one_sentence(setup_with_recorder, monkeypatch):
    setup, recorder, _ = setup_with_recorder(state())
    monkeypatch.setattr(
        bs.shutil, "disk_usage", lambda path: SimpleNamespace(free=int(0.5 * bs.GIB))
    )
    with pytest.raises(bs.SetupError, match=r"^Not enough disk space: .* 0\.5 GB is free\."):
        setup.run(
            bs.make_plan(expected(CUDA), None, None, CUDA, venv_exists=False), CUDA, expected(CUDA)
        )
    assert recorder.calls == []


@pytest.mark.parametrize(
    ("output", "start"),
    [
        (
            "WARNING: Retrying (Retry(total=4, connect=None, read=None, redirect=None, status=None)) after "
            "connection broken by 'NewConnectionError('<pip._vendor.urllib3.connection.HTTPSConnection object>: "
            "Failed to establish a new connection: [Errno -3] Temporary failure in name resolution')': /simple/torch/\n"
            "ERROR: Could not find a version that satisfies the requirement torch (from versions: none)\n"
            "ERROR: No matching distribution found for torch\n",
            "Could not download PyTorch: there is no network connection",
        ),
        (
            "Looking in indexes: https://download.pytorch.org/whl/cu130\n"
            "WARNING: Retrying (Retry(total=4, connect=None, read=None, redirect=None, status=None)) after "
            "connection broken by 'NewConnectionError('<pip._vendor.urllib3.connection.HTTPSConnection object>: "
            "Failed to establish a new connection: [Errno -3] Temporary failure in name resolution')': /whl/cu130/torch/\n"
            "ERROR: No matching distribution found for torch\n",
            "Could not download PyTorch: download.pytorch.org could not be reached. Check the "
            "network connection, and any proxy or firewall, for that host",
        ),
        (
            "WARNING: Retrying after connection broken by 'ConnectTimeoutError(<...>, "
            "'Connection to pypi.org timed out.')': /simple/pillow/\n"
            "Could not fetch URL https://pypi.org/simple/pillow/: There was a problem confirming "
            "the ssl certificate: HTTPSConnectionPool(host='pypi.org', port=443)\n",
            "Could not download PyTorch: pypi.org could not be reached.",
        ),
        (
            "ERROR: Could not install packages due to an OSError: [Errno 28] No space left on device\n",
            "The disk filled up while installing PyTorch",
        ),
        (
            "ERROR: Could not find a version that satisfies the requirement torch==9.9 (from versions: 2.13.0)\n"
            "ERROR: No matching distribution found for torch==9.9\n",
            "pip could not install PyTorch (exit 1: No matching distribution found for torch==9.9)",
        ),
    ],
)
def test_pip_failures_become_one_line_with_the_log_path(output, start):
    message = bs.explain_pip_failure("PyTorch", 1, output, Path("/logs/setup.log"))
    assert message.startswith(start)
    assert "/logs/setup.log" in message
    assert "\n" not in message


def test_pip_progress_is_boiled_down():
    assert bs._progress_line(
        "  Downloading torch-2.13.0%2Bcu130-cp311-cp311-manylinux_2_28_x86_64.whl (899.7 MB)"
    ) == ("downloading torch-2.13.0%2Bcu130-cp311-cp311-manylinux_2_28_x86_64.whl (899.7 MB)")
    assert bs._progress_line("  Downloading idna-3.20-py3-none-any.whl (70 kB)") is None
    assert bs._progress_line("Installing collected packages: a, b, c\n") == "unpacking 3 packages"
    assert bs._progress_line("Requirement already satisfied: numpy in ./lib") is None


# --- Where the environment goes ------------------------------------------------------------------------


def test_environment_goes_beside_a_writable_app():
    layout = bs.choose_layout(Path("/apps/HalfSafe"), {}, writable=lambda path: True)
    assert layout == bs.Layout(Path("/apps/HalfSafe/.venv"), editable=True)


def test_read_only_app_puts_the_environment_in_the_data_folder(tmp_path):
    layout = bs.choose_layout(
        Path("/opt/HalfSafe"), {"HALFSAFE_DATA_DIR": str(tmp_path)}, writable=lambda p: False
    )
    assert layout.venv.parent == tmp_path / "envs"
    assert layout.venv.name.startswith("app-")
    assert not layout.editable
    other = bs.choose_layout(
        Path("/opt/HalfSafe-2"), {"HALFSAFE_DATA_DIR": str(tmp_path)}, writable=lambda p: False
    )
    assert other.venv != layout.venv


def test_environment_folder_can_be_named(tmp_path):
    layout = bs.choose_layout(
        ROOT, {"HALFSAFE_VENV": str(tmp_path / "env")}, writable=lambda p: True
    )
    assert layout.venv == tmp_path / "env"


def test_read_only_app_is_importable_through_a_path_file(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    log = bs.Log(tmp_path / "setup.log")
    bs.Setup(ROOT, bs.Layout(venv, editable=False), log, [], {}, lambda text: None).link_source()
    log.close()
    found = subprocess.run(
        [str(bs.venv_python(venv)), "-c", "import app; print(app.__file__)"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=True,
    ).stdout.strip()
    assert Path(found) == ROOT / "app" / "__init__.py"


def test_venv_state_reports_versions_and_damage(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    purelib = subprocess.run(
        [
            str(bs.venv_python(venv)),
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    package, info = Path(purelib) / "tinypkg", Path(purelib) / "tinypkg-1.0.dist-info"
    package.mkdir()
    info.mkdir()
    (package / "__init__.py").write_text("")
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n")
    (info / "RECORD").write_text("tinypkg/__init__.py,,\ntinypkg-1.0.dist-info/METADATA,,\n")
    assert bs.read_venv_state(venv).dists["tinypkg"] == "1.0"
    assert bs.read_venv_state(venv).damaged == ()
    (package / "__init__.py").unlink()
    assert bs.read_venv_state(venv).damaged == ("tinypkg",)
    assert bs.read_venv_state(tmp_path / "nothing-here") is None


# --- Arguments ----------------------------------------------------------------------------------------


def test_leading_setup_options_are_taken_and_the_rest_goes_to_halfsafe():
    options = bs.parse_arguments(["--dev", "--setup-only", "check", "demo", "--dev"])
    assert options.dev and options.setup_only
    assert options.app_args == ["check", "demo", "--dev"]
    assert bs.parse_arguments(["--", "--repair"]).app_args == ["--repair"]
    assert bs.parse_arguments(["--version"]).app_args == ["--version"]
    assert bs.parse_arguments(["--setup-help"]).help
