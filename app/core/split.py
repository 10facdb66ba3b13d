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
from app.core import limits
from app.core.checkpoint import read_safetensors_header
from app.core.errors import BadFileError, HalfSafeError, UnsupportedModelError

Shapes = Mapping[str, tuple[int, ...]]

FLUX_PREFIXES = ("model.diffusion_model.", "")  # a ComfyUI full save, a plain transformer file
TRANSFORMER_FOLDERS = ("diffusion_models", "unet")
TEXT_ENCODER_FOLDERS = ("text_encoders", "clip")
VAE_FOLDERS = ("vae",)
MAX_SIBLINGS = 64  # files whose headers are read when looking for companions
CLIP_PREFIX = "text_model."


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
            yield path, read_safetensors_header(path).shapes()


def _siblings(model: Path, folders: tuple[str, ...]) -> list[Path]:
    """Folders named `folders` beside the transformer's folder (ComfyUI's models/ tree)."""
    root = model.parent.parent
    return [root / name for name in folders if (root / name).is_dir()]


def _files(folders: list[Path]) -> list[Path]:
    found: list[Path] = []
    for folder in folders:
        with contextlib.suppress(OSError):
            found += sorted(p for p in folder.iterdir() if p.suffix == ".safetensors")
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
        if path.suffix.lower() != ".safetensors":
            raise UnsupportedModelError(path, "split text encoders are read from .safetensors.")
        kind = encoder_kind(read_safetensors_header(path).shapes())
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


# Z-Image (ComfyUI: diffusion_models/z_image_*.safetensors, text_encoders/qwen_3_4b, vae/ae) ---

ZIMAGE_PREFIXES = ("model.diffusion_model.", "")
# Rotary table lengths (frame/caption index, height, width), which no tensor records: room for
# Z-Image's 512 caption tokens and 1024 patches a side, as its released config allows.
ZIMAGE_AXES_LENS = (1536, 512, 512)
QWEN3_PREFIXES = ("model.", "")  # transformers' Qwen3ForCausalLM names, or Qwen3Model's
# Qwen3's settings that no tensor records (Qwen3-4B's config.json).
QWEN3_FIXED: dict[str, Any] = {
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 40960,
    "hidden_act": "silu",
    "attention_bias": False,
    "tie_word_embeddings": True,
}
# Z-Image's original names -> diffusers' (the renames of its single-file layout); the fused
# qkv is split into to_q, to_k, to_v. One list serves both directions.
_ZIMAGE_RENAMES = (
    ("final_layer.", "all_final_layer.2-1."),
    ("x_embedder.", "all_x_embedder.2-1."),
    (".attention.out.", ".attention.to_out.0."),
    (".attention.q_norm.", ".attention.norm_q."),
    (".attention.k_norm.", ".attention.norm_k."),
)
_ZIMAGE_QKV = (".attention.to_q.", ".attention.to_k.", ".attention.to_v.")


def _bounded(*sizes: tuple[str, int, int]) -> None:
    """Each (what, size, limit) at least 1 and within real models' bounds (`limits.py`)."""
    for what, size, limit in sizes:
        if not 1 <= size <= limit:
            raise ValueError(f"its {what} ({size}) is outside 1 to {limit}")


def zimage_prefix(shapes: Shapes) -> str | None:
    """The key prefix of a Z-Image transformer in its original layout, or None."""
    for prefix in ZIMAGE_PREFIXES:
        if (
            prefix + "layers.0.attention.qkv.weight" in shapes
            and prefix + "cap_embedder.1.weight" in shapes
            and prefix + "noise_refiner.0.attention.qkv.weight" in shapes
        ):
            return prefix
    return None


