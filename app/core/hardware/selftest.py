"""Device self-test: do fp16 and bf16 give the right answers, here, for the operations SD runs?

Each operation (convolution with SD's channel counts, group norm, layer norm, matmul, attention
on every backend, GELU, GEGLU; and the faults that come from layout and magnitude: attention on
every backend with strided q/k/v at SD and Flux head shapes, a convolution of a channel chunk,
norms of activations in the thousands, a long-K matrix product under reduced-precision
reduction) runs in the half-precision dtype and again in fp32 on the same device, from the same
(rounded) inputs. Full fp16 accumulation, a mode rather than a dtype, has a row of its own
(`fp16_accumulation`) that fails no dtype. A non-finite output, an error past the dtype's
tolerance, or an exception marks the dtype failed and names the operation. Results are cached
per device name, driver and PyTorch version, so the test costs seconds once. Where comfy-kitchen
is installed, its int8/int4 kernels run too, at generic shapes on every backend usable here
(`precision.lowbit`): a fault there is the other tools' kernel, recorded in `low_bit`, and fails
no dtype.

Importing this module does not import torch; running the test does. Its records, `OpResult`
and `SelfTestResult`, are plain data in `selftest_records` (re-exported here).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.core import paths
from app.core.files import read_saved_object
from app.core.hardware.selftest_records import ACCUMULATION_OP, OpResult, SelfTestResult
from app.core.hardware.selftest_stats import StatisticalTest, default_budget, run_statistical
from app.core.jobs import CancelToken, ProgressCallback, no_progress

if TYPE_CHECKING:
    import torch

    from app.core.precision.lowbit import LowBitReport

# Bump when the operations, sizes or tolerances change, so old cached verdicts are not reused.
SELFTEST_VERSION = 4
HALF_DTYPES = ("fp16", "bf16")
ATTENTION_BACKENDS = ("flash", "efficient", "cudnn", "math")

# Largest error allowed, relative to the largest magnitude in the fp32 result. Correct kernels
# land an order of magnitude below these (fp16 keeps 11 mantissa bits, bf16 8); a broken kernel
# is off by far more, or not finite at all.
TOLERANCE = {"fp16": 1e-2, "bf16": 6e-2, "fp32": 2e-3}

_NO_KERNEL_MESSAGES = ("No available kernel", "No viable backend")

# A cached result is some 100 operations and a few hundred low-bit calls: under 100 KB.
MAX_CACHE_BYTES = 4 << 20
# What reading a damaged cached document field by field can raise (a text where a record
# belongs, a number too large for a float); each means "no cache".
CACHE_DAMAGE = (LookupError, TypeError, ValueError, AttributeError, ArithmeticError)


def cache_key(name: str, driver: str | None, torch_version: str, kind: str = "") -> str:
    """The identity a cached result belongs to: device name, driver and PyTorch version."""
    return json.dumps([SELFTEST_VERSION, kind, name, driver or "", torch_version])


def cache_path(key: str) -> Path:
    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:24]
    return paths.cache_dir() / "selftest" / f"{digest}.json"


def cached_result(key: str) -> SelfTestResult | None:
    """The cached result for `key`, or None when there is none or the file is damaged in any
    way (not a regular file, over MAX_CACHE_BYTES, nested, a field of the wrong kind)."""
    data = read_saved_object(cache_path(key), MAX_CACHE_BYTES)
    if data is None or data.get("key") != key:
        return None
    try:
        return _from_cache(data["result"], key)
    except CACHE_DAMAGE:
        return None


def _store(result: SelfTestResult) -> None:
    path = cache_path(result.key)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"key": result.key, "result": _cache_document(result)}, indent=1)
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except OSError:
        # A cache that cannot be written only costs a re-run next time.
        Path(tmp).unlink(missing_ok=True)


def _cache_document(result: SelfTestResult) -> dict[str, Any]:
    return {
        "fp16": result.fp16,
        "bf16": result.bf16,
        "details": [d.to_json() for d in result.details],
        "statistical": result.statistical.to_json() if result.statistical else None,
        "seconds": result.seconds,
        "device": result.device,
        "notes": list(result.notes),
        "low_bit": result.low_bit.to_json() if result.low_bit is not None else None,
    }


def _from_cache(data: Mapping[str, Any], key: str) -> SelfTestResult:
    verdicts = ("pass", "fail", "skipped")
    if data.get("fp16") not in verdicts or data.get("bf16") not in verdicts:
        raise ValueError("bad verdict")
    from app.core.precision.lowbit import LowBitReport

    statistical = data.get("statistical")
    low_bit = data.get("low_bit")
    return SelfTestResult(
        fp16=data["fp16"],
        bf16=data["bf16"],
        details=[OpResult.from_json(d) for d in data.get("details", [])],
        seconds=float(data.get("seconds", 0.0)),
        device=str(data.get("device", "")),
        key=key,
        cached=True,
        notes=[str(n) for n in data.get("notes", [])],
        statistical=None
        if not isinstance(statistical, dict)
        else StatisticalTest.from_json(statistical),
        low_bit=LowBitReport.from_json(low_bit) if isinstance(low_bit, dict) else None,
    )


def run_self_test(
    device: torch.device | str = "cpu",
    *,
    key: str,
    skip: Mapping[str, str] | None = None,
    retest: bool = False,
    stat_budget_s: float | None = None,
    stat_max_calls: int | None = None,
    on_progress: ProgressCallback = no_progress,
    cancel: CancelToken | None = None,
) -> SelfTestResult:
    """Test fp16 and bf16 on `device` against fp32, or return the cached verdict.

    Then the statistical test (`selftest_stats.run_statistical`) counts rare faults over many
    calls within `stat_budget_s` seconds (None: `selftest_stats.default_budget`, 10 s on a GPU,
    1 s on a CPU; 0: not run) or `stat_max_calls` calls per operation. An fp16/bf16 Linear or
    matrix product that gave one bad result fails its dtype; an attention backend that did is
    no longer among `attention_backends`. A cached verdict is reused with its statistical counts
    unless none were made or a budget or call limit is asked for.

    `key` identifies the device for the cache (see `cache_key`; `hardware.self_test_key`
    builds it from a described device, so that this module never needs `hardware`, which
    imports it). `skip` maps a dtype to the reason it is not tested (e.g. bf16 on a device
    that has none). `retest` ignores the cache.

    Takes about two seconds on a 2-core CPU (sizes there are kept small) and well under a second
    on a GPU, plus the statistical test's budget, plus with comfy-kitchen installed its low-bit
    kernels (`precision.lowbit`: a second or two on a CPU after importing it). Runs on the calling thread, allocates a few MB on `device`, writes one JSON file
    under `paths.cache_dir()`. Progress goes to `on_progress`; `cancel` is checked between
    operations.
    """
    import torch

    device = torch.device(device)
    skip = dict(skip or {})
    budget = default_budget(device.type) if stat_budget_s is None else stat_budget_s
    wants_statistical = budget > 0 or stat_max_calls is not None
    if not retest:
        hit = cached_result(key)
        if hit is not None:
            asked = stat_budget_s is not None or stat_max_calls is not None
            if wants_statistical and (hit.statistical is None or asked):
                hit.statistical = run_statistical(
                    device,
                    dtypes=[
                        d for d in HALF_DTYPES if d not in skip and getattr(hit, d) != "skipped"
                    ],
                    budget_s=budget if budget > 0 else None,
                    max_calls=stat_max_calls,
                    on_progress=on_progress,
                    cancel=cancel,
                )
                hit.fp16, hit.bf16 = (_verdict(hit, d) for d in HALF_DTYPES)
                _store(hit)
            return hit

    small = device.type == "cpu"
    ops = _operations(small)
    dtypes = [d for d in HALF_DTYPES if d not in skip]
    total = len(ops) * (len(dtypes) + 1)
    done = 0
    details: list[OpResult] = []
    started = time.perf_counter()
    with _exact_fp32():
        for dtype in [*dtypes, "fp32"]:
            for op in ops:
                if cancel is not None:
                    cancel.raise_if_cancelled()
                on_progress(f"Self-test: {op.name} in {dtype}", done, total)
                if dtype == "fp32" and not op.name.startswith("attention:"):
                    # fp32 is the reference; only the attention backends are worth checking
                    # in it (which ones exist, for an fp32 recommendation).
                    done += 1
                    continue
                details.append(_check(op, dtype, device))
                done += 1
    on_progress("Self-test done", total, total)

    statistical = None
    if wants_statistical:
        statistical = run_statistical(
            device,
            dtypes=dtypes,
            budget_s=budget if budget > 0 else None,
            max_calls=stat_max_calls,
            on_progress=on_progress,
            cancel=cancel,
        )
    if "fp16" not in skip:
        details.append(fp16_accumulation(device))
    for dtype in HALF_DTYPES:
        if dtype in skip:
            details.append(OpResult("all", dtype, "skipped", note=skip[dtype]))
    low_bit = _low_bit_kernels(device, skip, on_progress)
    notes = []
    if device.type == "cpu":
        notes.append(
            "On a CPU the self-test checks correctness only: fp16 there is emulated and runs "
            "several times slower than fp32."
        )
    result = SelfTestResult(
        fp16="skipped",
        bf16="skipped",
        details=details,
        seconds=time.perf_counter() - started,
        device=str(device),
        key=key,
        notes=notes,
        statistical=statistical,
        low_bit=low_bit,
    )
    result.fp16, result.bf16 = (_verdict(result, d) for d in HALF_DTYPES)
    _store(result)
    return result


def _verdict(result: SelfTestResult, dtype: str) -> str:
    """ "skipped" when `dtype` was not tested; "fail" when an operation failed in it, or a
    Linear layer or matrix product gave a bad result in the statistical test; else "pass".
    (A flaky attention backend only loses its place among the backends to use.)"""
    if any(d.dtype == dtype and d.op == "all" and d.status == "skipped" for d in result.details):
        return "skipped"
    if any(
        d.dtype == dtype and d.status == "fail" and d.op != ACCUMULATION_OP for d in result.details
    ):
        return "fail"
    flaky = result.statistical.flaky(dtype) if result.statistical is not None else []
    return "fail" if any(r.op != "attention" for r in flaky) else "pass"


def _low_bit_kernels(
    device: torch.device, skip: Mapping[str, str], on_progress: ProgressCallback
) -> LowBitReport | None:
    """comfy-kitchen's int8/int4 kernels at the generic shapes, every backend usable here
    (`precision.lowbit`), with bf16 activations (fp16 where bf16 is not tested): None when
    comfy-kitchen is not installed."""
    from app.core.precision import fused, lowbit

    if fused.installed() is None:
        return None
    said = "Self-test: comfy-kitchen's low-bit kernels"
    on_progress(said, 0, 1)
    dtype = "fp16" if "bf16" in skip else "bf16"
    report = lowbit.compare(lowbit.generic_shapes(device.type), str(device), dtype)
    on_progress(said, 1, 1)
    return report


def fp16_accumulation(
    device: torch.device | str, matmul: Callable[[Any, Any], Any] | None = None
) -> OpResult:
    """Full fp16 accumulation (cuBLAS's CUBLAS_COMPUTE_16F, PyTorch's
    `torch.backends.cuda.matmul.allow_fp16_accumulation`) on a (64, 4096) @ (4096, 64) fp16
    product whose running sums pass 65504 (+64 per term for the first half of K, -64 for the
    second) while the result is small: fp32 accumulation gives it finite, fp16 accumulation
    holds inf from the first partial sum past 65504 on. "fail" with the figures where the
    mode turned a finite product into NaN or Inf or past the tolerance, "pass" where it held,
    "unavailable" where the device (not CUDA) or this PyTorch has no such mode. `matmul`
    replaces the product under that mode (a test's stand-in, since no CPU has the mode)."""
    import torch

    device = torch.device(device)
    matmul_flags = torch.backends.cuda.matmul
    if matmul is None:
        if device.type != "cuda" or not hasattr(matmul_flags, "allow_fp16_accumulation"):
            return OpResult(
                ACCUMULATION_OP,
                "fp16",
                "unavailable",
                note="fp16 accumulation is a cuBLAS mode of CUDA GPUs; it does not run here",
            )
        matmul = _fp16_accumulating_matmul
    k = 4096
    generator = torch.Generator().manual_seed(1234)

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * scale

    factors = _cancelling_factors(rand, k)
    a, b = (factors[name].to(device, torch.float16) for name in ("a", "b"))
    started = time.perf_counter()
    with _exact_fp32():
        reference = a.float() @ b.float()
        partial = float((a[0].float() * b[:, 0].float()).cumsum(0).abs().max())
        try:
            output = matmul(a, b).float()
        except Exception as exc:  # noqa: BLE001 - a mode that cannot run is not a fault
            return OpResult(
                ACCUMULATION_OP, "fp16", "unavailable", note=f"raised {type(exc).__name__}: {exc}"
            )
    seconds = time.perf_counter() - started
    tolerance = TOLERANCE["fp16"]
    peak = float(reference.abs().max().clamp_min(1e-6))
    figures = f"partial sums reach {partial:,.0f}; fp32 accumulation gives at most {peak:,.3g}"
    bad = int((~torch.isfinite(output)).sum())
    if bad:
        note = f"{figures}, fp16 accumulation NaN or Inf in {bad} of {output.numel()} outputs"
        return OpResult(ACCUMULATION_OP, "fp16", "fail", None, tolerance, seconds, note)
    error = float((output - reference).abs().max()) / peak
    note = f"{figures}, fp16 accumulation off by {error:.2g} of that"
    status = "fail" if error > tolerance else "pass"
    return OpResult(ACCUMULATION_OP, "fp16", status, error, tolerance, seconds, note)


def _fp16_accumulating_matmul(a: Any, b: Any) -> Any:
    import torch

    flags = torch.backends.cuda.matmul
    saved = flags.allow_fp16_accumulation
    flags.allow_fp16_accumulation = True
    try:
        return a @ b
    finally:
        flags.allow_fp16_accumulation = saved


@dataclass(frozen=True)
class _Operation:
    """An operation under test: `make` builds fp32 inputs on a device, `run` applies the op."""

    name: str
    make: Callable[[Callable[..., Any]], dict[str, Any]]
    run: Callable[[dict[str, Any]], Any]
    # The fp32 reference when it is not `run` in fp32 (an attention backend: the math kernel).
    reference: Callable[[dict[str, Any]], Any] | None = None
    kernel_choice: bool = False  # an attention backend this device or build may lack


def _operations(small: bool) -> list[_Operation]:
    """SD's operations at shapes that exercise the same kernels, kept tiny on a CPU."""
    import torch.nn.functional as F  # noqa: N812

    batch, latent, feature, tokens = (1, 16, 8, 128) if small else (2, 64, 32, 1024)

    def conv(cin: int, cout: int, size: int) -> _Operation:
        return _Operation(
            f"conv2d {cin}->{cout}",
            lambda rand: {
                "x": rand(batch, cin, size, size),
                "w": rand(cout, cin, 3, 3, scale=(cin * 9) ** -0.5),
                "b": rand(cout, scale=0.1),
            },
            lambda t: F.conv2d(t["x"], t["w"], t["b"], padding=1),
        )

    def attention(backend: str) -> _Operation:
        return _Operation(
            f"attention:{backend}",
            lambda rand: {
                "q": rand(batch, 8, tokens, 64),
                "k": rand(batch, 8, tokens, 64),
                "v": rand(batch, 8, tokens, 64),
            },
            lambda t: _attention(t, backend),
        )

    def geglu(t: dict[str, Any]) -> Any:
        hidden, gate = F.linear(t["x"], t["w"], t["b"]).chunk(2, dim=-1)
        return hidden * F.gelu(gate)

    width = 320
    return [
        conv(4, width, latent),
        conv(width, 2 * width, feature),
        _Operation(
            "group_norm",
            lambda rand: {
                "x": rand(batch, width, latent, latent, scale=3.0),
                "w": rand(width, scale=0.5),
                "b": rand(width, scale=0.5),
            },
            lambda t: F.group_norm(t["x"], 32, t["w"], t["b"], eps=1e-5),
        ),
        _Operation(
            "layer_norm",
            lambda rand: {
                "x": rand(tokens, 768, scale=3.0),
                "w": rand(768, scale=0.5),
                "b": rand(768, scale=0.5),
            },
            lambda t: F.layer_norm(t["x"], (768,), t["w"], t["b"], eps=1e-5),
        ),
        _Operation(
            "matmul",
            lambda rand: {"a": rand(tokens, 768), "b": rand(768, 768, scale=768**-0.5)},
            lambda t: t["a"] @ t["b"],
        ),
        *[attention(b) for b in ATTENTION_BACKENDS],
        *_layout_and_range_operations(small, batch, latent, width),
        _Operation(
            "gelu", lambda rand: {"x": rand(tokens, 768, scale=3.0)}, lambda t: F.gelu(t["x"])
        ),
        _Operation(
            "geglu",
            lambda rand: {
                "x": rand(tokens, width),
                "w": rand(8 * width, width, scale=width**-0.5),
                "b": rand(8 * width, scale=0.1),
            },
            geglu,
        ),
    ]


def _layout_and_range_operations(small: bool, batch: int, latent: int, width: int):
    """Operations whose failures come from memory layout or magnitude, not the dtype's
    precision: attention on every backend with q/k/v as strided views of one fused projection
    (as diffusers' attention and Flux's fused qkv hand them over) at SD and Flux head shapes, a
    convolution of a channel chunk, group and layer norm of activations in the thousands (the
    variance of values past 256 passes 65504 when a kernel keeps it in half precision), and a
    long-K matrix product whose partial sums pass 65504 while the result is small (what a
    reduced-precision split-K reduction gets wrong), run with that reduction allowed."""
    import torch.nn.functional as F  # noqa: N812

    shapes = {  # heads, head_dim, tokens
        "sd": (8, 40, 256 if small else 4096),
        "flux": (4 if small else 24, 128, 256 if small else 4608),
    }

    def strided(heads: int, dim: int, tokens: int, backend: str):
        def run(t: dict[str, Any], chosen: str = backend) -> Any:
            q, k, v = (
                part.view(2, tokens, heads, dim).transpose(1, 2)
                for part in t["qkv"].chunk(3, dim=-1)
            )
            return _attention({"q": q, "k": k, "v": v}, chosen)

        return run

    operations = []
    for family, (heads, dim, tokens) in shapes.items():
        for backend in ATTENTION_BACKENDS:
            run = strided(heads, dim, tokens, backend)
            operations.append(
                _Operation(
                    f"strided attention {family}:{backend}",
                    lambda rand, heads=heads, dim=dim, tokens=tokens: {
                        "qkv": rand(2, tokens, 3 * heads * dim)
                    },
                    run,
                    reference=lambda t, run=run: run(t, "math"),
                    kernel_choice=True,
                )
            )
    big = 5000.0
    long_k = 4096 if small else 16384
    operations += [
        _Operation(
            "conv2d after chunk",
            lambda rand: {
                "x": rand(2, 2 * width, latent, latent),
                "w": rand(width, width, 3, 3, scale=(width * 9) ** -0.5),
            },
            lambda t: F.conv2d(t["x"].chunk(2, dim=1)[1], t["w"], padding=1),
        ),
        _Operation(
            "group_norm large",
            lambda rand: {
                "x": rand(batch, width, latent, latent, scale=big),
                "w": rand(width, scale=0.5),
                "b": rand(width, scale=0.5),
            },
            lambda t: F.group_norm(t["x"], 32, t["w"], t["b"], eps=1e-5),
        ),
        _Operation(
            "layer_norm large",
            lambda rand: {
                "x": rand(256, 768, scale=big),
                "w": rand(768, scale=0.5),
                "b": rand(768, scale=0.5),
            },
            lambda t: F.layer_norm(t["x"], (768,), t["w"], t["b"], eps=1e-5),
        ),
        _Operation(
            "long-K matmul, reduced-precision reduction",
            lambda rand: _cancelling_factors(rand, long_k),
            _reduced_precision_matmul,
        ),
    ]
    return operations


def _cancelling_factors(rand: Callable[..., Any], k: int) -> dict[str, Any]:
    """(64, k) @ (k, 64) whose first half of the sum is +64 per term and second half -64:
    partial sums reach 64 * k / 2 (past 65504 for k >= 2048), the result is small noise."""
    a = rand(64, k, scale=0.0) + 8.0
    b = rand(k, 64, scale=0.01) + 8.0
    b[k // 2 :] -= 16.0
    return {"a": a, "b": b}


def _reduced_precision_matmul(t: dict[str, Any]) -> Any:
    import torch

    matmul = torch.backends.cuda.matmul
    saved = (
        matmul.allow_fp16_reduced_precision_reduction,
        matmul.allow_bf16_reduced_precision_reduction,
    )
    matmul.allow_fp16_reduced_precision_reduction = True
    matmul.allow_bf16_reduced_precision_reduction = True
    try:
        return t["a"] @ t["b"]
    finally:
        (
            matmul.allow_fp16_reduced_precision_reduction,
            matmul.allow_bf16_reduced_precision_reduction,
        ) = saved


def _attention(t: dict[str, Any], backend: str) -> Any:
    import torch.nn.functional as F  # noqa: N812
    from torch.nn.attention import SDPBackend, sdpa_kernel

    chosen = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "math": SDPBackend.MATH,
    }[backend]
    with sdpa_kernel([chosen]):
        return F.scaled_dot_product_attention(t["q"], t["k"], t["v"])


def _check(op: _Operation, dtype: str, device: torch.device) -> OpResult:
    import torch

    torch_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    generator = torch.Generator().manual_seed(1234)

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=generator) * scale).to(device)

    tolerance = TOLERANCE[dtype]
    started = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            inputs = {k: v.to(torch_dtype) for k, v in op.make(rand).items()}
            output = op.run(inputs)
            # The reference sees the same rounded inputs, so only the arithmetic is compared;
            # attention's reference is always the plain math kernel.
            reference_inputs = {k: v.float() for k, v in inputs.items()}
            if op.reference is not None:
                reference = op.reference(reference_inputs)
            elif op.name.startswith("attention:"):
                reference = _attention(reference_inputs, "math")
            else:
                reference = op.run(reference_inputs)
            output = output.float()
            finite = bool(torch.isfinite(output).all())
            reference_finite = bool(torch.isfinite(reference).all())
            error = None
            if finite and reference_finite:
                scale = float(reference.abs().max().clamp_min(1e-6))
                error = float((output - reference).abs().max()) / scale
        except Exception as exc:  # noqa: BLE001 - any failure of the op is the finding
            seconds = time.perf_counter() - started
            first_line = (str(exc).strip().splitlines() or [""])[0]
            message = f"{type(exc).__name__}: {first_line}"
            kernel_choice = op.kernel_choice or op.name.startswith("attention:")
            if kernel_choice and any(m in str(exc) for m in _NO_KERNEL_MESSAGES):
                return OpResult(
                    op.name,
                    dtype,
                    "unavailable",
                    None,
                    tolerance,
                    seconds,
                    "this attention backend does not run here",
                )
            return OpResult(
                op.name, dtype, "fail", None, tolerance, seconds, f"raised {message[:200]}"
            )
    seconds = time.perf_counter() - started
    heard = "; ".join(sorted({str(w.message).splitlines()[0][:120] for w in caught}))
    if not reference_finite:
        return OpResult(
            op.name,
            dtype,
            "fail",
            None,
            tolerance,
            seconds,
            "the fp32 reference itself was not finite",
        )
    if not finite:
        return OpResult(
            op.name,
            dtype,
            "fail",
            None,
            tolerance,
            seconds,
            "output held NaN or Inf where fp32 is finite",
        )
    assert error is not None
    if error > tolerance:
        return OpResult(
            op.name,
            dtype,
            "fail",
            error,
            tolerance,
            seconds,
            f"error {error:.2g} is past the tolerance {tolerance:g}",
        )
    return OpResult(op.name, dtype, "pass", error, tolerance, seconds, heard)


@contextmanager
def _exact_fp32() -> Iterator[None]:
    """Turn TF32 off while testing, so the fp32 reference is real fp32 on Ampere and newer."""
    import torch

    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = matmul
        torch.backends.cudnn.allow_tf32 = cudnn
