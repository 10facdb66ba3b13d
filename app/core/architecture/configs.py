"""Config inference: a diffusers config for each component of an original-layout checkpoint
(UNet, VAE, CLIP text encoders), starting from the shipped config and replacing every value
the tensor shapes determine; and why a supported checkpoint's shapes would be refused.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from app.core.architecture.keys import Shapes, _cross_attention_dim
from app.core.detection import UNET, VAE, Detection, TextEncoderLayout
from app.core.formats.layouts import count_indices
from app.core.limits import index_in_name


def shape_problem(shapes: Shapes, detection: Detection) -> str | None:
    """Why the loader would refuse a supported checkpoint's shapes, in words that complete
    "this looks like ..., but", or None when every component's config can be inferred and
    stays within real models' sizes. Headers only, so the model library can say it up front.
    """
    from app.core import config_limits

    try:
        for encoder in detection.text_encoders:
            config_limits.check_text_encoder_config(infer_text_encoder_config(shapes, {}, encoder))
        config_limits.check_unet_config(infer_unet_config(shapes, {}, prefix=detection.unet_prefix))
        if detection.has_vae:
            config_limits.check_vae_config(
                infer_vae_config(shapes, {}, prefix=detection.vae_prefix)
            )
    except ValueError as error:
        return str(error)
    return None


def _weight_shape(shapes: Shapes, prefix: str, name: str, ndim: int, words: str):
    """The shape of one weight that config inference reads, which must exist and have `ndim`
    dimensions (a scalar or 1-D tensor where a matrix belongs is a damaged file, not an
    IndexError)."""
    shape = shapes.get(prefix + name)
    if shape is None:
        raise ValueError(f"the {words} has no {name}, so its layout is unknown")
    if len(shape) != ndim:
        raise ValueError(
            f"the {words} weight {name} has shape {list(shape)} where a {ndim}-D tensor belongs"
        )
    return shape


def _unet_heads(channels: int, sd1_style: bool) -> int:
    if sd1_style and channels % 8 == 0:
        return 8
    if channels >= 128 and channels % 64 == 0:
        return channels // 64
    return next(h for h in (8, 4, 2, 1) if channels % h == 0)


def _norm_groups(widths: list[int], base: int) -> int:
    return next(g for g in (base, 32, 16, 8, 4, 2, 1) if all(w % g == 0 for w in widths))


def infer_unet_config(
    shapes: Shapes,
    base: Mapping[str, Any],
    *,
    prefix: str = UNET,
    sample_size: int | None = None,
    pooled_text_dim: int | None = None,
) -> dict[str, Any]:
    """A UNet2DConditionModel config for the original-layout UNet under `prefix`.

    Raises ValueError with a plain sentence when the layout is not one diffusers can build
    (uneven blocks per level, unknown block kinds).
    """
    blocks: dict[tuple[str, int, int], set[str]] = {}
    for key in shapes:
        if not key.startswith(prefix):
            continue
        parts = key[len(prefix) :].split(".")
        numbers = [index_in_name(p) for p in parts[1:3]]
        if parts[0] in ("input_blocks", "output_blocks") and len(parts) > 3:
            level, index = numbers
            if level is not None and index is not None:
                blocks.setdefault((parts[0], level, index), set()).add(".".join(parts[3:]))
        elif parts[0] == "middle_block" and len(parts) > 2 and numbers[0] is not None:
            blocks.setdefault(("middle_block", 0, numbers[0]), set()).add(".".join(parts[2:]))

    def w(name: str, ndim: int) -> tuple[int, ...]:
        return _weight_shape(shapes, prefix, name, ndim, "UNet")

    def depth(kind: str, i: int, j: int) -> int:
        rest = blocks.get((kind, i, j), set())
        return len({r.split(".")[1] for r in rest if r.startswith("transformer_blocks.")})

    conv_in = w("input_blocks.0.0.weight", 4)
    levels: list[dict[str, Any]] = [{"resnets": 0, "channels": None, "depths": []}]
    inputs = sorted({i for (kind, i, _j) in blocks if kind == "input_blocks" and i >= 1})
    for i in inputs:
        rest = blocks.get(("input_blocks", i, 0), set())
        if "op.weight" in rest:
            levels.append({"resnets": 0, "channels": None, "depths": []})
            continue
        level = levels[-1]
        level["resnets"] += 1
        level["channels"] = w(f"input_blocks.{i}.0.out_layers.3.weight", 4)[0]
        level["depths"].append(depth("input_blocks", i, 1))
    if any(level["resnets"] == 0 for level in levels):
        raise ValueError("a UNet level has no residual blocks")
    per_level = {level["resnets"] for level in levels}
    if len(per_level) != 1:
        raise ValueError(
            "its UNet levels have different numbers of blocks, which diffusers cannot build"
        )
    layers = per_level.pop()
    down_depths = []
    for level in levels:
        if len(set(level["depths"])) != 1:
            raise ValueError("a UNet level mixes blocks with and without attention")
        down_depths.append(level["depths"][0])

    outputs = sorted({i for (kind, i, _j) in blocks if kind == "output_blocks"})
    if len(outputs) != len(levels) * (layers + 1):
        raise ValueError(
            f"its UNet has {len(outputs)} output blocks where {len(levels)} levels of "
            f"{layers} blocks need {len(levels) * (layers + 1)}"
        )
    up_depths = [depth("output_blocks", u * (layers + 1), 1) for u in range(len(levels))]
    if up_depths != down_depths[::-1]:
        raise ValueError("its UNet's up path does not mirror its down path")

    config = copy.deepcopy(dict(base))
    for key in ("_diffusers_version", "_name_or_path"):
        config.pop(key, None)
    channels = [level["channels"] for level in levels]
    sd1_style = not isinstance(base.get("attention_head_dim"), list)
    config.update(
        in_channels=conv_in[1],
        out_channels=w("out.2.weight", 4)[0],
        conv_in_kernel=conv_in[2],
        conv_out_kernel=w("out.2.weight", 4)[2],
        block_out_channels=channels,
        layers_per_block=layers,
        down_block_types=["CrossAttnDownBlock2D" if d else "DownBlock2D" for d in down_depths],
        up_block_types=["CrossAttnUpBlock2D" if d else "UpBlock2D" for d in down_depths[::-1]],
        attention_head_dim=[_unet_heads(c, sd1_style) for c in channels],
        norm_num_groups=_norm_groups(channels, int(base.get("norm_num_groups", 32))),
    )
    if sd1_style and len(set(config["attention_head_dim"])) == 1:
        config["attention_head_dim"] = config["attention_head_dim"][0]
    depths = [max(d, 1) for d in down_depths]
    config["transformer_layers_per_block"] = depths if any(d > 1 for d in depths) else 1

    mid = {j for (kind, _i, j) in blocks if kind == "middle_block"}
    if not mid:
        config["mid_block_type"] = None
    elif mid == {0, 1, 2} and depth("middle_block", 0, 1):
        config["mid_block_type"] = "UNetMidBlock2DCrossAttn"
        if depth("middle_block", 0, 1) != depths[-1]:
            raise ValueError("its UNet's middle block depth differs from its last level's")
    else:
        raise ValueError("its UNet's middle block has an unknown layout")

    cross = _cross_attention_dim(shapes, prefix)
    if cross is not None:
        config["cross_attention_dim"] = cross
        proj_in = next(
            (
                s
                for k, s in shapes.items()
                if k.startswith(prefix) and k.endswith(".proj_in.weight")
            ),
            None,
        )
        if proj_in is None:
            raise ValueError("its UNet has cross-attention but no proj_in weights")
        config["use_linear_projection"] = len(proj_in) == 2

    time_dim = w("time_embed.0.weight", 2)[0]
    config["time_embedding_dim"] = None if time_dim == channels[0] * 4 else time_dim
    label = shapes.get(prefix + "label_emb.0.0.weight")
    if label is not None:
        in_dim = w("label_emb.0.0.weight", 2)[1]
        pooled = (
            pooled_text_dim
            if pooled_text_dim is not None
            else in_dim - 6 * int(base.get("addition_time_embed_dim") or 256)
        )
        time_embed = (in_dim - pooled) / 6
        if time_embed <= 0 or time_embed != int(time_embed):
            raise ValueError(
                f"its UNet's size embedding takes {in_dim} inputs, which does not "
                f"fit a {pooled}-wide pooled text embedding"
            )
        config.update(
            addition_embed_type="text_time",
            projection_class_embeddings_input_dim=in_dim,
            addition_time_embed_dim=int(time_embed),
        )
    else:
        config.update(addition_embed_type=None, projection_class_embeddings_input_dim=None)
    if sample_size is not None:
        config["sample_size"] = sample_size // 8
    return config


def infer_vae_config(
    shapes: Shapes, base: Mapping[str, Any], *, prefix: str = VAE, sample_size: int | None = None
) -> dict[str, Any]:
    """An AutoencoderKL config for the VAE under `prefix`, in original or diffusers layout."""
    diffusers_layout = (prefix + "encoder.down_blocks.0.resnets.0.conv1.weight") in shapes
    down = "encoder.down_blocks." if diffusers_layout else "encoder.down."
    block = ".resnets." if diffusers_layout else ".block."

    def w(name: str, ndim: int = 4) -> tuple[int, ...]:
        return _weight_shape(shapes, prefix, name, ndim, "VAE")

    levels = count_indices(shapes, prefix + down)
    if levels == 0:
        raise ValueError("the VAE has no encoder blocks")
    channels = [w(f"{down}{i}{block}0.conv2.weight")[0] for i in range(levels)]
    layers = count_indices(shapes, f"{prefix}{down}0{block}")
    config = copy.deepcopy(dict(base))
    for key in ("_diffusers_version", "_name_or_path"):
        config.pop(key, None)
    mid_attention = "mid_block.attentions.0." if diffusers_layout else "mid.attn_1."
    config.update(
        in_channels=w("encoder.conv_in.weight")[1],
        out_channels=w("decoder.conv_out.weight")[0],
        latent_channels=w("decoder.conv_in.weight")[1],
        block_out_channels=channels,
        layers_per_block=layers,
        down_block_types=["DownEncoderBlock2D"] * levels,
        up_block_types=["UpDecoderBlock2D"] * levels,
        norm_num_groups=_norm_groups(channels, int(base.get("norm_num_groups", 32))),
        use_quant_conv=(prefix + "quant_conv.weight") in shapes,
        use_post_quant_conv=(prefix + "post_quant_conv.weight") in shapes,
        mid_block_add_attention=any(
            k.startswith(prefix + "encoder." + mid_attention) for k in shapes
        ),
    )
    if sample_size is not None:
        config["sample_size"] = sample_size
    return config


def _text_heads(hidden: int) -> int:
    if hidden >= 128 and hidden % 64 == 0:
        return hidden // 64
    return next(h for h in (4, 2, 1) if hidden % h == 0)


def infer_text_encoder_config(
    shapes: Shapes, base: Mapping[str, Any], encoder: TextEncoderLayout
) -> dict[str, Any]:
    """A CLIPTextConfig dict for one text encoder of a single file."""
    p = encoder.prefix

    def w(name: str, ndim: int = 2) -> tuple[int, ...]:
        return _weight_shape(shapes, p, name, ndim, "text encoder")

    config = copy.deepcopy(dict(base))
    for key in ("_name_or_path", "transformers_version"):
        config.pop(key, None)
    if encoder.layout == "hf":
        vocab, hidden = w("embeddings.token_embedding.weight")
        positions = w("embeddings.position_embedding.weight")[0]
        intermediate = w("encoder.layers.0.mlp.fc1.weight")[0]
        layers = count_indices(shapes, p + "encoder.layers.")
        projection = shapes.get(p.removesuffix("text_model.") + "text_projection.weight")
        projection_dim = projection[0] if projection and len(projection) == 2 else None
        if encoder.drop_last_layer:
            layers -= 1
    else:
        vocab, hidden = w("token_embedding.weight")
        positions = w("positional_embedding")[0]
        intermediate = w("transformer.resblocks.0.mlp.c_fc.weight")[0]
        layers = count_indices(shapes, p + "transformer.resblocks.")
        projection = shapes.get(p + "text_projection")
        projection_dim = projection[1] if projection and len(projection) == 2 else None
        if encoder.drop_last_layer:
            layers -= 1
    if layers < 1:
        raise ValueError("the text encoder has no layers")
    config.update(
        vocab_size=vocab,
        hidden_size=hidden,
        max_position_embeddings=positions,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=_text_heads(hidden),
    )
    if projection_dim is not None and not encoder.drop_last_layer:  # SD2 never uses its projection
        config["projection_dim"] = projection_dim
    return config
