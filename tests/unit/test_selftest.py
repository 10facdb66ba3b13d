"""The device self-test, run for real on this CPU: correct kernels pass, planted faults fail
naming the operation, and the verdict is cached per device, driver and PyTorch version."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from app.core.errors import CancelledError
from app.core.hardware import selftest
from app.core.jobs import CancelToken

KEY = selftest.cache_key("Test CPU", None, torch.__version__, "cpu")
SD_OPS = {
    "conv2d 4->320",
    "conv2d 320->640",
    "group_norm",
    "layer_norm",
    "matmul",
    "attention:math",
    "gelu",
    "geglu",
}


def run(**kwargs) -> selftest.SelfTestResult:
    kwargs.setdefault("key", KEY)
    kwargs.setdefault("retest", True)
    # The statistical part is tested in test_selftest_stats.py; here a few calls, bound by count.
    kwargs.setdefault("stat_max_calls", 2)
    return selftest.run_self_test("cpu", **kwargs)


def test_cpu_passes_fp16_and_bf16_on_every_sd_operation():
    result = run()
    assert (result.fp16, result.bf16) == ("pass", "pass")
    assert result.cached is False
    for dtype in ("fp16", "bf16"):
        tested = {d.op: d for d in result.details if d.dtype == dtype}
        assert set(tested) >= SD_OPS, dtype
        for op in SD_OPS:
            assert tested[op].status == "pass"
            assert tested[op].error is not None and tested[op].error < tested[op].tolerance
    # Attention backends a CPU lacks are reported as unavailable, not as failures.
    cudnn = next(d for d in result.details if d.op == "attention:cudnn" and d.dtype == "fp16")
    assert cudnn.status == "unavailable"
    assert "math" in result.attention_backends("fp32")
    assert any("slower" in note for note in result.notes)
    document = json.loads(json.dumps(result.to_json()))
    assert set(document) == {
        "fp16",
        "bf16",
        "details",
        "statistical",
        "statistical_budget_s",
        "statistical_seconds",
        "low_bit",
    }


def test_inf_from_an_op_in_fp16_fails_fp16_naming_the_op(monkeypatch):
    real = F.group_norm

    def overflowing(x, *args, **kwargs):
        out = real(x, *args, **kwargs)
        return (
            out.masked_fill(torch.ones_like(out, dtype=torch.bool), float("inf"))
            if x.dtype == torch.float16
            else out
        )

    monkeypatch.setattr(F, "group_norm", overflowing)
    result = run()
    assert result.fp16 == "fail"
    assert result.failed_ops("fp16") == ["group_norm", "group_norm large"]
    assert result.bf16 == "pass"
    failure = next(d for d in result.details if d.op == "group_norm" and d.dtype == "fp16")
    assert "NaN or Inf" in failure.note


def test_a_large_error_fails_the_dtype(monkeypatch):
    real = F.gelu

    def off_by_ten_percent(x, *args, **kwargs):
        out = real(x, *args, **kwargs)
        return out * 1.1 if x.dtype == torch.bfloat16 else out

    monkeypatch.setattr(F, "gelu", off_by_ten_percent)
    result = run()
    assert result.fp16 == "pass"
    assert result.bf16 == "fail"
    # GEGLU uses GELU too, so both are named, and nothing else.
    assert result.failed_ops("bf16") == ["gelu", "geglu"]
    failure = next(d for d in result.details if d.op == "gelu" and d.dtype == "bf16")
    assert failure.error is not None and failure.error > failure.tolerance


def test_an_op_that_raises_fails_the_dtype(monkeypatch):
    real = F.layer_norm

    def refusing(x, *args, **kwargs):
        if x.dtype == torch.float16:
            raise RuntimeError("\"LayerNormKernelImpl\" not implemented for 'Half'")
        return real(x, *args, **kwargs)

    monkeypatch.setattr(F, "layer_norm", refusing)
    result = run()
    assert result.failed_ops("fp16") == ["layer_norm", "layer_norm large"]
    failure = next(d for d in result.details if d.op == "layer_norm" and d.dtype == "fp16")
    assert "RuntimeError" in failure.note and "Half" in failure.note


def test_second_call_is_a_cache_hit_without_running_anything(monkeypatch):
    first = run(retest=False)
    assert first.cached is False

    calls = []
    real = F.conv2d
    monkeypatch.setattr(F, "conv2d", lambda *a, **k: calls.append(1) or real(*a, **k))
    second = run(retest=False)
    assert second.cached is True
    assert calls == []
    assert (second.fp16, second.bf16) == (first.fp16, first.bf16)
    assert [d.op for d in second.details] == [d.op for d in first.details]

    third = run(retest=True)
    assert third.cached is False and calls


def test_cache_is_per_device_driver_and_torch_version():
    run(retest=False)
    assert selftest.cached_result(KEY) is not None
    for other in (
        selftest.cache_key("Other CPU", None, torch.__version__, "cpu"),
        selftest.cache_key("Test CPU", "560.94", torch.__version__, "cpu"),
        selftest.cache_key("Test CPU", None, "2.99.0", "cpu"),
    ):
        assert selftest.cached_result(other) is None


def test_damaged_cache_file_is_ignored_and_rewritten():
    run(retest=False)
    path = selftest.cache_path(KEY)
    path.write_text("{ half a file")
    assert selftest.cached_result(KEY) is None
    result = run(retest=False)
    assert result.cached is False
    assert selftest.cached_result(KEY) is not None


def test_skipped_dtype_is_not_run_and_says_why():
    result = run(skip={"bf16": "bf16 is not supported on this device [some-quirk]"})
    assert (result.fp16, result.bf16) == ("pass", "skipped")
    assert not [d for d in result.details if d.dtype == "bf16" and d.op != "all"]
    note = next(d for d in result.details if d.dtype == "bf16")
    assert note.status == "skipped" and "some-quirk" in note.note


def test_cancel_stops_the_test():
    token = CancelToken()
    token.cancel()
    with pytest.raises(CancelledError):
        run(cancel=token)


def test_progress_reaches_the_end():
    seen = []
    run(on_progress=lambda stage, done, total: seen.append((stage, done, total)))
    assert seen[0][1] == 0
    assert seen[-1][1] == seen[-1][2] > 0


LAYOUT_AND_RANGE_OPS = {
    "strided attention sd:math",
    "strided attention flux:math",
    "conv2d after chunk",
    "group_norm large",
    "layer_norm large",
    "long-K matmul, reduced-precision reduction",
}


def test_layout_and_magnitude_operations_pass_on_this_cpu():
    result = run()
    for dtype in ("fp16", "bf16"):
        tested = {d.op: d for d in result.details if d.dtype == dtype}
        for op in LAYOUT_AND_RANGE_OPS:
            assert tested[op].status == "pass", (dtype, op, tested[op].note)


def test_a_backend_that_fails_only_on_strided_inputs_fails_and_is_no_choice(monkeypatch):
    real = F.scaled_dot_product_attention

    def wrong_on_strided(q, k, v, *args, **kwargs):
        out = real(q, k, v, *args, **kwargs)
        return out if q.is_contiguous() else out * 0 + float("nan")

    monkeypatch.setattr(F, "scaled_dot_product_attention", wrong_on_strided)
    result = run()
    assert "attention:math" not in result.failed_ops("fp16")  # contiguous inputs: fine
    assert "strided attention sd:math" in result.failed_ops("fp16")
    assert "math" not in result.attention_backends("fp16")


def test_a_half_precision_variance_of_large_activations_is_caught(monkeypatch):
    real = F.layer_norm

    def half_variance(x, shape, weight=None, bias=None, eps=1e-5):
        if x.dtype != torch.float16:
            return real(x, shape, weight, bias, eps)
        mean = x.mean(-1, keepdim=True)
        variance = ((x - mean) * (x - mean)).mean(-1, keepdim=True)  # in fp16: overflows
        return (x - mean) / torch.sqrt(variance + eps) * weight + bias

    monkeypatch.setattr(F, "layer_norm", half_variance)
    result = run()
    assert "layer_norm large" in result.failed_ops("fp16")
    assert "layer_norm" not in result.failed_ops("fp16")
