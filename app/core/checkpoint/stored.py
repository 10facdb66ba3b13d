"""Weights kept as their file stores them (`StoredTensor`): fp8 and int8 bytes with their scale,
NVFP4's packed 4-bit values with their block and tensor scales, GGUF blocks, decoded only for
the length of the operation that reads them.

A quantized file is read as the model it means, not as the bytes it holds: every stored weight
stands for its values rounded to `COMPUTE_DTYPE` (bf16), as a weight dequantised on read would.
A `StoredTensor` is a tensor of that logical shape whose dtype is the dtype it computes in. The
file's bytes stay in memory (a GGUF tensor copied once, an fp8 tensor a view of the file's
map), and every torch operation that reads the values gets them decoded, as bf16 and then in
the tensor's dtype, for that operation alone: a `Linear` holds 0.56 bytes per weight for Q4_0
and 1 for fp8, and 2 only for the one layer computing at a time.

What precision a layer computes in is then a dtype, not a copy: `.to(torch.float32)` (an island,
the fp32 reference) and `.to("cuda")` give a `StoredTensor` over the same bytes (moved to that
device), so placing a component in any plan costs its stored bytes, never a wider copy. Row
slices and concatenations along the first dimension (how a layout's fused weights are split
into diffusers' layers) stay stored too. Anything that would change the values in place is
refused: they are the file's.

int8 ConvRot weights (rows stored rotated by a Hadamard matrix) are turned back for every
operation but one: a linear layer multiplies its input rotated as the tool rotates it by the
stored rows instead, the same product in exact arithmetic, so that an fp16 input whose rotation
overflows in the tool overflows here (`_linear`). Turning the weight back would compute the true
product where the tool fails. This holds in every grad mode (`ConvRotTensor`): `aten.linear` is
a composite op, which reaches `__torch_dispatch__` whole only under inference mode; wherever
autograd's dispatch keys are active (plain `no_grad` too: it only stops recording) autograd
splits it first into the weight's `.t()` (decoded) and a product of plain tensors.

torch is imported at the top: this module is loaded only by code that reads tensors.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.utils._pytree import tree_map_only

# What a stored weight's values mean: what they were dequantised to when read (see quantized).
MEANING_DTYPE = torch.bfloat16
FP8 = "fp8"
INT8 = "int8"
# NVFP4: two E2M1 (4-bit float) values per byte, one fp8 e4m3 scale per block of 16 values of
# a row and one fp32 scale for the tensor. The two packings differ in which nibble holds the
# even-indexed value: the low one (NVIDIA ModelOpt's layout, BFL's files) or the high one
# (ComfyUI's files, packed by comfy-kitchen).
NVFP4 = "nvfp4"
NVFP4_HIGH_FIRST = "nvfp4_high_first"
NVFP4_CODECS = (NVFP4, NVFP4_HIGH_FIRST)
NVFP4_BLOCK = 16
# The 16 E2M1 codes' values: bit 3 is the sign, bits 2-0 the magnitude (OCP MX spec, FP4 E2M1).
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
# int8 ConvRot (comfy-kitchen's int8 layers with `convrot`, arXiv 2512.03673): each row's
# values, in groups of `group` inputs, were multiplied by a normalised regular Hadamard matrix H
# (Kronecker powers of the 4x4 block below, over sqrt(group)) before they were quantised per
# row. H is symmetric and orthogonal, so it is its own inverse: W = (q * scale) @ H per group.
INT8_CONVROT = "int8_convrot"
_HADAMARD_BLOCK = ((1, 1, 1, -1), (1, 1, -1, 1), (1, -1, 1, 1), (-1, 1, 1, 1))
# Codecs whose bytes are one element each, times a scale (one number or one per row); a row
# slice of an int8 ConvRot weight is a slice of its rows too (its groups run along the rows).
_SCALED_BYTES = (FP8, INT8, INT8_CONVROT)


class StoredTensor(torch.Tensor):
    """A weight in its file's storage (`packed`, and its scales), computing in `dtype`.

    `codec` is "fp8" or "int8" (packed: the 8-bit tensor in the logical shape, `scale`: none,
    one fp32 number or one per row), "nvfp4" or "nvfp4_high_first" (packed: uint8, rows of
    two values per byte; `scale`: the fp8 block scales, one per 16 values of a row, in row
    order; `scale2`: the tensor's fp32 scale) or a GGUF block type such as "Q4_0" (packed:
    uint8, one row of bytes per index of the first dimension). An NVFP4 weight may have a
    `pre_scale` (fp32, one per column: AWQ's input smoothing factor, folded into its columns).
    "int8_convrot" is int8 with its scale whose rows were stored rotated in groups of `group`
    values (`INT8_CONVROT`)."""

    packed: torch.Tensor
    scale: torch.Tensor | None
    scale2: torch.Tensor | None
    codec: str
    pre_scale: torch.Tensor | None = None
    group: int  # int8 ConvRot's rotation group (0 for the other codecs)

    @staticmethod
    def __new__(
        cls, packed, codec: str, shape, dtype, scale=None, scale2=None, pre_scale=None, group=0
    ):
        # Never an inference tensor, wherever it is made: a placement inside inference mode
        # makes a Parameter of it, which detaches it, and torch sets a detached tensor's
        # version counter (refused for inference tensors). Its bytes may be one.
        kind = ConvRotTensor if codec == INT8_CONVROT else cls
        with torch.inference_mode(False):
            made = torch.Tensor._make_wrapper_subclass(
                kind, tuple(shape), dtype=dtype, device=packed.device, requires_grad=False
            )
        made.packed, made.codec, made.scale, made.scale2 = packed, codec, scale, scale2
        made.pre_scale = pre_scale
        made.group = group
        return made

    def __init__(
        self, packed, codec: str, shape, dtype, scale=None, scale2=None, pre_scale=None, group=0
    ) -> None:
        super().__init__()

    # Every operation goes straight to __torch_dispatch__ (no Python overhead per call above it).
    __torch_function__ = torch._C._disabled_torch_function_impl  # pyright: ignore[reportAssignmentType]

    def __repr__(self, *, tensor_contents=None) -> str:  # never decodes: a repr stays cheap
        return (
            f"StoredTensor({self.codec}, shape={list(self.shape)}, computes in "
            f"{str(self.dtype).removeprefix('torch.')}, {stored_bytes(self):,} bytes)"
        )

    def decoded(self, dtype=None) -> torch.Tensor:
        """The values as a plain tensor in `dtype` (default: the tensor's own), on its device."""
        if self.codec == INT8_CONVROT:
            values = unrotate(scaled_rows(self.packed, self.scale), self.group)
        else:
            values = _decode(
                self.packed, self.codec, self.scale, self.scale2, tuple(self.shape), self.pre_scale
            )
        return values.to(dtype or self.dtype)

    def _like(
        self, packed=None, scale=None, shape=None, dtype=None, scale2=None, pre_scale=None
    ) -> StoredTensor:
        return StoredTensor(
            self.packed if packed is None else packed,
            self.codec,
            self.shape if shape is None else shape,
            dtype or self.dtype,
            self.scale if scale is None else scale,
            self.scale2 if scale2 is None else scale2,
            self.pre_scale if pre_scale is None else pre_scale,
            group=self.group,
        )

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        handler = _HANDLERS.get(func)
        if handler is not None:
            result = handler(*args, **kwargs)
            if result is not NotImplemented:
                return result
        if func._schema.is_mutable and _mutates_stored(func, args, kwargs):
            raise TypeError(
                f"a weight kept as its file stores it cannot be changed in place ({func})"
            )
        args, kwargs = tree_map_only(StoredTensor, lambda t: t.decoded(), (args, kwargs))
        return func(*args, **kwargs)


class ConvRotTensor(StoredTensor):
    """An int8 ConvRot weight (`StoredTensor` makes one for that codec), whose linear layers
    are computed as the tool computes them (`_linear`) whatever the grad mode.

    `torch.nn.functional.linear` is met here, above the dispatcher, where it is still whole:
    below, autograd's key splits it (into `.t()` and `mm` or `addmm`, or `expand` and `bmm` for
    an input whose rows are not one block) wherever that key is active, which is everywhere but
    inference mode, so `__torch_dispatch__` would see the layer only there. ComfyUI runs every
    prompt under inference mode; comfy-kitchen's int8 tensor also takes `.t()` as a flag and
    `mm`/`addmm` as the layer, but not the `bmm` split. Every other function goes on as
    `StoredTensor`'s do, to `__torch_dispatch__`, for one Python call each."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is _LINEAR:
            result = _linear(*args, **kwargs)
            if result is not NotImplemented:
                return result
        return _NO_FUNCTION(func, types, args, kwargs)


_LINEAR = torch._C._nn.linear  # pyright: ignore[reportAttributeAccessIssue] - what F.linear is
_NO_FUNCTION = torch._C._disabled_torch_function_impl


def _mutates_stored(func, args, kwargs) -> bool:
    arguments = func._schema.arguments
    for position, argument in enumerate(arguments):
        if argument.alias_info is None or not argument.alias_info.is_write:
            continue
        value = args[position] if position < len(args) else kwargs.get(argument.name)
        if isinstance(value, StoredTensor):
            return True
    return False


def plain(tensor):
    """`tensor` with its values decoded if it is stored (for code that reads every value once,
    such as a scan), else itself."""
    return tensor.decoded() if isinstance(tensor, StoredTensor) else tensor


def _parts(tensor: StoredTensor) -> list[torch.Tensor]:
    parts = (tensor.packed, tensor.scale, tensor.scale2, tensor.pre_scale)
    return [t for t in parts if t is not None]


def stored_bytes(tensor) -> int:
    """The bytes a tensor holds: a stored one's packed bytes and scales, else its elements'."""
    if isinstance(tensor, StoredTensor):
        return sum(t.numel() * t.element_size() for t in _parts(tensor))
    return tensor.numel() * tensor.element_size()


def storages(tensor) -> list[Any]:
    """The untyped storages holding a tensor's bytes (a stored one's packed bytes and scales)."""
    if isinstance(tensor, StoredTensor):
        return [t.untyped_storage() for t in _parts(tensor)]
    return [tensor.untyped_storage()]


# Making them ------------------------------------------------------------------------------


def gguf_decodable(type_name: str) -> bool:
    """Whether a GGUF block type is decoded by torch (diffusers' ports of the gguf package's
    decoders, on any device), so that it can be kept as stored."""
    from app.core.formats.quantized import TORCH_DECODED_GGUF

    return type_name in TORCH_DECODED_GGUF and type_name in _gguf_decoders()


def from_gguf(raw, type_name: str, shape) -> StoredTensor:
    """A GGUF tensor's blocks (`raw`: uint8, all of the tensor's bytes) kept as stored."""
    rows = shape[0] if len(shape) > 1 else 1
    packed = raw.reshape(rows, -1)
    return StoredTensor(packed, type_name, shape, MEANING_DTYPE)


def from_fp8(values, scale=None) -> StoredTensor:
    """An fp8 tensor (and its fp32 scale: one number or one per row) kept as stored."""
    return StoredTensor(values, FP8, values.shape, MEANING_DTYPE, scale)


def from_int8(values, scale) -> StoredTensor:
    """An int8 tensor and its fp32 scale (one number or one per row) kept as stored."""
    return StoredTensor(values, INT8, values.shape, MEANING_DTYPE, scale)


def from_int8_convrot(values, scale, group: int) -> StoredTensor:
    """An int8 ConvRot matrix (rows rotated in groups of `group` inputs, a power of 4 that
    divides the row) and its fp32 scale (one number or one per row) kept as stored."""
    return StoredTensor(values, INT8_CONVROT, values.shape, MEANING_DTYPE, scale, group=group)


def from_nvfp4(
    packed, block_scales, tensor_scale, *, high_first: bool, pre_scale=None
) -> StoredTensor:
    """An NVFP4 matrix kept as stored: `packed` (uint8, rows of two values per byte),
    `block_scales` (fp8 e4m3, one per 16 values of a row, in row order: a tiled layout is put in
    row order by the reader), `tensor_scale` (one fp32 number) and AWQ's `pre_scale` (fp32, one
    per column, or None)."""
    codec = NVFP4_HIGH_FIRST if high_first else NVFP4
    shape = (packed.shape[0], packed.shape[1] * 2)
    return StoredTensor(packed, codec, shape, MEANING_DTYPE, block_scales, tensor_scale, pre_scale)


# Decoding ---------------------------------------------------------------------------------


@functools.cache
def _gguf_decoders() -> dict[str, Any]:
    """GGUF type name -> (decoder, block size, block bytes): diffusers' torch ports, which run
    on the tensor's own device (the gguf package's decoders are numpy, CPU only)."""
    from diffusers.quantizers.gguf.utils import GGML_QUANT_SIZES, dequantize_functions

    return {
        kind.name: (decoder, *GGML_QUANT_SIZES[kind])
        for kind, decoder in dequantize_functions.items()
        if kind.name != "BF16"  # read as plain bf16, nothing to keep stored
    }


def _decode(packed, codec: str, scale, scale2, shape, pre_scale=None) -> torch.Tensor:
    if codec in _SCALED_BYTES:
        from app.core.formats.quantized import dequantize_scaled

        return dequantize_scaled(packed, scale)
    if codec in NVFP4_CODECS:
        high_first = codec == NVFP4_HIGH_FIRST
        return decode_nvfp4(packed, scale, scale2, high_first=high_first, pre_scale=pre_scale)
    decoder, block, block_bytes = _gguf_decoders()[codec]
    blocks = packed.reshape(-1, block_bytes)
    # fp32 throughout, as the gguf package decodes: diffusers' default keeps a Q8_0 block's
    # fp16 scale in fp16 and rounds each product there.
    values = decoder(blocks, block, block_bytes, torch.float32)
    return values.reshape(shape).to(MEANING_DTYPE)


def hadamard(group: int, device=None, dtype=torch.float32) -> torch.Tensor:
    """The normalised regular Hadamard matrix of `group` rows (a power of 4): Kronecker powers
    of the symmetric 4x4 block `_HADAMARD_BLOCK`, over sqrt(group). Symmetric and orthogonal."""
    return _hadamard(group, str(device or "cpu"), dtype)


@functools.lru_cache(maxsize=16)
@torch.inference_mode(False)  # kept for every later call, which autograd may record
def _hadamard(group: int, device: str, dtype) -> torch.Tensor:
    block = torch.tensor(_HADAMARD_BLOCK, dtype=torch.float64)
    matrix = torch.ones(1, 1, dtype=torch.float64)
    while matrix.shape[0] < group:
        matrix = torch.kron(matrix, block)
    if matrix.shape[0] != group:
        raise ValueError(f"a regular Hadamard matrix has a power of 4 rows, not {group}")
    return (matrix / group**0.5).to(device=device, dtype=dtype)


def scaled_rows(packed, scale) -> torch.Tensor:
    """int8 rows times their scale (one number or one per row), in float32."""
    values = packed.to(torch.float32)
    if scale is not None:
        values.mul_(scale.to(torch.float32).reshape(-1, 1) if scale.numel() > 1 else scale)
    return values


def unrotate(values, group: int) -> torch.Tensor:
    """Rows of dequantised ConvRot values (float32) in their own basis: each group of `group`
    values times H (its own inverse), in float32, then rounded once to MEANING_DTYPE.

    Times H's transpose (H is symmetric), as comfy-kitchen's decoding multiplies: the same
    product with the same strides, so that the float32 sums add in the same order. With H
    itself, a CPU's BLAS may order a 4-wide group's sum otherwise (an AMD EPYC did), and a
    rounding to bf16 then differs by one step in some values from what ComfyUI decodes."""
    rows, columns = values.shape
    matrix = hadamard(group, values.device)
    grouped = values.to(torch.float32).reshape(rows, columns // group, group)
    return torch.matmul(grouped, matrix.T).reshape(rows, columns).to(MEANING_DTYPE)


def rotate_input(x, group: int) -> torch.Tensor:
    """An activation rotated as an int8 ConvRot layer's kernel rotates it before its int8
    matrix product: each group of `group` values of the last dimension times H, in `x`'s own
    dtype (a group's largest value can grow to sqrt(group) times the input's, and in fp16 it
    overflows where the rotated value passes 65504)."""
    shape = x.shape
    matrix = hadamard(group, x.device, x.dtype)
    return torch.matmul(x.reshape(-1, shape[-1] // group, group), matrix).reshape(shape)


def rotated_input(weight, x) -> torch.Tensor | None:
    """`x` rotated as the int8 ConvRot `weight`'s kernel rotates it, or None where `x` is not
    a floating tensor that fits the weight's rows."""
    if (
        not isinstance(x, torch.Tensor)
        or isinstance(x, StoredTensor)
        or not x.is_floating_point()
        or not x.numel()
        or x.shape[-1] != weight.shape[-1]
    ):
        return None
    return rotate_input(x.detach(), weight.group)


