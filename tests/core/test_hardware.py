"""The hardware report: real device descriptions (faked torch/NVML answers) give the
classification and the settings a knowledgeable user would pick; devices are picked as asked."""

from __future__ import annotations

import dataclasses
import json
import pickle
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy
import pytest
import torch

from app.cli.text import hardware_text
from app.core import hardware, paths
from app.core.errors import DeviceError, HalfSafeError
from app.core.hardware import DeviceInfo, probe, selftest, selftest_stats
from app.core.hardware.records import Bounds, QuirkMatch
from app.core.hardware.selftest import OpResult, SelfTestResult
from app.core.precision import lowbit
from app.core.settings import PRECISION_KEYS, PrecisionSettings

GIB = 2**30


@dataclass
class FakeProps:
    """What `torch.cuda.get_device_properties` answers."""

    name: str
    major: int
    minor: int
    total_memory: int = 8 * GIB
    gcnArchName: str = ""  # noqa: N815 - torch's spelling


class FakeNVML:
    """Stands in for pynvml: a driver version and the GPUs the driver sees, or no driver."""

    class NVMLError(Exception):
        pass

    def __init__(self, driver: str | None = "560.94", names: tuple[str, ...] = ()) -> None:
        self.driver, self.names = driver, names

    def nvmlInit(self) -> None:  # noqa: N802
        if self.driver is None:
            raise self.NVMLError("NVML Shared Library Not Found")

    def nvmlShutdown(self) -> None:  # noqa: N802
        pass

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        return self.driver

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.names)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        return index

    def nvmlDeviceGetName(self, handle: int) -> str:  # noqa: N802
        return self.names[handle]


@pytest.fixture
def machine(monkeypatch):
    """Configure what torch, NVML and the OS report; returns a function that does it."""

    def configure(
        gpus: list[FakeProps] = (),
        *,
        hip: str | None = None,
        driver: str | None = "560.94",
        mps_macos: str | None = None,
        chip: str = "Apple M2",
        nvml_names: tuple[str, ...] = (),
        cpu_flags: frozenset[str] = frozenset(),
    ) -> None:
        gpus = list(gpus)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: bool(gpus))
        monkeypatch.setattr(torch.cuda, "device_count", lambda: len(gpus))
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: gpus[i])
        monkeypatch.setattr(torch.version, "hip", hip)
        monkeypatch.setattr(torch.version, "cuda", None if hip or not gpus else "12.8")
        monkeypatch.setitem(sys.modules, "pynvml", FakeNVML(driver, nvml_names))
        monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps_macos is not None)
        monkeypatch.setattr(probe, "_cpu_features", lambda: cpu_flags)
        # The flags faked here are the CPU's: the suite's pin (tests/conftest.py) is lifted.
        monkeypatch.delenv(hardware.CPU_BF16_ENV, raising=False)
        monkeypatch.setattr(probe, "_amdgpu_driver", lambda: None)
        if mps_macos is not None:
            monkeypatch.setattr(probe.platform, "system", lambda: "Darwin")
            monkeypatch.setattr(
                probe.platform, "mac_ver", lambda: (mps_macos, ("", "", ""), "arm64")
            )
            monkeypatch.setattr(probe, "_mac_chip_name", lambda: chip)
            monkeypatch.setattr(torch.mps, "recommended_max_memory", lambda: 16 * GIB)

    return configure


def nvidia(name: str, major: int, minor: int, memory_gb: int = 8) -> FakeProps:
    return FakeProps(name, major, minor, memory_gb * GIB)


def amd(name: str, arch: str, major: int, minor: int) -> FakeProps:
    return FakeProps(name, major, minor, 16 * GIB, gcnArchName=f"{arch}:sramecc-:xnack-")


def quirk_ids(info: hardware.DeviceInfo) -> set[str]:
    return {q.id for q in info.quirks}


