"""GGUF files (ComfyUI-GGUF's and llama.cpp's: Q8_0, Q4_K, ... blocks, each with its own scale),
read as the values they mean and kept as stored, as `quantized` keeps fp8, int8 and NVFP4.

The header is walked here with every count, size and offset bounded (`check_gguf_header`)
before the `gguf` package's reader maps the file: a hostile header gets one sentence, never an
allocation or a loop of the size it names. numpy and gguf are imported inside functions; torch
too.
"""

from __future__ import annotations

import functools
import math
import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.core.errors import BadFileError
from app.core.limits import (
    MAX_GGUF_ALIGNMENT,
    MAX_GGUF_ARRAY_ITEMS,
    MAX_GGUF_ARRAY_STRINGS,
    MAX_GGUF_KEYS,
    MAX_GGUF_STRING,
    MAX_GGUF_TENSORS,
    MAX_TENSOR_RANK,
    MAX_TEXT_LAYERS,
    check_tensor_shape,
    open_regular,
)

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)
_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_INTEGER_FORMS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 10: "<Q", 11: "<q"}
# ComfyUI-GGUF stores some tensors flattened for quantisation and records the true shape here.
ORIGINAL_SHAPE_KEY = "comfy.gguf.orig_shape."
_STRING, _ARRAY = 8, 9
_UINT32 = 4


def is_gguf_file(path: str | os.PathLike[str]) -> bool:
    try:
        with open_regular(path) as handle:
            return handle.read(4) == GGUF_MAGIC
    except OSError:
        return False


@dataclass(frozen=True)
class GgufTensorInfo:
    name: str
    type_name: str  # "Q8_0", "F16", ...
    # Torch order (the file stores the reverse); where ComfyUI-GGUF flattened a tensor, the
    # original shape it recorded (`ORIGINAL_SHAPE_KEY`), holding the same elements.
    shape: tuple[int, ...]
    start: int  # absolute byte offset in the file
    nbytes: int


def check_gguf_header(path: Path) -> list[GgufTensorInfo]:
    """Walk a GGUF header with every count, length and offset checked against the file and the
    bounds above before it is used, and return its tensors. Raises BadFileError with one
    sentence for the first problem. Reads through a map of the file: nothing is allocated from a
    size the file names."""
    try:
        with open_regular(path) as handle:
            size = os.fstat(handle.fileno()).st_size
            if size < 24:
                raise BadFileError(
                    path, f"the file is only {size} bytes long, too short to be a GGUF file."
                )
            data = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as error:
        raise BadFileError(path, f"the file cannot be read ({error.strerror or error}).") from None
    try:
        return _GgufWalker(path, data).walk()
    finally:
        data.close()


