"""What this computer's devices can do in fp16, bf16 and TF32, and the precision to use on each.

A device is first described from what PyTorch, NVML and the OS report, then classified from
its capability and the data-driven quirks table (`resources/quirks.json`), then given a
recommendation: every precision setting resolved (never "auto"), each with a one-line reason.

Importing this module does not import torch; the functions that need it import it.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import platform
import re
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app import __version__
from app.core import paths
from app.core.errors import DeviceError
from app.core.jobs import CancelToken, ProgressCallback, no_progress
from app.core.selftest import SelfTestResult
from app.core.settings import FIELDS, PRECISION_KEYS, PrecisionSettings

if TYPE_CHECKING:
    import torch

FP16_CLASSES = ("fast", "slow", "unreliable", "unsupported")  # best to worst
BF16_CLASSES = ("native", "emulated", "unsupported")
KINDS = ("cuda", "rocm", "mps", "xpu", "cpu")
BACKENDS = (*KINDS, "directml")

QUIRKS_FILE = "quirks.json"
_MATCH_KEYS = {"backend", "vendor", "name", "arch", "capability", "os", "os_version", "driver"}
_RANGE_KEYS = {"min", "max", "below"}
_CLASS_EFFECTS = {"fp16": FP16_CLASSES, "bf16": BF16_CLASSES}


# --------------------------------------------------------------------------------------------
# The quirks table


@dataclass(frozen=True)
class Quirk:
    """One known fault or limit: which devices it hits, what it changes, and where it is from.

    `effects` maps "fp16"/"bf16" to a (worse) class, "tf32" to False, or a precision setting
    (a key of `PrecisionSettings`) to the value that device needs.
    """

    id: str
    summary: str
    source: str
    match: Mapping[str, Any]
    effects: Mapping[str, Any]

    def matches(self, device: DeviceInfo) -> bool:
        """Whether every condition of the match rule holds for `device`."""
        rule = self.match
        if "backend" in rule and device.backend not in _as_list(rule["backend"]):
            return False
        if "vendor" in rule and device.vendor not in _as_list(rule["vendor"]):
            return False
        if "name" in rule and not re.search(rule["name"], device.name, re.IGNORECASE):
            return False
        if "arch" in rule and not (device.arch and re.search(rule["arch"], device.arch)):
            return False
        if "capability" in rule:
            if device.capability is None:
                return False
            bounds = {k: tuple(v) for k, v in rule["capability"].items()}
            if not _in_range(tuple(device.capability), bounds):
                return False
        if "os" in rule and device.os_name not in _as_list(rule["os"]):
            return False
        for key, value in (("os_version", device.os_version), ("driver", device.driver)):
            if key in rule:
                if not value or not re.search(r"\d", value):
                    return False
                bounds = {k: _version(v) for k, v in rule[key].items()}
                if not _in_range(_version(value), bounds):
                    return False
        return True

    def to_json(self) -> dict[str, str]:
        return {"id": self.id, "summary": self.summary, "source": self.source}


def load_quirks(path: Path | None = None) -> tuple[Quirk, ...]:
    """Read and check the quirks table; a malformed entry raises ValueError naming it."""
    path = path or paths.resource(QUIRKS_FILE)
    info = path.stat()
    stamp = (info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_dev, info.st_ino)
    return _load_quirks_cached(str(path), stamp)


@functools.lru_cache(maxsize=4)
def _load_quirks_cached(path: str, _stamp: tuple[int, ...]) -> tuple[Quirk, ...]:
    document = json.loads(Path(path).read_text(encoding="utf-8"))
    quirks: list[Quirk] = []
    seen: set[str] = set()
    for number, entry in enumerate(document["quirks"]):
        name = entry.get("id", f"entry {number}")
        try:
            quirk = Quirk(
                id=entry["id"],
                summary=entry["summary"],
                source=entry["source"],
                match=dict(entry["match"]),
                effects=dict(entry["effects"]),
            )
            _check_quirk(quirk)
        except (KeyError, TypeError, ValueError, re.error) as error:
            raise ValueError(f"{path}: quirk '{name}' is malformed: {error}") from error
        if quirk.id in seen:
            raise ValueError(f"{path}: quirk id '{quirk.id}' appears twice")
        seen.add(quirk.id)
        quirks.append(quirk)
    return tuple(quirks)


def _check_quirk(quirk: Quirk) -> None:
    if not quirk.summary.strip() or "\n" in quirk.summary:
        raise ValueError("summary must be one non-empty line")
    if not quirk.source.startswith("https://"):
        raise ValueError("source must be an https:// address")
    if not quirk.match or set(quirk.match) - _MATCH_KEYS:
        raise ValueError(f"match keys must be among {sorted(_MATCH_KEYS)}")
    for backend in _as_list(quirk.match.get("backend", [])):
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}")
    for key in ("name", "arch"):
        if key in quirk.match:
            re.compile(quirk.match[key])
    for key in ("capability", "os_version", "driver"):
        if key in quirk.match and (not quirk.match[key] or set(quirk.match[key]) - _RANGE_KEYS):
            raise ValueError(f"{key} must be a range with keys among {sorted(_RANGE_KEYS)}")
    if not quirk.effects:
        raise ValueError("effects must not be empty")
    for key, value in quirk.effects.items():
        if key in _CLASS_EFFECTS:
            if value not in _CLASS_EFFECTS[key]:
                raise ValueError(f"{key} effect must be one of {_CLASS_EFFECTS[key]}")
        elif key == "tf32":
            if value is not False:
                raise ValueError("a tf32 effect can only turn TF32 off")
        elif key in PRECISION_KEYS:
            if value == "auto":
                raise ValueError(f"{key} effect must be resolved, not 'auto'")
            FIELDS[key].validate(value)
        else:
            raise ValueError(f"unknown effect {key!r}")


# --------------------------------------------------------------------------------------------
# Devices


@dataclass(frozen=True)
class DeviceInfo:
    """One device: what the system reports, its classification, and the recommended settings.

    `kind` is the contract's device kind ("cuda", "rocm", "mps", "xpu", "cpu"); `backend` is
    the same except for a DirectML adapter ("directml"). `arch` is an AMD GPU's gfx target.
    `features` holds hints the classification uses (CPU instruction sets, Intel XMX).
    `recommended` maps every precision setting to a resolved value; `reasons` says why, one line
    per setting.
    """

    kind: str
    index: int | None
    name: str
    capability: tuple[int, int] | None = None
    memory_total_mb: int | None = None
    driver: str | None = None
    vendor: str = ""
    arch: str | None = None
    os_name: str = ""
    os_version: str = ""
    backend: str = ""
    features: frozenset[str] = frozenset()
    fp16: str = "fast"
    bf16: str = "native"
    tf32: bool = False
    quirks: tuple[Quirk, ...] = ()
    recommended: Mapping[str, Any] = field(default_factory=dict)
    reasons: Mapping[str, str] = field(default_factory=dict)
    self_test: SelfTestResult | None = None

    def __post_init__(self) -> None:
        if not self.backend:
            object.__setattr__(self, "backend", self.kind)

    @property
    def torch_device(self) -> str:
        """The PyTorch device string: "cuda:0" (ROCm too), "mps", "xpu:0" or "cpu"."""
        if self.kind in ("cuda", "rocm"):
            return f"cuda:{self.index or 0}"
        if self.kind == "xpu":
            return f"xpu:{self.index or 0}"
        return self.kind

    def recommended_settings(self) -> PrecisionSettings:
        return PrecisionSettings(**self.recommended)

    def to_json(self) -> dict[str, Any]:
        """This device as `halfsafe gpu --json` lists it."""
        test = self.self_test or SelfTestResult.skipped()
        return {
            "kind": self.kind,
            "index": self.index,
            "name": self.name,
            "capability": list(self.capability) if self.capability else None,
            "memory_total_mb": self.memory_total_mb,
            "driver": self.driver,
            "fp16": self.fp16,
            "bf16": self.bf16,
            "tf32": self.tf32,
            "quirks": [q.to_json() for q in self.quirks],
            "self_test": test.to_json(),
            "recommended": dict(self.recommended),
            "reasons": dict(self.reasons),
        }


@dataclass
class HardwareReport:
    """Every device PyTorch can use on this computer, assessed, plus notes for the user."""

    halfsafe: str
    torch: str
    cuda: str | None
    devices: list[DeviceInfo]
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The object `halfsafe gpu --json` prints (see DESIGN.md)."""
        return {
            "halfsafe": self.halfsafe,
            "torch": self.torch,
            "cuda": self.cuda,
            "devices": [d.to_json() for d in self.devices],
        }


