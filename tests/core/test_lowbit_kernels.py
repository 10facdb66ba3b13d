"""comfy-kitchen's low-bit kernels tested on the device, backend by backend and shape by shape
(`precision.lowbit`): planted backends (`tests.support.lowbit_backends`) with the faults users
meet on older cards, each found and named per shape by the comparison, the self-test and the
check of an int8 model; the package's own eager backend reports clean.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

pytest.importorskip("comfy_kitchen")

from app.cli.text import hardware_text  # noqa: E402
from app.core import hardware  # noqa: E402
from app.core.hardware import selftest  # noqa: E402
from app.core.hardware.records import DeviceInfo, HardwareReport  # noqa: E402
from app.core.precision import lowbit  # noqa: E402
from app.core.precision.words import low_bit_lines  # noqa: E402
from tests.support.lowbit_backends import REFUSAL, planted_lowbit  # noqa: E402

CPU_MS = lowbit.GENERIC_MS_CPU  # 1, 96, 97, 127, 128
BETWEEN_TILES = {97, 127}


def gemm_status(report: lowbit.LowBitReport, backend: str) -> dict[int, str]:
    return {
        c.m: c.status for c in report.calls if c.backend == backend and c.op == lowbit.INT8_GEMM
    }


def clean(report: lowbit.LowBitReport, backend: str) -> bool:
    calls = [c for c in report.calls if c.backend == backend]
    return bool(calls) and all(c.status == "right" for c in calls)


# --- the comparison -------------------------------------------------------------------------


def test_the_eager_backend_is_right_at_every_shape_and_op():
    report = lowbit.compare(lowbit.generic_shapes("cpu"))

    assert report is not None and report.backends == ["eager"]
    assert {c.op for c in report.calls} == set(lowbit.OPS)
    assert clean(report, "eager")
    # 5 Ms of one (K, N): 5 int8 GEMMs, 5 int4 GEMMs, one decode; nothing timed on a CPU.
    assert report.calls_per_backend() == {"eager": 11}
    assert not report.timed and all(c.ms is None for c in report.calls)
    gemm = [c for c in report.calls if c.op == lowbit.INT8_GEMM]
    assert all(0 < c.error < lowbit.TOLERANCE[lowbit.INT8_GEMM] for c in gemm)


def test_a_backend_wrong_between_two_tiles_is_named_at_those_ms_only():
    with planted_lowbit("wrong_m") as planted:
        report = lowbit.compare(lowbit.generic_shapes("cpu"))

    assert report is not None and report.backends[0] == planted
    statuses = gemm_status(report, planted)
    assert {m for m, s in statuses.items() if s == "wrong"} == BETWEEN_TILES
    assert {m for m, s in statuses.items() if s == "right"} == {1, 96, 128}
    wrong = [c for c in report.calls if c.status == "wrong"]
    assert all(c.error > 0.5 and c.k == 256 and c.n == 256 for c in wrong)  # the error measured
    assert clean(report, "eager")  # the package's own backend, beside it, is clean
    line = next(x for x in low_bit_lines(report.to_json()) if x.startswith(f"{planted} int8"))
    assert line.startswith(f"{planted} int8 GEMM: wrong results at M 97, 127 (K 256, N 256)")


def test_a_backend_returning_tiled_noise_is_wrong_at_every_shape():
    with planted_lowbit("tiled") as planted:
        report = lowbit.compare(lowbit.generic_shapes("cpu"))

    assert report is not None
    assert set(gemm_status(report, planted).values()) == {"wrong"}
    assert min(c.error for c in report.calls if c.status == "wrong") > 1.0
    # Its decode is right: the fault is named on the GEMM, not on the format.
    decode = [c for c in report.calls if c.backend == planted and c.op == lowbit.INT8_DECODE]
    assert [c.status for c in decode] == ["right"]
    assert clean(report, "eager")


def test_a_backend_that_refuses_some_ms_is_named_with_its_message():
    with planted_lowbit("refuses") as planted:
        report = lowbit.compare(lowbit.generic_shapes("cpu"))

    assert report is not None
    statuses = gemm_status(report, planted)
    assert {m for m, s in statuses.items() if s == "refused"} == BETWEEN_TILES
    assert {m for m, s in statuses.items() if s == "right"} == {1, 96, 128}
    refused = [c for c in report.calls if c.status == "refused"]
    assert {c.message for c in refused} == {REFUSAL} and all(c.error is None for c in refused)
    said = low_bit_lines(report.to_json())
    assert f'{planted} int8 GEMM: refused at M 97, 127 (K 256, N 256): raised "{REFUSAL}"' in said


def test_a_call_a_backends_constraints_turn_away_is_counted_not_judged():
    with planted_lowbit("cuda_only") as planted:
        report = lowbit.compare(lowbit.generic_shapes("cpu"))

    assert report is not None and planted in report.backends
    assert gemm_status(report, planted) == {}  # the registry sends those calls elsewhere
    assert report.declined == {planted: len(CPU_MS)}
    assert [c.status for c in report.calls if c.backend == planted] == ["right"]  # its decode
    assert report.to_json()["declined"] == {planted: len(CPU_MS)}
    said = low_bit_lines(report.to_json())
    assert f"{planted}: 1 call, all right (5 more its constraints send to another backend)" in said


def test_the_record_reads_back_from_its_json():
    with planted_lowbit("tiled"):
        report = lowbit.compare(lowbit.generic_shapes("cpu")[:2])
    assert report is not None
    document = report.to_json()
    back = lowbit.LowBitReport.from_json(document)

    assert back.to_json() == document
    assert back.calls == report.calls


def test_a_non_finite_output_is_wrong_with_an_infinite_error(monkeypatch):
    call = lowbit.LowBitCall("x", lowbit.INT8_GEMM, 97, 8, 8, "wrong", math.inf, 0.02, "NaN")
    document = call.to_json()
    assert document["error"] is None and document["non_finite"] is True
    assert lowbit.LowBitCall.from_json(document) == call


def test_nothing_is_compared_without_the_package(monkeypatch):
    from app.core.precision import fused

    monkeypatch.setattr(fused, "installed", lambda: None)
    assert lowbit.compare(lowbit.generic_shapes("cpu")) is None


# --- the shapes -----------------------------------------------------------------------------


def test_the_generic_shapes_cross_the_96_and_128_row_tiles():
    for device_type in ("cuda", "cpu"):
        ms = {s.m for s in lowbit.generic_shapes(device_type)}
        assert {96, 97, 127, 128} <= ms
    gpu = lowbit.generic_shapes("cuda")
    assert len(gpu) == len(set(gpu)) == len(lowbit.GENERIC_MS) * len(lowbit.GENERIC_KN_GPU)


def test_a_module_trees_linear_layers_give_each_k_n_once_at_every_m():
    tree = torch.nn.Sequential(
        torch.nn.Linear(64, 128),
        torch.nn.Sequential(torch.nn.Linear(128, 64), torch.nn.ReLU(), torch.nn.Linear(64, 128)),
        torch.nn.Conv2d(4, 4, 3),
        torch.nn.Linear(128, 32, bias=False),
    )
    shapes = lowbit.linear_shapes(tree, [256, 512])

    assert [(s.k, s.n) for s in shapes[::2]] == [(64, 128), (128, 64), (128, 32)]
    assert [s.m for s in shapes] == [256, 512] * 3
    assert len(lowbit.linear_shapes(tree, [256], limit=2)) == 2
    only_wide = lowbit.linear_shapes(tree, [1], only=lambda layer: layer.out_features == 128)
    assert [(s.k, s.n) for s in only_wide] == [(64, 128)]


def test_a_jobs_ms_are_its_tokens_times_batch_and_cfg_bounded():
    assert lowbit.job_ms(4096) == [4096, 8192]
    assert lowbit.job_ms(4096, batch=2, cfg=False) == [8192]
    unet = lowbit.job_ms([4096, 1024, 256, 64])
    assert unet == sorted(set(unet)) and len(unet) == lowbit.MAX_MS and max(unet) == 8192


# --- the self-test --------------------------------------------------------------------------


def test_the_self_test_names_a_planted_kernel_fault_per_shape_and_keeps_it_cached(tmp_path):
    key = selftest.cache_key("planted low-bit CPU", None, torch.__version__, "cpu")
    with planted_lowbit("refuses") as planted:
        result = selftest.run_self_test("cpu", key=key, retest=True, stat_budget_s=0)

    assert result.low_bit is not None and result.low_bit.shapes_from == "generic"
    statuses = gemm_status(result.low_bit, planted)
    assert {m for m, s in statuses.items() if s == "refused"} == BETWEEN_TILES
    assert clean(result.low_bit, "eager")
    # A low-bit kernel's fault is the tool's, not the dtype's: fp16 and bf16 still pass.
    assert (result.fp16, result.bf16) == ("pass", "pass")
    document = result.to_json()
    assert document["low_bit"]["calls_per_backend"] == {planted: 6, "eager": 11}
    cached = selftest.cached_result(key)
    assert cached is not None and cached.low_bit is not None
    assert cached.low_bit.to_json() == result.low_bit.to_json()

    info = hardware.assess(DeviceInfo("cpu", None, "Some CPU"), result)
    text = hardware_text(HardwareReport("x", "2.13", None, [info]))
    assert "low-bit kernels (bf16, generic shapes)" in text
    assert f"{planted} int8 GEMM: refused at M 97, 127 (K 256, N 256)" in text
    assert "eager: 11 calls, all right" in text


# --- the check of an int8 model -------------------------------------------------------------


@pytest.fixture(scope="module", params=["int8-comfy_quant", "int8-convrot"])
def int8_model(tmp_path_factory, request):
    """A tiny Krea 2 transformer in ComfyUI's int8 layout, plain or ConvRot (whose input the
    tools rotate before the same int8 GEMM), loaded."""
    from app.core import models
    from tests.support.quantised_transformers import CASES, quantised_set

    case = CASES["krea2"]
    written = quantised_set(tmp_path_factory.mktemp("int8"), case.build(), case, request.param)
    return models.load_model(str(written.path))


def test_an_int8_models_shapes_are_its_int8_layers_at_the_jobs_m(int8_model):
    transformer = int8_model.pipeline.transformer
    stored = [m for m in transformer.modules() if isinstance(m, torch.nn.Linear)]
    int8 = [m for m in stored if lowbit.stored_int8(m)]
    assert int8 and len(int8) < len(stored)  # only the layers the file keeps in int8

    report = lowbit.model_report(int8_model.pipeline, 128, "cpu")

    assert report is not None and report.shapes_from == "model"
    pairs = {(m.in_features, m.out_features) for m in int8}
    assert {(c.k, c.n) for c in report.calls} == pairs
    # 128 px: a 16x16 latent, one token per 2x2 patch, alone and doubled by CFG.
    assert {c.m for c in report.calls if c.op == lowbit.INT8_GEMM} == {64, 128}
    assert {c.op for c in report.calls} == set(lowbit.INT8_OPS)  # an int8 model's ops only
    assert clean(report, "eager")


def test_the_check_of_an_int8_model_names_a_planted_kernel_fault(int8_model):
    from tests.support.family_helpers import check

    with planted_lowbit("tiled") as planted:
        report = check(int8_model)

    assert report.low_bit_kernels is not None
    document = report.to_json()["low_bit_kernels"]
    assert document["shapes_from"] == "model"
    wrong = [c for c in document["calls"] if c["backend"] == planted and c["status"] == "wrong"]
    assert wrong and {c["op"] for c in wrong} == {lowbit.INT8_GEMM}
    # The check's size: a (size / 8)^2 latent, one token per 2x2 patch, alone and under CFG.
    tokens = (report.size // 16) ** 2
    said = [n for n in report.notes if f"{planted} int8 GEMM: wrong results" in n]
    assert len(said) == 1  # every layer shape struck at the same Ms: one sentence
    assert f"wrong results at M {tokens}, {2 * tokens} (K " in said[0]
    assert report.verdict.value == "healthy"  # HalfSafe's own numbers are not the kernel's


def test_on_a_cpu_a_models_shapes_are_bounded_by_their_work(int8_model, monkeypatch):
    shapes = [lowbit.Shape(m, k, n) for k, n in ((64, 64), (64, 256)) for m in (16, 32)]
    cost = {s: s.m * s.k * s.n for s in shapes}  # 16x64x64 = 65,536 the smallest
    assert lowbit.within(shapes, 1e12) == shapes
    kept = lowbit.within(shapes, cost[shapes[0]] + cost[shapes[2]])
    assert kept == [shapes[0], shapes[2]]  # both layers at the smallest M first

    whole = lowbit.model_report(int8_model.pipeline, 128, "cpu")
    monkeypatch.setattr(lowbit, "CPU_MACS", 64 * 64 * 64)
    bounded = lowbit.model_report(int8_model.pipeline, 128, "cpu")

    assert whole is not None and bounded is not None and whole.left_out == 0
    ran = {(c.m, c.k, c.n) for c in bounded.calls if c.op == lowbit.INT8_GEMM}
    assert ran and sum(m * k * n for m, k, n in ran) <= 64 * 64 * 64
    whole_gemms = sum(c.op == lowbit.INT8_GEMM for c in whole.calls)
    assert bounded.left_out == whole_gemms - len(ran) > 0
    assert bounded.to_json()["left_out"] == bounded.left_out


def test_a_model_without_int8_layers_runs_no_kernels():
    class Pipe:
        transformer = torch.nn.Sequential(torch.nn.Linear(8, 8))

    assert lowbit.model_report(Pipe(), 128, "cpu") is None


def test_the_fields_are_documented():
    docs = (Path(__file__).resolve().parents[2] / "docs" / "json.md").read_text(encoding="utf-8")
    for field in (
        "low_bit",
        "low_bit_kernels",
        "calls_per_backend",
        "shapes_from",
        "bf16_ms",
        "non_finite",
        "declined",
        "left_out",
    ):
        assert f"`{field}`" in docs, field


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_cuda_gpu_every_backend_runs_the_generic_shapes_timed():
    report = lowbit.compare(lowbit.generic_shapes("cuda"), "cuda")

    assert report is not None and report.timed and "eager" in report.backends
    assert {(c.k, c.n) for c in report.calls} == set(lowbit.GENERIC_KN_GPU)
    for call in report.calls:
        timed = call.status in ("right", "slow") and call.op in lowbit.GEMMS
        assert (call.ms is not None and call.bf16_ms is not None) is timed, call
    eager = [c for c in report.calls if c.backend == "eager"]
    assert all(c.status in ("right", "slow") for c in eager), report.faults