def decode_nvfp4(
    packed, block_scales, tensor_scale, *, high_first: bool, pre_scale=None
) -> torch.Tensor:
    """An NVFP4 matrix's values in MEANING_DTYPE: each E2M1 value times its block's fp8 scale
    times the tensor's scale (times its column's AWQ `pre_scale`: x * s @ W.T is
    x @ (W * s).T), the product taken in fp32 and then rounded to bf16."""
    rows = packed.shape[0]
    low, high = packed & 0x0F, packed >> 4
    pairs = (high, low) if high_first else (low, high)
    codes = torch.stack(pairs, dim=-1).reshape(rows, -1).to(torch.int32)
    table = torch.tensor(_E2M1, dtype=torch.float32, device=packed.device)
    values = table.index_select(0, codes.reshape(-1)).reshape(rows, -1, NVFP4_BLOCK)
    scales = block_scales.to(torch.float32) * tensor_scale.to(torch.float32).reshape(())
    values.mul_(scales.reshape(rows, -1, 1))
    values = values.reshape(rows, -1)
    if pre_scale is not None:
        values.mul_(pre_scale.to(torch.float32))
    return values.to(MEANING_DTYPE)


# Operations that keep the bytes as stored ---------------------------------------------------


def _rows_sliceable(tensor: StoredTensor) -> bool:
    """Whether a slice of the first dimension is a slice of `packed`'s rows: fp8, int8 and
    NVFP4 always, GGUF when it has at least two dimensions (a 1-D tensor's blocks straddle its
    elements)."""
    return tensor.codec in _SCALED_BYTES + NVFP4_CODECS or tensor.dim() > 1


