"""Run by ComfyUI's Python (not HalfSafe's): HalfSafe Check and Fix on the VAE and the text
encoder in the real ComfyUI on a CPU, and what the nodes did as one JSON object on the last line.

    python drive_parts.py COMFYUI_FOLDER NODE_PACKAGE_FOLDER CHECKPOINT

The MODEL is the tiny single-file SD1 checkpoint's (one attention query planted past fp16),
loaded by ComfyUI's checkpoint loader. Its tiny VAE does not load through that loader (ComfyUI
fixes an SD VAE's widths at the released size: 128 channels, four levels), so it is built by
ComfyUI's own `comfy.sd.VAE` from the checkpoint's VAE weights with its config given; once as
it is, once with one decoder convolution's weights scaled so that its output passes fp16's
range while fp32 holds it. ComfyUI runs an SD VAE in bf16 or fp32 unless told `--fp16-vae`:
that flag is set here. Its text encoders have fixed full-size configs, so the CLIP is SD1's
full-size CLIP-L with seeded weights (one MLP's first layer scaled past fp16's range), stored
in fp16, which ComfyUI computes in fp32."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import drive  # beside this file: ComfyUI's start on a CPU, the package loader

SIZE = 64
PLANTED_VAE = "decoder.up.1.block.0.conv1"
PLANTED_CLIP = "clip_l.transformer.text_model.encoder.layers.0.mlp.fc1"
# The tiny VAE's widths (diffusers' block_out_channels (32, 64), one layer a block) in the
# layout ComfyUI's AutoencoderKL takes.
TINY_VAE = {
    "embed_dim": 4,
    "ddconfig": {
        "double_z": True,
        "z_channels": 4,
        "resolution": 256,
        "in_channels": 3,
        "out_ch": 3,
        "ch": 32,
        "ch_mult": [1, 2],
        "num_res_blocks": 1,
        "attn_resolutions": [],
        "dropout": 0.0,
    },
}


def digest(module) -> str:
    found = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        found.update(name.encode() + tensor.detach().float().cpu().numpy().tobytes())
    return found.hexdigest()


def vaes(checkpoint: Path):
    """The checkpoint's tiny VAE as ComfyUI's VAE: as it is, planted, and planted in fp32."""
    import comfy.sd
    import torch
    from safetensors.torch import load_file

    prefix = "first_stage_model."
    weights = {
        k[len(prefix) :]: v for k, v in load_file(str(checkpoint)).items() if k.startswith(prefix)
    }
    planted = dict(weights)
    planted[f"{PLANTED_VAE}.weight"] = weights[f"{PLANTED_VAE}.weight"].float().mul(1e6).half()
    config = {"params": TINY_VAE}
    return (
        comfy.sd.VAE(sd=weights, config=config),
        comfy.sd.VAE(sd=planted, config=config),
        comfy.sd.VAE(sd=planted, config=config, dtype=torch.float32),
    )


def clip_l():
    """SD1's full-size CLIP-L in ComfyUI, weights seeded (norms at one and zero), stored in fp16,
    one MLP layer scaled past fp16's range."""
    import comfy.sd
    import comfy.supported_models
    import torch

    target = comfy.supported_models.SD15({}).clip_target()
    clip = comfy.sd.CLIP(target, model_options={"dtype": torch.float16})
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in clip.cond_stage_model.named_parameters():
            if "norm" in name:
                parameter.fill_(1.0 if name.endswith("weight") else 0.0)
            else:
                noise = torch.randn(parameter.shape, generator=generator) * 0.02
                parameter.copy_(noise.to(parameter.dtype))
        clip.cond_stage_model.get_submodule(PLANTED_CLIP).weight.mul_(1e5)
    return clip


def decoded(vae, latent):
    """ComfyUI's own VAE decode (VAEDecode's), its pixels in 0..1."""
    return vae.decode(latent)


def main() -> None:
    comfy_folder, package_folder, checkpoint = (Path(a) for a in sys.argv[1:4])
    drive.start_comfy(comfy_folder)
    import comfy.cli_args
    import comfy.sd
    import torch

    comfy.cli_args.args.fp16_vae = True  # as `--fp16-vae`: the VAE computes in fp16
    model = comfy.sd.load_checkpoint_guess_config(
        str(checkpoint), output_vae=False, output_clip=False
    )[0]
    sound, planted, reference = vaes(checkpoint)
    clip = clip_l()
    nodes = drive.load_package(package_folder).NODE_CLASS_MAPPINGS
    from app.core.fixing.quality import compare  # HalfSafe's core, found once the package is in

    found: dict = {"vae_dtype": str(planted.vae_dtype).removeprefix("torch.")}
    before = {
        "model": drive.weights_digest(model),
        "vae": digest(planted.first_stage_model),
        "clip": digest(clip.cond_stage_model),
    }

    check = nodes["HalfSafeCheck"]().check
    text, image, fix = check(model, SIZE, SIZE, 4, 0, clip, planted)["result"]
    found["check"] = {"text": text, "fix": fix, "image": list(image.shape)}

    latent = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(1)) / 0.18215
    wanted = decoded(reference, latent)
    fixed_model, said, fixed_vae = nodes["HalfSafeFix"]().fix(model, fix, planted)[:3]
    pixels = decoded(fixed_vae, latent)
    original = decoded(planted, latent)
    found["fix"] = {
        "said": said,
        "fixed_finite": drive.finite(pixels),
        "fixed_db": compare(pixels, wanted).value,
        "original_finite": drive.finite(original),
        "patches": sorted(fixed_vae.patcher.object_patches),
        "shares_weights": fixed_vae.first_stage_model is planted.first_stage_model,
    }
    whole = {"islands": {}, "component": None, "vae": {"islands": {}, "component": "fp32"}}
    _, said, wider = nodes["HalfSafeFix"]().fix(model, whole, planted)[:3]
    pixels = decoded(wider, latent)
    found["whole_vae"] = {
        "said": said,
        "finite": drive.finite(pixels),
        "db": compare(pixels, wanted).value,
        "stored": sorted({str(p.dtype) for p in wider.first_stage_model.parameters()}),
        "original_finite_after": drive.finite(decoded(planted, latent)),
    }
    _, said, passed = nodes["HalfSafeFix"]().fix(model, fix, None)[:3]
    found["no_vae_connected"] = {"said": said, "vae": passed is None}
    # A VAE part that cannot be put on this VAE (a layer it lacks): the model's fix stays.
    astray = {**fix, "vae": {**fix["vae"], "islands": {"decoder.no_such_block": "fp32"}}}
    patched, said, passed = nodes["HalfSafeFix"]().fix(model, astray, planted)[:3]
    found["vae_part_fails"] = {
        "said": said,
        "vae_as_given": passed is planted and planted.patcher.object_patches == {},
        "model_fixed": patched is not model and bool(patched.object_patches),
    }

    found["untouched"] = {
        "model": model.object_patches == {} and drive.weights_digest(model) == before["model"],
        "vae": planted.patcher.object_patches == {}
        and planted.vae_dtype == torch.float16
        and digest(planted.first_stage_model) == before["vae"],
        "clip": digest(clip.cond_stage_model) == before["clip"],
    }
    text, _, fix = check(model, SIZE, SIZE, 4, 0, None, sound)["result"]
    found["healthy_vae"] = {"text": text, "fix": fix}
    text, _, _ = check(model, SIZE, SIZE, 4, 0, None, "not a vae")["result"]
    found["bad_vae"] = text
    print(json.dumps(found))


if __name__ == "__main__":
    main()
