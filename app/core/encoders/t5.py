"""T5 v1.1 encoders (Flux.1's, SD3.x's and Chroma's t5xxl; Anima's T5 tokenizer): a file in
transformers' names (shared.*, encoder.block.*), its config read from its shapes."""

from __future__ import annotations

from typing import Any

from app.core import config_limits
from app.core.encoders.kind import OwnIsland, TextEncoderKind
from app.core.errors import UnsupportedModelError
from app.core.formats.layouts import Need, Shapes, count_indices, weight_shape


def t5_config(shapes: Shapes) -> dict[str, Any]:
    """A T5EncoderModel config from a T5 encoder file's shapes (T5 v1.1: gated GELU). Raises
    ValueError naming what does not fit (sizes: `config_limits.check_text_encoder_config`)."""
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


# The feed-forward output projection of each block: transformers keeps it in fp32 for T5
# (`_keep_in_fp32_modules`) and runs it without casting back (T5's own layer norm takes the
# fp32 stream and casts back itself); `t5_fp32_feed_forward` keeps it so in fp16 or bf16.
FEED_FORWARD_OUTPUT = "DenseReluDense.wo"
FEED_FORWARD_ISLAND = OwnIsland(
    setting="t5_fp32_feed_forward",
    dtype="fp32",
    ending=FEED_FORWARD_OUTPUT,
    within="DenseReluDense",
    guarded=False,
    fix="t5_feed_forward",
    about="T5's feed-forward output in fp32",
    words="keep the T5 feed-forward output layers (wo) in fp32",
    asked="The T5 feed-forward output projections run in fp32, as you asked.",
)


class T5Kind(TextEncoderKind):
    key = "t5"
    name = "T5"
    classes = ("T5EncoderModel",)
    own_islands = (FEED_FORWARD_ISLAND,)

    def holds(self, shapes: Shapes) -> bool:
        return (
            "encoder.block.0.layer.0.SelfAttention.q.weight" in shapes and "shared.weight" in shapes
        )

    def embedding(self, shapes: Shapes) -> str:
        return "shared.weight"

    def width(self, shapes: Shapes) -> int | None:
        if not self.holds(shapes):
            return None
        config = t5_config(shapes)
        config_limits.check_text_encoder_config(config)
        return config["d_model"]

    def load(self, checkpoint, prefix: str, need: Need, configs: str) -> tuple[Any, list]:
        import transformers

        from app.core.checkpoint.assembly import assign, empty

        words = need.words.removeprefix("its ")
        shapes = {k[len(prefix) :]: v for k, v in checkpoint.shapes.items() if k.startswith(prefix)}
        try:
            config = t5_config(shapes)
            config_limits.check_text_encoder_config(config)
        except (KeyError, ValueError) as error:
            raise UnsupportedModelError(
                checkpoint.path, f"the {words} cannot be built: {error}."
            ) from None
        model = empty(transformers.T5EncoderModel, transformers.T5Config(**config))
        tensors = {k: checkpoint.get(prefix + k) for k in shapes}
        dtypes = [checkpoint.dtypes[prefix + k] for k in shapes]
        expected = model.state_dict()
        # Files differ in whether they repeat the tied token embedding under the encoder's name.
        embedding = "encoder.embed_tokens.weight"
        if embedding in expected and embedding not in tensors:
            tensors[embedding] = tensors["shared.weight"]
        state = {
            k: v for k, v in tensors.items() if k in expected or not k.startswith("encoder.embed")
        }
        return assign(checkpoint.path, model, state, words), dtypes

    def tokenizer(self, need: Need) -> Any:
        from app.core.encoders.tokenizers import t5_tokenizer

        return t5_tokenizer()

    def is_module(self, module) -> bool:
        return is_t5(module)


T5 = T5Kind()


def t5_need(component: str, width: int, inside: str | None = None) -> Need:
    """A transformer's T5 encoder, `width` wide (`inside`: its prefix in the transformer's own
    file)."""
    return Need(component, T5, "its T5 text encoder (t5xxl)", lambda w: w == width, ("t5",), inside)


# What transformers does for T5 in fp16 ---------------------------------------------------------


def is_t5(module) -> bool:
    """Whether a loaded text encoder is a T5 (transformers' T5 classes)."""
    return type(module).__name__.startswith("T5")


def clamped_blocks(module) -> list[Any]:
    """The blocks of a T5 encoder: transformers clamps their fp16 output to 65504 (64504 once
    an inf appeared), so a T5 overflow comes out finite and wrong instead of NaN. Empty for
    another encoder."""
    encoder = getattr(module, "encoder", None)
    return list(getattr(encoder, "block", None) or []) if is_t5(module) else []
