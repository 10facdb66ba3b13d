"""The devices PyTorch can use here: every one listed, one described, and the one a `device`
setting picks (or the sentence saying why it cannot be used).

Imports torch only inside the functions that need it.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from app.core.errors import DeviceError
from app.core.hardware.classify import assess
from app.core.hardware.probe import _probe_cpu, _probe_cuda, _probe_mps, _probe_xpu
from app.core.hardware.records import DeviceInfo
from app.core.hardware.selftest_cache import _cached_self_test

if TYPE_CHECKING:
    import torch


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