def list_devices() -> list[DeviceInfo]:
    """Every device PyTorch can use, described and classified (no self-test; cheap).

    Order: CUDA/ROCm GPUs by index, Apple MPS, Intel XPUs, then the CPU, which is always there.
    """
    import torch

    found: list[DeviceInfo] = []
    if torch.cuda.is_available():
        found += [_probe_cuda(i) for i in range(torch.cuda.device_count())]
    if _mps_available():
        found.append(_probe_mps())
    if _xpu_available():
        found += [_probe_xpu(i) for i in range(torch.xpu.device_count())]
    found.append(_probe_cpu())
    return [assess(d, _cached_self_test(d)) for d in found]


def describe_device(device: torch.device | str) -> DeviceInfo:
    """Describe, classify and recommend for one device, without running the self-test.

    Cheap (no kernels run); uses a cached self-test verdict when one exists. Raises
    `DeviceError` for a device PyTorch cannot use.
    """
    import torch

    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise DeviceError(
            f"'{device}' is not a device name; use cpu, cuda, cuda:N, mps or xpu."
        ) from error
    if device.type == "cuda":
        index = _check_index("cuda", device.index, _cuda_count())
        info = _probe_cuda(index)
    elif device.type == "mps":
        if not _mps_available():
            raise DeviceError(_MPS_MISSING)
        info = _probe_mps()
    elif device.type == "xpu":
        index = _check_index("xpu", device.index, _xpu_count())
        info = _probe_xpu(index)
    elif device.type == "cpu":
        info = _probe_cpu()
    else:
        raise DeviceError(
            f"HalfSafe cannot run on the '{device.type}' device; use cpu, cuda, mps or xpu."
        )
    return assess(info, _cached_self_test(info))


