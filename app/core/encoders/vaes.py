"""The VAE kinds more than one family takes: the original-layout VAE (SD's, SDXL's, Flux.1's
ae, SD3.x's: encoder.*, decoder.*, in a file of its own or a full checkpoint's
first_stage_model.*), Qwen-Image's in the Wan 2.1 layout (Qwen-Image's and Anima's), and
Flux.2's with its batch-norm statistics (Flux.2's and FLUX.3's). What a VAE file offers a
transformer is its latent channels."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.core import architecture as arch
from app.core import config_limits, limits, paths
from app.core.encoders.kind import VaeKind
from app.core.errors import BadFileError, UnsupportedModelError
from app.core.formats.layouts import Need, Shapes, bounded, count_indices, weight_shape

# The original layout ---------------------------------------------------------------------------

_PARTS = ("encoder.", "decoder.", "quant_conv.", "post_quant_conv.")
# Where a file keeps its VAE: a full checkpoint's, a "vae." save, a VAE file of its own.
PREFIXES = (arch.VAE, "vae.", "")
# The size a transformer's VAE is built for (its config's sample size: tiling only).
_SAMPLE_SIZE = 1024


def vae_keys(names: list[str], prefix: str) -> list[str]:
    """The VAE's keys under `prefix` (its encoder, decoder and the convolutions around the
    latent)."""
    return [k for k in names if k.startswith(prefix) and k[len(prefix) :].startswith(_PARTS)]


def vae_to_diffusers(
    tensors: dict[str, Any], prefix: str, config: dict[str, Any]
) -> dict[str, Any]:
    """A VAE's tensors under `prefix`, original or diffusers names, renamed to
    AutoencoderKL's."""
    plain = {k[len(prefix) :]: v for k, v in tensors.items()}
    if "encoder.down_blocks.0.resnets.0.conv1.weight" in plain:
        # Already diffusers names; older files still call the attention projections
        # query/key/value/proj_attn and store them as 1x1 convolutions.
        renamed = {}
        for key, tensor in plain.items():
            for old, new in (
                (".query.", ".to_q."),
                (".key.", ".to_k."),
                (".value.", ".to_v."),
                (".proj_attn.", ".to_out.0."),
            ):
                key = key.replace(old, new)
            if ".attentions." in key and key.endswith("weight") and tensor.ndim > 2:
                tensor = tensor.reshape(tensor.shape[0], tensor.shape[1])
            renamed[key] = tensor
        return renamed
    from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint

    return convert_ldm_vae_checkpoint(plain, config)


def vae_from_checkpoint(checkpoint, prefix: str, base: dict[str, Any], native_size: int, read):
    """An AutoencoderKL from the VAE under `prefix` of a checkpoint, its config read from the
    shapes over `base`; `read(keys)` gives its tensors."""
    import diffusers

    from app.core.checkpoint.assembly import assign, built, empty

    path = checkpoint.path
    try:
        config = arch.infer_vae_config(
            checkpoint.shapes, base, prefix=prefix, sample_size=native_size
        )
    except ValueError as error:
        raise UnsupportedModelError(
            path, f"its VAE is not one HalfSafe can build: {error}."
        ) from None
    try:
        config_limits.check_vae_config(config)
    except ValueError as error:
        raise BadFileError(
            path, f"the VAE weights' shapes describe a VAE no real file holds: {error}."
        ) from None
    tensors = read(vae_keys(checkpoint.keys(), prefix))
    model = built(path, "VAE", empty, diffusers.AutoencoderKL.from_config, config)
    return assign(path, model, built(path, "VAE", vae_to_diffusers, tensors, prefix, config), "VAE")


def shipped_vae_config(configs: str) -> dict[str, Any]:
    """The VAE config a family ships in app/resources/configs/<configs>/vae."""
    return limits.read_json_object(paths.resource("configs", configs, "vae", "config.json"))


class OriginalVaeKind(VaeKind):
    key = "vae"

    def holds(self, shapes: Shapes) -> bool:
        return "decoder.conv_in.weight" in shapes

    def width(self, shapes: Shapes) -> int | None:
        if not self.holds(shapes):
            return None
        config = arch.infer_vae_config(shapes, {}, prefix="")
        config_limits.check_vae_config(config)
        return config["latent_channels"]

    def load(self, checkpoint, prefix: str, need: Need, configs: str) -> tuple[Any, list]:
        keys = checkpoint.keys()
        if not prefix:  # a file of its own, or a checkpoint's VAE given as one
            prefix = next(
                (p for p in PREFIXES if any(k.startswith(p + "decoder.") for k in keys)), ""
            )
        if not any(k.startswith(prefix + "encoder.") for k in keys) or not any(
            k.startswith(prefix + "decoder.") for k in keys
        ):
            raise BadFileError(
                checkpoint.path, "this file holds no VAE (no encoder and decoder tensors)."
            )
        names = vae_keys(keys, prefix)

        def read(wanted: list[str]) -> dict[str, Any]:
            return {k: checkpoint.get(k) for k in wanted}

        model = vae_from_checkpoint(
            checkpoint, prefix, shipped_vae_config(configs), _SAMPLE_SIZE, read
        )
        return model, [checkpoint.dtypes[k] for k in names]