def _row_scale(tensor: StoredTensor, start: int, stop: int):
    """The scales of rows `start` to `stop`: NVFP4's block scales by row, a scale per row, or
    the tensor's one scale."""
    if tensor.scale is None or tensor.scale.numel() == 1:
        return tensor.scale
    if tensor.codec in NVFP4_CODECS:
        return tensor.scale[start:stop]
    return tensor.scale.reshape(-1)[start:stop]


def _alias(tensor, *args, **kwargs):
    return tensor._like()


def _to_copy(tensor, dtype=None, layout=None, device=None, pin_memory=None, **kwargs):
    if (dtype is not None and not dtype.is_floating_point) or layout not in (None, torch.strided):
        return NotImplemented
    non_blocking = kwargs.get("non_blocking", False)
    packed, scale, scale2 = tensor.packed, tensor.scale, tensor.scale2
    pre_scale = tensor.pre_scale
    if device is not None and torch.device(device) != packed.device:
        packed = packed.to(device, non_blocking=non_blocking)
        scale = None if scale is None else scale.to(device, non_blocking=non_blocking)
        scale2 = None if scale2 is None else scale2.to(device, non_blocking=non_blocking)
        if pre_scale is not None:
            pre_scale = pre_scale.to(device, non_blocking=non_blocking)
    return tensor._like(packed=packed, scale=scale, dtype=dtype, scale2=scale2, pre_scale=pre_scale)


