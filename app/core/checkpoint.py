"""Opening checkpoint files safely: safetensors header checks, the pickle policy, the weight scan.

Every file is untrusted. A `.safetensors` header is validated here, byte by byte, before the
file is handed to safetensors or diffusers, so a malformed file is refused with one sentence and
nothing is half-loaded. Pickle checkpoints (`.ckpt`, `.pt`, `.bin`) can run code when opened;
they are refused unless the user allows them, and even then only PyTorch's weights-only loader
reads them.

This module imports torch only inside the functions that need it.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import struct
import sys
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.core import quantized
from app.core.errors import BadFileError, PickleRefusedError
from app.core.jobs import CancelToken, ProgressCallback, no_progress
from app.core.limits import check_tensor_shape, open_regular, parse_json, read_regular

# The safetensors format caps its JSON header at 100 MB; its reference reader refuses larger.
HEADER_LIMIT = 100_000_000
PICKLE_SUFFIXES = (".ckpt", ".pt", ".pth", ".bin", ".pkl")
SAFETENSORS_SUFFIX = ".safetensors"

# Bits per element of every dtype the safetensors format defines.
DTYPE_BITS = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "I64": 64,
    "U64": 64,
    "F64": 64,
    "C64": 64,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
}
FLOAT_DTYPES = {
    "F16",
    "BF16",
    "F32",
    "F64",
    "F8_E5M2",
    "F8_E4M3",
    "F8_E8M0",
    "F4",
    "F6_E2M3",
    "F6_E3M2",
}
# The names HalfSafe shows for a model's storage precision.
DTYPE_NAMES = {
    "F16": "fp16",
    "BF16": "bf16",
    "F32": "fp32",
    "F64": "fp64",
    "F8_E5M2": "fp8",
    "F8_E4M3": "fp8",
    "F8_E8M0": "fp8",
}

_ZIP_MAGIC = b"PK\x03\x04"


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lies in a safetensors file; offsets are relative to the data section."""

    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


@dataclass
class SafetensorsHeader:
    """A validated safetensors header: every tensor's dtype, shape and byte range."""

    path: Path
    file_size: int
    raw: bytes
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def data_start(self) -> int:
        return 8 + len(self.raw)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: info.shape for name, info in self.tensors.items()}

    def dtypes(self) -> dict[str, str]:
        return {name: info.dtype for name, info in self.tensors.items()}


def read_safetensors_header(path: str | Path) -> SafetensorsHeader:
    """Read and validate a safetensors header without reading any tensor data.

    Checks, in order: the file exists and can be read; it is long enough for the 8-byte length
    field; the header fits in the file and under the format's 100 MB limit; it is a JSON object;
    every entry has a known dtype, a shape and offsets whose length matches dtype x shape; the
    tensors lie inside the data section, do not overlap and leave no gap or trailing bytes.
    Raises BadFileError (or PickleRefusedError for a pickle under a .safetensors name) with one
    sentence naming the file and the first problem found.
    """
    path = Path(path)
    size = _file_size(path)
    if size == 0:
        raise BadFileError(path, "the file is empty (0 bytes), so it holds no model.")
    try:
        with open_regular(path) as handle:
            head = handle.read(8)
            if head.startswith(_ZIP_MAGIC) or _looks_like_pickle(head):
                raise PickleRefusedError(
                    path,
                    "this is a pickle checkpoint under a .safetensors name; pickles can "
                    "run code when opened, so HalfSafe refuses it.",
                )
            if len(head) < 8:
                raise BadFileError(
                    path,
                    f"the file is only {size} bytes long, too short to be a safetensors "
                    "file (it is truncated or not a model).",
                )
            (header_len,) = struct.unpack("<Q", head)
            if header_len > HEADER_LIMIT:
                raise BadFileError(
                    path,
                    f"the header length field says {header_len / 1e6:.0f} MB, over the "
                    f"safetensors limit of {HEADER_LIMIT // 1_000_000} MB, so the file is "
                    "malformed or not a safetensors file.",
                )
            if header_len > size - 8:
                raise BadFileError(
                    path,
                    f"the header length field says {header_len} bytes but the file has only "
                    f"{size - 8} after it: the file is truncated or not a safetensors file.",
                )
            raw = handle.read(header_len)
    except OSError as error:
        raise BadFileError(path, f"the file cannot be read ({error.strerror or error}).") from None
    if len(raw) != header_len:
        raise BadFileError(path, "the file changed or ended while its header was being read.")
    return _parse_header(path, size, raw)


