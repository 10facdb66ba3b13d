"""Text encoders and VAEs from checkpoint layouts (original LDM / OpenCLIP names or
transformers' and diffusers' own), a separate VAE file or folder, and the check that a VAE's
latents fit the denoiser."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.core import architecture as arch
from app.core.checkpoint import (
    Checkpoint,
    WeightScanner,
    assembly,
    read_safetensors_header,
    scan_weights,
    stored_dtype,
)
from app.core.checkpoint.assembly import first_line, nbytes
from app.core.encoders.vaes import vae_from_checkpoint, vae_keys
from app.core.errors import BadFileError, UnsupportedModelError
from app.core.families import family_of_denoiser
from app.core.formats.layouts import count_indices
from app.core.jobs import CancelToken
from app.core.models.component_files import check_files, weight_files
from app.core.models.configs import read_json


def text_encoder_keys(names: list[str], shapes, encoder: arch.TextEncoderLayout) -> list[str]:
    keys = [k for k in names if k.startswith(encoder.prefix)]
    if encoder.layout == "hf":
        root = encoder.prefix.removesuffix("text_model.")
        keys = [k for k in keys if not k.endswith("position_ids")]
        if encoder.drop_last_layer:  # SD2 in transformers names: as below
            last = count_indices(shapes, encoder.prefix + "encoder.layers.") - 1
            unused = f"{encoder.prefix}encoder.layers.{last}."
            return [k for k in keys if not k.startswith(unused)]
        keys += [k for k in names if k == root + "text_projection.weight"]
        return keys
    keys = [
        k
        for k in keys
        if k[len(encoder.prefix) :].split(".")[0]
        in ("token_embedding", "positional_embedding", "transformer", "ln_final", "text_projection")
    ]
    if encoder.drop_last_layer:
        last = count_indices(shapes, encoder.prefix + "transformer.resblocks.") - 1
        unused = f"{encoder.prefix}transformer.resblocks.{last}."
        # SD2 reads the penultimate layer: the last block and the projection are never used.
        keys = [
            k for k in keys if not k.startswith(unused) and k != encoder.prefix + "text_projection"
        ]
    return keys


def load_vae_override(
    path: Path,
    base: dict[str, Any],
    native_size: int,
    allow_pickle: bool,
    cancel: CancelToken | None,
    identify: bool = False,
):
    """A separate VAE: a file (original or diffusers layout, or a full checkpoint's VAE) or a
    diffusers VAE folder. Returns (model, scan, dtypes); the scan digests with `identify`."""
    import diffusers

    if not path.exists():
        raise BadFileError(path, "the VAE does not exist (no such file or folder).")
    if path.is_dir():
        config = read_json(path / "config.json", owner=path)
        check_files(path, "vae")
        files = weight_files(path, allow_pickle, path)
        dtypes = [
            d
            for f in files
            if f.suffix == ".safetensors"
            for d in read_safetensors_header(f).dtypes().values()
        ]
        torch_dtype = assembly.torch_dtype(stored_dtype(dtypes)) if dtypes else None
        try:
            model = diffusers.AutoencoderKL.from_pretrained(
                path,
                local_files_only=True,
                trust_remote_code=False,
                torch_dtype=torch_dtype,
                use_safetensors=not all(f.suffix != ".safetensors" for f in files) or None,
            )
        except (OSError, ValueError, RuntimeError, KeyError) as error:
            raise BadFileError(
                path, f"diffusers could not load this VAE folder ({first_line(error)})."
            ) from None
        if config.get("_class_name") not in (None, "AutoencoderKL"):
            raise UnsupportedModelError(
                path, f"this is a {config['_class_name']}, not an AutoencoderKL VAE."
            )
        return model.eval(), scan_weights(model, cancel=cancel, identify=identify), dtypes
    with Checkpoint(path, allow_pickle=allow_pickle, component="vae") as checkpoint:
        keys = checkpoint.keys()
        prefix = next(
            (p for p in (arch.VAE, "vae.", "") if any(k.startswith(p + "decoder.") for k in keys)),
            None,
        )
        if prefix is None or not any(k.startswith(prefix + "encoder.") for k in keys):
            raise BadFileError(path, "this file holds no VAE (no encoder and decoder tensors).")
        vae_names = vae_keys(keys, prefix)
        scanner = WeightScanner(
            sum(nbytes(checkpoint, k) for k in vae_names),
            cancel=cancel,
            identify=identify,
            label=f"{path.name}:",
        )

        def read(keys_: list[str]) -> dict[str, Any]:
            tensors = {}
            for key in keys_:
                tensors[key] = checkpoint.get(key)
                scanner.check(key, tensors[key])
            return tensors

        model = vae_from_checkpoint(checkpoint, prefix, base, native_size, read)
        return model, scanner.result(), [checkpoint.dtypes[k] for k in vae_names]


def check_latents(path: Path, vae, unet) -> None:
    latent = vae.config.latent_channels
    kind = type(unet).__name__
    family = family_of_denoiser(unet)
    patches = family.packed_channels if family is not None else 1
    # Z-Image's transformer has no out_channels: it gives back what it takes.
    channels = (unet.config.get("out_channels") or unet.config.in_channels) // patches
    if latent != channels:
        raise UnsupportedModelError(
            path,
            f"the VAE makes {latent}-channel latents but the "
            f"{'transformer' if kind.endswith('Transformer2DModel') else 'UNet'} works on "
            f"{channels}.",
        )