class _GgufWalker:
    def __init__(self, path: Path, data: mmap.mmap) -> None:
        self.path = path
        self.data = data
        self.size = len(data)
        self.offset = 0
        self.items = 0
        self.strings = 0
        self.alignment = 32
        self.original_shapes: dict[str, tuple[int, ...]] = {}

    def fail(self, problem: str) -> BadFileError:
        return BadFileError(self.path, problem)

    def take(self, count: int, what: str) -> int:
        if count > self.size - self.offset:
            raise self.fail(
                f"its header says {what} takes {count} bytes at byte {self.offset}, past the "
                f"end of the {self.size}-byte file: it is truncated or damaged."
            )
        start = self.offset
        self.offset += count
        return start

    def unpack(self, form: str, what: str) -> Any:
        start = self.take(struct.calcsize(form), what)
        return struct.unpack_from(form, self.data, start)[0]

    def string(self, what: str) -> str:
        length = self.unpack("<Q", what)
        if length > MAX_GGUF_STRING:
            raise self.fail(
                f"its header gives {what} a length of {length:,} bytes, more than any real "
                "GGUF file uses, so it is damaged or hostile."
            )
        start = self.take(length, what)
        try:
            return bytes(self.data[start : start + length]).decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"its header holds {what} that is not UTF-8 text.") from None

    def walk(self) -> list[GgufTensorInfo]:
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

        if bytes(self.data[:4]) != GGUF_MAGIC:
            raise self.fail("this is not a GGUF file (it does not start with 'GGUF').")
        self.offset = 4
        version = self.unpack("<I", "the version")
        if version not in GGUF_VERSIONS:
            raise self.fail(
                f"it is GGUF version {version}; HalfSafe reads versions 2 and 3 (big-endian "
                "and older files are not read)."
            )
        tensors = self.unpack("<Q", "the tensor count")
        keys = self.unpack("<Q", "the metadata count")
        for count, limit, what in (
            (tensors, MAX_GGUF_TENSORS, "tensors"),
            (keys, MAX_GGUF_KEYS, "metadata entries"),
        ):
            if count > limit:
                raise self.fail(
                    f"its header claims {count:,} {what}, more than the {limit:,} any real "
                    "GGUF file has, so it is damaged or hostile."
                )
        for _ in range(keys):
            key = self.string("a metadata key")
            kind = self.unpack("<I", f"the type of '{key}'")
            if key == "general.alignment":
                if kind != _UINT32:
                    raise self.fail("its general.alignment is not a 32-bit whole number.")
                alignment = self.unpack("<I", "general.alignment")
                if alignment == 0 or alignment & (alignment - 1) or alignment > MAX_GGUF_ALIGNMENT:
                    raise self.fail(f"its general.alignment of {alignment} is not a power of two.")
                self.alignment = alignment
            elif key.startswith(ORIGINAL_SHAPE_KEY) and kind == _ARRAY:
                self.original_shapes[key.removeprefix(ORIGINAL_SHAPE_KEY)] = self.shape(key)
            else:
                self.value(kind, key)
        infos: list[tuple[str, str, tuple[int, ...], int, int]] = []
        names: set[str] = set()
        for _ in range(tensors):
            name = self.string("a tensor name")
            if name in names:
                raise self.fail(f"its header names tensor '{name}' twice.")
            names.add(name)
            rank = self.unpack("<I", f"the rank of '{name}'")
            if rank > MAX_TENSOR_RANK:
                raise self.fail(
                    f"tensor '{name}' has {rank} dimensions, more than the {MAX_TENSOR_RANK} "
                    "any real weight has."
                )
            dims = [self.unpack("<Q", f"the shape of '{name}'") for _ in range(rank)]
            shape = tuple(reversed(dims))
            too_big = check_tensor_shape(shape)
            if too_big is not None:
                raise self.fail(f"tensor '{name}' {too_big}, so the file is damaged or hostile.")
            code = self.unpack("<I", f"the type of '{name}'")
            try:
                kind = GGMLQuantizationType(code)
                block, block_bytes = GGML_QUANT_SIZES[kind]
            except (ValueError, KeyError):
                raise self.fail(f"tensor '{name}' has an unknown GGUF type {code}.") from None
            row = dims[0] if dims else 1
            if row % block:
                raise self.fail(
                    f"tensor '{name}' is {kind.name} in blocks of {block}, but its rows hold "
                    f"{row} values, so the file is damaged."
                )
            offset = self.unpack("<Q", f"the offset of '{name}'")
            nbytes = math.prod(dims) // block * block_bytes
            infos.append((name, kind.name, shape, offset, nbytes))
        start = -(-self.offset // self.alignment) * self.alignment
        found = []
        end = 0
        for name, type_name, shape, offset, nbytes in sorted(infos, key=lambda i: i[3]):
            if offset % self.alignment:
                raise self.fail(
                    f"tensor '{name}' starts at offset {offset}, not a multiple of the file's "
                    f"alignment ({self.alignment}), so the file is damaged."
                )
            if offset < end:
                raise self.fail(f"tensor '{name}' overlaps the tensor before it.")
            end = offset + nbytes
            if start + end > self.size:
                raise self.fail(
                    f"tensor '{name}' ends at byte {start + end} but the file has only "
                    f"{self.size}: the file is truncated."
                )
            recorded = self.original_shapes.get(name, shape)
            if any(d < 0 for d in recorded):
                raise self.fail(
                    f"its recorded original shape of '{name}' is {list(recorded)}, with a "
                    "negative dimension, so the file is damaged or hostile."
                )
            if math.prod(recorded) != math.prod(shape) or check_tensor_shape(recorded):
                raise self.fail(
                    f"its recorded original shape of '{name}' does not hold the tensor's elements."
                )
            found.append(GgufTensorInfo(name, type_name, recorded, start + offset, nbytes))
        if not found:
            raise self.fail("the file holds no tensors, so it holds no model.")
        return found

    def shape(self, key: str) -> tuple[int, ...]:
        """A recorded original shape: a short array of whole numbers."""
        item = self.unpack("<I", f"the array type of '{key}'")
        count = self.unpack("<Q", f"the array length of '{key}'")
        if item not in _INTEGER_FORMS or not 1 <= count <= MAX_TENSOR_RANK:
            raise self.fail(f"its metadata '{key}' is not a shape (a few whole numbers).")
        return tuple(self.unpack(_INTEGER_FORMS[item], f"'{key}'") for _ in range(count))

    def skip_strings(self, count: int, key: str) -> None:
        """Step over `count` strings of an array (never read, so not decoded), each length
        checked against the file before it is used."""
        data, size, offset = self.data, self.size, self.offset
        for _ in range(count):
            if offset + 8 > size:
                break
            length = struct.unpack_from("<Q", data, offset)[0]
            if length > MAX_GGUF_STRING or offset + 8 + length > size:
                break
            offset += 8 + length
        else:
            self.offset = offset
            return
        self.offset = offset
        self.string(f"an item of '{key}'")  # raises the sentence for this one

    def value(self, kind: int, key: str) -> None:
        if kind in _SCALAR_SIZES:
            self.take(_SCALAR_SIZES[kind], f"the value of '{key}'")
        elif kind == _STRING:
            self.string(f"the value of '{key}'")
        elif kind == _ARRAY:
            item = self.unpack("<I", f"the array type of '{key}'")
            count = self.unpack("<Q", f"the array length of '{key}'")
            self.items += count
            if self.items > MAX_GGUF_ARRAY_ITEMS:
                raise self.fail(
                    f"its metadata '{key}' makes {self.items:,} array items in all, more "
                    "than any real GGUF file holds, so it is damaged or hostile."
                )
            if item in _SCALAR_SIZES:
                self.take(count * _SCALAR_SIZES[item], f"the array '{key}'")
            elif item == _STRING:
                self.strings += count
                if self.strings > MAX_GGUF_ARRAY_STRINGS:
                    raise self.fail(
                        f"its metadata '{key}' makes {self.strings:,} strings in arrays, more "
                        f"than the {MAX_GGUF_ARRAY_STRINGS:,} of any real GGUF file, so it is "
                        "damaged or hostile."
                    )
                self.skip_strings(count, key)
            else:
                raise self.fail(
                    f"its metadata '{key}' is an array of type {item}, not one GGUF has."
                )
        else:
            raise self.fail(f"its metadata '{key}' has an unknown type {kind}.")


@dataclass
class GgufHeader:
    """A bounds-checked GGUF header, in the shape of a safetensors header's accessors (what the
    library and companion search read): shapes, dtype codes, no metadata."""

    path: Path
    file_size: int
    tensors: list[GgufTensorInfo]
    metadata: dict[str, str] = field(default_factory=dict)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {t.name: t.shape for t in self.tensors}

    def dtypes(self) -> dict[str, str]:
        return {t.name: gguf_dtype_code(t.type_name) for t in self.tensors}


def read_gguf_header(path: str | os.PathLike[str]) -> GgufHeader:
    """A GGUF file's tensors from its header alone (see `check_gguf_header`), a T5 encoder's
    under transformers' names (see `transformers_names`)."""
    path = Path(path)
    tensors = check_gguf_header(path)
    names = _transformers_names(path, [t.name for t in tensors])
    tensors = [
        GgufTensorInfo(names.get(t.name, t.name), t.type_name, t.shape, t.start, t.nbytes)
        for t in tensors
    ]
    return GgufHeader(path, os.stat(path).st_size, tensors)


_T5_PARTS = (
    "layer.0.SelfAttention.q",
    "layer.0.SelfAttention.k",
    "layer.0.SelfAttention.v",
    "layer.0.SelfAttention.o",
    "layer.0.SelfAttention.relative_attention_bias",
    "layer.0.layer_norm",
    "layer.1.DenseReluDense.wi",
    "layer.1.DenseReluDense.wi_0",
    "layer.1.DenseReluDense.wi_1",
    "layer.1.DenseReluDense.wo",
    "layer.1.layer_norm",
)


def transformers_names(names: list[str]) -> dict[str, str]:
    """GGUF name -> transformers name for a T5 encoder in llama.cpp's naming (city96's T5 GGUF
    files: `token_embd`, `enc.blk.N.attn_q`, ...), so its tensors read as a T5 safetensors
    file's do; {} for any other file. The table is the gguf package's own (`TensorNameMap`).
    Raises ValueError for more blocks than any real text encoder has: the table grows with
    them (5 s and 150 MB to read a 1 MB header naming 20,000 blocks)."""
    if "token_embd.weight" not in names or "enc.blk.0.attn_q.weight" not in names:
        return {}
    from gguf import MODEL_ARCH, get_tensor_name_map

    blocks = {n.split(".")[2] for n in names if n.startswith("enc.blk.")}
    count = len(blocks)
    if count > MAX_TEXT_LAYERS:
        raise ValueError(
            f"it names {count:,} T5 encoder blocks (enc.blk.N), more than the "
            f"{MAX_TEXT_LAYERS} any real text encoder has"
        )
    table = get_tensor_name_map(MODEL_ARCH.T5ENCODER, count)
    ours = ["shared", "encoder.final_layer_norm"]
    ours += [f"encoder.block.{i}.{part}" for i in range(count) for part in _T5_PARTS]
    present = set(names)
    mapping: dict[str, str] = {}
    for name in ours:
        theirs = table.get_name(name)
        if theirs is not None and theirs + ".weight" in present:
            mapping[theirs + ".weight"] = name + ".weight"
    return mapping


def _transformers_names(path: Path, names: list[str]) -> dict[str, str]:
    """`transformers_names`, its refusal a sentence naming the file."""
    try:
        return transformers_names(names)
    except ValueError as error:
        raise BadFileError(path, f"{error}.") from None


GGUF_DTYPE_PREFIX = "GGUF_"


def gguf_dtype_code(type_name: str) -> str:
    """A GGUF tensor type as a dtype code: the float and integer types under their safetensors
    names, the block-quantised ones as GGUF_<type> (GGUF_Q8_0)."""
    plain = {"F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64"}
    return type_name if type_name in plain else GGUF_DTYPE_PREFIX + type_name


# Types read as stored: numpy's own, no blocks, no dequantisation.
_PLAIN_GGUF_TYPES = {
    "F32": "float32",
    "F16": "float16",
    "F64": "float64",
    "I8": "int8",
    "I16": "int16",
    "I32": "int32",
    "I64": "int64",
}


class GgufTensors:
    """A GGUF file's tensors, dequantised one at a time on request.

    Tensors are read at the offsets and sizes the bounds-checked header walk found
    (`check_gguf_header`); the gguf package decodes their blocks (`gguf.quants.dequantize`,
    which knows every type used for diffusion models, the IQ types included). Its GGUFReader is
    not used: it parses all metadata eagerly into numpy objects, tens of seconds and gigabytes
    for an array of millions of strings that no weight needs. A type the gguf package cannot
    decode refuses the file at once, before any tensor is read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        infos = check_gguf_header(path)
        for info in infos:
            if info.type_name not in _PLAIN_GGUF_TYPES and not _decodable(info.type_name):
                raise BadFileError(
                    path,
                    f"tensor '{info.name}' is {info.type_name}, which the gguf package cannot "
                    "decode, so HalfSafe cannot read the file.",
                )
        try:
            with open_regular(path) as handle:
                self.file_size = os.fstat(handle.fileno()).st_size
                # Private (copy-on-write): tensors are views of it, pages shared with the OS
                # cache and held once; writing to one never touches the file.
                self._map = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
        except OSError as error:
            raise BadFileError(
                path, f"the file cannot be read ({error.strerror or error})."
            ) from None
        if len(self._map) != self.file_size:
            raise BadFileError(path, "the file changed while it was read; read it again.")
        # A T5 encoder's tensors under transformers' names, as `read_gguf_header` gives them.
        names = _transformers_names(path, [i.name for i in infos])
        self.infos = {
            names.get(i.name, i.name): GgufTensorInfo(
                names.get(i.name, i.name), i.type_name, i.shape, i.start, i.nbytes
            )
            for i in infos
        }
        self.shapes = {n: i.shape for n, i in self.infos.items()}
        self.types = {n: i.type_name for n, i in self.infos.items()}

    @property
    def quantized_types(self) -> list[str]:
        return sorted(set(self.types.values()))

    def keys(self) -> list[str]:
        return [n for n, _ in sorted(self.infos.items(), key=lambda item: item[1].start)]

    def raw(self, name: str):
        """One tensor's bytes as the file stores them: a zero-copy uint8 view of the file's
        private map (a copy held them twice, beside the map's pages, while a model loaded)."""
        import numpy as np
        import torch

        info = self.infos[name]
        raw = np.frombuffer(self._map, dtype=np.uint8, count=info.nbytes, offset=info.start)
        return torch.from_numpy(raw)

    def get(self, name: str):
        """One tensor: F32, F16, F64 and integer types as stored (a view of the file's map),
        block-quantised types and BF16 dequantised by the gguf package to float32 and held as
        COMPUTE_DTYPE."""
        import numpy as np
        import torch
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
        from gguf.quants import dequantize

        info = self.infos[name]
        raw = np.frombuffer(self._map, dtype=np.uint8, count=info.nbytes, offset=info.start)
        plain = _PLAIN_GGUF_TYPES.get(info.type_name)
        if plain is not None:
            values = raw.view(plain) if info.start % np.dtype(plain).itemsize == 0 else None
            if values is None:  # not aligned to its elements: kernels may assume it, so copy
                values = raw.copy().view(plain)
            return torch.from_numpy(values).reshape(info.shape)
        kind = GGMLQuantizationType[info.type_name]
        block_bytes = GGML_QUANT_SIZES[kind][1]
        values = dequantize(raw.reshape(-1, block_bytes), kind)
        return torch.from_numpy(values).reshape(info.shape).to(torch.bfloat16)


@functools.cache
def _decodable(type_name: str) -> bool:
    """Whether the installed gguf package can dequantise this block type (it raises
    NotImplementedError for those it cannot: Q8_1, Q8_K, ... in gguf 0.19), tried on one block
    of zeros."""
    import numpy as np
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    kind = GGMLQuantizationType[type_name]
    try:
        dequantize(np.zeros((1, GGML_QUANT_SIZES[kind][1]), dtype=np.uint8), kind)
    except NotImplementedError:
        return False
    return True
