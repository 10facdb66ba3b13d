"""The statistical self-test: exact binomial bounds checked against values computed another
way, and rare faults planted in the kernels a user's patch would replace (fused attention, an
fp16 Linear) counted exactly, bounded by calls, never by seconds."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from app.core.hardware import binomial, selftest, selftest_stats
from app.core.hardware.binomial import Rate

# --- the binomial bounds ----------------------------------------------------------------------


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p), summed term by term in log space (no beta function)."""
    total = 0.0
    for i in range(k + 1):
        log_term = (
            math.lgamma(n + 1)
            - math.lgamma(i + 1)
            - math.lgamma(n - i + 1)
            + (i * math.log(p) if i else 0.0)
            + (n - i) * math.log1p(-p)
        )
        total += math.exp(log_term)
    return total


@pytest.mark.parametrize(
    ("x", "a", "b", "expected"),
    [
        (0.3, 1.0, 1.0, 0.3),  # uniform
        (0.3, 3.0, 1.0, 0.3**3),  # I_x(a, 1) = x^a
        (0.3, 1.0, 4.0, 1 - 0.7**4),  # I_x(1, b) = 1 - (1 - x)^b
        (0.5, 7.0, 7.0, 0.5),  # symmetric
        # I_x(a, b) for integer a, b is a binomial tail: P(Binomial(a+b-1, x) >= a)
        (0.2, 3.0, 5.0, 1 - binomial_cdf(2, 7, 0.2)),
        (0.001, 2.0, 9999.0, 1 - binomial_cdf(1, 10000, 0.001)),
    ],
)
def test_regularized_beta_matches_closed_forms(x, a, b, expected):
    assert binomial.regularized_beta(x, a, b) == pytest.approx(expected, rel=1e-10, abs=1e-14)


def test_beta_quantile_inverts_the_function():
    for q in (0.025, 0.5, 0.95, 0.975):
        x = binomial.beta_quantile(q, 4.0, 9997.0)
        assert binomial.regularized_beta(x, 4.0, 9997.0) == pytest.approx(q, rel=1e-9)


@pytest.mark.parametrize(("bad", "calls"), [(1, 10), (3, 10_000), (17, 400), (999, 1000)])
def test_clopper_pearson_bounds_are_where_the_binomial_tails_reach_alpha(bad, calls):
    low, high = binomial.interval(bad, calls)
    assert 0 < low < bad / calls < high < 1
    # The defining property, checked with the binomial sum instead of the beta function.
    assert binomial_cdf(bad, calls, high) == pytest.approx(0.025, rel=1e-6)
    assert 1 - binomial_cdf(bad - 1, calls, low) == pytest.approx(0.025, rel=1e-6)
    upper = binomial.upper_bound(bad, calls)
    assert binomial_cdf(bad, calls, upper) == pytest.approx(0.05, rel=1e-6)
    assert low < upper < high


def test_zero_and_all_bad_use_the_closed_forms():
    # Rule of three: no bad call in n, the one-sided 95% bound is 1 - 0.05^(1/n), about 3/n.
    assert binomial.upper_bound(0, 20_000) == pytest.approx(1 - 0.05 ** (1 / 20_000))
    assert binomial.upper_bound(0, 20_000) == pytest.approx(3 / 20_000, rel=0.002)
    assert binomial.interval(0, 50) == (0.0, pytest.approx(1 - 0.025 ** (1 / 50)))
    assert binomial.interval(50, 50) == (pytest.approx(0.025 ** (1 / 50)), 1.0)
    with pytest.raises(ValueError):
        binomial.interval(3, 0)


def test_rate_words_as_a_user_reads_them():
    assert Rate(0, 20_000).words("NaN") == ("0 NaN in 20,000 calls (rate below 1.5e-04 at 95%)")
    assert Rate(3, 10_000).words("NaN") == (
        "3 NaN in 10,000 calls (0.03%, 95% interval 6.2e-05 to 8.8e-04)"
    )


# --- planted rare faults ------------------------------------------------------------------------


class EveryNth:
    """A kernel that is right except on every `n`-th call in half precision, where it returns
    NaN (or zeros): the deterministic stand-in for a fault that strikes at random, installed
    the way a user's patched kernel is (replacing the function in torch.nn.functional)."""

    def __init__(self, real, n: int, fault: str = "nan"):
        self.real, self.n, self.fault, self.calls = real, n, fault, 0

    def __call__(self, *args, **kwargs):
        out = self.real(*args, **kwargs)
        if out.dtype not in (torch.float16, torch.bfloat16):
            return out
        self.calls += 1
        if self.calls % self.n:
            return out
        return torch.full_like(out, math.nan) if self.fault == "nan" else torch.zeros_like(out)


def pick(result, op, dtype, backend=None):
    (found,) = [
        r for r in result.results if r.op == op and r.dtype == dtype and r.backend == backend
    ]
    return found


def test_correct_kernels_give_no_bad_result():
    result = selftest_stats.run_statistical("cpu", max_calls=5)
    measured = [r for r in result.results if r.status == "measured"]
    assert {(r.op, r.backend) for r in measured} >= {
        ("attention", "math"),
        ("linear", None),
        ("matmul", None),
    }
    assert all(r.calls == 5 and r.bad == 0 for r in measured)
    assert result.budget_s is None


