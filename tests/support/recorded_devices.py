"""Hardware reports of devices this machine is not, as `halfsafe gpu` records them: what the
probe reads from PyTorch and the OS (name, compute capability, memory, driver) and the verdicts
the self-test recorded there, classified and given their recommendation by core's own `assess`
against the shipped quirks table, beside the computer's CPU entry (its RAM)."""

from __future__ import annotations

from app.core.hardware import DeviceInfo, HardwareReport, assess
from app.core.hardware.selftest_records import OpResult, SelfTestResult

GIB_MB = 1024


def _cpu(ram_gb: int, os_name: str = "linux", os_version: str = "6.8.0") -> DeviceInfo:
    cpu = DeviceInfo(
        kind="cpu",
        index=None,
        name="x86 CPU" if os_name == "linux" else "Apple M1",
        memory_total_mb=ram_gb * GIB_MB,
        os_name=os_name,
        os_version=os_version,
        features=frozenset({"avx2"}),
    )
    return assess(cpu, SelfTestResult.skipped())


def _passed(fp16: str = "pass", bf16: str = "pass", failed: tuple[str, ...] = ()) -> SelfTestResult:
    details = [OpResult(op, "fp16", "fail") for op in failed]
    details += [OpResult("matmul 1024", "bf16", bf16), OpResult("matmul 1024", "fp16", fp16)]
    return SelfTestResult(fp16=fp16, bf16=bf16, details=details, seconds=4.2, cached=True)


def _nvidia(name: str, capability: tuple[int, int], memory_mb: int, test: SelfTestResult):
    card = DeviceInfo(
        kind="cuda",
        index=0,
        name=name,
        capability=capability,
        memory_total_mb=memory_mb,
        driver="560.94",
        vendor="nvidia",
        os_name="linux",
        os_version="6.8.0",
    )
    return assess(card, test)


def _report(device: DeviceInfo, cpu: DeviceInfo) -> HardwareReport:
    return HardwareReport(halfsafe="0.1.0", torch="2.13.0", cuda="12.8", devices=[device, cpu])


def gtx_1660() -> HardwareReport:
    """A GTX 1660 (TU116, 6 GB): fp16 convolutions fail the self-test, bf16 is right but not
    native (no bf16 tensor cores before compute capability 8.0)."""
    test = _passed(fp16="fail", failed=("conv2d 320->320 3x3",))
    return _report(_nvidia("NVIDIA GeForce GTX 1660", (7, 5), 5936, test), _cpu(16))


def rtx_2060() -> HardwareReport:
    """An RTX 2060 (TU106, 6 GB): fp16 fast and right, bf16 right but emulated."""
    return _report(_nvidia("NVIDIA GeForce RTX 2060", (7, 5), 5926, _passed()), _cpu(32))


def v100() -> HardwareReport:
    """A Tesla V100 (Volta, compute capability 7.0, 16 GB) in a 64 GB server: no int8 tensor
    cores."""
    return _report(_nvidia("Tesla V100-SXM2-16GB", (7, 0), 16151, _passed()), _cpu(64))


def m1() -> HardwareReport:
    """An M1 Mac with 16 GB on macOS 14.6: Apple's GPU computes bf16 through fp32."""
    gpu = DeviceInfo(
        kind="mps",
        index=None,
        name="Apple M1",
        memory_total_mb=10923,
        driver="macOS 14.6",
        vendor="apple",
        os_name="darwin",
        os_version="14.6",
    )
    return _report(assess(gpu, _passed()), _cpu(16, "darwin", "14.6"))


def gtx_1660_super() -> HardwareReport:
    """A GTX 1660 SUPER (TU116, 6 GB, no tensor cores) in a 16 GB computer: fp16 convolutions
    fail the self-test, so it computes in fp32."""
    test = _passed(fp16="fail", failed=("conv2d 320->320 3x3",))
    card = _nvidia("NVIDIA GeForce GTX 1660 SUPER", (7, 5), 5928, test)
    return _report(card, _cpu(16))


def rtx_3060() -> HardwareReport:
    """An RTX 3060 (GA106, 12 GB, Ampere: bf16 native, int8 tensor cores, no fp8) in a 32 GB
    computer."""
    return _report(_nvidia("NVIDIA GeForce RTX 3060", (8, 6), 12036, _passed()), _cpu(32))


def cpu_only() -> HardwareReport:
    """A computer without a GPU HalfSafe can use: its CPU and 32 GB of RAM."""
    cpu = _cpu(32)
    return HardwareReport(halfsafe="0.1.0", torch="2.13.0", cuda=None, devices=[cpu])
