"""Models kept as split files, as ComfyUI and Forge users keep Flux.1, Chroma, SD3.x, Z-Image
and Qwen-Image: a transformer file (in `diffusion_models/` or `unet/`), its text encoders (in
`text_encoders/` or `clip/`) and its VAE (in `vae/`), each a file of its own (`.safetensors`,
bf16/fp16 or fp8, or `.gguf`: every file is read through `Checkpoint`, which dequantises fp8 and
GGUF weights, see `quantized.py`); and Stability AI's SD3.x checkpoints, which may carry their
text encoders and VAE inside the same file.

Each transformer layout is one entry of `LAYOUTS`: the keys that mark it, how its config is
read from tensor names and shapes (block counts, widths, head size, embeddings present or
not), the one table that maps its keys to diffusers names in both directions, and the
companions it runs with. Layouts here: Black Forest Labs' (Flux.1 dev/schnell; Chroma, told
apart by its `distilled_guidance_layer`), Stability AI's MMDiT (SD3, SD3.5 Large and Medium),
Z-Image's original layout (fused qkv, final_layer, x_embedder; a Qwen3 text encoder and Flux's
VAE) and Qwen-Image's (diffusers' own names; a Qwen2.5-VL text encoder in its files' older
names and a VAE in the Wan 2.1 layout, each mapped by one rename both ways). The companions
come from `--text-encoder PATH` (repeatable) and `--vae PATH`, or are found by their contents
in the usual sibling folders (a file there that cannot be read or built is passed over, named
with why); a missing one is named in one sentence. Every header is read
before any tensor; nothing reaches the network (shipped configs in `resources/configs`,
shipped CLIP, T5 and Qwen vocabularies).

torch, diffusers and transformers are imported inside the functions that use them.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.core import architecture as arch
from app.core import limits
from app.core.checkpoint import read_header
from app.core.errors import BadFileError, HalfSafeError, UnsupportedModelError

Shapes = Mapping[str, tuple[int, ...]]
Row = tuple[str, tuple[str, ...], str]  # (original key, diffusers keys, how), see `to_diffusers`

TRANSFORMER_PREFIXES = ("model.diffusion_model.", "")  # a full save, a plain transformer file
TRANSFORMER_FOLDERS = ("diffusion_models", "unet")
TEXT_ENCODER_FOLDERS = ("text_encoders", "clip")
VAE_FOLDERS = ("vae",)
CLIP_PREFIX = "text_model."
CLIP_PROJECTION = "text_projection.weight"
# Where Stability AI's all-in-one SD3.x files keep their text encoders and VAE.
SD3_INSIDE = {
    "text_encoder": "text_encoders.clip_l.transformer.",
    "text_encoder_2": "text_encoders.clip_g.transformer.",
    "text_encoder_3": "text_encoders.t5xxl.transformer.",
    "vae": arch.VAE,
}
# Companion files: safetensors, and GGUF (a T5 encoder in llama.cpp's names reads as
# transformers' layout, see quantized.transformers_names).
COMPANION_SUFFIXES = (".safetensors", ".gguf")


# What a transformer file is and what it runs with ------------------------------------------


@dataclass(frozen=True)
class Need:
    """One component a transformer runs with besides itself."""

    component: str  # the pipeline component it becomes: "text_encoder", "vae", ...
    # What file it takes, as `width_of` reads it: "clip" (hidden width), "clip_projected"
    # (projection width), "t5", "qwen3", "qwen25_vl" (hidden width); "vae" (an original-layout
    # VAE), "wan_vae" (the Wan 2.1 layout) by latent channels.
    kind: str
    words: str  # "its T5 text encoder (t5xxl)"
    fits: Callable[[int], bool]  # on the file's width (latent channels for a VAE)
    hints: tuple[str, ...] = ()  # name fragments preferred when several files fit
    inside: str | None = None  # its key prefix when the transformer's own file holds it
    pad_token: str = "<|endoftext|>"  # a CLIP tokenizer's padding (CLIP-G pads with "!")
    clip_config: str = "sd1/text_encoder"  # a CLIP's shipped config (what shapes do not say)

    @property
    def is_text_encoder(self) -> bool:
        return not self.kind.endswith("vae")


@dataclass(frozen=True)
class SplitModel:
    """A transformer file read from its header: its diffusers config and what it needs."""

    layout: str  # LAYOUTS key: "flux", "chroma", "sd3", "zimage", "qwenimage"
    title: str  # "Flux.1", "Chroma", "SD3.5 Large", "Z-Image" (for sentences)
    prefix: str  # the transformer's key prefix in the file
    config: dict[str, Any]  # the diffusers transformer's config, `_class_name` included
    architecture: str  # HalfSafe's name: "flux-dev", "chroma", "sd3", "zimage", "qwenimage"
    because: str  # one sentence: why it is this model
    needs: tuple[Need, ...]
    pipeline_class: str  # the diffusers pipeline class
    configs: str  # resources/configs folder with its scheduler and VAE configs
    scheduler: dict[str, Any]  # overrides of the shipped scheduler config
    latent_channels: int  # what its VAE must make
    native_size: int = 1024  # the pictures' side it was trained for
    # Projected CLIPs whose pooled vectors, side by side, make the transformer's pooled input.
    pooled_from: tuple[str, ...] = ()

    def rows(self) -> Iterator[Row]:
        return LAYOUTS[self.layout].table(self.config)

    @property
    def companions(self) -> tuple[Need, ...]:
        """The needs the transformer's own file does not hold."""
        return tuple(n for n in self.needs if n.inside is None)


@dataclass(frozen=True)
class Layout:
    """One transformer key layout: the keys that mark it (after the prefix), the keys that
    mark another layout instead, how a file in it is read, and its key table."""

    words: str  # "Flux-style transformer"
    markers: tuple[str, ...]
    excluded: tuple[str, ...]
    read: Callable[[Shapes, str], SplitModel]  # raises ValueError naming what does not fit
    table: Callable[[Mapping[str, Any]], Iterator[Row]]


def find_layout(shapes: Shapes) -> tuple[str, str] | None:
    """(LAYOUTS key, key prefix) of a transformer file in a layout read here, or None."""
    for name, layout in LAYOUTS.items():
        for prefix in TRANSFORMER_PREFIXES:
            if all(prefix + m in shapes for m in layout.markers) and not any(
                prefix + m in shapes for m in layout.excluded
            ):
                return name, prefix
    return None


def read_model(shapes: Shapes) -> SplitModel | None:
    """What a transformer file holds, or None when it is in no layout read here. Raises
    ValueError with words completing "this <layout words> is not one HalfSafe can build: "."""
    found = find_layout(shapes)
    if found is None:
        return None
    name, prefix = found
    return LAYOUTS[name].read(shapes, prefix)


def layout_words(shapes: Shapes) -> str:
    """ "Flux-style transformer" for the file's layout ("transformer" when none)."""
    found = find_layout(shapes)
    return LAYOUTS[found[0]].words if found else "transformer"