def assert_resolved(info: hardware.DeviceInfo) -> None:
    """Every precision setting present, valid, never 'auto', and explained in one line."""
    assert list(info.recommended) == list(PRECISION_KEYS)
    # auto_fix's "auto" is a choice (repair at once); vae_tiling's is decided by each job from
    # its picture's size, which no recommendation knows.
    chosen = [k for k in PRECISION_KEYS if k not in ("auto_fix", "vae_tiling")]
    assert "auto" not in [info.recommended[k] for k in chosen]
    assert info.recommended["attention_backend"] != "auto"
    PrecisionSettings(**info.recommended)
    assert set(info.reasons) == set(PRECISION_KEYS)
    for reason in info.reasons.values():
        assert reason.strip() and "\n" not in reason
        # Said in the user's words: a setting is named by its label, never its key.
        assert not [k for k in PRECISION_KEYS if "_" in k and k in reason], reason


# --- NVIDIA ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["NVIDIA GeForce GTX 1660 SUPER", "NVIDIA GeForce GTX 1650"],
)
def test_gtx16_fp16_is_unreliable_and_everything_runs_in_fp32(machine, name):
    machine([nvidia(name, 7, 5, 6)])
    info = hardware.describe_device("cuda:0")

    assert (info.kind, info.fp16, info.bf16, info.tf32) == ("cuda", "unreliable", "emulated", False)
    assert quirk_ids(info) == {"nvidia-turing-gtx16-fp16-nan"}
    rec = info.recommended
    assert rec["precision"] == "fp32"
    assert [rec["unet_precision"], rec["vae_precision"], rec["text_encoder_precision"]] == [
        "fp32",
        "fp32",
        "fp32",
    ]
    assert rec["no_half"] is True and rec["no_half_vae"] is True
    assert rec["attention_backend"] == "efficient"  # flash has no fp32 kernel
    assert "nvidia-turing-gtx16-fp16-nan" in info.reasons["precision"]
    assert info.driver == "560.94"
    assert info.capability == (7, 5)
    assert_resolved(info)


@pytest.mark.parametrize(
    "name",
    [
        "NVIDIA GeForce GTX 1660 Ti with Max-Q Design",
        "NVIDIA GeForce GTX 1650 Ti",
        "NVIDIA GeForce GTX 1630",
        "NVIDIA GeForce MX450",
        "NVIDIA GeForce MX550",
        "NVIDIA T400 4GB",
        "NVIDIA T600",
        "NVIDIA T1000 8GB",
        "NVIDIA T1200 Laptop GPU",
        "NVIDIA T550 Laptop GPU",
        "Quadro T1000",
        "Quadro T2000 with Max-Q Design",
        "NVIDIA CMP 30HX",
    ],
)
def test_tu116_tu117_siblings_carry_the_gtx16_quirk(machine, name):
    machine([nvidia(name, 7, 5, 4)])
    info = hardware.describe_device("cuda")
    assert info.fp16 == "unreliable", name
    assert info.recommended["precision"] == "fp32"


@pytest.mark.parametrize(
    ("name", "major", "minor"),
    [
        ("Tesla T4", 7, 5),
        ("NVIDIA T4", 7, 5),
        ("NVIDIA T10", 7, 5),
        ("NVIDIA GeForce RTX 2060", 7, 5),
        ("Quadro RTX 4000", 7, 5),
        ("NVIDIA TITAN RTX", 7, 5),
        ("NVIDIA GeForce MX570", 8, 6),
        ("NVIDIA RTX A2000", 8, 6),
        ("NVIDIA RTX 2000 Ada Generation", 8, 9),
    ],
)
def test_turing_cards_with_tensor_cores_are_not_caught_by_the_gtx16_quirk(
    machine, name, major, minor
):
    machine([nvidia(name, major, minor)])
    info = hardware.describe_device("cuda:0")
    assert info.fp16 == "fast", name
    assert info.quirks == ()
    assert info.recommended["precision"] == "fp16"


def test_gtx_1080_pascal_fp16_is_slow_so_fp32(machine):
    machine([nvidia("NVIDIA GeForce GTX 1080", 6, 1)])
    info = hardware.describe_device("cuda:0")
    assert (info.fp16, info.bf16, info.tf32) == ("slow", "emulated", False)
    assert quirk_ids(info) == {"nvidia-pascal-cc61-slow-fp16"}
    assert info.recommended["precision"] == "fp32"
    assert info.recommended["no_half"] is True
    assert info.recommended["attention_backend"] == "efficient"
    assert "1/64" in info.reasons["precision"]
    assert_resolved(info)


