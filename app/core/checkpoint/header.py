"""A safetensors header read and validated before any tensor is touched (and a GGUF header).

Every file is untrusted. A `.safetensors` header is validated here, byte by byte, before the
file is handed to safetensors or diffusers, so a malformed file is refused with one sentence and
nothing is half-loaded.
"""

from __future__ import annotations

import functools
import json
import math
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.core.checkpoint.dtypes import DTYPE_BITS
from app.core.errors import BadFileError, PickleRefusedError
from app.core.formats import gguf, quantized
from app.core.limits import check_tensor_shape, open_regular

# The safetensors format caps its JSON header at 100 MB; its reference reader refuses larger.
HEADER_LIMIT = 100_000_000
SAFETENSORS_SUFFIX = ".safetensors"

_ZIP_MAGIC = b"PK\x03\x04"
# The bytes read to tell what a file that is no safetensors file is (a text file renamed).
_SNIFF_BYTES = 64
# A text file's opening said back to the user, at most this many characters.
_QUOTED_CHARS = 32


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
        """Every tensor's shape as the model sees it: an NVFP4 weight at the shape of the values
        it packs (`quantized.model_view`); `tensors` holds the stored shapes. A copy: callers
        may change it."""
        return dict(self._model_view[0])

    def dtypes(self) -> dict[str, str]:
        """Every tensor's dtype code as the model sees it: NVFP4 and int8-with-scale weights
        as NVFP4 and INT8 (`quantized.model_view`); `tensors` holds the stored codes. A copy."""
        return dict(self._model_view[1])

    @functools.cached_property
    def _model_view(self) -> tuple[dict[str, tuple[int, ...]], dict[str, str]]:
        stored_shapes = {name: info.shape for name, info in self.tensors.items()}
        stored_dtypes = {name: info.dtype for name, info in self.tensors.items()}
        return quantized.model_view(stored_shapes, stored_dtypes)


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
            start = handle.read(_SNIFF_BYTES)
            head = start[:8]
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
            if header_len > min(HEADER_LIMIT, size - 8):
                # No header's length at all: say what the file is rather than what its first
                # bytes would mean as one ("2338328219632 MB").
                foreign = not_safetensors_words(start)
                if foreign:
                    raise BadFileError(path, foreign)
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
            handle.seek(8)
            raw = handle.read(header_len)
    except OSError as error:
        raise BadFileError(path, f"the file cannot be read ({error.strerror or error}).") from None
    if len(raw) != header_len:
        raise BadFileError(path, "the file changed or ended while its header was being read.")
    return _parse_header(path, size, raw)


def read_header(path: str | Path) -> SafetensorsHeader | gguf.GgufHeader:
    """A model file's tensor names, shapes and dtype codes from its header alone: a GGUF file
    (by its first bytes) or a safetensors file, each validated (see `read_safetensors_header`,
    `gguf.check_gguf_header`)."""
    if gguf.is_gguf_file(path):
        return gguf.read_gguf_header(path)
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


def not_safetensors_words(start: bytes) -> str | None:
    """What a file is whose first bytes (`start`, up to 64) cannot open a safetensors file,
    one whose 8-byte length field is no header's length: text ("this is a text file, not a
    safetensors file ...", quoting its start, printable characters only), or other bytes
    where the header's opening brace belongs. None where the brace is there (a safetensors
    file cut short, or one whose length field is damaged), which the caller says itself."""
    if len(start) > 8 and start[8:9] == b"{":
        return None
    text = _text_start(start)
    if text is not None:
        return (
            f"this is a text file, not a safetensors file (it begins '{text}'), so it holds "
            "no model."
        )
    return (
        "this is not a safetensors file (its first bytes are not the length of a header "
        "followed by the header), so it holds no model."
    )


def _text_start(start: bytes) -> str | None:
    """The first line of `start` as the user may read it, when the bytes are text (UTF-8,
    printable, line breaks and tabs allowed); None for other bytes."""
    try:
        text = start.decode("utf-8")
    except UnicodeDecodeError as error:
        if error.start < len(start) - 3:  # not merely a character cut at the end
            return None
        text = start[: error.start].decode("utf-8")
    if not text or not all(c.isprintable() or c in "\t\r\n" for c in text):
        return None
    line = " ".join(text.strip().split("\n", 1)[0].split())
    if not line:
        return None
    return line if len(line) <= _QUOTED_CHARS else line[: _QUOTED_CHARS - 1].rstrip() + "…"


def _looks_like_pickle(head: bytes) -> bool:
    # Pickle protocol 2+ opens with PROTO (0x80) and the version; torch's legacy format too.
    return len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5
