"""Quantized checkpoints: fp8 safetensors (plain and scaled), int8 and NVFP4 safetensors and GGUF
files, read as the values they mean and kept as stored.

Many large models reach users stored in 8 bits or fewer per weight: fp8 safetensors
(`float8_e4m3fn` or `float8_e5m2`, often "scaled": a per-tensor or per-channel scale tensor beside
each weight, `<layer>.weight_scale`, in ComfyUI's current files with `<layer>.comfy_quant`, the
layer's format as JSON bytes; or ComfyUI's older `<layer>.scale_weight` with a `scaled_fp8`
marker tensor), int8 weights with such a scale (ComfyUI's `int8_tensorwise`), NVFP4 (E2M1
values two per byte, an fp8 scale per block of 16 and a tensor scale: ComfyUI's files and
NVIDIA ModelOpt's, which BFL publishes, pack them differently; see `ScaledLayout.tiled`) and GGUF
files (Q8_0, Q4_K, ... blocks, each block with its own scale). HalfSafe
runs no fp8 or block-quantised kernels: every such weight stands for its values in
`COMPUTE_DTYPE`, and `Checkpoint.get` (the one place, so every loader gets it) hands it out kept
as stored (`checkpoint.stored.StoredTensor`), decoded by each operation that reads it. That costs
memory as the file, not as the bf16 model. GGUF block types torch does not decode are
dequantised when read.

A loader bug with these files (a scale dropped or applied twice, a block decoded wrongly) makes
black or noise images that look like fp16 overflow, so the reading path checks what it decodes:
scales that are NaN, Inf, zero, negative or absurd and weights whose dequantised values are far
beyond any real model's become `QuantFinding`s (the health check's `broken_weights`; plain
records in `weight_findings`), and a scale that is missing altogether refuses the file (see
`scaled_layout`).

GGUF headers are walked here with every count, size and offset bounded (`check_gguf_header`)
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
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.core.errors import BadFileError
from app.core.formats.weight_findings import QuantFinding
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

# What fp8 and GGUF weights become when read: bf16 has fp32's range, so no scaled weight can
# overflow in the conversion, and 8 bits of mantissa hold every fp8 value and Q8_0's 8-bit
# steps (times an fp16 block scale) within 2^-9 of their value.
COMPUTE_DTYPE = "bf16"

FP8_DTYPES = ("F8_E4M3", "F8_E5M2")
# Block-scaled formats (MX scales, 4- and 6-bit floats) that no diffusion loader HalfSafe
# knows stores in safetensors yet; refused with a sentence instead of half-read.
UNSUPPORTED_SAFETENSORS = ("F8_E8M0", "F4", "F6_E2M3", "F6_E3M2")

# The dtype codes of weights whose stored type alone does not say what they mean (see
# `model_view`): NVFP4, a uint8 tensor of two E2M1 values per byte with fp8 block scales (one
# per 16 values of a row, `<layer>.weight_scale`) and an fp32 tensor scale
# (`<layer>.weight_scale_2`), shown at the shape of its values; and int8 values with a scale.
NVFP4_CODE = "NVFP4"
INT8_CODE = "INT8"
SCALED_CODES = (*FP8_DTYPES, INT8_CODE, NVFP4_CODE)
NVFP4_BLOCK = 16
# NVFP4 block scales in ComfyUI's files are in cuBLAS's tiled layout: 128 rows by 4 block
# columns per tile, the matrix padded to whole tiles.
NVFP4_TILE = (128, 4)

# Weight scales, by the suffix that replaces a weight's final "weight": `weight_scale`
# (compressed-tensors, ModelOpt and most fp8 exports; NVFP4's block scales), `scale_weight`
# (ComfyUI's scaled fp8).
SCALE_SUFFIXES = ("weight_scale", "scale_weight")
SECOND_SCALE_SUFFIX = "weight_scale_2"  # NVFP4's tensor scale
# Activation scales, used only by fp8 and fp4 matrix kernels; decoded weights do not need them.
INPUT_SCALE_SUFFIXES = ("input_scale", "scale_input")
# A smoothing factor some NVFP4 exports multiply into a layer's input (AWQ-style): the layer
# computes differently from its weight alone, so such a file is refused.
PRE_QUANT_SCALE_SUFFIX = "pre_quant_scale"
SCALED_FP8_MARKER = "scaled_fp8"
# ComfyUI's per-layer quantisation config, `<layer>.comfy_quant`: the layer's format as JSON
# bytes ({"format": "float8_e4m3fn"}), beside its `weight_scale` (its comfy/ops.py,
# MixedPrecisionOps). The weight's dtype and scale say all a reader needs: bookkeeping.
LAYER_CONFIG_SUFFIX = ".comfy_quant"

# A scale outside this range is absurd: a real fp8 scale is a layer's largest weight over 448
# (e4m3's largest value), and real weights' largest values lie between about 1e-3 and a few
# hundred, so real scales fall between about 1e-6 and 1.
SCALE_RANGE = (1e-10, 1e4)
# A judgment with a wide margin: the largest weights expected in SD, SDXL, Flux and SD3 files
# (norm gains, embeddings) are in the tens, and a weight this large would carry activations
# toward fp16's 65,504 in the first layer it meets. A dequantised weight past it is reported as
# wrongly decoded.
PLAUSIBLE_WEIGHT_MAX = 1e4


@dataclass
class Quantization:
    """How a file stores its weights in 8 bits or fewer: "fp8", "fp8_scaled" or "gguf", and
    the stored types found (F8_E4M3, Q8_0, ...)."""

    format: str
    types: list[str]
    file: str

    def to_json(self) -> dict[str, Any]:
        return {"format": self.format, "types": list(self.types), "file": self.file}


# Collecting what every file read during one load found -------------------------------------


@dataclass
class _Collected:
    findings: list[QuantFinding] = field(default_factory=list)
    files: list[Quantization] = field(default_factory=list)


_ACTIVE: ContextVar[_Collected | None] = ContextVar("halfsafe_quantized", default=None)


@contextmanager
def collecting() -> Iterator[_Collected]:
    """Gather the findings and quantised files of every checkpoint read inside the block (a
    model's own file and its companions), whichever loader reads them."""
    collected = _Collected()
    token = _ACTIVE.set(collected)
    try:
        yield collected
    finally:
        _ACTIVE.reset(token)


def report(finding: QuantFinding | None = None, quantization: Quantization | None = None) -> None:
    collected = _ACTIVE.get()
    if collected is None:
        return
    if finding is not None:
        collected.findings.append(finding)
    if quantization is not None and quantization not in collected.files:
        collected.files.append(quantization)


def summary(files: list[Quantization]) -> dict[str, Any] | None:
    """The `model.quantization` object of a report: the formats and types of every quantised
    file the model was read from, or None when none was."""
    if not files:
        return None
    formats = sorted({f.format for f in files})
    types = sorted({t for f in files for t in f.types})
    return {
        "format": formats[0] if len(formats) == 1 else "mixed",
        "types": types,
        "files": [f.file for f in files],
        "dequantized_to": COMPUTE_DTYPE,
        "dequantized_on_load": [t for t in types if _read_dequantized(t)],
    }


# GGUF block types that torch decodes (diffusers' ports of the gguf package's decoders): kept
# as stored and decoded per use (`checkpoint.stored`). The others the gguf package decodes are
# dequantised when read. A test holds this list to diffusers' own.
TORCH_DECODED_GGUF = frozenset(
    ("Q8_0", "Q5_1", "Q5_0", "Q4_1", "Q4_0", "Q6_K", "Q5_K", "Q4_K", "Q3_K", "Q2_K")
    + ("IQ4_NL", "IQ4_XS")
)
# Stored types read as ordinary tensors (nothing to keep or dequantise).
_PLAIN_TYPES = frozenset(("F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64"))


def _read_dequantized(type_name: str) -> bool:
    return not (
        type_name in SCALED_CODES or type_name in _PLAIN_TYPES or type_name in TORCH_DECODED_GGUF
    )


def held_words(quantization: Mapping[str, Any]) -> str:
    """How a quantized model's weights are held, in the words every view shows."""
    decoded = quantization.get("dequantized_on_load") or []
    words = (
        f"kept as stored, each layer reading its weights as {quantization['dequantized_to']} "
        "values as it computes"
    )
    if decoded:
        words += f" ({', '.join(decoded)} weights dequantised to {quantization['dequantized_to']} when loaded)"
    return words


# Scaled weights in safetensors: fp8, int8 and NVFP4 -------------------------------------------


def model_view(
    shapes: Mapping[str, tuple[int, ...]], dtypes: Mapping[str, str]
) -> tuple[dict[str, tuple[int, ...]], dict[str, str]]:
    """A safetensors header's shapes and dtype codes as the model sees them: a 2-D uint8 weight
    with an NVFP4 tensor scale beside it is NVFP4, at the shape of the values it packs (two per
    byte); an int8 weight with a scale beside it is INT8. Everything else as stored. Only
    names are read: `scaled_layout` checks that the rest of each layer holds together."""
    shapes, dtypes = dict(shapes), dict(dtypes)
    for name, code in dtypes.items():
        if not name.endswith("weight") or code not in ("U8", "I8"):
            continue
        base = name.removesuffix("weight")
        if code == "U8" and base + SECOND_SCALE_SUFFIX in dtypes and len(shapes[name]) == 2:
            rows, packed = shapes[name]
            shapes[name] = (rows, packed * 2)
            dtypes[name] = NVFP4_CODE
        elif code == "I8" and any(base + suffix in dtypes for suffix in SCALE_SUFFIXES):
            dtypes[name] = INT8_CODE
    return shapes, dtypes


# ComfyUI's per-layer formats (`<layer>.comfy_quant`) HalfSafe reads, and the code each needs.
COMFY_FORMATS = {
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
    "int8_tensorwise": INT8_CODE,
    "nvfp4": NVFP4_CODE,
}
MAX_LAYER_CONFIG_BYTES = 4096  # a real one is a few dozen


@dataclass
class ScaledLayout:
    """Which weights of a safetensors file are stored in 8 bits or fewer (fp8, int8, NVFP4),
    which scales belong to which, and which tensors exist only as their bookkeeping (hidden
    from loaders)."""

    stored: dict[str, str]  # weight -> its code (F8_E4M3, F8_E5M2, INT8, NVFP4)
    scale_of: dict[str, str]  # weight -> its scale (an NVFP4 weight's: its block scales)
    tensor_scale_of: dict[str, str]  # NVFP4 weight -> its tensor scale
    config_of: dict[str, str]  # weight -> its ComfyUI layer config (`comfy_quant`)
    hidden: set[str]  # scales, input scales, layer configs, the scaled_fp8 marker

    @property
    def format(self) -> str:
        codes = set(self.stored.values())
        if NVFP4_CODE in codes:
            return "nvfp4"
        if INT8_CODE in codes:
            return "int8_scaled"
        return "fp8_scaled" if self.scale_of else "fp8"

    def tiled(self, weight: str) -> bool:
        """Whether an NVFP4 weight is packed as ComfyUI packs it (the even value in each
        byte's high nibble, block scales in the tiled layout): a layer with a ComfyUI config
        is; ModelOpt's and BFL's files (the even value low, scales in row order) have none."""
        return weight in self.config_of


def scaled_layout(
    path: Path, dtypes: Mapping[str, str], shapes: Mapping[str, tuple[int, ...]]
) -> ScaledLayout | None:
    """The scaled-weight layout of a safetensors file (its `model_view`), or None when it holds
    no fp8, int8-with-scale or NVFP4 weight.

    Raises BadFileError for what cannot be read right: block-scaled dtypes HalfSafe does not
    decode, an input smoothing factor, a scale or a layer config without its weight (or a scale
    for a weight it cannot apply to), a scale of the wrong shape, and a missing scale. A
    missing scale refuses the file rather than being flagged: the weight's true values are
    unknown (it could be off by any factor), and a weight read without its scale can still give
    finite, plausible-looking output, so a check run on it could call a wrong model healthy. The
    file is scaled when any tensor has a scale, a layer config (`comfy_quant`) or the
    `scaled_fp8` marker is present; then every fp8 weight needs its scale.
    """
    for name, code in dtypes.items():
        if code in UNSUPPORTED_SAFETENSORS:
            raise BadFileError(
                path,
                f"tensor '{name}' is stored as {code}, a block-scaled format HalfSafe cannot "
                "read (it reads fp8, int8 and NVFP4 safetensors and GGUF files).",
            )
        if name.endswith(PRE_QUANT_SCALE_SUFFIX):
            raise BadFileError(
                path,
                f"tensor '{name}' multiplies its layer's input before the quantized weight (a "
                "smoothing factor), which HalfSafe does not apply, so the layer would compute "
                "other values than the file means.",
            )
    marker = SCALED_FP8_MARKER in dtypes
    scales = {n for n in dtypes if n.endswith(SCALE_SUFFIXES)}
    seconds = {n for n in dtypes if n.endswith(SECOND_SCALE_SUFFIX)}
    inputs = {n for n in dtypes if n.endswith(INPUT_SCALE_SUFFIXES)}
    configs = {n for n in dtypes if n.endswith(LAYER_CONFIG_SUFFIX)}
    bookkeeping = scales | seconds | inputs | configs | {SCALED_FP8_MARKER}
    stored = {n: c for n, c in dtypes.items() if c in SCALED_CODES and n not in bookkeeping}
    if not stored and not marker and not seconds:
        return None
    config_of: dict[str, str] = {}
    for config in sorted(configs):
        weight = config.removesuffix(LAYER_CONFIG_SUFFIX) + ".weight"
        if weight not in dtypes:
            raise BadFileError(
                path,
                f"the layer config '{config}' belongs to no weight (there is no '{weight}'), "
                "so the file is damaged or not what it claims.",
            )
        config_of[weight] = config
    scale_of: dict[str, str] = {}
    for scale in sorted(scales):
        suffix = next(s for s in SCALE_SUFFIXES if scale.endswith(s))
        weight = scale[: -len(suffix)] + "weight"
        if weight not in dtypes:
            raise BadFileError(
                path,
                f"the scale '{scale}' belongs to no weight (there is no '{weight}'), so the "
                "file is damaged or not what it claims.",
            )
        if weight not in stored:
            raise BadFileError(
                path,
                f"the scale '{scale}' belongs to '{weight}', which is stored as "
                f"{dtypes[weight]}, not fp8, int8 or NVFP4, so it is unclear whether it "
                "applies.",
            )
        if weight in scale_of:
            raise BadFileError(path, f"the weight '{weight}' has two scales.")
        scale_of[weight] = scale
    tensor_scale_of: dict[str, str] = {}
    for second in sorted(seconds):
        weight = second.removesuffix(SECOND_SCALE_SUFFIX) + "weight"
        if dtypes.get(weight) != NVFP4_CODE:
            held = f"is stored as {dtypes[weight]}" if weight in dtypes else "does not exist"
            raise BadFileError(
                path,
                f"the tensor scale '{second}' belongs to no NVFP4 weight ('{weight}' {held}), "
                "so the file is damaged or not what it claims.",
            )
        tensor_scale_of[weight] = second
    for name, code in stored.items():
        if name in scale_of:
            continue
        if code == NVFP4_CODE:
            raise BadFileError(
                path,
                f"the NVFP4 weight '{name}' has no block scales "
                f"('{name.removesuffix('weight')}weight_scale'), so its true values are unknown.",
            )
        if marker or scale_of or configs:
            raise BadFileError(
                path,
                f"the fp8 tensor '{name}' has no scale ({_scale_names(name)}) although "
                "the file's other fp8 weights are scaled, so its true values are unknown "
                "(the file is damaged or was converted incompletely).",
            )
    for weight, scale in scale_of.items():
        _check_scale_shape(path, weight, scale, stored[weight], dtypes, shapes, config_of)
    for weight, second in tensor_scale_of.items():
        if math.prod(shapes[second]) != 1 or dtypes[second] not in ("F16", "BF16", "F32"):
            raise BadFileError(
                path,
                f"the tensor scale '{second}' of '{weight}' has shape {list(shapes[second])} "
                f"and dtype {dtypes[second]}, where one fp32 number belongs.",
            )
    hidden = set(scale_of.values()) | set(tensor_scale_of.values()) | inputs | configs
    if marker:
        hidden.add(SCALED_FP8_MARKER)
    return ScaledLayout(stored, scale_of, tensor_scale_of, config_of, hidden)


def _check_scale_shape(path, weight, scale, code, dtypes, shapes, config_of) -> None:
    size = math.prod(shapes[scale])
    if size == 0:
        raise BadFileError(
            path,
            f"the scale '{scale}' of '{weight}' is empty (it holds no number), so the "
            "weight's true values are unknown.",
        )
    if code != NVFP4_CODE:
        rows = shapes[weight][0] if shapes[weight] else 1
        if size not in (1, rows) or dtypes[scale] not in ("F16", "BF16", "F32", "F64"):
            raise BadFileError(
                path,
                f"the scale '{scale}' of '{weight}' has shape {list(shapes[scale])} and dtype "
                f"{dtypes[scale]}, where one number (or one per output row of the weight) in "
                "fp16, bf16 or fp32 belongs.",
            )
        return
    rows, columns = shapes[weight]
    if columns % NVFP4_BLOCK:
        raise BadFileError(
            path,
            f"the NVFP4 weight '{weight}' holds {columns} values per row, not a whole number "
            f"of blocks of {NVFP4_BLOCK}, so its block scales cannot apply.",
        )
    blocks = columns // NVFP4_BLOCK
    expected = (rows, blocks)
    where = "one per 16 values of a row"
    if weight in config_of:
        tile_rows, tile_columns = NVFP4_TILE
        expected = (-(-rows // tile_rows) * tile_rows, -(-blocks // tile_columns) * tile_columns)
        where += ", in ComfyUI's tiled layout"
    if tuple(shapes[scale]) != expected or dtypes[scale] != "F8_E4M3":
        raise BadFileError(
            path,
            f"the block scales '{scale}' of the NVFP4 weight '{weight}' have shape "
            f"{list(shapes[scale])} and dtype {dtypes[scale]}, where fp8 e4m3 scales of "
            f"shape {list(expected)} belong ({where}).",
        )


def layer_format(path: Path, config: str, raw: bytes, code: str) -> None:
    """Check a ComfyUI layer config (`comfy_quant`: the layer's format as JSON bytes) against the
    weight's code: a format HalfSafe decodes, the one its weight is stored in, without a
    rotation (int8 "convrot" weights are stored multiplied by a Hadamard matrix). Raises
    BadFileError with one sentence otherwise."""
    import json

    def refuse(problem: str) -> BadFileError:
        return BadFileError(path, f"the layer config '{config}' {problem}")

    if len(raw) > MAX_LAYER_CONFIG_BYTES:
        raise refuse(
            f"is more than {MAX_LAYER_CONFIG_BYTES:,} bytes long, where a few dozen belong."
        )
    try:
        document = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise refuse("is not JSON text, so the file is damaged.") from None
    if not isinstance(document, dict) or not isinstance(document.get("format"), str):
        raise refuse("names no format, so how its weight is stored is unknown.")
    fmt = document["format"]
    if fmt not in COMFY_FORMATS:
        raise refuse(
            f"names the format '{fmt[:40]}', which HalfSafe cannot read (it reads "
            f"{', '.join(COMFY_FORMATS)})."
        )
    if COMFY_FORMATS[fmt] != code:
        raise refuse(f"names the format '{fmt}', but its weight is stored as {code}.")
    params = document.get("params")
    rotated = document.get("convrot") or (isinstance(params, dict) and params.get("convrot"))
    if rotated:
        raise refuse(
            "says its int8 weight is stored rotated (ConvRot), which HalfSafe does not undo, "
            "so the weight would be read as other values than the layer's."
        )


def _scale_names(name: str) -> str:
    base = name[: -len("weight")] if name.endswith("weight") else name + "."
    return " or ".join(f"'{base}{suffix}'" for suffix in SCALE_SUFFIXES)


def scale_problem(scale, stored=None) -> str | None:
    """Why a scale tensor (float32) cannot be a real one, or None.

    A zero (or vanishing) scale is harmless only where every stored value it multiplies is
    zero, as converters write an all-zero weight: that weight is 0 whatever its scale.
    `stored` is the fp8 or int8 tensor, to tell the two apart.
    """
    import torch

    if not bool(torch.isfinite(scale).all()):
        return "NaN" if bool(torch.isnan(scale).any()) else "Inf"
    low, high = float(scale.min()), float(scale.max())
    if low < 0:
        return f"negative ({low:.3g})"
    if high > SCALE_RANGE[1]:
        return f"{high:.3g}, outside {SCALE_RANGE[0]:g} to {SCALE_RANGE[1]:g} where real scales lie"
    small = scale.reshape(-1) < SCALE_RANGE[0]
    if not bool(small.any()):
        return None
    if stored is not None:
        if stored.dtype == torch.int8:
            magnitudes = stored.contiguous()
        else:
            magnitudes = stored.contiguous().view(torch.uint8) & 0x7F  # fp8: the sign cleared
        rows = magnitudes.reshape(small.numel(), -1)
        if not bool(rows[small].any()):
            return None
    if low == 0:
        return "0"
    return f"{low:.3g}, outside {SCALE_RANGE[0]:g} to {SCALE_RANGE[1]:g} where real scales lie"


def block_scale_problem(block_scales) -> str | None:
    """Why NVFP4 block scales (fp8 e4m3, whose range is what a block scale can be: a block of
    zeros has the scale 0) cannot be real ones, or None: NaN, or negative."""
    import torch

    codes = block_scales.contiguous().view(torch.uint8)
    if bool(((codes & 0x7F) == 0x7F).any()):  # e4m3fn's NaN, with either sign
        return "NaN (in a block scale)"
    negative = block_scales.to(torch.float32) < 0
    if bool(negative.any()):
        return f"negative ({float(block_scales.to(torch.float32).min()):.3g}, in a block scale)"
    return None


def dequantize_scaled(tensor, scale=None):
    """An fp8 or int8 tensor times its scale (one number, or one per output row), in
    COMPUTE_DTYPE, each value's product taken in fp32 and rounded once.

    Without a scale or with one per tensor, this is a lookup in a table of all 256 codes (fp8's
    NaN and Inf codes included) already scaled and rounded: the same values as converting
    element by element, several times faster on CPUs (docs/benchmarks.md).
    """
    import torch

    if scale is not None and scale.numel() > 1:
        values = tensor.to(torch.float32)
        values.mul_(scale.reshape(-1, *([1] * (values.dim() - 1))))
        return values.to(torch.bfloat16)
    table = torch.arange(256, dtype=torch.uint8).view(tensor.dtype).to(torch.float32)
    if scale is not None:
        table = table * scale.reshape(())
    codes = tensor.contiguous().view(torch.uint8).reshape(-1).to(torch.int32)
    return table.to(torch.bfloat16).index_select(0, codes).view(tensor.shape)


def implausible(tensor) -> str | None:
    """Why a dequantised weight cannot be a real model's, or None (NaN and Inf are left to the
    weight scan, which names them as non-finite)."""
    import torch

    if tensor.numel() == 0 or not tensor.is_floating_point():
        return None
    low, high = torch.aminmax(tensor)  # one pass, no temporary (abs() would copy)
    peak = max(-float(low), float(high))
    if math.isfinite(peak) and peak > PLAUSIBLE_WEIGHT_MAX:
        return (
            f"decodes to values as large as {peak:.3g}, far beyond any real weight "
            f"(real models stay well under {PLAUSIBLE_WEIGHT_MAX:g}): its quantisation or "
            "scale is wrong"
        )
    return None


# GGUF --------------------------------------------------------------------------------------

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
