"""The newest families' transformer files quantised as users download them, written in code
from tiny transformers in their original key layout: fp8 e4m3 in ComfyUI's layouts, NVFP4 and
int8 (ConvRot too) as ComfyUI and ModelOpt write them, and GGUF as city96's tools make it, each
beside its companions as ComfyUI keeps them, with the values each file decodes to."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize

from app.core.checkpoint import write_safetensors
from app.core.families import family_of
from app.core.formats.layouts import Layout, to_original
from app.core.formats.quantized import PLAUSIBLE_WEIGHT_MAX
from tests.support.model_files import save_split_files
from tests.support.tiny_models import (
    build_tiny_flux2_klein_pipeline,
    build_tiny_flux3_pipeline,
    build_tiny_krea2_pipeline,
    build_tiny_qwenimage21_pipeline,
)

E4M3 = torch.float8_e4m3fn
Q8_0, Q4_K = GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q4_K
F32, F16, BF16 = GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16
BF16_ROUNDING = 2**-8  # relative: what a value may move when it is held as bf16


# The families ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One family's tiny pipeline and how its quantised transformer files are made."""

    build: Callable[[], Any]
    stem: str  # the transformer file's name before its quantisation's
    architecture: str
    because: str  # how detection's sentence starts
    fp8_layers: tuple[str, ...]  # prefixes of the matrices fp8 files store in fp8
    gguf_arch: str  # the GGUF file's general.architecture ("flux": convert.py's for Flux.2)
    bf16_in_gguf: tuple[str, ...]  # prefixes llama-quantize leaves as converted (BF16)
    block: tuple[str, str]  # a block's layer (the file's key, the pipeline's module)


# ComfyUI-GGUF's rules for "flux" files (tools/lcpp.patch): these are not quantised.
FLUX_EMBEDDERS = ("txt_in.", "img_in.", "time_in.", "vector_in.", "guidance_in.", "final_layer.")

CASES = {
    "flux2-klein": Case(
        build_tiny_flux2_klein_pipeline,
        "flux-2-klein-4b",
        "flux2-klein",
        "Flux.2 Klein: a transformer in Black Forest Labs' layout",
        (
            "double_blocks.",
            "single_blocks.",
            "double_stream_modulation",
            "single_stream_modulation",
        ),
        "flux",
        FLUX_EMBEDDERS,
        ("double_blocks.0.img_mlp.0.weight", "transformer_blocks.0.ff.linear_in"),
    ),
    "qwenimage21": Case(
        build_tiny_qwenimage21_pipeline,
        "qwen_image_2.1",
        "qwenimage21",
        "Qwen-Image 2.1: a single-stream block-causal transformer file",
        ("transformer_blocks.",),
        "qwen_image",
        (),
        ("transformer_blocks.0.attn.to_v.weight", "transformer_blocks.0.attn.to_v"),
    ),
    "krea2": Case(
        lambda: build_tiny_krea2_pipeline(released_taps=True),  # a file reads 12 layers
        "krea2",
        "krea2",
        "Krea 2: a single-stream transformer in Krea's layout",
        ("blocks.", "txtfusion.layerwise_blocks.", "txtfusion.refiner_blocks."),
        "krea2",
        (),
        ("blocks.0.mlp.up.weight", "transformer_blocks.0.ff.up"),
    ),
    "flux3-klein": Case(
        lambda: build_tiny_flux3_pipeline(distilled=True),
        "flux-3-klein",
        "flux3-klein",
        "FLUX.3 Klein: a transformer in Black Forest Labs' layout",
        (
            "txt_mode_blocks.",
            "content_mode_blocks.",
            "single_blocks.",
            "early_stream_modulations",
            "single_stream_modulations",
        ),
        "flux3",
        ("txt_in.", "emb_in.", "time_in.", "ref_time_in.", "final_layer."),
        ("content_mode_blocks.image.0.mlp_in.weight", "mode_blocks.image.0.ff.linear_in"),
    ),
}