def test_fused_attention_returning_nan_one_call_in_n_is_counted_exactly(monkeypatch):
    faulty = EveryNth(F.scaled_dot_product_attention, n=7)
    monkeypatch.setattr(F, "scaled_dot_product_attention", faulty)
    ops = [op for op in selftest_stats.operations(small=True) if op.backend == "math"]
    result = selftest_stats.run_statistical("cpu", dtypes=["fp16"], max_calls=70, ops=ops)
    found = pick(result, "attention", "fp16", "math")
    assert (found.calls, found.non_finite, found.zeros, found.wrong) == (70, 10, 0, 0)
    assert found.rate is not None
    low, high = found.rate.interval_95
    assert low < 10 / 70 < high
    assert "10 bad results in 70 calls" in found.words()


def test_fp16_linear_returning_zeros_is_a_wrong_result(monkeypatch):
    monkeypatch.setattr(F, "linear", EveryNth(F.linear, n=4, fault="zeros"))
    ops = [op for op in selftest_stats.operations(small=True) if op.op == "linear"]
    result = selftest_stats.run_statistical("cpu", dtypes=["fp16", "bf16"], max_calls=20, ops=ops)
    fp16, bf16 = pick(result, "linear", "fp16"), pick(result, "linear", "bf16")
    # One counter for both dtypes: calls 4, 8, ... 40 are zeros, 5 in each dtype's 20.
    assert (fp16.zeros, fp16.non_finite, fp16.wrong) == (5, 0, 0)
    assert (bf16.zeros, bf16.calls) == (5, 20)
    assert result.flaky("fp16") == [fp16]


def test_an_unavailable_backend_is_named_not_failed():
    ops = [op for op in selftest_stats.operations(small=True) if op.backend == "cudnn"]
    result = selftest_stats.run_statistical("cpu", dtypes=["fp16"], max_calls=3, ops=ops)
    found = pick(result, "attention", "fp16", "cudnn")
    if not torch.cuda.is_available():
        assert found.status == "unavailable" and found.calls == 0
        assert found.rate is None and "does not run here" in found.words()


# --- in the self-test and `halfsafe gpu --json` ------------------------------------------------

KEY = selftest.cache_key("Stat CPU", None, torch.__version__, "cpu")


def test_a_flaky_linear_fails_its_dtype_and_a_flaky_backend_is_not_recommended(monkeypatch):
    clean = selftest.run_self_test("cpu", key=KEY, retest=True, stat_max_calls=4)
    assert (clean.fp16, clean.bf16) == ("pass", "pass")
    assert "math" in clean.attention_backends("fp16")

    # The math backend goes bad once in 5 calls, in the statistical test only.
    # (Scoped patches throughout: monkeypatch.undo() would also undo the isolated folders the
    # autouse fixture set, and the cache would be read from the real one.)
    with monkeypatch.context() as patched:
        patched.setattr(
            F, "scaled_dot_product_attention", EveryNth(F.scaled_dot_product_attention, n=5)
        )
        ops = [op for op in selftest_stats.operations(small=True) if op.backend == "math"]
        clean.statistical = selftest_stats.run_statistical("cpu", max_calls=10, ops=ops)
    assert "math" not in clean.attention_backends("fp16")
    assert "math (statistical)" not in clean.failed_ops("fp16")
    assert any(name.startswith("attention:math (") for name in clean.failed_ops("fp16"))

    # The one-call self-test is cached clean; then an fp16 Linear starts returning zeros
    # once in 3 calls, and asking for a call limit counts again over the cached verdict.
    with monkeypatch.context() as patched:
        patched.setattr(F, "linear", EveryNth(F.linear, n=3, fault="zeros"))
        result = selftest.run_self_test("cpu", key=KEY, stat_max_calls=4)
    assert result.cached and result.fp16 == "fail" and result.bf16 == "fail"
    assert not [d for d in result.details if d.status == "fail"]  # only the counts failed it
    assert any(name.startswith("linear (") for name in result.failed_ops("fp16"))

    document = result.to_json()
    assert set(document) >= {"fp16", "bf16", "details", "statistical", "statistical_budget_s"}
    row = next(r for r in document["statistical"] if r["op"] == "linear" and r["dtype"] == "fp16")
    assert row["calls"] == 4 and row["bad"] == row["zeros"] >= 1
    assert row["upper_95"] > row["rate"] > 0 and len(row["interval_95"]) == 2
    json.dumps(document)

    # Read back from the cache with the counts; asking for a call limit counts again.
    cached = selftest.run_self_test("cpu", key=KEY)
    assert cached.statistical is not None and cached.fp16 == "fail"
    recounted = selftest.run_self_test("cpu", key=KEY, stat_max_calls=4)
    assert recounted.fp16 == "pass"
    assert selftest.cached_result(KEY).fp16 == "pass"  # type: ignore[union-attr]


def test_a_zero_budget_skips_the_statistical_test():
    result = selftest.run_self_test("cpu", key=KEY, retest=True, stat_budget_s=0)
    assert result.statistical is None
    assert (
        result.to_json()["statistical"] == [] and result.to_json()["statistical_budget_s"] is None
    )