def read_header(path: str | Path) -> SafetensorsHeader | quantized.GgufHeader:
    """A model file's tensor names, shapes and dtype codes from its header alone: a GGUF file
    (by its first bytes) or a safetensors file, each validated (see `read_safetensors_header`,
    `quantized.check_gguf_header`)."""
    if quantized.is_gguf_file(path):
        return quantized.read_gguf_header(path)
    return read_safetensors_header(path)


def _parse_header(path: Path, size: int, raw: bytes) -> SafetensorsHeader:
    try:
        document = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicate_keys)
    except UnicodeDecodeError:
        raise BadFileError(
            path, "the header is not text, so this is not a safetensors file."
        ) from None
    except _DuplicateKeyError as error:
        raise BadFileError(path, f"the header names tensor '{error}' twice.") from None
    except (ValueError, RecursionError):
        raise BadFileError(
            path, "the header is not valid JSON, so the file is damaged or not a safetensors file."
        ) from None
    if not isinstance(document, dict):
        raise BadFileError(
            path, "the header is JSON but not an object, so this is not a safetensors file."
        )

    metadata = document.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise BadFileError(path, "the header's __metadata__ is not a map of text to text.")

    data_size = size - 8 - len(raw)
    tensors: dict[str, TensorInfo] = {}
    for name, entry in document.items():
        tensors[name] = _tensor_info(path, name, entry, data_size)

    # The format requires tensors to tile the data section exactly: no overlap, no hole.
    position = 0
    for name, info in sorted(tensors.items(), key=lambda item: (item[1].start, item[1].end)):
        if info.start < position:
            raise BadFileError(
                path,
                f"tensor '{name}' overlaps the tensor before it "
                f"(bytes {info.start}-{info.end}), so the file is malformed.",
            )
        if info.start > position:
            raise BadFileError(
                path,
                f"there is a gap of {info.start - position} bytes before "
                f"tensor '{name}', so the file is malformed.",
            )
        position = info.end
    if position != data_size:
        raise BadFileError(
            path,
            f"the file has {data_size - position} bytes after its last "
            "tensor, so it is damaged or not what its header says.",
        )
    return SafetensorsHeader(path, size, raw, tensors, dict(metadata))


def _tensor_info(path: Path, name: str, entry: Any, data_size: int) -> TensorInfo:
    if not isinstance(entry, dict):
        raise BadFileError(path, f"the header entry for '{name}' is not an object.")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in DTYPE_BITS:
        raise BadFileError(path, f"tensor '{name}' has an unknown dtype {dtype!r}.")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise BadFileError(path, f"tensor '{name}' has an invalid shape {shape!r}.")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)
        or offsets[0] > offsets[1]
    ):
        raise BadFileError(path, f"tensor '{name}' has invalid data offsets {offsets!r}.")
    too_big = check_tensor_shape(shape)
    if too_big is not None:
        raise BadFileError(path, f"tensor '{name}' {too_big}, so the file is damaged or hostile.")
    start, end = offsets
    expected_bits = math.prod(shape) * DTYPE_BITS[dtype]
    if expected_bits != (end - start) * 8:
        raise BadFileError(
            path,
            f"tensor '{name}' is {dtype} with shape {shape}, which needs "
            f"{math.ceil(expected_bits / 8)} bytes, but its offsets span {end - start}.",
        )
    if end > data_size:
        raise BadFileError(
            path,
            f"tensor '{name}' ends at byte {end} of the data but the file holds only "
            f"{data_size}: the file is truncated.",
        )
    return TensorInfo(dtype, tuple(shape), start, end)


class _DuplicateKeyError(ValueError):
    pass


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKeyError(key)
        result[key] = value
    return result


def _file_size(path: Path) -> int:
    try:
        stat = path.stat()
    except FileNotFoundError:
        raise BadFileError(path, "the file does not exist.") from None
    except OSError as error:
        raise BadFileError(path, f"the file cannot be read ({error.strerror or error}).") from None
    if not path.is_file():
        raise BadFileError(path, "this is not a regular file.")
    return stat.st_size


def _looks_like_pickle(head: bytes) -> bool:
    # Pickle protocol 2+ opens with PROTO (0x80) and the version; torch's legacy format too.
    return len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5


# The pickle policy -------------------------------------------------------------------------


def is_pickle_file(path: str | Path) -> bool:
    """True for the pickle suffixes, and for any file whose first bytes are a pickle or a zip."""
    path = Path(path)
    if path.suffix.lower() in PICKLE_SUFFIXES:
        return True
    try:
        with open_regular(path) as handle:
            head = handle.read(8)
    except OSError:
        return False
    return head.startswith(_ZIP_MAGIC) or _looks_like_pickle(head)