VAE = OriginalVaeKind()


# Flux.2's ---------------------------------------------------------------------------------------

_STATISTICS = ("bn.running_mean", "bn.running_var")


class Flux2VaeKind(OriginalVaeKind):
    """The original layout with batch-norm statistics over its latent patches."""

    key = "flux2_vae"
    diffusers_class = "AutoencoderKLFlux2"

    def holds(self, shapes: Shapes) -> bool:
        return "decoder.conv_in.weight" in shapes and "bn.running_mean" in shapes

    def load(self, checkpoint, prefix: str, need: Need, configs: str) -> tuple[Any, list]:
        """The original or diffusers names, with its statistics, read as an
        AutoencoderKLFlux2 on the shipped config."""
        import diffusers
        import torch

        from app.core.checkpoint.assembly import assign, empty

        path = checkpoint.path
        try:
            config = arch.infer_vae_config(
                checkpoint.shapes, shipped_vae_config(configs), prefix=""
            )
            config_limits.check_vae_config(config)
        except ValueError as error:
            raise UnsupportedModelError(path, f"this VAE cannot be built: {error}.") from None
        tensors = {k: checkpoint.get(k) for k in checkpoint.shapes if k.startswith(_PARTS)}
        state = vae_to_diffusers(tensors, "", config)
        for key in _STATISTICS:
            if key not in checkpoint.shapes:
                raise BadFileError(path, f"the VAE is incomplete: {key} is missing.")
            state[key] = checkpoint.get(key)
        # How many batches the statistics were gathered over: never used when sampling.
        counted = "bn.num_batches_tracked"
        state[counted] = (
            checkpoint.get(counted)
            if counted in checkpoint.shapes
            else torch.zeros((), dtype=torch.long)
        )
        dtypes = [checkpoint.dtypes[k] for k in [*tensors, *_STATISTICS]]
        model = empty(diffusers.AutoencoderKLFlux2.from_config, config)
        return assign(path, model, state, "VAE"), dtypes


FLUX2_VAE = Flux2VaeKind()


# The Wan 2.1 layout -------------------------------------------------------------------------------

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


class WanVaeKind(VaeKind):
    key = "wan_vae"
    layout = "the Wan 2.1 layout"
    diffusers_class = "AutoencoderKLQwenImage"

    def holds(self, shapes: Shapes) -> bool:
        return is_wan_vae(shapes)

    def width(self, shapes: Shapes) -> int | None:
        return wan_vae_config(shapes)["z_dim"] if is_wan_vae(shapes) else None

    def load(self, checkpoint, prefix: str, need: Need, configs: str) -> tuple[Any, list]:
        import diffusers

        from app.core.checkpoint.assembly import assign, empty

        path = checkpoint.path
        try:
            config = wan_vae_config(checkpoint.shapes)
        except (KeyError, ValueError) as error:
            raise UnsupportedModelError(path, f"this VAE cannot be built: {error}.") from None
        model = empty(diffusers.AutoencoderKLQwenImage.from_config, config)
        expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        try:
            state = wan_vae_to_diffusers(
                {k: checkpoint.get(k) for k in checkpoint.shapes},
                expected,
                config["num_res_blocks"],
            )
        except KeyError as error:
            raise BadFileError(
                path, f"the VAE is incomplete: {error.args[0]} is missing."
            ) from None
        return assign(path, model, state, "VAE"), list(checkpoint.dtypes.values())


WAN_VAE = WanVaeKind()


# What a VAE file or folder is ---------------------------------------------------------------------

# The layouts other than the original one, told apart by their files.
LAYOUTS: tuple[VaeKind, ...] = (WAN_VAE,)


def layout_of_file(shapes: Shapes) -> str:
    """A VAE file's layout in words ("": the original one)."""
    return next((kind.layout for kind in LAYOUTS if kind.holds(shapes)), "")


def layout_of_class(class_name: str) -> str:
    """The layout of a VAE folder declaring `class_name` ("": the original one)."""
    return next((kind.layout for kind in LAYOUTS if kind.diffusers_class == class_name), "")


def channels_of_file(shapes: Shapes) -> int | None:
    """The latent channels of a VAE file (original or diffusers names, a full checkpoint's
    first_stage_model, or another layout), from its header; None when it holds no VAE."""
    for kind in LAYOUTS:
        if kind.holds(shapes):
            try:
                return kind.width(shapes)
            except ValueError:
                return None
    for prefix in PREFIXES:
        shape = shapes.get(prefix + "decoder.conv_in.weight", ())
        if len(shape) == 4:
            return int(shape[1])
    return None