def test_p100_fp16_is_fast_with_an_fp32_vae(machine):
    machine([nvidia("Tesla P100-PCIE-16GB", 6, 0, 16)])
    info = hardware.describe_device("cuda:0")
    assert (info.fp16, info.bf16, info.tf32) == ("fast", "emulated", False)
    assert info.quirks == ()
    rec = info.recommended
    assert rec["precision"] == rec["unet_precision"] == rec["text_encoder_precision"] == "fp16"
    # No native bf16: the VAE goes to fp32, which is --no-half-vae.
    assert rec["vae_precision"] == "fp32" and rec["no_half_vae"] is True
    assert rec["no_half"] is False
    assert rec["attention_backend"] == "efficient"
    assert_resolved(info)


@pytest.mark.parametrize(
    ("name", "major", "minor", "memory"),
    [
        ("NVIDIA GeForce RTX 4090", 8, 9, 24),
        ("NVIDIA GeForce RTX 3060", 8, 6, 12),
        ("NVIDIA H100 80GB HBM3", 9, 0, 80),
    ],
)
def test_ampere_and_newer_fp16_with_a_bf16_vae_flash_attention_and_tf32(
    machine, name, major, minor, memory
):
    machine([nvidia(name, major, minor, memory)])
    info = hardware.describe_device("cuda:0")
    assert (info.fp16, info.bf16, info.tf32) == ("fast", "native", True)
    assert info.quirks == ()
    rec = info.recommended
    assert rec["precision"] == rec["unet_precision"] == rec["text_encoder_precision"] == "fp16"
    # SDXL's VAE overflows in fp16; bf16 has fp32's range at fp16's cost.
    assert rec["vae_precision"] == "bf16"
    assert rec["no_half"] is False and rec["no_half_vae"] is False
    assert rec["upcast_attention"] is False
    assert rec["attention_backend"] == "flash"
    assert rec["allow_tf32"] is True
    assert rec["fp16_accumulation"] is False and rec["nan_check"] is True
    assert info.memory_total_mb == memory * 1024
    assert_resolved(info)


def test_tesla_k80_has_no_fp16(machine):
    machine([nvidia("Tesla K80", 3, 7, 12)])
    info = hardware.describe_device("cuda:0")
    assert (info.fp16, info.tf32) == ("unsupported", False)
    assert quirk_ids(info) == {"nvidia-below-cc53-no-fp16"}
    assert info.recommended["precision"] == "fp32"
    assert info.recommended["no_half"] is True
    assert info.recommended["attention_backend"] == "math"
    assert_resolved(info)


def test_tesla_t4_fp16_fast_without_bf16(machine):
    machine([nvidia("Tesla T4", 7, 5, 16)])
    info = hardware.describe_device("cuda:0")
    assert (info.fp16, info.bf16, info.tf32) == ("fast", "emulated", False)
    rec = info.recommended
    assert (rec["precision"], rec["vae_precision"], rec["attention_backend"]) == (
        "fp16",
        "fp32",
        "efficient",
    )
    assert rec["allow_tf32"] is False
    assert_resolved(info)


def test_missing_nvml_is_not_an_error(machine):
    machine([nvidia("NVIDIA GeForce RTX 3060", 8, 6)], driver=None)
    info = hardware.describe_device("cuda:0")
    assert info.driver is None
    assert info.fp16 == "fast"


def test_pynvml_not_installed_is_not_an_error(machine, monkeypatch):
    machine([nvidia("NVIDIA GeForce RTX 3060", 8, 6)])
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    assert hardware.describe_device("cuda:0").driver is None


# --- AMD, Apple, CPU, DirectML ---------------------------------------------------------------


