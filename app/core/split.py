"""Models kept as split files, as ComfyUI and Forge users keep Flux.1, Chroma and SD3.x: a
transformer file (in `diffusion_models/` or `unet/`), its text encoders (in `text_encoders/` or
`clip/`) and its VAE (in `vae/`), each a `.safetensors` of its own; and Stability AI's SD3.x
checkpoints, which may carry their text encoders and VAE inside the same file.

Each transformer layout is one entry of `LAYOUTS`: the keys that mark it, how its config is
read from tensor names and shapes (block counts, widths, head size, embeddings present or
not), the one table that maps its keys to diffusers names in both directions, and the
companions it runs with. Layouts here: Black Forest Labs' (Flux.1 dev/schnell; Chroma, told
apart by its `distilled_guidance_layer`) and Stability AI's MMDiT (SD3, SD3.5 Large and
Medium). The companions come from `--text-encoder PATH` (repeatable) and `--vae PATH`, or are
found by their contents in the usual sibling folders; a missing one is named in one sentence.
Every header is read before any tensor; nothing reaches the network (shipped configs in
`resources/configs`, shipped CLIP and T5 vocabularies).

torch, diffusers and transformers are imported inside the functions that use them.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.core import architecture as arch
from app.core.checkpoint import read_safetensors_header
from app.core.errors import BadFileError, HalfSafeError, UnsupportedModelError

Shapes = Mapping[str, tuple[int, ...]]
Row = tuple[str, tuple[str, ...], str]  # (original key, diffusers keys, how), see `to_diffusers`

TRANSFORMER_PREFIXES = ("model.diffusion_model.", "")  # a full save, a plain transformer file
TRANSFORMER_FOLDERS = ("diffusion_models", "unet")
TEXT_ENCODER_FOLDERS = ("text_encoders", "clip")
VAE_FOLDERS = ("vae",)
MAX_SIBLINGS = 64  # files whose headers are read when looking for companions
CLIP_PREFIX = "text_model."
CLIP_PROJECTION = "text_projection.weight"
# Where Stability AI's all-in-one SD3.x files keep their text encoders and VAE.
SD3_INSIDE = {
    "text_encoder": "text_encoders.clip_l.transformer.",
    "text_encoder_2": "text_encoders.clip_g.transformer.",
    "text_encoder_3": "text_encoders.t5xxl.transformer.",
    "vae": arch.VAE,
}


# What a transformer file is and what it runs with ------------------------------------------


@dataclass(frozen=True)
class Need:
    """One component a transformer runs with besides itself."""

    component: str  # the pipeline component it becomes: "text_encoder", "vae", ...
    kind: str  # "clip" (hidden width), "clip_projected" (projection width), "t5", "vae"
    words: str  # "its T5 text encoder (t5xxl)"
    fits: Callable[[int], bool]  # on the file's width (latent channels for a VAE)
    hints: tuple[str, ...] = ()  # name fragments preferred when several files fit
    inside: str | None = None  # its key prefix when the transformer's own file holds it
    pad_token: str = "<|endoftext|>"  # a CLIP tokenizer's padding (CLIP-G pads with "!")
    clip_config: str = "sd1/text_encoder"  # a CLIP's shipped config (what shapes do not say)

    @property
    def is_text_encoder(self) -> bool:
        return self.kind != "vae"


@dataclass(frozen=True)
class SplitModel:
    """A transformer file read from its header: its diffusers config and what it needs."""

    layout: str  # LAYOUTS key: "flux", "chroma", "sd3"
    title: str  # "Flux.1", "Chroma", "SD3.5 Large" (for sentences)
    prefix: str  # the transformer's key prefix in the file
    config: dict[str, Any]  # the diffusers transformer's config, `_class_name` included
    architecture: str  # HalfSafe's name: "flux-dev", "chroma", "sd3"
    because: str  # one sentence: why it is this model
    needs: tuple[Need, ...]
    pipeline_class: str  # the diffusers pipeline class
    configs: str  # resources/configs folder with its scheduler and VAE configs
    scheduler: dict[str, Any]  # overrides of the shipped scheduler config
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


def _reader(shapes: Shapes, prefix: str):
    def w(name: str, ndim: int | None = None) -> tuple[int, ...]:
        shape = shapes.get(prefix + name)
        if shape is None:
            raise ValueError(f"it has no {name}")
        if ndim is not None and len(shape) != ndim:
            raise ValueError(f"its {name} has shape {list(shape)} where a {ndim}-D tensor belongs")
        return shape

    return w


class AbsurdSizes(ValueError):
    """A transformer file whose shapes describe a model beyond any real one's sizes."""


