"""Run by ComfyUI's Python (not HalfSafe's): drives the real ComfyUI in process on a CPU with a
tiny planted SD1 UNet and prints what the nodes did as one JSON object on the last line.

    python drive.py COMFYUI_FOLDER NODE_PACKAGE_FOLDER WORK_FOLDER

The UNet is SD1's shape as ComfyUI's detection reads it (320 channels, a 768-wide context), cut
to one level; one attention's query projection is scaled so that it passes fp16's range while
fp32 holds it. ComfyUI computes a model in fp32 on a CPU; here it is made to compute in fp16 as
it does on a GPU, by making `should_use_fp16` answer True for the CPU."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

STEPS = 3  # the watch test samples this many steps
PLANTED = "input_blocks.1.1.transformer_blocks.0.attn1.to_q"
TINY_SD1 = {
    "use_checkpoint": False,
    "image_size": 32,
    "out_channels": 4,
    "use_spatial_transformer": True,
    "legacy": False,
    "adm_in_channels": None,
    "in_channels": 4,
    "model_channels": 320,
    "num_res_blocks": [1],
    "transformer_depth": [1],
    "channel_mult": [1],
    "transformer_depth_middle": 1,
    "use_linear_in_transformer": False,
    "context_dim": 768,
    "num_heads": 8,
    "transformer_depth_output": [1, 1],
    "use_temporal_attention": False,
    "use_temporal_resblock": False,
}


# SDXL as ComfyUI's detection reads it (320 channels, transformer depths 0, 0, 2, 2, 10, 10, a
# 2048-wide context, a 2816-wide ADM), every level at 320 channels where the released model
# widens to 640 and 1280 (its channel multipliers are not part of the match): 283 M parameters
# in place of 2.6 B, run by the same SDXL model code.
TINY_SDXL = {
    **TINY_SD1,
    "adm_in_channels": 2816,
    "num_classes": "sequential",
    "use_linear_in_transformer": True,
    "context_dim": 2048,
    "num_heads": -1,
    "num_head_channels": 64,
    "channel_mult": [1, 1, 1],
    "num_res_blocks": [2, 2, 2],
    "transformer_depth": [0, 0, 2, 2, 10, 10],
    "transformer_depth_middle": 10,
    "transformer_depth_output": [0, 0, 0, 2, 2, 2, 10, 10, 10],
}
PLANTED_SDXL = "input_blocks.4.1.transformer_blocks.0.attn1.to_q"


def start_comfy(comfy: Path) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    import stand_ins

    stand_ins.install()
    sys.path.insert(0, str(comfy))
    sys.argv = [sys.argv[0], "--cpu"]
    import comfy.options

    comfy.options.enable_args_parsing()
    import comfy.cli_args  # noqa: F401
    import comfy.model_management as mm

    mm.should_use_fp16 = lambda *args, **kwargs: True  # compute in fp16 as on a GPU


def write_tiny_unet(path: Path, config: dict | None = None, planted: str = PLANTED) -> Path:
    import comfy.ops
    import torch
    from comfy.ldm.modules.diffusionmodules.openaimodel import UNetModel
    from safetensors.torch import save_file

    torch.manual_seed(0)
    unet = UNetModel(**(config or TINY_SD1), operations=comfy.ops.disable_weight_init)
    for module in unet.modules():  # ComfyUI's ops skip initialisation: torch's own here
        for kind in (torch.nn.Linear, torch.nn.Conv2d, torch.nn.GroupNorm, torch.nn.LayerNorm):
            if type(module).__mro__.__contains__(kind):
                kind.reset_parameters(module)
                break
    with torch.no_grad():
        unet.get_submodule(planted).weight.mul_(1e5)
    tensors = {
        f"model.diffusion_model.{k}": v.half().contiguous() for k, v in unet.state_dict().items()
    }
    save_file(tensors, str(path))
    return path


def load_package(folder: Path):
    spec = importlib.util.spec_from_file_location(
        "comfyui_halfsafe", folder / "__init__.py", submodule_search_locations=[str(folder)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def load_module(name: str, path: Path):
    """A module of HalfSafe's tests by its file (ComfyUI's folder has a `tests` package too)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def weights_digest(model) -> str:
    """A checksum of each weight's name, dtype, shape and bytes as stored: any change a node
    made to them shows (a CRC is no defence against an attacker, nor needs to be here, and it
    reads a released width's 2 GB in about a second where a float copy and SHA-256 took 15)."""
    import zlib

    import torch

    sums = []
    for name, tensor in sorted(model.model.diffusion_model.state_dict().items()):
        stored = tensor.detach().cpu()
        if type(stored) is not torch.Tensor:  # a quantized layout's tensor: its values
            stored = stored.float()
        stored = stored.contiguous()
        raw = stored.reshape(-1).view(torch.uint8) if stored.numel() else stored
        sums.append(f"{name} {stored.dtype} {tuple(stored.shape)} {zlib.crc32(raw.numpy())}")
    return str(zlib.crc32("\n".join(sums).encode()))


def finite(output) -> bool:
    import torch

    return bool(torch.isfinite(output).all())


