"""Builds HalfSafe's Python environment on first start, keeps it healthy, and starts the app.

Every launcher in this folder runs this file with the system's own Python (3.10+), so it uses
the standard library only. It creates a virtual environment (`.venv` beside the app, or in the
user's data folder when the app folder is read-only), installs the PyTorch build that fits this
machine and then the app, and records what it did in a marker file; a later start that finds
the marker and an intact environment goes straight to the app without calling pip. An install
that was interrupted or damaged is found and repaired on the next start.

    python3 installer/bootstrap.py [SETUP OPTIONS] [HALFSAFE ARGUMENTS]

Setup options come first; everything from the first other argument on goes to `halfsafe`.
Exit status: the app's own, or 2 when it cannot start here (no display), 3 when setup failed.
"""

from __future__ import annotations

import sys

if sys.version_info < (3, 10):  # noqa: UP036 (the launchers may hand us an old Python)
    sys.stderr.write(
        "HalfSafe needs Python 3.10 or newer, and this is Python "
        + ".".join(str(part) for part in sys.version_info[:2])
        + ": install a newer one from https://www.python.org/downloads/ and start HalfSafe again.\n"
    )
    raise SystemExit(3)

import contextlib
import datetime
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

APP_NAME = "HalfSafe"
APP_DIR = Path(__file__).resolve().parent.parent
MARKER_NAME = "halfsafe-install.json"
MARKER_FORMAT = 1
EXIT_CANNOT_RUN = 2
EXIT_SETUP_FAILED = 3
DEFAULT_TORCH_REQUIREMENT = "torch>=2.6,<3"
PYTORCH_WHEELS = "https://download.pytorch.org/whl/"
GIB = 1024**3


# --- Which PyTorch build fits this machine -------------------------------------------------------


@dataclass(frozen=True)
class DriverFloor:
    """The oldest NVIDIA driver that runs a CUDA release (driver versions as nvidia-smi prints them)."""

    cuda: tuple[int, int]
    linux: str | None
    windows: str | None


# NVIDIA, "CUDA Toolkit Release Notes", table "CUDA Toolkit and Corresponding Driver Versions"
# (https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/index.html), GA release of each
# toolkit. NVIDIA stopped listing Windows drivers there with CUDA 13.0; the 13.0 Windows figure
# is the one PyTorch gives in its 2.12 release notes. Only used when nvidia-smi does not print
# the driver's CUDA version itself.
CUDA_DRIVER_FLOORS: tuple[DriverFloor, ...] = (
    DriverFloor((13, 2), linux="595.45.04", windows=None),
    DriverFloor((13, 0), linux="580.65.06", windows="580.88"),
    DriverFloor((12, 9), linux="575.51.03", windows="576.02"),
    DriverFloor((12, 8), linux="570.26", windows="570.65"),
    DriverFloor((12, 6), linux="560.28.03", windows="560.76"),
    DriverFloor((12, 4), linux="550.54.14", windows="551.61"),
    DriverFloor((11, 8), linux="520.61.05", windows="520.06"),
)


@dataclass(frozen=True)
class TorchBuild:
    """One of PyTorch's wheel indexes (https://download.pytorch.org/whl/<tag>)."""

    tag: str
    version: tuple[int, int]
    min_capability: tuple[int, int] = (0, 0)
    max_capability: tuple[int, int] | None = None
    last_torch: str | None = None  # newest torch on the index; None while releases still come
    download_gb: float = 3.0
    disk_gb: float = 7.0

    @property
    def index_url(self) -> str:
        return PYTORCH_WHEELS + self.tag

    def runs_on(self, capability: tuple[int, int]) -> bool:
        if capability < self.min_capability:
            return False
        return self.max_capability is None or capability <= self.max_capability


# PyTorch's CUDA builds, newest first, with the GPU generations each ships kernels for. Sources:
# PyTorch's RELEASE.md "PyTorch CUDA support matrix" and the release RFCs that change it
# (pytorch/pytorch#172352 for 2.11, #178665 for 2.12: CUDA 12.8 dropped; #190355 for 2.14:
# 12.6 legacy, 13.0 and 13.2 stable). CUDA 12.6 is the only build left with Maxwell, Pascal and
# Volta (compute capability below 7.5); CUDA 13 cannot target them at all.
CUDA_BUILDS: tuple[TorchBuild, ...] = (
    TorchBuild("cu132", (13, 2), min_capability=(7, 5)),
    TorchBuild("cu130", (13, 0), min_capability=(7, 5)),
    TorchBuild("cu128", (12, 8), min_capability=(7, 5), last_torch="2.11"),
    TorchBuild("cu126", (12, 6), min_capability=(5, 0), max_capability=(9, 0)),
    TorchBuild("cu124", (12, 4), min_capability=(5, 0), max_capability=(9, 0), last_torch="2.6"),
    TorchBuild("cu118", (11, 8), min_capability=(5, 0), max_capability=(9, 0), last_torch="2.7"),
)

# PyTorch's ROCm builds, newest first. Each wheel carries its own ROCm runtime, so what matters
# is the kernel driver; where a system ROCm is installed we stay at or below its version.
ROCM_BUILDS: tuple[TorchBuild, ...] = (
    TorchBuild("rocm7.2", (7, 2), download_gb=4.5, disk_gb=16.0),
    TorchBuild("rocm7.1", (7, 1), download_gb=4.5, disk_gb=16.0),
    TorchBuild("rocm6.4", (6, 4), download_gb=4.0, disk_gb=15.0),
)
CPU_BUILD = TorchBuild("cpu", (0, 0), download_gb=0.25, disk_gb=1.0)
APP_DISK_GB = (
    1.5  # the app's other dependencies (Qt, diffusers, transformers...) plus pip's temp files
)

# GPUs older than Turing (compute capability < 7.5), by name, for drivers too old to report it.
_PRE_TURING = re.compile(
    r"GTX (?:9\d\d|10[5-8]0)|GTX TITAN|TITAN (?:X|Xp|V)\b|Tesla [KMPV]\d|Quadro [KMP]\d|"
    r"Quadro GV\d|GeForce 9\d\dM?|MX[1-3]\d0",
    re.IGNORECASE,
)
_BLACKWELL = re.compile(
    r"RTX 50\d\d|RTX PRO \d+ Blackwell|\bB[12]00\b|\bGB[12]\d\d\b", re.IGNORECASE
)


@dataclass(frozen=True)
class NvidiaInfo:
    driver: str | None
    max_cuda: tuple[int, int] | None  # the newest CUDA the driver runs, as nvidia-smi states it
    gpus: tuple[str, ...] = ()
    capabilities: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class MachineFacts:
    """What the torch choice depends on; gathered by `probe_machine`, or recorded for tests."""

    system: str  # platform.system(): "Linux", "Darwin", "Windows"
    nvidia: NvidiaInfo | None = None
    amd_gpus: tuple[str, ...] = ()
    rocm_version: tuple[int, int] | None = None


@dataclass(frozen=True)
class TorchChoice:
    """The torch build to install, and how to recognise an installed torch that will do."""

    requirement: str  # what pip is asked for: "torch>=2.6,<3", or HALFSAFE_TORCH_SPEC
    index_url: str | None  # None: pip's own configuration (PyPI, or what pip.conf says)
    kind: str  # "cuda", "rocm", "cpu", "default" (macOS), "override"
    tag: str | None
    reason: str
    accepted_tags: tuple[str, ...] = ()  # local versions (+cu126...) an installed torch may have
    download_gb: float = 3.0
    disk_gb: float = 7.0
    warning: str | None = None

    def key(self) -> dict[str, str | None]:
        """What the marker remembers about the choice."""
        return {"requirement": self.requirement, "index_url": self.index_url, "tag": self.tag}

    def accepts(self, installed: str | None) -> bool:
        """Whether an already-installed torch (a version like "2.13.0+cpu") can stay."""
        if not installed:
            return False
        matches = requirement_matches(self.requirement, installed)
        if matches is False:
            return False
        if matches is None:  # a URL or path: only the marker can say it was installed from it
            return False
        local = installed.partition("+")[2].lower()
        if self.kind == "cuda":
            return local in self.accepted_tags
        if self.kind == "rocm":
            return local.startswith("rocm")
        return True  # cpu (a GPU build runs on the CPU too), macOS default, explicit override


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text))


def max_cuda_for_driver(driver: str, windows: bool) -> tuple[int, int] | None:
    """The newest CUDA release a driver version runs, from NVIDIA's table; None if older than all."""
    have = _version_tuple(driver)
    for floor in CUDA_DRIVER_FLOORS:
        needed = floor.windows if windows else floor.linux
        if needed is not None and have >= _version_tuple(needed):
            return floor.cuda
    return None


