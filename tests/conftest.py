"""Test-wide setup: offscreen Qt, no hub access, a pinned CPU bf16 class, and every HalfSafe
folder under tmp_path."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

# The folders HalfSafe and the hub read, each pointed away from the user's own.
_FOLDERS = (
    ("HALFSAFE_CONFIG_DIR", "config"),
    ("HALFSAFE_DATA_DIR", "data"),
    ("HALFSAFE_CACHE_DIR", "cache"),
    ("HF_HOME", "hf"),
)

# Before anything can import Qt or huggingface_hub.
os.environ["QT_QPA_PLATFORM"] = "offscreen"
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
# The tests run tiny models: with two intra-op threads, every small kernel waits on the other
# core whenever anything else runs there (measured: 7.8 ms instead of 0.03 ms for a small
# Linear). One thread per process is faster here; subprocesses inherit it.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# What HalfSafe prefers on a CPU depends on whether it has native bf16 (a fix keeps layers in
# bf16 there, in fp32 elsewhere). The suite pins that class so that its results do not depend on
# the machine: "native" unless the run names one. The test command runs the core tests again with
# HALFSAFE_CPU_BF16=emulated, so both branches run on every machine.
os.environ.setdefault("HALFSAFE_CPU_BF16", "native")
# fp16 matrix products and convolutions on the CPU are summed in fp32 and rounded once, as
# torch's own fp16 kernels sum them (tests/support/cpu_fp16.py), 45-70 times faster on a CPU
# without fp16 kernels. In this process, and in the subprocesses the tests start, through
# site/sitecustomize.py.
# HALFSAFE_TEST_CPU_FP16=native keeps torch's own kernels.
from tests.support import cpu_fp16  # noqa: E402 (imports no torch)

os.environ.setdefault(cpu_fp16.ENV, cpu_fp16.VALUE)
_SITE = str(Path(__file__).resolve().parent / "support" / "site")
os.environ["PYTHONPATH"] = os.pathsep.join(
    [_SITE, *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != _SITE]]
)
# Every test gets fresh folders (`isolated_dirs`). Beneath those, the whole run points them at a
# folder of its own too, so that nothing a test does (a monkeypatch.undo() undoes the fixture's
# folders as well) reads or writes the user's real settings, models' hashes or caches.
_RUN_HOME = tempfile.mkdtemp(prefix="halfsafe-tests-")
atexit.register(shutil.rmtree, _RUN_HOME, ignore_errors=True)
for _var, _name in _FOLDERS:
    os.environ[_var] = os.path.join(_RUN_HOME, _name)

import pytest  # noqa: E402

if os.environ[cpu_fp16.ENV] == cpu_fp16.VALUE:
    cpu_fp16.install()


@pytest.fixture(autouse=True)
def isolated_dirs(tmp_path_factory, monkeypatch):
    """Point settings, data, caches and the HF cache at fresh folders for every test."""
    root = tmp_path_factory.mktemp("halfsafe-home")
    for var, name in _FOLDERS:
        monkeypatch.setenv(var, str(root / name))
    return root


@pytest.fixture(params=["native", "emulated"])
def cpu_bf16(request, monkeypatch) -> str:
    """Runs a test once as on a CPU with native bf16 and once as on one without; returns which.

    For tests whose right answer depends on that class (the layers a fix keeps wider are bf16
    where it is native, fp32 elsewhere): both answers are asserted on every machine."""
    monkeypatch.setenv("HALFSAFE_CPU_BF16", request.param)
    return request.param


# The computer's RAM as the tests see it: a job on the CPU with no budget of its own takes one
# from the RAM free beside its model (`streaming.device_budget`). Fixed, so that what a job holds
# and records does not depend on the machine; tests of that budget set their own.
TEST_RAM_GIB = 64


@pytest.fixture(autouse=True)
def fixed_ram(monkeypatch):
    import psutil

    memory = psutil.virtual_memory()._replace(
        available=TEST_RAM_GIB * 2**30, total=TEST_RAM_GIB * 2**30
    )
    monkeypatch.setattr(psutil, "virtual_memory", lambda: memory)


# A device's dtype table is measured on the machine (`hardware.dtype_speed`), so a check that
# predicted its candidates' costs from it would rank, prune and time them by this machine's
# speeds. The suite uses no table unless a test injects a fixed one: the candidates are ranked
# as where no prediction error was measured. For the whole session, so that a check a module's
# fixture shares (set up before any test's own fixtures) runs without one too.
@pytest.fixture(autouse=True, scope="session")
def no_dtype_table():
    from app.core.health import step_work

    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(step_work, "device_speed", lambda device: None)
        yield


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """An empty home folder of the test's own (HOME, USERPROFILE), with its data folder under
    it (XDG_DATA_HOME), where model folders and explained images are laid out."""
    home = tmp_path / "home"
    home.mkdir()
    for var in ("HOME", "USERPROFILE"):
        monkeypatch.setenv(var, str(home))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / ".local" / "share"))
    return home
