"""How fast a device multiplies in each dtype: matmul and convolution throughput in fp16, bf16 and
fp32 (GFLOP/s), measured once per device and cached beside its self-test (under the same key,
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
DTYPES = ("fp16", "bf16", "fp32")
# Bumped when what is measured changes: an older cached table is measured again.
SPEED_VERSION = 1


@dataclass(frozen=True)
class DtypeSpeed:
    """`gflops[dtype][kind]`: the device's throughput, GFLOP/s, for the dtypes measured (a dtype
    the device does not run is absent)."""

    key: str
    gflops: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    seconds_measuring: float = 0.0

    def seconds(self, flops: Mapping[tuple[str, str], float]) -> float | None:
        """What `flops` ((dtype, kind) -> floating-point operations) take at these speeds; None
        where a dtype or kind in it was not measured."""
        total = 0.0
        for (dtype, kind), count in flops.items():
            rate = self.gflops.get(dtype, {}).get(kind)
            if not rate:
                if count:
                    return None
                continue
            total += count / (rate * 1e9)
        return total

    def to_json(self) -> dict[str, Any]:
        return {
            "gflops": {d: dict(k) for d, k in self.gflops.items()},
            "seconds_measuring": self.seconds_measuring,
        }


def _shapes(device_type: str) -> tuple[int, tuple[int, int, int]]:
    """The matmul side and the convolution's (channels, side, batch): big enough to run a
    device near its rate for a UNet's layers, small enough to measure in a fraction of a second
    (a CPU's fp16 kernels are slow)."""
    if device_type == "cpu":
        return 512, (64, 32, 1)
    return 4096, (320, 64, 2)


def _rate(run: Callable[[], Any], flops: float, sync: Callable[[], None], repeats: int) -> float:
    run()  # warm-up: kernel selection, caches
    sync()
    began = time.perf_counter()
    for _ in range(repeats):
        run()
    sync()
    return flops * repeats / max(time.perf_counter() - began, 1e-9) / 1e9


def measure(device, key: str, dtypes: Iterable[str] = DTYPES, repeats: int = 5) -> DtypeSpeed:
    """Time a square matmul and a 3x3 convolution in each of `dtypes` on `device` (a torch
    device); a dtype the device cannot run is left out."""
    import torch

    from app.core.precision.plan import torch_dtype

    began = time.perf_counter()
    side, (channels, width, batch) = _shapes(device.type)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    gflops: dict[str, dict[str, float]] = {}
    generator = torch.Generator().manual_seed(0)
    for name in dtypes:
        dtype = torch_dtype(name)
        try:
            a = torch.randn(side, side, generator=generator).to(device, dtype)
            b = torch.randn(side, side, generator=generator).to(device, dtype)
            x = torch.randn(batch, channels, width, width, generator=generator).to(device, dtype)
            w = torch.randn(channels, channels, 3, 3, generator=generator).to(device, dtype)
            with torch.inference_mode():
                matmul = _rate(lambda a=a, b=b: a @ b, 2.0 * side**3, sync, repeats)
                conv_flops = 2.0 * batch * channels * channels * 9 * width * width
                conv = _rate(
                    lambda x=x, w=w: torch.nn.functional.conv2d(x, w, padding=1),
                    conv_flops,
                    sync,
                    repeats,
                )
        except (RuntimeError, TypeError, NotImplementedError):  # no kernel for it here
            continue
        gflops[name] = {"matmul": round(matmul, 3), "conv": round(conv, 3)}
    return DtypeSpeed(key, gflops, round(time.perf_counter() - began, 4))


def cache_path(key: str) -> Path:
    """The cached table of the device whose self-test key is `key`, beside its self-test."""
    from app.core import paths

    digest = hashlib.sha256(json.dumps([SPEED_VERSION, key]).encode("utf-8")).hexdigest()[:24]
    return paths.cache_dir() / "selftest" / f"{digest}.speed.json"


def cached(key: str) -> DtypeSpeed | None:
    """The cached table for `key`; None where there is none, or it is damaged or another's."""
    try:
        data = json.loads(cache_path(key).read_text(encoding="utf-8"))
        if not isinstance(data, dict) or data.get("key") != key:
            return None
        gflops = {
            str(d): {k: float(v) for k, v in kinds.items() if k in KINDS}
            for d, kinds in data["gflops"].items()
            if d in DTYPES
        }
        return DtypeSpeed(key, gflops, float(data.get("seconds_measuring", 0.0)))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
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
