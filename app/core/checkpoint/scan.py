"""The weight scan: every tensor streamed once and checked for NaN and Inf and, when asked,
fingerprinted in the same pass (`TensorDigest`, the identity remembered fixes are keyed by).
The record it fills, `WeightScan`, is plain data in `weight_findings` (re-exported here), so
the window reads it without importing the reader.

Imports torch only inside the functions that need it.
"""

from __future__ import annotations

import hashlib
import os
import struct
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from app.core.checkpoint.dtypes import _safetensors_dtype
from app.core.checkpoint.reader import Checkpoint
from app.core.formats.weight_findings import DIGEST_SCHEME, WeightScan
from app.core.jobs import CancelToken, ProgressCallback, no_progress


class TensorDigest:
    """The identity of a set of tensors: sha256 over each one's name, dtype, shape and bytes.

    Remembered fixes are keyed by it, so two fine-tunes of one base saved in the same layout
    (byte-identical headers) never share one, while the same weights moved, renamed, touched
    or re-saved in another file format keep their key. Each tensor is hashed on its own as it
    streams past, and the per-tensor digests are combined in name order, so the order in which
    a loader happens to read them does not matter. sha256 because it is the fastest sound hash
    Python ships on CPUs with SHA extensions (0.9-1.3 GB/s on one core here, 2.1-2.4x blake2b;
    docs/benchmarks.md).
    """

    def __init__(self) -> None:
        self._parts: dict[str, bytes] = {}

    def add(self, name: str, tensor) -> None:
        """Hash one tensor (any device, any layout; copied to contiguous CPU memory only
        when it is not already there). Releases the GIL while hashing large tensors."""
        digest = hashlib.sha256()
        digest.update(f"{_safetensors_dtype(tensor.dtype)}{list(tensor.shape)}\0".encode())
        digest.update(tensor_bytes(tensor))
        self._parts[name] = digest.digest()

    def hexdigest(self) -> str:
        combined = hashlib.sha256(DIGEST_SCHEME.encode())
        for name in sorted(self._parts):
            encoded = name.encode("utf-8", "surrogatepass")
            combined.update(struct.pack("<Q", len(encoded)) + encoded + self._parts[name])
        return combined.hexdigest()


def tensor_bytes(tensor) -> memoryview:
    """A tensor's stored bytes as a flat view (no copy when it is contiguous on the CPU)."""
    import torch

    flat = tensor.detach().reshape(-1)
    if flat.device.type != "cpu":
        flat = flat.cpu()
    return memoryview(flat.contiguous().view(torch.uint8).numpy())


def tensor_is_finite(tensor) -> bool:
    """True when every element of a floating tensor is finite (integer tensors always are).

    A plain sum is the fast path: it reads the tensor once without a temporary, and a NaN or
    Inf anywhere makes it non-finite. Only when it is non-finite (which a large fp16 sum can
    also be, by overflow) does the exact element-wise check run.
    """
    import torch

    if not (tensor.is_floating_point() or tensor.is_complex()) or tensor.numel() == 0:
        return True
    if tensor.dtype.itemsize < 2:  # fp8 and smaller have no CPU sum kernel
        tensor = tensor.to(torch.float16)
    if bool(torch.isfinite(tensor.sum())):
        return True
    return bool(torch.isfinite(tensor).all())


