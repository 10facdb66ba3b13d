"""Models kept as split files, as ComfyUI and Forge users keep Flux.1: a transformer file (in
`diffusion_models/` or `unet/`), its text encoders (in `text_encoders/` or `clip/`) and its VAE
(in `vae/`), each a `.safetensors` of its own.

The transformer file is in Black Forest Labs' key layout (double_blocks.N, single_blocks.N,
img_in, txt_in, guidance_in for dev); its config is read from its tensor names and shapes
(block counts, widths, head size, guidance embedding present or not) and its keys are mapped
to diffusers' `FluxTransformer2DModel` names with one table that serves both directions.
The companions come from `--text-encoder PATH` (repeatable) and `--vae PATH`, or are found by
their contents in the usual sibling folders; a missing one is named in one sentence. Every
header is read before any tensor; nothing reaches the network (shipped configs in
`resources/configs/flux`, shipped CLIP and T5 vocabularies).

torch, diffusers and transformers are imported inside the functions that use them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.core import architecture as arch
from app.core.checkpoint import read_header
from app.core.errors import BadFileError, HalfSafeError, UnsupportedModelError

Shapes = Mapping[str, tuple[int, ...]]

FLUX_PREFIXES = ("model.diffusion_model.", "")  # a ComfyUI full save, a plain transformer file
TRANSFORMER_FOLDERS = ("diffusion_models", "unet")
TEXT_ENCODER_FOLDERS = ("text_encoders", "clip")
VAE_FOLDERS = ("vae",)
MAX_SIBLINGS = 64  # files whose headers are read when looking for companions
CLIP_PREFIX = "text_model."
# Companion files: safetensors, and GGUF (a T5 encoder in llama.cpp's names reads as
# transformers' layout, see quantized.transformers_names).
COMPANION_SUFFIXES = (".safetensors", ".gguf")


# Detection ---------------------------------------------------------------------------------


def flux_prefix(shapes: Shapes) -> str | None:
    """The key prefix of a Flux.1 transformer in BFL layout, or None when this is not one."""
    for prefix in FLUX_PREFIXES:
        if prefix + "double_blocks.0.img_attn.qkv.weight" in shapes and (
            prefix + "img_in.weight" in shapes
        ):
            return prefix
    return None


def flux_transformer_config(shapes: Shapes, prefix: str) -> dict[str, Any]:
    """A FluxTransformer2DModel config from a BFL-layout file's shapes. Raises ValueError
    naming what does not fit."""

    def w(name: str) -> tuple[int, ...]:
        shape = shapes.get(prefix + name)
        if shape is None:
            raise ValueError(f"it has no {name}")
        return shape

    inner, in_channels = w("img_in.weight")
    head = w("double_blocks.0.img_attn.norm.query_norm.scale")[0]
    mlp = w("double_blocks.0.img_mlp.0.weight")[0]
    if inner % head or mlp != 4 * inner:
        raise ValueError(f"its blocks ({inner} wide, {head}-wide heads, MLP {mlp}) are not Flux's")
    return {
        "_class_name": "FluxTransformer2DModel",
        "patch_size": 1,
        "in_channels": in_channels,
        "out_channels": w("final_layer.linear.weight")[0],
        "num_layers": arch._count_indices(shapes, prefix + "double_blocks."),
        "num_single_layers": arch._count_indices(shapes, prefix + "single_blocks."),
        "attention_head_dim": head,
        "num_attention_heads": inner // head,
        "joint_attention_dim": w("txt_in.weight")[1],
        "pooled_projection_dim": w("vector_in.in_layer.weight")[1],
        "guidance_embeds": prefix + "guidance_in.in_layer.weight" in shapes,
        # Rotary axes (index, height, width) in Flux's proportions: 16, 56, 56 of 128.
        "axes_dims_rope": [head // 8, 7 * head // 16, 7 * head // 16],
    }


def describe_flux(config: Mapping[str, Any], prefix: str) -> tuple[str, str]:
    """(architecture, the "why" sentence) for a Flux.1 transformer file."""
    dev = bool(config["guidance_embeds"])
    variant = "dev" if dev else "schnell"
    width = config["num_attention_heads"] * config["attention_head_dim"]
    guidance = (
        "and a guidance embedding (guidance_in), as the guidance-distilled Flux.1 dev has"
        if dev
        else "and no guidance embedding (no guidance_in), as Flux.1 schnell"
    )
    return (
        f"flux-{variant}",
        f"Flux.1 {variant}: a transformer in Black Forest Labs' layout ({prefix}double_blocks, "
        f"single_blocks) with {config['num_layers']} double and "
        f"{config['num_single_layers']} single blocks, {width} wide, taking "
        f"{config['joint_attention_dim']}-wide T5 features and a "
        f"{config['pooled_projection_dim']}-wide CLIP vector, {guidance}; flow matching.",
    )


# Key layouts -------------------------------------------------------------------------------


def _flux_table(config: Mapping[str, Any]) -> Iterator[tuple[str, tuple[str, ...], str]]:
    """(BFL key, diffusers keys, how): "same", "cat" (fused along dim 0) or "swap" (the final
    modulation's shift and scale halves swapped). One table for both directions."""

    def linear(bfl: str, diffusers: str):
        for part in ("weight", "bias"):
            yield f"{bfl}.{part}", (f"{diffusers}.{part}",), "same"

    def fused(bfl: str, parts: tuple[str, ...]):
        for part in ("weight", "bias"):
            yield f"{bfl}.{part}", tuple(f"{p}.{part}" for p in parts), "cat"

    yield from linear("time_in.in_layer", "time_text_embed.timestep_embedder.linear_1")
    yield from linear("time_in.out_layer", "time_text_embed.timestep_embedder.linear_2")
    yield from linear("vector_in.in_layer", "time_text_embed.text_embedder.linear_1")
    yield from linear("vector_in.out_layer", "time_text_embed.text_embedder.linear_2")
    if config["guidance_embeds"]:
        yield from linear("guidance_in.in_layer", "time_text_embed.guidance_embedder.linear_1")
        yield from linear("guidance_in.out_layer", "time_text_embed.guidance_embedder.linear_2")
    yield from linear("txt_in", "context_embedder")
    yield from linear("img_in", "x_embedder")
    for i in range(config["num_layers"]):
        b, d = f"double_blocks.{i}.", f"transformer_blocks.{i}."
        yield from linear(b + "img_mod.lin", d + "norm1.linear")
        yield from linear(b + "txt_mod.lin", d + "norm1_context.linear")
        yield from fused(b + "img_attn.qkv", (d + "attn.to_q", d + "attn.to_k", d + "attn.to_v"))
        yield from fused(
            b + "txt_attn.qkv",
            (d + "attn.add_q_proj", d + "attn.add_k_proj", d + "attn.add_v_proj"),
        )
        for side, added in (("img", ""), ("txt", "added_")):
            yield (
                f"{b}{side}_attn.norm.query_norm.scale",
                (f"{d}attn.norm_{added}q.weight",),
                "same",
            )
            yield f"{b}{side}_attn.norm.key_norm.scale", (f"{d}attn.norm_{added}k.weight",), "same"
        yield from linear(b + "img_mlp.0", d + "ff.net.0.proj")
        yield from linear(b + "img_mlp.2", d + "ff.net.2")
        yield from linear(b + "txt_mlp.0", d + "ff_context.net.0.proj")
        yield from linear(b + "txt_mlp.2", d + "ff_context.net.2")
        yield from linear(b + "img_attn.proj", d + "attn.to_out.0")
        yield from linear(b + "txt_attn.proj", d + "attn.to_add_out")
    for i in range(config["num_single_layers"]):
        b, d = f"single_blocks.{i}.", f"single_transformer_blocks.{i}."
        yield from linear(b + "modulation.lin", d + "norm.linear")
        yield from fused(
            b + "linear1", (d + "attn.to_q", d + "attn.to_k", d + "attn.to_v", d + "proj_mlp")
        )
        yield from linear(b + "linear2", d + "proj_out")
        yield b + "norm.query_norm.scale", (d + "attn.norm_q.weight",), "same"
        yield b + "norm.key_norm.scale", (d + "attn.norm_k.weight",), "same"
    yield from linear("final_layer.linear", "proj_out")
    for part in ("weight", "bias"):
        yield f"final_layer.adaLN_modulation.1.{part}", (f"norm_out.linear.{part}",), "swap"


def _swap_halves(tensor):
    import torch

    first, second = tensor.chunk(2, dim=0)
    return torch.cat([second, first], dim=0)


def flux_to_diffusers(
    tensors: Mapping[str, Any], config: Mapping[str, Any], expected: Shapes, prefix: str = ""
) -> dict[str, Any]:
    """BFL-layout tensors -> diffusers names; `expected` gives the fused parts' sizes. Raises
    KeyError for a missing key."""
    import torch

    state: dict[str, Any] = {}
    for bfl, names, how in _flux_table(config):
        tensor = tensors[prefix + bfl]
        if how == "cat":
            sizes = [expected[n][0] for n in names]
            if sum(sizes) != tensor.shape[0]:
                raise ValueError(f"{prefix + bfl} has {tensor.shape[0]} rows, not {sum(sizes)}")
            state.update(zip(names, torch.split(tensor, sizes, dim=0), strict=True))
        elif how == "swap":
            state[names[0]] = _swap_halves(tensor)
        else:
            state[names[0]] = tensor
    return state


def flux_to_bfl(state: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """A diffusers FluxTransformer2DModel state dict under BFL names (what a Flux transformer
    file in ComfyUI's `diffusion_models/` holds)."""
    import torch

    out: dict[str, Any] = {}
    for bfl, names, how in _flux_table(config):
        if how == "cat":
            out[bfl] = torch.cat([state[n] for n in names], dim=0)
        elif how == "swap":
            out[bfl] = _swap_halves(state[names[0]])
        else:
            out[bfl] = state[names[0]]
    return out


# Text encoders -----------------------------------------------------------------------------


def encoder_kind(shapes: Shapes) -> str | None:
    """ "t5" or "clip" for a text-encoder file in transformers' key layout, else None."""
    if "encoder.block.0.layer.0.SelfAttention.q.weight" in shapes and "shared.weight" in shapes:
        return "t5"
    if CLIP_PREFIX + "embeddings.token_embedding.weight" in shapes:
        return "clip"
    return None


def t5_config(shapes: Shapes) -> dict[str, Any]:
    """A T5EncoderModel config from a T5 encoder file's shapes (T5 v1.1: gated GELU)."""
    vocab, width = shapes["shared.weight"]
    buckets, heads = shapes["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"]
    inner = shapes["encoder.block.0.layer.0.SelfAttention.q.weight"][0]
    gated = "encoder.block.0.layer.1.DenseReluDense.wi_0.weight" in shapes
    d_ff = shapes[
        "encoder.block.0.layer.1.DenseReluDense." + ("wi_0" if gated else "wi") + ".weight"
    ][0]
    if inner % heads:
        raise ValueError(f"its attention ({inner} wide) does not split into {heads} heads")
    return {
        "vocab_size": vocab,
        "d_model": width,
        "d_kv": inner // heads,
        "d_ff": d_ff,
        "num_layers": arch._count_indices(shapes, "encoder.block."),
        "num_heads": heads,
        "relative_attention_num_buckets": buckets,
        "feed_forward_proj": "gated-gelu" if gated else "relu",
        "is_encoder_decoder": False,
        "use_cache": False,
        "tie_word_embeddings": False,
    }


# Companions --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Companions:
    """The files a split transformer runs with, and what was missing."""

    clip: Path | None
    t5: Path | None
    vae: Path | None
    looked_in: tuple[Path, ...]


def _headers(paths: list[Path]) -> Iterator[tuple[Path, Shapes]]:
    for path in paths:
        with contextlib.suppress(HalfSafeError, OSError):
            yield path, read_header(path).shapes()


def _siblings(model: Path, folders: tuple[str, ...]) -> list[Path]:
    """Folders named `folders` beside the transformer's folder (ComfyUI's models/ tree)."""
    root = model.parent.parent
    return [root / name for name in folders if (root / name).is_dir()]


def _files(folders: list[Path]) -> list[Path]:
    found: list[Path] = []
    for folder in folders:
        with contextlib.suppress(OSError):
            found += sorted(p for p in folder.iterdir() if p.suffix in COMPANION_SUFFIXES)
    return found[:MAX_SIBLINGS]


def find_companions(
    model: Path, text_encoders: list[str], vae: str | None, needs: Mapping[str, Any]
) -> Companions:
    """The CLIP-L and T5 text encoders and the VAE for a Flux transformer file: the files given
    first (each must be what it claims: a sentence otherwise), then the sibling folders, by
    contents (a T5 whose width is the transformer's text width, a CLIP, a VAE whose latent
    channels fit). Reads headers only."""
    clip = t5 = None
    for given in text_encoders:
        path = Path(given).expanduser()
        if not path.is_file():
            raise BadFileError(path, "the text encoder does not exist (no such file).")
        if path.suffix.lower() not in COMPANION_SUFFIXES:
            raise UnsupportedModelError(
                path, "split text encoders are read from .safetensors or .gguf files."
            )
        kind = encoder_kind(read_header(path).shapes())
        if kind is None:
            raise UnsupportedModelError(
                path, "this is neither a CLIP nor a T5 text encoder in transformers' layout."
            )
        clip, t5 = (path, t5) if kind == "clip" else (clip, path)
    folders = _siblings(model, TEXT_ENCODER_FOLDERS)
    if clip is None or t5 is None:
        for path, shapes in _headers(_files(folders)):
            kind = encoder_kind(shapes)
            if kind == "t5" and t5 is None and shapes["shared.weight"][1] == needs["t5_width"]:
                t5 = path
            elif kind == "clip" and clip is None:
                width = shapes[CLIP_PREFIX + "embeddings.token_embedding.weight"][1]
                if width == needs["clip_width"]:
                    clip = path
    vae_path = Path(vae).expanduser() if vae is not None else None
    vae_folders = _siblings(model, VAE_FOLDERS)
    if vae_path is None:
        for path, shapes in _headers(_files(vae_folders)):
            conv = shapes.get("decoder.conv_in.weight")
            if conv is not None and conv[1] == needs["latent_channels"]:
                vae_path = path
                break
    return Companions(clip, t5, vae_path, tuple(folders + vae_folders))


def missing_sentence(companions: Companions, model: Path) -> str | None:
    """One sentence naming what a split Flux transformer still needs, or None."""
    missing = []
    if companions.t5 is None:
        missing.append("its T5 text encoder (t5xxl)")
    if companions.clip is None:
        missing.append("its CLIP-L text encoder (clip_l)")
    if companions.vae is None:
        missing.append("its 16-channel VAE (ae)")
    if not missing:
        return None
    what = missing[0] if len(missing) == 1 else ", ".join(missing[:-1]) + " and " + missing[-1]
    root = model.parent.parent
    folders = TEXT_ENCODER_FOLDERS if companions.t5 is None or companions.clip is None else ()
    folders += VAE_FOLDERS if companions.vae is None else ()
    flags = [
        flag
        for flag, absent in (
            ("--text-encoder PATH", companions.t5 is None or companions.clip is None),
            ("--vae PATH", companions.vae is None),
        )
        if absent
    ]
    places = " or ".join(str(root / f) for f in folders)
    return (
        f"this Flux.1 transformer file needs {what}, which {'is' if len(missing) == 1 else 'are'} "
        f"neither given ({' and '.join(flags)}) nor found in {places}."
    )
