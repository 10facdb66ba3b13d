"""The hardware report: every device assessed, with its self-test, and notes for the user.

Imports torch only inside the functions that need it.
"""

from __future__ import annotations

from collections.abc import Iterable

from app import __version__
from app.core.hardware.classify import assess
from app.core.hardware.devices import list_devices
from app.core.hardware.probe import nvidia_gpu_names
from app.core.hardware.records import DeviceInfo, HardwareReport
from app.core.hardware.selftest import SelfTestResult
from app.core.hardware.selftest_cache import self_test_key, self_test_skips
from app.core.jobs import CancelToken, ProgressCallback, no_progress
from app.core.precision import fused, kernels


def hardware_report(
    self_test: bool = True,
    retest: bool = False,
    on_progress: ProgressCallback = no_progress,
    cancel: CancelToken | None = None,
    stat_budget_s: float | None = None,
) -> HardwareReport:
    """Every device, assessed; with `self_test`, each one's self-test too (cached per device).

    `retest` runs the self-test even where a cached verdict exists. `stat_budget_s` is the
    statistical self-test's budget per device in seconds (None: 10 s on a GPU, 1 s on a CPU;
    0: not run; see `selftest.run_self_test`). Without `self_test` a
    cached verdict is still used. Takes seconds on first run (the self-test), then tens of ms.
    Runs on the calling thread; writes self-test results under `paths.cache_dir()`.
    """
    import torch

    from app.core.hardware import selftest

    devices = []
    for info in list_devices():
        key = self_test_key(info)
        if self_test:
            result = selftest.run_self_test(
                info.torch_device,
                key=key,
                skip=self_test_skips(info),
                retest=retest,
                stat_budget_s=stat_budget_s,
                on_progress=on_progress,
                cancel=cancel,
            )
        else:
            result = selftest.cached_result(key) or SelfTestResult.skipped(
                "The self-test was not run and no earlier result is cached."
            )
        devices.append(assess(info, result))
    cuda = torch.version.cuda
    found = kernels.installed_kernels()
    kitchen = fused.installed()
    return HardwareReport(
        halfsafe=__version__,
        # Exactly str: torch.__version__ is torch's TorchVersion, a str subclass that would
        # import torch wherever the report is unpickled (the GUI process).
        torch=str(torch.__version__),
        cuda=None if cuda is None else str(cuda),
        devices=devices,
        notes=_report_notes(devices)
        + [kernel_note(k) for k in found]
        + ([kitchen_note(kitchen)] if kitchen is not None else []),
        attention_kernels=found,
    )


def kernel_note(kernel: kernels.AttentionKernel) -> str:
    """One sentence on an attention or fused kernel HalfSafe does not ship, found here."""
    if kernel.fused:
        how = (
            f"has replaced PyTorch's {kernel.op} in this process ({kernel.function}): "
            "HalfSafe's auto attention backend runs it, every named backend runs PyTorch's own "
            "kernels, and a failing check compares the two"
        )
    elif kernel.patched_sdpa:
        how = (
            f"has replaced PyTorch's scaled_dot_product_attention in this process "
            f"({kernel.function}): HalfSafe's auto attention backend runs it, every named "
            "backend runs PyTorch's own kernel, and a failing check compares the two"
        )
    elif kernel.diffusers_backend:
        how = (
            f"is diffusers' attention backend here ({kernels.DIFFUSERS_BACKEND_ENV}="
            f"{kernel.diffusers_backend}): the transformer models' attention runs it"
        )
    else:
        how = (
            "is installed but not in use here (HalfSafe runs PyTorch's attention); other tools "
            "in this environment may use it"
        )
    kind = f"Fused {kernel.op} kernel" if kernel.fused else "Attention kernel"
    return f"{kind} {kernel.words()} {how}."


def kitchen_note(version: str) -> str:
    """One sentence on comfy-kitchen found here (`precision.fused`): what runs it, and where
    HalfSafe compares it."""
    words = f"comfy-kitchen {version}" if version else "comfy-kitchen"
    return (
        f"{words} is installed: HalfSafe's own runs do not use it, but ComfyUI applies the "
        "rotary embeddings of Flux-style models through its fused kernels; explaining a black "
        "ComfyUI image whose check runs clean compares them with PyTorch's own on this device."
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
