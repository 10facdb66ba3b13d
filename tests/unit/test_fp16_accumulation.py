"""Full fp16 accumulation (cuBLAS's CUBLAS_COMPUTE_16F): the self-test's row, with the
accumulation planted (no CPU has the mode) both ways, and the Volta quirk that keeps it off.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from app.cli.text import hardware_text
from app.core import hardware
from app.core.hardware import selftest
from app.core.hardware.records import DeviceInfo, HardwareReport
from app.core.hardware.selftest_records import ACCUMULATION_OP, OpResult, SelfTestResult


def fp16_accumulating(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A product whose running sum is kept in fp16, 16 terms at a time: what cuBLAS's
    CUBLAS_COMPUTE_16F does on the GPU."""
    total = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float16)
    for start in range(0, a.shape[1], 16):
        step = a[:, start : start + 16].float() @ b[start : start + 16].float()
        total = (total.float() + step).half()
    return total


def fp32_accumulating(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.float() @ b.float()).half()


def test_fp16_accumulation_past_65504_fails_with_its_figures():
    row = selftest.fp16_accumulation("cpu", matmul=fp16_accumulating)

    assert (row.op, row.dtype, row.status) == (ACCUMULATION_OP, "fp16", "fail")
    assert "partial sums reach 131," in row.note  # 64 per term over 2,048 terms
    assert "NaN or Inf in 4096 of 4096 outputs" in row.note


def test_fp32_accumulation_of_the_same_product_passes():
    row = selftest.fp16_accumulation("cpu", matmul=fp32_accumulating)

    assert row.status == "pass" and row.error is not None and row.error < 1e-2
    assert "partial sums reach 131," in row.note


def test_the_cpu_has_no_fp16_accumulation_to_test():
    row = selftest.fp16_accumulation("cpu")
    assert row.status == "unavailable" and "cuBLAS" in row.note


def test_a_failed_accumulation_row_fails_no_dtype_and_says_why_it_stays_off():
    row = selftest.fp16_accumulation("cpu", matmul=fp16_accumulating)
    result = SelfTestResult(
        "skipped",
        "skipped",
        details=[OpResult("matmul", "fp16", "pass"), OpResult("matmul", "bf16", "pass"), row],
    )
    assert selftest._verdict(result, "fp16") == "pass"
    assert result.failed_ops("fp16") == []
    result.fp16 = result.bf16 = "pass"

    info = hardware.assess(DeviceInfo("cuda", 0, "NVIDIA GeForce RTX 4090", (8, 9)), result)
    assert info.fp16 == "fast" and info.recommended["fp16_accumulation"] is False
    assert "the self-test measured it here: partial sums reach" in info.reasons["fp16_accumulation"]
    text = hardware_text(HardwareReport("x", "2.13", "12.8", [info]))
    assert "Self-test: full fp16 accumulation (fp16_accumulation) overflows here" in text


VOLTA = DeviceInfo("cuda", 0, "Tesla V100-SXM2-16GB", (7, 0), vendor="nvidia")


@pytest.mark.parametrize(
    ("device", "hit"),
    [
        (VOLTA, True),
        (DeviceInfo("cuda", 0, "NVIDIA TITAN V", (7, 0), vendor="nvidia"), True),
        (DeviceInfo("cuda", 0, "Tesla T4", (7, 5), vendor="nvidia"), False),
        (DeviceInfo("cuda", 0, "Tesla P100-PCIE-16GB", (6, 0), vendor="nvidia"), False),
        (DeviceInfo("cuda", 0, "NVIDIA A100-SXM4-40GB", (8, 0), vendor="nvidia"), False),
        (DeviceInfo("rocm", 0, "AMD Instinct MI50", arch="gfx906", vendor="amd"), False),
    ],
)
def test_the_volta_quirk_keeps_fp16_accumulation_off_on_volta_only(device, hit):
    quirk_id = "nvidia-volta-fp16-accumulation"
    quirk = next(q for q in hardware.load_quirks() if q.id == quirk_id)
    assert quirk.source.startswith("https://github.com/") and "CUBLAS_COMPUTE_16F" in quirk.summary
    assert quirk.matches(device) is hit
    info = hardware.assess(device)
    assert info.recommended["fp16_accumulation"] is False
    assert (f"[{quirk_id}]" in info.reasons["fp16_accumulation"]) is hit
    assert info.fp16 == "fast"  # fp16 itself is fine there


def test_the_row_is_documented():
    docs = (Path(__file__).resolve().parents[2] / "docs" / "json.md").read_text(encoding="utf-8")
    assert f"`{ACCUMULATION_OP}`" in docs and "`nvidia-volta-fp16-accumulation`" in docs


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_row_runs_cublas_fp16_accumulation_on_a_cuda_gpu():
    row = selftest.fp16_accumulation("cuda")

    assert row.status in ("pass", "fail") and "partial sums reach 131," in row.note
    if row.status == "fail" and row.error is None:
        assert "NaN or Inf in" in row.note
    # The mode was put back as it was.
    assert torch.backends.cuda.matmul.allow_fp16_accumulation is False
