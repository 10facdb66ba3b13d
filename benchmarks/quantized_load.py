"""Loading quantized checkpoints against the same model in bf16 and fp16: a mid-size Flux-shaped
transformer file (random weights) with tiny companions, loaded with `load_model` as split files.

One transformer (2 double and 4 single blocks, 1024 wide: about 140M parameters) is written in
every form HalfSafe reads: bf16 and fp16 safetensors, fp8 e4m3 safetensors plain and scaled
(ComfyUI's `scale_weight` and `scaled_fp8` marker), and GGUF Q8_0, Q4_0 and F16 (matrices
block-quantised, biases and norms F32, as city96's files are). Each is then loaded warm (file in
the OS cache, identity digest cached by a first load) with its tiny CLIP, T5 and VAE companions,
alternating forms. The table gives, per form, the time to read every tensor of the transformer
file (`scan_weights(path)`: read, dequantise, NaN/Inf check: the part that differs between
forms), the whole `load_model`, and the transformer's weights in memory once loaded (for
bf16/fp16 safetensors they are views of the mapped file; quantized forms are dequantised bf16
copies). On a shared machine the minimum is the steadier figure; medians are given too.

Usage: python benchmarks/quantized_load.py [--runs 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import time
from pathlib import Path

from common import emit, machine, machine_line, status

FORMS = ("bf16", "fp16", "fp8", "fp8_scaled", "gguf_Q8_0", "gguf_Q4_0", "gguf_F16", "int8_convrot")


def transformer_config() -> dict:
    return {
        "patch_size": 1,
        "in_channels": 64,
        "num_layers": 2,
        "num_single_layers": 4,
        "attention_head_dim": 128,
        "num_attention_heads": 8,
        "joint_attention_dim": 32,  # the tiny T5 companion's width
        "pooled_projection_dim": 32,  # the tiny CLIP companion's width
        "guidance_embeds": True,
        "axes_dims_rope": (16, 56, 56),
    }


def random_bfl_state(config: dict | None = None) -> dict:
    """The transformer's weights under BFL names (of `config`, default this script's), random
    at a real model's scale, in fp32."""
    import torch
    from diffusers import FluxTransformer2DModel

    from app.core.formats import layouts
    from app.core.models import split

    config = config or transformer_config()
    with torch.device("meta"):
        model = FluxTransformer2DModel(**config)
    generator = torch.Generator().manual_seed(0)
    state = {
        k: torch.randn(v.shape, generator=generator) * 0.02 for k, v in model.state_dict().items()
    }
    rows = split.layout_of("flux").table({**model.config, "_class_name": "FluxTransformer2DModel"})
    return layouts.to_original(rows, state)