def test_rx_6800_xt_rdna2_has_no_bf16(machine):
    machine([amd("AMD Radeon RX 6800 XT", "gfx1030", 10, 3)], hip="6.2.41133")
    info = hardware.describe_device("cuda:0")
    assert (info.kind, info.arch) == ("rocm", "gfx1030")
    assert (info.fp16, info.bf16, info.tf32) == ("fast", "unsupported", False)
    assert quirk_ids(info) == {"amd-rdna1-rdna2-no-bf16"}
    rec = info.recommended
    assert (rec["precision"], rec["vae_precision"], rec["no_half_vae"]) == ("fp16", "fp32", True)
    assert rec["attention_backend"] == "math"
    assert info.to_json()["kind"] == "rocm"
    assert_resolved(info)


def test_rx_7900_xtx_rdna3_has_native_bf16(machine):
    machine([amd("AMD Radeon RX 7900 XTX", "gfx1100", 11, 0)], hip="6.2.41133")
    info = hardware.describe_device("cuda:0")
    assert (info.kind, info.fp16, info.bf16, info.tf32) == ("rocm", "fast", "native", False)
    assert quirk_ids(info) == {"amd-rdna3-aotriton-attention-nan"}  # attention only
    assert info.recommended["attention_backend"] == "classic"
    assert (info.recommended["precision"], info.recommended["vae_precision"]) == ("fp16", "bf16")
    assert_resolved(info)


def test_vega_radeon_vii_has_no_bf16(machine):
    machine([amd("AMD Radeon VII", "gfx906", 9, 6)], hip="6.2.41133")
    info = hardware.describe_device("cuda:0")
    assert info.bf16 == "unsupported"
    assert quirk_ids(info) == {"amd-gcn-vega-no-bf16"}


def test_instinct_mi300_is_not_caught_by_the_gcn_quirk(machine):
    machine([amd("AMD Instinct MI300X", "gfx942", 9, 4)], hip="6.2.41133")
    info = hardware.describe_device("cuda:0")
    assert (info.bf16, info.quirks) == ("native", ())
    assert info.recommended["attention_backend"] == "efficient"


def test_apple_m2_on_macos_15_needs_attention_upcast(machine):
    machine(mps_macos="15.1")
    info = hardware.describe_device("mps")
    assert (info.kind, info.name, info.index) == ("mps", "Apple M2", None)
    assert (info.fp16, info.bf16, info.tf32) == ("fast", "emulated", False)
    assert quirk_ids(info) == {
        "apple-mps-macos145-attention-overflow",
        "apple-mps-classic-attention-nan",
    }
    rec = info.recommended
    assert rec["precision"] == "fp16"
    assert rec["upcast_attention"] is True
    assert "apple-mps-macos145-attention-overflow" in info.reasons["upcast_attention"]
    assert rec["vae_precision"] == "fp32" and rec["no_half_vae"] is True
    assert rec["attention_backend"] == "math"
    assert info.driver == "macOS 15.1"
    assert info.memory_total_mb == 16 * 1024
    assert_resolved(info)


def test_apple_m2_on_macos_14_4_needs_no_upcast(machine):
    machine(mps_macos="14.4")
    info = hardware.describe_device("mps")
    assert quirk_ids(info) == {"apple-mps-classic-attention-nan"}  # no upcast quirk
    assert info.recommended["upcast_attention"] is False
    assert info.recommended["precision"] == "fp16"
    assert info.bf16 == "emulated"


def test_apple_on_macos_13_has_no_bf16(machine):
    machine(mps_macos="13.6.1")
    info = hardware.describe_device("mps")
    assert info.bf16 == "unsupported"
    assert quirk_ids(info) == {
        "apple-mps-no-bf16-before-macos14",
        "apple-mps-classic-attention-nan",
    }


@pytest.mark.parametrize("flags", [frozenset(), frozenset({"avx512_bf16"})])
def test_cpu_runs_fp32(machine, flags):
    machine(cpu_flags=flags)
    info = hardware.describe_device("cpu")
    assert (info.kind, info.index, info.capability) == ("cpu", None, None)
    assert (info.fp16, info.tf32) == ("slow", False)
    assert info.bf16 == ("native" if flags else "emulated")
    rec = info.recommended
    assert rec["precision"] == "fp32" and rec["no_half"] is True
    assert rec["vae_precision"] == "fp32" and rec["allow_tf32"] is False
    assert_resolved(info)


