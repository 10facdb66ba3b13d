"""Run by ComfyUI's Python (not HalfSafe's): drives the real ComfyUI in process on a CPU with a
broken attention kernel and prints what the nodes did as one JSON object on the last line.

    python drive_kernels.py COMFYUI_FOLDER NODE_PACKAGE_FOLDER CHECKPOINT WORK_FOLDER

CHECKPOINT is a tiny single-file SD1 checkpoint with nothing planted, loaded by ComfyUI's own
checkpoint loader. The kernel is installed as a user's broken build is: a function made the way
ComfyUI makes its backends (its `wrap_attn`) put where ComfyUI's attention module dispatches
(`optimized_attention`, `optimized_attention_masked`), returning NaN on every call in every
dtype. Then the working kernel is put back, and drive.py's tiny UNet, one attention query past
fp16's range, is checked. As in drive.py, ComfyUI computes in fp16 on the CPU as on a GPU."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import drive  # beside this file: ComfyUI's start on a CPU, the package loader, the writers

SIZE = 64
BROKEN = "attention_broken_build"


def install_broken_kernel():
    """Put a NaN-returning attention where ComfyUI's attention module dispatches; returns what
    was there, to put back."""
    import comfy.ldm.modules.attention as comfy_attention

    working = (comfy_attention.optimized_attention, comfy_attention.optimized_attention_masked)
    computes = working[0].__wrapped__  # what the working kernel computes, for the shape

    def attention_broken_build(q, k, v, heads, *args, **kwargs):
        return computes(q, k, v, heads, *args, **kwargs) * float("nan")

    broken = comfy_attention.wrap_attn(attention_broken_build)
    comfy_attention.optimized_attention = broken
    comfy_attention.optimized_attention_masked = broken
    return working


def put_back(working) -> None:
    import comfy.ldm.modules.attention as comfy_attention

    comfy_attention.optimized_attention, comfy_attention.optimized_attention_masked = working


def as_the_sampler_calls(host, patched, call):
    """The denoiser call with the patched model's own transformer options merged in, as
    ComfyUI's sampler passes them (`calc_cond_batch`)."""
    import torch

    kwargs = dict(call.kwargs)
    options = patched.model_options.get("transformer_options", {})
    kwargs["transformer_options"] = {**kwargs.get("transformer_options", {}), **options}
    host.load(patched)
    with torch.no_grad():
        return host.diffusion_model(patched)(*call.args, **kwargs)


def fixed(nodes, host, model, fix, call, reference) -> dict:
    """What HalfSafe Fix made of `model` with `fix` (None: the remembered one)."""
    from app.core.fixing.quality import compare

    patched, said = nodes["HalfSafeFix"]().fix(model, fix)[:2]
    output = as_the_sampler_calls(host, patched, call)
    options = patched.model_options.get("transformer_options", {})
    return {
        "said": said,
        "finite": drive.finite(output),
        "db": compare(output, reference).value,
        "object_patches": sorted(patched.object_patches),
        "override": type(options.get("optimized_attention_override")).__name__,
        "compute": str(host.precision(patched)["compute"]),
        "sampled_finite": sampled_finite(patched),
    }


def sampled_finite(model) -> bool:
    """Three steps of ComfyUI's KSampler on `model`, zeros for the text: a finite latent."""
    import nodes as comfy_nodes
    import torch

    cond = [[torch.zeros(1, 77, 768), {}]]
    latent = {"samples": torch.zeros(1, 4, SIZE // 8, SIZE // 8)}
    (out,) = comfy_nodes.common_ksampler(
        model, 0, 3, 1.0, "euler", "normal", cond, cond, latent, denoise=1.0
    )
    return drive.finite(out["samples"])


def watched(nodes, model, fix) -> dict:
    """Three KSampler steps through HalfSafe NaN Watch with `fix` connected: its output and
    what the watch found (nothing, where the fix it put on holds)."""
    (model_watched,) = nodes["HalfSafeNaNWatch"]().watch(model, fix, True)
    state = model_watched.get_wrappers("apply_model", "halfsafe_watch")[0].__self__
    return {
        "sampled_finite": sampled_finite(model_watched),
        "findings": [f.words() for f in state.findings],
    }


def main() -> None:
    comfy_folder, package_folder, checkpoint, work = (Path(a) for a in sys.argv[1:5])
    drive.start_comfy(comfy_folder)
    import comfy.sd

    nodes = drive.load_package(package_folder).NODE_CLASS_MAPPINGS  # joins HalfSafe's `app`
    from app.core.fixing.module_check import reference_call

    host = sys.modules["comfyui_halfsafe.host"]
    model = comfy.sd.load_checkpoint_guess_config(
        str(checkpoint), output_vae=False, output_clip=False
    )[0]
    found: dict = {"precision": host.precision(model)}
    before = drive.weights_digest(model)
    call = host.one_call(model.clone(), SIZE, SIZE, 4, 0)
    # fp32 on the working kernel: what a right answer is.
    reference = reference_call(host.diffusion_model(model), call.args, call.kwargs).output
    found["working"] = nodes["HalfSafeCheck"]().check(model, SIZE, SIZE, 4, 0)["result"][0]

    working = install_broken_kernel()
    try:
        text, _, fix = nodes["HalfSafeCheck"]().check(model, SIZE, SIZE, 4, 0)["result"]
        found["check"] = {"text": text, "fix": fix}
        found["broken_sampled_finite"] = sampled_finite(model)
        found["fixed"] = fixed(nodes, host, model, fix, call, reference)
        found["remembered"] = fixed(nodes, host, model, None, call, reference)
        found["watched"] = watched(nodes, model, fix)
        options = model.model_options.get("transformer_options", {})
        found["untouched"] = (
            model.object_patches == {}
            and "optimized_attention_override" not in options
            and drive.weights_digest(model) == before
        )
    finally:
        put_back(working)

    planted = comfy.sd.load_diffusion_model(
        str(drive.write_tiny_unet(work / "tiny_sd1_unet.safetensors"))
    )
    text, _, fix = nodes["HalfSafeCheck"]().check(planted, SIZE, SIZE, 4, 0)["result"]
    found["overflow"] = {"text": text, "fix": fix}
    print(json.dumps(found))


if __name__ == "__main__":
    main()