def pick_device(spec: str = "auto") -> torch.device:
    """The torch device for a `device` setting: auto, cpu, cuda, cuda:N, mps, xpu or xpu:N.

    "auto" takes the CUDA/ROCm GPU with the most memory, else Apple MPS, else an Intel XPU,
    else the CPU. An explicit device is honoured, or `DeviceError` says why it cannot be.
    """
    import torch

    text = (spec or "auto").strip().lower()
    if text == "auto":
        count = _cuda_count()
        if count:
            memory = [torch.cuda.get_device_properties(i).total_memory for i in range(count)]
            return torch.device("cuda", max(range(count), key=lambda i: (memory[i], -i)))
        if _mps_available():
            return torch.device("mps")
        if _xpu_count():
            return torch.device("xpu", 0)
        return torch.device("cpu")
    match = re.fullmatch(r"(cpu|cuda|mps|xpu)(?::(\d+))?", text)
    if not match or (match[1] in ("cpu", "mps") and match[2] is not None):
        raise DeviceError(f"'{spec}' is not a device; use auto, cpu, cuda, cuda:N, mps or xpu.")
    kind, number = match[1], None if match[2] is None else int(match[2])
    if kind == "cpu":
        return torch.device("cpu")
    if kind == "mps":
        if not _mps_available():
            raise DeviceError(_MPS_MISSING)
        return torch.device("mps")
    if kind == "cuda":
        return torch.device("cuda", _check_index("cuda", number, _cuda_count()))
    return torch.device("xpu", _check_index("xpu", number, _xpu_count()))


_MPS_MISSING = (
    "Apple's GPU (mps) is not available: it needs an Apple silicon Mac with macOS 12.3 or later "
    "and a PyTorch build with MPS; choose auto or cpu instead."
)


def _check_index(kind: str, index: int | None, count: int) -> int:
    import torch

    if count == 0:
        if kind == "cuda":
            if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
                raise DeviceError(
                    f"This PyTorch ({torch.__version__}) is a CPU-only build, so no GPU can be "
                    "used; install a CUDA or ROCm build of PyTorch, or choose the cpu device."
                )
            raise DeviceError(
                "PyTorch finds no usable NVIDIA or AMD GPU here (check the GPU driver), so "
                "cuda cannot be used; choose auto or cpu instead."
            )
        raise DeviceError("PyTorch finds no Intel GPU (xpu) here; choose auto or cpu instead.")
    index = 0 if index is None else index
    if index >= count:
        have = ", ".join(f"{kind}:{i}" for i in range(count))
        raise DeviceError(f"There is no {kind}:{index} on this computer; PyTorch sees {have}.")
    return index