def weight_shape(shapes: Shapes, name: str, ndim: int, prefix: str = "") -> tuple[int, ...]:
    """The shape of a weight a config is read from: present, `ndim`-D and with no empty
    dimension (a scalar, a 1-D or a 0-wide tensor where a matrix belongs is a damaged file, not
    an IndexError or a ZeroDivisionError later). Raises ValueError naming it."""
    shape = shapes.get(prefix + name)
    if shape is None:
        raise ValueError(f"it has no {name}")
    if len(shape) != ndim:
        raise ValueError(f"its {name} has shape {list(shape)} where a {ndim}-D tensor belongs")
    if 0 in shape:
        raise ValueError(f"its {name} has shape {list(shape)}, with an empty dimension")
    return tuple(shape)


def _reader(shapes: Shapes, prefix: str):
    def w(name: str, ndim: int) -> tuple[int, ...]:
        return weight_shape(shapes, name, ndim, prefix)

    return w


class AbsurdSizes(ValueError):
    """A transformer file whose shapes describe a model beyond any real one's sizes."""


def _check(config: dict[str, Any]) -> dict[str, Any]:
    """A config within real models' sizes (app.core.limits), before anything is built."""
    try:
        limits.check_transformer_config(config)
    except ValueError as error:
        raise AbsurdSizes(str(error)) from None
    return config


def _clip_needs(pooled: int, inside: Mapping[str, str] | None = None) -> tuple[Need, Need]:
    """SD3's two CLIPs, told apart by projection width (CLIP-L's 768 and CLIP-G's 1280 make
    the transformer's 2048-wide pooled vector) and, where widths agree, by name."""
    inside = inside or {}
    return (
        Need(
            "text_encoder",
            "clip_projected",
            "its CLIP-L text encoder (clip_l)",
            lambda width: 2 * width <= pooled,
            ("clip_l", "clip-l", "clipl"),
            inside.get("text_encoder"),
        ),
        Need(
            "text_encoder_2",
            "clip_projected",
            "its CLIP-G text encoder (clip_g)",
            lambda width: pooled > width and 2 * width >= pooled,
            ("clip_g", "clip-g", "clipg"),
            inside.get("text_encoder_2"),
            pad_token="!",
            clip_config="sdxl/text_encoder_2",  # OpenCLIP ViT-bigG: gelu, not quick_gelu
        ),
    )


# Black Forest Labs' layout: Flux.1 and Chroma ----------------------------------------------

_BFL_MARKERS = ("double_blocks.0.img_attn.qkv.weight", "img_in.weight")
_CHROMA_MARKER = "distilled_guidance_layer.in_proj.weight"


