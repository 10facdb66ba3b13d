"""The self-test's records: one operation's result (`OpResult`) and the verdict per half dtype
(`SelfTestResult`), as plain data.

They live apart from the test that makes them (`selftest`, which re-exports them, and whose
cache reads and writes them): a hardware report carries them to the window, whose process need
not import the test to show one. The statistical test's record (`selftest_stats`) is named here
for the type checker only; this module imports no other HalfSafe module.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.core.hardware.selftest_stats import StatisticalTest
    from app.core.precision.lowbit import LowBitReport

# The self-test's row for full fp16 accumulation (cuBLAS's CUBLAS_COMPUTE_16F). It tells whether
# that mode, not fp16, is safe here, so it counts toward no dtype's verdict.
ACCUMULATION_OP = "fp16 accumulation matmul"


@dataclass(frozen=True)
class OpResult:
    """One operation in one dtype: "pass", "fail", "unavailable" (an attention backend this
    device or build lacks) or "skipped" (the whole dtype was not tested, `note` says why)."""

    op: str
    dtype: str
    status: str
    error: float | None = None
    tolerance: float | None = None
    seconds: float = 0.0
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "dtype": self.dtype,
            "status": self.status,
            "error": self.error,
            "tolerance": self.tolerance,
            "seconds": round(self.seconds, 4),
            "note": self.note,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> OpResult:
        return cls(
            op=str(data["op"]),
            dtype=str(data["dtype"]),
            status=str(data["status"]),
            error=None if data.get("error") is None else float(data["error"]),
            tolerance=None if data.get("tolerance") is None else float(data["tolerance"]),
            seconds=float(data.get("seconds", 0.0)),
            note=str(data.get("note", "")),
        )


@dataclass
class SelfTestResult:
    """The verdict per half dtype ("pass", "fail" or "skipped") and every operation's result.

    `seconds` is the wall time of the run that produced it (not of a cache read); `cached`
    says whether this came from the cache.
    """

    fp16: str
    bf16: str
    details: list[OpResult] = field(default_factory=list)
    seconds: float = 0.0
    device: str = ""
    key: str = ""
    cached: bool = False
    notes: list[str] = field(default_factory=list)
    # The statistical self-test (`selftest_stats`): rare faults counted over many calls.
    statistical: StatisticalTest | None = None
    # comfy-kitchen's low-bit kernels at the self-test's shapes (`precision.lowbit`): None when
    # comfy-kitchen is not installed.
    low_bit: LowBitReport | None = None

    @classmethod
    def skipped(cls, reason: str = "the self-test was not run") -> SelfTestResult:
        return cls(fp16="skipped", bf16="skipped", notes=[reason])

    @property
    def ran(self) -> bool:
        return self.fp16 != "skipped" or self.bf16 != "skipped"

    def failed_ops(self, dtype: str) -> list[str]:
        """Names of the operations that failed in `dtype`, in test order; then those that gave
        a bad result in the statistical test, with their count."""
        failed = [
            d.op
            for d in self.details
            if d.dtype == dtype and d.status == "fail" and d.op != ACCUMULATION_OP
        ]
        if self.statistical is not None:
            failed += [
                f"{r.name} ({r.bad} bad in {r.calls:,} calls)"
                for r in self.statistical.flaky(dtype)
            ]
        return failed

    def attention_backends(self, dtype: str) -> list[str]:
        """The attention backends that ran correctly in `dtype` ("fp16", "bf16" or "fp32")."""
        prefix = "attention:"
        # A backend that fails on strided q/k/v (as models hand them over) is no choice either.
        strided = {
            d.op.rpartition(":")[2]
            for d in self.details
            if d.dtype == dtype and d.status == "fail" and d.op.startswith("strided attention")
        }
        # Nor is one that gave a bad result, however rarely, in the statistical test.
        flaky = {
            r.backend
            for r in (self.statistical.flaky(dtype) if self.statistical is not None else [])
            if r.op == "attention"
        }
        return [
            d.op[len(prefix) :]
            for d in self.details
            if d.dtype == dtype
            and d.status == "pass"
            and d.op.startswith(prefix)
            and d.op[len(prefix) :] not in strided | flaky
        ]

    def to_json(self) -> dict[str, Any]:
        """The `self_test` object of `halfsafe gpu --json`."""
        statistical = self.statistical
        return {
            "fp16": self.fp16,
            "bf16": self.bf16,
            "details": [d.to_json() for d in self.details],
            "statistical": [r.to_json() for r in statistical.results] if statistical else [],
            "statistical_budget_s": statistical.budget_s if statistical else None,
            "statistical_seconds": round(statistical.seconds, 3) if statistical else None,
            "low_bit": self.low_bit.to_json() if self.low_bit is not None else None,
        }
