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

GGUF files are read in `gguf`, with the header walked within bounds first. numpy is imported
inside functions; torch too.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.core.errors import BadFileError
from app.core.formats.weight_findings import QuantFinding, StoredQuantization

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
# A file whose int8 layers (some or all) are stored rotated: `Quantization.format`; and the
# stored type its rotated layers are listed as (`Quantization.types`).
INT8_CONVROT_FORMAT = "int8_convrot"
INT8_CONVROT_TYPE = "INT8_CONVROT"
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
# A smoothing factor NVFP4-AWQ exports (NVIDIA ModelOpt's, and ComfyUI's encoders made from
# them) multiply into a layer's input, one per input channel: x * s @ W.T. HalfSafe folds it
# into the weight's columns when it decodes (`stored.decode_nvfp4`): the same product,
# x @ (W * s).T, with one rounding to bf16 of W * s where the tool rounds x * s in its compute
# dtype. Beside any other weight, it is refused.
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


def summary(files: list[Quantization]) -> StoredQuantization | None:
    """How the quantised files the model was read from store it, or None when none was."""
    if not files:
        return None
    formats = sorted({f.format for f in files})
    types = sorted({t for f in files for t in f.types})
    return StoredQuantization(
        format=formats[0] if len(formats) == 1 else "mixed",
        types=tuple(types),
        files=tuple(f.file for f in files),
        dequantized_to=COMPUTE_DTYPE,
        dequantized_on_load=tuple(t for t in types if _read_dequantized(t)),
    )


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
        type_name in SCALED_CODES
        or type_name == INT8_CONVROT_TYPE
        or type_name in _PLAIN_TYPES
        or type_name in TORCH_DECODED_GGUF
    )


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
    # NVFP4 weight -> its input smoothing factor (AWQ's `pre_quant_scale`, one per column)
    pre_scale_of: dict[str, str] = field(default_factory=dict)

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
    pre_scale_of = _pre_scales(path, dtypes, shapes)
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
    hidden |= set(pre_scale_of.values())
    if marker:
        hidden.add(SCALED_FP8_MARKER)
    return ScaledLayout(stored, scale_of, tensor_scale_of, config_of, hidden, pre_scale_of)


def _pre_scales(path, dtypes, shapes) -> dict[str, str]:
    """Each NVFP4 weight's input smoothing factor (`pre_quant_scale`: one float per column);
    BadFileError for one beside another weight, or of another shape."""
    found: dict[str, str] = {}
    for name in sorted(n for n in dtypes if n.endswith(PRE_QUANT_SCALE_SUFFIX)):
        weight = name.removesuffix(PRE_QUANT_SCALE_SUFFIX) + "weight"
        if dtypes.get(weight) != NVFP4_CODE:
            held = f"is stored as {dtypes[weight]}" if weight in dtypes else "does not exist"
            raise BadFileError(
                path,
                f"tensor '{name}' multiplies its layer's input before the quantized weight (a "
                f"smoothing factor), which HalfSafe applies only to an NVFP4 weight ('{weight}' "
                f"{held}), so the layer would compute other values than the file means.",
            )
        columns = shapes[weight][1]
        if tuple(shapes[name]) != (columns,) or dtypes[name] not in ("F16", "BF16", "F32"):
            raise BadFileError(
                path,
                f"the smoothing factor '{name}' of '{weight}' has shape {list(shapes[name])} "
                f"and dtype {dtypes[name]}, where one number per input column ({columns}) "
                "belongs.",
            )
        found[weight] = name
    return found


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


@dataclass(frozen=True)
class Rotation:
    """An int8 layer stored rotated (ConvRot, as its ComfyUI config says): its group size, or
    why the rotation cannot be undone (`problem`, completing "tensor X ...")."""

    group: int
    problem: str | None = None


def layer_format(path: Path, config: str, raw: bytes, code: str) -> Rotation | None:
    """Check a ComfyUI layer config (`comfy_quant`: the layer's format as JSON bytes) against the
    weight's code: a format HalfSafe decodes, the one its weight is stored in. Returns the
    layer's rotation where the config names one (int8 ConvRot: `convrot` and its
    `convrot_groupsize`, at the top or under `params`, as ComfyUI reads them; 256 where no
    size is given), else None. Raises BadFileError with one sentence for a config that cannot
    be read, or a rotation on a format that has none."""
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
    params = params if isinstance(params, dict) else {}
    rotated = document.get("convrot", params.get("convrot", False))
    group = document.get("convrot_groupsize", params.get("convrot_groupsize", CONVROT_GROUP))
    if rotated is False or rotated is None:  # as ComfyUI reads it: not rotated
        return None
    if code != INT8_CODE:
        raise refuse(
            f"says its {fmt} weight is stored rotated (ConvRot), which only int8 layers are, "
            "so the weight would be read as other values than the layer's."
        )
    return Rotation(group if _whole(group) else 0, rotation_problem(rotated, group))


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# ConvRot's default group (comfy-kitchen's and ComfyUI's), and the largest HalfSafe builds a
# rotation for: released files use 256, and a group of 4096 is already a 64 MiB matrix.
CONVROT_GROUP = 256
CONVROT_GROUP_MAX = 4096