# The rotation group of the int8 ConvRot files written here: released files use 256, wider
# than most tiny layers; 16 is a power of 4 that divides them (a layer it does not divide stays
# plain int8, as converters leave it).
CONVROT_GROUP = 16


def written_weights(pipeline) -> dict[str, torch.Tensor]:
    """The pipeline's transformer weights under its file layout's names, in bf16 as the
    released files hold them: what every quantised file here is made from."""
    layout = family_of(pipeline).layout
    assert layout is not None
    return original_weights(pipeline.transformer, layout)


def original_weights(transformer, layout: Layout) -> dict[str, torch.Tensor]:
    config = {**transformer.config, "_class_name": type(transformer).__name__}
    state = to_original(layout.table(config), transformer.state_dict())
    return {k: v.detach().to(torch.bfloat16).contiguous() for k, v in state.items()}


@dataclass
class Written:
    """A quantised file written here: each key's values as this file decodes them from the
    bytes it wrote (float32), how far each may be from the weight written (float32, per
    value), and the stored type of each key."""

    path: Path
    decoded: dict[str, torch.Tensor]
    error: dict[str, torch.Tensor]
    types: dict[str, str]
    rotated: tuple[str, ...] = ()  # int8 weights stored rotated (ConvRot)


# fp8, as ComfyUI writes it -----------------------------------------------------------------


def comfy_quant(config: dict[str, Any]) -> torch.Tensor:
    """A layer's quantisation config as ComfyUI stores it: its JSON as a uint8 tensor."""
    return torch.tensor(list(json.dumps(config).encode()), dtype=torch.uint8)


def matrices_under(prefixes: tuple[str, ...]) -> Callable[[str, torch.Tensor], bool]:
    """Which tensors an fp8 file stores in fp8: the matrices (linear layers' weights) whose
    names start with one of `prefixes`."""
    return lambda name, t: name.endswith(".weight") and t.ndim == 2 and name.startswith(prefixes)


def _as_given(tensors, decoded, error, types, name: str, weight: torch.Tensor) -> None:
    """A tensor a quantised file keeps as the weights give it: read back exactly."""
    values = weight.float()
    tensors[name], decoded[name] = weight, values
    error[name], types[name] = torch.zeros_like(values), str(weight.dtype)


def write_fp8(path: Path, weights, quantised, layout: str) -> Written:
    """The weights `quantised` picks in fp8 e4m3 with a per-tensor scale (their largest value
    over 448), everything else as given, in one of ComfyUI's layouts (see the module)."""
    tensors: dict[str, torch.Tensor] = {}
    decoded, error, types, formats = {}, {}, {}, {}
    for name, weight in weights.items():
        values = weight.float()
        if not quantised(name, weight):
            _as_given(tensors, decoded, error, types, name, weight)
            continue
        layer = name.removesuffix(".weight")
        scale = (values.abs().max() / 448).reshape(())
        stored = (values / scale).to(E4M3)
        tensors[name], types[name] = stored, "F8_E4M3"
        decoded[name] = stored.float() * scale
        # e4m3 keeps 3 bits after the leading one (half a step: 1/16 of the value), and steps
        # of 2^-9 below 2^-6 (half of one times the scale).
        error[name] = values.abs() / 16 + scale * 2**-10
        if layout == "scaled":
            tensors[f"{layer}.scale_weight"] = scale
            tensors[f"{layer}.scale_input"] = torch.tensor(1.0)
        else:
            tensors[f"{layer}.weight_scale"] = scale
            tensors[f"{layer}.input_scale"] = torch.tensor(0.0125)  # an fp8 kernel's, unused
            formats[layer] = {"format": "float8_e4m3fn"}
            if layout == "comfy_quant":
                tensors[f"{layer}.comfy_quant"] = comfy_quant(formats[layer])
    metadata = None
    if layout == "scaled":
        tensors["scaled_fp8"] = torch.empty(0, dtype=E4M3)
    elif layout == "metadata":
        metadata = {
            "_quantization_metadata": json.dumps({"format_version": "1.0", "layers": formats})
        }
    write_safetensors(path, tensors, metadata)
    return Written(path, decoded, error, types)


