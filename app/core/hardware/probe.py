"""One device described from what PyTorch, NVML and the OS report: name, capability, memory,
driver, OS and the CPU's instruction sets (before any classification).

Imports torch only inside the functions that need it.
"""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
from pathlib import Path

from app.core.errors import DeviceError
from app.core.hardware.records import DeviceInfo


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