def rotation_problem(rotated: object, group: object) -> str | None:
    """Why a ConvRot config's rotation cannot be undone, or None: `convrot` is not true (a
    value HalfSafe cannot tell a rotation from), or the group is not a power of 4 (the only
    sizes a regular Hadamard matrix of ConvRot's block has) within reason."""
    if rotated is not True:
        return (
            f"names its rotation as {json_words(rotated)}, not true or false, so whether its "
            "weight is stored rotated is unknown"
        )
    if not _power_of_4(group):
        return (
            f"names the rotation group size {json_words(group)}, where ConvRot's rotation "
            f"needs a power of 4 from 4 to {CONVROT_GROUP_MAX:,} (its files use 256), so its "
            "weight cannot be turned back"
        )
    return None


def _power_of_4(value: object) -> bool:
    if not isinstance(value, int) or isinstance(value, bool):
        return False
    in_range = 4 <= value <= CONVROT_GROUP_MAX
    return in_range and value & (value - 1) == 0 and (value.bit_length() - 1) % 2 == 0


def group_problem(group: int, shape: tuple[int, ...]) -> str | None:
    """Why a rotation of `group` inputs cannot apply to a weight of `shape`, or None."""
    if len(shape) != 2 or shape[1] % group:
        width = f"{shape[1]} inputs per row" if len(shape) == 2 else f"the shape {list(shape)}"
        return (
            f"has {width}, not a whole number of its rotation groups of {group}, so its "
            "weight cannot be turned back"
        )
    return None


def json_words(value: object) -> str:
    import json

    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


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


def nvfp4_holds_values(packed) -> bool:
    """Whether NVFP4 codes (uint8, two E2M1 values per byte) hold any value but +-0."""
    return bool((packed & 0x77).any())  # each nibble's magnitude bits


# GGUF block types whose zero code is plain to see, by name: (block bytes, bytes of scale at
# the block's start, the code that means 0). Q8_0: an fp16 scale and 32 int8 values (0 is 0);
# Q4_0: an fp16 scale and 32 nibbles, each value (nibble - 8) times the scale. Types with a
# minimum or sub-block scales are left to the value checks.
_GGUF_ZERO_CODES: dict[str, tuple[int, int, int]] = {"Q8_0": (34, 2, 0), "Q4_0": (18, 2, 8)}


def gguf_holds_values(raw, type_name: str) -> bool:
    """Whether a GGUF tensor's blocks (`raw`: uint8, all its bytes) hold any code but the zero
    code, for the types `_GGUF_ZERO_CODES` reads; False for others (nothing is claimed)."""
    if type_name not in _GGUF_ZERO_CODES:
        return False
    size, head, zero = _GGUF_ZERO_CODES[type_name]
    codes = raw.reshape(-1, size)[:, head:]
    if type_name == "Q4_0":
        return bool(((codes & 0x0F) != zero).any() or ((codes >> 4) != zero).any())
    return bool((codes != zero).any())


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


def implausible(tensor, holds_values: bool = False) -> str | None:
    """Why a dequantised weight cannot be a real model's, or None (NaN and Inf are left to the
    weight scan, which names them as non-finite). `holds_values`: its stored codes are not all
    zero codes, so a weight that decodes to 0 everywhere lost them to scales of 0 (a converter
    writes an all-zero weight as zero codes)."""
    import torch

    if tensor.numel() == 0 or not tensor.is_floating_point():
        return None
    low, high = torch.aminmax(tensor)  # one pass, no temporary (abs() would copy)
    if holds_values and float(low) == 0.0 == float(high):
        return (
            "decodes to 0 everywhere although its stored values are not 0: its block scales "
            "are 0, so the layer is lost"
        )
    peak = max(-float(low), float(high))
    if math.isfinite(peak) and peak > PLAUSIBLE_WEIGHT_MAX:
        return (
            f"decodes to values as large as {peak:.3g}, far beyond any real weight "
            f"(real models stay well under {PLAUSIBLE_WEIGHT_MAX:g}): its quantisation or "
            "scale is wrong"
        )
    return None


# GGUF --------------------------------------------------------------------------------------