def write_form(form: str, state: dict, path: Path) -> Path:
    import numpy as np
    import torch

    from app.core.checkpoint import write_safetensors

    def matrix(name: str, tensor) -> bool:
        return name.endswith(".weight") and tensor.ndim >= 2

    if form in ("bf16", "fp16"):
        dtype = torch.bfloat16 if form == "bf16" else torch.float16
        return write_safetensors(path, {k: v.to(dtype) for k, v in state.items()})
    if form == "nvfp4":
        out = {}
        for name, tensor in state.items():
            if matrix(name, tensor) and tensor.ndim == 2 and tensor.shape[1] % 16 == 0:
                out.update(nvfp4_layer(name, tensor))
            else:
                out[name] = tensor.to(torch.bfloat16)
        return write_safetensors(path, out)
    if form == "int8_convrot":
        return write_safetensors(path, int8_convrot_layers(state))
    if form.startswith("fp8"):
        out = {}
        for name, tensor in state.items():
            if not matrix(name, tensor):
                out[name] = tensor.to(torch.bfloat16)
            elif form == "fp8":
                out[name] = tensor.to(torch.float8_e4m3fn)
            else:
                scale = (tensor.abs().max() / 448).reshape(())
                out[name] = (tensor / scale).to(torch.float8_e4m3fn)
                out[name.removesuffix("weight") + "scale_weight"] = scale
        if form == "fp8_scaled":
            out["scaled_fp8"] = torch.empty(0, dtype=torch.float8_e4m3fn)
        return write_safetensors(path, out)
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import quantize

    kind = GGMLQuantizationType[form.removeprefix("gguf_")]
    writer = GGUFWriter(path, "flux")
    for name, tensor in state.items():
        values = tensor.numpy()
        if not matrix(name, tensor):
            writer.add_tensor(name, values.astype(np.float32))
        elif kind == GGMLQuantizationType.F16:
            writer.add_tensor(name, values.astype(np.float16))
        else:
            writer.add_tensor(name, quantize(values, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def int8_convrot_layers(state: dict, group: int = 256) -> dict:
    """The matrices whose rows divide into groups of `group` as int8 ConvRot, quantised by
    comfy-kitchen (as ComfyUI's templates' files are made), the rest bf16; each layer's
    `comfy_quant` config saying so as ComfyUI reads it."""
    import json

    import torch
    from comfy_kitchen.backends.eager.quantization import quantize_int8_convrot_weight

    config = {"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": group}
    raw = torch.tensor(list(json.dumps(config).encode()), dtype=torch.uint8)
    out = {}
    for name, tensor in state.items():
        if name.endswith(".weight") and tensor.ndim == 2 and tensor.shape[1] % group == 0:
            layer = name.removesuffix(".weight")
            out[name], out[f"{layer}.weight_scale"] = quantize_int8_convrot_weight(
                tensor.float(), group
            )
            out[f"{layer}.comfy_quant"] = raw
        else:
            out[name] = tensor.to(torch.bfloat16)
    return out


# E2M1's magnitudes and the midpoints between them: a value's nearest code is the number of
# midpoints below its magnitude.
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def nvfp4_layer(name: str, weight) -> dict:
    """One matrix in NVFP4 as NVIDIA ModelOpt (and BFL) write it: two E2M1 codes per byte (the
    even value in the low nibble), an fp8 e4m3 scale per 16 values of a row, in row order, and
    the tensor's fp32 scale (its largest value over 448 x 6)."""
    import torch

    rows, columns = weight.shape
    values = weight.float().reshape(rows, columns // 16, 16)
    second = (values.abs().max() / (448 * 6)).clamp_min(1e-12)
    blocks = (values.abs().amax(-1) / 6 / second).to(torch.float8_e4m3fn)
    scale = blocks.float() * second
    scaled = values / torch.where(scale > 0, scale, 1.0)[..., None]
    codes = torch.bucketize(scaled.abs(), torch.tensor(_E2M1_MIDPOINTS)).to(torch.uint8)
    codes = (codes | ((scaled < 0).to(torch.uint8) << 3)).reshape(rows, columns)
    layer = name.removesuffix("weight")
    return {
        name: codes[:, 0::2] | (codes[:, 1::2] << 4),
        layer + "weight_scale": blocks,
        layer + "weight_scale_2": second.reshape(()),
        layer + "input_scale": torch.tensor(1.0),
    }


def build_files(root: Path) -> dict[str, Path]:
    from tests.support.model_files import save_split_files
    from tests.support.tiny_models import build_tiny_flux_pipeline

    written = save_split_files(build_tiny_flux_pipeline(), root / "companions")
    written["transformer"].unlink()
    state = random_bfl_state()
    files = {}
    for form in FORMS:
        folder = root / form / "diffusion_models"
        folder.mkdir(parents=True)
        for part in ("text_encoders", "vae"):
            os.symlink(root / "companions" / part, root / form / part)
        suffix = ".gguf" if form.startswith("gguf") else ".safetensors"
        with status(f"writing the {form} transformer"):
            files[form] = write_form(form, state, folder / f"flux-mid-{form}{suffix}")
    return files


def load_once(path: Path) -> tuple[float, int, int, str]:
    """Seconds of one `load_model`, and the loaded transformer's parameters, bytes, dtype."""
    from app.core import models

    gc.collect()
    started = time.perf_counter()
    model = models.load_model(str(path))
    seconds = time.perf_counter() - started
    weights = list(model.pipeline.transformer.parameters())
    count = sum(p.numel() for p in weights)
    nbytes = sum(p.numel() * p.element_size() for p in weights)
    dtype = str(weights[0].dtype).removeprefix("torch.")
    del model, weights
    gc.collect()
    return seconds, count, nbytes, dtype


def read_once(path: Path) -> float:
    from app.core.checkpoint import scan_weights

    started = time.perf_counter()
    scan_weights(path)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="halfsafe-quant-bench-") as scratch:
        root = Path(scratch)
        os.environ.setdefault("HALFSAFE_CACHE_DIR", str(root / "cache"))
        files = build_files(root)
        with status("first loads (hash and identity digest, cached afterwards)"):
            for path in files.values():
                load_once(path)
        times: dict[str, list[float]] = {f: [] for f in FORMS}
        reads: dict[str, list[float]] = {f: [] for f in FORMS}
        held: dict[str, tuple[int, str]] = {}
        parameters = 0
        for run in range(args.runs):
            with status(f"run {run + 1} of {args.runs}"):
                for form in FORMS:
                    reads[form].append(read_once(files[form]))
                    seconds, parameters, nbytes, dtype = load_once(files[form])
                    times[form].append(seconds)
                    held[form] = (nbytes, dtype)
        sizes = {form: files[form].stat().st_size for form in FORMS}

    described = machine("cpu")
    read_bf16 = min(reads["bf16"])
    rows = [
        f"{machine_line(described)}",
        f"Flux-shaped transformer, {parameters / 1e6:.0f}M parameters, as split files "
        f"({args.runs} runs, warm; min / median)",
        "| stored as | file | read every tensor | vs bf16 (min) | load_model | weights held |",
        "|---|---|---|---|---|---|",
    ]
    document = {"machine": described, "parameters": parameters, "forms": {}}
    for form in FORMS:
        nbytes, dtype = held[form]
        rows.append(
            f"| {form} | {sizes[form] / 2**20:.0f} MiB | {min(reads[form]):.2f} / "
            f"{statistics.median(reads[form]):.2f} s | {min(reads[form]) / read_bf16:.1f}x | "
            f"{min(times[form]):.2f} / {statistics.median(times[form]):.2f} s | "
            f"{nbytes / 2**20:.0f} MiB {dtype} |"
        )
        document["forms"][form] = {
            "file_bytes": sizes[form],
            "read_seconds": reads[form],
            "load_seconds": times[form],
            "weights_bytes": nbytes,
            "weights_dtype": dtype,
        }
    emit(document, "\n".join(rows), args.json)


if __name__ == "__main__":
    main()