def _to_dtype(tensor, dtype, non_blocking=False, copy=False, memory_format=None):
    return _to_copy(tensor, dtype=dtype, non_blocking=non_blocking)


def _to_device(tensor, device, dtype, non_blocking=False, copy=False, memory_format=None):
    return _to_copy(tensor, dtype=dtype, device=device, non_blocking=non_blocking)


def _to_dtype_layout(tensor, dtype=None, layout=None, device=None, pin_memory=None, **kwargs):
    return _to_copy(tensor, dtype=dtype, layout=layout, device=device, **kwargs)


def _slice(tensor, dim=0, start=None, end=None, step=1):
    size = tensor.shape[0]
    if dim != 0 or step != 1 or not _rows_sliceable(tensor):
        return NotImplemented
    begin, stop, _ = slice(start, end).indices(size)
    stop = max(begin, stop)
    shape = (stop - begin, *tensor.shape[1:])
    return tensor._like(
        packed=tensor.packed[begin:stop], scale=_row_scale(tensor, begin, stop), shape=shape
    )


def _split_with_sizes(tensor, split_sizes, dim=0):
    if dim != 0 or not _rows_sliceable(tensor):
        return NotImplemented
    parts, start = [], 0
    for size in split_sizes:
        parts.append(_slice(tensor, 0, start, start + size))
        start += size
    return parts


