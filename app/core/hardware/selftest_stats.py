"""The statistical self-test: faults too rare for one call to show, counted over many calls.

Some kernel faults strike at random: a fused attention kernel that leaves part of its output
unwritten (NaN where the allocator's block held NaN) in a few of 10,000 calls, an fp16 GEMM that
now and then returns zeros. One call of each operation (`selftest`) cannot see them. Here each
operation (fused attention on every SDPA backend, a Linear layer, a matrix product, in fp16 and
bf16, at the shapes an SD UNet runs) is called again and again on the same inputs within a time
budget, and every result is checked on the device against one fp32 reference: not finite, all
zeros where the answer is not, or past the dtype's tolerance. The count comes back as a rate
with exact (Clopper-Pearson) 95% bounds (`binomial`).

The counters stay on the device; the host reads them once per batch of calls, so the test
measures the kernels, not synchronisation. Importing this module does not import torch.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from app.core.hardware.binomial import Rate
from app.core.jobs import CancelToken, ProgressCallback, no_progress

if TYPE_CHECKING:
    import torch

# Seconds the whole statistical test may take by default: about 10 s on a GPU (thousands of
# calls per operation); on a CPU (fp16 emulated, shapes kept small) one second, which buys from
# one to a few dozen calls per operation: it only catches a fault that strikes often.
DEFAULT_BUDGET_S = {"gpu": 10.0, "cpu": 1.0}
BATCH = 32  # calls between two reads of the device-side counters
ATTENTION_BACKENDS = ("flash", "efficient", "cudnn", "math")
# Largest error allowed relative to the largest magnitude of the fp32 result, as `selftest`.
TOLERANCE = {"fp16": 1e-2, "bf16": 6e-2}
_NO_KERNEL_MESSAGES = ("No available kernel", "No viable backend")


def default_budget(device_type: str) -> float:
    """The default budget in seconds for a device type ("cuda", "mps", "xpu", "cpu")."""
    return DEFAULT_BUDGET_S["cpu" if device_type == "cpu" else "gpu"]


@dataclass(frozen=True)
class StatResult:
    """One operation in one dtype (and attention backend) called `calls` times.

    `bad` = `non_finite` + `zeros` (all zeros where fp32 is not) + `wrong` (finite, not zero,
    past the tolerance). `status`: "measured", "unavailable" (a backend this device or build
    lacks) or "error" (it raised; `note` says what)."""

    op: str
    dtype: str
    backend: str | None
    shape: str
    calls: int = 0
    non_finite: int = 0
    zeros: int = 0
    wrong: int = 0
    seconds: float = 0.0
    status: str = "measured"
    note: str = ""

    @property
    def bad(self) -> int:
        return self.non_finite + self.zeros + self.wrong

    @property
    def name(self) -> str:
        return f"{self.op}:{self.backend}" if self.backend else self.op

    @property
    def rate(self) -> Rate | None:
        return Rate(self.bad, self.calls) if self.calls else None

    def words(self) -> str:
        """ "attention:flash in fp16: 0 bad results in 20,000 calls (rate below 1.5e-04 at
        95%)", or why it was not measured."""
        head = f"{self.name} in {self.dtype}"
        rate = self.rate
        if rate is None:
            return f"{head}: {self.note or self.status}"
        kinds = [
            f"{n} {what}"
            for n, what in (
                (self.non_finite, "NaN/Inf"),
                (self.zeros, "all zeros"),
                (self.wrong, "wrong"),
            )
            if n
        ]
        detail = f" [{', '.join(kinds)}]" if kinds else ""
        return f"{head}: {rate.words('bad results')}{detail}"

    def to_json(self) -> dict[str, Any]:
        rate = self.rate
        return {
            "op": self.op,
            "dtype": self.dtype,
            "backend": self.backend,
            "shape": self.shape,
            "status": self.status,
            "calls": self.calls,
            "bad": self.bad,
            "non_finite": self.non_finite,
            "zeros": self.zeros,
            "wrong": self.wrong,
            "rate": None if rate is None else rate.rate,
            "upper_95": None if rate is None else rate.upper_95,
            "interval_95": None if rate is None else list(rate.interval_95),
            "seconds": round(self.seconds, 4),
            "note": self.note,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StatResult:
        return cls(
            op=str(data["op"]),
            dtype=str(data["dtype"]),
            backend=None if data.get("backend") is None else str(data["backend"]),
            shape=str(data.get("shape", "")),
            calls=int(data.get("calls", 0)),
            non_finite=int(data.get("non_finite", 0)),
            zeros=int(data.get("zeros", 0)),
            wrong=int(data.get("wrong", 0)),
            seconds=float(data.get("seconds", 0.0)),
            status=str(data.get("status", "measured")),
            note=str(data.get("note", "")),
        )


@dataclass
class StatisticalTest:
    """Every operation's count, the budget it ran under (seconds; None when bounded by calls
    only) and the wall time it took."""

    results: list[StatResult] = field(default_factory=list)
    budget_s: float | None = None
    seconds: float = 0.0

    def flaky(self, dtype: str) -> list[StatResult]:
        """The operations that gave at least one bad result in `dtype`."""
        return [r for r in self.results if r.dtype == dtype and r.bad > 0]

    def to_json(self) -> dict[str, Any]:
        return {
            "budget_s": self.budget_s,
            "seconds": round(self.seconds, 3),
            "results": [r.to_json() for r in self.results],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StatisticalTest:
        budget = data.get("budget_s")
        return cls(
            results=[StatResult.from_json(r) for r in data.get("results", [])],
            budget_s=None if budget is None else float(budget),
            seconds=float(data.get("seconds", 0.0)),
        )


@dataclass(frozen=True)
class StatOp:
    """An operation under test: `make(rand)` builds fp32 inputs, `run` applies the kernel under
    test, `reference` computes the same thing in fp64 from other kernels (so a fault planted in,
    or present in, the kernel under test never reaches the reference)."""

    op: str
    backend: str | None
    shape: str
    make: Callable[[Callable[..., Any]], dict[str, Any]]
    run: Callable[[dict[str, Any]], Any]
    reference: Callable[[dict[str, Any]], Any]


def operations(small: bool) -> list[StatOp]:
    """Fused attention on every backend, a Linear layer and a matrix product at the shapes of
    an SD UNet's first block at 512x512 with guidance (batch 2, 4096 tokens, 8 heads of 40,
    320 channels); on a CPU (`small`) 64 tokens and batch 1."""
    import torch
    import torch.nn.functional as F  # noqa: N812

    batch, tokens, heads, dim, width = (1, 64, 8, 40, 320) if small else (2, 4096, 8, 40, 320)

    def attention_inputs(rand):
        return {name: rand(batch, heads, tokens, dim) for name in ("q", "k", "v")}

    def attention_reference(t):
        q, k, v = (t[n].double() for n in ("q", "k", "v"))
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        return torch.softmax(scores, dim=-1) @ v

    def attention(backend: str) -> StatOp:
        return StatOp(
            "attention",
            backend,
            f"{batch}x{heads}x{tokens}x{dim}",
            attention_inputs,
            lambda t: _fused_attention(t, backend),
            attention_reference,
        )

    rows = batch * tokens
    return [
        *[attention(b) for b in ATTENTION_BACKENDS],
        StatOp(
            "linear",
            None,
            f"{rows}x{width} -> {4 * width}",
            lambda rand: {
                "x": rand(rows, width),
                "w": rand(4 * width, width, scale=width**-0.5),
                "b": rand(4 * width, scale=0.1),
            },
            lambda t: F.linear(t["x"], t["w"], t["b"]),
            lambda t: t["x"].double() @ t["w"].double().T + t["b"].double(),
        ),
        StatOp(
            "matmul",
            None,
            f"{rows}x{2 * width} @ {2 * width}x{2 * width}",
            lambda rand: {
                "a": rand(rows, 2 * width),
                "b": rand(2 * width, 2 * width, scale=(2 * width) ** -0.5),
            },
            lambda t: torch.matmul(t["a"], t["b"]),
            lambda t: t["a"].double() @ t["b"].double(),
        ),
    ]


def _fused_attention(t: dict[str, Any], backend: str) -> Any:
    import torch.nn.functional as F  # noqa: N812
    from torch.nn.attention import SDPBackend, sdpa_kernel

    chosen = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "math": SDPBackend.MATH,
    }[backend]
    with sdpa_kernel([chosen]):
        # Looked up at call time: a kernel patched in by the user (or a test) is what runs.
        return F.scaled_dot_product_attention(t["q"], t["k"], t["v"])


def run_statistical(
    device: torch.device | str = "cpu",
    *,
    dtypes: Sequence[str] = ("fp16", "bf16"),
    budget_s: float | None = None,
    max_calls: int | None = None,
    ops: Sequence[StatOp] | None = None,
    on_progress: ProgressCallback = no_progress,
    cancel: CancelToken | None = None,
) -> StatisticalTest:
    """Call each operation in each of `dtypes` on `device` until its share of `budget_s`
    (seconds, shared among the operations still to run) is spent or it reached `max_calls`;
    at least one of the two must bound the test. Tests bound it by calls, so the counts do not
    depend on the machine's speed.

    Runs on the calling thread; allocates a few tens of MB on `device` (inputs, one fp64
    reference per operation). Before each call on a GPU, a NaN-filled block of the output's size
    is allocated and freed, so that a kernel that leaves part of its output unwritten gets NaN
    there (as the caching allocator hands the same block back). `cancel` is checked between
    batches of calls.
    """
    import torch

    if budget_s is None and max_calls is None:
        raise ValueError("the statistical test needs a time budget or a call limit")
    device = torch.device(device)
    ops = list(ops) if ops is not None else operations(device.type == "cpu")
    combos = [(op, dtype) for dtype in dtypes for op in ops]
    results: list[StatResult] = []
    started = time.perf_counter()
    for number, (op, dtype) in enumerate(combos):
        if cancel is not None:
            cancel.raise_if_cancelled()
        on_progress(f"Statistical self-test: {op.op} in {dtype}", number, len(combos))
        share = None
        if budget_s is not None:
            left = budget_s - (time.perf_counter() - started)
            share = max(0.0, left) / (len(combos) - number)
        results.append(_count(op, dtype, device, share, max_calls, cancel))
    on_progress("Statistical self-test done", len(combos), len(combos))
    return StatisticalTest(results, budget_s, time.perf_counter() - started)


def _count(
    op: StatOp,
    dtype: str,
    device: torch.device,
    seconds: float | None,
    max_calls: int | None,
    cancel: CancelToken | None,
) -> StatResult:
    import torch

    torch_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    generator = torch.Generator().manual_seed(4321)

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=generator) * scale).to(device)

    started = time.perf_counter()
    base = StatResult(op.op, dtype, op.backend, op.shape)
    try:
        inputs = {k: v.to(torch_dtype) for k, v in op.make(rand).items()}
        # The reference sees the same rounded inputs, so only the kernel's arithmetic counts.
        reference = op.reference(inputs).float()
        scale = float(reference.abs().max().clamp_min(1e-6))
        reference_zero = bool((reference == 0).all())
        counts = torch.zeros(3, dtype=torch.int64, device=device)
        poison = device.type != "cpu"
        tolerance = TOLERANCE[dtype]
        calls = 0
        batch = 1  # the first call alone: on a slow device it may already spend the share
        while max_calls is None or calls < max_calls:
            if max_calls is not None:
                batch = min(batch, max_calls - calls)
            for _ in range(batch):
                if poison:
                    poisoned = torch.full(
                        reference.shape, math.nan, dtype=torch_dtype, device=device
                    )
                    del poisoned
                with torch.inference_mode():
                    output = op.run(inputs).float()
                finite = torch.isfinite(output).all()
                zeros = (output == 0).all() & finite & (not reference_zero)
                error = (output - reference).abs().max() / scale
                wrong = finite & ~zeros & (error > tolerance)
                counts += torch.stack([~finite, zeros, wrong]).to(torch.int64)
            calls += batch
            if cancel is not None:
                cancel.raise_if_cancelled()
            if seconds is None:
                batch = BATCH
                continue
            counts.tolist()  # the host waits for the device here, once per batch
            spent = time.perf_counter() - started
            if spent >= seconds:
                break
            # As many calls as the rest of the share likely holds, at most one batch.
            batch = max(1, min(BATCH, int((seconds - spent) / (spent / calls))))
        non_finite, zeros_n, wrong_n = (int(n) for n in counts.tolist())
    except Exception as exc:  # noqa: BLE001 - a kernel that raises is the finding
        first = (str(exc).strip().splitlines() or [""])[0]
        spent = time.perf_counter() - started
        if op.backend is not None and any(m in str(exc) for m in _NO_KERNEL_MESSAGES):
            return replace(
                base,
                status="unavailable",
                note="this attention backend does not run here",
                seconds=spent,
            )
        return replace(
            base, status="error", note=f"raised {type(exc).__name__}: {first[:200]}", seconds=spent
        )
    return StatResult(
        op.op,
        dtype,
        op.backend,
        op.shape,
        calls=calls,
        non_finite=non_finite,
        zeros=zeros_n,
        wrong=wrong_n,
        seconds=time.perf_counter() - started,
    )