def _refuse_if_not_torch_save(path: Path) -> None:
    """A file under a pickle suffix that torch.save did not write (neither a zip archive nor a
    pickle of protocol 2+: random or damaged bytes) is named as such, not as possible code."""
    with open_regular(path) as handle:
        head = handle.read(8)
    if not (head.startswith(_ZIP_MAGIC) or _looks_like_pickle(head)):
        raise BadFileError(
            path,
            "the file is neither a zip archive nor a pickle, so it is not a PyTorch checkpoint "
            "(it is damaged, or another kind of file under this name).",
        )


def refuse_pickle(path: str | Path) -> None:
    """Raise the one-sentence refusal for a pickle file the user has not allowed (or, for a
    file that is no pickle at all, the sentence saying so)."""
    path = Path(path)
    _refuse_if_not_torch_save(path)
    kind = path.suffix.lower() or "pickle"
    raise PickleRefusedError(
        path,
        f"this is a pickle file ({kind}), which can run any code on your computer when "
        "opened; HalfSafe opens it only if you allow pickles (--allow-pickle), and then only "
        "with PyTorch's weights-only loader.",
    )


def load_pickle_state_dict(path: str | Path) -> dict[str, Any]:
    """Read a pickle checkpoint with PyTorch's weights-only loader and return its tensors.

    Nothing in the file runs: the weights-only unpickler accepts tensors and plain containers
    only, and fails on anything else (which is reported as a bad file). A nested "state_dict"
    (Lightning/LDM checkpoints) is unwrapped, stopping at a loop; non-tensor entries are
    dropped. Each tensor must be a plain dense CPU tensor whose elements its stored bytes
    really hold (see `_pickle_tensor_problem`). Zip checkpoints are memory-mapped, as
    safetensors are (see `Checkpoint.check_unchanged`). PyTorch's warnings stay quiet.
    """
    import pickle
    import warnings
    import zipfile

    import torch

    path = Path(path)
    size = _file_size(path)
    if size == 0:
        raise BadFileError(path, "the file is empty (0 bytes), so it holds no model.")
    _refuse_if_not_torch_save(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loaded = _torch_load(path)
    except pickle.UnpicklingError:
        raise BadFileError(
            path,
            "PyTorch's weights-only loader refused this file because it holds more than "
            "plain tensors (possibly code), so HalfSafe will not open it.",
        ) from None
    except OSError as error:
        raise BadFileError(path, f"the file cannot be read ({error.strerror or error}).") from None
    except (RuntimeError, EOFError, ValueError, zipfile.BadZipFile, struct.error):
        raise BadFileError(
            path,
            "the file is damaged, truncated or changed while it was read: PyTorch could not "
            "read it as a checkpoint.",
        ) from None
    except MemoryError:
        raise BadFileError(
            path, "the file declares more data than this computer's memory, so it is damaged."
        ) from None
    loaded = _unwrap_state_dict(path, loaded)
    tensors = {
        k: v for k, v in loaded.items() if isinstance(k, str) and isinstance(v, torch.Tensor)
    }
    if not tensors:
        raise BadFileError(path, "the file holds no weights.")
    total = 0
    for name, tensor in tensors.items():
        problem = _pickle_tensor_problem(tensor)
        if problem is not None:
            raise BadFileError(path, f"tensor '{name}' {problem}.")
        total += tensor.numel() * tensor.element_size()
    # Tied weights may share bytes, but never many times over: without this bound, thousands of
    # names for one large tensor would make the weight scan read the file thousands of times.
    if total > _MAX_PICKLE_REUSE * size + (1 << 20):
        raise BadFileError(
            path,
            f"its tensors add up to {total / 1e9:.1f} GB but the file holds only "
            f"{size / 1e9:.1f} GB, so it names the same data over and over.",
        )
    return tensors


def _torch_load(path: Path) -> Any:
    """torch.load with the weights-only loader, memory-mapping zip checkpoints.

    torch.load hands any path ending in ".safetensors" to safetensors, whatever the file holds;
    a pickle under that name is read through a file object instead (not mapped). The legacy
    (pre-zip) format cannot be mapped either.
    """
    import torch

    if not str(path).endswith(SAFETENSORS_SUFFIX):
        try:
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as error:
            if "mmap" not in str(error):
                raise
    with open_regular(path) as handle:
        return torch.load(handle, map_location="cpu", weights_only=True)


# How many times over a pickle's tensors may cover its file: tied embeddings count twice.
_MAX_PICKLE_REUSE = 4


def _unwrap_state_dict(path: Path, loaded: Any) -> dict[str, Any]:
    """Follow "state_dict" entries (a Lightning checkpoint holds the weights one level down)
    to the dictionary of weights; a chain that loops back on itself is a bad file."""
    seen: set[int] = set()
    while isinstance(loaded, dict) and isinstance(loaded.get("state_dict"), dict):
        if id(loaded) in seen:
            raise BadFileError(
                path,
                "its state_dict entries refer back to each other in a loop, so it holds no "
                "weights (the file is damaged or hostile).",
            )
        seen.add(id(loaded))
        loaded = loaded["state_dict"]
    if not isinstance(loaded, dict):
        raise BadFileError(path, "the file does not hold a dictionary of weights.")
    return loaded


def _pickle_tensor_problem(tensor) -> str | None:
    """Why a tensor from a pickle is not a plain weight HalfSafe can read, or None.

    The weights-only loader still builds sparse, quantized, nested and meta tensors, and views
    whose elements repeat a few stored values (a stride-0 view of 4 bytes can claim 1e12
    elements, which a weight scan would add up for hours).
    """
    import torch

    if tensor.is_meta or tensor.device.type != "cpu":
        return "is a placeholder without data (a meta tensor), so the file holds no weights there"
    if tensor.layout != torch.strided or tensor.is_nested:
        return f"is a {str(tensor.layout).removeprefix('torch.')} tensor, not a dense weight"
    if tensor.is_quantized:
        return "is a quantized tensor, which HalfSafe cannot check or run"
    too_big = check_tensor_shape(tensor.shape)
    if too_big is not None:
        return too_big
    stored = tensor.untyped_storage().nbytes()
    if tensor.numel() * tensor.element_size() > stored:
        return (
            f"claims {tensor.numel():.3g} elements but stores only {stored} bytes (a stride-0 "
            "or overlapping view), which no model file holds"
        )
    return None


# An opened checkpoint ----------------------------------------------------------------------


class Checkpoint:
    """A single-file checkpoint opened for reading: names, shapes and dtypes up front, tensors
    on demand.

    Quantized files are dequantised here, in `get`, so every loader reads plain weights: fp8
    tensors are multiplied by their scales (`quantized.fp8_layout` pairs them; the scales, input
    scales and the `scaled_fp8` marker are hidden from `keys`, `shapes` and `dtypes`), GGUF files
    (recognised by their first bytes, bounds-checked before they are mapped) are decoded by the
    gguf package. Both become `quantized.COMPUTE_DTYPE`. What a decoded weight shows wrong (a
    bad scale, implausible values) is kept in `findings` and reported to an active
    `quantized.collecting()`; `quantization` says how the file is stored. `component` names the
    pipeline part the file holds, when the loader knows it (for the findings).

    For safetensors, the validated byte ranges are read as zero-copy views of a private
    (copy-on-write) memory map of the file: nothing is copied, pages are shared with the OS
    cache, and writing to a tensor never touches the file. The map lives as long as any
    tensor from it. The file is held open and checked before each tensor, so one that is
    truncated or rewritten meanwhile gets a sentence (see `check_unchanged`). Use as a context
    manager, or call `close()`.
    """

    def __init__(
        self, path: str | Path, *, allow_pickle: bool = False, component: str | None = None
    ) -> None:
        self.path = Path(path)
        self.header: SafetensorsHeader | None = None
        self._map: Any = None
        self._tensors: dict[str, Any] | None = None
        self._populated = 0
        self._gguf: quantized.GgufTensors | None = None
        self._fp8: quantized.Fp8Layout | None = None
        self._scales: dict[str, Any] = {}
        self.quantization: quantized.Quantization | None = None
        self.findings: dict[str, quantized.QuantFinding] = {}
        self.component = component
        if is_pickle_file(self.path):
            if not allow_pickle:
                refuse_pickle(self.path)
            self._stamp = self._stamp_now()
            self._tensors = load_pickle_state_dict(self.path)
            self.shapes = {k: tuple(v.shape) for k, v in self._tensors.items()}
            self.dtypes = {k: _safetensors_dtype(v.dtype) for k, v in self._tensors.items()}
            self.metadata: dict[str, str] = {}
            self.file_size = _file_size(self.path)
        elif quantized.is_gguf_file(self.path):
            self._gguf = quantized.GgufTensors(self.path)
            self._stamp = self._stamp_now()
            self.shapes = dict(self._gguf.shapes)
            self.dtypes = {n: _gguf_code(t) for n, t in self._gguf.types.items()}
            self.metadata = {}
            self.file_size = self._gguf.file_size
            self.quantization = quantized.Quantization(
                "gguf", self._gguf.quantized_types, self.path.name
            )
        else:
            self.header = read_safetensors_header(self.path)
            self.shapes = self.header.shapes()
            self.dtypes = self.header.dtypes()
            self.metadata = self.header.metadata
            self.file_size = self.header.file_size
        if not self.shapes:
            raise BadFileError(self.path, "the file holds no tensors, so it holds no model.")
        if self.header is not None:
            self._fp8 = quantized.fp8_layout(self.path, self.dtypes, self.shapes)
            self._open_for_tensors()
        if self._fp8 is not None:
            self._read_scales(self._fp8)
        if self.quantization is not None:
            quantized.report(quantization=self.quantization)

    def _read_scales(self, layout: quantized.Fp8Layout) -> None:
        """Hide the fp8 bookkeeping tensors and read every scale (a few bytes each) up front,
        so each weight is dequantised with its own scale as it is read."""
        import torch

        for name in layout.hidden:
            self.shapes.pop(name, None)
            self.dtypes.pop(name, None)
        for weight, scale in layout.scale_of.items():
            self._scales[weight] = self._stored(scale).to(torch.float32).clone()
        if layout.fp8:  # a `scaled_fp8` marker beside no fp8 weight leaves the file as stored
            types = sorted({layout.fp8[n] for n in layout.fp8})
            self.quantization = quantized.Quantization(layout.format, types, self.path.name)

    def _finding(self, name: str, problem: str) -> None:
        finding = quantized.QuantFinding(name, problem, self.path.name, self.component)
        if name not in self.findings:
            self.findings[name] = finding
            quantized.report(finding=finding)

    def _open_for_tensors(self) -> None:
        """Hold the validated file open and remember what it looked like (see `check_unchanged`)."""
        try:
            with open_regular(self.path) as handle:
                fd = os.dup(handle.fileno())
            # A bare descriptor, closed by close() or when this object goes away.
            self._fd: int | None = fd
            self._closer = weakref.finalize(self, os.close, fd)
            self._stamp = _stamp(os.fstat(fd))
            named = _stamp(os.stat(self.path))
        except OSError as error:
            raise BadFileError(
                self.path, f"the file cannot be read ({error.strerror or error})."
            ) from None
        if self._stamp != named or self._stamp[0] != self.file_size:
            self.close()
            raise _changed(self.path)

    def check_unchanged(self) -> None:
        """Raise BadFileError when the file was truncated, rewritten or replaced since it was
        opened: its size or modification time on the open handle differ.

        Tensors are zero-copy views of a map of the file, and a page of a map beyond a shrunken
        file's end kills the process (SIGBUS) when touched. `get` calls this before mapping each
        tensor, and loaders call it once more at the end, so a file that changes while it loads
        gets a sentence; only a change in the very moment a tensor is being read still crashes.
        """
        if getattr(self, "_stamp", None) is not None and self._stamp_now() != self._stamp:
            raise _changed(self.path)

    def _stamp_now(self) -> tuple[int, int, int, int, int] | None:
        """The stamp of the open descriptor (safetensors), or of the path (pickles, which
        PyTorch maps itself); None when it cannot be read."""
        fd = getattr(self, "_fd", None)
        try:
            return _stamp(os.fstat(fd) if fd is not None else os.stat(self.path))
        except (OSError, ValueError):
            return None

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Drop this object's hold on the file; tensors already handed out stay valid."""
        self._map = None
        if getattr(self, "_fd", None) is not None:
            self._fd = None
            self._closer()

    def keys(self) -> list[str]:
        """Tensor names, in file order (sequential reads are kinder to disks)."""
        if self.header is not None:
            ordered = sorted(self.header.tensors.items(), key=lambda kv: kv[1].start)
            return [k for k, _ in ordered if k in self.shapes]
        if self._gguf is not None:
            return self._gguf.keys()
        return list(self.shapes)

    def get(self, name: str):
        """One tensor: as stored (dtype and shape as in the file), except that fp8 and GGUF
        weights come dequantised (see the class)."""
        if self._tensors is not None:
            self.check_unchanged()
            return self._tensors[name]
        if self._gguf is not None:
            self.check_unchanged()
            tensor = self._gguf.get(name)
            if self.dtypes[name].startswith(_GGUF_PREFIX):
                self._check_decoded(name, tensor)
            return tensor
        tensor = self._stored(name)
        if self._fp8 is None or name not in self._fp8.fp8:
            return tensor
        # The one place fp8 becomes a plain weight: scaled where the file has a scale.
        scale = self._scales.get(name)
        problem = quantized.scale_problem(scale, tensor) if scale is not None else None
        tensor = quantized.dequantize_fp8(tensor, scale)
        if problem is not None:
            self._finding(name, f"has the scale {problem} (in {self._fp8.scale_of[name]})")
        else:
            self._check_decoded(name, tensor)
        return tensor

    def _check_decoded(self, name: str, tensor) -> None:
        problem = quantized.implausible(tensor)
        if problem is not None:
            self._finding(name, problem)

    def _stored(self, name: str):
        """One safetensors tensor exactly as stored: a zero-copy view of the map."""
        import torch

        assert self.header is not None
        info = self.header.tensors[name]
        dtype = _torch_dtype(self.path, name, info.dtype)
        if info.nbytes == 0:
            return torch.empty(info.shape, dtype=dtype)
        start = self.header.data_start + info.start
        self.check_unchanged()
        self._populate(start + info.nbytes)
        tensor = torch.frombuffer(
            self._mapping(), dtype=dtype, count=info.nbytes // dtype.itemsize, offset=start
        ).view(info.shape)
        # Kernels may assume element alignment; a header of odd length breaks it, so copy.
        return tensor if start % dtype.itemsize == 0 else tensor.clone()

    def _mapping(self):
        if self._map is None:
            import mmap

            if getattr(self, "_fd", None) is None:
                self._open_for_tensors()  # reopened after close(): still the same file?
            assert self._fd is not None
            try:
                self._map = mmap.mmap(self._fd, 0, access=mmap.ACCESS_COPY)
            except (OSError, ValueError) as error:
                raise BadFileError(
                    self.path,
                    f"the file cannot be mapped for reading "
                    f"({getattr(error, 'strerror', None) or error}).",
                ) from None
            if len(self._map) != self.file_size:
                self._map = None
                raise _changed(self.path)
        return self._map

    def _populate(self, end: int) -> None:
        """Map the file's pages ahead of use in large steps (Linux): one call per 256 MiB
        instead of a page fault every few KiB, which dominates reading on virtual machines."""
        if self._populated >= end or sys.platform != "linux":
            return
        mapping = self._mapping()
        start = self._populated
        stop = min(len(mapping), max(end, start + _POPULATE_STEP))
        stop = min(len(mapping), (stop + mmap_page() - 1) // mmap_page() * mmap_page())
        try:
            mapping.madvise(_MADV_POPULATE_READ, start, stop - start)
        except OSError as error:
            if error.errno == errno.EFAULT:
                # The kernel's way of saying "these pages are past the file's end now": the
                # file shrank after it was mapped, and touching them would raise SIGBUS.
                raise _changed(self.path) from None
            self._populated = len(mapping)  # unsupported kernel: fall back to page faults
            return
        except (ValueError, AttributeError):
            self._populated = len(mapping)
            return
        self._populated = stop

    def stored_dtype(self, names: Iterable[str] | None = None) -> str:
        return stored_dtype(self.dtypes[n] for n in (self.dtypes if names is None else names))


def _stamp(stat: os.stat_result) -> tuple[int, int, int, int, int]:
    """What identifies one version of a file: size, modification and change times, device and
    inode (see `file_stamp`)."""
    return (stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_dev, stat.st_ino)


def _changed(path: Path) -> BadFileError:
    return BadFileError(
        path,
        "the file changed while it was read (it was truncated, rewritten or replaced); "
        "load it again once it is complete.",
    )


_POPULATE_STEP = 256 << 20
_MADV_POPULATE_READ = 22  # Linux 5.14+; Python 3.11's mmap module does not name it


def mmap_page() -> int:
    import mmap

    return mmap.ALLOCATIONGRANULARITY


def _torch_dtype(path: Path, name: str, code: str):
    import torch

    names = {
        "F16": "float16",
        "BF16": "bfloat16",
        "F32": "float32",
        "F64": "float64",
        "I8": "int8",
        "U8": "uint8",
        "I16": "int16",
        "U16": "uint16",
        "I32": "int32",
        "U32": "uint32",
        "I64": "int64",
        "U64": "uint64",
        "BOOL": "bool",
        "F8_E4M3": "float8_e4m3fn",
        "F8_E5M2": "float8_e5m2",
        "F8_E8M0": "float8_e8m0fnu",
        "C64": "complex64",
    }
    dtype = getattr(torch, names.get(code, ""), None)
    if dtype is None:
        raise BadFileError(
            path, f"tensor '{name}' is stored as {code}, which this PyTorch cannot read."
        )
    return dtype


_GGUF_PREFIX = quantized.GGUF_DTYPE_PREFIX
_gguf_code = quantized.gguf_dtype_code


def _safetensors_dtype(dtype: Any) -> str:
    import torch

    names = {
        torch.float16: "F16",
        torch.bfloat16: "BF16",
        torch.float32: "F32",
        torch.float64: "F64",
        torch.int64: "I64",
        torch.int32: "I32",
        torch.int16: "I16",
        torch.int8: "I8",
        torch.uint8: "U8",
        torch.bool: "BOOL",
        torch.float8_e4m3fn: "F8_E4M3",
        torch.float8_e5m2: "F8_E5M2",
        torch.float8_e8m0fnu: "F8_E8M0",
    }
    return names.get(dtype, str(dtype).removeprefix("torch.").upper())


def stored_dtype(dtypes: Iterable[str]) -> str:
    """ "fp16", "bf16", "fp32" (or "fp8", a GGUF type such as "q8_0") when every floating
    tensor has that dtype, else "mixed".

    Integer tensors (position ids, step counters) do not count.
    """
    found = {
        DTYPE_NAMES.get(d, d.removeprefix(_GGUF_PREFIX).lower())
        for d in dtypes
        if d in FLOAT_DTYPES or d.startswith(_GGUF_PREFIX)
    }
    if len(found) == 1:
        return found.pop()
    return "mixed" if found else "none"


# The weight scan ---------------------------------------------------------------------------


@dataclass
class WeightScan:
    """What one pass over every tensor found: the names of tensors holding NaN or Inf, and,
    when asked for, the digest of their content (see `TensorDigest`)."""

    non_finite: list[str]
    tensors: int
    bytes: int
    seconds: float
    content: str | None = None  # TensorDigest hex, None when the scan did not identify
    # Quantized weights that decode wrongly (a bad scale, implausible values): see quantized.py.
    bad_quantized: list[quantized.QuantFinding] = field(default_factory=list)

    @property
    def mb_per_s(self) -> float:
        """Throughput in MB/s (10^6 bytes); 0 when nothing was timed."""
        return self.bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0

    def merged(self, other: WeightScan) -> WeightScan:
        """Both scans as one (a checkpoint and its separate VAE); the content digest covers
        both, each kept apart so tensors of the same name in the two cannot stand in for
        each other."""
        content = None
        if self.content is not None and other.content is not None:
            content = hashlib.sha256(
                f"{_DIGEST_SCHEME} merged\0{self.content}\0{other.content}".encode()
            ).hexdigest()
        return WeightScan(
            self.non_finite + other.non_finite,
            self.tensors + other.tensors,
            self.bytes + other.bytes,
            self.seconds + other.seconds,
            content,
            self.bad_quantized + other.bad_quantized,
        )


# Names the digest scheme; changing how tensors are hashed must change it, so that no key of
# the old scheme can ever match one of the new.
_DIGEST_SCHEME = "halfsafe-tensors-v1"


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
        combined = hashlib.sha256(_DIGEST_SCHEME.encode())
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
        started = time.perf_counter()
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


# Writing ----------------------------------------------------------------------------------


def write_safetensors(
    path: str | Path, tensors: Mapping[str, Any], metadata: Mapping[str, str] | None = None
) -> Path:
    """Write tensors as a safetensors file, streaming each tensor's bytes straight from its
    memory (no serialised copy of the whole model), to a temp file renamed into place."""
    import torch

    path = Path(path)
    ready = {name: t.detach().to("cpu").contiguous() for name, t in tensors.items()}
    header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for name, tensor in ready.items():
        size = tensor.numel() * tensor.element_size()
        header[name] = {
            "dtype": _safetensors_dtype(tensor.dtype),
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # keep tensor data 8-byte aligned, as the format advises
    # A plain exclusive open (not mkstemp) so the file gets the usual permissions.
    tmp = path.with_name(f"{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "xb") as handle:
            handle.write(struct.pack("<Q", len(raw)) + raw)
            for tensor in ready.values():
                if tensor.numel():
                    handle.write(memoryview(tensor.view(-1).view(torch.uint8).numpy()))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


# File hashes -------------------------------------------------------------------------------


def sha256_file(
    path: str | Path,
    *,
    cancel: CancelToken | None = None,
    on_bytes: Callable[[int], None] | None = None,
    chunk_bytes: int = 16 << 20,
) -> str:
    """sha256 of a whole file, read in chunks (hashlib releases the GIL on large updates, so
    this can run on a worker thread while the model loads). `on_bytes(total_so_far)` is called
    after each chunk, on the hashing thread."""
    digest = hashlib.sha256()
    buffer = bytearray(chunk_bytes)
    view = memoryview(buffer)
    done = 0
    with open(path, "rb", buffering=0) as handle:
        while True:
            if cancel is not None:
                cancel.raise_if_cancelled()
            read = handle.readinto(view)
            if not read:
                break
            digest.update(view[:read])
            done += read
            if on_bytes is not None:
                on_bytes(done)
    return digest.hexdigest()


# What was computed from a file's bytes (its sha256, its tensors' digest) is cached in one JSON
# file, each entry under a key with the stamp of the files it was computed from: a value is
# reused only while every one of those files has the same stamp (`file_stamp`).
_HASH_CACHE = "model_hashes.json"


def file_stamp(path: Path) -> dict[str, Any]:
    """One file's stamp, as cache entries record them: size, modification time, inode and
    change time.

    Size and modification time alone can be forged by accident: another model's bytes copied
    over the file with its time restored (`touch -r`, `cp -p`, a sync tool) keep both. The
    change time (st_ctime_ns) is set by the system on every write, and restoring the
    modification time sets it again; no call sets it back. A rewrite into a new file changes
    the inode. A chmod or a rename also changes the change time: that costs hashing once more.
    """
    stat = path.stat()
    return {
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "ctime_ns": stat.st_ctime_ns,
        "inode": [stat.st_dev, stat.st_ino],
    }


def files_stamp(files: Iterable[Path]) -> dict[str, Any]:
    """The stamp of several files: each one's absolute path and `file_stamp`."""
    stamps = []
    for file in files:
        file = file.resolve()
        stat = file.stat()
        stamps.append(
            [str(file), stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_dev, stat.st_ino]
        )
    return {"files": sorted(stamps)}


def cached_value(key: str, stamp: Mapping[str, Any], name: str) -> str | None:
    """The cached text `name` of entry `key`, if the entry's stamp is `stamp`; else None."""
    from app.core import paths

    entry = _read_json_dict(paths.cache_dir() / _HASH_CACHE).get(key)
    if not isinstance(entry, dict) or any(entry.get(k) != v for k, v in stamp.items()):
        return None
    value = entry.get(name)
    return value if isinstance(value, str) else None


def store_value(key: str, stamp: Mapping[str, Any], name: str, value: str) -> None:
    """Cache `value` as `name` of entry `key` (atomic write). Other values in the entry stay
    while its stamp still holds; a stamp that changed starts the entry afresh."""
    from app.core import paths

    cache_file = paths.cache_dir() / _HASH_CACHE
    cache = _read_json_dict(cache_file)  # another process may have added entries meanwhile
    entry = cache.get(key)
    if not isinstance(entry, dict) or any(entry.get(k) != v for k, v in stamp.items()):
        entry = dict(stamp)
    entry[name] = value
    cache[key] = entry
    write_json_atomic(cache_file, cache)


def cached_model_hash(path: str | Path) -> str | None:
    """The short hash if the cache already has it for this exact file, else None (no reading)."""
    path = Path(path).resolve()
    try:
        stamp = file_stamp(path)
    except OSError:
        return None
    sha = cached_value(str(path), stamp, "sha256")
    return sha[:10] if sha is not None else None


def model_hash(
    path: str | Path,
    *,
    cancel: CancelToken | None = None,
    on_bytes: Callable[[int], None] | None = None,
) -> str:
    """AUTOMATIC1111's short model hash: the first 10 hex digits of the file's sha256.

    Reading a multi-GB file takes seconds, so the full sha256 is cached in
    `paths.cache_dir()/model_hashes.json`, keyed by absolute path and `file_stamp`.
    """
    cached = cached_model_hash(path)
    if cached is not None:
        return cached
    path = Path(path).resolve()
    stamp = file_stamp(path)
    sha = sha256_file(path, cancel=cancel, on_bytes=on_bytes)
    if file_stamp(path) == stamp:  # a file rewritten while it was hashed is hashed next time
        store_value(str(path), stamp, "sha256", sha)
    return sha[:10]


def _read_json_dict(path: Path) -> dict[str, Any]:
    """A cache file's object, or {} when it is missing or damaged (nested, huge, not a file):
    a cache only saves time, so a bad one must never stop a model from loading."""
    try:
        data = parse_json(read_regular(path, _CACHE_LIMIT))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


# The hash cache holds some 150 bytes per model file.
_CACHE_LIMIT = 64 << 20


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON to a temp file beside `path`, then rename over it (never half a file)."""
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=1, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