def zimage_transformer_config(shapes: Shapes, prefix: str) -> dict[str, Any]:
    """A ZImageTransformer2DModel config from an original-layout file's shapes. Raises
    ValueError naming what does not fit."""

    def w(name: str) -> tuple[int, ...]:
        shape = shapes.get(prefix + name)
        if shape is None or not shape:
            raise ValueError(f"it has no {name}")
        return shape

    dim, patch_values = w("x_embedder.weight")
    head = w("layers.0.attention.q_norm.weight")[0]
    rows = w("layers.0.attention.qkv.weight")[0]
    if patch_values % 4 or dim % head or head % 8:
        raise ValueError(f"its blocks ({dim} wide, {head}-wide heads) are not Z-Image's")
    heads = dim // head
    kv_heads, rest = divmod(rows // head - heads, 2)
    if rows % head or rest or kv_heads < 1:
        raise ValueError(f"its fused attention ({rows} rows) does not split into {heads} heads")
    layers = arch._count_indices(shapes, prefix + "layers.")
    refiners = arch._count_indices(shapes, prefix + "noise_refiner.")
    _bounded(
        ("number of blocks", layers, limits.MAX_TRANSFORMER_DEPTH),
        ("number of refiner blocks", refiners, limits.MAX_TRANSFORMER_DEPTH),
        ("width", dim, limits.MAX_WIDTH),
        ("number of attention heads", heads, limits.MAX_HEADS),
        ("number of latent channels", patch_values // 4, limits.MAX_IMAGE_CHANNELS),
    )
    return {
        "_class_name": "ZImageTransformer2DModel",
        "all_patch_size": [2],
        "all_f_patch_size": [1],
        "in_channels": patch_values // 4,
        "dim": dim,
        "n_layers": layers,
        "n_refiner_layers": refiners,
        "n_heads": heads,
        "n_kv_heads": kv_heads,
        "qk_norm": True,
        "cap_feat_dim": w("cap_embedder.1.weight")[1],
        # Rotary axes (frame, height, width) in Z-Image's proportions: 32, 48, 48 of 128.
        "axes_dims": [head // 4, 3 * head // 8, 3 * head // 8],
        "axes_lens": list(ZIMAGE_AXES_LENS),
    }


def describe_zimage(config: Mapping[str, Any], prefix: str) -> tuple[str, str]:
    """(architecture, the "why" sentence) for a Z-Image transformer file."""
    return (
        "zimage",
        f"Z-Image: a single-stream transformer in its original layout ({prefix}layers, "
        f"noise_refiner, context_refiner, cap_embedder) with {config['n_layers']} main and "
        f"{config['n_refiner_layers']}+{config['n_refiner_layers']} refiner blocks, "
        f"{config['dim']} wide, on {config['in_channels']}-channel latents in 2x2 patches, "
        f"reading {config['cap_feat_dim']}-wide Qwen3 hidden states; flow matching.",
    )


def _zimage_name(diffusers_key: str) -> str:
    name = diffusers_key
    for original, renamed in _ZIMAGE_RENAMES:
        if name.startswith(renamed) or (renamed.startswith(".") and renamed in name):
            name = name.replace(renamed, original, 1)
    return name


def _zimage_table(expected: Shapes) -> Iterator[tuple[str, tuple[str, ...], str]]:
    """(original key, diffusers keys, how) for every weight of a ZImageTransformer2DModel
    whose state dict has the keys of `expected`: "same", or "cat" for the fused qkv."""
    for key in expected:
        if _ZIMAGE_QKV[0] in key:
            parts = tuple(key.replace(_ZIMAGE_QKV[0], part) for part in _ZIMAGE_QKV)
            yield key.replace(_ZIMAGE_QKV[0], ".attention.qkv."), parts, "cat"
        elif not any(part in key for part in _ZIMAGE_QKV):
            yield _zimage_name(key), (key,), "same"


def zimage_to_diffusers(
    tensors: Mapping[str, Any], expected: Shapes, prefix: str = ""
) -> dict[str, Any]:
    """Original-layout tensors -> diffusers names; `expected` is the empty model's shapes.
    Raises KeyError for a missing key, ValueError for a fused tensor of the wrong size."""
    import torch

    state: dict[str, Any] = {}
    for original, names, how in _zimage_table(expected):
        tensor = tensors[prefix + original]
        if how == "cat":
            sizes = [expected[n][0] for n in names]
            if sum(sizes) != tensor.shape[0]:
                raise ValueError(
                    f"{prefix + original} has {tensor.shape[0]} rows, not {sum(sizes)}"
                )
            state.update(zip(names, torch.split(tensor, sizes, dim=0), strict=True))
        else:
            state[names[0]] = tensor
    return state


def zimage_to_original(state: Mapping[str, Any]) -> dict[str, Any]:
    """A diffusers ZImageTransformer2DModel state dict under its original names (what a
    Z-Image file in ComfyUI's `diffusion_models/` holds)."""
    import torch

    expected = {k: tuple(v.shape) for k, v in state.items()}
    out: dict[str, Any] = {}
    for original, names, how in _zimage_table(expected):
        out[original] = torch.cat([state[n] for n in names]) if how == "cat" else state[names[0]]
    return out


def qwen3_prefix(shapes: Shapes) -> str | None:
    """The prefix of a Qwen3 text encoder in transformers' layout (q/k norms set Qwen3 apart
    from Qwen2), or None."""
    for prefix in QWEN3_PREFIXES:
        if (
            prefix + "embed_tokens.weight" in shapes
            and prefix + "layers.0.self_attn.q_norm.weight" in shapes
        ):
            return prefix
    return None


def qwen3_config(shapes: Shapes, prefix: str) -> dict[str, Any]:
    """A Qwen3Config from a Qwen3 file's shapes (the rest as Qwen3-4B has it). Raises
    ValueError naming what does not fit."""
    vocab, width = shapes[prefix + "embed_tokens.weight"]
    head = shapes[prefix + "layers.0.self_attn.q_norm.weight"][0]
    queries = shapes[prefix + "layers.0.self_attn.q_proj.weight"][0]
    keys = shapes[prefix + "layers.0.self_attn.k_proj.weight"][0]
    if not head or queries % head or keys % head:
        raise ValueError(f"its attention ({queries} wide) does not split into {head}-wide heads")
    layers = arch._count_indices(shapes, prefix + "layers.")
    _bounded(
        ("number of layers", layers, limits.MAX_TEXT_LAYERS),
        ("vocabulary size", vocab, limits.MAX_VOCAB),
        ("width", width, limits.MAX_WIDTH),
        ("number of attention heads", queries // head, limits.MAX_HEADS),
    )
    return {
        **QWEN3_FIXED,
        "vocab_size": vocab,
        "hidden_size": width,
        "intermediate_size": shapes[prefix + "layers.0.mlp.gate_proj.weight"][0],
        "num_hidden_layers": layers,
        "num_attention_heads": queries // head,
        "num_key_value_heads": keys // head,
        "head_dim": head,
    }


@dataclass(frozen=True)
class LLMCompanions:
    """The files a split transformer with one LLM text encoder runs with."""

    text_encoder: Path | None
    vae: Path | None
    looked_in: tuple[Path, ...]


def _find_vae(model: Path, vae: str | None, latent_channels: int) -> tuple[Path | None, list[Path]]:
    """The VAE given, else the first in the sibling vae/ folder whose latents fit."""
    folders = _siblings(model, VAE_FOLDERS)
    if vae is not None:
        return Path(vae).expanduser(), folders
    for path, shapes in _headers(_files(folders)):
        conv = shapes.get("decoder.conv_in.weight")
        if conv is not None and len(conv) > 1 and conv[1] == latent_channels:
            return path, folders
    return None, folders


def find_qwen3_companions(
    model: Path, text_encoders: list[str], vae: str | None, width: int, latent_channels: int
) -> LLMCompanions:
    """The Qwen3 text encoder and the VAE of a Z-Image transformer file: the files given (a
    given text encoder must be a Qwen3 one: a sentence otherwise), else the sibling folders by
    contents (a Qwen3 as wide as the transformer reads, a VAE whose latents fit)."""
    encoder = None
    for given in text_encoders:
        path = Path(given).expanduser()
        if not path.is_file():
            raise BadFileError(path, "the text encoder does not exist (no such file).")
        if path.suffix.lower() != ".safetensors":
            raise UnsupportedModelError(path, "split text encoders are read from .safetensors.")
        if qwen3_prefix(read_safetensors_header(path).shapes()) is None:
            raise UnsupportedModelError(
                path,
                "this is not a Qwen3 text encoder in transformers' layout (Z-Image reads one).",
            )
        encoder = path
    folders = _siblings(model, TEXT_ENCODER_FOLDERS)
    if encoder is None:
        for path, shapes in _headers(_files(folders)):
            prefix = qwen3_prefix(shapes)
            if prefix is not None and shapes[prefix + "embed_tokens.weight"][1] == width:
                encoder = path
                break
    vae_path, vae_folders = _find_vae(model, vae, latent_channels)
    return LLMCompanions(encoder, vae_path, tuple(folders + vae_folders))


def missing_llm_sentence(
    companions: LLMCompanions, model: Path, family: str, encoder: str, vae: str
) -> str | None:
    """One sentence naming what a split transformer with one LLM text encoder still needs."""
    missing = [
        words
        for words, absent in (
            (encoder, companions.text_encoder is None),
            (vae, companions.vae is None),
        )
        if absent
    ]
    if not missing:
        return None
    root = model.parent.parent
    folders = (TEXT_ENCODER_FOLDERS if companions.text_encoder is None else ()) + (
        VAE_FOLDERS if companions.vae is None else ()
    )
    flags = [
        flag
        for flag, absent in (
            ("--text-encoder PATH", companions.text_encoder is None),
            ("--vae PATH", companions.vae is None),
        )
        if absent
    ]
    places = " or ".join(str(root / f) for f in folders)
    return (
        f"this {family} transformer file needs {' and '.join(missing)}, which "
        f"{'is' if len(missing) == 1 else 'are'} neither given ({' and '.join(flags)}) nor "
        f"found in {places}."
    )


# Qwen-Image (ComfyUI: diffusion_models/qwen_image_*.safetensors, text_encoders/
# qwen_2.5_vl_7b.safetensors, vae/qwen_image_vae.safetensors) --------------------------------

QWENIMAGE_PREFIXES = ("model.diffusion_model.", "")  # the file keeps diffusers' own names
# Qwen2.5-VL-7B's settings that no tensor records. The vision tower is read (its weights are in
# the file) but never run for text-to-image; its heads are 80 wide.
QWEN25_VL_FIXED: dict[str, Any] = {"rope_theta": 1000000.0, "rms_norm_eps": 1e-6}
QWEN25_VL_POSITIONS = 128000
QWEN25_VL_HEAD = 128  # the language model's heads (3B to 72B alike; 28 in the 7B)
QWEN25_VL_VISION_HEAD = 80
QWEN25_VL_FULL_ATTENTION = [7, 15, 23, 31]
# The file's names (transformers before the language model moved under model.language_model)
# -> transformers' current names.
_QWEN25_VL_RENAMES = (("model.", "model.language_model."), ("visual.", "model.visual."))


def qwenimage_prefix(shapes: Shapes) -> str | None:
    """The key prefix of a Qwen-Image transformer file, or None."""
    for prefix in QWENIMAGE_PREFIXES:
        if (
            prefix + "transformer_blocks.0.img_mod.1.weight" in shapes
            and prefix + "txt_norm.weight" in shapes
            and prefix + "img_in.weight" in shapes
        ):
            return prefix
    return None


def qwenimage_transformer_config(shapes: Shapes, prefix: str) -> dict[str, Any]:
    """A QwenImageTransformer2DModel config from a file's shapes. Raises ValueError naming
    what does not fit."""

    def w(name: str) -> tuple[int, ...]:
        shape = shapes.get(prefix + name)
        if shape is None or not shape:
            raise ValueError(f"it has no {name}")
        return shape

    inner, in_channels = w("img_in.weight")
    head = w("transformer_blocks.0.attn.norm_q.weight")[0]
    if inner % head or head % 16 or in_channels % 4:
        raise ValueError(f"its blocks ({inner} wide, {head}-wide heads) are not Qwen-Image's")
    layers = arch._count_indices(shapes, prefix + "transformer_blocks.")
    _bounded(
        ("number of blocks", layers, limits.MAX_TRANSFORMER_DEPTH),
        ("width", inner, limits.MAX_WIDTH),
        ("number of attention heads", inner // head, limits.MAX_HEADS),
        ("number of latent channels", in_channels // 4, limits.MAX_IMAGE_CHANNELS),
    )
    return {
        "_class_name": "QwenImageTransformer2DModel",
        "patch_size": 2,
        "in_channels": in_channels,
        "out_channels": w("proj_out.weight")[0] // 4,
        "num_layers": layers,
        "attention_head_dim": head,
        "num_attention_heads": inner // head,
        "joint_attention_dim": w("txt_norm.weight")[0],
        "guidance_embeds": False,
        # Rotary axes (frame, height, width) in Qwen-Image's proportions: 16, 56, 56 of 128.
        "axes_dims_rope": [head // 8, 7 * head // 16, 7 * head // 16],
    }


def describe_qwenimage(config: Mapping[str, Any], prefix: str) -> tuple[str, str]:
    """(architecture, the "why" sentence) for a Qwen-Image transformer file."""
    width = config["num_attention_heads"] * config["attention_head_dim"]
    return (
        "qwenimage",
        f"Qwen-Image: an MMDiT transformer file in diffusers' names ({prefix}transformer_blocks "
        f"with img_mod, txt_norm) with {config['num_layers']} blocks, {width} wide, on "
        f"{config['in_channels'] // 4}-channel latents in 2x2 patches, reading "
        f"{config['joint_attention_dim']}-wide Qwen2.5-VL hidden states; flow matching with "
        "real CFG.",
    )


def is_qwen25_vl(shapes: Shapes) -> bool:
    """A Qwen2.5-VL file in the layout its text encoder files use (model.*, visual.*)."""
    return "model.embed_tokens.weight" in shapes and "visual.merger.mlp.2.weight" in shapes


def qwen25_vl_to_transformers(name: str) -> str | None:
    """A Qwen2.5-VL file's key -> Qwen2_5_VLForConditionalGeneration's (None: not a weight
    of it)."""
    if name == "lm_head.weight":
        return name
    for old, new in _QWEN25_VL_RENAMES:
        if name.startswith(old):
            return new + name[len(old) :]
    return None


def qwen25_vl_to_file(name: str) -> str:
    """The inverse of `qwen25_vl_to_transformers`."""
    for old, new in _QWEN25_VL_RENAMES:
        if name.startswith(new):
            return old + name[len(new) :]
    return name


def qwen25_vl_config(shapes: Shapes) -> dict[str, Any]:
    """A Qwen2_5_VLConfig (as keyword arguments) from a Qwen2.5-VL file's shapes, the rest as
    Qwen2.5-VL-7B has it. Raises ValueError naming what does not fit."""
    vocab, width = shapes["model.embed_tokens.weight"]
    queries = shapes["model.layers.0.self_attn.q_proj.weight"][0]
    keys = shapes["model.layers.0.self_attn.k_proj.weight"][0]
    head = QWEN25_VL_HEAD
    if queries % head or keys % head:
        raise ValueError(f"its attention ({queries} wide) does not split into {head}-wide heads")
    layers = arch._count_indices(shapes, "model.layers.")
    vision = shapes["visual.patch_embed.proj.weight"][0]
    depth = arch._count_indices(shapes, "visual.blocks.")
    _bounded(
        ("number of layers", layers, limits.MAX_TEXT_LAYERS),
        ("vocabulary size", vocab, limits.MAX_VOCAB),
        ("width", width, limits.MAX_WIDTH),
        ("number of attention heads", queries // head, limits.MAX_HEADS),
        ("number of vision blocks", depth, limits.MAX_TEXT_LAYERS),
        ("vision width", vision, limits.MAX_WIDTH),
    )
    half = head // 2  # rotary sections (time, height, width) as the 7B's 16, 24, 24 of 64
    return {
        "text_config": {
            **QWEN25_VL_FIXED,
            "vocab_size": vocab,
            "hidden_size": width,
            "intermediate_size": shapes["model.layers.0.mlp.gate_proj.weight"][0],
            "num_hidden_layers": layers,
            "num_attention_heads": queries // head,
            "num_key_value_heads": keys // head,
            "max_position_embeddings": QWEN25_VL_POSITIONS,
            "rope_scaling": {
                "type": "mrope",
                "mrope_section": [half // 4, half * 3 // 8, half * 3 // 8],
            },
            "tie_word_embeddings": False,
        },
        "vision_config": {
            "depth": depth,
            "hidden_size": vision,
            "intermediate_size": shapes["visual.blocks.0.mlp.gate_proj.weight"][0],
            "num_heads": max(1, vision // QWEN25_VL_VISION_HEAD),
            "out_hidden_size": shapes["visual.merger.mlp.2.weight"][0],
            "fullatt_block_indexes": QWEN25_VL_FULL_ATTENTION,
        },
        "tie_word_embeddings": False,
    }


# Qwen-Image's VAE in its original (Wan 2.1) layout: flat encoder.downsamples and
# decoder.upsamples lists of residual blocks (residual.0/2/3/6, shortcut) and resamples,
# middle.0-2, head.0/2, conv1/conv2 around the latent.
_WAN_RESIDUAL = (
    ("residual.0.", "norm1."),
    ("residual.2.", "conv1."),
    ("residual.3.", "norm2."),
    ("residual.6.", "conv2."),
    ("shortcut.", "conv_shortcut."),
)
_WAN_FIXED = (
    ("encoder.conv1.", "encoder.conv_in."),
    ("decoder.conv1.", "decoder.conv_in."),
    ("encoder.head.0.", "encoder.norm_out."),
    ("encoder.head.2.", "encoder.conv_out."),
    ("decoder.head.0.", "decoder.norm_out."),
    ("decoder.head.2.", "decoder.conv_out."),
    ("encoder.middle.0.", "encoder.mid_block.resnets.0."),
    ("encoder.middle.1.", "encoder.mid_block.attentions.0."),
    ("encoder.middle.2.", "encoder.mid_block.resnets.1."),
    ("decoder.middle.0.", "decoder.mid_block.resnets.0."),
    ("decoder.middle.1.", "decoder.mid_block.attentions.0."),
    ("decoder.middle.2.", "decoder.mid_block.resnets.1."),
    ("conv1.", "quant_conv."),
    ("conv2.", "post_quant_conv."),
)


def is_wan_vae(shapes: Shapes) -> bool:
    """A VAE in the Wan 2.1 layout Qwen-Image's VAE file keeps."""
    return "decoder.middle.0.residual.0.gamma" in shapes and "conv2.weight" in shapes


def _wan_residual(rest: str) -> str:
    for original, renamed in _WAN_RESIDUAL:
        if rest.startswith(renamed):
            return original + rest[len(renamed) :]
    return rest


def _wan_name(key: str, per_level: int) -> str:
    """A diffusers AutoencoderKLQwenImage key -> its Wan-layout name; `per_level` is the
    decoder's residual blocks per level (num_res_blocks + 1)."""
    for original, renamed in _WAN_FIXED:
        if key.startswith(renamed):
            rest = key[len(renamed) :]
            return original + (_wan_residual(rest) if "resnets" in renamed else rest)
    parts = key.split(".")
    if key.startswith("encoder.down_blocks."):
        return f"encoder.downsamples.{parts[2]}." + _wan_residual(".".join(parts[3:]))
    if key.startswith("decoder.up_blocks."):
        level = int(parts[2])
        if parts[3] == "upsamplers":
            return f"decoder.upsamples.{level * (per_level + 1) + per_level}." + ".".join(parts[5:])
        index = level * (per_level + 1) + int(parts[4])
        return f"decoder.upsamples.{index}." + _wan_residual(".".join(parts[5:]))
    return key


def wan_vae_config(shapes: Shapes) -> dict[str, Any]:
    """An AutoencoderKLQwenImage config from a Wan-layout VAE file's shapes. Raises
    ValueError naming what does not fit."""
    encoder = arch._count_indices(shapes, "encoder.downsamples.")
    decoder = arch._count_indices(shapes, "decoder.upsamples.")
    levels = decoder - encoder
    if levels < 1 or (encoder + 1) % levels:
        raise ValueError(f"its {encoder} encoder and {decoder} decoder stages do not form levels")
    blocks = (encoder + 1) // levels - 1
    _bounded(
        ("number of levels", levels, limits.MAX_LEVELS),
        ("number of blocks per level", blocks, limits.MAX_LAYERS_PER_BLOCK),
    )
    base = shapes["encoder.conv1.weight"][0]
    mult = []
    for level in range(levels):
        width = shapes[f"encoder.downsamples.{level * (blocks + 1)}.residual.6.weight"][0]
        if not base or width % base:
            raise ValueError(f"its level {level} ({width} wide) is not a multiple of {base}")
        mult.append(width // base)
    temporal = [
        f"encoder.downsamples.{level * (blocks + 1) + blocks}.time_conv.weight" in shapes
        for level in range(levels - 1)
    ]
    _bounded(("width", base * max(mult), limits.MAX_CHANNELS))
    return {
        "base_dim": base,
        "z_dim": shapes["conv2.weight"][0],
        "dim_mult": mult,
        "num_res_blocks": blocks,
        "attn_scales": [],
        "temperal_downsample": temporal,
    }


def wan_vae_to_diffusers(
    tensors: Mapping[str, Any], expected: Shapes, blocks: int
) -> dict[str, Any]:
    """Wan-layout VAE tensors -> diffusers names. Raises KeyError for a missing key."""
    return {key: tensors[_wan_name(key, blocks + 1)] for key in expected}


def wan_vae_to_original(state: Mapping[str, Any], blocks: int) -> dict[str, Any]:
    """An AutoencoderKLQwenImage state dict under its Wan-layout names (what
    vae/qwen_image_vae.safetensors holds)."""
    return {_wan_name(key, blocks + 1): tensor for key, tensor in state.items()}


def find_qwen25_vl_companions(
    model: Path, text_encoders: list[str], vae: str | None, width: int, latent_channels: int
) -> LLMCompanions:
    """The Qwen2.5-VL text encoder and the Wan-layout VAE of a Qwen-Image transformer file:
    the files given (a given text encoder must be a Qwen2.5-VL one), else the sibling folders
    by contents (a Qwen2.5-VL as wide as the transformer reads, a VAE whose latents fit)."""
    encoder = None
    for given in text_encoders:
        path = Path(given).expanduser()
        if not path.is_file():
            raise BadFileError(path, "the text encoder does not exist (no such file).")
        if path.suffix.lower() != ".safetensors":
            raise UnsupportedModelError(path, "split text encoders are read from .safetensors.")
        if not is_qwen25_vl(read_safetensors_header(path).shapes()):
            raise UnsupportedModelError(
                path, "this is not a Qwen2.5-VL text encoder (Qwen-Image reads one)."
            )
        encoder = path
    folders = _siblings(model, TEXT_ENCODER_FOLDERS)
    if encoder is None:
        for path, shapes in _headers(_files(folders)):
            if is_qwen25_vl(shapes) and shapes["model.embed_tokens.weight"][1] == width:
                encoder = path
                break
    vae_folders = _siblings(model, VAE_FOLDERS)
    vae_path = Path(vae).expanduser() if vae is not None else None
    if vae_path is None:
        for path, shapes in _headers(_files(vae_folders)):
            if is_wan_vae(shapes) and shapes["conv2.weight"][0] == latent_channels:
                vae_path = path
                break
    return LLMCompanions(encoder, vae_path, tuple(folders + vae_folders))
