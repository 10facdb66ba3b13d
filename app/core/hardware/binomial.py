"""Exact binomial confidence bounds for a fault rate: k bad results in n calls.

Clopper-Pearson bounds come from quantiles of the beta distribution, computed here without
scipy: the regularised incomplete beta function by its continued fraction, and its inverse by
bisection (monotone in x, so bisection cannot miss). Pure Python; no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

_EPSILON = 1e-15
_TINY = 1e-300
_MAX_TERMS = 10_000
_BISECTIONS = 200  # halvings of [0, 1]: far below any double's spacing near the answer


def regularized_beta(x: float, a: float, b: float) -> float:
    """I_x(a, b), the regularised incomplete beta function, for a, b > 0 and 0 <= x <= 1.

    The continued fraction (modified Lentz) converges fast for x < (a + 1) / (a + b + 2);
    beyond that the symmetry I_x(a, b) = 1 - I_{1-x}(b, a) is used.
    """
    if a <= 0 or b <= 0:
        raise ValueError("a and b must be positive")
    if not 0.0 <= x <= 1.0:
        raise ValueError("x must lie in [0, 1]")
    if x == 0.0 or x == 1.0:
        return x
    if x > (a + 1.0) / (a + b + 2.0):
        return 1.0 - regularized_beta(1.0 - x, b, a)
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    return math.exp(log_front) * _beta_fraction(x, a, b) / a


def _beta_fraction(x: float, a: float, b: float) -> float:
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    result = d
    for m in range(1, _MAX_TERMS):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + numerator / c
            c = c if abs(c) > _TINY else _TINY
            step = c * d
            result *= step
        if abs(step - 1.0) < _EPSILON:
            return result
    raise ArithmeticError(f"the incomplete beta fraction did not converge (a={a}, b={b})")


def beta_quantile(q: float, a: float, b: float) -> float:
    """The x with I_x(a, b) = q (the beta distribution's quantile), by bisection."""
    if not 0.0 <= q <= 1.0:
        raise ValueError("q must lie in [0, 1]")
    low, high = 0.0, 1.0
    for _ in range(_BISECTIONS):
        middle = (low + high) / 2
        if middle in (low, high):
            break
        if regularized_beta(middle, a, b) < q:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def interval(bad: int, calls: int, confidence: float = 0.95) -> tuple[float, float]:
    """The two-sided Clopper-Pearson interval for the rate of `bad` in `calls`."""
    _check(bad, calls)
    alpha = 1.0 - confidence
    low = 0.0 if bad == 0 else beta_quantile(alpha / 2, bad, calls - bad + 1)
    high = 1.0 if bad == calls else beta_quantile(1 - alpha / 2, bad + 1, calls - bad)
    return low, high


def upper_bound(bad: int, calls: int, confidence: float = 0.95) -> float:
    """The one-sided Clopper-Pearson upper bound: the rate is below it with `confidence`.

    With no bad call it is 1 - (1 - confidence) ** (1 / calls), about 3 / calls at 95% (the
    rule of three)."""
    _check(bad, calls)
    if bad == calls:
        return 1.0
    if bad == 0:
        return 1.0 - (1.0 - confidence) ** (1.0 / calls)
    return beta_quantile(confidence, bad + 1, calls - bad)


def _check(bad: int, calls: int) -> None:
    if calls <= 0 or not 0 <= bad <= calls:
        raise ValueError(f"need 0 <= bad <= calls and calls > 0 (got {bad} of {calls})")


@dataclass(frozen=True)
class Rate:
    """`bad` of `calls`, with the 95% bounds on the true rate."""

    bad: int
    calls: int

    @property
    def rate(self) -> float:
        return self.bad / self.calls

    @property
    def upper_95(self) -> float:
        return upper_bound(self.bad, self.calls)

    @property
    def interval_95(self) -> tuple[float, float]:
        return interval(self.bad, self.calls)

    def words(self, what: str = "bad results") -> str:
        """ "0 bad results in 20,000 calls (rate below 1.5e-04 at 95%)" or
        "3 bad results in 10,000 calls (0.03%, 95% interval 6.2e-05 to 8.8e-04)"."""
        head = f"{self.bad:,} {what} in {self.calls:,} call{'s' if self.calls != 1 else ''}"
        if self.bad == 0:
            return f"{head} (rate below {_number(self.upper_95)} at 95%)"
        low, high = self.interval_95
        return f"{head} ({self.rate:.2%}, 95% interval {_number(low)} to {_number(high)})"


def _number(value: float) -> str:
    """A rate in two significant digits: 0.012, 1.5e-04."""
    return f"{value:.2g}" if value >= 1e-3 or value == 0 else f"{value:.1e}"
