"""CLIP text encoders (SD's and SDXL's, SD3.x's clip_l and clip_g, Flux.1's clip_l): a file in
transformers' names (text_model.*), its config read from its shapes over the shipped config of
the CLIP it is (what shapes do not say: its activation). `CLIP_PROJECTED` is one whose pooled
vector goes through its text projection (SD3.x's)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.core import architecture as arch
from app.core import config_limits, limits, paths
from app.core.encoders.kind import TextEncoderKind
from app.core.errors import UnsupportedModelError
from app.core.formats.layouts import Need, Shapes, weight_shape


def convert_text_encoder(model, tensors: dict[str, Any], encoder: arch.TextEncoderLayout):
    """A CLIP's tensors under `encoder.prefix` (transformers' names, or OpenCLIP's in an
    original checkpoint) renamed to `model`'s own."""
    wrapped = any(k.startswith("text_model.") for k in model.state_dict())
    if encoder.layout == "hf":
        root = encoder.prefix.removesuffix("text_model.")
        state = {}
        for key, tensor in tensors.items():
            if key == root + "text_projection.weight":
                state["text_projection.weight"] = tensor
            else:
                name = key[len(encoder.prefix) :]
                state[("text_model." + name) if wrapped else name] = tensor
        return state
    from diffusers.loaders.single_file_utils import convert_open_clip_checkpoint

    converted = convert_open_clip_checkpoint(model, tensors, prefix=encoder.prefix)
    if not hasattr(model, "text_projection"):
        converted.pop("text_projection.weight", None)
    if not wrapped:
        converted = {k.removeprefix("text_model."): v for k, v in converted.items()}
    return converted


# A CLIP file's names: transformers' CLIPTextModel's, and its text projection's.
CLIP_PREFIX = "text_model."
CLIP_PROJECTION = "text_projection.weight"
# CLIP-L's shipped config (SD 1.x's text encoder): quick_gelu, what its shapes do not say.
CLIP_L_CONFIG = "sd1/text_encoder"


class ClipKind(TextEncoderKind):
    key = "clip"
    name = "CLIP"
    classes = ("CLIPTextModel",)

    def holds(self, shapes: Shapes) -> bool:
        return CLIP_PREFIX + "embeddings.token_embedding.weight" in shapes

    def embedding(self, shapes: Shapes) -> str:
        return CLIP_PREFIX + "embeddings.token_embedding.weight"

    def width(self, shapes: Shapes) -> int | None:
        if not self.holds(shapes):
            return None
        if self.projected and CLIP_PROJECTION not in shapes:
            return None  # a CLIP without a projection is not what this need takes
        layout = arch.TextEncoderLayout("text_encoder", CLIP_PREFIX, "hf")
        config = arch.infer_text_encoder_config(shapes, {}, layout)
        config_limits.check_text_encoder_config(config)
        if not self.projected:
            return config["hidden_size"]
        return weight_shape(shapes, CLIP_PROJECTION, 2)[0]

    def load(self, checkpoint, prefix: str, need: Need, configs: str) -> tuple[Any, list]:
        import transformers

        from app.core.checkpoint.assembly import assign, empty

        path = checkpoint.path
        words = need.words.removeprefix("its ")
        shapes = {k[len(prefix) :]: v for k, v in checkpoint.shapes.items() if k.startswith(prefix)}
        layout = arch.TextEncoderLayout(need.component, CLIP_PREFIX, "hf")
        try:
            folder, component = (need.clip_config or CLIP_L_CONFIG).split("/")
            base = limits.read_json_object(
                paths.resource("configs", folder, component, "config.json")
            )
            config = arch.infer_text_encoder_config(shapes, base, layout)
            config_limits.check_text_encoder_config(config)
        except (KeyError, ValueError) as error:
            raise UnsupportedModelError(path, f"the {words} cannot be built: {error}.") from None
        if self.projected and CLIP_PROJECTION not in shapes:
            raise UnsupportedModelError(
                path,
                f"the {words} has no text projection ({prefix}{CLIP_PROJECTION}), which "
                "its pooled vector goes through.",
            )
        keys = [k for k in shapes if k.startswith(CLIP_PREFIX) and not k.endswith("position_ids")]
        keys += [CLIP_PROJECTION] if self.projected else []
        model_class = (
            transformers.CLIPTextModelWithProjection
            if self.projected
            else transformers.CLIPTextModel
        )
        model = empty(model_class, transformers.CLIPTextConfig(**config))
        tensors = {k: checkpoint.get(prefix + k) for k in keys}
        dtypes = [checkpoint.dtypes[prefix + k] for k in keys]
        state = convert_text_encoder(model, tensors, layout)
        return assign(path, model, state, words), dtypes

    def tokenizer(self, need: Need) -> Any:
        from app.core.encoders.tokenizers import clip_tokenizer

        return clip_tokenizer(need.pad_token)


class ProjectedClipKind(ClipKind):
    key = "clip_projected"
    projected = True


CLIP = ClipKind()
CLIP_PROJECTED = ProjectedClipKind()


def clip_needs(pooled: int, inside: Mapping[str, str] | None = None) -> tuple[Need, Need]:
    """SD3's two CLIPs, told apart by projection width (CLIP-L's 768 and CLIP-G's 1280 make
    the transformer's 2048-wide pooled vector) and, where widths agree, by name."""
    inside = inside or {}
    return (
        Need(
            "text_encoder",
            CLIP_PROJECTED,
            "its CLIP-L text encoder (clip_l)",
            lambda width: 2 * width <= pooled,
            ("clip_l", "clip-l", "clipl"),
            inside.get("text_encoder"),
        ),
        Need(
            "text_encoder_2",
            CLIP_PROJECTED,
            "its CLIP-G text encoder (clip_g)",
            lambda width: pooled > width and 2 * width >= pooled,
            ("clip_g", "clip-g", "clipg"),
            inside.get("text_encoder_2"),
            pad_token="!",
            clip_config="sdxl/text_encoder_2",  # OpenCLIP ViT-bigG: gelu, not quick_gelu
        ),
    )
