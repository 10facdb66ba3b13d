"""Run by ComfyUI's Python (not HalfSafe's): HalfSafe Fix's layers kept wider against a LoRA that
changes between jobs, on ComfyUI's own ModelPatcher and loader (the standard patcher, which
merges a LoRA into the shared model's weights in place), and prints each job's weight in the
layer kept wider as one JSON object on the last line.

    python drive_island_lora.py COMFYUI_FOLDER NODE_PACKAGE_FOLDER

The model: one fp16 linear layer, the identity; the LoRA adds 1 to every weight, at a strength
each job sets. The off-diagonal weight a job runs is its LoRA's strength (0 without one)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import drive  # beside this file: ComfyUI's start on a CPU, the package loader


def main() -> None:
    comfy_folder, package_folder = (Path(a) for a in sys.argv[1:3])
    drive.start_comfy(comfy_folder)
    import comfy.model_management as mm
    import comfy.model_patcher
    import comfy.ops
    import torch

    drive.load_package(package_folder)
    host = sys.modules["comfyui_halfsafe.host"]

    class Base(torch.nn.Module):
        def __init__(self):
            super().__init__()
            linear = comfy.ops.disable_weight_init.Linear(4, 4, bias=False, dtype=torch.float16)
            self.diffusion_model = torch.nn.Sequential(linear)
            with torch.no_grad():
                linear.weight.copy_(torch.eye(4))
            mm.archive_model_dtypes(self.diffusion_model)

        def get_dtype(self):
            return torch.float16

    cpu = torch.device("cpu")
    base = comfy.model_patcher.ModelPatcher(Base(), cpu, cpu)
    key = "diffusion_model.0.weight"

    def with_lora(strength: float):
        clone = base.clone()
        clone.add_patches({key: (torch.ones(4, 4, dtype=torch.float16),)}, strength)
        return clone

    def fixed(model):
        clone = model.clone()
        host.apply_islands(clone, {"0": "fp32"})
        return clone

    def ran(model) -> float:
        mm.load_models_gpu([model])
        return base.model.diffusion_model[0].weight[0, 1].item()

    # Each job's model is made after the job before it ran, as a queue runs a workflow again.
    jobs = {
        "fix, LoRA 1.0": lambda: fixed(with_lora(1.0)),
        "fix, LoRA 0.5": lambda: fixed(with_lora(0.5)),
        "fix, no LoRA": lambda: fixed(base),
        "no fix, LoRA 1.0": lambda: with_lora(1.0),
        "fix again, no LoRA": lambda: fixed(base),
        "plain after": base.clone,
    }
    found = {name: ran(made()) for name, made in jobs.items()}
    print(json.dumps(found))


if __name__ == "__main__":
    main()