@pytest.mark.parametrize(
    ("flags", "pin", "bf16"),
    [
        (frozenset(), "native", "native"),
        (frozenset({"avx512_bf16", "amx_bf16"}), "emulated", "emulated"),
        (frozenset({"avx512_bf16"}), " Native ", "native"),
        (frozenset({"avx512_bf16"}), "", "native"),
    ],
)
def test_the_cpus_bf16_class_can_be_pinned(machine, monkeypatch, flags, pin, bf16):
    machine(cpu_flags=flags)
    monkeypatch.setenv(hardware.CPU_BF16_ENV, pin)
    info = hardware.describe_device("cpu")
    assert info.bf16 == bf16
    # What the device reports and what HalfSafe prefers follow the pin alike.
    assert ("native bf16" in info.reasons["precision"]) == (bf16 == "native")


def test_a_bad_bf16_pin_is_one_sentence(machine, monkeypatch):
    machine()
    monkeypatch.setenv(hardware.CPU_BF16_ENV, "fast")
    with pytest.raises(DeviceError, match="HALFSAFE_CPU_BF16 is 'fast'; it takes 'native' or"):
        hardware.describe_device("cpu")


def test_directml_adapter_has_no_bf16():
    adapter = hardware.DeviceInfo(
        kind="cuda", backend="directml", index=0, name="AMD Radeon RX 6600", vendor="amd"
    )
    info = hardware.assess(adapter)
    assert info.bf16 == "unsupported"
    assert quirk_ids(info) == {"directml-no-bf16"}
    assert info.recommended["vae_precision"] == "fp32"


# --- The self-test feeds the recommendation --------------------------------------------------


def _test_result(fp16: str, bf16: str, failed: tuple[str, str] | None = None) -> SelfTestResult:
    details = [OpResult("attention:flash", d, "pass", 1e-4, 1e-2) for d in ("fp16", "bf16")]
    if failed:
        details.append(OpResult(failed[0], failed[1], "fail", None, 1e-2, 0.0, "NaN"))
    return SelfTestResult(fp16=fp16, bf16=bf16, details=details)


def test_failed_fp16_self_test_moves_an_rtx_4090_to_bf16(machine):
    machine([nvidia("NVIDIA GeForce RTX 4090", 8, 9, 24)])
    probed = hardware.describe_device("cuda:0")
    info = hardware.assess(probed, _test_result("fail", "pass", ("conv2d 320->640", "fp16")))
    assert info.fp16 == "unreliable"
    assert info.recommended["precision"] == "bf16"
    assert info.recommended["vae_precision"] == "bf16"
    assert "conv2d 320->640" in info.reasons["precision"]


def test_failed_bf16_self_test_withdraws_bf16(machine):
    machine([nvidia("NVIDIA GeForce RTX 4090", 8, 9, 24)])
    probed = hardware.describe_device("cuda:0")
    info = hardware.assess(probed, _test_result("pass", "fail", ("matmul", "bf16")))
    assert info.bf16 == "unsupported"
    assert info.recommended["vae_precision"] == "fp32"


def test_passed_self_test_does_not_clear_the_gtx16_quirk(machine):
    machine([nvidia("NVIDIA GeForce GTX 1660 SUPER", 7, 5, 6)])
    info = hardware.assess(hardware.describe_device("cuda:0"), _test_result("pass", "pass"))
    assert info.fp16 == "unreliable"
    assert info.recommended["precision"] == "fp32"
    assert "self-test passed" in info.reasons["precision"]


# --- Picking a device ------------------------------------------------------------------------


def test_auto_picks_the_gpu_with_the_most_memory(machine):
    machine(
        [
            nvidia("NVIDIA GeForce GTX 1660 SUPER", 7, 5, 6),
            nvidia("NVIDIA GeForce RTX 4090", 8, 9, 24),
        ]
    )
    assert hardware.pick_device("auto") == torch.device("cuda", 1)
    assert hardware.pick_device("cuda:0") == torch.device("cuda", 0)
    assert hardware.pick_device("cuda") == torch.device("cuda", 0)
    assert hardware.pick_device("cpu") == torch.device("cpu")