def main() -> None:
    comfy_folder, package_folder, work = (Path(a) for a in sys.argv[1:4])
    check_only = "--check-only" in sys.argv
    start_comfy(comfy_folder)
    import comfy.sd
    import torch

    found: dict = {}
    path = write_tiny_unet(work / "tiny_sd1_unet.safetensors")
    model = comfy.sd.load_diffusion_model(str(path))
    package = load_package(package_folder)
    nodes = package.NODE_CLASS_MAPPINGS
    host = sys.modules["comfyui_halfsafe.host"]
    found["precision"] = host.precision(model)
    before = weights_digest(model)

    copies_module = load_module(
        "parameter_copies", Path(__file__).resolve().parents[1] / "support" / "parameter_copies.py"
    )
    ParameterCopies, own_parameter_bytes = (  # noqa: N806
        copies_module.ParameterCopies,
        copies_module.own_parameter_bytes,
    )

    denoiser = model.model.diffusion_model
    with ParameterCopies(denoiser) as copies:
        text, image, fix = nodes["HalfSafeCheck"]().check(model, 64, 64, 4, 0)["result"]
    found["check"] = {"text": text, "fix": fix, "image": list(image.shape)}
    island = denoiser.get_submodule(next(iter(fix["islands"]))) if fix else denoiser
    found["copies"] = {
        "peak": copies.peak_bytes,
        "largest_layer": own_parameter_bytes(denoiser, torch.float32),
        "island": sum(p.numel() for p in island.parameters()) * 4,
        "model_fp32": sum(p.numel() for p in denoiser.parameters()) * 4,
    }
    found["untouched"] = model.object_patches == {} and weights_digest(model) == before
    if check_only:
        print(json.dumps(found))
        return

    fixed, said = nodes["HalfSafeFix"]().fix(model, fix)[:2]
    call = host.one_call(model.clone(), 64, 64, 4, 0)
    island_params = sum(
        p.numel()
        for o in fixed.object_patches.values()
        if isinstance(o, torch.nn.Module)
        for p in o.parameters()
    )
    layer = model.model.diffusion_model.get_submodule(next(iter(fix["islands"])))
    found["fix"] = {
        "said": said,
        "fixed_finite": finite(host.run_call(fixed, call)),
        "original_finite": finite(host.run_call(model, call)),
        "island_params": island_params,
        "layer_params": sum(p.numel() for p in layer.parameters()),
        "model_params": sum(p.numel() for p in model.model.diffusion_model.parameters()),
        "original_patches": len(model.object_patches),
    }
    # A UNet file alone: the fix the check proved is remembered under the file's own key.
    unchanged, said = nodes["HalfSafeFix"]().fix(model, None)[:2]
    found["remembered"] = {"said": said, "unchanged": unchanged is model}
    found["watch"] = watch(nodes, model)
    found["watch"].pop("outputs")
    found["repaired"] = repaired(nodes, model)
    found["bad_input"] = {
        "check": nodes["HalfSafeCheck"]().check("not a model", 64, 64, 4, 0)["result"][0],
        "fix": nodes["HalfSafeFix"]().fix("not a model", None)[1],
    }
    print(json.dumps(found))


def watch(nodes, model, cond=None, latent=None, fix=None, repair=False) -> dict:
    """Sample 3 steps through ComfyUI's KSampler with and without the watch (given `fix`,
    connected to it; `repair`: the watch's repair on), counting the host syncs (torch's scalar
    reads) each run makes; SD1's zero text and latent unless given."""
    import nodes as comfy_nodes
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Syncs(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._local_scalar_dense.default:
                Syncs.count += 1
            return func(*args, **(kwargs or {}))

    cond = cond or [[torch.zeros(1, 77, 768), {}]]
    latent = latent or {"samples": torch.zeros(1, 4, 8, 8)}

    outputs = []

    def sample(m) -> int:
        Syncs.count = 0
        with Syncs():
            outputs.append(
                comfy_nodes.common_ksampler(
                    m, 0, STEPS, 1.0, "euler", "normal", cond, cond, latent
                )[0]["samples"]
            )
        return Syncs.count

    plain = sample(model)
    (watched,) = nodes["HalfSafeNaNWatch"]().watch(model, fix, repair)
    with_watch = sample(watched)
    state = watched.get_wrappers("apply_model", "halfsafe_watch")[0].__self__
    return {
        "findings": [f.__dict__ for f in state.findings],
        "words": [f.words() for f in state.findings],
        "syncs_plain": plain,
        "syncs_watched": with_watch,
        "host_syncs": state.host_syncs,
        "outputs": outputs,  # the plain run's samples, the watched run's
    }


def repaired(nodes, model, cond=None, latent=None) -> dict:
    """The watch with its repair on and no fix connected: the run that went non-finite sampled
    again with a proved fix, its samples measured against the same sampling with the whole
    diffusion model computing in fp32 (ComfyUI's own compute-dtype patch)."""
    from app.core.fixing.quality import compare

    host = sys.modules["comfyui_halfsafe.host"]
    # As a job loads it: an earlier run of a fixed clone (the watch with the fix connected)
    # leaves its layers kept wider in the model the clones share until then.
    host.load(model)
    before = weights_digest(model)
    found = watch(nodes, model, cond, latent, repair=True)
    untouched = model.object_patches == {} and weights_digest(model) == before
    plain, fixed = found.pop("outputs")
    wide = model.clone()
    host.apply_component(wide, "fp32")
    reference = watch(nodes, wide, cond, latent)["outputs"][0]
    found.update(
        plain_finite=finite(plain),
        repaired_finite=finite(fixed),
        repaired_db=compare(fixed, reference).value,
        untouched=untouched,  # before the reference's run loads another clone
    )
    return found


if __name__ == "__main__":
    main()
