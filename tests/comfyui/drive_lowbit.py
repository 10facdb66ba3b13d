"""Run by ComfyUI's Python (not HalfSafe's): drives the real ComfyUI in process on a CPU with the
tiny planted SD1 UNet of drive.py saved in the low-bit layouts ComfyUI loads (scaled fp8 as
older files hold it, fp8 and int8 with a per-tensor `weight_scale`, int8 ConvRot with per-row
scales on Hadamard-rotated weights), each loaded by ComfyUI's own loader, and prints what the
nodes did as one JSON object on the last line.

    python drive_lowbit.py COMFYUI_FOLDER NODE_PACKAGE_FOLDER WORK_FOLDER

The Linear weights of the transformer blocks are stored low-bit, the rest in fp16, as released
files keep their embeddings and convolutions wide. The writer and `own_weight`, which reads a
layer's weight back from the file's tensors, follow the layouts as ComfyUI's loader reads them
(comfy/utils.py's `convert_old_quants`, comfy/ops.py's `_load_quantized_module`); neither calls
ComfyUI or comfy-kitchen, so a layout read another way by them shows as a difference. As in
drive.py, ComfyUI is made to compute in fp16 on the CPU as it does on a GPU."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import drive  # beside this file: ComfyUI's start on a CPU, the tiny UNet, the package loader

FORMATS = ("scaled_fp8", "fp8", "int8", "int8_convrot")
LOW_BIT = "transformer_blocks."  # the Linear weights under these are stored low-bit
GROUP = 64  # ConvRot's rotation group: a power of 4 that divides every width of the UNet
SIZE = 64
ATTENTION_OUT = drive.PLANTED.replace("to_q", "to_out.0")  # a low-bit Linear with a bias


def hadamard(size: int):
    """The normalised regular Hadamard matrix ConvRot rotates by (symmetric, its own inverse):
    Kronecker powers of the 4x4 one, over sqrt(size)."""
    import torch

    four = torch.tensor(
        [[1, 1, 1, -1], [1, 1, -1, 1], [1, -1, 1, 1], [-1, 1, 1, 1]], dtype=torch.float32
    )
    h = four
    while h.shape[0] < size:
        h = torch.kron(h, four)
    assert h.shape[0] == size, size
    return h / math.sqrt(size)


def rotated(weight):
    """`weight` [out, in] with each group of GROUP inputs multiplied by the Hadamard matrix."""
    out_f, in_f = weight.shape
    grouped = weight.reshape(out_f, in_f // GROUP, GROUP)
    return (grouped @ hadamard(GROUP)).reshape(out_f, in_f)


def quantized(weight, fmt: str) -> tuple[dict, dict | None]:
    """The file's tensors for one Linear weight (suffix after the layer's name -> tensor) and
    its `comfy_quant` layer config (None for the old scaled-fp8 layout)."""
    import torch

    w = weight.float()
    if fmt in ("scaled_fp8", "fp8"):
        scale = w.abs().amax() / torch.finfo(torch.float8_e4m3fn).max
        q = (w / scale).to(torch.float8_e4m3fn)
        key = "scale_weight" if fmt == "scaled_fp8" else "weight_scale"
        return {"weight": q, key: scale.reshape(())}, (
            None if fmt == "scaled_fp8" else {"format": "float8_e4m3fn"}
        )
    if fmt == "int8":
        scale = w.abs().amax() / 127.0
        q = torch.round(w / scale).clamp(-127, 127).to(torch.int8)
        return {"weight": q, "weight_scale": scale.reshape(())}, {"format": "int8_tensorwise"}
    if fmt == "int8_convrot":
        r = rotated(w)
        scale = r.abs().amax(dim=1, keepdim=True) / 127.0
        q = torch.round(r / scale).clamp(-127, 127).to(torch.int8)
        conf = {"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": GROUP}
        return {"weight": q, "weight_scale": scale}, conf
    raise ValueError(fmt)


def write_lowbit(fp16: dict, fmt: str, path: Path) -> dict:
    """The UNet `fp16` (ComfyUI's names, no prefix) saved at `path` in `fmt`; its tensors."""
    import torch
    from safetensors.torch import save_file

    tensors: dict = {}
    for key, value in fp16.items():
        layer = key.removesuffix(".weight")
        if LOW_BIT in key and key.endswith(".weight") and value.ndim == 2:
            stored, conf = quantized(value, fmt)
            tensors.update({f"{layer}.{suffix}": t for suffix, t in stored.items()})
            if conf is not None:
                data = list(json.dumps(conf).encode())
                tensors[f"{layer}.comfy_quant"] = torch.tensor(data, dtype=torch.uint8)
        else:
            tensors[key] = value
    if fmt == "scaled_fp8":
        tensors["scaled_fp8"] = torch.empty(0, dtype=torch.float8_e4m3fn)
    save_file(tensors, str(path))
    return tensors


def own_weight(tensors: dict, layer: str, fmt: str):
    """The fp32 weight of `layer` read back from the file's tensors: the stored values times
    their scale, ConvRot's rotation undone."""
    q = tensors[f"{layer}.weight"].float()
    if fmt == "scaled_fp8":
        return q * tensors[f"{layer}.scale_weight"]
    w = q * tensors[f"{layer}.weight_scale"]
    return rotated(w) if fmt == "int8_convrot" else w


def relative_error(value, expected) -> float:
    return float((value.float() - expected).abs().max() / expected.abs().max())


def island_of_one_layer(host, model, tensors: dict, fmt: str, layer: str) -> dict:
    """The island copy of one low-bit Linear alone, in fp32 and bf16, against that layer
    computed from the file's tensors in the same dtype."""
    import torch
    import torch.nn.functional as F  # noqa: N812

    weight = own_weight(tensors, layer, fmt)
    bias = tensors.get(f"{layer}.bias")
    x = torch.randn(2, 16, weight.shape[1], generator=torch.Generator().manual_seed(1))
    found: dict = {"bias": bias is not None}
    for dtype, wide in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        clone = model.clone()
        host.apply_islands(clone, {layer: dtype})
        island = clone.object_patches[f"{host.PREFIX}.{layer}"]
        with torch.no_grad():
            got = island(x)
            b = None if bias is None else bias.to(wide)
            want = F.linear(x.to(wide), weight.to(wide), b).float()
        found[dtype] = {
            "kind": f"{type(island).__module__}.{type(island).__name__}",
            "weights": sorted({f"{type(p).__name__} {p.dtype}" for p in island.parameters()}),
            "error": relative_error(got, want),
            "out_dtype": str(got.dtype),
        }
    return found


def stored_layers(denoiser, quantized_class) -> dict[str, tuple[int, int]]:
    """Each module holding a quantized weight -> that module's id and its weight's storage."""
    return {
        name: (id(module), module._parameters["weight"].data_ptr())
        for name, module in denoiser.named_modules()
        if isinstance(module._parameters.get("weight"), quantized_class)
    }


def lowbit_model(nodes, host, model, tensors: dict, fmt: str) -> dict:
    """Check and fix one low-bit model; the island of its planted layer against the file."""
    from comfy.quant_ops import QuantizedTensor

    from app.core.fixing.module_check import reference_call
    from app.core.fixing.quality import compare

    denoiser = host.diffusion_model(model)
    stored = stored_layers(denoiser, QuantizedTensor)
    before = drive.weights_digest(model)
    found: dict = {
        "precision": host.precision(model),
        "quantized": len(stored),
        "planted_quantized": drive.PLANTED in stored,
        "islands": {
            layer: island_of_one_layer(host, model, tensors, fmt, layer)
            for layer in (drive.PLANTED, ATTENTION_OUT)
        },
    }
    text, _, fix = nodes["HalfSafeCheck"]().check(model, SIZE, SIZE, 4, 0)["result"]
    found["check"] = {"text": text, "fix": fix}
    if not fix or not fix.get("islands"):
        return found
    fixed, said = nodes["HalfSafeFix"]().fix(model, fix)[:2]
    call = host.one_call(model.clone(), SIZE, SIZE, 4, 0)
    patched = host.run_call(fixed, call)
    # Loaded with the fix (its object patches put in place): the islands there, every other
    # low-bit layer the one stored, its quantized weight the same storage.
    islands = list(fix["islands"])
    outside = {n: i for n, i in stored.items() if not any(n.startswith(p + ".") for p in islands)}
    kept = stored_layers(host.diffusion_model(fixed), QuantizedTensor)
    # The model loaded without the fix (its patches taken off again) gives the fp32 reference.
    original = host.run_call(model, call)
    reference = reference_call(denoiser, call.args, call.kwargs).output
    patches = dict(fixed.object_patches)
    island_layers = [denoiser.get_submodule(p) for p in islands]
    found["fix"] = {
        "said": said,
        "fixed_finite": drive.finite(patched),
        "fixed_db": compare(patched, reference).value,
        "original_finite": drive.finite(original),
        "patches": sorted(patches),
        "patch_weights": sorted(
            {f"{type(p).__name__} {p.dtype}" for m in patches.values() for p in m.parameters()}
        ),
        "patch_params": sum(p.numel() for m in patches.values() for p in m.parameters()),
        "island_params": sum(p.numel() for m in island_layers for p in m.parameters()),
        "model_params": sum(p.numel() for p in denoiser.parameters()),
        "outside": len(outside),
        "outside_kept": all(kept.get(n) == i for n, i in outside.items()),
    }
    found["untouched"] = model.object_patches == {} and drive.weights_digest(model) == before
    return found


def odd_layout(host) -> str:
    """What the nodes say for a layer whose weight is a tensor kind they cannot dequantize (a
    custom node's own packed tensor, as GGUF's loader makes)."""
    import torch

    class Packed(torch.Tensor):
        pass

    layer = torch.nn.Linear(4, 4)
    layer.weight = torch.nn.Parameter(torch.zeros(4, 4).as_subclass(Packed), requires_grad=False)
    try:
        host.dequantized_layer(layer, torch.float32)
    except host.NodeProblem as problem:
        return str(problem)
    return ""


def main() -> None:
    comfy_folder, package_folder, work = (Path(a) for a in sys.argv[1:4])
    drive.start_comfy(comfy_folder)
    import comfy.sd
    from safetensors.torch import load_file

    package = drive.load_package(package_folder)
    nodes = package.NODE_CLASS_MAPPINGS
    host = sys.modules["comfyui_halfsafe.host"]
    unet = load_file(str(drive.write_tiny_unet(work / "tiny_sd1_unet.safetensors")))
    fp16 = {k.removeprefix("model.diffusion_model."): v for k, v in unet.items()}
    found: dict = {}
    for fmt in FORMATS:
        path = work / f"tiny_sd1_{fmt}.safetensors"
        tensors = write_lowbit(fp16, fmt, path)
        model = comfy.sd.load_diffusion_model(str(path))
        began = time.perf_counter()
        found[fmt] = lowbit_model(nodes, host, model, tensors, fmt)
        found[fmt]["seconds"] = round(time.perf_counter() - began, 1)
    found["odd_layout"] = odd_layout(host)
    print(json.dumps(found))


if __name__ == "__main__":
    main()