def test_auto_falls_back_to_mps_then_cpu(machine):
    machine(mps_macos="15.1")
    assert hardware.pick_device("auto") == torch.device("mps")
    machine()
    assert hardware.pick_device("auto") == torch.device("cpu")


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("cuda:3", "cuda:3"),
        ("mps", "mps"),
        ("xpu", "xpu"),
        ("tpu", "not a device"),
        ("cpu:1", "not a device"),
    ],
)
def test_unavailable_devices_raise_one_plain_sentence(machine, spec, words):
    machine([nvidia("NVIDIA GeForce RTX 3060", 8, 6)])
    with pytest.raises(DeviceError) as caught:
        hardware.pick_device(spec)
    message = str(caught.value)
    assert words in message
    assert "\n" not in message and message.endswith(".")
    assert isinstance(caught.value, HalfSafeError)


def test_cuda_on_a_cpu_only_build_says_so(machine):
    machine()
    with pytest.raises(DeviceError, match="CPU-only build"):
        hardware.pick_device("cuda")
    with pytest.raises(DeviceError, match="CPU-only build"):
        hardware.describe_device("cuda:0")


# --- The report ------------------------------------------------------------------------------


def test_report_lists_every_device_and_keeps_the_contract(machine):
    machine([amd("AMD Radeon RX 6800 XT", "gfx1030", 10, 3)], hip="6.2.41133")
    report = hardware.hardware_report(self_test=False)
    kinds = [d.kind for d in report.devices]
    assert kinds == ["rocm", "cpu"]
    document = json.loads(json.dumps(report.to_json()))
    assert document["cuda"] is None
    rocm = document["devices"][0]
    assert rocm["capability"] == [10, 3]
    assert rocm["self_test"] == {
        "fp16": "skipped",
        "bf16": "skipped",
        "details": [],
        "statistical": [],
        "statistical_budget_s": None,
        "statistical_seconds": None,
        "low_bit": None,
    }
    assert rocm["quirks"][0]["source"].startswith("https://")
    text = hardware_text(report)
    assert "AMD Radeon RX 6800 XT [gfx1030]" in text
    assert "amd-rdna1-rdna2-no-bf16" in text


def test_report_notes_a_gpu_this_pytorch_cannot_use(machine):
    machine(nvml_names=("NVIDIA GeForce RTX 3060",))
    report = hardware.hardware_report(self_test=False)
    assert [d.kind for d in report.devices] == ["cpu"]
    assert any("RTX 3060" in n and "CPU-only" in n for n in report.notes)
    assert "RTX 3060" in hardware_text(report)


# Exactly these types, never a subclass: torch's TorchVersion is a str, numpy's float64 a float,
# and either would make the GUI process that unpickles the report import its library.
PLAIN_TYPES = (str, int, float, bool, type(None), list, tuple, dict, frozenset)
REPORT_RECORDS = (
    selftest_stats.StatisticalTest,
    selftest_stats.StatResult,
    hardware.HardwareReport,
    hardware.DeviceInfo,
    hardware.Quirk,
    QuirkMatch,
    Bounds,
    SelfTestResult,
    OpResult,
    lowbit.LowBitReport,
    lowbit.LowBitCall,
)


def library_objects(value: object, where: str = "report") -> list[str]:
    """Where a value reachable from `value` has a type that is not exactly a builtin or one of
    the report's own records, and which type it has."""
    kind = type(value)
    if kind in REPORT_RECORDS:
        return [
            found
            for item in dataclasses.fields(value)
            for found in library_objects(getattr(value, item.name), f"{where}.{item.name}")
        ]
    if kind not in PLAIN_TYPES:
        return [f"{where} is a {kind.__module__}.{kind.__qualname__}"]
    if isinstance(value, dict):
        return [
            found
            for key, item in value.items()
            for found in (
                *library_objects(key, f"{where} key {key!r}"),
                *library_objects(item, f"{where}[{key!r}]"),
            )
        ]
    if isinstance(value, (list, tuple, frozenset)):
        return [
            found
            for number, item in enumerate(value)
            for found in library_objects(item, f"{where}[{number}]")
        ]
    return []


