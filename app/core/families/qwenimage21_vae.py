"""Qwen-Image 2.1's VAE kind, its own: a file in diffusers' AutoencoderKLQwenImage21 names (its
residual blocks, convolutions stored 2-D: one frame per image), with the released VAE's
per-channel latent statistics (app/resources/configs/qwenimage21/vae)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.core import limits, paths
from app.core.encoders.kind import VaeKind
from app.core.errors import UnsupportedModelError
from app.core.formats.layouts import Need, Shapes, bounded, count_indices, weight_shape

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


def _released() -> dict[str, Any]:
    return limits.read_json_object(paths.resource("configs", "qwenimage21", "vae", "config.json"))


class QwenImage21VaeKind(VaeKind):
    key = "qwenimage21_vae"
    diffusers_class = "AutoencoderKLQwenImage21"

    def holds(self, shapes: Shapes) -> bool:
        return is_qwenimage21_vae(shapes)

    def width(self, shapes: Shapes) -> int | None:
        if not is_qwenimage21_vae(shapes):
            return None
        return qwenimage21_vae_config(shapes, _released())["z_dim"]

    def load(self, checkpoint, prefix: str, need: Need, configs: str) -> tuple[Any, list]:
        import diffusers

        from app.core.checkpoint.assembly import assign, empty

        path = checkpoint.path
        try:
            config = qwenimage21_vae_config(checkpoint.shapes, _released())
        except (KeyError, ValueError) as error:
            raise UnsupportedModelError(path, f"this VAE cannot be built: {error}.") from None
        model = empty(diffusers.AutoencoderKLQwenImage21.from_config, config)
        state = {k: checkpoint.get(k) for k in checkpoint.shapes}
        return assign(path, model, state, "VAE"), list(checkpoint.dtypes.values())


QWENIMAGE21_VAE = QwenImage21VaeKind()
