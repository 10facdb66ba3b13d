"""Run by ComfyUI's Python (not HalfSafe's): HalfSafe Check with a VAE connected (`check`), or
HalfSafe Fix with no fix connected and the VAE decoding after it (`fix`), in the real ComfyUI on
a CPU; what the node did as one JSON object on the last line.

    python drive_remembered.py COMFYUI_FOLDER NODE_PACKAGE_FOLDER CHECKPOINT VAE_FILE check|fix

The MODEL is the checkpoint's, loaded by ComfyUI's checkpoint loader. The VAE is read from
VAE_FILE: the checkpoint itself (its `first_stage_model.` weights), or a VAE file. Its tiny
widths do not load through ComfyUI's VAE loaders (they fix an SD VAE at the released size), so
it is built by ComfyUI's own `comfy.sd.VAE` with its config given, and is told the file it came
from as those loaders tell it (the reload recipe on its patcher). It decodes in fp16, as
`--fp16-vae` makes it. The store is HalfSafe's (`HALFSAFE_DATA_DIR`), shared by the runs of one
test, each a fresh process as the next job is."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import drive  # beside this file: ComfyUI's start on a CPU, the package loader
from drive_parts import TINY_VAE

SIZE = 64
PREFIX = "first_stage_model."


def loaded_vae(checkpoint: Path, vae_file: Path, dtype=None):
    """The VAE of `vae_file` as ComfyUI's VAE, its patcher's reload recipe naming the file as
    ComfyUI's checkpoint loader (the checkpoint) or VAE loader (a VAE file) does."""
    import comfy.sd
    from safetensors.torch import load_file

    weights = load_file(str(vae_file))
    if any(k.startswith(PREFIX) for k in weights):
        weights = {k[len(PREFIX) :]: v for k, v in weights.items() if k.startswith(PREFIX)}
    vae = comfy.sd.VAE(sd=weights, config={"params": TINY_VAE}, dtype=dtype)
    if vae_file == checkpoint:
        recipe = (comfy.sd.load_checkpoint_vae_patcher, (str(checkpoint), None, {}, {}))
    else:
        recipe = (comfy.sd.load_vae_patcher, (str(vae_file), None, None))
    vae.patcher.cached_patcher_init = recipe
    return vae


def main() -> None:
    comfy_folder, package_folder, checkpoint, vae_file = (Path(a) for a in sys.argv[1:5])
    action = sys.argv[5]
    drive.start_comfy(comfy_folder)
    import comfy.cli_args
    import comfy.sd
    import torch

    comfy.cli_args.args.fp16_vae = True  # as `--fp16-vae`: the VAE computes in fp16
    model = comfy.sd.load_checkpoint_guess_config(
        str(checkpoint), output_vae=False, output_clip=False
    )[0]
    vae = loaded_vae(checkpoint, vae_file)
    nodes = drive.load_package(package_folder).NODE_CLASS_MAPPINGS
    found: dict = {"vae_dtype": str(vae.vae_dtype).removeprefix("torch.")}
    if action == "check":
        text, _, fix = nodes["HalfSafeCheck"]().check(model, SIZE, SIZE, 4, 0, None, vae)["result"]
        found["check"] = {"text": text, "fix": fix}
    else:
        from app.core.fixing.quality import compare  # HalfSafe's core, found once it is in

        latent = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(1)) / 0.18215
        wanted = loaded_vae(checkpoint, vae_file, torch.float32).decode(latent)
        patched, said, fixed_vae = nodes["HalfSafeFix"]().fix(model, None, vae)[:3]
        pixels = fixed_vae.decode(latent)
        quality = compare(pixels, wanted)
        found["fix"] = {
            "said": said,
            "model_patches": sorted(patched.object_patches),
            "vae_patches": sorted(fixed_vae.patcher.object_patches),
            "fixed_finite": drive.finite(pixels),
            "fixed_db": quality.value,
            "original_finite": drive.finite(vae.decode(latent)),
            "untouched": vae.patcher.object_patches == {},
        }
    print(json.dumps(found))


if __name__ == "__main__":
    main()