def test_the_check_finds_a_library_object_however_deep():
    nested = {"a": [1, (2.0, torch.__version__)]}
    assert library_objects(nested) == ["report['a'][1][1] is a torch.torch_version.TorchVersion"]
    test = SelfTestResult(
        "pass", "pass", details=[OpResult("gelu", "fp16", "pass", numpy.float64(0.01))]
    )
    assert library_objects(test) == ["report.details[0].error is a numpy.float64"]


@pytest.mark.parametrize("computer", ["this computer, self-tested", "a GPU with a quirk"])
def test_the_report_holds_only_builtins_and_reads_back_without_torch(machine, computer):
    """The report is pickled to the GUI process, which must never import torch."""
    if computer == "a GPU with a quirk":
        machine([nvidia("NVIDIA GeForce GTX 1660 SUPER", 7, 5, 6)])
        report = hardware.hardware_report(self_test=False)
        assert report.devices[0].quirks  # the quirks' match rules and effects are walked too
    else:
        report = hardware.hardware_report(self_test=True)  # the CPU's runs, in about 2 s
        assert report.devices[-1].self_test is not None and report.devices[-1].self_test.ran
    assert library_objects(report) == []

    read_back = subprocess.run(
        [
            sys.executable,
            "-c",
            "import pickle, sys; report = pickle.loads(sys.stdin.buffer.read()); "
            "print(report.torch, len(report.devices), 'torch' in sys.modules)",
        ],
        input=pickle.dumps(report),
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        check=True,
    )
    assert read_back.stdout.decode().split() == [report.torch, str(len(report.devices)), "False"]


# --- The quirks table ------------------------------------------------------------------------


def test_shipped_quirks_table_is_well_formed_and_covers_the_known_faults():
    quirks = hardware.load_quirks()
    ids = {q.id for q in quirks}
    assert {
        "nvidia-turing-gtx16-fp16-nan",
        "nvidia-pascal-cc61-slow-fp16",
        "nvidia-below-cc53-no-fp16",
        "amd-rdna1-rdna2-no-bf16",
        "amd-gcn-vega-no-bf16",
        "apple-mps-macos145-attention-overflow",
        "directml-no-bf16",
    } <= ids
    for quirk in quirks:
        assert quirk.source.startswith("https://")
        assert len(quirk.summary) > 40


def test_malformed_quirk_is_refused_naming_it(tmp_path):
    table = json.loads(Path(paths.resource("quirks.json")).read_text())
    table["quirks"][0]["effects"] = {"fp16": "dreadful"}
    bad = tmp_path / "quirks.json"
    bad.write_text(json.dumps(table))
    with pytest.raises(ValueError, match="nvidia-turing-gtx16-fp16-nan"):
        hardware.load_quirks(bad)


def test_a_quirk_can_set_a_precision_setting(tmp_path, machine):
    table = {
        "quirks": [
            {
                "id": "test-vae-in-fp32",
                "match": {"backend": "cuda", "name": "RTX 3060"},
                "effects": {"no_half_vae": True},
                "summary": "A made-up fault that needs the VAE in fp32 on this one card.",
                "source": "https://example.org/made-up",
            }
        ]
    }
    path = tmp_path / "quirks.json"
    path.write_text(json.dumps(table))
    machine([nvidia("NVIDIA GeForce RTX 3060", 8, 6)])
    info = hardware.assess(hardware.describe_device("cuda:0"), quirks=hardware.load_quirks(path))
    assert info.recommended["no_half_vae"] is True
    assert info.recommended["vae_precision"] == "fp32"
    assert "test-vae-in-fp32" in info.reasons["vae_precision"]