def _check(config: dict[str, Any]) -> dict[str, Any]:
    """A config within real models' sizes (app.core.limits), before anything is built."""
    from app.core import limits

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


# The layouts, first match wins (Chroma before Flux.1: the same blocks, and more).
LAYOUTS: dict[str, Layout] = {
    "chroma": Layout(
        "Chroma-style transformer", (*_BFL_MARKERS, _CHROMA_MARKER), (), _read_chroma, _bfl_table
    ),
    "flux": Layout(
        "Flux-style transformer", _BFL_MARKERS, (_CHROMA_MARKER,), _read_flux, _bfl_table
    ),
    "sd3": Layout("SD3-style transformer", _SD3_MARKERS, (), _read_sd3, _sd3_table),
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
    """The files a split transformer runs with (by component, None where missing)."""

    found: dict[str, Path | None]
    looked_in: tuple[Path, ...]

    def missing(self) -> list[str]:
        return [c for c, path in self.found.items() if path is None]


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


def width_of(kind: str, shapes: Shapes) -> int | None:
    """What a companion file offers for a need of `kind`: a text encoder's width (a CLIP's
    projection width for "clip_projected") or a VAE's latent channels; None when it is not
    that kind of file."""
    if kind == "vae":
        conv = shapes.get("decoder.conv_in.weight")
        return conv[1] if conv is not None and len(conv) == 4 else None
    found = encoder_kind(shapes)
    if kind == "t5" and found == "t5":
        return shapes["shared.weight"][1]
    if kind == "clip" and found == "clip":
        return shapes[CLIP_PREFIX + "embeddings.token_embedding.weight"][1]
    if kind == "clip_projected" and found == "clip":
        projection = shapes.get(CLIP_PROJECTION)
        return projection[0] if projection is not None and len(projection) == 2 else None
    return None


def _hinted(need: Need, path: Path) -> bool:
    """Whether the file's name has a word starting with one of the need's hints ("t5xxl_fp16"
    says t5, "sd3_vae" says sd3 but not ae)."""
    stem = path.stem.lower()
    return any(re.search(rf"(^|[^a-z0-9]){re.escape(h)}", stem) for h in need.hints)


def find_companions(
    model: Path, split_model: SplitModel, text_encoders: list[str], vae: str | None
) -> Companions:
    """The companions of a transformer file: the files given first (each must fit one of
    its needs: a sentence otherwise), then the sibling folders, by contents (a T5 as wide as
    the transformer's text input, a CLIP of the width it takes, a VAE whose latent channels
    fit), preferring a file whose name says what it is where several fit. Headers only."""
    needs = split_model.companions
    found: dict[str, Path | None] = {n.component: None for n in needs}
    for given in text_encoders:
        path = Path(given).expanduser()
        if not path.is_file():
            raise BadFileError(path, "the text encoder does not exist (no such file).")
        if path.suffix.lower() != ".safetensors":
            raise UnsupportedModelError(path, "split text encoders are read from .safetensors.")
        shapes = read_safetensors_header(path).shapes()
        if encoder_kind(shapes) is None:
            raise UnsupportedModelError(
                path, "this is neither a CLIP nor a T5 text encoder in transformers' layout."
            )
        open_needs = [n for n in needs if n.is_text_encoder and found[n.component] is None]
        if not any(n.is_text_encoder for n in needs):
            raise UnsupportedModelError(
                path,
                f"the {split_model.title} file given with it carries its own text encoders, so "
                "--text-encoder has nothing to add.",
            )
        fitting = [n for n in open_needs if _fits(n, shapes)]
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
    for component in [c for c, path in found.items() if path is None]:
        need = next(n for n in needs if n.component == component)
        candidates = _files(vae_folders if need.kind == "vae" else folders)
        taken = set(found.values())
        fitting = [
            p for p, shapes in _headers(candidates) if p not in taken and _fits(need, shapes)
        ]
        found[component] = next((p for p in fitting if _hinted(need, p)), None) or next(
            iter(fitting), None
        )
    return Companions(found, tuple(folders + vae_folders))


def _fits(need: Need, shapes: Shapes) -> bool:
    width = width_of(need.kind, shapes)
    return width is not None and need.fits(width)


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
    return (
        f"this {split_model.title} transformer file needs {_listed(words)}, which "
        f"{'is' if len(absent) == 1 else 'are'} neither given ({' and '.join(flags)}) nor "
        f"found in {places}."
    )
