"""Run by ComfyUI's Python (not HalfSafe's): drives the real ComfyUI in process on a CPU with two
tiny transformer files of one family (one planted, one healthy, written by the test), loaded by
ComfyUI's own loader, and prints what the nodes did as one JSON object on the last line.

    python drive_dit.py COMFYUI_FOLDER NODE_PACKAGE_FOLDER PLANTED_FILE HEALTHY_FILE [--watch]

No CLIP is connected: the check runs on zeros of the text widths the model's config gives. As
in drive.py, ComfyUI is made to compute in fp16 on the CPU as it does on a GPU."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import drive  # beside this file: ComfyUI's start on a CPU, the package loader, the watch

SIZE = 64  # the check's picture: 64x64 pixels


def planted_model(nodes, host, model) -> dict:
    """Check and fix the planted model, each call measured against an fp32 reference of it;
    the MODEL passed in must come out as it went in."""
    from app.core.fixing.module_check import reference_call
    from app.core.fixing.quality import compare

    before = drive.weights_digest(model)
    text, image, fix = nodes["HalfSafeCheck"]().check(model, SIZE, SIZE, 4, 0)["result"]
    found: dict = {"precision": host.precision(model)}
    found["check"] = {"text": text, "fix": fix, "image": list(image.shape)}
    fixed, said = nodes["HalfSafeFix"]().fix(model, fix)[:2]
    call = host.one_call(model.clone(), SIZE, SIZE, 4, 0)
    reference = reference_call(host.diffusion_model(model), call.args, call.kwargs).output
    patched, original = host.run_call(fixed, call), host.run_call(model, call)
    found["fix"] = {
        "said": said,
        "fixed_finite": drive.finite(patched),
        "fixed_db": compare(patched, reference).value,
        "original_finite": drive.finite(original),
        "original_db": compare(original, reference).value,
        "patches": sorted(fixed.object_patches),
    }
    found["clamp_calls"] = clamp_calls(host, model, fix)
    found["untouched"] = model.object_patches == {} and drive.weights_digest(model) == before
    return found


def clamp_calls(host, model, fix) -> int:
    """How often a clamp on the planted layer's block's first linear layer held its output in
    one KSampler step of a clone: the clamp's hook must run in every family's model code."""
    import nodes as comfy_nodes

    clamped = model.clone()
    host.apply_clamps(clamped, [call_layer(host, model, fix)])
    cond, samples = sampler_inputs(host, model)
    held = []
    original = host._clamp

    def counted(module, args, output):
        held.append(module)
        return original(module, args, output)

    host._clamp = counted
    try:
        comfy_nodes.common_ksampler(clamped, 0, 1, 1.0, "euler", "normal", cond, cond, samples)
    finally:
        host._clamp = original
    return len(held)


def call_layer(host, model, fix) -> str:
    """The first linear layer inside the fix's island (the planted one's block)."""
    import torch

    island = next(iter(fix["islands"]))
    block = host.diffusion_model(model).get_submodule(island)
    name = next(n for n, m in block.named_modules() if isinstance(m, torch.nn.Linear))
    return f"{island}.{name}"


def watched(nodes, host, model, fix) -> dict:
    """Three sampler steps of the planted model through ComfyUI's KSampler under the watch,
    with zeros for the text as the check feeds it: without a fix, and with the check's."""
    cond, samples = sampler_inputs(host, model)
    found = drive.watch(nodes, model, cond, samples)
    found.pop("outputs")
    found["with_fix"] = drive.watch(nodes, model, cond, samples, fix)["findings"]
    found["repaired"] = drive.repaired(nodes, model, cond, samples)
    return found


def saturated(nodes, host, model) -> dict:
    """Check a healthy Flux file whose first single block's residual add passes fp16's range
    outside any layer (its second linear layer's output at 60000, finite, times a gate of
    1.5), which ComfyUI's block code turns into 65504: no layer goes non-finite."""
    import torch

    block = host.diffusion_model(model).single_blocks[0]
    hidden = block.linear2.out_features
    with torch.no_grad():
        block.linear2.weight.zero_()
        block.linear2.bias.fill_(60000.0)
        gate = block.modulation.lin
        gate.weight[2 * hidden : 3 * hidden].zero_()
        gate.bias[2 * hidden : 3 * hidden] = 1.5
    text, _, fix = nodes["HalfSafeCheck"]().check(model, SIZE, SIZE, 4, 0)["result"]
    return {"text": text, "fix": fix}


def sampler_inputs(host, model):
    """Zeros for the text, as the check feeds it, and an empty latent: a KSampler's inputs."""
    import torch

    base = model.model
    context, pooled = host.check_text(base)
    cond = [[context, {"pooled_output": pooled} if pooled is not None else {}]]
    shape = host.latent_shape(base, SIZE, SIZE)
    return cond, {"samples": torch.zeros(shape)}


def main() -> None:
    comfy_folder, package_folder, planted, healthy = (Path(a) for a in sys.argv[1:5])
    watch = "--watch" in sys.argv
    drive.start_comfy(comfy_folder)  # sets ComfyUI's own arguments in sys.argv
    import comfy.sd

    package = drive.load_package(package_folder)
    nodes = package.NODE_CLASS_MAPPINGS
    host = sys.modules["comfyui_halfsafe.host"]

    model = comfy.sd.load_diffusion_model(str(planted))
    found = {"model": type(model.model).__name__, **planted_model(nodes, host, model)}
    if watch:
        found["watch"] = watched(nodes, host, model, found["check"]["fix"])
        found["saturated"] = saturated(nodes, host, comfy.sd.load_diffusion_model(str(healthy)))
    sound = comfy.sd.load_diffusion_model(str(healthy))
    text, _, fix = nodes["HalfSafeCheck"]().check(sound, SIZE, SIZE, 4, 0)["result"]
    found["healthy"] = {"text": text, "fix": fix}
    print(json.dumps(found))


if __name__ == "__main__":
    main()