def test_report_runs_the_self_test_and_skips_what_the_device_lacks(machine, monkeypatch):
    machine(mps_macos="13.6.1")
    calls = []

    def fake_run(device, *, key, skip, retest, stat_budget_s, on_progress, cancel):
        calls.append((device, dict(skip)))
        return SelfTestResult(
            fp16="pass",
            bf16="skipped",
            details=[OpResult("all", "bf16", "skipped", note=skip.get("bf16", ""))],
        )

    monkeypatch.setattr(selftest, "run_self_test", fake_run)
    report = hardware.hardware_report(self_test=True)
    mps = report.devices[0]
    assert calls[0][0] == "mps"
    assert "apple-mps-no-bf16-before-macos14" in calls[0][1]["bf16"]
    assert (mps.self_test.fp16, mps.self_test.bf16) == ("pass", "skipped")
    assert "bf16 not tested" in hardware_text(report)


# --- the sourced kernel-fault quirks: each matches the devices it names and no other ----------

KERNEL_FAULT_QUIRKS = {
    "intel-xpu-fused-attention-rare-nan": "math",
    "apple-mps-classic-attention-nan": "math",
    "nvidia-blackwell-sm103-cudnn-attention": "classic",
    "amd-rdna3-aotriton-attention-nan": "classic",
}
FAULT_DEVICES = {
    "Intel Arc A770": DeviceInfo("xpu", 0, "Intel(R) Arc(TM) A770 Graphics", vendor="intel"),
    "Intel Arc B580": DeviceInfo("xpu", 0, "Intel(R) Arc(TM) B580 Graphics", vendor="intel"),
    "Apple M2 Max": DeviceInfo(
        "mps", None, "Apple M2 Max", vendor="apple", os_name="darwin", os_version="15.1"
    ),
    "NVIDIA B300": DeviceInfo("cuda", 0, "NVIDIA B300 SXM6", (10, 3), vendor="nvidia"),
    "NVIDIA B200": DeviceInfo("cuda", 0, "NVIDIA B200", (10, 0), vendor="nvidia"),
    "RTX 5090": DeviceInfo("cuda", 0, "NVIDIA GeForce RTX 5090", (12, 0), vendor="nvidia"),
    "RTX 4090": DeviceInfo("cuda", 0, "NVIDIA GeForce RTX 4090", (8, 9), vendor="nvidia"),
    "RX 7900 XTX": DeviceInfo("rocm", 0, "AMD Radeon RX 7900 XTX", arch="gfx1100", vendor="amd"),
    "Radeon 8060S": DeviceInfo("rocm", 0, "AMD Radeon 8060S", arch="gfx1151", vendor="amd"),
    "RX 6800": DeviceInfo("rocm", 0, "AMD Radeon RX 6800", arch="gfx1030", vendor="amd"),
    "MI300X": DeviceInfo("rocm", 0, "AMD Instinct MI300X", arch="gfx942", vendor="amd"),
    "CPU": DeviceInfo("cpu", None, "Some CPU"),
}
NAMED = {
    "intel-xpu-fused-attention-rare-nan": {"Intel Arc A770", "Intel Arc B580"},
    "apple-mps-classic-attention-nan": {"Apple M2 Max"},
    "nvidia-blackwell-sm103-cudnn-attention": {"NVIDIA B300"},
    "amd-rdna3-aotriton-attention-nan": {"RX 7900 XTX", "Radeon 8060S"},
}


@pytest.mark.parametrize("quirk_id", sorted(KERNEL_FAULT_QUIRKS))
def test_each_kernel_fault_quirk_hits_only_the_devices_it_names(quirk_id):
    quirk = next(q for q in hardware.load_quirks() if q.id == quirk_id)
    assert quirk.source.startswith("https://github.com/")
    hit = {name for name, device in FAULT_DEVICES.items() if quirk.matches(device)}
    assert hit == NAMED[quirk_id]
    # The recommender applies the workaround, a setting HalfSafe has, with the quirk as reason.
    backend = KERNEL_FAULT_QUIRKS[quirk_id]
    for name in NAMED[quirk_id]:
        info = hardware.assess(FAULT_DEVICES[name])
        assert info.recommended["attention_backend"] == backend, name
        assert f"[{quirk_id}]" in info.reasons["attention_backend"]
    for name in set(FAULT_DEVICES) - NAMED[quirk_id]:
        info = hardware.assess(FAULT_DEVICES[name])
        assert quirk_id not in [q.id for q in info.quirks], name
