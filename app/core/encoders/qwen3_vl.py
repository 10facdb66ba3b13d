"""Qwen3-VL text encoders (Krea 2's, Qwen-Image 2.1's and FLUX.3's), read as the class each
family's pipeline takes (`READS`, named by a `Need`'s `reads`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from app.core import config_limits, limits
from app.core.encoders.kind import TextEncoderKind
from app.core.errors import UnsupportedModelError
from app.core.formats.layouts import Need, Shapes, bounded, count_indices, weight_shape

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


READS = {
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


class Qwen3VLKind(TextEncoderKind):
    key = "qwen3_vl"
    name = "Qwen3-VL"
    classes = ("Qwen3VL",)

    def holds(self, shapes: Shapes) -> bool:
        return is_qwen3_vl(shapes)

    def embedding(self, shapes: Shapes) -> str:
        return f"{qwen3_vl_prefix(shapes) or ''}language_model.embed_tokens.weight"

    def width(self, shapes: Shapes) -> int | None:
        prefix = qwen3_vl_prefix(shapes)
        if prefix is None:
            return None
        # Its text side, the same whichever released model's settings and class it is read as.
        config = qwen3_vl_config(shapes, prefix, READS["8b"])["text_config"]
        config_limits.check_text_encoder_config(config)
        return config["hidden_size"]

    def load(self, checkpoint, prefix: str, need: Need, configs: str) -> tuple[Any, list]:
        """Read as `need.reads` says: Krea 2's Qwen3VLModel (the LM head, if any, is not used)
        or Qwen-Image 2.1's and FLUX.3's Qwen3VLForConditionalGeneration."""
        import transformers

        from app.core.checkpoint.assembly import assign, empty

        path = checkpoint.path
        read = READS[need.reads]
        found = qwen3_vl_prefix(checkpoint.shapes)
        try:
            if found is None:
                raise ValueError("it has no Qwen3-VL language model and vision tower")
            config = qwen3_vl_config(checkpoint.shapes, found, read)
        except (KeyError, ValueError) as error:
            raise UnsupportedModelError(
                path, f"this Qwen3-VL text encoder cannot be built: {error}."
            ) from None
        tensors, dtypes = {}, []
        for key in checkpoint.shapes:
            name = qwen3_vl_to_transformers(key, found, read)
            if name is not None:
                tensors[name] = checkpoint.get(key)
                dtypes.append(checkpoint.dtypes[key])
        embedding = "model.language_model.embed_tokens.weight"
        if read.keeps_lm_head and config["tie_word_embeddings"] and embedding in tensors:
            tensors["lm_head.weight"] = tensors[embedding]  # tied: the file keeps it once
        model_class = getattr(transformers, read.model_class)
        model = empty(model_class, transformers.Qwen3VLConfig(**config))
        return assign(path, model, tensors, "Qwen3-VL text encoder"), dtypes

    def prompt_reader(self, need: Need) -> tuple[str, Any] | None:
        from app.core.encoders.tokenizers import qwen2_tokenizer, qwen3_vl_processor

        if READS[need.reads].processor:
            return "processor", qwen3_vl_processor()
        # Qwen3-VL reads the same BPE as Qwen2 (Krea 2 applies its own template).
        return need.component.replace("text_encoder", "tokenizer"), qwen2_tokenizer()


QWEN3_VL = Qwen3VLKind()
