"""The original (LDM / A1111) checkpoint layout's key prefixes, and the small readings of a
header's `{name: shape}` that detection and config inference share: which prefixes it has,
where CLIP sits, a tensor's size along one dimension, cross-attention width, layer counts.
"""

from __future__ import annotations

from collections.abc import Mapping

from app.core.detection import TextEncoderLayout
from app.core.formats.layouts import count_indices

Shapes = Mapping[str, tuple[int, ...]]

_TOKEN_EMBEDDING = {"hf": "embeddings.token_embedding.weight", "openclip": "token_embedding.weight"}


def _prefix_checker(keys: list[str]):
    prefixes: set[str] = set()
    for k in keys:
        parts = k.split(".")
        for n in range(1, min(len(parts), 5)):
            prefixes.add(".".join(parts[:n]) + ".")
    return lambda prefix: prefix in prefixes


def _hf_prefix(keys: list[str], prefix: str) -> str:
    """CLIP in transformers layout sits under `text_model.`; very old files lack that level."""
    return (
        prefix + "text_model."
        if any(k.startswith(prefix + "text_model.") for k in keys)
        else prefix
    )


def _cross_attention_dim(shapes: Shapes, prefix: str) -> int | None:
    for key, shape in shapes.items():
        if key.startswith(prefix) and key.endswith(".attn2.to_k.weight") and len(shape) == 2:
            return shape[1]
    return None


def _shape(shapes: Shapes, key: str, dim: int) -> int | None:
    shape = shapes.get(key)
    return shape[dim] if shape is not None and len(shape) > dim else None


def _count_layers(shapes: Shapes, encoder: TextEncoderLayout) -> int:
    pattern = "encoder.layers." if encoder.layout == "hf" else "transformer.resblocks."
    return count_indices(shapes, encoder.prefix + pattern)
