"""Quantized weights kept as stored against dequantised on load, at Flux.1's width: what the
transformer holds once loaded, what the check's copies hold on the device, and what one fp32
call (the check's reference) costs in memory and time, side by side in one run.

The transformer is Flux.1 dev's width (3072 wide, 24 heads of 128, T5-XXL's 4096-wide text
input, CLIP-L's 768 pooled) at a reduced depth (2 double and 4 single blocks of its 19 and 38),
with random weights, written as users keep it: fp8 e4m3 scaled (ComfyUI's `scale_weight`),
NVFP4 (as ModelOpt and BFL write it), GGUF Q8_0 and GGUF Q4_0 (matrices block-quantised, the rest
F32) and int8 ConvRot (comfy-kitchen's quantiser, groups of 256, as ComfyUI's templates ship it).
Memory does
not depend on the values. Each file is read by HalfSafe's own transformer loader (the reader,
the layout's key table, the assignment), without companions.

Two ways per form:
- "as stored" is HalfSafe now: quantized weights stay in the file's bytes and each operation
  decodes the values it reads (`StoredTensor`);
- "dequantised" is HalfSafe before: every quantized weight decoded to bf16 as it was read (the
  same loaded model with its weights decoded, the values are identical).

Figures per way: the transformer's bytes once loaded, the RAM peak of the load; the device peak
of the check's placements for a failing transformer (the fp16 probe, the fp32 reference, two
layers in fp32, the transformer in bf16 and in fp32: `PlacedPipeline.peak_bytes`, what a GPU
would hold of the weights, counted the same way on a CPU); and one fp32 transformer call at
`--size` px (its RAM peak including the placed copy, its time, and whether both ways give the
same output). From the measured bytes per block, the whole model (19 + 38 blocks) is projected.

Usage: python benchmarks/stored_memory.py [--forms fp8_scaled,nvfp4,gguf_Q8_0,gguf_Q4_0,int8_convrot]
       [--size 256]
       [--json FILE]
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from common import PeakMemory, emit, machine, machine_line, names, status
from quantized_load import random_bfl_state, write_form

FORMS = ("fp8_scaled", "nvfp4", "gguf_Q8_0", "gguf_Q4_0", "int8_convrot")
GIB = 2**30
# Flux.1 dev's depth, for the projection.
FULL_DOUBLE, FULL_SINGLE = 19, 38
DOUBLE, SINGLE = 2, 4
ISLANDS = ("transformer_blocks.0.ff.net.2", "single_transformer_blocks.0.proj_out")


def transformer_config() -> dict:
    return {
        "patch_size": 1,
        "in_channels": 64,
        "num_layers": DOUBLE,
        "num_single_layers": SINGLE,
        "attention_head_dim": 128,
        "num_attention_heads": 24,
        "joint_attention_dim": 4096,
        "pooled_projection_dim": 768,
        "guidance_embeds": True,
        "axes_dims_rope": (16, 56, 56),
    }


def load(path: Path):
    """The transformer as HalfSafe's loader reads it (the split-file loader's own function)."""
    from app.core.checkpoint import Checkpoint
    from app.core.models import split
    from app.core.models.transformer_files import _split_transformer

    with Checkpoint(path) as checkpoint:
        model = split.read_model(checkpoint.shapes, path.name)
        return _split_transformer(path, checkpoint, model)


def dequantised(transformer):
    """The same model with every weight kept as stored decoded to bf16, as loading did before."""
    import torch

    from app.core.checkpoint.stored import StoredTensor

    for module in transformer.modules():
        for name, tensor in list(module.named_parameters(recurse=False)):
            if isinstance(tensor, StoredTensor):
                setattr(module, name, torch.nn.Parameter(tensor.decoded(), requires_grad=False))
    return transformer


def block_bytes(transformer) -> dict[str, int]:
    from app.core.precision.placement import tensor_bytes

    return {
        "double": tensor_bytes(transformer.transformer_blocks[0]),
        "single": tensor_bytes(transformer.single_transformer_blocks[0]),
        "all": tensor_bytes(transformer),
    }


def placements(transformer, budget_mb: float | None = None):
    """The check's placements of a failing transformer, in order, under `budget_mb`: the
    device peak, each step's bytes, and how the transformer was last streamed (None: placed
    whole)."""
    from app.core.precision import PrecisionPlan, placement

    fp16 = PrecisionPlan(device="cpu", dtypes={"transformer": "fp16"}, memory_budget_mb=budget_mb)
    steps = [
        ("first probe (fp16)", fp16),
        ("fp32 reference", fp16.with_dtypes(transformer="fp32")),
        ("2 layers in fp32", fp16.with_modules("transformer", dict.fromkeys(ISLANDS, "fp32"))),
        ("transformer in bf16", fp16.with_dtypes(transformer="bf16")),
        ("transformer in fp32", fp16.with_dtypes(transformer="fp32")),
    ]
    source = SimpleNamespace(transformer=transformer)
    placed = placement.PlacedPipeline(source, fp16, components=())
    held = []
    for words, plan in steps:
        placed.apply(plan, ["transformer"])
        held.append((words, placed.placed_bytes))
    peak = placed.peak_bytes
    streamed = placed.streamed.get("transformer")
    placed.release()
    return peak, held, streamed


def flux_inputs(size: int) -> dict:
    """One transformer call's inputs at `size` px (64 text tokens), the same every run."""
    import torch

    tokens = (size // 16) ** 2
    generator = torch.Generator().manual_seed(0)
    return {
        "hidden_states": torch.randn(1, tokens, 64, generator=generator),
        "encoder_hidden_states": torch.randn(1, 64, 4096, generator=generator),
        "pooled_projections": torch.randn(1, 768, generator=generator),
        "timestep": torch.tensor([0.5]),
        "guidance": torch.tensor([3.5]),
        "img_ids": torch.zeros(tokens, 3),
        "txt_ids": torch.zeros(64, 3),
    }


def written_forms(root: Path, forms: list[str]) -> tuple[dict[str, Path], int]:
    """The random Flux.1-width transformer written in each form under `root`: the files and
    its parameter count."""
    with status("random weights at Flux.1's width"):
        state = random_bfl_state(transformer_config())
    files = {}
    for form in forms:
        suffix = ".gguf" if form.startswith("gguf") else ".safetensors"
        with status(f"writing the {form} transformer"):
            files[form] = write_form(form, state, root / f"flux-width-{form}{suffix}")
    parameters = sum(t.numel() for t in state.values())
    del state
    gc.collect()
    return files, parameters


def call(transformer, size: int, budget_mb: float | None = None):
    """One fp32 call from a placement under `budget_mb`: (RAM peak MiB, seconds, output)."""
    import torch

    from app.core.precision import PrecisionPlan, placement

    inputs = flux_inputs(size)
    plan = PrecisionPlan(device="cpu", dtypes={"transformer": "fp32"}, memory_budget_mb=budget_mb)
    with PeakMemory("cpu") as ram, torch.inference_mode():
        placed = placement.PlacedPipeline(SimpleNamespace(transformer=transformer), plan)
        started = time.perf_counter()
        output = placed["transformer"](**inputs).sample
        seconds = time.perf_counter() - started
        placed.release()
    return ram.mib, seconds, output


def measure(path: Path, size: int) -> dict:
    import torch

    results = {}
    outputs = {}
    for way in ("as stored", "dequantised"):
        gc.collect()
        with status(f"{path.name}: {way}"), PeakMemory("cpu") as ram:
            transformer = load(path)
            if way == "dequantised":
                transformer = dequantised(transformer)
        held = block_bytes(transformer)
        peak, steps, _ = placements(transformer)
        call_mib, seconds, outputs[way] = call(transformer, size)
        results[way] = {
            "load_ram_mib": ram.mib,
            "held": held,
            "device_peak": peak,
            "steps": steps,
            "call_ram_mib": call_mib,
            "call_seconds": round(seconds, 2),
        }
        del transformer
    same = bool(torch.equal(outputs["as stored"], outputs["dequantised"]))
    return {"file_bytes": path.stat().st_size, "ways": results, "identical": same}


def projected(held: dict[str, int]) -> int:
    """The whole model's bytes from the measured blocks (the rest is the measured remainder)."""
    rest = held["all"] - DOUBLE * held["double"] - SINGLE * held["single"]
    return rest + FULL_DOUBLE * held["double"] + FULL_SINGLE * held["single"]


def run(args) -> dict:
    forms = names(args.forms, FORMS)
    document = {"machine": machine("cpu"), "size": args.size, "forms": {}}
    with tempfile.TemporaryDirectory(prefix="halfsafe-stored-bench-") as scratch:
        files, document["parameters"] = written_forms(Path(scratch), forms)
        for form in forms:
            document["forms"][form] = measure(files[form], args.size)
    return document


def table(document: dict) -> str:
    lines = [
        machine_line(document["machine"]),
        f"Flux.1-width transformer, {DOUBLE} double + {SINGLE} single blocks "
        f"({document['parameters'] / 1e9:.2f}B parameters); one fp32 call at {document['size']} px",
        "",
        "| file | way | held once loaded | load RAM peak | check's device peak | fp32 call: "
        "RAM peak, time | whole Flux.1 dev held (projected) |",
        "|---|---|---|---|---|---|---|",
    ]
    for form, result in document["forms"].items():
        for way, figures in result["ways"].items():
            lines.append(
                f"| {form} ({result['file_bytes'] / GIB:.2f} GiB) | {way} | "
                f"{figures['held']['all'] / GIB:.2f} GiB | {figures['load_ram_mib'] or 0:.0f} MiB | "
                f"{figures['device_peak'] / GIB:.2f} GiB | "
                f"{figures['call_ram_mib'] or 0:.0f} MiB, {figures['call_seconds']} s | "
                f"{projected(figures['held']) / GIB:.1f} GiB |"
            )
        outcome = "identical" if result["identical"] else "DIFFERENT"
        lines.append(f"| | outputs of the two ways: {outcome} | | | | | |")
    lines.append("")
    lines.append("Device GiB held after each of the check's placements (first form):")
    lines.extend(placement_lines(next(iter(document["forms"].values())), "step", 14))
    return "\n".join(lines)


def placement_lines(result: dict, heading: str, width: int) -> list[str]:
    """One form's device GiB held after each placement of the check, a column per way."""
    ways = list(result["ways"])
    lines = [f"  {heading:<24}" + "".join(f"{w:>{width}}" for w in ways)]
    for index, (step, _) in enumerate(result["ways"][ways[0]]["steps"]):
        held = [result["ways"][w]["steps"][index][1] / GIB for w in ways]
        lines.append(f"  {step:<24}" + "".join(f"{h:>{width}.2f}" for h in held))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--forms", help=f"comma-separated, of {', '.join(FORMS)}")
    parser.add_argument("--size", type=int, default=256, help="the fp32 call's size in px")
    parser.add_argument("--json")
    args = parser.parse_args()
    document = run(args)
    emit(document, table(document), args.json)


if __name__ == "__main__":
    main()