# NVFP4 and int8, as ComfyUI and ModelOpt write them -----------------------------------------


# E2M1's magnitudes by their 3-bit code; bit 3 of a code is the sign.
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def nvfp4(values: torch.Tensor):
    """`values` (rows by a multiple of 16) in NVFP4: the tensor scale (largest value over 448 x
    6), each block of 16's fp8 e4m3 scale (its largest over 6, over the tensor scale), each
    value's nearest E2M1 code. Returns the codes (one per value), block scales, tensor scale,
    the decoded values and each value's error bound (half E2M1's widest step at its block's
    scale, plus what the block scale's rounding may clip: 1/16 of the value)."""
    rows, columns = values.shape
    tensor_scale = (values.abs().max() / (448 * 6)).clamp_min(1e-12).reshape(())
    blocks = values.reshape(rows, columns // 16, 16)
    block_scales = (blocks.abs().amax(-1) / 6 / tensor_scale).to(E4M3)
    scale = block_scales.float() * tensor_scale
    scaled = blocks / torch.where(scale > 0, scale, 1.0)[..., None]
    index = (scaled.abs().clamp(max=6)[..., None] - E2M1).abs().argmin(-1)
    negative = scaled < 0
    codes = (index | (negative.long() << 3)).to(torch.uint8).reshape(rows, columns)
    decoded = E2M1[index] * torch.where(negative, -1.0, 1.0) * scale[..., None]
    error = scale[..., None].expand_as(blocks) + blocks.abs() / 16
    return (
        codes,
        block_scales,
        tensor_scale,
        decoded.reshape(rows, columns),
        error.reshape(rows, columns),
    )


def pack_nibbles(codes: torch.Tensor, *, high_first: bool) -> torch.Tensor:
    even, odd = codes[:, 0::2], codes[:, 1::2]
    return (even << 4) | odd if high_first else even | (odd << 4)


def tiled(block_scales: torch.Tensor) -> torch.Tensor:
    """Block scales in cuBLAS's tiled layout, as ComfyUI's files hold them, placed one by one:
    tiles of 128 rows by 4 columns, row of tiles after row of tiles, row 32a + j and column c
    of a tile at 16j + 4a + c within it."""
    rows, columns = block_scales.shape
    row_tiles, column_tiles = -(-rows // 128), -(-columns // 4)
    flat = torch.zeros(row_tiles * column_tiles * 512, dtype=torch.uint8)
    codes = block_scales.view(torch.uint8)
    for r in range(rows):
        for c in range(columns):
            tile = (r // 128) * column_tiles + c // 4
            within = (r % 32) * 16 + (r % 128 // 32) * 4 + c % 4
            flat[tile * 512 + within] = codes[r, c]
    return flat.view(E4M3).reshape(row_tiles * 128, column_tiles * 4)


def write_nvfp4(path: Path, weights, quantised, layout: str) -> Written:
    """The weights `quantised` picks (those whose rows hold whole blocks of 16) in NVFP4, the
    rest as given: ComfyUI's layout ("comfy": the even value in each byte's high nibble, block
    scales tiled, a `comfy_quant` config per layer) or ModelOpt's, as BFL publishes it
    ("modelopt": the even value low, block scales in row order, an `input_scale` per layer)."""
    tensors: dict[str, torch.Tensor] = {}
    decoded, error, types = {}, {}, {}
    for name, weight in weights.items():
        values = weight.float()
        if not quantised(name, weight) or values.shape[1] % 16:
            _as_given(tensors, decoded, error, types, name, weight)
            continue
        layer = name.removesuffix(".weight")
        codes, blocks, second, decoded[name], error[name] = nvfp4(values)
        comfy = layout == "comfy"
        tensors[name] = pack_nibbles(codes, high_first=comfy)
        tensors[f"{layer}.weight_scale"] = tiled(blocks) if comfy else blocks
        tensors[f"{layer}.weight_scale_2"] = second
        if comfy:
            tensors[f"{layer}.comfy_quant"] = comfy_quant({"format": "nvfp4"})
        else:
            tensors[f"{layer}.input_scale"] = torch.tensor(0.02)  # an fp4 kernel's, unused
        types[name] = "NVFP4"
    write_safetensors(path, tensors)
    return Written(path, decoded, error, types)


def write_int8(path: Path, weights, quantised, group: int | None = None) -> Written:
    """The weights `quantised` picks in int8 with a scale per row (its largest value over 127),
    as ComfyUI's `int8_tensorwise` layers store them, the rest as given. With `group`, each
    such weight whose rows divide into groups of `group` is rotated first (int8 ConvRot), by
    comfy-kitchen's own quantiser, its layer config saying so as ComfyUI reads it."""
    from comfy_kitchen.backends.eager import quantization as kitchen

    tensors: dict[str, torch.Tensor] = {}
    decoded, error, types, rotated = {}, {}, {}, []
    for name, weight in weights.items():
        values = weight.float()
        if not quantised(name, weight):
            _as_given(tensors, decoded, error, types, name, weight)
            continue
        layer = name.removesuffix(".weight")
        config: dict[str, Any] = {"format": "int8_tensorwise"}
        if group is not None and values.shape[1] % group == 0:
            stored, scale = kitchen.quantize_int8_convrot_weight(values, group)
            decoded[name] = kitchen.dequantize_int8_convrot_weight(stored, scale, group)
            # Half a step in each rotated value, spread back over a group (H's entries are
            # +-1/sqrt(group)).
            error[name] = (scale / 2 * group**0.5).expand_as(values)
            config |= {"convrot": True, "convrot_groupsize": group}
            rotated.append(name)
        else:
            scale = (values.abs().amax(1, keepdim=True) / 127).clamp_min(1e-12)
            stored = (values / scale).round().clamp(-127, 127).to(torch.int8)
            decoded[name], error[name] = stored.float() * scale, (scale / 2).expand_as(values)
        tensors[name], tensors[f"{layer}.weight_scale"] = stored, scale
        tensors[f"{layer}.comfy_quant"] = comfy_quant(config)
        types[name] = "INT8_CONVROT" if rotated and rotated[-1] == name else "INT8"
    write_safetensors(path, tensors)
    return Written(path, decoded, error, types, tuple(rotated))


# GGUF, as city96's tools make it -----------------------------------------------------------


def q8_0(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q8_0 blocks written by the gguf package (ggml's own rounding), decoded here from their
    bytes: per 32 values an fp16 step d, then 32 signed bytes q, each value q x d. Returns the
    bytes, the decoded values and each value's error bound: half a step, plus 127 times what
    d lost when it was stored in fp16."""
    raw = quantize(values, Q8_0)
    blocks = raw.reshape(-1, 34)
    step = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    q = blocks[:, 2:].copy().view(np.int8).astype(np.float32)
    decoded = (q * step).reshape(values.shape)
    exact = np.abs(values.reshape(-1, 32)).max(axis=1, keepdims=True) / 127
    bound = exact / 2 + 127 * np.abs(exact - step)
    return raw, decoded, np.broadcast_to(bound, q.shape).reshape(values.shape)


SMALLEST_FP16 = 2.0**-24


def _fp16_at_least(value: np.ndarray) -> np.ndarray:
    """The smallest fp16 numbers no smaller than `value` (float32, non-negative)."""
    stored = value.astype(np.float16)
    low = stored.astype(np.float32) < value
    stored[low] = np.nextafter(stored[low], np.float16(np.inf))
    return stored


def q4_k(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_K blocks as ggml lays them out (the gguf package decodes but cannot encode them).
    Per 256 values: fp16 d and dmin, twelve bytes packing eight 6-bit scales sc and mins m
    (one per 32 values), then 128 bytes of 4-bit q, sub-blocks 2i and 2i+1 in the low and high
    halves of the same 32 bytes; a value is d sc q - dmin m. Chosen here so that no value is
    clipped: each sub-block's offset dmin m at least its most negative value, its step d sc
    at least its span over 15. Returns the bytes (rows by row bytes), the decoded values and
    each value's bound: half its sub-block's step."""
    rows = values.shape[0]
    x = values.reshape(-1, 8, 32).astype(np.float32)
    low = np.minimum(x.min(axis=2), 0)
    dmin = _fp16_at_least(np.maximum((-low).max(axis=1) / 63, SMALLEST_FP16))
    mins = np.ceil(-low / dmin.astype(np.float32)[:, None]).astype(np.uint8)
    offset = mins * dmin.astype(np.float32)[:, None]
    span = x.max(axis=2) + offset  # what the 16 levels above the offset must reach
    wanted = (x.max(axis=2) - low + dmin.astype(np.float32)[:, None]) / 15
    d = _fp16_at_least(np.maximum(wanted.max(axis=1) / 63, SMALLEST_FP16))
    scales = np.ceil(span / 15 / d.astype(np.float32)[:, None]).astype(np.uint8)
    step = scales * d.astype(np.float32)[:, None]
    q = np.clip(np.rint((x + offset[:, :, None]) / step[:, :, None]), 0, 15).astype(np.uint8)
    assert scales.max() <= 63 and mins.max() <= 63
    packed = np.zeros((len(x), 12), dtype=np.uint8)
    packed[:, 0:4] = (scales[:, :4] & 63) | ((scales[:, 4:] >> 4) << 6)
    packed[:, 4:8] = (mins[:, :4] & 63) | ((mins[:, 4:] >> 4) << 6)
    packed[:, 8:12] = (scales[:, 4:] & 15) | ((mins[:, 4:] & 15) << 4)
    pairs = q.reshape(len(x), 4, 2, 32)
    nibbles = (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).reshape(len(x), 128)
    raw = np.concatenate(
        [d[:, None].view(np.uint8), dmin[:, None].view(np.uint8), packed, nibbles], axis=1
    )
    decoded = q * step[:, :, None] - offset[:, :, None]
    bound = np.broadcast_to(step[:, :, None] / 2, x.shape) * (1 + 1e-6)
    return raw.reshape(rows, -1), decoded.reshape(values.shape), bound.reshape(values.shape)


QUANTIZERS = {Q8_0: (32, q8_0), Q4_K: (256, q4_k)}


def gguf_type(name: str, values: np.ndarray, qtype, bf16: tuple[str, ...]):
    """The type city96's tools leave a tensor of a bf16 model in: F32 for 1-D tensors and
    those of at most 1,024 values (convert.py), BF16 for what llama-quantize may not quantise
    (the family's embedders), `qtype` for matrices whose rows fit its blocks, else F16 (the
    patched llama-quantize's fallback)."""
    if values.ndim == 1 or values.size <= 1024:
        return F32
    if name.startswith(bf16):
        return BF16
    return qtype if values.shape[-1] % QUANTIZERS[qtype][0] == 0 else F16


def write_gguf(path: Path, weights, qtype, case: Case) -> Written:
    writer = GGUFWriter(path, case.gguf_arch)
    decoded, error, types = {}, {}, {}
    for name, weight in weights.items():
        values = weight.float().numpy()
        kind = gguf_type(name, values, qtype, case.bf16_in_gguf)
        types[name] = kind.name
        if kind in QUANTIZERS:
            raw, values_read, bound = QUANTIZERS[kind][1](values)
            writer.add_tensor(name, raw, raw_dtype=kind)
        else:
            stored = values.astype(np.float16) if kind == F16 else values
            if kind == BF16:
                writer.add_tensor(name, quantize(values, BF16), raw_dtype=BF16)
            else:
                writer.add_tensor(name, stored)
            values_read = stored.astype(np.float32)
            bound = np.abs(values_read - values)  # 0 but for F16's rounding (F32, BF16: exact)
        decoded[name] = torch.from_numpy(np.ascontiguousarray(values_read, dtype=np.float32))
        error[name] = torch.from_numpy(np.ascontiguousarray(bound, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Written(path, decoded, error, types)


# A model folder as ComfyUI keeps it ----------------------------------------------------------


def write_quantised(folder: Path, weights, case: Case, form: str) -> Written:
    """`weights` as a transformer file of `form` ("fp8-<ComfyUI layout>", "gguf-<type>") in
    `folder`, named as the ecosystem names them (<model>-fp8, <model>-Q8_0)."""
    kind, style = form.split("-", 1)
    folder.mkdir(parents=True, exist_ok=True)
    quantised = matrices_under(case.fp8_layers)
    if kind == "fp8":
        return write_fp8(folder / f"{case.stem}-fp8.safetensors", weights, quantised, style)
    if kind == "nvfp4":
        return write_nvfp4(folder / f"{case.stem}-nvfp4.safetensors", weights, quantised, style)
    if kind == "int8" and style == "convrot":
        path = folder / f"{case.stem}_int8_convrot.safetensors"
        return write_int8(path, weights, quantised, CONVROT_GROUP)
    if kind == "int8":
        return write_int8(folder / f"{case.stem}-int8.safetensors", weights, quantised)
    qtype = GGMLQuantizationType[style]
    return write_gguf(folder / f"{case.stem}-{style}.gguf", weights, qtype, case)


def quantised_set(root: Path, pipeline, case: Case, form: str, weights=None) -> Written:
    """The pipeline's files under root/models as ComfyUI keeps them, its transformer replaced
    by a quantised file of `form` in diffusion_models/ (made from `weights`, by default the
    pipeline's own)."""
    written = save_split_files(pipeline, root / "models", case.stem)
    written["transformer"].unlink()
    weights = weights if weights is not None else written_weights(pipeline)
    return write_quantised(written["transformer"].parent, weights, case, form)


def close(got: torch.Tensor, want: torch.Tensor, error: torch.Tensor | float = 0.0) -> bool:
    """`got` (as loaded, bf16) is `want` within `error` and bf16's rounding."""
    got = got.float()
    rounding = torch.maximum(got.abs(), want.abs()) * BF16_ROUNDING
    return bool(((got - want).abs() <= error + rounding).all())


def wide_klein(klein):
    """Klein with a 256-wide transformer (two 128-wide heads, a 768-wide feed-forward): every
    block matrix's rows then fill Q4_K's blocks of 256 values, as the real model's do."""
    from diffusers import Flux2KleinPipeline, Flux2Transformer2DModel

    torch.manual_seed(5)
    transformer = Flux2Transformer2DModel(
        patch_size=1,
        in_channels=128,
        num_layers=1,
        num_single_layers=2,
        attention_head_dim=128,
        num_attention_heads=2,
        joint_attention_dim=klein.transformer.config.joint_attention_dim,
        timestep_guidance_channels=32,
        axes_dims_rope=(32, 32, 32, 32),
        guidance_embeds=False,
    ).eval()
    return Flux2KleinPipeline(**{**klein.components, "transformer": transformer})


def language_model_matrix(name: str, tensor: torch.Tensor) -> bool:
    """A projection of a Qwen text encoder's language model (what ComfyUI's fp8 "mixed" text
    encoders store in fp8; the vision tower, embeddings and norms stay bf16)."""
    return re.search(r"(^|\.)layers\.\d+\..*_proj\.weight$", name) is not None


# An overflow planted in a block: the layer's weights scaled until the largest is 8,000, short
# of the 10,000 past which a decoded weight is called broken, and enough to carry the layer's
# output past fp16's 65,504 on the check's prompt.
PLANTED_PEAK = 0.8 * PLAUSIBLE_WEIGHT_MAX
