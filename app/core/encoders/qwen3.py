"""Qwen3 text encoders (Z-Image's and Flux.2 Klein's qwen_3_4b, Anima's qwen_3_06b): a file
in transformers' names (Qwen3ForCausalLM's model.*, or Qwen3Model's), read as a Qwen3Model
(the LM head, if any, is not used); its config from its shapes, the rest as Qwen3-4B has it."""

from __future__ import annotations

from typing import Any

from app.core import config_limits, limits
from app.core.encoders.kind import TextEncoderKind
from app.core.errors import UnsupportedModelError
from app.core.formats.layouts import Need, Shapes, bounded, count_indices, weight_shape

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


class Qwen3Kind(TextEncoderKind):
    key = "qwen3"
    name = "Qwen3"
    classes = ("Qwen3",)  # after Qwen3-VL's, which starts with it (`kinds.TEXT_ENCODERS`)

    def holds(self, shapes: Shapes) -> bool:
        return qwen3_prefix(shapes) is not None

    def embedding(self, shapes: Shapes) -> str:
        return f"{qwen3_prefix(shapes) or ''}embed_tokens.weight"

    def width(self, shapes: Shapes) -> int | None:
        prefix = qwen3_prefix(shapes)
        if prefix is None:
            return None
        config = qwen3_config(shapes, prefix)
        config_limits.check_text_encoder_config(config)
        return config["hidden_size"]

    def load(self, checkpoint, prefix: str, need: Need, configs: str) -> tuple[Any, list]:
        import transformers

        from app.core.checkpoint.assembly import assign, empty

        path = checkpoint.path
        found = qwen3_prefix(checkpoint.shapes)
        try:
            if found is None:
                raise ValueError("it has no Qwen3 layers (embed_tokens, q_norm)")
            config = qwen3_config(checkpoint.shapes, found)
        except (KeyError, ValueError) as error:
            raise UnsupportedModelError(
                path, f"this Qwen3 text encoder cannot be built: {error}."
            ) from None
        keys = [k for k in checkpoint.shapes if k.startswith(found) and k != "lm_head.weight"]
        tensors = {k[len(found) :]: checkpoint.get(k) for k in keys}
        dtypes = [checkpoint.dtypes[k] for k in keys]
        model = empty(transformers.Qwen3Model, transformers.Qwen3Config(**config))
        return assign(path, model, tensors, "Qwen3 text encoder"), dtypes

    def tokenizer(self, need: Need) -> Any:
        from app.core.encoders.tokenizers import qwen3_tokenizer

        return qwen3_tokenizer()


QWEN3 = Qwen3Kind()