def parse_nvidia_smi(text: str) -> NvidiaInfo | None:
    """Driver version, CUDA version and GPU names from `nvidia-smi`'s usual table."""
    driver = re.search(r"Driver Version:\s*([\d.]+)", text)
    if not driver:
        return None
    cuda = re.search(r"CUDA Version:\s*(\d+)\.(\d+)", text)
    gpus = re.findall(r"^\|\s+\d+\s+(.+?)\s{2,}(?:On|Off|WDDM|TCC|MCDM)\s+\|", text, re.MULTILINE)
    return NvidiaInfo(
        driver=driver.group(1),
        max_cuda=(int(cuda.group(1)), int(cuda.group(2))) if cuda else None,
        gpus=tuple(name.strip() for name in gpus),
    )


def parse_compute_capabilities(text: str) -> tuple[tuple[int, int], ...]:
    """Compute capabilities from `nvidia-smi --query-gpu=compute_cap --format=csv,noheader`."""
    found = re.findall(r"^\s*(\d+)\.(\d+)\s*$", text, re.MULTILINE)
    return tuple((int(major), int(minor)) for major, minor in found)


def guess_capabilities(gpus: Sequence[str]) -> tuple[tuple[int, int], ...]:
    """A rough compute capability from the GPU's name, for drivers that cannot report it."""
    guesses = []
    for name in gpus:
        if _PRE_TURING.search(name):
            guesses.append((6, 1))
        elif _BLACKWELL.search(name):
            guesses.append((12, 0))
    return tuple(guesses)


def parse_rocminfo(text: str) -> tuple[str, ...]:
    """The GPU agents `rocminfo` lists, as "Marketing Name (gfxNNNN)"; CPUs are left out."""
    gpus = []
    for block in re.split(r"\n\*{5,}\s*\nAgent \d+\s*\n\*{5,}", text)[1:]:
        if not re.search(r"Device Type:\s*GPU", block):
            continue
        arch = re.search(r"^\s*Name:\s*(gfx\w+)", block, re.MULTILINE)
        label = re.search(r"Marketing Name:\s*(.+)", block)
        name = label.group(1).strip() if label else "AMD GPU"
        gpus.append(f"{name} ({arch.group(1)})" if arch else name)
    return tuple(gpus)


def parse_rocm_version(text: str) -> tuple[int, int] | None:
    """ROCm's version from /opt/rocm/.info/version ("6.4.1-120")."""
    found = re.match(r"\s*(\d+)\.(\d+)", text)
    return (int(found.group(1)), int(found.group(2))) if found else None


def choose_torch(
    facts: MachineFacts, base_requirement: str, environ: Mapping[str, str]
) -> TorchChoice:
    """Which torch build to install here.

    `HALFSAFE_TORCH_SPEC` replaces the requirement and the choice (pip then uses its own indexes
    unless `HALFSAFE_TORCH_INDEX` names one); `HALFSAFE_TORCH_INDEX` alone keeps the automatic
    choice but fetches it from the given index.
    """
    override = environ.get("HALFSAFE_TORCH_SPEC", "").strip()
    index_override = environ.get("HALFSAFE_TORCH_INDEX", "").strip() or None
    if override:
        return TorchChoice(
            requirement=override,
            index_url=index_override,
            kind="override",
            tag=None,
            reason=f"HALFSAFE_TORCH_SPEC asks for {override}",
        )
    choice = _automatic_choice(facts, base_requirement)
    if index_override:
        choice = TorchChoice(**{**choice.__dict__, "index_url": index_override})
    return choice


def _automatic_choice(facts: MachineFacts, requirement: str) -> TorchChoice:
    if facts.system == "Darwin":
        return TorchChoice(
            requirement=requirement,
            index_url=None,
            kind="default",
            tag=None,
            reason="macOS: PyTorch's standard build, which uses the Apple GPU (MPS)",
            download_gb=0.1,
            disk_gb=0.5,
        )
    warning = None
    nvidia = facts.nvidia
    if nvidia is not None and nvidia.driver:
        windows = facts.system == "Windows"
        max_cuda = nvidia.max_cuda or max_cuda_for_driver(nvidia.driver, windows)
        capabilities = nvidia.capabilities or guess_capabilities(nvidia.gpus)
        usable = [
            build
            for build in CUDA_BUILDS
            if max_cuda is not None
            and build.version <= max_cuda
            and all(build.runs_on(cc) for cc in capabilities)
        ]
        # Prefer a build that still gets new PyTorch releases over a newer CUDA that stopped.
        maintained = [build for build in usable if build.last_torch is None]
        build = (maintained or usable or [None])[0]
        gpu = nvidia.gpus[0] if nvidia.gpus else "NVIDIA GPU"
        if build is not None:
            cuda = f"{max_cuda[0]}.{max_cuda[1]}"  # type: ignore[index]
            return TorchChoice(
                requirement=requirement,
                index_url=build.index_url,
                kind="cuda",
                tag=build.tag,
                reason=(
                    f"{gpu} with driver {nvidia.driver} (CUDA up to {cuda}): "
                    f"PyTorch's CUDA {build.version[0]}.{build.version[1]} build"
                ),
                accepted_tags=tuple(b.tag for b in usable),
                download_gb=build.download_gb,
                disk_gb=build.disk_gb,
            )
        oldest = CUDA_BUILDS[-1].version
        warning = (
            f"The NVIDIA driver {nvidia.driver} is too old for any PyTorch build HalfSafe can use "
            f"(they need CUDA {oldest[0]}.{oldest[1]} or newer, or the card is not supported by "
            "them), so HalfSafe will run on the CPU. Install a current driver from "
            "https://www.nvidia.com/Download/index.aspx and start HalfSafe again to use the GPU."
        )
    elif facts.system == "Linux" and facts.amd_gpus:
        candidates = [
            build
            for build in ROCM_BUILDS
            if facts.rocm_version is None or build.version <= facts.rocm_version
        ] or [ROCM_BUILDS[-1]]
        build = candidates[0]
        return TorchChoice(
            requirement=requirement,
            index_url=build.index_url,
            kind="rocm",
            tag=build.tag,
            reason=f"{facts.amd_gpus[0]}: PyTorch's ROCm {build.version[0]}.{build.version[1]} build",
            download_gb=build.download_gb,
            disk_gb=build.disk_gb,
        )
    return TorchChoice(
        requirement=requirement,
        index_url=CPU_BUILD.index_url,
        kind="cpu",
        tag=CPU_BUILD.tag,
        reason="no supported GPU found: PyTorch's CPU build",
        download_gb=CPU_BUILD.download_gb,
        disk_gb=CPU_BUILD.disk_gb,
        warning=warning,
    )