def _split(tensor, split_size, dim=0):
    if dim != 0:
        return NotImplemented
    total = tensor.shape[0]
    sizes = [min(split_size, total - start) for start in range(0, total, split_size)]
    return _split_with_sizes(tensor, sizes or [0], 0)


def _cat(tensors, dim=0):
    first = tensors[0] if tensors else None
    if (
        dim != 0
        or not isinstance(first, StoredTensor)
        or not all(
            isinstance(t, StoredTensor)
            and t.codec == first.codec
            and t.group == first.group
            and t.dtype == first.dtype
            and t.device == first.device
            and t.shape[1:] == first.shape[1:]
            and _rows_sliceable(t)
            for t in tensors
        )
    ):
        return NotImplemented
    scale = None
    if first.codec in NVFP4_CODECS:
        # Block scales go with their rows; one tensor scale must hold for every part.
        second, blocks = first.scale2, [t.scale for t in tensors]
        seconds = [t.scale2 for t in tensors]
        if second is None or any(s is None or not torch.equal(s, second) for s in seconds):
            return NotImplemented
        # An input smoothing factor is the columns' own: one for every part, or none.
        pre = [t.pre_scale for t in tensors]
        if any((p is None) != (first.pre_scale is None) for p in pre) or (
            first.pre_scale is not None
            and not all(p is not None and torch.equal(p, first.pre_scale) for p in pre)
        ):
            return NotImplemented
        scale = torch.cat([b for b in blocks if b is not None], dim=0)
    elif first.scale is not None:
        scales = [t.scale for t in tensors]
        if any(s is None for s in scales):
            return NotImplemented
        whole = [s for s in scales if s is not None and s.numel() == 1]
        if len(whole) == len(scales) and all(torch.equal(s, whole[0]) for s in whole):
            scale = first.scale
        else:  # one scale per row for every part
            scale = torch.cat(
                [
                    s.reshape(-1).expand(t.shape[0]) if s.numel() == 1 else s.reshape(-1)
                    for s, t in zip(scales, tensors, strict=True)
                    if s is not None
                ]
            )
    packed = torch.cat([t.packed for t in tensors], dim=0)
    shape = (sum(t.shape[0] for t in tensors), *first.shape[1:])
    return first._like(packed=packed, scale=scale, shape=shape)