def _bfl_blocks(shapes: Shapes, prefix: str) -> dict[str, Any]:
    """What Flux.1 and Chroma transformers share, read from the shapes."""
    w = _reader(shapes, prefix)
    inner, in_channels = w("img_in.weight", 2)
    head = w("double_blocks.0.img_attn.norm.query_norm.scale", 1)[0]
    mlp = w("double_blocks.0.img_mlp.0.weight", 2)[0]
    if head < 8 or inner % head or mlp != 4 * inner:
        raise ValueError(f"its blocks ({inner} wide, {head}-wide heads, MLP {mlp}) are not Flux's")
    return {
        "patch_size": 1,
        "in_channels": in_channels,
        "out_channels": w("final_layer.linear.weight", 2)[0],
        "num_layers": arch._count_indices(shapes, prefix + "double_blocks."),
        "num_single_layers": arch._count_indices(shapes, prefix + "single_blocks."),
        "attention_head_dim": head,
        "num_attention_heads": inner // head,
        "joint_attention_dim": w("txt_in.weight", 2)[1],
        # Rotary axes (index, height, width) in Flux's proportions: 16, 56, 56 of 128.
        "axes_dims_rope": [head // 8, 7 * head // 16, 7 * head // 16],
    }


def _bfl_vae(latent: int) -> Need:
    return Need("vae", "vae", "its 16-channel VAE (ae)", lambda c: c == latent, ("ae", "flux"))


def _t5(component: str, width: int, inside: str | None = None) -> Need:
    return Need(
        component, "t5", "its T5 text encoder (t5xxl)", lambda w: w == width, ("t5",), inside
    )


def _read_flux(shapes: Shapes, prefix: str) -> SplitModel:
    config = {"_class_name": "FluxTransformer2DModel", **_bfl_blocks(shapes, prefix)}
    config["pooled_projection_dim"] = _reader(shapes, prefix)("vector_in.in_layer.weight", 2)[1]
    config["guidance_embeds"] = prefix + "guidance_in.in_layer.weight" in shapes
    _check(config)
    dev = bool(config["guidance_embeds"])
    variant = "dev" if dev else "schnell"
    width = config["num_attention_heads"] * config["attention_head_dim"]
    guidance = (
        "and a guidance embedding (guidance_in), as the guidance-distilled Flux.1 dev has"
        if dev
        else "and no guidance embedding (no guidance_in), as Flux.1 schnell"
    )
    clip_width = config["pooled_projection_dim"]
    return SplitModel(
        layout="flux",
        title="Flux.1",
        prefix=prefix,
        config=config,
        architecture=f"flux-{variant}",
        because=(
            f"Flux.1 {variant}: a transformer in Black Forest Labs' layout ({prefix}double_blocks, "
            f"single_blocks) with {config['num_layers']} double and "
            f"{config['num_single_layers']} single blocks, {width} wide, taking "
            f"{config['joint_attention_dim']}-wide T5 features and a "
            f"{clip_width}-wide CLIP vector, {guidance}; flow matching."
        ),
        needs=(
            _t5("text_encoder_2", config["joint_attention_dim"]),
            Need(
                "text_encoder",
                "clip",
                "its CLIP-L text encoder (clip_l)",
                lambda w: w == clip_width,
                ("clip_l", "clip-l", "clipl"),
            ),
            _bfl_vae(config["in_channels"] // 4),
        ),
        pipeline_class="FluxPipeline",
        configs="flux",
        # Schnell's schedule differs from dev's only in not shifting by resolution.
        scheduler={"use_dynamic_shifting": dev, "shift": 3.0 if dev else 1.0},
        latent_channels=config["in_channels"] // 4,
    )


def _read_chroma(shapes: Shapes, prefix: str) -> SplitModel:
    w = _reader(shapes, prefix)
    hidden, channels = w("distilled_guidance_layer.in_proj.weight", 2)
    config = {
        "_class_name": "ChromaTransformer2DModel",
        **_bfl_blocks(shapes, prefix),
        "approximator_num_channels": channels,
        "approximator_hidden_dim": hidden,
        "approximator_layers": arch._count_indices(
            shapes, prefix + "distilled_guidance_layer.layers."
        ),
    }
    _check(config)
    width = config["num_attention_heads"] * config["attention_head_dim"]
    return SplitModel(
        layout="chroma",
        title="Chroma",
        prefix=prefix,
        config=config,
        architecture="chroma",
        because=(
            f"Chroma: a Flux-shaped transformer in Black Forest Labs' layout ({prefix}double_blocks, "
            f"single_blocks) with {config['num_layers']} double and "
            f"{config['num_single_layers']} single blocks, {width} wide, whose modulation comes "
            f"from a small approximator network (distilled_guidance_layer, "
            f"{_count(config['approximator_layers'], 'layer')}) instead of Flux's per-block modulation, "
            f"CLIP vector and guidance embedding, taking {config['joint_attention_dim']}-wide T5 "
            "features only; flow matching with real CFG."
        ),
        needs=(
            _t5("text_encoder", config["joint_attention_dim"]),
            _bfl_vae(config["in_channels"] // 4),
        ),
        pipeline_class="ChromaPipeline",
        configs="flux",  # Flux.1's VAE and FLUX.1-dev's schedule
        scheduler={},
        latent_channels=config["in_channels"] // 4,
    )


def _linear(original: str, diffusers: str) -> Iterator[Row]:
    for part in ("weight", "bias"):
        yield f"{original}.{part}", (f"{diffusers}.{part}",), "same"


def _fused(original: str, parts: tuple[str, ...]) -> Iterator[Row]:
    for part in ("weight", "bias"):
        yield f"{original}.{part}", tuple(f"{p}.{part}" for p in parts), "cat"


def _swapped(original: str, diffusers: str) -> Iterator[Row]:
    for part in ("weight", "bias"):
        yield f"{original}.{part}", (f"{diffusers}.{part}",), "swap"


def _bfl_table(config: Mapping[str, Any]) -> Iterator[Row]:
    """Black Forest Labs' names <-> diffusers' FluxTransformer2DModel and
    ChromaTransformer2DModel names. Chroma has no per-block modulation, time, vector or
    guidance embedding and no final modulation: its approximator gives them all."""
    chroma = config["_class_name"] == "ChromaTransformer2DModel"
    if chroma:
        layer = "distilled_guidance_layer"
        yield from _linear(f"{layer}.in_proj", f"{layer}.in_proj")
        for i in range(config["approximator_layers"]):
            yield from _linear(f"{layer}.layers.{i}.in_layer", f"{layer}.layers.{i}.linear_1")
            yield from _linear(f"{layer}.layers.{i}.out_layer", f"{layer}.layers.{i}.linear_2")
            yield f"{layer}.norms.{i}.scale", (f"{layer}.norms.{i}.weight",), "same"
        yield from _linear(f"{layer}.out_proj", f"{layer}.out_proj")
    else:
        yield from _linear("time_in.in_layer", "time_text_embed.timestep_embedder.linear_1")
        yield from _linear("time_in.out_layer", "time_text_embed.timestep_embedder.linear_2")
        yield from _linear("vector_in.in_layer", "time_text_embed.text_embedder.linear_1")
        yield from _linear("vector_in.out_layer", "time_text_embed.text_embedder.linear_2")
        if config["guidance_embeds"]:
            yield from _linear("guidance_in.in_layer", "time_text_embed.guidance_embedder.linear_1")
            yield from _linear(
                "guidance_in.out_layer", "time_text_embed.guidance_embedder.linear_2"
            )
    yield from _linear("txt_in", "context_embedder")
    yield from _linear("img_in", "x_embedder")
    for i in range(config["num_layers"]):
        b, d = f"double_blocks.{i}.", f"transformer_blocks.{i}."
        if not chroma:
            yield from _linear(b + "img_mod.lin", d + "norm1.linear")
            yield from _linear(b + "txt_mod.lin", d + "norm1_context.linear")
        yield from _fused(b + "img_attn.qkv", (d + "attn.to_q", d + "attn.to_k", d + "attn.to_v"))
        yield from _fused(
            b + "txt_attn.qkv",
            (d + "attn.add_q_proj", d + "attn.add_k_proj", d + "attn.add_v_proj"),
        )
        for side, added in (("img", ""), ("txt", "added_")):
            for bfl, ours in (("query", "q"), ("key", "k")):
                yield (
                    f"{b}{side}_attn.norm.{bfl}_norm.scale",
                    (f"{d}attn.norm_{added}{ours}.weight",),
                    "same",
                )
        yield from _linear(b + "img_mlp.0", d + "ff.net.0.proj")
        yield from _linear(b + "img_mlp.2", d + "ff.net.2")
        yield from _linear(b + "txt_mlp.0", d + "ff_context.net.0.proj")
        yield from _linear(b + "txt_mlp.2", d + "ff_context.net.2")
        yield from _linear(b + "img_attn.proj", d + "attn.to_out.0")
        yield from _linear(b + "txt_attn.proj", d + "attn.to_add_out")
    for i in range(config["num_single_layers"]):
        b, d = f"single_blocks.{i}.", f"single_transformer_blocks.{i}."
        if not chroma:
            yield from _linear(b + "modulation.lin", d + "norm.linear")
        yield from _fused(
            b + "linear1", (d + "attn.to_q", d + "attn.to_k", d + "attn.to_v", d + "proj_mlp")
        )
        yield from _linear(b + "linear2", d + "proj_out")
        yield b + "norm.query_norm.scale", (d + "attn.norm_q.weight",), "same"
        yield b + "norm.key_norm.scale", (d + "attn.norm_k.weight",), "same"
    yield from _linear("final_layer.linear", "proj_out")
    if not chroma:  # BFL's final modulation is (shift, scale), diffusers' (scale, shift)
        yield from _swapped("final_layer.adaLN_modulation.1", "norm_out.linear")


# Stability AI's MMDiT layout: SD3, SD3.5 Large and Medium ----------------------------------

_SD3_MARKERS = ("joint_blocks.0.x_block.attn.qkv.weight", "x_embedder.proj.weight")
SD3_HEAD = 64  # MMDiT's head width, stored only where queries and keys are normed


def _read_sd3(shapes: Shapes, prefix: str) -> SplitModel:
    w = _reader(shapes, prefix)
    width, in_channels, patch, patch_w = w("x_embedder.proj.weight", 4)
    positions = w("pos_embed", 3)[1]
    side = math.isqrt(positions)
    if patch != patch_w or side * side != positions:
        raise ValueError(
            f"its patches ({patch}x{patch_w}) or position table ({positions}) are not square"
        )
    normed = prefix + "joint_blocks.0.x_block.attn.ln_q.weight" in shapes
    head = w("joint_blocks.0.x_block.attn.ln_q.weight", 1)[0] if normed else SD3_HEAD
    if head < 8 or width % head:
        raise ValueError(f"its blocks ({width} wide) do not split into {head}-wide heads")
    layers = arch._count_indices(shapes, prefix + "joint_blocks.")
    dual = sorted(
        i for i in range(layers) if f"{prefix}joint_blocks.{i}.x_block.attn2.qkv.weight" in shapes
    )
    out = w("final_layer.linear.weight", 2)[0]
    text_width, caption = w("context_embedder.weight", 2)[1], w("context_embedder.weight", 2)[0]
    config = {
        "_class_name": "SD3Transformer2DModel",
        "sample_size": 128,  # 1024-pixel pictures; the position table covers larger ones
        "patch_size": patch,
        "in_channels": in_channels,
        "out_channels": out // (patch * patch),
        "num_layers": layers,
        "attention_head_dim": head,
        "num_attention_heads": width // head,
        "joint_attention_dim": text_width,
        "caption_projection_dim": caption,
        "pooled_projection_dim": w("y_embedder.mlp.0.weight", 2)[1],
        "pos_embed_max_size": side,
        "dual_attention_layers": dual,
        "qk_norm": "rms_norm" if normed else None,
    }
    _check(config)
    if dual:
        title, why = "SD3.5 Medium", f"{len(dual)} of them with a second attention (MMDiT-X)"
    elif normed:
        title, why = "SD3.5 Large", "RMS-normed queries and keys"
    else:
        title, why = "SD3 Medium", "no query/key norm"
    if dual and normed:
        why += " and RMS-normed queries and keys"
    inside = {c: p for c, p in SD3_INSIDE.items() if _holds(shapes, c, p)}
    carried = [
        words
        for component, words in (
            ("text_encoder", "CLIP-L"),
            ("text_encoder_2", "CLIP-G"),
            ("text_encoder_3", "T5"),
            ("vae", "VAE"),
        )
        if component in inside
    ]
    holds = (
        f", and the file carries its {_listed(carried)} too (text_encoders, first_stage_model)"
        if carried
        else ""
    )
    pooled = config["pooled_projection_dim"]
    latent = config["in_channels"]
    return SplitModel(
        layout="sd3",
        title=title,
        prefix=prefix,
        config=config,
        architecture="sd3",
        because=(
            f"{title}-shaped: an MMDiT in Stability AI's layout ({prefix}joint_blocks) with "
            f"{layers} joint blocks, {width} wide, {why}, taking {text_width}-wide T5 features "
            f"and a {pooled}-wide CLIP-L + CLIP-G vector, on {latent}-channel latents"
            f"{holds}; flow matching."
        ),
        needs=(
            *_clip_needs(pooled, inside),
            _t5("text_encoder_3", text_width, inside.get("text_encoder_3")),
            Need(
                "vae",
                "vae",
                f"its {latent}-channel SD3 VAE",
                lambda c: c == latent,
                ("sd3", "sd35"),
                inside.get("vae"),
            ),
        ),
        pipeline_class="StableDiffusion3Pipeline",
        configs="sd3",
        scheduler={},
        latent_channels=latent,
        pooled_from=("text_encoder", "text_encoder_2"),
    )


def _holds(shapes: Shapes, component: str, prefix: str) -> bool:
    """Whether an SD3.x file holds `component` under `prefix`."""
    if component == "vae":
        return prefix + "decoder.conv_in.weight" in shapes
    if component == "text_encoder_3":
        return prefix + "shared.weight" in shapes
    return prefix + CLIP_PREFIX + "embeddings.token_embedding.weight" in shapes


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _listed(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _sd3_table(config: Mapping[str, Any]) -> Iterator[Row]:
    """Stability AI's MMDiT names <-> diffusers' SD3Transformer2DModel names. The last joint
    block's context side only feeds attention (no output projection or MLP), and its
    modulation, like the final layer's, is (shift, scale) where diffusers has (scale, shift)."""
    yield "pos_embed", ("pos_embed.pos_embed",), "same"
    yield from _linear("x_embedder.proj", "pos_embed.proj")
    yield from _linear("t_embedder.mlp.0", "time_text_embed.timestep_embedder.linear_1")
    yield from _linear("t_embedder.mlp.2", "time_text_embed.timestep_embedder.linear_2")
    yield from _linear("y_embedder.mlp.0", "time_text_embed.text_embedder.linear_1")
    yield from _linear("y_embedder.mlp.2", "time_text_embed.text_embedder.linear_2")
    yield from _linear("context_embedder", "context_embedder")
    normed = config["qk_norm"] is not None
    last = config["num_layers"] - 1
    for i in range(config["num_layers"]):
        b, d = f"joint_blocks.{i}.", f"transformer_blocks.{i}."
        x, c = b + "x_block.", b + "context_block."
        yield from _linear(x + "adaLN_modulation.1", d + "norm1.linear")
        yield from _fused(x + "attn.qkv", (d + "attn.to_q", d + "attn.to_k", d + "attn.to_v"))
        yield from _linear(x + "attn.proj", d + "attn.to_out.0")
        yield from _linear(x + "mlp.fc1", d + "ff.net.0.proj")
        yield from _linear(x + "mlp.fc2", d + "ff.net.2")
        yield from _fused(
            c + "attn.qkv", (d + "attn.add_q_proj", d + "attn.add_k_proj", d + "attn.add_v_proj")
        )
        if normed:
            yield x + "attn.ln_q.weight", (d + "attn.norm_q.weight",), "same"
            yield x + "attn.ln_k.weight", (d + "attn.norm_k.weight",), "same"
            yield c + "attn.ln_q.weight", (d + "attn.norm_added_q.weight",), "same"
            yield c + "attn.ln_k.weight", (d + "attn.norm_added_k.weight",), "same"
        if i in config["dual_attention_layers"]:
            yield from _fused(
                x + "attn2.qkv", (d + "attn2.to_q", d + "attn2.to_k", d + "attn2.to_v")
            )
            yield from _linear(x + "attn2.proj", d + "attn2.to_out.0")
            if normed:
                yield x + "attn2.ln_q.weight", (d + "attn2.norm_q.weight",), "same"
                yield x + "attn2.ln_k.weight", (d + "attn2.norm_k.weight",), "same"
        if i == last:
            yield from _swapped(c + "adaLN_modulation.1", d + "norm1_context.linear")
        else:
            yield from _linear(c + "adaLN_modulation.1", d + "norm1_context.linear")
            yield from _linear(c + "attn.proj", d + "attn.to_add_out")
            yield from _linear(c + "mlp.fc1", d + "ff_context.net.0.proj")
            yield from _linear(c + "mlp.fc2", d + "ff_context.net.2")
    yield from _linear("final_layer.linear", "proj_out")
    yield from _swapped("final_layer.adaLN_modulation.1", "norm_out.linear")


# Z-Image's original layout (ComfyUI: diffusion_models/z_image_turbo_bf16.safetensors) ------

_ZIMAGE_MARKERS = (
    "layers.0.attention.qkv.weight",
    "cap_embedder.1.weight",
    "noise_refiner.0.attention.qkv.weight",
)
# Rotary table lengths (frame/caption index, height, width), which no tensor records: room for
# Z-Image's 512 caption tokens and 1024 patches a side, as its released config allows.
ZIMAGE_AXES_LENS = (1536, 512, 512)


def _bounded(*sizes: tuple[str, int, int]) -> None:
    """Each (what, size, limit) at least 1 and within real models' bounds (`limits.py`)."""
    for what, size, limit in sizes:
        if not 1 <= size <= limit:
            raise AbsurdSizes(f"its {what} ({size}) is outside 1 to {limit}")


def _read_zimage(shapes: Shapes, prefix: str) -> SplitModel:
    w = _reader(shapes, prefix)
    dim, patch_values = w("x_embedder.weight", 2)
    head = w("layers.0.attention.q_norm.weight", 1)[0]
    rows = w("layers.0.attention.qkv.weight", 2)[0]
    if patch_values % 4 or head < 8 or dim % head or head % 8:
        raise ValueError(f"its blocks ({dim} wide, {head}-wide heads) are not Z-Image's")
    heads = dim // head
    kv_heads, rest = divmod(rows // head - heads, 2)
    if rows % head or rest or kv_heads < 1:
        raise ValueError(f"its fused attention ({rows} rows) does not split into {heads} heads")
    layers = arch._count_indices(shapes, prefix + "layers.")
    refiners = arch._count_indices(shapes, prefix + "noise_refiner.")
    latent = patch_values // 4
    _bounded(
        ("number of blocks", layers, limits.MAX_TRANSFORMER_DEPTH),
        ("number of refiner blocks", refiners, limits.MAX_TRANSFORMER_DEPTH),
        ("width", dim, limits.MAX_TRANSFORMER_WIDTH),
        ("number of attention heads", heads, limits.MAX_HEADS),
        ("number of latent channels", latent, limits.MAX_IMAGE_CHANNELS),
    )
    config = {
        "_class_name": "ZImageTransformer2DModel",
        "all_patch_size": [2],
        "all_f_patch_size": [1],
        "in_channels": latent,
        "dim": dim,
        "n_layers": layers,
        "n_refiner_layers": refiners,
        "n_heads": heads,
        "n_kv_heads": kv_heads,
        "qk_norm": True,
        "cap_feat_dim": w("cap_embedder.1.weight", 2)[1],
        # Rotary axes (frame, height, width) in Z-Image's proportions: 32, 48, 48 of 128.
        "axes_dims": [head // 4, 3 * head // 8, 3 * head // 8],
        "axes_lens": list(ZIMAGE_AXES_LENS),
    }
    _check(config)
    text_width = config["cap_feat_dim"]
    return SplitModel(
        layout="zimage",
        title="Z-Image",
        prefix=prefix,
        config=config,
        architecture="zimage",
        because=(
            f"Z-Image: a single-stream transformer in its original layout ({prefix}layers, "
            f"noise_refiner, context_refiner, cap_embedder) with {layers} main and "
            f"{refiners}+{refiners} refiner blocks, {dim} wide, on {latent}-channel latents in "
            f"2x2 patches, reading {text_width}-wide Qwen3 hidden states; flow matching."
        ),
        needs=(
            Need(
                "text_encoder",
                "qwen3",
                "its Qwen3 text encoder (qwen_3_4b)",
                lambda width: width == text_width,
                ("qwen_3", "qwen3"),
            ),
            Need(
                "vae",
                "vae",
                f"its {latent}-channel VAE (Flux's ae)",
                lambda c: c == latent,
                ("ae", "flux"),
            ),
        ),
        pipeline_class="ZImagePipeline",
        configs="flux",  # Flux.1's VAE; the schedule as Z-Image Turbo's: a fixed shift of 3
        scheduler={"use_dynamic_shifting": False, "shift": 3.0},
        latent_channels=latent,
    )


def _zimage_block(b: str, modulated: bool) -> Iterator[Row]:
    parts = tuple(f"{b}attention.to_{x}.weight" for x in "qkv")
    yield b + "attention.qkv.weight", parts, "cat"
    yield b + "attention.out.weight", (b + "attention.to_out.0.weight",), "same"
    yield b + "attention.q_norm.weight", (b + "attention.norm_q.weight",), "same"
    yield b + "attention.k_norm.weight", (b + "attention.norm_k.weight",), "same"
    for name in (
        "feed_forward.w1",
        "feed_forward.w2",
        "feed_forward.w3",
        "attention_norm1",
        "ffn_norm1",
        "attention_norm2",
        "ffn_norm2",
    ):
        yield f"{b}{name}.weight", (f"{b}{name}.weight",), "same"
    if modulated:  # the context refiner has no timestep modulation
        yield from _linear(b + "adaLN_modulation.0", b + "adaLN_modulation.0")


def _zimage_table(config: Mapping[str, Any]) -> Iterator[Row]:
    """Z-Image's original names <-> diffusers' ZImageTransformer2DModel names: the attention's
    fused qkv (no bias), its out and q/k norms renamed, the patch embedder and final layer
    under the (2x2 patch, 1 frame) key diffusers keeps them by."""
    for name in ("x_pad_token", "cap_pad_token", "cap_embedder.0.weight"):
        yield name, (name,), "same"
    yield from _linear("cap_embedder.1", "cap_embedder.1")
    yield from _linear("t_embedder.mlp.0", "t_embedder.mlp.0")
    yield from _linear("t_embedder.mlp.2", "t_embedder.mlp.2")
    yield from _linear("x_embedder", "all_x_embedder.2-1")
    yield from _linear("final_layer.linear", "all_final_layer.2-1.linear")
    yield from _linear("final_layer.adaLN_modulation.1", "all_final_layer.2-1.adaLN_modulation.1")
    for i in range(config["n_refiner_layers"]):
        yield from _zimage_block(f"noise_refiner.{i}.", modulated=True)
        yield from _zimage_block(f"context_refiner.{i}.", modulated=False)
    for i in range(config["n_layers"]):
        yield from _zimage_block(f"layers.{i}.", modulated=True)


# Qwen-Image (ComfyUI: diffusion_models/qwen_image_bf16.safetensors, in diffusers' names) ---

_QWENIMAGE_MARKERS = ("transformer_blocks.0.img_mod.1.weight", "txt_norm.weight", "img_in.weight")


def _read_qwenimage(shapes: Shapes, prefix: str) -> SplitModel:
    w = _reader(shapes, prefix)
    inner, in_channels = w("img_in.weight", 2)
    head = w("transformer_blocks.0.attn.norm_q.weight", 1)[0]
    if head < 16 or inner % head or head % 16 or in_channels % 4:
        raise ValueError(f"its blocks ({inner} wide, {head}-wide heads) are not Qwen-Image's")
    config = {
        "_class_name": "QwenImageTransformer2DModel",
        "patch_size": 2,
        "in_channels": in_channels,
        "out_channels": w("proj_out.weight", 2)[0] // 4,
        "num_layers": arch._count_indices(shapes, prefix + "transformer_blocks."),
        "attention_head_dim": head,
        "num_attention_heads": inner // head,
        "joint_attention_dim": w("txt_norm.weight", 1)[0],
        "guidance_embeds": False,
        # Rotary axes (frame, height, width) in Qwen-Image's proportions: 16, 56, 56 of 128.
        "axes_dims_rope": [head // 8, 7 * head // 16, 7 * head // 16],
    }
    _check(config)
    latent = in_channels // 4
    text_width = config["joint_attention_dim"]
    return SplitModel(
        layout="qwenimage",
        title="Qwen-Image",
        prefix=prefix,
        config=config,
        architecture="qwenimage",
        because=(
            f"Qwen-Image: an MMDiT transformer file in diffusers' names ({prefix}"
            f"transformer_blocks with img_mod, txt_norm) with {config['num_layers']} blocks, "
            f"{inner} wide, on {latent}-channel latents in 2x2 patches, reading "
            f"{text_width}-wide Qwen2.5-VL hidden states; flow matching with real CFG."
        ),
        needs=(
            Need(
                "text_encoder",
                "qwen25_vl",
                "its Qwen2.5-VL text encoder (qwen_2.5_vl_7b)",
                lambda width: width == text_width,
                ("qwen_2.5", "qwen2.5", "qwen25"),
            ),
            Need(
                "vae",
                "wan_vae",
                "its VAE (qwen_image_vae)",
                lambda c: c == latent,
                ("qwen_image", "qwen"),
            ),
        ),
        pipeline_class="QwenImagePipeline",
        # Flux.1's flow-matching schedule reshaped as Qwen-Image's: an exponential,
        # resolution-dependent shift ending at sigma 0.02. Its VAE's config comes from shapes.
        configs="flux",
        scheduler={
            "shift": 1.0,
            "max_shift": 0.9,
            "max_image_seq_len": 8192,
            "shift_terminal": 0.02,
            "time_shift_type": "exponential",
        },
        native_size=1328,
        latent_channels=latent,
    )


def _qwenimage_table(config: Mapping[str, Any]) -> Iterator[Row]:
    """Qwen-Image's files keep diffusers' QwenImageTransformer2DModel names: every row is the
    key itself."""
    names = [
        "time_text_embed.timestep_embedder.linear_1",
        "time_text_embed.timestep_embedder.linear_2",
    ]
    names += ["img_in", "txt_in", "norm_out.linear", "proj_out"]
    yield "txt_norm.weight", ("txt_norm.weight",), "same"
    for i in range(config["num_layers"]):
        b = f"transformer_blocks.{i}."
        for norm in ("norm_q", "norm_k", "norm_added_q", "norm_added_k"):
            yield f"{b}attn.{norm}.weight", (f"{b}attn.{norm}.weight",), "same"
        names += [
            b + name
            for name in (
                "img_mod.1",
                "txt_mod.1",
                "attn.to_q",
                "attn.to_k",
                "attn.to_v",
                "attn.add_q_proj",
                "attn.add_k_proj",
                "attn.add_v_proj",
                "attn.to_out.0",
                "attn.to_add_out",
                "img_mlp.net.0.proj",
                "img_mlp.net.2",
                "txt_mlp.net.0.proj",
                "txt_mlp.net.2",
            )
        ]
    for name in names:
        yield from _linear(name, name)


# The layouts, first match wins (Chroma before Flux.1: the same blocks, and more).
LAYOUTS: dict[str, Layout] = {
    "chroma": Layout(
        "Chroma-style transformer", (*_BFL_MARKERS, _CHROMA_MARKER), (), _read_chroma, _bfl_table
    ),
    "flux": Layout(
        "Flux-style transformer", _BFL_MARKERS, (_CHROMA_MARKER,), _read_flux, _bfl_table
    ),
    "sd3": Layout("SD3-style transformer", _SD3_MARKERS, (), _read_sd3, _sd3_table),
    "zimage": Layout("Z-Image-style transformer", _ZIMAGE_MARKERS, (), _read_zimage, _zimage_table),
    "qwenimage": Layout(
        "Qwen-Image-style transformer", _QWENIMAGE_MARKERS, (), _read_qwenimage, _qwenimage_table
    ),
}


# Key mapping, both directions ---------------------------------------------------------------


def _swap_halves(tensor):
    import torch

    first, second = tensor.chunk(2, dim=0)
    return torch.cat([second, first], dim=0)


def to_diffusers(
    rows: Iterator[Row], tensors: Mapping[str, Any], expected: Shapes, prefix: str = ""
) -> dict[str, Any]:
    """Original-layout tensors -> diffusers names, by a layout's rows: "same" (renamed), "cat"
    (fused along dim 0; `expected` gives the parts' sizes) or "swap" (a modulation's shift and
    scale halves swapped). Raises KeyError for a missing key, ValueError for a misfit."""
    import torch

    state: dict[str, Any] = {}
    for original, names, how in rows:
        tensor = tensors[prefix + original]
        if how == "cat":
            sizes = [expected[n][0] for n in names]
            if sum(sizes) != tensor.shape[0]:
                raise ValueError(
                    f"{prefix + original} has {tensor.shape[0]} rows, not {sum(sizes)}"
                )
            state.update(zip(names, torch.split(tensor, sizes, dim=0), strict=True))
        elif how == "swap":
            state[names[0]] = _swap_halves(tensor)
        else:
            state[names[0]] = tensor
    return state


def to_original(rows: Iterator[Row], state: Mapping[str, Any]) -> dict[str, Any]:
    """A diffusers transformer's state dict under the original layout's names (what a
    transformer file in ComfyUI's `diffusion_models/` holds), by the same rows."""
    import torch

    out: dict[str, Any] = {}
    for original, names, how in rows:
        if how == "cat":
            out[original] = torch.cat([state[n] for n in names], dim=0)
        elif how == "swap":
            out[original] = _swap_halves(state[names[0]])
        else:
            out[original] = state[names[0]]
    return out


# Text encoders -----------------------------------------------------------------------------


def encoder_kind(shapes: Shapes) -> str | None:
    """ "t5", "clip", "qwen3" or "qwen25_vl" for a text-encoder file in the layout its files
    use (transformers' names; Qwen2.5-VL's older model.*, visual.*), else None."""
    if "encoder.block.0.layer.0.SelfAttention.q.weight" in shapes and "shared.weight" in shapes:
        return "t5"
    if CLIP_PREFIX + "embeddings.token_embedding.weight" in shapes:
        return "clip"
    if is_qwen25_vl(shapes):
        return "qwen25_vl"
    if qwen3_prefix(shapes) is not None:
        return "qwen3"
    return None


def t5_config(shapes: Shapes) -> dict[str, Any]:
    """A T5EncoderModel config from a T5 encoder file's shapes (T5 v1.1: gated GELU). Raises
    ValueError naming what does not fit (sizes: `limits.check_text_encoder_config`)."""
    vocab, width = weight_shape(shapes, "shared.weight", 2)
    block = "encoder.block.0.layer."
    buckets, heads = weight_shape(
        shapes, block + "0.SelfAttention.relative_attention_bias.weight", 2
    )
    inner = weight_shape(shapes, block + "0.SelfAttention.q.weight", 2)[0]
    gated = block + "1.DenseReluDense.wi_0.weight" in shapes
    d_ff = weight_shape(shapes, f"{block}1.DenseReluDense.{'wi_0' if gated else 'wi'}.weight", 2)[0]
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
    vocab, width = weight_shape(shapes, "embed_tokens.weight", 2, prefix)
    head = weight_shape(shapes, "layers.0.self_attn.q_norm.weight", 1, prefix)[0]
    queries = weight_shape(shapes, "layers.0.self_attn.q_proj.weight", 2, prefix)[0]
    keys = weight_shape(shapes, "layers.0.self_attn.k_proj.weight", 2, prefix)[0]
    if queries % head or keys % head:
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
        "intermediate_size": weight_shape(shapes, "layers.0.mlp.gate_proj.weight", 2, prefix)[0],
        "num_hidden_layers": layers,
        "num_attention_heads": queries // head,
        "num_key_value_heads": keys // head,
        "head_dim": head,
    }


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
    vocab, width = weight_shape(shapes, "model.embed_tokens.weight", 2)
    queries = weight_shape(shapes, "model.layers.0.self_attn.q_proj.weight", 2)[0]
    keys = weight_shape(shapes, "model.layers.0.self_attn.k_proj.weight", 2)[0]
    head = QWEN25_VL_HEAD
    if queries % head or keys % head:
        raise ValueError(f"its attention ({queries} wide) does not split into {head}-wide heads")
    layers = arch._count_indices(shapes, "model.layers.")
    vision = weight_shape(shapes, "visual.patch_embed.proj.weight", 5)[0]
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
            "intermediate_size": weight_shape(shapes, "model.layers.0.mlp.gate_proj.weight", 2)[0],
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
            "intermediate_size": weight_shape(shapes, "visual.blocks.0.mlp.gate_proj.weight", 2)[0],
            "num_heads": max(1, vision // QWEN25_VL_VISION_HEAD),
            "out_hidden_size": weight_shape(shapes, "visual.merger.mlp.2.weight", 2)[0],
            "fullatt_block_indexes": QWEN25_VL_FULL_ATTENTION,
        },
        "tie_word_embeddings": False,
    }


# VAEs ---------------------------------------------------------------------------------------

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
    base = weight_shape(shapes, "encoder.conv1.weight", 5)[0]
    mult = []
    for level in range(levels):
        name = f"encoder.downsamples.{level * (blocks + 1)}.residual.6.weight"
        width = weight_shape(shapes, name, 5)[0]
        if width % base:
            raise ValueError(f"its level {level} ({width} wide) is not a multiple of {base}")
        mult.append(width // base)
    temporal = [
        f"encoder.downsamples.{level * (blocks + 1) + blocks}.time_conv.weight" in shapes
        for level in range(levels - 1)
    ]
    _bounded(("width", base * max(mult), limits.MAX_CHANNELS))
    return {
        "base_dim": base,
        "z_dim": weight_shape(shapes, "conv2.weight", 5)[0],
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


# Companions --------------------------------------------------------------------------------

# Directory entries looked at in one sibling folder (a models folder holds dozens of files).
MAX_FOLDER_ENTRIES = 10_000
# Headers read when looking for one component. Files whose name says what they are come first,
# then the largest (a text encoder or VAE is megabytes, junk rarely is): junk hides a companion
# only when more than this many files rank above it.
MAX_CANDIDATES = 256
# What a file of each kind is called when it is passed over.
_KIND_WORDS = {
    "t5": "T5 text encoder",
    "clip": "CLIP text encoder",
    "clip_projected": "CLIP text encoder",
    "qwen3": "Qwen3 text encoder",
    "qwen25_vl": "Qwen2.5-VL text encoder",
    "vae": "VAE",
    "wan_vae": "VAE",
}
_PASSED_OVER_SHOWN = 3  # files a sentence names before "and N more"


@dataclass(frozen=True)
class Companions:
    """The files a split transformer runs with (by component, None where missing), the other
    files that fit a component as well as the one chosen, and the files in the sibling folders
    passed over, each with why (words completing "<file>: ")."""

    found: dict[str, Path | None]
    looked_in: tuple[Path, ...]
    also_fit: dict[str, tuple[Path, ...]] = field(default_factory=dict)
    passed_over: dict[Path, str] = field(default_factory=dict)

    def missing(self) -> list[str]:
        return [c for c, path in self.found.items() if path is None]

    def used(self) -> dict[str, str]:
        """component -> the companion file it is read from, as reports name it."""
        return {c: str(path) for c, path in self.found.items() if path is not None}


@dataclass(frozen=True)
class _File:
    path: Path
    size: int


def _siblings(model: Path, folders: tuple[str, ...]) -> list[Path]:
    """Folders named `folders` beside the transformer's folder (ComfyUI's models/ tree)."""
    root = model.parent.parent
    return [root / name for name in folders if (root / name).is_dir()]


def _files(folders: list[Path]) -> list[_File]:
    """The .safetensors and .gguf files in `folders`, at most MAX_FOLDER_ENTRIES entries looked
    at in each; an unreadable folder or entry is left out."""
    found: list[_File] = []
    for folder in folders:
        try:
            with os.scandir(folder) as listing:
                for count, entry in enumerate(listing):
                    if count >= MAX_FOLDER_ENTRIES:
                        break
                    if not entry.name.lower().endswith(COMPANION_SUFFIXES):
                        continue
                    with contextlib.suppress(OSError):
                        if entry.is_file():  # follows a symlink, as the loader will
                            found.append(_File(Path(entry.path), entry.stat().st_size))
        except OSError:
            continue
    return found


def _ranked(need: Need, files: list[_File]) -> list[_File]:
    """The files worth reading for `need`, best first, at most MAX_CANDIDATES of them: named
    for it, then the largest, then by name."""
    ranked = sorted(files, key=lambda f: (not _hinted(need, f.path), -f.size, f.path.name))
    return ranked[:MAX_CANDIDATES]


def width_of(kind: str, shapes: Shapes) -> int | None:
    """What a companion file offers for a need of `kind`: a text encoder's width (a CLIP's
    projection width for "clip_projected") or a VAE's latent channels; None when it is not
    that kind of file. The component it would become is read from the shapes first, as the
    loader reads it, and checked against real models' sizes: a file of that kind that cannot
    be built raises ValueError naming what does not fit (nothing is built here)."""
    if kind == "vae":
        if "decoder.conv_in.weight" not in shapes:
            return None
        config = arch.infer_vae_config(shapes, {}, prefix="")
        limits.check_vae_config(config)
        return config["latent_channels"]
    if kind == "wan_vae":
        return wan_vae_config(shapes)["z_dim"] if is_wan_vae(shapes) else None
    found = encoder_kind(shapes)
    if kind == "t5" and found == "t5":
        config = t5_config(shapes)
        limits.check_text_encoder_config(config)
        return config["d_model"]
    if kind in ("clip", "clip_projected") and found == "clip":
        if kind == "clip_projected" and CLIP_PROJECTION not in shapes:
            return None  # a CLIP without a projection is not what this need takes
        layout = arch.TextEncoderLayout("text_encoder", CLIP_PREFIX, "hf")
        config = arch.infer_text_encoder_config(shapes, {}, layout)
        limits.check_text_encoder_config(config)
        if kind == "clip":
            return config["hidden_size"]
        return weight_shape(shapes, CLIP_PROJECTION, 2)[0]
    if kind == "qwen3" and found == "qwen3":
        config = qwen3_config(shapes, qwen3_prefix(shapes) or "")
        limits.check_text_encoder_config(config)
        return config["hidden_size"]
    if kind == "qwen25_vl" and found == "qwen25_vl":
        config = qwen25_vl_config(shapes)["text_config"]
        limits.check_text_encoder_config(config)
        return config["hidden_size"]
    return None


def _hinted(need: Need, path: Path) -> bool:
    """Whether the file's name has a word starting with one of the need's hints ("t5xxl_fp16"
    says t5, "sd3_vae" says sd3 but not ae)."""
    stem = path.stem.lower()
    return any(re.search(rf"(^|[^a-z0-9]){re.escape(h)}", stem) for h in need.hints)


def _cannot_build(kind: str, error: Exception) -> str:
    """Why a file of `kind` cannot be built, completing "<file>: "."""
    if isinstance(error, ValueError):
        reason = str(error).rstrip(".")
    else:  # a fault no check foresaw costs this file only, named as such
        words = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
        reason = (
            f"HalfSafe could not read it ({type(error).__name__}{': ' + words if words else ''})"
        )
    return f"this {_KIND_WORDS[kind]} cannot be built: {reason}"


class _Search:
    """One search of the sibling folders: each file's header is read once, and a file that
    cannot be read, or not built as what it holds, is passed over with why."""

    def __init__(self) -> None:
        self.headers: dict[Path, Shapes | None] = {}
        self.passed_over: dict[Path, str] = {}

    def shapes(self, path: Path) -> Shapes | None:
        if path not in self.headers:
            try:
                self.headers[path] = read_header(path).shapes()
            except HalfSafeError as error:
                problem = getattr(error, "problem", str(error))
                self.passed_over[path] = problem.rstrip(".")
                self.headers[path] = None
            except Exception as error:  # one file's fault costs that file only
                self.passed_over[path] = f"the file cannot be read ({type(error).__name__})"
                self.headers[path] = None
        return self.headers[path]

    def fits(self, need: Need, path: Path) -> bool:
        shapes = self.shapes(path)
        if shapes is None:
            return False
        try:
            return _fits(need, shapes)
        except Exception as error:  # ValueError: damaged shapes; anything else: unforeseen
            self.passed_over.setdefault(path, _cannot_build(need.kind, error))
            return False


def find_companions(
    model: Path, split_model: SplitModel, text_encoders: list[str], vae: str | None
) -> Companions:
    """The companions of a transformer file: the files given first (each must fit one of
    its needs and be buildable: a sentence otherwise), then the sibling folders, by contents
    (a T5 as wide as the transformer's text input, a CLIP of the width it takes, a VAE whose
    latent channels fit, each readable as the loader will read it), preferring a file whose
    name says what it is where several fit, then the first by name. Headers only, at most
    MAX_CANDIDATES per component (see `_ranked`). A file in the folders that cannot be read
    or built is passed over with why, never raised."""
    needs = split_model.companions
    found: dict[str, Path | None] = {n.component: None for n in needs}
    for given in text_encoders:
        path = Path(given).expanduser()
        if not path.is_file():
            raise BadFileError(path, "the text encoder does not exist (no such file).")
        if path.suffix.lower() not in COMPANION_SUFFIXES:
            raise UnsupportedModelError(
                path, "split text encoders are read from .safetensors or .gguf files."
            )
        shapes = read_header(path).shapes()
        if encoder_kind(shapes) is None:
            raise UnsupportedModelError(
                path,
                "this is not a text encoder HalfSafe reads (CLIP, T5, Qwen3 or Qwen2.5-VL in the "
                "layout their files use).",
            )
        open_needs = [n for n in needs if n.is_text_encoder and found[n.component] is None]
        if not any(n.is_text_encoder for n in needs):
            raise UnsupportedModelError(
                path,
                f"the {split_model.title} file given with it carries its own text encoders, so "
                "--text-encoder has nothing to add.",
            )
        fitting = []
        for need in open_needs:
            try:
                if _fits(need, shapes):
                    fitting.append(need)
            except ValueError as error:
                raise UnsupportedModelError(path, _cannot_build(need.kind, error) + ".") from None
        if not fitting:
            raise UnsupportedModelError(
                path,
                f"this text encoder fits none of what this {split_model.title} transformer "
                f"still needs ({_listed([n.words for n in open_needs] or ['nothing'])}).",
            )
        need = next((n for n in fitting if _hinted(n, path)), fitting[0])
        found[need.component] = path
    if vae is not None:  # in place of the file's own VAE too, as for any checkpoint
        found["vae"] = Path(vae).expanduser()
    folders = _siblings(model, TEXT_ENCODER_FOLDERS)
    vae_folders = _siblings(model, VAE_FOLDERS)
    files = {True: _files(folders), False: _files(vae_folders)}  # by need.is_text_encoder
    search = _Search()
    also_fit: dict[str, tuple[Path, ...]] = {}
    for component in [c for c, path in found.items() if path is None]:
        need = next(n for n in needs if n.component == component)
        taken = set(found.values())
        fitting = [
            f.path
            for f in _ranked(need, files[need.is_text_encoder])
            if f.path not in taken and search.fits(need, f.path)
        ]
        fitting.sort(key=lambda p: (not _hinted(need, p), p.name, str(p)))
        if fitting:
            found[component], others = fitting[0], tuple(fitting[1:])
            if others:
                also_fit[component] = others
    return Companions(found, tuple(folders + vae_folders), also_fit, search.passed_over)


def _fits(need: Need, shapes: Shapes) -> bool:
    """Whether a file fits `need`; ValueError when it is of its kind but cannot be built."""
    width = width_of(need.kind, shapes)
    return width is not None and need.fits(width)


def _passed_over_words(passed: list[tuple[Path, str]]) -> str:
    """ "a.safetensors (why), b.gguf (why) and 4 more" """
    shown = [f"{path} ({why})" for path, why in passed[:_PASSED_OVER_SHOWN]]
    rest = len(passed) - len(shown)
    return _listed(shown + ([f"{rest} more"] if rest else []))


def companion_notes(split_model: SplitModel, companions: Companions) -> list[str]:
    """Sentences for a report on the companions found in the folders: which file was used
    where several fit, and the files passed over."""
    notes = []
    for need in split_model.companions:
        chosen, others = (
            companions.found.get(need.component),
            companions.also_fit.get(need.component),
        )
        if chosen is not None and others:
            flag = "--text-encoder PATH" if need.is_text_encoder else "--vae PATH"
            notes.append(
                f"Several files fit {need.words}: HalfSafe used {chosen} as {need.component}, "
                f"not {_listed([str(p) for p in others])}; give {flag} to use another."
            )
    passed = list(companions.passed_over.items())
    if passed:
        notes.append(f"Passed over in the model folders: {_passed_over_words(passed)}.")
    return notes


def missing_sentence(split_model: SplitModel, companions: Companions, model: Path) -> str | None:
    """One sentence naming what a transformer file still needs, or None."""
    absent = [n for n in split_model.companions if companions.found.get(n.component) is None]
    if not absent:
        return None
    words = [n.words for n in absent]
    text = any(n.is_text_encoder for n in absent)
    image = any(not n.is_text_encoder for n in absent)
    root = model.parent.parent
    folders = (TEXT_ENCODER_FOLDERS if text else ()) + (VAE_FOLDERS if image else ())
    flags = [
        flag for flag, wanted in (("--text-encoder PATH", text), ("--vae PATH", image)) if wanted
    ]
    places = " or ".join(str(root / f) for f in folders)
    # The files passed over where it was looked for may be the one the user meant.
    passed = [
        (path, why) for path, why in companions.passed_over.items() if path.parent.name in folders
    ]
    return (
        f"this {split_model.title} transformer file needs {_listed(words)}, which "
        f"{'is' if len(absent) == 1 else 'are'} neither given ({' and '.join(flags)}) nor "
        f"found in {places}"
        + (f" (passed over: {_passed_over_words(passed)})" if passed else "")
        + "."
    )