def _run_probe(command: Sequence[str], timeout: float = 15) -> str | None:
    try:
        result = subprocess.run(
            list(command), capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout if result.returncode == 0 else None


def _nvml_info() -> NvidiaInfo | None:
    """Driver and CUDA version from NVML directly, for systems without nvidia-smi on PATH."""
    import ctypes

    names = ["nvml.dll"] if os.name == "nt" else ["libnvidia-ml.so.1", "libnvidia-ml.so"]
    for name in names:
        try:
            nvml = ctypes.CDLL(name)
        except OSError:
            continue
        try:
            if nvml.nvmlInit_v2() != 0:
                return None
            buffer = ctypes.create_string_buffer(96)
            cuda = ctypes.c_int()
            ok = nvml.nvmlSystemGetDriverVersion(buffer, 96) == 0
            has_cuda = nvml.nvmlSystemGetCudaDriverVersion_v2(ctypes.byref(cuda)) == 0
            nvml.nvmlShutdown()
        except (AttributeError, OSError):
            return None
        if not ok:
            return None
        max_cuda = (cuda.value // 1000, cuda.value % 1000 // 10) if has_cuda else None
        return NvidiaInfo(driver=buffer.value.decode(), max_cuda=max_cuda)
    return None


def probe_machine(system: str | None = None) -> MachineFacts:
    """Look at this machine's GPUs (runs nvidia-smi and rocminfo where present; a second or two)."""
    system = system or platform.system()
    if system == "Darwin":
        return MachineFacts(system=system)
    nvidia = None
    smi = shutil.which("nvidia-smi")
    if smi:
        text = _run_probe([smi])
        nvidia = parse_nvidia_smi(text) if text else None
        if nvidia is not None:
            query = _run_probe([smi, "--query-gpu=compute_cap", "--format=csv,noheader"])
            capabilities = parse_compute_capabilities(query or "")
            nvidia = NvidiaInfo(nvidia.driver, nvidia.max_cuda, nvidia.gpus, capabilities)
    if nvidia is None:
        nvidia = _nvml_info()
    amd: tuple[str, ...] = ()
    rocm_version = None
    if system == "Linux" and nvidia is None:
        rocminfo = shutil.which("rocminfo") or (
            "/opt/rocm/bin/rocminfo" if os.path.exists("/opt/rocm/bin/rocminfo") else None
        )
        if rocminfo:
            amd = parse_rocminfo(_run_probe([rocminfo]) or "")
        with contextlib.suppress(OSError):
            rocm_version = parse_rocm_version(Path("/opt/rocm/.info/version").read_text())
    return MachineFacts(system=system, nvidia=nvidia, amd_gpus=amd, rocm_version=rocm_version)


# --- Versions and requirements (the small part of PEP 440 that torch requirements use) -----------


def _release_key(version: str) -> tuple[tuple[int, ...], int, str]:
    public, _, local = version.strip().partition("+")
    match = re.match(r"v?(\d+(?:\.\d+)*)(?:[-_.]?(a|b|rc|alpha|beta|c)[-_.]?\d*)?", public, re.I)
    if not match:
        raise ValueError(version)
    release = tuple(int(p) for p in match.group(1).split("."))
    while len(release) > 1 and release[-1] == 0:
        release = release[:-1]
    is_final = 0 if (match.group(2) or ".dev" in public) else 1
    return release, is_final, local.lower()


def requirement_matches(requirement: str, version: str) -> bool | None:
    """Whether `version` satisfies a "torch..." requirement; None when that cannot be told here.

    Handles ==, !=, >=, <=, >, <, ~= and == with a trailing .*, which is all a torch pin needs.
    A local version in the requirement ("+cpu") must match exactly; otherwise it is ignored.
    """
    text = requirement.split(";")[0].strip()
    match = re.match(r"^torch\s*(\[[^\]]*\])?\s*(.*)$", text, re.IGNORECASE)
    if not match or match.group(2).startswith("@") or " " in match.group(2).strip():
        return None
    clauses = [c.strip() for c in match.group(2).split(",") if c.strip()]
    try:
        have = _release_key(version)
        for clause in clauses:
            op_match = re.match(r"(===|==|!=|~=|>=|<=|>|<)\s*(\S+)$", clause)
            if not op_match:
                return None
            op, target = op_match.groups()
            if not _clause_holds(op, target, version, have):
                return False
    except ValueError:
        return None
    return True


def _clause_holds(op: str, target: str, version: str, have: tuple) -> bool:
    if op == "===":
        return version.strip() == target
    if target.endswith(".*"):
        prefix = _version_tuple(target[:-2])
        full = _version_tuple(version.partition("+")[0])
        same = full[: len(prefix)] == prefix
        return same if op == "==" else not same
    want = _release_key(target)
    have_cmp = have[:2]
    want_cmp = want[:2]
    if op in ("==", "!="):
        equal = have_cmp == want_cmp and (not want[2] or have[2] == want[2])
        return equal if op == "==" else not equal
    if op == "~=":
        prefix = _version_tuple(target)[:-1]
        return have_cmp >= want_cmp and _version_tuple(version)[: len(prefix)] == prefix
    return {
        ">=": have_cmp >= want_cmp,
        "<=": have_cmp <= want_cmp,
        ">": have_cmp > want_cmp,
        "<": have_cmp < want_cmp,
    }[op]


# --- The app's own facts: version, requirements, where the environment goes ---------------------


def read_app_version(app_dir: Path) -> str:
    text = (app_dir / "app" / "__init__.py").read_text(encoding="utf-8")
    found = re.search(r"^__version__\s*=\s*[\"']([^\"']+)[\"']", text, re.MULTILINE)
    return found.group(1) if found else "unknown"


_PACKAGING_TABLES = (
    "build-system",
    "project",
    "project.optional-dependencies",
    "project.scripts",
    "project.gui-scripts",
    "project.entry-points",
)


def requirements_text(app_dir: Path) -> str:
    """The parts of pyproject.toml that decide what gets installed (dependencies, scripts)."""
    kept, table = [], ""
    for line in (app_dir / "pyproject.toml").read_text(encoding="utf-8").splitlines():
        header = re.match(r"^\s*\[+\s*([^\]]+?)\s*\]+", line)
        if header:
            table = header.group(1)
        if table in _PACKAGING_TABLES or table.startswith("project.entry-points"):
            kept.append(line.rstrip())
    return "\n".join(kept)


def requirements_hash(app_dir: Path) -> str:
    return hashlib.sha256(requirements_text(app_dir).encode()).hexdigest()[:16]


def _toml_string_array(text: str, key: str, table: str) -> list[str]:
    """`key = ["...", ...]` under `[table]`, for Pythons without tomllib (3.10)."""
    section = re.search(
        r"^\[" + re.escape(table) + r"\]\s*$(.*?)(?=^\[|\Z)", text, re.MULTILINE | re.DOTALL
    )
    array = section and re.search(
        r"^\s*" + re.escape(key) + r"\s*=\s*\[(.*?)\]", section.group(1), re.MULTILINE | re.DOTALL
    )
    if not array:
        return []
    body = re.sub(r"#[^\n]*", "", array.group(1))
    return [a or b for a, b in re.findall(r"\"([^\"]+)\"|'([^']+)'", body)]


def app_dependencies(app_dir: Path, extras: Sequence[str]) -> list[str]:
    """The app's requirement strings from pyproject.toml (for installs that cannot use -e)."""
    text = (app_dir / "pyproject.toml").read_text(encoding="utf-8")
    try:
        import tomllib
    except ImportError:
        found = _toml_string_array(text, "dependencies", "project")
        for extra in extras:
            found += _toml_string_array(text, extra, "project.optional-dependencies")
        return found
    project = tomllib.loads(text).get("project", {})
    found = list(project.get("dependencies", []))
    for extra in extras:
        found += project.get("optional-dependencies", {}).get(extra, [])
    return found


def torch_requirement(app_dir: Path) -> str:
    """The app's own torch requirement (pyproject.toml), e.g. "torch>=2.6,<3"."""
    for requirement in app_dependencies(app_dir, ()):
        if re.match(r"^torch\s*($|[<>=!~;\[])", requirement):
            return requirement.replace(" ", "")
    return DEFAULT_TORCH_REQUIREMENT


def _platform_dir(kind: str, environ: Mapping[str, str]) -> Path:
    home = Path(environ.get("HOME") or Path.home())
    if os.name == "nt":
        base = Path(environ.get("LOCALAPPDATA") or home / "AppData" / "Local") / APP_NAME
        return base / "Logs" if kind == "log" else base
    if sys.platform == "darwin":
        if kind == "log":
            return home / "Library" / "Logs" / APP_NAME
        return home / "Library" / "Application Support" / APP_NAME
    if kind == "log":
        return Path(environ.get("XDG_STATE_HOME") or home / ".local" / "state") / APP_NAME / "log"
    return Path(environ.get("XDG_DATA_HOME") or home / ".local" / "share") / APP_NAME


def data_dir(environ: Mapping[str, str]) -> Path:
    """The user's HalfSafe data folder (`HALFSAFE_DATA_DIR` overrides, as in app/core/paths.py)."""
    return (
        Path(environ["HALFSAFE_DATA_DIR"])
        if environ.get("HALFSAFE_DATA_DIR")
        else _platform_dir("data", environ)
    )


def log_dir(environ: Mapping[str, str]) -> Path:
    return (
        Path(environ["HALFSAFE_LOG_DIR"])
        if environ.get("HALFSAFE_LOG_DIR")
        else _platform_dir("log", environ)
    )


def folder_is_writable(folder: Path) -> bool:
    """Really try: os.access is wrong for Windows ACLs and for read-only mounts."""
    try:
        handle, name = tempfile.mkstemp(prefix=".halfsafe-write-test-", dir=folder)
    except OSError:
        return False
    os.close(handle)
    with contextlib.suppress(OSError):
        os.unlink(name)
    return True


@dataclass(frozen=True)
class Layout:
    """Where the environment lives and how the app gets into it."""

    venv: Path
    editable: bool  # `pip install -e <app>`; False: the app folder is read-only, see `source_link`


def choose_layout(
    app_dir: Path, environ: Mapping[str, str], writable: Callable[[Path], bool] = folder_is_writable
) -> Layout:
    """`.venv` beside the app when the app folder is writable, else one in the user's data folder.

    `HALFSAFE_VENV` names the folder outright.
    """
    app_writable = writable(app_dir)
    if environ.get("HALFSAFE_VENV"):
        return Layout(Path(environ["HALFSAFE_VENV"]).expanduser().resolve(), editable=app_writable)
    beside = app_dir / ".venv"
    if app_writable and (not beside.exists() or writable(beside)):
        return Layout(beside, editable=True)
    tag = hashlib.sha256(str(app_dir).encode()).hexdigest()[:8]
    return Layout(data_dir(environ) / "envs" / f"app-{tag}", editable=app_writable)


def venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


# Python puts the working folder first on sys.path for `-m`, so a module there named as one pip,
# venv or the app imports (an argparse.py in the folder the launcher was started from) would run
# in their place. The command below takes the folder out before it runs the module, on every
# Python from 3.10 (-P, which does the same, arrived in 3.11).
# One line, so that the setup log's "running pip: ..." line reads back as the command it ran.
_RUN_MODULE = (
    "import sys; sys.path[:1] == [''] and sys.path.pop(0); import runpy; "
    "runpy.run_module({module!r}, run_name='__main__', alter_sys=True)"
)


def module_command(python: str | Path, module: str, *arguments: str) -> list[str]:
    """`python -m module arguments`, importing nothing from the working folder."""
    return [str(python), "-c", _RUN_MODULE.format(module=module), *arguments]


def venv_script(venv: Path, name: str) -> Path:
    return (
        venv
        / ("Scripts" if os.name == "nt" else "bin")
        / (name + (".exe" if os.name == "nt" else ""))
    )


# --- What is installed now, and what has to happen ------------------------------------------------

# Run by the environment's own Python: installed versions, and packages whose files are gone.
_STATE_SCRIPT = r"""
import importlib.metadata as md, json, os, re, sys
dists, damaged = {}, []
for dist in md.distributions():
    name = re.sub(r"[-_.]+", "-", (dist.metadata["Name"] or "")).lower()
    if not name:
        continue
    dists[name] = dist.version
    for path in dist.files or ():
        if path.name == "__init__.py" and not os.path.exists(dist.locate_file(path)):
            damaged.append(name)
            break
print(json.dumps({"python": list(sys.version_info[:3]), "dists": dists, "damaged": damaged}))
"""

# Run after installing: the imports the app cannot start without.
_IMPORT_CHECK = r"""
import importlib.util, json, sys
import torch
import app.cli
missing = [m for m in ("PySide6", "diffusers", "transformers", "safetensors")
           if importlib.util.find_spec(m) is None]
if missing:
    sys.exit("missing: " + ", ".join(missing))
print(json.dumps({"torch": torch.__version__, "gpu": torch.cuda.is_available()}))
"""


@dataclass(frozen=True)
class VenvState:
    python: tuple[int, ...]
    dists: dict[str, str]
    damaged: tuple[str, ...] = ()

    @property
    def torch(self) -> str | None:
        return self.dists.get("torch")


def read_venv_state(venv: Path) -> VenvState | None:
    """What the environment holds (about 0.2 s); None when it has no working Python."""
    python = venv_python(venv)
    if not python.exists():
        return None
    try:
        result = subprocess.run(
            [str(python), "-I", "-c", _STATE_SCRIPT], capture_output=True, text=True, timeout=60
        )
        data = json.loads(result.stdout)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return VenvState(tuple(data["python"]), dict(data["dists"]), tuple(data["damaged"]))


def expected_marker(
    app_dir: Path, extras: Sequence[str], choice: TorchChoice, layout: Layout
) -> dict:
    return {
        "format": MARKER_FORMAT,
        "app_dir": str(app_dir),
        "app_version": read_app_version(app_dir),
        "requirements": requirements_hash(app_dir),
        "extras": sorted(set(extras)),
        "editable": layout.editable,
        "torch": choice.key(),
    }


_APP_KEYS = ("format", "app_dir", "app_version", "requirements", "extras", "editable")


def read_marker(venv: Path) -> dict | None:
    try:
        data = json.loads((venv / MARKER_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_marker(venv: Path, data: dict) -> None:
    """Written last, atomically: a marker only ever describes a finished install."""
    target = venv / MARKER_NAME
    temporary = target.with_name(target.name + ".tmp")
    temporary.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(temporary, target)


def remove_marker(venv: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        (venv / MARKER_NAME).unlink()


@dataclass
class Plan:
    """The work one start has to do; empty when the environment is ready."""

    create_venv: bool = False
    recreate_venv: bool = False
    install_torch: bool = False
    install_app: bool = False
    reinstall: list[str] = field(default_factory=list)  # damaged packages, as name==version
    update_marker: bool = False
    reasons: list[str] = field(default_factory=list)

    @property
    def runs_pip(self) -> bool:
        return (
            self.create_venv
            or self.recreate_venv
            or self.install_torch
            or self.install_app
            or bool(self.reinstall)
        )


def make_plan(
    expected: dict,
    marker: dict | None,
    state: VenvState | None,
    choice: TorchChoice,
    venv_exists: bool,
    repair: bool = False,
) -> Plan:
    """Decide what to do from the marker, the environment as it is, and the torch choice."""
    plan = Plan()
    if repair:
        plan.recreate_venv = venv_exists
        plan.create_venv = not venv_exists
        plan.install_torch = plan.install_app = True
        plan.reasons.append("a full reinstall was asked for")
        return plan
    if state is None or state.python < (3, 10):
        plan.recreate_venv = venv_exists
        plan.create_venv = not venv_exists
        plan.install_torch = plan.install_app = True
        plan.reasons.append(
            "the environment has no working Python"
            if venv_exists
            else "first start: nothing is installed yet"
        )
        return plan

    if marker is None:
        plan.reasons.append("no record of a finished install (new, or interrupted last time)")
        plan.install_app = True
    else:
        changed = [key for key in _APP_KEYS if marker.get(key) != expected.get(key)]
        if changed:
            plan.reasons.append("the app changed (" + ", ".join(changed) + ")")
            plan.install_app = True
    if "halfsafe" not in state.dists:
        plan.reasons.append("the app is not installed in the environment")
        plan.install_app = True

    if (
        marker is not None
        and marker.get("torch") == choice.key()
        and state.torch
        and (marker.get("torch_installed") == state.torch)
    ):
        pass  # exactly what was installed last time
    elif choice.accepts(state.torch):
        if marker is None or marker.get("torch") != choice.key():
            plan.update_marker = True
    else:
        plan.install_torch = True
        plan.reasons.append(
            f"torch {state.torch} does not fit ({choice.reason})"
            if state.torch
            else "torch is not installed"
        )

    for name in state.damaged:
        if name == "torch":
            plan.install_torch = True
        else:
            plan.reinstall.append(f"{name}=={state.dists[name]}")
        plan.reasons.append(f"files of {name} are missing")
    if plan.install_torch or plan.reinstall:
        plan.install_app = True  # cheap when nothing changes, and it re-checks every dependency
    if plan.runs_pip:
        plan.update_marker = True
    return plan


# --- Doing it ----------------------------------------------------------------------------------------


class SetupError(Exception):
    """A setup failure the user can act on; the message is one sentence, printed as is."""


class Log:
    """The setup log: everything pip says, and each step, with times."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() and path.stat().st_size > 2_000_000:
            os.replace(path, path.with_name(path.name + ".1"))
        self._file = path.open("a", encoding="utf-8", errors="replace")

    def write(self, text: str) -> None:
        self._file.write(text if text.endswith("\n") else text + "\n")
        self._file.flush()

    def step(self, text: str) -> None:
        self.write(f"[{datetime.datetime.now():%H:%M:%S}] {text}")

    def close(self) -> None:
        self._file.close()


class Setup:
    """Carries out a plan: venv, pip, verification, marker. Progress goes to stderr in plain words."""

    def __init__(
        self,
        app_dir: Path,
        layout: Layout,
        log: Log,
        extras: Sequence[str],
        environ: Mapping[str, str],
        say: Callable[[str], None],
    ) -> None:
        self.app_dir = app_dir
        self.layout = layout
        self.venv = layout.venv
        self.log = log
        self.extras = list(extras)
        self.environ = dict(environ)
        self.say = say
        self.gpu_expected = False  # set when a CUDA or ROCm build was chosen

    # The steps

    def run(self, plan: Plan, choice: TorchChoice, expected: dict) -> str:
        """Do the plan; returns the installed torch version."""
        self.gpu_expected = choice.kind in ("cuda", "rocm")
        for reason in plan.reasons:
            self.log.step(f"reason: {reason}")
        if plan.runs_pip:
            self.check_disk_space(
                choice if (plan.install_torch or plan.create_venv or plan.recreate_venv) else None
            )
            remove_marker(self.venv)  # from here on, an interruption is seen on the next start
        if plan.create_venv or plan.recreate_venv:
            self.create_venv(clear=plan.recreate_venv)
        state = read_venv_state(self.venv)
        if state is None:
            raise SetupError(f"The new environment in {self.venv} does not work. {self.see_log()}")
        if plan.install_torch:
            self.install_torch(choice, state)
        if plan.reinstall:
            self.say(
                "Repairing damaged packages: " + ", ".join(r.split("==")[0] for r in plan.reinstall)
            )
            self.pip(["install", "--force-reinstall", "--no-deps", *plan.reinstall], "repairing")
        state = read_venv_state(self.venv)
        torch_version = state.torch if state else None
        if not torch_version:
            raise SetupError(f"PyTorch did not get installed. {self.see_log()}")
        if plan.install_app:
            self.install_app(torch_version)
            if self.layout.editable:
                self.compile_app()
        if plan.runs_pip:
            torch_version = self.verify()
        if plan.update_marker or plan.runs_pip:
            marker = dict(expected)
            marker.update(
                {
                    "torch_installed": torch_version,
                    "torch_reason": choice.reason,
                    "python": platform.python_version(),
                    "installed_at": datetime.datetime.now().isoformat(timespec="seconds"),
                }
            )
            write_marker(self.venv, marker)
        return torch_version

    def check_disk_space(self, choice: TorchChoice | None) -> None:
        need_gb = APP_DISK_GB + (choice.disk_gb if choice else 0.0)
        folder = self.venv
        while not folder.exists() and folder.parent != folder:
            folder = folder.parent
        free_gb = shutil.disk_usage(folder).free / GIB
        self.log.step(f"disk: {free_gb:.1f} GB free in {folder}, about {need_gb:.1f} GB needed")
        if free_gb < need_gb:
            raise SetupError(
                f"Not enough disk space: setting up HalfSafe needs about {need_gb:.0f} GB free in "
                f"{folder}, and {free_gb:.1f} GB is free. Free some space and start HalfSafe again."
            )

    def create_venv(self, clear: bool) -> None:
        import importlib.util

        version = f"{sys.version_info[0]}.{sys.version_info[1]}"
        no_venv = SetupError(
            "This Python cannot create environments because its venv support is missing: "
            f"install it (on Debian/Ubuntu: sudo apt install python{version}-venv) and start "
            "HalfSafe again."
        )
        if importlib.util.find_spec("ensurepip") is None:
            raise no_venv
        self.say(f"Creating HalfSafe's Python environment in {self.venv}")
        clearing = ["--clear"] if clear else []
        command = module_command(sys.executable, "venv", *clearing, str(self.venv))
        self.log.step("running: " + shlex.join(command))
        result = subprocess.run(command, capture_output=True, text=True)
        self.log.write(result.stdout + result.stderr)
        if result.returncode != 0 and "ensurepip" in result.stdout + result.stderr:
            raise no_venv  # Debian's python3 without python3-venv says this
        if result.returncode != 0:
            raise SetupError(
                f"Python could not create an environment in {self.venv} ({_last_line(result.stderr)}). "
                + self.see_log()
            )

    def install_torch(self, choice: TorchChoice, state: VenvState) -> None:
        if state.torch and not choice.accepts(state.torch):
            # pip would keep a same-numbered torch of the wrong kind (CPU instead of CUDA).
            self.log.step(f"removing torch {state.torch}, which does not fit")
            self.pip(["uninstall", "--yes", "torch"], "removing the old PyTorch", install=False)
        size = f"about {choice.download_gb:.1f} GB to download" if choice.kind != "override" else ""
        self.say(f"Installing PyTorch ({choice.reason}{'; ' + size if size else ''})")
        if choice.warning:
            self.say(choice.warning)
        arguments = ["install", *shlex.split(choice.requirement)]
        if choice.index_url:
            arguments += ["--index-url", choice.index_url]
        self.pip(arguments, "PyTorch")

    def install_app(self, torch_version: str) -> None:
        # Pinning the installed torch keeps pip from swapping it for another build while it
        # resolves the app's dependencies.
        pin = f"torch=={torch_version}"
        extras = f"[{','.join(self.extras)}]" if self.extras else ""
        if self.layout.editable:
            self.say("Installing HalfSafe and its libraries (Qt, diffusers, transformers)")
            self.pip(["install", "-e", f"{self.app_dir}{extras}", pin], "HalfSafe")
        else:
            self.say(
                "Installing HalfSafe's libraries (the app folder is read-only, so it runs from there)"
            )
            requirements = [
                r
                for r in app_dependencies(self.app_dir, self.extras)
                if not re.match(r"^torch\s*($|[<>=!~;\[])", r)
            ]
            self.pip(["install", *requirements, pin], "HalfSafe's libraries")
            self.link_source()

    def compile_app(self) -> None:
        """Write the app's bytecode now, into its writable folder, so that the first launch
        reads it as every later one does instead of compiling some 150 modules from source
        (about 0.07 s of a 0.3 s launch on a 2-core machine; see docs/benchmarks.md). A failure
        costs only that time, so it is logged and setup goes on."""
        command = module_command(
            venv_python(self.venv), "compileall", "-q", "-j", "0", str(self.app_dir / "app")
        )
        self.log.step("running: " + shlex.join(command))
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as error:
            self.log.write(f"compiling the app's modules failed: {error}")
            return
        self.log.write(result.stdout + result.stderr)
        if result.returncode != 0:
            self.log.write(f"compiling the app's modules failed (exit {result.returncode})")

    def link_source(self) -> None:
        """Make the read-only app folder importable from the environment (what -e would do)."""
        python = venv_python(self.venv)
        purelib = subprocess.run(
            [str(python), "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        (Path(purelib) / "halfsafe-source.pth").write_text(
            str(self.app_dir) + "\n", encoding="utf-8"
        )

    def verify(self) -> str:
        """Import what the app needs; repair once what is broken, then give up with the log path."""
        for attempt in (1, 2):
            python = venv_python(self.venv)
            self.log.step("checking the install: import torch, app.cli")
            result = subprocess.run(
                [str(python), "-c", _IMPORT_CHECK],
                capture_output=True,
                text=True,
                cwd=str(self.venv),
            )
            self.log.write(result.stdout + result.stderr)
            if result.returncode == 0:
                try:
                    found = json.loads(result.stdout.strip().splitlines()[-1])
                except (ValueError, IndexError):
                    found = {}
                if "torch" in found:
                    if self.gpu_expected and not found.get("gpu"):
                        self.say(
                            "PyTorch is installed but cannot use the GPU (check the driver with "
                            "nvidia-smi or rocminfo); HalfSafe runs on the CPU until that works."
                        )
                    return found["torch"]
            if attempt == 2:
                break
            state = read_venv_state(self.venv)
            broken = [f"{name}=={state.dists[name]}" for name in (state.damaged if state else ())]
            module = re.search(r"No module named '([\w.]+)'", result.stderr)
            if module and state:
                top = module.group(1).split(".")[0].lower().replace("_", "-")
                if top in state.dists:
                    broken.append(f"{top}=={state.dists[top]}")
            self.say("The install looks damaged; repairing it")
            if broken:
                self.pip(
                    ["install", "--force-reinstall", "--no-deps", *sorted(set(broken))], "repairing"
                )
            self.install_app((state.torch if state else None) or "0")
        raise SetupError(
            f"HalfSafe was installed but does not start ({_last_line(result.stderr)}). "
            "Start it with --repair to reinstall everything. " + self.see_log()
        )

    # pip

    def pip(self, arguments: list[str], what: str, install: bool = True) -> None:
        command = module_command(
            venv_python(self.venv),
            "pip",
            *arguments[:1],
            "--disable-pip-version-check",
            "--no-input",
            "--no-color",
            *arguments[1:],
        )
        if install:
            command.insert(command.index("--no-input"), "--progress-bar")
            command.insert(command.index("--no-input"), "off")
        self.log.step("running pip: " + shlex.join(command))
        started = time.monotonic()
        output: list[str] = []
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            env={**self.environ, "PYTHONIOENCODING": "utf-8"},
        )
        last_output = [time.monotonic()]
        done = threading.Event()

        def keep_talking() -> None:
            while not done.wait(5):
                quiet = time.monotonic() - last_output[0]
                if quiet >= 30:
                    minutes = (time.monotonic() - started) / 60
                    self.say(f"  still working on {what} ({minutes:.0f} min so far)")
                    last_output[0] = time.monotonic()

        ticker = threading.Thread(target=keep_talking, daemon=True)
        ticker.start()
        try:
            assert process.stdout is not None
            for line in process.stdout:
                output.append(line)
                self.log.write(line.rstrip("\n"))
                shown = _progress_line(line)
                if shown:
                    self.say("  " + shown)
                    last_output[0] = time.monotonic()
            status = process.wait()
        except KeyboardInterrupt:
            process.terminate()
            raise
        finally:
            done.set()
        self.log.step(f"pip finished with status {status} after {time.monotonic() - started:.0f} s")
        if status != 0:
            raise SetupError(explain_pip_failure(what, status, "".join(output), self.log.path))

    def see_log(self) -> str:
        return f"Details are in {self.log.path}"


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no message"


def _progress_line(line: str) -> str | None:
    """pip's output, boiled down to what a person wants to see."""
    download = re.match(r"\s*Downloading\s+(\S+)\s+\(([\d.]+)\s*(kB|MB|GB)\)", line)
    if download:
        size = float(download.group(2)) * {"kB": 1e-3, "MB": 1.0, "GB": 1e3}[download.group(3)]
        if size >= 5:
            name = download.group(1).rsplit("/", 1)[-1]
            return f"downloading {name} ({download.group(2)} {download.group(3)})"
        return None
    collected = re.match(r"Installing collected packages: (.+)", line)
    if collected:
        count = len(collected.group(1).split(","))
        return f"unpacking {count} package{'s' if count != 1 else ''}"
    if line.startswith("Successfully installed"):
        return "done"
    return None


_NETWORK_SIGNS = (
    "NewConnectionError",
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Name or service not known",
    "nodename nor servname",
    "getaddrinfo failed",
    "Network is unreachable",
    "ConnectTimeoutError",
    "Read timed out",
    "ReadTimeoutError",
    "Connection aborted",
    "Connection reset",
    "Could not fetch URL",
    "No route to host",
    "ProxyError",
    "SSLError",
)


def _unreached_hosts(output: str) -> list[str]:
    """The hosts pip could not reach: those its connection errors name (urllib3's
    `host='...'`, a URL it could not fetch), else those of the indexes it was looking in."""
    named = re.findall(r"host='([^']+)'", output)
    named += re.findall(r"Could not fetch URL https?://([^/:\s]+)", output)
    if not named:
        for line in output.splitlines():
            if line.startswith(("Looking in indexes:", "Looking in links:")):
                named += re.findall(r"https?://(?:[^@/\s]*@)?([^/:\s,]+)", line)
    return list(dict.fromkeys(named))


def explain_pip_failure(what: str, status: int, output: str, log_path: Path) -> str:
    """One sentence for a failed pip run: no network, no disk space, or pip's own last words."""
    if "No space left on device" in output or "[Errno 28]" in output:
        return (
            f"The disk filled up while installing {what}: free some space and start HalfSafe "
            f"again (details in {log_path})."
        )
    if any(sign in output for sign in _NETWORK_SIGNS):
        hosts = _unreached_hosts(output)
        if hosts:  # one index can be out of reach while the rest of the internet is not
            return (
                f"Could not download {what}: {' and '.join(hosts)} could not be reached. Check "
                "the network connection, and any proxy or firewall, for "
                f"{'that host' if len(hosts) == 1 else 'those hosts'}, then start HalfSafe "
                f"again (details in {log_path})."
            )
        return (
            f"Could not download {what}: there is no network connection. Connect to the "
            f"internet and start HalfSafe again (details in {log_path})."
        )
    errors = [line.strip() for line in output.splitlines() if line.strip().startswith("ERROR:")]
    detail = errors[-1][len("ERROR:") :].strip() if errors else _last_line(output)
    return f"pip could not install {what} (exit {status}: {detail}). The full log is in {log_path}."


@contextlib.contextmanager
def setup_lock(path: Path, say: Callable[[str], None]) -> Iterator[None]:
    """One setup at a time per environment; a second start waits. The OS drops the lock on exit."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = path.open("a+")
    try:
        if os.name == "nt":
            import msvcrt

            while True:
                try:
                    msvcrt.locking(handle.fileno(), msvcrt.LK_NBLCK, 1)
                    break
                except OSError:
                    say("Another HalfSafe window is setting up; waiting for it to finish")
                    time.sleep(5)
        else:
            import fcntl

            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                say("Another HalfSafe window is setting up; waiting for it to finish")
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        yield
    finally:
        handle.close()


# --- Starting the app ----------------------------------------------------------------------------------


def display_problem(system: str, environ: Mapping[str, str], launcher: str) -> str | None:
    """Why the window cannot open here (Linux and other X11/Wayland systems without a display)."""
    if system in ("Windows", "Darwin"):
        return None
    if environ.get("DISPLAY") or environ.get("WAYLAND_DISPLAY") or environ.get("QT_QPA_PLATFORM"):
        return None
    return (
        "There is no display here (DISPLAY and WAYLAND_DISPLAY are not set), so HalfSafe's window "
        f"cannot open. Use the command line instead: '{launcher} check demo' or '{launcher} gpu' "
        "(the same as 'halfsafe check demo' and 'halfsafe gpu' inside the environment)."
    )


# The libraries Qt's window platforms load from the system, by the package that holds each on
# the distributions whose package managers the launcher knows (apt: Debian, Ubuntu; dnf:
# Fedora, RHEL; pacman: Arch). Qt's own libraries come inside PySide6. Package names as those
# distributions publish them.
SYSTEM_LIBRARY_PACKAGES: dict[str, dict[str, str]] = {
    "libxcb-cursor.so.0": {
        "apt": "libxcb-cursor0",
        "dnf": "xcb-util-cursor",
        "pacman": "xcb-util-cursor",
    },
    "libxcb-icccm.so.4": {"apt": "libxcb-icccm4", "dnf": "xcb-util-wm", "pacman": "xcb-util-wm"},
    "libxcb-keysyms.so.1": {
        "apt": "libxcb-keysyms1",
        "dnf": "xcb-util-keysyms",
        "pacman": "xcb-util-keysyms",
    },
    "libxcb-image.so.0": {
        "apt": "libxcb-image0",
        "dnf": "xcb-util-image",
        "pacman": "xcb-util-image",
    },
    "libxcb-render-util.so.0": {
        "apt": "libxcb-render-util0",
        "dnf": "xcb-util-renderutil",
        "pacman": "xcb-util-renderutil",
    },
    "libxcb-util.so.1": {"apt": "libxcb-util1", "dnf": "xcb-util", "pacman": "xcb-util"},
    "libxkbcommon-x11.so.0": {
        "apt": "libxkbcommon-x11-0",
        "dnf": "libxkbcommon-x11",
        "pacman": "libxkbcommon-x11",
    },
    "libxkbcommon.so.0": {"apt": "libxkbcommon0", "dnf": "libxkbcommon", "pacman": "libxkbcommon"},
    "libxcb-xkb.so.1": {"apt": "libxcb-xkb1", "dnf": "libxcb", "pacman": "libxcb"},
    "libxcb-randr.so.0": {"apt": "libxcb-randr0", "dnf": "libxcb", "pacman": "libxcb"},
    "libxcb-shape.so.0": {"apt": "libxcb-shape0", "dnf": "libxcb", "pacman": "libxcb"},
    "libxcb-shm.so.0": {"apt": "libxcb-shm0", "dnf": "libxcb", "pacman": "libxcb"},
    "libxcb-sync.so.1": {"apt": "libxcb-sync1", "dnf": "libxcb", "pacman": "libxcb"},
    "libxcb-xfixes.so.0": {"apt": "libxcb-xfixes0", "dnf": "libxcb", "pacman": "libxcb"},
    "libxcb-render.so.0": {"apt": "libxcb-render0", "dnf": "libxcb", "pacman": "libxcb"},
    "libxcb.so.1": {"apt": "libxcb1", "dnf": "libxcb", "pacman": "libxcb"},
    "libX11-xcb.so.1": {"apt": "libx11-xcb1", "dnf": "libX11-xcb", "pacman": "libx11"},
    "libX11.so.6": {"apt": "libx11-6", "dnf": "libX11", "pacman": "libx11"},
    "libEGL.so.1": {"apt": "libegl1", "dnf": "libglvnd-egl", "pacman": "libglvnd"},
    "libGL.so.1": {"apt": "libgl1", "dnf": "libglvnd-glx", "pacman": "libglvnd"},
    "libfontconfig.so.1": {"apt": "libfontconfig1", "dnf": "fontconfig", "pacman": "fontconfig"},
    "libfreetype.so.6": {"apt": "libfreetype6", "dnf": "freetype", "pacman": "freetype2"},
    "libdbus-1.so.3": {"apt": "libdbus-1-3", "dnf": "dbus-libs", "pacman": "dbus"},
    "libglib-2.0.so.0": {"apt": "libglib2.0-0", "dnf": "glib2", "pacman": "glib2"},
    "libgthread-2.0.so.0": {"apt": "libglib2.0-0", "dnf": "glib2", "pacman": "glib2"},
    "libwayland-client.so.0": {
        "apt": "libwayland-client0",
        "dnf": "libwayland-client",
        "pacman": "wayland",
    },
    "libwayland-cursor.so.0": {
        "apt": "libwayland-cursor0",
        "dnf": "libwayland-cursor",
        "pacman": "wayland",
    },
    "libwayland-egl.so.1": {"apt": "libwayland-egl1", "dnf": "libwayland-egl", "pacman": "wayland"},
}
INSTALL_COMMANDS = {
    "apt": ["apt-get", "install", "-y"],
    "dnf": ["dnf", "install", "-y"],
    "pacman": ["pacman", "-S", "--needed", "--noconfirm"],
}
PLATFORM_WORDS = {"xcb": "X11 (xcb)", "wayland": "Wayland"}


@dataclass(frozen=True)
class WindowLibraries:
    """What Qt's window platform lacks here: the system libraries its plugin cannot load, and
    the packages that hold them on this system (empty where its package manager is unknown)."""

    platform: str
    missing: tuple[str, ...]
    manager: str | None
    packages: tuple[str, ...]

    def install_command(self) -> list[str] | None:
        if not self.manager or not self.packages:
            return None
        return [*INSTALL_COMMANDS[self.manager], *self.packages]

    def sentence(self, launcher: str) -> str:
        names = _join(list(self.packages or self.missing))
        command = self.install_command()
        how = (
            f"install {'it' if len(self.packages) == 1 else 'them'} with "
            f"'sudo {shlex.join(command)}'"
            if command
            else "install the packages of your system that hold "
            + ("it" if len(self.missing) == 1 else "them")
        )
        return (
            f"HalfSafe's window cannot open: Qt's {PLATFORM_WORDS.get(self.platform, self.platform)} "
            f"platform needs {names}, which this system lacks; {how} and start HalfSafe again "
            f"(meanwhile the command line works: '{launcher} check demo')."
        )


def _join(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def qt_platforms(environ: Mapping[str, str]) -> list[str]:
    """The window platforms Qt tries here, in order: QT_QPA_PLATFORM's list where it is set,
    else Wayland then X11 in a Wayland session, else X11."""
    chosen = environ.get("QT_QPA_PLATFORM", "").strip()
    if chosen:
        return [name.split(":")[0].strip() for name in chosen.split(";") if name.strip()]
    if environ.get("WAYLAND_DISPLAY") or environ.get("XDG_SESSION_TYPE") == "wayland":
        return ["wayland", "xcb"]
    return ["xcb"]


def qt_plugin(venv: Path, platform_name: str) -> Path | None:
    """Qt's plugin for a window platform inside the environment's PySide6, if installed."""
    found = sorted(
        venv.glob(f"lib/python3*/site-packages/PySide6/Qt/plugins/platforms/libq{platform_name}.so")
    )
    return found[0] if found else None


def parse_ldd_missing(text: str) -> tuple[str, ...]:
    """The libraries ldd says it could not find ('libfoo.so.1 => not found'), each once."""
    missing: list[str] = []
    for line in text.splitlines():
        name, _, where = line.strip().partition(" => ")
        if where.strip() == "not found" and name not in missing:
            missing.append(name)
    return tuple(missing)


def package_manager(os_release: str, have: Callable[[str], bool]) -> str | None:
    """apt, dnf or pacman, read from /etc/os-release's ID and ID_LIKE and checked on PATH."""
    fields = dict(
        line.split("=", 1)
        for line in os_release.splitlines()
        if "=" in line and not line.startswith("#")
    )
    family = " ".join(
        fields.get(key, "").strip().strip('"').lower() for key in ("ID", "ID_LIKE")
    ).split()
    for manager, names in (
        ("apt", {"debian", "ubuntu"}),
        ("dnf", {"fedora", "rhel", "centos"}),
        ("pacman", {"arch"}),
    ):
        if names & set(family) and have(INSTALL_COMMANDS[manager][0]):
            return manager
    return None


def missing_window_libraries(
    venv: Path,
    environ: Mapping[str, str],
    ldd: Callable[[Path], str | None],
    os_release: str,
    have: Callable[[str], bool],
) -> WindowLibraries | None:
    """What keeps Qt's window from opening here, found before it starts (Qt itself aborts with
    'Could not load the Qt platform plugin', naming no library); None when a platform Qt tries
    has every library, or when that cannot be told (no ldd, no plugin, a platform such as
    offscreen that needs no system library)."""
    platforms = qt_platforms(environ)
    if not platforms or any(name not in PLATFORM_WORDS for name in platforms):
        return None
    found: list[tuple[str, tuple[str, ...]]] = []
    for name in platforms:
        plugin = qt_plugin(venv, name)
        report = ldd(plugin) if plugin is not None else None
        if report is None:
            return None
        missing = parse_ldd_missing(report)
        if not missing:
            return None
        found.append((name, missing))
    name, missing = found[-1]  # X11 is the one a Wayland session falls back on
    manager = package_manager(os_release, have)
    packages: list[str] = []
    if manager:
        for library in missing:
            package = SYSTEM_LIBRARY_PACKAGES.get(library, {}).get(manager)
            if package is None:  # a library the table does not know: name the files instead
                packages = []
                break
            if package not in packages:
                packages.append(package)
    return WindowLibraries(name, missing, manager if packages else None, tuple(packages))


def run_ldd(path: Path) -> str | None:
    """ldd's report on one of the environment's own Qt plugins (None where there is no ldd)."""
    if not shutil.which("ldd"):
        return None
    try:
        result = subprocess.run(["ldd", str(path)], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout


def _read_os_release() -> str:
    for path in ("/etc/os-release", "/usr/lib/os-release"):
        with contextlib.suppress(OSError):
            return Path(path).read_text(encoding="utf-8", errors="replace")
    return ""


def ensure_window_libraries(
    venv: Path,
    environ: Mapping[str, str],
    launcher: str,
    say: Callable[[str], None],
    ask: Callable[[str], bool] | None,
    run: Callable[[list[str]], int] | None = None,
    ldd: Callable[[Path], str | None] | None = None,
    os_release: str | None = None,
) -> str | None:
    """Make sure Qt's window can open: where a system library it loads is missing, install its
    packages when `ask` (a terminal's yes/no question; None where nobody can answer) agrees;
    returns the sentence to show when the window still cannot open, else None."""
    release = _read_os_release() if os_release is None else os_release
    ldd = ldd or run_ldd
    run = run or subprocess.call

    def have(program: str) -> bool:
        return shutil.which(program) is not None

    lacking = missing_window_libraries(venv, environ, ldd, release, have)
    if lacking is None:
        return None
    command = lacking.install_command()
    if command and ask is not None:
        as_root = command if hasattr(os, "geteuid") and os.geteuid() == 0 else ["sudo", *command]
        names = _join(list(lacking.packages))
        if ask(
            f"HalfSafe's window needs {names}, which this system lacks. Install now ({shlex.join(as_root)})? [Y/n] "
        ):
            status = run(as_root)
            if status == 0:
                lacking = missing_window_libraries(venv, environ, ldd, release, have)
                if lacking is None:
                    say(f"Installed {names}.")
                    return None
            else:
                say(f"Installing {names} failed (exit {status}).")
    return lacking.sentence(launcher)


def _ask_in_terminal(question: str) -> bool:
    try:
        answer = input(question)
    except EOFError:
        return False
    return answer.strip().lower() in ("", "y", "yes")


def app_command(venv: Path, args: Sequence[str], gui: bool) -> list[str]:
    if os.name == "nt" and gui:
        script = venv_script(venv, "halfsafe-gui")
        if script.exists():
            return [str(script), *args]
        return module_command(venv / "Scripts" / "pythonw.exe", "app", *args)
    script = venv_script(venv, "halfsafe")
    if script.exists():
        return [str(script), *args]
    return module_command(venv_python(venv), "app", *args)


def start_app(
    venv: Path, args: Sequence[str], detach: bool, log_folder: Path, say: Callable[[str], None]
) -> int:
    gui = not args
    command = app_command(venv, args, gui)
    if gui and detach:
        # The launcher's console or Terminal window can close: the app lives on without it.
        gui_log = log_folder / "app-start.log"
        with gui_log.open("ab") as output:
            if os.name == "nt":
                flags = getattr(subprocess, "DETACHED_PROCESS", 0x8) | getattr(
                    subprocess, "CREATE_NEW_PROCESS_GROUP", 0x200
                )
                process = subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=output,
                    creationflags=flags,
                    close_fds=True,
                )
            else:
                process = subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=output,
                    start_new_session=True,
                )
        with contextlib.suppress(subprocess.TimeoutExpired):
            status = process.wait(timeout=3)
            if status != 0:
                say(f"HalfSafe closed right after starting (exit {status}); see {gui_log}.")
                return status
        return 0
    if os.name == "nt":
        return subprocess.call(command)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(command[0], command)
    return 0  # not reached


def install_desktop_entry(app_dir: Path, environ: Mapping[str, str]) -> Path:
    """Add HalfSafe to the Linux applications menu (~/.local/share/applications)."""
    home = Path(environ.get("HOME") or Path.home())
    applications = Path(environ.get("XDG_DATA_HOME") or home / ".local" / "share") / "applications"
    applications.mkdir(parents=True, exist_ok=True)
    template = (app_dir / "installer" / "halfsafe.desktop").read_text(encoding="utf-8")
    text = template.replace(
        "@LAUNCHER@", desktop_exec_quote(str(app_dir / "installer" / "halfsafe.sh"))
    )
    text = text.replace("@ICON@", str(app_dir / "app" / "resources" / "icons" / "halfsafe-256.png"))
    text = "\n".join(line for line in text.splitlines() if not line.startswith("#")) + "\n"
    target = applications / "halfsafe.desktop"
    temporary = target.with_suffix(".tmp")
    temporary.write_text(text, encoding="utf-8")
    temporary.chmod(0o755)
    os.replace(temporary, target)
    return target


def desktop_exec_quote(argument: str) -> str:
    """Quote one Exec= argument as the Desktop Entry Specification asks (then escape for the file)."""
    if re.fullmatch(r"[A-Za-z0-9_./+,:@%=-]+", argument):
        quoted = argument
    else:
        quoted = '"' + re.sub(r'(["`$\\])', r"\\\1", argument) + '"'
    return quoted.replace("\\", "\\\\")


# --- Command line ----------------------------------------------------------------------------------

SETUP_OPTIONS = {
    "--setup-only": "set up (or check) the environment, then stop",
    "--dev": "also install the test tools (pytest, ruff, import-linter)",
    "--repair": "rebuild the environment from scratch",
    "--detach": "start the window detached from this console (used by double-click launchers)",
    "--where": "print the environment's folder and stop",
    "--desktop-entry": "add HalfSafe to the Linux applications menu and stop",
    "--setup-help": "show this help",
}


@dataclass
class Options:
    setup_only: bool = False
    dev: bool = False
    repair: bool = False
    detach: bool = False
    where: bool = False
    desktop_entry: bool = False
    help: bool = False
    app_args: list[str] = field(default_factory=list)


def parse_arguments(argv: Sequence[str]) -> Options:
    """Leading setup options are ours; the rest (after an optional --) goes to `halfsafe`."""
    options = Options()
    rest = list(argv)
    while rest and rest[0] in SETUP_OPTIONS:
        setattr(options, rest.pop(0)[2:].replace("-", "_").replace("setup_help", "help"), True)
    if rest and rest[0] == "--":
        rest.pop(0)
    options.app_args = rest
    return options


def _usage(launcher: str) -> str:
    lines = [
        f"usage: {launcher} [SETUP OPTIONS] [halfsafe arguments]",
        "",
        "Sets HalfSafe up on first start, then runs it: the window with no arguments,",
        f"the halfsafe command otherwise ('{launcher} check demo', '{launcher} gpu').",
        "",
        "setup options (before any halfsafe argument):",
    ]
    lines += [f"  {name:<16} {text}" for name, text in SETUP_OPTIONS.items()]
    lines += [
        "",
        "environment: HALFSAFE_TORCH_SPEC (torch requirement, e.g. torch==2.13.0),",
        "HALFSAFE_TORCH_INDEX (wheel index for torch), HALFSAFE_VENV (environment folder),",
        "HALFSAFE_LOG_DIR (where setup.log goes)",
    ]
    return "\n".join(lines)


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _notify_desktop(text: str, environ: Mapping[str, str]) -> None:
    """Started from a menu with no terminal, an error would vanish: show it as a notification."""
    if sys.stderr.isatty() or os.name == "nt" or sys.platform == "darwin":
        return
    if (environ.get("DISPLAY") or environ.get("WAYLAND_DISPLAY")) and shutil.which("notify-send"):
        with contextlib.suppress(OSError):
            subprocess.run(["notify-send", "--urgency=critical", APP_NAME, text], timeout=10)


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    environ = dict(os.environ if environ is None else environ)
    options = parse_arguments(sys.argv[1:] if argv is None else argv)
    launcher = environ.get("HALFSAFE_LAUNCHER") or "installer/halfsafe.sh"
    if options.help:
        print(_usage(launcher))
        return 0
    system = platform.system()
    if options.desktop_entry:
        target = install_desktop_entry(APP_DIR, environ)
        _say(f"HalfSafe is now in the applications menu ({target}).")
        return 0
    starting_gui = not options.app_args and not options.setup_only and not options.where
    if starting_gui:
        problem = display_problem(system, environ, launcher)
        if problem:
            _say(problem)
            return EXIT_CANNOT_RUN

    layout = choose_layout(APP_DIR, environ)
    if options.where:
        print(layout.venv)
        return 0
    folder = log_dir(environ)
    try:
        log = Log(folder / "setup.log")
    except OSError:  # a read-only home: a log somewhere is better than none
        folder = Path(tempfile.gettempdir()) / f"{APP_NAME}-logs"
        log = Log(folder / "setup.log")
    log.write(
        f"\n=== {datetime.datetime.now().isoformat(timespec='seconds')} "
        f"setup {shlex.join(sys.argv[1:] if argv is None else list(argv))} "
        f"(Python {platform.python_version()}, {system}) ==="
    )
    try:
        first_setup = read_marker(layout.venv) is None
        installed = ensure_environment(layout, options, environ, log)
        if (
            starting_gui
            and first_setup
            and installed
            and system == "Linux"
            and not environ.get("HALFSAFE_NO_DESKTOP_ENTRY")
        ):
            with contextlib.suppress(OSError):
                log.step(
                    f"added to the applications menu: {install_desktop_entry(APP_DIR, environ)}"
                )
    except SetupError as error:
        log.step(f"failed: {error}")
        _say(f"HalfSafe setup: {error}")
        _notify_desktop(f"Setup failed: {error}", environ)
        return EXIT_SETUP_FAILED
    except KeyboardInterrupt:
        log.step("interrupted")
        _say("HalfSafe setup was interrupted; start HalfSafe again to finish it.")
        return 130
    except Exception as error:  # a bug here: still one line for the user, the trace in the log
        import traceback

        log.write(traceback.format_exc())
        _say(
            f"HalfSafe setup failed unexpectedly ({type(error).__name__}: {error}). "
            f"Details are in {log.path}"
        )
        return EXIT_SETUP_FAILED
    finally:
        log.close()
    if options.setup_only:
        return 0
    if starting_gui and system not in ("Windows", "Darwin"):
        interactive = sys.stdin is not None and sys.stdin.isatty() and not options.detach
        problem = ensure_window_libraries(
            layout.venv, environ, launcher, _say, _ask_in_terminal if interactive else None
        )
        if problem:
            _say(problem)
            _notify_desktop(problem, environ)
            return EXIT_CANNOT_RUN
    return start_app(layout.venv, options.app_args, options.detach, folder, _say)


def effective_extras(requested: Sequence[str], marker: dict | None, app_dir: Path) -> list[str]:
    """Extras only ever add packages: keep those an earlier start installed (the test tools stay
    when the window is started after the test command), so the two never undo each other."""
    extras = set(requested)
    if marker and marker.get("app_dir") == str(app_dir):
        extras |= set(marker.get("extras") or [])
    return sorted(extras)


def ensure_environment(
    layout: Layout, options: Options, environ: Mapping[str, str], log: Log
) -> bool:
    """Make the environment ready; returns True when pip ran. Quiet when nothing has to change."""
    started = time.monotonic()
    # The launcher always installs the window (`gui`); the core alone is what ComfyUI's
    # environment gets from the node package.
    requested = ["gui", "dev"] if options.dev else ["gui"]
    extras = effective_extras(requested, read_marker(layout.venv), APP_DIR)
    # An explicit torch spec makes the machine's GPUs irrelevant: skip running nvidia-smi.
    pinned = environ.get("HALFSAFE_TORCH_SPEC", "").strip()
    facts = MachineFacts(system=platform.system()) if pinned else probe_machine()
    choice = choose_torch(facts, torch_requirement(APP_DIR), environ)
    log.step(
        f"torch choice: {choice.requirement} from {choice.index_url or 'pip defaults'} ({choice.reason})"
    )
    expected = expected_marker(APP_DIR, extras, choice, layout)

    def plan_now() -> Plan:
        return make_plan(
            expected,
            read_marker(layout.venv),
            read_venv_state(layout.venv),
            choice,
            venv_exists=layout.venv.exists(),
            repair=options.repair,
        )

    plan = plan_now()
    if not plan.runs_pip and not plan.update_marker:
        log.step(f"ready, nothing to install ({time.monotonic() - started:.2f} s)")
        if options.setup_only:
            _say(f"HalfSafe is set up in {layout.venv}.")
        return False
    lock = log.path.with_name(
        "setup-" + hashlib.sha256(str(layout.venv).encode()).hexdigest()[:8] + ".lock"
    )
    with setup_lock(lock, _say):
        plan = plan_now()  # another window may have finished the work while we waited
        if plan.runs_pip:
            _say(f"Setting up HalfSafe ({'; '.join(plan.reasons)}). A log is kept in {log.path}")
        torch_version = Setup(APP_DIR, layout, log, extras, environ, _say).run(
            plan, choice, expected
        )
    elapsed = time.monotonic() - started
    log.step(f"ready: torch {torch_version}, {elapsed:.0f} s")
    if plan.runs_pip:
        _say(f"HalfSafe is set up (PyTorch {torch_version}) in {elapsed:.0f} s.")
    return plan.runs_pip


if __name__ == "__main__":
    raise SystemExit(main())
