"""How fast a device multiplies in each dtype: matmul and convolution throughput in fp16, bf16 and
fp32 (GFLOP/s), the rate each reads its weights at, and the rate of casting weights to the dtype,
measured once per device and cached beside its self-test (under the same key,
`selftest_cache.dtype_speed`), so that what a plan's step costs can be predicted from the work
it does (`app.core.health.step_work`) instead of timed.

Imports torch only inside the functions that need it.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KINDS = ("matmul", "conv")
# What the table holds per dtype: each kind's arithmetic (GFLOP/s), the rate its weights are
# read at (G weights/s), and casting fp16 weights to the dtype (G elements/s).
RATES = (*KINDS, *(f"{k}_weights" for k in KINDS), "cast")
DTYPES = ("fp16", "bf16", "fp32")
# Bumped when what is measured changes: an older cached table is measured again.
SPEED_VERSION = 2


@dataclass(frozen=True)
class DtypeSpeed:
    """`gflops[dtype][rate]`: the device's rates (`RATES`: GFLOP/s for a kind's arithmetic, G
    elements/s for its weights and for a cast) for the dtypes measured (a dtype the device does
    not run is absent; a rate the measurement could not tell, too)."""

    key: str
    gflops: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    seconds_measuring: float = 0.0

    def seconds(self, flops: Mapping[tuple[str, str], float]) -> float | None:
        """What `flops` ((dtype, rate) -> floating-point operations, or elements for a weights'
        or a cast's rate) take at these speeds; None where a dtype or an arithmetic's rate in it
        was not measured (a weights' or a cast's rate not measured counts no time)."""
        total = 0.0
        for (dtype, kind), count in flops.items():
            rate = self.gflops.get(dtype, {}).get(kind)
            if not rate:
                if count and (kind in KINDS or dtype not in self.gflops):
                    return None
                continue
            total += count / (rate * 1e9)
        return total

    def to_json(self) -> dict[str, Any]:
        return {
            "gflops": {d: dict(k) for d, k in self.gflops.items()},
            "seconds_measuring": self.seconds_measuring,
        }


def _shapes(
    device_type: str,
) -> tuple[tuple[int, int, int], tuple[int, int, int], tuple[int, int, int], tuple[int, int, int]]:
    """Each kind's two shapes: one its arithmetic bounds, one its weights bound (few rows or
    pixels per weight, as a UNet's inner blocks at a small latent). A matmul is (rows, inner,
    outer), a 3x3 convolution (batch, channels, side). Big enough to run a device near its rate,
    small enough to measure in about a second (a CPU's fp16 kernels are slow)."""
    if device_type == "cpu":
        return (1024, 1024, 1024), (32, 1280, 5120), (2, 320, 16), (2, 1280, 2)
    return (4096, 4096, 4096), (64, 5120, 20480), (2, 320, 64), (2, 1280, 8)


# Elements cast per call of the cast measured (a part computed from weights stored in another
# dtype casts each layer's weights as it runs).
_CAST_ELEMENTS = 2**24


def _rate(run: Callable[[], Any], sync: Callable[[], None], repeats: int) -> float:
    """Seconds one `run()` takes, after a warm-up (kernel selection, caches)."""
    run()
    sync()
    began = time.perf_counter()
    for _ in range(repeats):
        run()
    sync()
    return max(time.perf_counter() - began, 1e-9) / repeats


def _fit(work: tuple[float, float], weights: tuple[float, float], seconds: tuple[float, float]):
    """The rates (GFLOP/s, G weights/s) that make `seconds[i] = work[i] / flops_rate +
    weights[i] / weights_rate` hold for both shapes: the arithmetic's rate and the weights'.
    A shape both terms cannot explain (the weights' time would be negative) gives its rate from
    the arithmetic alone, and the weights no time of their own (None)."""
    (f1, f2), (w1, w2), (t1, t2) = work, weights, seconds
    det = f1 * w2 - f2 * w1
    per_flop = (t1 * w2 - t2 * w1) / det if det else 0.0
    per_weight = (f1 * t2 - f2 * t1) / det if det else 0.0
    if per_flop <= 0 or per_weight <= 0:
        return f1 / t1 / 1e9, None
    return 1 / per_flop / 1e9, 1 / per_weight / 1e9


def measure(device, key: str, dtypes: Iterable[str] = DTYPES, repeats: int = 3) -> DtypeSpeed:
    """Time a matmul and a 3x3 convolution at two shapes each (`_shapes`) and a cast from fp16
    in each of `dtypes` on `device` (a torch device): per dtype the arithmetic's rate of each
    kind (GFLOP/s), the rate its weights are read at ("<kind>_weights", G weights/s, where the
    two shapes tell it) and the rate of casting fp16 weights to it ("cast", G elements/s; none
    for fp16). A dtype the device cannot run is left out."""
    import torch

    from app.core.precision.plan import torch_dtype

    began = time.perf_counter()
    shapes = _shapes(device.type)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    gflops: dict[str, dict[str, float]] = {}
    generator = torch.Generator().manual_seed(0)

    def tensor(*size: int, dtype) -> Any:
        return torch.randn(*size, generator=generator).to(device, dtype)

    for name in dtypes:
        dtype = torch_dtype(name)
        rates: dict[str, float] = {}
        try:
            with torch.inference_mode():
                for kind, pair in (("matmul", shapes[:2]), ("conv", shapes[2:])):
                    work, weights, seconds = [], [], []
                    for shape in pair:
                        run, flops, held = _kernel(kind, shape, dtype, tensor)
                        seconds.append(_rate(run, sync, repeats))
                        work.append(flops)
                        weights.append(held)
                    rate, weight_rate = _fit(tuple(work), tuple(weights), tuple(seconds))
                    rates[kind] = round(rate, 3)
                    if weight_rate is not None:
                        rates[f"{kind}_weights"] = round(weight_rate, 3)
                if name != "fp16":
                    stored = tensor(_CAST_ELEMENTS, dtype=torch.float16)
                    taken = _rate(lambda s=stored, d=dtype: s.to(d), sync, repeats)
                    rates["cast"] = round(_CAST_ELEMENTS / taken / 1e9, 3)
        except (RuntimeError, TypeError, NotImplementedError):  # no kernel for it here
            continue
        gflops[name] = rates
    return DtypeSpeed(key, gflops, round(time.perf_counter() - began, 4))


def _kernel(kind: str, shape: tuple[int, int, int], dtype, tensor):
    """One kernel of `kind` at `shape`: the call, its floating-point operations and the weights
    it reads."""
    import torch

    if kind == "matmul":
        rows, inner, outer = shape
        a, b = tensor(rows, inner, dtype=dtype), tensor(outer, inner, dtype=dtype)
        return (lambda: torch.nn.functional.linear(a, b)), 2.0 * rows * inner * outer, b.numel()
    batch, channels, side = shape
    x = tensor(batch, channels, side, side, dtype=dtype)
    w = tensor(channels, channels, 3, 3, dtype=dtype)
    flops = 2.0 * batch * channels * channels * 9 * side * side
    return (lambda: torch.nn.functional.conv2d(x, w, padding=1)), flops, w.numel()


def cache_path(key: str) -> Path:
    """The cached table of the device whose self-test key is `key`, beside its self-test."""
    from app.core import paths

    digest = hashlib.sha256(json.dumps([SPEED_VERSION, key]).encode("utf-8")).hexdigest()[:24]
    return paths.cache_dir() / "selftest" / f"{digest}.speed.json"


def cached(key: str) -> DtypeSpeed | None:
    """The cached table for `key`; None where there is none, or it is damaged or another's."""
    from app.core.files import read_saved_object
    from app.core.hardware.selftest import CACHE_DAMAGE, MAX_CACHE_BYTES

    data = read_saved_object(cache_path(key), MAX_CACHE_BYTES)
    if data is None or data.get("key") != key:
        return None
    try:
        gflops = {
            str(d): {k: float(v) for k, v in kinds.items() if k in RATES}
            for d, kinds in data["gflops"].items()
            if d in DTYPES
        }
        return DtypeSpeed(key, gflops, float(data.get("seconds_measuring", 0.0)))
    except CACHE_DAMAGE:
        return None


def store(speed: DtypeSpeed) -> None:
    """Write the table atomically; a cache that cannot be written only costs a measurement."""
    path = cache_path(speed.key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    except OSError:
        return
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(json.dumps({"key": speed.key, **speed.to_json()}, indent=1))
        os.replace(tmp, path)
    except OSError:
        Path(tmp).unlink(missing_ok=True)
