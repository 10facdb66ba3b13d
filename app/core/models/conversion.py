"""Text encoders and VAEs from checkpoint layouts (original LDM / OpenCLIP names or
transformers' and diffusers' own), a separate VAE file or folder, and the check that a VAE's
latents fit the denoiser."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.core import architecture as arch
from app.core import limits
from app.core.checkpoint import (
    Checkpoint,
    WeightScanner,
    read_safetensors_header,
    scan_weights,
    stored_dtype,
)
from app.core.errors import BadFileError, UnsupportedModelError
from app.core.families import family_of_denoiser
from app.core.formats.layouts import count_indices
from app.core.jobs import CancelToken
from app.core.models import assembly
from app.core.models.assembly import assign, built, empty, first_line, nbytes
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


def convert_text_encoder(model, tensors: dict[str, Any], encoder: arch.TextEncoderLayout):
    wrapped = any(k.startswith("text_model.") for k in model.state_dict())
    if encoder.layout == "hf":
        root = encoder.prefix.removesuffix("text_model.")
        state = {}
        for key, tensor in tensors.items():
            if key == root + "text_projection.weight":
                state["text_projection.weight"] = tensor
            else:
                name = key[len(encoder.prefix) :]
                state[("text_model." + name) if wrapped else name] = tensor
        return state
    from diffusers.loaders.single_file_utils import convert_open_clip_checkpoint

    converted = convert_open_clip_checkpoint(model, tensors, prefix=encoder.prefix)
    if not hasattr(model, "text_projection"):
        converted.pop("text_projection.weight", None)
    if not wrapped:
        converted = {k.removeprefix("text_model."): v for k, v in converted.items()}
    return converted


_VAE_PARTS = ("encoder.", "decoder.", "quant_conv.", "post_quant_conv.")


def vae_keys(names: list[str], prefix: str) -> list[str]:
    return [k for k in names if k.startswith(prefix) and k[len(prefix) :].startswith(_VAE_PARTS)]


def vae_from_checkpoint(
    checkpoint: Checkpoint, prefix: str, base: dict[str, Any], native_size: int, read
):
    import diffusers

    path = checkpoint.path
    try:
        config = arch.infer_vae_config(
            checkpoint.shapes, base, prefix=prefix, sample_size=native_size
        )
    except ValueError as error:
        raise UnsupportedModelError(
            path, f"its VAE is not one HalfSafe can build: {error}."
        ) from None
    try:
        limits.check_vae_config(config)
    except ValueError as error:
        raise BadFileError(
            path, f"the VAE weights' shapes describe a VAE no real file holds: {error}."
        ) from None
    tensors = read(vae_keys(checkpoint.keys(), prefix))
    model = built(path, "VAE", empty, diffusers.AutoencoderKL.from_config, config)
    return assign(path, model, built(path, "VAE", _convert_vae, tensors, prefix, config), "VAE")


def _convert_vae(tensors: dict[str, Any], prefix: str, config: dict[str, Any]) -> dict[str, Any]:
    plain = {k[len(prefix) :]: v for k, v in tensors.items()}
    if "encoder.down_blocks.0.resnets.0.conv1.weight" in plain:
        # Already diffusers names; older files still call the attention projections
        # query/key/value/proj_attn and store them as 1x1 convolutions.
        renamed = {}
        for key, tensor in plain.items():
            for old, new in (
                (".query.", ".to_q."),
                (".key.", ".to_k."),
                (".value.", ".to_v."),
                (".proj_attn.", ".to_out.0."),
            ):
                key = key.replace(old, new)
            if ".attentions." in key and key.endswith("weight") and tensor.ndim > 2:
                tensor = tensor.reshape(tensor.shape[0], tensor.shape[1])
            renamed[key] = tensor
        return renamed
    from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint

    return convert_ldm_vae_checkpoint(plain, config)


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