def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _mps_available() -> bool:
    import torch

    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def _xpu_available() -> bool:
    return _xpu_count() > 0


def _xpu_count() -> int:
    import torch

    xpu = getattr(torch, "xpu", None)
    try:
        return xpu.device_count() if xpu is not None and xpu.is_available() else 0
    except (RuntimeError, AttributeError):
        return 0


def _os_facts() -> tuple[str, str]:
    system = platform.system().lower()
    if system == "darwin":
        return system, platform.mac_ver()[0]
    return system, platform.release()


def _probe_cuda(index: int) -> DeviceInfo:
    import torch

    props = torch.cuda.get_device_properties(index)
    os_name, os_version = _os_facts()
    common = {
        "index": index,
        "name": str(props.name).strip() or f"GPU {index}",
        "capability": (int(props.major), int(props.minor)),
        "memory_total_mb": int(props.total_memory) // 2**20,
        "os_name": os_name,
        "os_version": os_version,
    }
    if getattr(torch.version, "hip", None):
        arch = str(getattr(props, "gcnArchName", "") or "").split(":")[0] or None
        return DeviceInfo(kind="rocm", vendor="amd", arch=arch, driver=_amdgpu_driver(), **common)
    return DeviceInfo(kind="cuda", vendor="nvidia", driver=nvidia_driver(), **common)


def _probe_mps() -> DeviceInfo:
    import torch

    memory = None
    try:
        memory = int(torch.mps.recommended_max_memory()) // 2**20
    except (AttributeError, RuntimeError):
        memory = _system_memory_mb()
    os_name, os_version = _os_facts()
    return DeviceInfo(
        kind="mps",
        index=None,
        name=_mac_chip_name() or "Apple GPU",
        memory_total_mb=memory,
        # Apple's GPU driver ships with the OS, so the macOS version is the driver version.
        driver=f"macOS {os_version}" if os_version else None,
        vendor="apple",
        os_name=os_name or "darwin",
        os_version=os_version,
    )


def _probe_xpu(index: int) -> DeviceInfo:
    import torch

    props = torch.xpu.get_device_properties(index)
    os_name, os_version = _os_facts()
    features = set()
    if getattr(props, "has_subgroup_matrix_multiply_accumulate", False):
        features.add("xmx")
    return DeviceInfo(
        kind="xpu",
        index=index,
        name=str(props.name),
        memory_total_mb=int(props.total_memory) // 2**20,
        driver=str(getattr(props, "driver_version", "") or "") or None,
        vendor="intel",
        os_name=os_name,
        os_version=os_version,
        features=frozenset(features),
    )


def _probe_cpu() -> DeviceInfo:
    os_name, os_version = _os_facts()
    return DeviceInfo(
        kind="cpu",
        index=None,
        name=_cpu_name(),
        memory_total_mb=_system_memory_mb(),
        vendor="",
        os_name=os_name,
        os_version=os_version,
        features=_pinned_bf16(_cpu_features()),
    )


# Names the CPU's bf16 class outright, whatever the CPU has: "native" or "emulated". The numbers
# are the same either way (torch computes bf16 on any CPU); what changes is what HalfSafe
# prefers, so the tests pin it and run both branches on any machine (tests/conftest.py).
CPU_BF16_ENV = "HALFSAFE_CPU_BF16"
_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def _pinned_bf16(features: frozenset[str]) -> frozenset[str]:
    """`features` with the bf16 flags that `HALFSAFE_CPU_BF16` pins, if it is set."""
    pinned = os.environ.get(CPU_BF16_ENV, "").strip().lower()
    if not pinned:
        return features
    if pinned == "native":
        return features | {"avx512_bf16"}
    if pinned == "emulated":
        return features - _BF16_FLAGS
    raise DeviceError(
        f"{CPU_BF16_ENV} is '{pinned}'; it takes 'native' or 'emulated' (or unset it to detect)."
    )


def nvidia_driver() -> str | None:
    """The NVIDIA driver version from NVML, or None where NVML or the driver is missing."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver, no library, no GPU: all just "unknown"
        return None
    try:
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # noqa: BLE001
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def nvidia_gpu_names() -> list[str]:
    """Names of the NVIDIA GPUs the driver sees (via NVML), whether or not PyTorch can use them."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001
        return []
    try:
        names = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
            names.append(name.decode() if isinstance(name, bytes) else str(name))
        return names
    except Exception:  # noqa: BLE001
        return []
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _amdgpu_driver() -> str | None:
    try:
        text = Path("/sys/module/amdgpu/version").read_text(encoding="ascii").strip()
    except OSError:
        return None
    return text or None


