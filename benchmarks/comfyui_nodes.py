"""HalfSafe's ComfyUI nodes on a full-size SD1.5 UNet (random weights at the published shapes,
stored in fp16, one attention query planted past fp16's range), loaded by ComfyUI's own
diffusion-model loader and computed in fp16 as ComfyUI does on a GPU. Measured side by side in
one run: the Check node's time and work (the diffusion model's calls by dtype, the layers
copied), the most memory copies of the model's weights held at once during the check, what
HalfSafe Fix holds (its islands) against the model's own weights, one denoiser call plain and
fixed, and the fixed call against fp32.

Runs in ComfyUI's Python (the nodes run there), not HalfSafe's:

    COMFYUI_PYTHON benchmarks/comfyui_nodes.py COMFYUI_FOLDER [--work DIR] [--size PX]
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "comfyui"))  # the drivers' ComfyUI start and loaders

import drive  # noqa: E402

# SD1.5's UNet as ComfyUI's detection reads it from the published checkpoint.
SD15 = {
    **drive.TINY_SD1,
    "num_res_blocks": [2, 2, 2, 2],
    "transformer_depth": [1, 1, 1, 1, 1, 1, 0, 0],
    "channel_mult": [1, 2, 4, 4],
    "transformer_depth_output": [1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0],
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("comfyui")
    parser.add_argument("--work", default=None)
    parser.add_argument("--size", type=int, default=128)
    options = parser.parse_args()
    work = Path(options.work or tempfile.mkdtemp(prefix="halfsafe-comfyui-bench-"))
    size = options.size
    drive.start_comfy(Path(options.comfyui))
    import comfy.sd
    import torch

    copies_module = drive.load_module(
        "parameter_copies", ROOT / "tests" / "support" / "parameter_copies.py"
    )
    path = drive.write_tiny_unet(work / "sd15_unet_planted.safetensors", SD15)
    model = comfy.sd.load_diffusion_model(str(path))
    nodes = drive.load_package(ROOT / "comfyui-halfsafe").NODE_CLASS_MAPPINGS
    # HalfSafe's core is found once the package is loaded (ComfyUI has an `app` of its own).
    from app.core.fixing.module_check import reference_call
    from app.core.fixing.quality import compare

    host = sys.modules["comfyui_halfsafe.host"]
    checking = importlib.import_module("comfyui_halfsafe.checking")
    denoiser = model.model.diffusion_model
    found: dict = {
        "machine": f"{platform.processor() or platform.machine()}, torch {torch.__version__}",
        "threads": torch.get_num_threads(),
        "size": size,
        "parameters": sum(p.numel() for p in denoiser.parameters()),
        "stored_bytes": sum(p.numel() * p.element_size() for p in denoiser.parameters()),
    }

    started = time.perf_counter()
    with copies_module.ParameterCopies(denoiser) as copies:
        outcome = checking.check(model, size, size, 20, 0)
    found["check"] = {
        "seconds": round(time.perf_counter() - started, 1),
        "verdict": outcome.verdict,
        "work": outcome.work.counts(),
        "copies_peak_bytes": copies.peak_bytes,
        "fix": outcome.fix and outcome.fix.get("summary"),
    }
    fixed = nodes["HalfSafeFix"]().fix(model, outcome.fix)[0]
    islands = [o for o in fixed.object_patches.values() if isinstance(o, torch.nn.Module)]
    found["fix"] = {
        "island_bytes": sum(p.numel() * p.element_size() for i in islands for p in i.parameters()),
    }
    call = host.one_call(model.clone(), size, size, 20, 0)
    seconds = {}
    for name, patcher in (("plain", model), ("fixed", fixed)):
        host.run_call(patcher, call)  # warm
        started = time.perf_counter()
        output = host.run_call(patcher, call)
        seconds[name] = round(time.perf_counter() - started, 2)
        found["fix"][f"{name}_finite"] = bool(torch.isfinite(output).all())
        if name == "fixed":
            reference = reference_call(denoiser, call.args, call.kwargs).output
            found["fix"]["fixed_db"] = round(compare(output, reference).value, 1)
    found["fix"]["call_seconds"] = seconds
    found["peak_rss_gb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)
    print(json.dumps(found, indent=1))


if __name__ == "__main__":
    main()