def _clone(tensor, memory_format=None):
    scale = None if tensor.scale is None else tensor.scale.clone()
    scale2 = None if tensor.scale2 is None else tensor.scale2.clone()
    pre_scale = None if tensor.pre_scale is None else tensor.pre_scale.clone()
    return tensor._like(
        packed=tensor.packed.clone(), scale=scale, scale2=scale2, pre_scale=pre_scale
    )


def _linear(input, weight, bias=None):  # noqa: A002 - torch's name, which callers may pass
    """An int8 ConvRot layer computed as its tool computes it (comfy-kitchen's int8 linear):
    the input rotated in its own dtype, then multiplied by the stored, still rotated rows (q
    times its scale) in that dtype, the bias added there. In exact arithmetic this is the
    product with the decoded weight (x H (q s)^T = x ((q s) H)^T, H symmetric); computed this
    way an fp16 input whose rotated values pass 65504 overflows here as it does in the tool,
    where decoding the weight would hide it. The tool rounds the rotated input to int8 per row
    and accumulates exactly in int32, scaling in fp32 before it writes the output in the input's
    dtype; HalfSafe's product accumulates as the dtype's matrix product does (fp32 for fp16 and
    bf16) and does not round the input to int8 (which moves no peak by more than half a step of
    its row's peak over 127). Reached from `ConvRotTensor.__torch_function__` in every grad
    mode, and from `__torch_dispatch__` where `aten.linear` arrives whole."""
    x = input
    if (
        not isinstance(weight, StoredTensor)
        or weight.codec != INT8_CONVROT
        or not isinstance(x, torch.Tensor)
        or isinstance(x, StoredTensor)
        or not x.is_floating_point()
        or not x.dim()
        or x.shape[-1] != weight.shape[-1]
    ):
        return NotImplemented
    rotated = rotate_input(x, weight.group)
    rows = scaled_rows(weight.packed, weight.scale).to(x.dtype)
    if bias is not None:
        bias = (bias.decoded() if isinstance(bias, StoredTensor) else bias).to(x.dtype)
    return torch.nn.functional.linear(rotated, rows, bias)


_aten = torch.ops.aten


def _shallow_copy_compatible(tensor, other):
    # Asked by `tensor.data = other` (how a layer computing in another dtype swaps its weight
    # for the length of its forward): two stored tensors are; without this both were decoded.
    both = isinstance(tensor, StoredTensor) and isinstance(other, StoredTensor)
    return True if both else NotImplemented


_HANDLERS = {
    _aten._has_compatible_shallow_copy_type.default: _shallow_copy_compatible,
    _aten.detach.default: _alias,
    _aten.alias.default: _alias,
    _aten._to_copy.default: _to_copy,
    # Under inference mode `.to()` arrives whole, not as `_to_copy`.
    _aten.to.dtype: _to_dtype,
    _aten.to.device: _to_device,
    _aten.to.dtype_layout: _to_dtype_layout,
    _aten.slice.Tensor: _slice,
    _aten.split_with_sizes.default: _split_with_sizes,
    _aten.split.Tensor: _split,
    _aten.cat.default: _cat,
    _aten.clone.default: _clone,
    _aten.linear.default: _linear,
}