def _mac_chip_name() -> str | None:
    try:
        out = subprocess.run(
            ["sysctl", "-n", "machdep.cpu.brand_string"],
            capture_output=True,
            text=True,
            timeout=2,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _cpu_name() -> str:
    try:
        for line in (
            Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines()
        ):
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if platform.system() == "Darwin":
        chip = _mac_chip_name()
        if chip:
            return chip
    return platform.processor() or platform.machine() or "CPU"


def _cpu_features() -> frozenset[str]:
    """The CPU instruction-set flags that matter for bf16 (Linux /proc/cpuinfo, macOS sysctl)."""
    wanted = {"avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16"}
    try:
        for line in (
            Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines()
        ):
            if line.startswith(("flags", "Features")):
                return frozenset(set(line.split(":", 1)[1].split()) & wanted | _arm_bf16(line))
    except OSError:
        pass
    if platform.system() == "Darwin":
        try:
            out = subprocess.run(
                ["sysctl", "-n", "hw.optional.arm.FEAT_BF16"],
                capture_output=True,
                text=True,
                timeout=2,
                check=False,
            )
            if out.stdout.strip() == "1":
                return frozenset({"bf16"})
        except (OSError, subprocess.SubprocessError):
            pass
    return frozenset()


def _arm_bf16(line: str) -> set[str]:
    return {"bf16"} if line.startswith("Features") and "bf16" in line.split() else set()


def _system_memory_mb() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    except (ValueError, OSError, AttributeError):
        return None


# --------------------------------------------------------------------------------------------
# Classification and recommendation


def assess(
    device: DeviceInfo,
    self_test: SelfTestResult | None = None,
    quirks: Sequence[Quirk] | None = None,
) -> DeviceInfo:
    """Classify `device` (capability, quirks, self-test) and attach the recommendation.

    Pure: returns a new DeviceInfo. A dtype that failed the self-test is lowered to
    "unreliable" (fp16) or "unsupported" (bf16), whatever its capability suggests.
    """
    quirks = load_quirks() if quirks is None else quirks
    matched = tuple(q for q in quirks if q.matches(device))
    fp16, bf16, tf32 = _base_classes(device)
    for quirk in matched:
        fp16 = _worse(FP16_CLASSES, fp16, quirk.effects.get("fp16"))
        bf16 = _worse(BF16_CLASSES, bf16, quirk.effects.get("bf16"))
        if quirk.effects.get("tf32") is False:
            tf32 = False
    test = self_test if self_test is not None and self_test.ran else None
    if test is not None and test.fp16 == "fail":
        fp16 = _worse(FP16_CLASSES, fp16, "unreliable")
    if test is not None and test.bf16 == "fail":
        bf16 = "unsupported"
    classified = replace(
        device, fp16=fp16, bf16=bf16, tf32=tf32, quirks=matched, self_test=self_test
    )
    recommended, reasons = _recommend(classified, test)
    return replace(classified, recommended=recommended, reasons=reasons)


def _base_classes(device: DeviceInfo) -> tuple[str, str, bool]:
    """What the device kind and capability alone say; quirks can only make these worse."""
    if device.backend == "cuda":
        ampere = (device.capability or (0, 0)) >= (8, 0)
        return "fast", "native" if ampere else "emulated", ampere
    if device.backend == "rocm":
        return "fast", "native", False
    if device.backend == "mps":
        # bf16 works on Apple's GPU from macOS 14, computed through fp32 on M1/M2.
        return "fast", "emulated", False
    if device.backend == "xpu":
        return "fast", "native" if "xmx" in device.features else "emulated", False
    if device.backend == "directml":
        return "fast", "native", False
    native = bool(device.features & _BF16_FLAGS)
    return "slow", "native" if native else "emulated", False


def _worse(order: tuple[str, ...], current: str, other: str | None) -> str:
    if other is None:
        return current
    return max(current, other, key=order.index)


def _quirk_for(device: DeviceInfo, effect: str) -> Quirk | None:
    """The quirk that set the device's class for `effect` ("fp16" or "bf16"), if any."""
    value = getattr(device, effect)
    for quirk in device.quirks:
        if quirk.effects.get(effect) == value:
            return quirk
    return None


def _recommend(
    device: DeviceInfo, test: SelfTestResult | None
) -> tuple[dict[str, Any], dict[str, str]]:
    rec: dict[str, Any] = {}
    why: dict[str, str] = {}
    bf16_ok = device.bf16 == "native"
    if device.kind == "cpu":
        base = "fp32"
        base_why = "On a CPU fp16 is emulated and several times slower than fp32, so fp32 is both safe and fastest"
        if bf16_ok:
            base_why += " (this CPU has native bf16, which can be faster at some loss of detail)"
    elif device.fp16 == "fast":
        base = "fp16"
        passed = " and passed the self-test" if test is not None and test.fp16 == "pass" else ""
        base_why = f"fp16 is fast on this device{passed}; it halves memory and time against fp32"
    elif bf16_ok:
        base = "bf16"
        base_why = f"{_fp16_problem(device, test)}; bf16 is native here and keeps fp32's range"
    else:
        base = "fp32"
        base_why = f"{_fp16_problem(device, test)}; bf16 is {device.bf16} here, so fp32 it is"

    rec["precision"], why["precision"] = base, base_why
    rec["unet_precision"] = base
    why["unet_precision"] = (
        "Follows precision: the UNet runs every step, so its dtype sets the speed"
    )
    rec["text_encoder_precision"] = base
    why["text_encoder_precision"] = (
        "Follows precision: text encoders run once per prompt; the health check moves one to "
        "fp32 only if a model's encoder overflows"
    )
    rec["text_encoder_2_precision"] = base
    why["text_encoder_2_precision"] = (
        "Follows the text encoder: SDXL's second encoder moves on its own only if it overflows"
    )
    rec["text_encoder_3_precision"] = base
    why["text_encoder_3_precision"] = (
        "Follows the text encoder: SD3's T5 encoder moves on its own only if it overflows"
    )
    if base == "fp16" and bf16_ok:
        rec["vae_precision"] = "bf16"
        why["vae_precision"] = (
            "bf16 has fp32's range, so the VAE overflow that blackens SDXL images cannot happen, "
            "at half of fp32's memory"
        )
    elif base == "fp16":
        rec["vae_precision"] = "fp32"
        why["vae_precision"] = (
            f"fp32, like --no-half-vae: SDXL's VAE overflows in fp16 and bf16 is {device.bf16} "
            "here; it costs a fraction of a second per image"
        )
    else:
        rec["vae_precision"] = base
        why["vae_precision"] = (
            "Follows precision: in fp32 the VAE cannot overflow"
            if base == "fp32"
            else "Follows precision: bf16 has fp32's range, so the VAE cannot overflow"
        )

    rec["upcast_attention"] = False
    why["upcast_attention"] = (
        "Attention already runs in fp32"
        if base == "fp32"
        else "No fault of this device needs it; the health check turns it on for models whose "
        "attention overflows (SD 2.x)"
    )
    rec["attention_backend"], why["attention_backend"] = _attention_choice(device, base, test)
    rec["attention_reduced_precision"] = False
    why["attention_reduced_precision"] = (
        "Reduced-precision sums in the math attention kernel can overflow for little speed"
    )
    rec["allow_tf32"] = device.tf32
    why["allow_tf32"] = (
        "TF32 runs fp32 matrix work on tensor cores, several times faster, with fp32's range"
        if device.tf32
        else "This device has no TF32 (NVIDIA Ampere or newer only), so the setting does nothing"
    )
    rec["fp16_reduced_precision_reduction"] = True
    why["fp16_reduced_precision_reduction"] = (
        "PyTorch's default; the health check turns it off only for a model that overflows "
        "because of it"
        if base == "fp16"
        else "PyTorch's default; it has no effect while nothing runs in fp16"
    )
    rec["fp16_accumulation"] = False
    why["fp16_accumulation"] = (
        "Full fp16 accumulation turns any sum past 65504 into inf; never on by default"
    )
    rec["t5_fp32_feed_forward"] = False
    why["t5_fp32_feed_forward"] = (
        "A per-model fix: the health check turns it on for a T5 text encoder that overflows"
    )
    for key in ("fp32_modules", "bf16_modules", "clamp_modules"):
        rec[key] = []
        why[key] = "A per-model fix: the health check names the layers of a model that overflow"
    rec["nan_check"] = True
    why["nan_check"] = "Costs nothing per step and catches black images before they are saved"
    rec["auto_fix"] = "auto"
    why["auto_fix"] = "Repairs only the part that went non-finite and remembers the fix"

    components = (
        "unet_precision",
        "vae_precision",
        "text_encoder_precision",
        "text_encoder_2_precision",
        "text_encoder_3_precision",
    )
    forced: dict[str, str] = {}  # setting -> the quirk reason that forced it
    for quirk in device.quirks:
        for key, value in quirk.effects.items():
            if key in PRECISION_KEYS:
                rec[key] = value
                why[key] = forced[key] = f"{quirk.summary} [{quirk.id}]"
    # The all-fp32 switches and the per-component dtypes must tell the same story.
    if rec.get("no_half"):
        for key in ("precision", *components):
            rec[key], why[key] = "fp32", forced.get("no_half", why.get(key, ""))
    if rec.get("no_half_vae"):
        rec["vae_precision"] = "fp32"
        why["vae_precision"] = forced.get("no_half_vae", why["vae_precision"])
    rec["no_half_vae"] = rec["vae_precision"] == "fp32"
    why["no_half_vae"] = forced.get("no_half_vae") or (
        "The VAE runs in fp32 (see vae_precision)"
        if rec["no_half_vae"]
        else f"The VAE runs in {rec['vae_precision']}, which has the range it needs"
    )
    rec["no_half"] = all(rec[k] == "fp32" for k in components) and rec["precision"] == "fp32"
    why["no_half"] = forced.get("no_half") or (
        "Everything runs in fp32 on this device, as with --no-half"
        if rec["no_half"]
        else "Half precision is usable here; a targeted fix from the health check beats --no-half"
    )
    ordered = {key: rec[key] for key in PRECISION_KEYS}
    PrecisionSettings(**ordered)  # every value valid for the schema
    return ordered, {key: why[key] for key in PRECISION_KEYS}


def _fp16_problem(device: DeviceInfo, test: SelfTestResult | None) -> str:
    failed = test.failed_ops("fp16") if test is not None else []
    quirk = _quirk_for(device, "fp16")
    if quirk is not None:
        text = f"{quirk.summary.rstrip('.')} [{quirk.id}]"
        if failed:
            text += f"; the self-test confirms it ({', '.join(failed)})"
        elif test is not None and test.fp16 == "pass":
            text += " (the self-test passed, but this fault depends on the shapes a model uses)"
        return text
    if failed:
        return f"fp16 failed the self-test in {', '.join(failed)}"
    return f"fp16 is {device.fp16} on this device"


def _attention_choice(
    device: DeviceInfo, dtype: str, test: SelfTestResult | None
) -> tuple[str, str]:
    """The fastest attention backend known to work here in `dtype`, and why."""
    candidates = ("flash", "efficient", "cudnn", "math")
    if test is not None:
        passed = test.attention_backends(dtype)
        for backend in candidates:
            if backend in passed:
                return backend, (
                    f"The fastest attention backend that passed the self-test in {dtype} "
                    f"(passed: {', '.join(passed)})"
                )
    cap = device.capability or (0, 0)
    if device.backend == "cuda":
        if dtype in ("fp16", "bf16") and cap >= (8, 0):
            return (
                "flash",
                "Flash attention runs on Ampere and newer in fp16/bf16 and is the fastest",
            )
        if cap >= (5, 0):
            return (
                "efficient",
                "Memory-efficient attention runs on this GPU in this dtype; flash needs Ampere and fp16/bf16",
            )
        return "math", "The plain math kernel is the only attention backend for this GPU"
    if device.backend == "rocm" and device.arch and re.match(r"gfx9(0a|4\d|5\d)$", device.arch):
        return (
            "efficient",
            "Memory-efficient attention is built for AMD Instinct (CDNA2/CDNA3) GPUs",
        )
    if device.backend == "cpu":
        return "flash", "PyTorch's CPU flash-attention kernel is the fastest on a CPU"
    return (
        "math",
        "The math kernel is the attention backend that runs everywhere; no faster one is known to work here",
    )


def _cached_self_test(device: DeviceInfo) -> SelfTestResult | None:
    from app.core import selftest

    return selftest.cached_result(self_test_key(device))


def self_test_key(device: DeviceInfo) -> str:
    """The self-test cache key for `device`: its name, driver and this PyTorch version."""
    import torch

    from app.core import selftest

    return selftest.cache_key(device.name, device.driver, torch.__version__, device.kind)


def self_test_skips(device: DeviceInfo) -> dict[str, str]:
    """The half dtypes not worth testing on `device` (classified unsupported), with the reason."""
    skips = {}
    for dtype in ("fp16", "bf16"):
        if getattr(device, dtype) == "unsupported":
            quirk = _quirk_for(device, dtype)
            reason = f"{dtype} is not supported on this device"
            skips[dtype] = f"{reason} [{quirk.id}]" if quirk else reason
    return skips


# --------------------------------------------------------------------------------------------
# The report


def hardware_report(
    self_test: bool = True,
    retest: bool = False,
    on_progress: ProgressCallback = no_progress,
    cancel: CancelToken | None = None,
) -> HardwareReport:
    """Every device, assessed; with `self_test`, each one's self-test too (cached per device).

    `retest` runs the self-test even where a cached verdict exists. Without `self_test` a
    cached verdict is still used. Takes seconds on first run (the self-test), then tens of ms.
    Runs on the calling thread; writes self-test results under `paths.cache_dir()`.
    """
    import torch

    from app.core import selftest

    devices = []
    for info in list_devices():
        key = self_test_key(info)
        if self_test:
            result = selftest.run_self_test(
                info.torch_device,
                key=key,
                skip=self_test_skips(info),
                retest=retest,
                on_progress=on_progress,
                cancel=cancel,
            )
        else:
            result = selftest.cached_result(key) or SelfTestResult.skipped(
                "The self-test was not run and no earlier result is cached."
            )
        devices.append(assess(info, result))
    return HardwareReport(
        halfsafe=__version__,
        torch=str(torch.__version__),
        cuda=torch.version.cuda,
        devices=devices,
        notes=_report_notes(devices),
    )


def _report_notes(devices: Iterable[DeviceInfo]) -> list[str]:
    import torch

    notes = []
    gpus = [d for d in devices if d.kind != "cpu"]
    if not any(d.kind in ("cuda", "rocm") for d in gpus):
        invisible = nvidia_gpu_names()
        if invisible:
            build = "a CPU-only build" if torch.version.cuda is None else "unable to use them"
            notes.append(
                f"The NVIDIA driver sees {', '.join(invisible)}, but this PyTorch "
                f"({torch.__version__}) is {build}; install a CUDA build of PyTorch to use it."
            )
    try:
        import importlib.util

        if importlib.util.find_spec("torch_directml") is not None:
            notes.append(
                "torch-directml is installed, but HalfSafe runs on CUDA, ROCm, MPS, XPU or the "
                "CPU; DirectML adapters are not used (and have no bf16)."
            )
    except (ImportError, ValueError):
        pass
    if not gpus:
        notes.append("No GPU is available to PyTorch here, so everything runs on the CPU in fp32.")
    return notes


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _version(text: str) -> tuple[int, ...]:
    """ "14.5" -> (14, 5, 0, 0); "macOS 15.1" -> (15, 1, 0, 0); "560.94" -> (560, 94, 0, 0)."""
    numbers = [int(n) for n in re.findall(r"\d+", str(text))][:4]
    return tuple(numbers + [0] * (4 - len(numbers)))


def _in_range(value: tuple[int, ...], bounds: Mapping[str, tuple[int, ...]]) -> bool:
    if "min" in bounds and value < bounds["min"]:
        return False
    if "max" in bounds and value > bounds["max"]:
        return False
    return not ("below" in bounds and value >= bounds["below"])


def device_entry(devices: Sequence[DeviceInfo], wanted: str) -> DeviceInfo | None:
    """The device of a report's list that the device setting `wanted` picks: auto (or a
    device that is not there) picks the first listed; a ROCm device also answers to cuda and
    cuda:N, as PyTorch names it."""
    if not devices:
        return None
    for device in devices:
        kind, index = device.kind, device.index
        names = {str(kind)} | ({f"{kind}:{index}"} if index is not None else set())
        if kind == "rocm":
            names |= {"cuda"} | ({f"cuda:{index}"} if index is not None else set())
        if wanted in names:
            return device
    return devices[0]
