"""Text encoders and VAEs kept as files of their own (the companions of a transformer file):
which kind a file holds, its config read from tensor shapes (T5, Qwen3, Qwen2.5-VL, Qwen3-VL;
the Wan 2.1-layout VAE, Qwen-Image 2.1's VAE), and the renames between its files' key names
and transformers' or diffusers'. Shapes and names only."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.core import limits
from app.core.formats.layouts import CLIP_PREFIX, Shapes, bounded, count_indices, weight_shape

# Text encoders -----------------------------------------------------------------------------


def encoder_kind(shapes: Shapes) -> str | None:
    """ "t5", "clip", "qwen3", "qwen25_vl" or "qwen3_vl" for a text-encoder file in the layout
    its files use (transformers' names; Qwen2.5-VL's older model.*, visual.*), else None."""
    if "encoder.block.0.layer.0.SelfAttention.q.weight" in shapes and "shared.weight" in shapes:
        return "t5"
    if CLIP_PREFIX + "embeddings.token_embedding.weight" in shapes:
        return "clip"
    if is_qwen25_vl(shapes):
        return "qwen25_vl"
    if is_qwen3_vl(shapes):
        return "qwen3_vl"
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
        "num_layers": count_indices(shapes, "encoder.block."),
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
    layers = count_indices(shapes, prefix + "layers.")
    bounded(
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
    layers = count_indices(shapes, "model.layers.")
    vision = weight_shape(shapes, "visual.patch_embed.proj.weight", 5)[0]
    depth = count_indices(shapes, "visual.blocks.")
    bounded(
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


# Qwen3-VL (Krea 2's, Qwen-Image 2.1's and FLUX.3's text encoder), kept as transformers'
# Qwen3VLForConditionalGeneration saves it (model.language_model.*, model.visual.*, an LM head
# where the embedding is not tied) or as a Qwen3VLModel (language_model.*, visual.*). One kind
# of file, read as the class its family's pipeline takes (`Qwen3VLRead`, named by a `Need`'s
# `reads`). The vision tower is always read (its weights are in the file).
QWEN3_VL_PREFIXES = ("model.", "")
# Qwen3-VL's settings that no tensor records, the same in the 4B and the 8B (their config.json).
QWEN3_VL_FIXED: dict[str, Any] = {
    "rope_theta": 5000000.0,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 262144,
    "hidden_act": "silu",
    "attention_bias": False,
}
# Which vision blocks feed the deepstack mergers, as the released models have them (depth,
# mergers: the 4B's, the 8B's); elsewhere spread evenly. Only pictures run the vision tower.
QWEN3_VL_DEEPSTACK = {(24, 3): [5, 11, 17], (27, 3): [8, 16, 24]}


@dataclass(frozen=True)
class Qwen3VLRead:
    """How a family reads its Qwen3-VL: the released model it runs with (what differs between
    them and no tensor records: the vision tower's head width), the transformers class its
    pipeline takes (and so what that class's keys are under) and what reads its prompts."""

    model: str  # "Qwen3-VL-4B-Instruct" (for docs and sentences)
    vision_head: int  # the vision tower's head width (its heads are fused in one qkv)
    model_class: str  # "Qwen3VLModel" or "Qwen3VLForConditionalGeneration"
    processor: bool  # Qwen3-VL's processor (pictures too), else its tokenizer (Qwen2's BPE)

    @property
    def keeps_lm_head(self) -> bool:
        return self.model_class == "Qwen3VLForConditionalGeneration"


QWEN3_VL_READS = {
    # Krea 2: Qwen3-VL-4B's hidden states, read as a Qwen3VLModel (its LM head unused), its
    # prompts by the tokenizer (Krea2Pipeline applies its own template). Vision: 1024 in 16 heads.
    "4b": Qwen3VLRead("Qwen3-VL-4B-Instruct", 64, "Qwen3VLModel", processor=False),
    # Qwen-Image 2.1: Qwen3-VL-8B read whole (its pipeline takes the generation model) through
    # Qwen3-VL's processor. Vision: 1152 wide in 16 heads.
    "8b": Qwen3VLRead(
        "Qwen3-VL-8B-Instruct", 72, "Qwen3VLForConditionalGeneration", processor=True
    ),
    # FLUX.3: Qwen3-VL-4B read whole (diffusers' FLUX.3 blocks take the generation model)
    # through Qwen3-VL's processor, whose chat form its prompts are read in.
    "4b-generation": Qwen3VLRead(
        "Qwen3-VL-4B-Instruct", 64, "Qwen3VLForConditionalGeneration", processor=True
    ),
}


def qwen3_vl_prefix(shapes: Shapes) -> str | None:
    """The prefix of a Qwen3-VL file (its language model under language_model., with Qwen3's
    q/k norms, and the vision tower with the merger that sets Qwen3-VL apart), or None."""
    for prefix in QWEN3_VL_PREFIXES:
        if (
            prefix + "language_model.embed_tokens.weight" in shapes
            and prefix + "language_model.layers.0.self_attn.q_norm.weight" in shapes
            and prefix + "visual.merger.linear_fc2.weight" in shapes
        ):
            return prefix
    return None


def is_qwen3_vl(shapes: Shapes) -> bool:
    """A Qwen3-VL file in transformers' names (either class's)."""
    return qwen3_vl_prefix(shapes) is not None


def qwen3_vl_to_transformers(name: str, prefix: str, read: Qwen3VLRead) -> str | None:
    """A Qwen3-VL file's key -> the name `read.model_class` has for it (None: not a weight of
    it, the LM head of a Qwen3VLModel)."""
    if name == "lm_head.weight":
        return name if read.keeps_lm_head else None
    if not name.startswith(prefix):
        return None
    return ("model." if read.keeps_lm_head else "") + name[len(prefix) :]


def qwen3_vl_config(shapes: Shapes, prefix: str, read: Qwen3VLRead) -> dict[str, Any]:
    """A Qwen3VLConfig (as keyword arguments) from a Qwen3-VL file's shapes, the rest as
    `read.model` has it. Raises ValueError naming what does not fit."""
    text, vision = prefix + "language_model.", prefix + "visual."
    vocab, width = weight_shape(shapes, "embed_tokens.weight", 2, text)
    head = weight_shape(shapes, "layers.0.self_attn.q_norm.weight", 1, text)[0]
    queries = weight_shape(shapes, "layers.0.self_attn.q_proj.weight", 2, text)[0]
    keys = weight_shape(shapes, "layers.0.self_attn.k_proj.weight", 2, text)[0]
    if head % 2 or queries % head or keys % head:
        raise ValueError(f"its attention ({queries} wide) does not split into {head}-wide heads")
    layers = count_indices(shapes, text + "layers.")
    tower, channels, frames, patch, _ = weight_shape(shapes, "patch_embed.proj.weight", 5, vision)
    out, merged = weight_shape(shapes, "merger.linear_fc2.weight", 2, vision)
    depth = count_indices(shapes, vision + "blocks.")
    mergers = count_indices(shapes, vision + "deepstack_merger_list.")
    merge = math.isqrt(merged // tower) if tower else 0
    positions = weight_shape(shapes, "pos_embed.weight", 2, vision)[0]
    bounded(
        ("number of layers", layers, limits.MAX_TEXT_LAYERS),
        ("vocabulary size", vocab, limits.MAX_VOCAB),
        ("width", width, limits.MAX_WIDTH),
        ("number of attention heads", queries // head, limits.MAX_HEADS),
        ("number of vision blocks", depth, limits.MAX_TEXT_LAYERS),
        ("vision width", tower, limits.MAX_WIDTH),
        ("vision patch size", patch, limits.MAX_KERNEL * 4),
        ("vision merge", merge, limits.MAX_KERNEL),
        ("vision positions", positions, limits.MAX_POSITIONS),
    )
    if merge * merge * tower != merged or mergers > depth:
        raise ValueError(f"its vision merger ({merged} wide) does not fit its {tower}-wide tower")
    half = head // 2  # interleaved rotary sections (time, height, width) as 24, 20, 20 of 64
    return {
        "text_config": {
            **QWEN3_VL_FIXED,
            "vocab_size": vocab,
            "hidden_size": width,
            "intermediate_size": weight_shape(shapes, "layers.0.mlp.gate_proj.weight", 2, text)[0],
            "num_hidden_layers": layers,
            "num_attention_heads": queries // head,
            "num_key_value_heads": keys // head,
            "head_dim": head,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": QWEN3_VL_FIXED["rope_theta"],
                "mrope_section": [
                    half * 3 // 8,
                    half * 5 // 16,
                    half - half * 3 // 8 - half * 5 // 16,
                ],
                "mrope_interleaved": True,
            },
        },
        "vision_config": {
            "depth": depth,
            "hidden_size": tower,
            "intermediate_size": weight_shape(shapes, "blocks.0.mlp.linear_fc1.weight", 2, vision)[
                0
            ],
            "num_heads": max(1, tower // read.vision_head),
            "in_channels": channels,
            "out_hidden_size": out,
            "patch_size": patch,
            "temporal_patch_size": frames,
            "spatial_merge_size": merge,
            "num_position_embeddings": positions,
            "deepstack_visual_indexes": QWEN3_VL_DEEPSTACK.get(
                (depth, mergers), [(i + 1) * depth // (mergers + 1) for i in range(mergers)]
            ),
        },
        # The 4B ties its LM head to the embedding (its files have none), the 8B does not.
        "tie_word_embeddings": "lm_head.weight" not in shapes,
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
    encoder = count_indices(shapes, "encoder.downsamples.")
    decoder = count_indices(shapes, "decoder.upsamples.")
    levels = decoder - encoder
    if levels < 1 or (encoder + 1) % levels:
        raise ValueError(f"its {encoder} encoder and {decoder} decoder stages do not form levels")
    blocks = (encoder + 1) // levels - 1
    bounded(
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
    bounded(("width", base * max(mult), limits.MAX_CHANNELS))
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


# Qwen-Image 2.1's VAE as its file keeps it: diffusers' AutoencoderKLQwenImage21 names (its
# residual blocks, convolutions stored 2-D: one frame per image).
_QWENIMAGE21_VAE_MARKERS = (
    "encoder.down_blocks.0.resnets.0.norm1.gamma",
    "decoder.up_blocks.0.resnets.0.conv1.weight",
    "post_quant_conv.weight",
)


def is_qwenimage21_vae(shapes: Shapes) -> bool:
    """A VAE in Qwen-Image 2.1's layout (2-D convolutions where Qwen-Image's are 3-D)."""
    return all(k in shapes for k in _QWENIMAGE21_VAE_MARKERS) and (
        len(shapes["post_quant_conv.weight"]) == 4
    )


def qwenimage21_vae_config(shapes: Shapes, statistics: Mapping[str, Any]) -> dict[str, Any]:
    """An AutoencoderKLQwenImage21 config from a Qwen-Image 2.1 VAE file's shapes, with the
    per-channel latent statistics of `statistics` (the released VAE's config). Raises ValueError
    naming what does not fit."""
    levels = count_indices(shapes, "encoder.down_blocks.")
    blocks = count_indices(shapes, "encoder.down_blocks.0.resnets.")
    bounded(
        ("number of levels", levels, limits.MAX_LEVELS),
        ("number of blocks per level", blocks, limits.MAX_LAYERS_PER_BLOCK),
    )
    base, in_channels = weight_shape(shapes, "encoder.conv_in.weight", 4)[:2]
    mult = []
    for level in range(levels):
        width = weight_shape(shapes, f"encoder.down_blocks.{level}.resnets.0.conv1.weight", 4)[0]
        if width % base:
            raise ValueError(f"its level {level} ({width} wide) is not a multiple of {base}")
        mult.append(width // base)
    out_channels, decoder_width = weight_shape(shapes, "decoder.conv_out.weight", 4)[:2]
    if decoder_width % mult[0]:
        raise ValueError(f"its decoder ({decoder_width} wide) does not fit its levels")
    z_dim = weight_shape(shapes, "post_quant_conv.weight", 4)[0]
    bounded(
        ("width", base * max(mult), limits.MAX_CHANNELS),
        ("decoder width", decoder_width * max(mult), limits.MAX_CHANNELS),
        ("number of latent channels", z_dim, limits.MAX_IMAGE_CHANNELS),
        ("number of image channels", in_channels, limits.MAX_IMAGE_CHANNELS),
    )
    mean, spread = statistics.get("latents_mean"), statistics.get("latents_std")
    if not isinstance(mean, list) or not isinstance(spread, list) or len(mean) != z_dim:
        raise ValueError(
            f"its {z_dim} latent channels have no known statistics (Qwen-Image 2.1's VAE has "
            f"{len(mean) if isinstance(mean, list) else 'other'})"
        )
    temporal = [
        f"encoder.down_blocks.{level}.downsampler.time_conv.weight" in shapes
        for level in range(levels - 1)
    ]
    return {
        "base_dim": base,
        "decoder_base_dim": decoder_width // mult[0],
        "z_dim": z_dim,
        "dim_mult": mult,
        "num_res_blocks": blocks,
        "attn_scales": [],
        "temperal_downsample": temporal,
        "latents_mean": mean,
        "latents_std": spread,
        "is_residual": True,
        "in_channels": in_channels,
        "out_channels": out_channels,
        "scale_factor_spatial": 2 ** (levels - 1),
        "scale_factor_temporal": 2 ** sum(temporal),
    }
