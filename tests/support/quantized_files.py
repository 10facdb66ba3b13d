"""Quantized checkpoints written in code from tiny models: fp8 e4m3 safetensors of SD1.x (plain
and scaled, as converters write them) and a Flux.1 transformer as a GGUF file, the way
city96's converter writes one, beside its companions as ComfyUI keeps them."""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize

from app.core.checkpoint import Checkpoint, write_safetensors
from tests.support.model_files import ldm_state_dict, save_split_files
from tests.support.tiny_models import build_tiny_flux_pipeline, build_tiny_sd_pipeline

E4M3 = torch.float8_e4m3fn
UNET_LAYER = "model.diffusion_model.input_blocks.1.1.proj_in.weight"


def is_quantizable(name: str, tensor) -> bool:
    return name.endswith(".weight") and tensor.ndim >= 2 and tensor.is_floating_point()


def fp8_scaled(tensors, *, style: str = "scale_weight", per_row: bool = False):
    """fp8 e4m3 weights with their scales, as a converter writes them: ComfyUI's
    `scale_weight` with the `scaled_fp8` marker, or `weight_scale` (per tensor or per row).
    Returns the tensors and each weight's exact dequantised value."""
    out, exact = {}, {}
    for name, tensor in tensors.items():
        if not is_quantizable(name, tensor):
            out[name] = tensor.to(torch.bfloat16) if tensor.is_floating_point() else tensor
            continue
        values = tensor.float()
        if per_row:
            peak = values.abs().reshape(values.shape[0], -1).amax(1).clamp_min(1e-8)
            scale = peak / 448
            shaped = scale.reshape(-1, *([1] * (values.dim() - 1)))
        else:
            scale = (values.abs().max().clamp_min(1e-8) / 448).reshape(())
            shaped = scale
        stored = (values / shaped).to(E4M3)
        out[name] = stored
        out[name.removesuffix("weight") + style] = scale
        exact[name] = stored.float() * shaped
    if style == "scale_weight":
        out["scaled_fp8"] = torch.empty(0, dtype=E4M3)
    return out, exact


def close_to(got, exact, reference=None) -> None:
    """Equal to the exact dequantised value within bf16 rounding, and (when given) to the
    original weight within fp8 e4m3's rounding (3 mantissa bits: 1/16 of the value, plus the
    subnormal step near zero)."""
    got = got.float()
    assert torch.allclose(got, exact, rtol=2**-8, atol=1e-12), (got - exact).abs().max()
    if reference is not None:
        step = reference.abs().max() / 448 * 2**-9
        assert ((got - reference).abs() <= reference.abs() / 16 + step * 2).all()


def sd1_file(tmp_path, name="tiny-sd1-fp8.safetensors", **options):
    pipeline = build_tiny_sd_pipeline(seed=3)
    tensors = ldm_state_dict(pipeline, architecture="sd1")
    original = {k: v.detach().clone() for k, v in tensors.items()}
    stored, exact = fp8_scaled(tensors, **options)
    path = write_safetensors(tmp_path / name, stored)
    return path, stored, exact, original


def write_gguf(path, tensors, qtype=GGMLQuantizationType.Q8_0, flattened=(), recorded=None):
    """A GGUF file as city96's converter writes a Flux transformer: matrices whose rows fit the
    block size in `qtype`, the rest (biases, norms, odd rows) in F32 or F16. The tensors named
    in `flattened` are stored as rows of one block, their shape recorded as ComfyUI-GGUF does
    (`recorded` gives another shape to record instead)."""
    from gguf.constants import GGML_QUANT_SIZES

    block = GGML_QUANT_SIZES[qtype][0]
    writer = GGUFWriter(path, "flux")
    for name, tensor in tensors.items():
        values = tensor.float().numpy()
        if name in flattened:
            shape = recorded or list(tensor.shape)
            writer.add_array(f"comfy.gguf.orig_shape.{name}", shape)
            values = values.reshape(-1, block)
        if qtype == GGMLQuantizationType.F16 or tensor.ndim < 2:
            writer.add_tensor(name, values.astype(np.float16 if tensor.ndim >= 2 else np.float32))
        elif values.shape[-1] % block == 0:
            writer.add_tensor(name, quantize(values, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(name, values.astype(np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def gguf_split_set(tmp_path, pipeline, qtype, folder="diffusion_models", name="flux1-tiny"):
    """The pipeline as ComfyUI keeps it, its transformer file replaced by a GGUF one (in
    `folder`). Returns the pipeline, the transformer's original-layout tensors, the GGUF path."""
    written = save_split_files(pipeline, tmp_path / "models", name)
    with Checkpoint(written["transformer"]) as checkpoint:
        original = {k: checkpoint.get(k).clone() for k in checkpoint.shapes}
    written["transformer"].unlink()
    target = tmp_path / "models" / folder / f"{name}-Q.gguf"
    target.parent.mkdir(exist_ok=True)
    return pipeline, original, write_gguf(target, original, qtype)


def flux_gguf(tmp_path, qtype, folder="diffusion_models"):
    return gguf_split_set(tmp_path, build_tiny_flux_pipeline(), qtype, folder)


# Largest error of one value, relative to its block's largest: half a step (Q4_0: a whole one,
# its 16 levels run from -8 to +7 steps, so the far side of a block is clipped by one).
STEP = {"Q8_0": 1 / 127, "Q4_0": 1 / 7, "F16": 2**-10}