class WeightScanner:
    """Accumulates a weight scan over tensors handed to it one by one (as a loader reads them).

    With `identify`, each tensor is also hashed into a `TensorDigest` while it is in memory for
    the NaN/Inf check, so the model's identity costs no second read (but about 1 s per GB of
    hashing: loaders skip it when a cached digest is still valid). `label` prefixes the names
    reported as non-finite (a separate VAE file's name) and is kept out of the digest.
    """

    def __init__(
        self,
        total_bytes: int = 0,
        on_progress: ProgressCallback | None = None,
        cancel: CancelToken | None = None,
        stage: str | None = None,
        *,
        identify: bool = False,
        label: str = "",
    ):
        self.non_finite: list[str] = []
        self.digest = TensorDigest() if identify else None
        self._label = label
        if stage is None:
            stage = "Checking weights for NaN/Inf"
            if identify:  # ten times slower than the check alone: say why this time it takes
                stage += " and fingerprinting them (first load only)"
        self.tensors = 0
        self.bytes = 0
        self.seconds = 0.0
        self._total_mb = max(1, round(total_bytes / 1e6))
        self._on_progress = on_progress or no_progress
        self._cancel = cancel
        self._stage = stage
        self._next_report = 0

    def check(self, name: str, tensor) -> None:
        if self._cancel is not None:
            self._cancel.raise_if_cancelled()
        from app.core.checkpoint.stored import plain

        started = time.perf_counter()
        tensor = plain(tensor)  # a weight kept as stored: its values, decoded once for both
        if not tensor_is_finite(tensor):
            self.non_finite.append(self._label + name)
        if self.digest is not None:
            self.digest.add(name, tensor)
        self.seconds += time.perf_counter() - started
        self.tensors += 1
        self.bytes += tensor.numel() * tensor.element_size()
        if self.bytes >= self._next_report:
            self._on_progress(
                self._stage, min(self._total_mb, round(self.bytes / 1e6)), self._total_mb
            )
            self._next_report = self.bytes + 64_000_000

    def result(self) -> WeightScan:
        content = self.digest.hexdigest() if self.digest is not None else None
        return WeightScan(list(self.non_finite), self.tensors, self.bytes, self.seconds, content)


def scan_weights(
    source: Any,
    *,
    allow_pickle: bool = False,
    on_progress: ProgressCallback | None = None,
    cancel: CancelToken | None = None,
    identify: bool = False,
) -> WeightScan:
    """Stream every tensor once and list the ones holding NaN or Inf (and with `identify`,
    digest their content in the same pass: see `WeightScanner`).

    `source` is a checkpoint path (safetensors tensors are memory-mapped one at a time, never
    copied as a whole; a pickle needs `allow_pickle`), a mapping of names to tensors, a
    diffusers pipeline (names are "<component>.<parameter>") or a torch module. `seconds`
    covers the whole pass, reading included. Runs on the calling thread; checks `cancel`
    between tensors.
    """
    started = time.perf_counter()
    tensors = _named_tensors(source, allow_pickle)
    items: list[tuple[str, Any]] | Iterator[tuple[str, Any]]
    total = 0
    if isinstance(tensors, Checkpoint):
        total = tensors.file_size
        names = tensors.keys()
        items = ((name, tensors.get(name)) for name in names)
    else:
        items = list(tensors)
        total = sum(t.numel() * t.element_size() for _, t in items)
    scanner = WeightScanner(total, on_progress, cancel, identify=identify)
    try:
        with one_torch_thread():
            for name, tensor in items:
                scanner.check(name, tensor)
    finally:
        if isinstance(tensors, Checkpoint):
            tensors.close()
    result = scanner.result()
    if isinstance(tensors, Checkpoint):
        result.bad_quantized = list(tensors.findings.values())
    result.seconds = time.perf_counter() - started
    return result


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """Run torch's CPU kernels on one thread for a while (process-wide), then restore.

    A scan is a chain of memory-bound reductions: one thread streams as fast as two, and
    multi-threaded kernels stall whenever the other core is busy (with the file hash, or with
    anything else on a small machine), which made scans 3-5x slower in measurements.
    """
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _named_tensors(source: Any, allow_pickle: bool):
    if isinstance(source, (str, os.PathLike)):
        return Checkpoint(os.fspath(source), allow_pickle=allow_pickle)
    if isinstance(source, Mapping):
        return iter(source.items())
    components = getattr(source, "components", None)
    if isinstance(components, dict):
        return _pipeline_tensors(components)
    if hasattr(source, "named_parameters"):
        return _module_tensors("", source)
    raise TypeError(f"cannot scan weights of {type(source).__name__}")


def _pipeline_tensors(components: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    for component, module in components.items():
        if hasattr(module, "named_parameters"):
            yield from _module_tensors(component + ".", module)


def _module_tensors(prefix: str, module: Any) -> Iterator[tuple[str, Any]]:
    seen: set[int] = set()
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        yield prefix + name, tensor.detach()
