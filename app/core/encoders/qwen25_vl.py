"""Qwen2.5-VL text encoders (Qwen-Image's qwen_2.5_vl_7b): a file as ComfyUI keeps it (model.*,
visual.*, lm_head), read as a Qwen2_5_VLForConditionalGeneration."""

from __future__ import annotations

from typing import Any

from app.core import config_limits, limits
from app.core.encoders.kind import TextEncoderKind
from app.core.errors import UnsupportedModelError
from app.core.formats.layouts import Need, Shapes, bounded, count_indices, weight_shape

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


class Qwen25VLKind(TextEncoderKind):
    key = "qwen25_vl"
    name = "Qwen2.5-VL"
    classes = ("Qwen2_5_VL",)

    def holds(self, shapes: Shapes) -> bool:
        return is_qwen25_vl(shapes)

    def embedding(self, shapes: Shapes) -> str:
        return "model.embed_tokens.weight"

    def width(self, shapes: Shapes) -> int | None:
        if not self.holds(shapes):
            return None
        config = qwen25_vl_config(shapes)["text_config"]
        config_limits.check_text_encoder_config(config)
        return config["hidden_size"]

    def load(self, checkpoint, prefix: str, need: Need, configs: str) -> tuple[Any, list]:
        import transformers

        from app.core.checkpoint.assembly import assign, empty

        path = checkpoint.path
        try:
            config = qwen25_vl_config(checkpoint.shapes)
        except (KeyError, ValueError) as error:
            raise UnsupportedModelError(
                path, f"this Qwen2.5-VL text encoder cannot be built: {error}."
            ) from None
        tensors = {}
        for key in checkpoint.shapes:
            name = qwen25_vl_to_transformers(key)
            tensors[name if name is not None else key] = checkpoint.get(key)
        dtypes = list(checkpoint.dtypes.values())
        model = empty(
            transformers.Qwen2_5_VLForConditionalGeneration,
            transformers.Qwen2_5_VLConfig(**config),
        )
        return assign(path, model, tensors, "Qwen2.5-VL text encoder"), dtypes

    def tokenizer(self, need: Need) -> Any:
        from app.core.encoders.tokenizers import qwen2_tokenizer

        return qwen2_tokenizer()


QWEN25_VL = Qwen25VLKind()
