"""Every size a model config sets, checked against what real models of its kind use (the
bounds are in limits), before anything is built from it: UNets, VAEs, diffusion transformers,
text encoders, schedulers and tokenizers. A config that names code of its own is refused too.

Each check raises ValueError whose text completes the sentence "<file>: ...", naming the key.
No torch here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from app.core.limits import (
    MAX_CHANNELS,
    MAX_HEADS,
    MAX_IMAGE_CHANNELS,
    MAX_IMAGE_SIZE,
    MAX_KERNEL,
    MAX_LATENT_SIZE,
    MAX_LAYERS_PER_BLOCK,
    MAX_LEVELS,
    MAX_MLP_RATIO,
    MAX_POSITIONS,
    MAX_SCHEDULE_NUMBER,
    MAX_TEXT_LAYERS,
    MAX_TRAIN_TIMESTEPS,
    MAX_TRANSFORMER_DEPTH,
    MAX_TRANSFORMER_INPUTS,
    MAX_TRANSFORMER_WIDTH,
    MAX_VOCAB,
    MAX_WIDTH,
    MAX_WIDTH_MULTIPLE,
    shown_value,
)

# key: (smallest, largest, which real models set the bound), for the configs of each component.
# A list value (per-level sizes) is checked element by element; None means "not set".
_UNET_SIZES: dict[str, tuple[int, int, str]] = {
    "sample_size": (1, MAX_LATENT_SIZE, "SDXL uses 128"),
    "in_channels": (1, MAX_IMAGE_CHANNELS, "SD uses 4, inpainting 9"),
    "out_channels": (1, MAX_IMAGE_CHANNELS, "SD uses 4"),
    "layers_per_block": (1, MAX_LAYERS_PER_BLOCK, "SDXL uses 2"),
    "block_out_channels": (1, MAX_CHANNELS, "SDXL uses at most 1280"),
    "attention_head_dim": (1, MAX_WIDTH, "SD1.x uses 8, SDXL 5 to 20"),
    "num_attention_heads": (1, MAX_HEADS, "SDXL uses at most 20"),
    "cross_attention_dim": (1, MAX_WIDTH, "SDXL uses 2048"),
    "transformer_layers_per_block": (1, MAX_TRANSFORMER_DEPTH, "SDXL uses at most 10"),
    "reverse_transformer_layers_per_block": (1, MAX_TRANSFORMER_DEPTH, "SDXL uses at most 10"),
    "norm_num_groups": (1, MAX_CHANNELS, "SD uses 32"),
    "time_embedding_dim": (1, MAX_WIDTH, "SDXL uses 1280"),
    "projection_class_embeddings_input_dim": (1, MAX_WIDTH, "SDXL uses 2816"),
    "addition_time_embed_dim": (1, MAX_WIDTH, "SDXL uses 256"),
    "encoder_hid_dim": (1, MAX_WIDTH, "IP-adapter UNets use 1024"),
    "num_class_embeds": (1, MAX_VOCAB, "SD x4 upscaler uses 1000"),
    "addition_embed_type_num_heads": (1, MAX_HEADS, "SDXL uses 64"),
    "conv_in_kernel": (1, MAX_KERNEL, "SD uses 3"),
    "conv_out_kernel": (1, MAX_KERNEL, "SD uses 3"),
}
_VAE_SIZES: dict[str, tuple[int, int, str]] = {
    "sample_size": (1, MAX_IMAGE_SIZE, "SDXL's VAE uses 1024"),
    "in_channels": (1, MAX_IMAGE_CHANNELS, "SD uses 3"),
    "out_channels": (1, MAX_IMAGE_CHANNELS, "SD uses 3"),
    "latent_channels": (1, MAX_IMAGE_CHANNELS, "SD uses 4, SD3 and Flux 16"),
    "layers_per_block": (1, MAX_LAYERS_PER_BLOCK, "SD's VAEs use 2"),
    "block_out_channels": (1, MAX_CHANNELS, "SD's VAEs use at most 512"),
    "norm_num_groups": (1, MAX_CHANNELS, "SD uses 32"),
    "decoder_block_out_channels": (1, MAX_CHANNELS, "Flux.2's VAE uses at most 512"),
    "patch_size": (1, MAX_KERNEL, "Flux.2's VAE uses 2x2"),
    # The 3D VAEs in the Wan 2.1 layout (Qwen-Image's, Krea 2's, Qwen-Image 2.1's).
    "base_dim": (1, MAX_CHANNELS, "Qwen-Image's VAE uses 96"),
    "decoder_base_dim": (1, MAX_CHANNELS, "Qwen-Image 2.1's VAE uses 144"),
    "z_dim": (1, MAX_IMAGE_CHANNELS, "Qwen-Image's VAE uses 16, Qwen-Image 2.1's 64"),
    "dim_mult": (1, MAX_WIDTH_MULTIPLE, "Qwen-Image's VAE uses 1, 2, 4 and 4"),
    "num_res_blocks": (1, MAX_LAYERS_PER_BLOCK, "Qwen-Image's VAE uses 2"),
    "input_channels": (1, MAX_IMAGE_CHANNELS, "Qwen-Image's VAE uses 3"),
    "scale_factor_spatial": (1, 64, "Qwen-Image 2.1's VAE uses 16"),
    "scale_factor_temporal": (1, 64, "Qwen-Image 2.1's VAE uses 8"),
}
_TEXT_SIZES: dict[str, tuple[int, int, str]] = {
    "vocab_size": (1, MAX_VOCAB, "CLIP uses 49,408, Qwen2 151,936"),
    "hidden_size": (1, MAX_WIDTH, "CLIP ViT-bigG uses 1280"),
    "d_model": (1, MAX_WIDTH, "T5-XXL uses 4096"),
    "intermediate_size": (1, MAX_WIDTH, "Qwen2.5-VL-7B uses 18,944"),
    "d_ff": (1, MAX_WIDTH, "T5-XXL uses 10,240"),
    "d_kv": (1, MAX_WIDTH, "T5 uses 64"),
    "projection_dim": (1, MAX_WIDTH, "CLIP ViT-bigG uses 1280"),
    "num_hidden_layers": (1, MAX_TEXT_LAYERS, "CLIP ViT-bigG uses 32"),
    "num_layers": (1, MAX_TEXT_LAYERS, "T5-XXL uses 24"),
    "num_decoder_layers": (1, MAX_TEXT_LAYERS, "T5-XXL uses 24"),
    "num_attention_heads": (1, MAX_HEADS, "T5-XXL uses 64"),
    "num_heads": (1, MAX_HEADS, "T5-XXL uses 64"),
    "num_key_value_heads": (1, MAX_HEADS, "Qwen2.5-VL-7B uses 4"),
    "max_position_embeddings": (1, MAX_POSITIONS, "CLIP uses 77"),
    "relative_attention_num_buckets": (1, MAX_POSITIONS, "T5 uses 32"),
    "relative_attention_max_distance": (1, MAX_POSITIONS, "T5 uses 128"),
    "head_dim": (1, MAX_WIDTH, "Qwen3 uses 128"),
}
# The vision tower of a multimodal text encoder (Qwen2.5-VL's, Qwen3-VL's, Mistral 3's), in
# its config's vision_config.
_VISION_SIZES: dict[str, tuple[int, int, str]] = {
    "depth": (1, MAX_TEXT_LAYERS, "Qwen2.5-VL-7B's vision tower uses 32"),
    "num_hidden_layers": (1, MAX_TEXT_LAYERS, "Mistral 3's vision tower uses 24"),
    "hidden_size": (1, MAX_WIDTH, "Qwen3-VL-8B's vision tower uses 1152"),
    "intermediate_size": (1, MAX_WIDTH, "Qwen3-VL-8B's vision tower uses 4304"),
    "out_hidden_size": (1, MAX_WIDTH, "Qwen3-VL-8B's uses 4096"),
    "num_heads": (1, MAX_HEADS, "Qwen3-VL-8B's vision tower uses 16"),
    "num_attention_heads": (1, MAX_HEADS, "Mistral 3's vision tower uses 16"),
    "head_dim": (1, MAX_WIDTH, "Mistral 3's vision tower uses 64"),
    "patch_size": (1, 64, "Qwen3-VL uses 16"),
    "spatial_merge_size": (1, MAX_KERNEL, "Qwen3-VL uses 2"),
    "temporal_patch_size": (1, MAX_KERNEL, "Qwen3-VL uses 2"),
    "num_position_embeddings": (1, MAX_POSITIONS, "Qwen3-VL uses 2304"),
    "image_size": (1, MAX_WIDTH, "Mistral 3 uses 1540"),
}
_TRANSFORMER_SIZES: dict[str, tuple[int, int, str]] = {
    "patch_size": (1, MAX_KERNEL, "SD3 uses 2, Flux 1 on packed latents"),
    "in_channels": (1, MAX_TRANSFORMER_INPUTS, "Flux uses 64, Flux.1 Fill 384, SD3 16"),
    "out_channels": (1, MAX_IMAGE_CHANNELS, "Flux uses 64, SD3 16"),
    "num_layers": (1, MAX_TRANSFORMER_DEPTH, "SD3.5 Large uses 38, Flux.1 19"),
    "num_single_layers": (0, MAX_TRANSFORMER_DEPTH, "Flux.1 uses 38"),
    "attention_head_dim": (1, MAX_WIDTH, "Flux uses 128, SD3 64"),
    "num_attention_heads": (1, MAX_HEADS, "SD3.5 Large uses 38"),
    "joint_attention_dim": (1, MAX_WIDTH, "T5-XXL's 4096"),
    "caption_projection_dim": (1, MAX_WIDTH, "SD3.5 Large uses 2432"),
    "pooled_projection_dim": (1, MAX_WIDTH, "SD3 uses 2048, Flux 768"),
    "pos_embed_max_size": (1, MAX_LATENT_SIZE * 2, "SD3.5 Medium uses 384"),
    "sample_size": (1, MAX_LATENT_SIZE, "SD3 uses 128"),
    "dual_attention_layers": (0, MAX_TRANSFORMER_DEPTH, "SD3.5 Medium's first 13 blocks"),
    "axes_dims_rope": (1, MAX_WIDTH, "Flux uses 16, 56 and 56"),
    "approximator_num_channels": (1, MAX_WIDTH, "Chroma uses 64"),
    "approximator_hidden_dim": (1, MAX_WIDTH, "Chroma uses 5120"),
    "approximator_layers": (1, MAX_TRANSFORMER_DEPTH, "Chroma uses 5"),
    "timestep_guidance_channels": (1, MAX_WIDTH, "Flux.2 uses 256"),
    "context_in_dim": (1, MAX_WIDTH, "Qwen-Image 2.1 reads Qwen3-VL-8B's 4096"),
    "num_key_value_heads": (1, MAX_HEADS, "Krea 2 uses 12"),
    "intermediate_size": (1, MAX_WIDTH, "Krea 2 uses 16,384"),
    "timestep_embed_dim": (1, MAX_WIDTH, "Krea 2 uses 256"),
    "text_hidden_dim": (1, MAX_WIDTH, "Krea 2 reads Qwen3-VL-4B's 2560"),
    "num_text_layers": (1, MAX_TEXT_LAYERS, "Krea 2 reads 12"),
    "text_num_attention_heads": (1, MAX_HEADS, "Krea 2 uses 20"),
    "text_num_key_value_heads": (1, MAX_HEADS, "Krea 2 uses 20"),
    "text_intermediate_size": (1, MAX_WIDTH, "Krea 2 uses 6912"),
    "num_layerwise_text_blocks": (0, MAX_TRANSFORMER_DEPTH, "Krea 2 uses 2"),
    "num_refiner_text_blocks": (0, MAX_TRANSFORMER_DEPTH, "Krea 2 uses 2"),
    # Z-Image names its sizes its own way.
    "dim": (1, MAX_TRANSFORMER_WIDTH, "Z-Image uses 3840"),
    "n_layers": (1, MAX_TRANSFORMER_DEPTH, "Z-Image uses 30"),
    "n_refiner_layers": (0, MAX_TRANSFORMER_DEPTH, "Z-Image uses 2"),
    "n_heads": (1, MAX_HEADS, "Z-Image uses 30"),
    "n_kv_heads": (1, MAX_HEADS, "Z-Image uses 30"),
    "cap_feat_dim": (1, MAX_WIDTH, "Z-Image reads Qwen3-4B's 2560"),
    "siglip_feat_dim": (1, MAX_WIDTH, "Z-Image Omni reads SigLIP's 1152"),
    "axes_dims": (1, MAX_WIDTH, "Z-Image uses 32, 48 and 48"),
    "axes_lens": (1, MAX_POSITIONS, "Z-Image uses 1024, 512 and 512"),
    "all_patch_size": (1, MAX_KERNEL, "Z-Image uses 2"),
    "all_f_patch_size": (1, MAX_KERNEL, "Z-Image uses 1"),
}
# Sizes that are ratios rather than counts: (smallest, largest, which real models set them).
_TRANSFORMER_RATIOS: dict[str, tuple[float, float, str]] = {
    "mlp_ratio": (1.0, MAX_MLP_RATIO, "Flux.2 and Qwen-Image 2.1 use 3"),
}
_SCHEDULER_SIZES: dict[str, tuple[int, int, str]] = {
    "num_train_timesteps": (1, MAX_TRAIN_TIMESTEPS, "every SD scheduler uses 1000"),
    "steps_offset": (0, MAX_TRAIN_TIMESTEPS, "SD uses 1"),
    "base_image_seq_len": (1, MAX_POSITIONS, "Flux.1 uses 256"),
    "max_image_seq_len": (1, MAX_POSITIONS, "Flux.1 uses 4096"),
    "solver_order": (1, 8, "DPM-Solver++ uses 2"),
}
# The numbers of a schedule that are no size, each with a wide margin over what diffusers'
# schedulers and the families' configs use: an absurd one (`shift: 1e308`) makes every
# timestep NaN and a good model look broken. A scheduler built for another sampler reads the
# same config, so every family's keys are bounded in every config.
_SCHEDULER_NUMBERS: dict[str, tuple[float, float, str]] = {
    "beta_start": (0.0, 1.0, "SD uses 0.00085"),
    "beta_end": (0.0, 1.0, "SD uses 0.012"),
    "shift": (0.0, 100.0, "SD3 and Z-Image use 3, FLUX.3 6.93"),
    "flow_shift": (0.0, 100.0, "Wan uses 3 to 12"),
    "base_shift": (-10.0, 10.0, "Flux.1 uses 0.5"),
    "max_shift": (-10.0, 10.0, "Flux.1 uses 1.15"),
    "shift_terminal": (0.0, 1.0, "LTX-Video uses 0.1"),
    "sigma_min": (0.0, 100.0, "Karras schedules use 0.0292, EDM 0.002"),
    "sigma_max": (0.0, 2000.0, "Karras schedules use 14.6, EDM 80"),
    "sigma_data": (0.0, 10.0, "EDM uses 0.5"),
    "rho": (0.0, 100.0, "Karras schedules use 7"),
    "sample_max_value": (0.0, 100.0, "SD uses 1"),
    "clip_sample_range": (0.0, 100.0, "SD uses 1"),
    "dynamic_thresholding_ratio": (0.0, 1.0, "DPM-Solver uses 0.995"),
    "timestep_scaling": (0.0, 1000.0, "LCM uses 10"),
    "snr_shift_scale": (0.0, 100.0, "CogVideoX uses 3"),
    "lambda_min_clipped": (-1000.0, 0.0, "DPM-Solver writes -Infinity, no clipping"),
}
_TOKENIZER_SIZES: dict[str, tuple[int, int, str]] = {
    "model_max_length": (1, MAX_POSITIONS, "CLIP uses 77"),
}
# The per-level lists of a UNet or VAE, which must all name the same number of levels.
_LEVEL_LISTS = ("block_out_channels", "down_block_types", "up_block_types")


def check_unet_config(config: Mapping[str, Any]) -> None:
    """Raise ValueError naming the first size of a UNet config outside what real models use."""
    _check_finite(config)
    _check_sizes(config, _UNET_SIZES)
    _check_levels(config)


def check_vae_config(config: Mapping[str, Any]) -> None:
    """Raise ValueError naming the first size of a VAE config outside what real models use."""
    _check_finite(config)
    _check_sizes(config, _VAE_SIZES)
    _check_levels(config)
    for key in ("dim_mult", "temperal_downsample", "attn_scales"):
        value = config.get(key)
        if value is not None and (not isinstance(value, (list, tuple)) or len(value) > MAX_LEVELS):
            raise ValueError(f"its {key} is not a list of at most {MAX_LEVELS} levels")
    base, multiples = config.get("base_dim"), config.get("dim_mult")
    if isinstance(base, int) and isinstance(multiples, (list, tuple)) and multiples:
        widest = base * max(multiples)
        if widest > MAX_CHANNELS:
            raise ValueError(
                f"its widest level (base_dim {base} x {max(multiples)}) is {widest:,} channels, "
                f"more than {MAX_CHANNELS:,}, so HalfSafe will not build it"
            )


def check_transformer_config(config: Mapping[str, Any]) -> None:
    """Raise ValueError naming the first size of a diffusion transformer config (Flux, Chroma,
    SD3) outside what real models use."""
    if config.get("dual_attention_layers") == []:  # none: every model but SD3.5 Medium
        config = {k: v for k, v in config.items() if k != "dual_attention_layers"}
    _check_finite(config)
    _check_sizes(config, _TRANSFORMER_SIZES)
    _check_ratios(config, _TRANSFORMER_RATIOS)
    width = config.get("num_attention_heads", 1) * config.get("attention_head_dim", 1)
    if width > MAX_TRANSFORMER_WIDTH:
        raise ValueError(
            f"its blocks are {width:,} wide, more than {MAX_TRANSFORMER_WIDTH:,} (Flux.1 uses "
            "3072), so HalfSafe will not build it"
        )
    _check_rotary(config)


def _check_rotary(config: Mapping[str, Any]) -> None:
    """Rotary position axes share each attention head, two values a turn: their widths must be
    even and add up to the head's (Flux.1's 16 + 56 + 56 = 128), or the first picture fails."""
    head = config.get("attention_head_dim")
    key = "axes_dims_rope"
    if config.get("axes_dims") is not None:  # Z-Image: its width split into n_heads heads
        key, width, heads = "axes_dims", config.get("dim"), config.get("n_heads")
        head = None
        if isinstance(width, int) and isinstance(heads, int):
            if width % heads:
                raise ValueError(f"its dim ({width}) does not split into {heads} heads")
            head = width // heads
    axes = config.get(key)
    if axes is None or not isinstance(head, int):
        return
    if not isinstance(axes, list) or not all(isinstance(a, int) for a in axes):
        raise ValueError(f"its {key} is {shown_value(axes)} where a list of whole numbers belongs")
    shown = ", ".join(str(a) for a in axes)
    if any(a % 2 for a in axes):
        raise ValueError(
            f"its {key} ({shown}) has an odd axis, where rotary axes turn values in pairs"
        )
    if sum(axes) != head:
        raise ValueError(
            f"its {key} ({shown}) add up to {sum(axes)} where its attention heads are {head} "
            "wide, which the rotary axes must share exactly"
        )


def check_text_encoder_config(config: Mapping[str, Any]) -> None:
    """Raise ValueError naming the first size of a text encoder config outside real models',
    its language model's and vision tower's (a multimodal encoder's text_config and
    vision_config) included."""
    _check_finite(config)
    _check_sizes(config, _TEXT_SIZES)
    for key, table in (("text_config", _TEXT_SIZES), ("vision_config", _VISION_SIZES)):
        nested = config.get(key)
        if nested is None:
            continue
        if not isinstance(nested, Mapping):
            raise ValueError(f"its {key} is {shown_value(nested)} where an object belongs")
        try:
            _check_sizes(nested, table)
        except ValueError as error:
            raise ValueError(str(error).replace("its ", f"its {key}'s ", 1)) from None


def check_scheduler_config(config: Mapping[str, Any]) -> None:
    """Raise ValueError when a scheduler config asks for more timesteps than real schedules,
    or holds a number outside what real schedules use (`_SCHEDULER_NUMBERS`; any other key's
    within +-`MAX_SCHEDULE_NUMBER`), NaN or an infinity included: the key named."""
    _check_sizes(config, _SCHEDULER_SIZES)
    lowest = config.get("lambda_min_clipped")
    if isinstance(lowest, float) and lowest == -math.inf:  # DPM-Solver's "no clipping"
        config = {k: v for k, v in config.items() if k != "lambda_min_clipped"}
    _check_ratios(config, _SCHEDULER_NUMBERS)
    betas = config.get("trained_betas")
    if betas is not None and (not isinstance(betas, list) or len(betas) > MAX_TRAIN_TIMESTEPS):
        raise ValueError(
            f"its trained_betas is not a list of at most {MAX_TRAIN_TIMESTEPS:,} numbers"
        )
    for beta in betas or ():
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0 <= beta < 1:
            raise ValueError(
                f"its trained_betas holds {shown_value(beta)} where a rate below 1 belongs"
            )
    base, top = config.get("base_image_seq_len"), config.get("max_image_seq_len")
    if isinstance(base, int) and isinstance(top, int) and base >= top:
        raise ValueError(
            f"its base_image_seq_len ({base}) is not below its max_image_seq_len ({top}), "
            "between which the shift is drawn"
        )
    _check_other_numbers(config, {*_SCHEDULER_SIZES, *_SCHEDULER_NUMBERS, "trained_betas"})


def _check_other_numbers(config: Mapping[str, Any], named: set[str]) -> None:
    """Every number of a schedule under a key not `named`, at any depth, is finite and within
    +-`MAX_SCHEDULE_NUMBER`."""
    pending = [(key, value) for key, value in config.items() if key not in named]
    while pending:
        key, value = pending.pop()
        if isinstance(value, Mapping):
            pending.extend((f"{key}.{k}", v) for k, v in value.items())
        elif isinstance(value, list):
            pending.extend((key, v) for v in value)
        elif (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and not -MAX_SCHEDULE_NUMBER <= value <= MAX_SCHEDULE_NUMBER
        ):
            raise ValueError(
                f"its {key} is {shown_value(value)}, outside +-{MAX_SCHEDULE_NUMBER:g} (no real "
                "schedule's number comes near), so HalfSafe will not build it"
            )


def check_tokenizer_config(config: Mapping[str, Any]) -> None:
    """Raise ValueError when a tokenizer pads prompts longer than any text encoder reads.

    transformers writes 1e30 for "no limit"; SD pipelines pad every prompt to a CLIP
    tokenizer's length, so an unbounded CLIP tokenizer is refused too. T5 and other encoders'
    pipelines (Flux, SD3, Chroma) pad to their own `max_sequence_length` instead, so there the
    "no limit" value is what transformers saves and is left alone.
    """
    unbounded = config.get("model_max_length")
    clip = str(config.get("tokenizer_class") or "").startswith("CLIP")
    if not clip and isinstance(unbounded, (int, float)) and unbounded >= _NO_LIMIT:
        config = {k: v for k, v in config.items() if k != "model_max_length"}
    _check_sizes(config, _TOKENIZER_SIZES)


_NO_LIMIT = 1e29  # transformers' VERY_LARGE_INTEGER is int(1e30)


def check_component_config(component: str, config: Mapping[str, Any]) -> None:
    """The check for a diffusers pipeline component by its folder name (others pass)."""
    if component.startswith("unet"):
        check_unet_config(config)
    elif component.startswith("transformer"):
        check_transformer_config(config)
    elif component.startswith("vae"):
        check_vae_config(config)
    elif component.startswith("text_encoder"):
        check_text_encoder_config(config)
    elif component.startswith("scheduler"):
        check_scheduler_config(config)


def _check_sizes(config: Mapping[str, Any], table: Mapping[str, tuple[int, int, str]]) -> None:
    for key, (low, high, usual) in table.items():
        if config.get(key) is None:
            continue
        for value in _leaves(config[key], key):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"its {key} is {shown_value(value)} where a whole number belongs")
            if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
                raise ValueError(f"its {key} is {shown_value(value)} where a whole number belongs")
            if not low <= value <= high:
                raise ValueError(
                    f"its {key} is {shown_value(value)}, outside {low} to {high:,} ({usual}), "
                    "so HalfSafe will not build it"
                )


def _check_ratios(config: Mapping[str, Any], table: Mapping[str, tuple[float, float, str]]) -> None:
    for key, (low, high, usual) in table.items():
        value = config.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"its {key} is {shown_value(value)} where a number belongs")
        if not low <= value <= high:
            raise ValueError(
                f"its {key} is {shown_value(value)}, outside {low:g} to {high:g} ({usual}), "
                "so HalfSafe will not build it"
            )


def _check_finite(config: Mapping[str, Any]) -> None:
    """Every number anywhere in a model config is finite: NaN or Infinity (which Python's json
    reads) is no size, scale or rate of a real model."""
    pending: list[tuple[str, Any]] = [(key, value) for key, value in config.items()]
    while pending:
        key, value = pending.pop()
        if isinstance(value, Mapping):
            pending.extend((f"{key}.{k}", v) for k, v in value.items())
        elif isinstance(value, list):
            pending.extend((key, v) for v in value)
        elif isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"its {key} is {shown_value(value)} where a number belongs")


def _leaves(value: Any, key: str) -> list[Any]:
    """The numbers in a size value: itself, or the elements of a (nested) per-level list."""
    found: list[Any] = []
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, (list, tuple)):
            if len(found) + len(item) > 4 * MAX_LEVELS * MAX_TRANSFORMER_DEPTH:
                raise ValueError(f"its {key} lists more sizes than any real model has")
            pending.extend(item)
        else:
            found.append(item)
    if not found:
        raise ValueError(f"its {key} is an empty list where sizes belong")
    return found


def _check_levels(config: Mapping[str, Any]) -> None:
    lengths = {}
    for key in _LEVEL_LISTS:
        value = config.get(key)
        if value is None:
            continue
        if not isinstance(value, list) or not 1 <= len(value) <= MAX_LEVELS:
            raise ValueError(
                f"its {key} is not a list of 1 to {MAX_LEVELS} levels (SD models have 4)"
            )
        lengths[key] = len(value)
    if len(set(lengths.values())) > 1:
        words = ", ".join(f"{key} {count}" for key, count in lengths.items())
        raise ValueError(f"its per-level lists disagree on the number of levels ({words})")


def check_no_custom_code(document: Any) -> None:
    """Raise ValueError when a config names code of the model's own to import: an `auto_map`
    (transformers' and diffusers' Auto classes read it, at any level a config nests, and would
    import the .py file it points at, asking on the terminal first where no answer was given)."""
    pending = [document]
    while pending:
        value = pending.pop()
        if isinstance(value, dict):
            if "auto_map" in value:
                raise ValueError(
                    "it names code of its own to run (auto_map), and HalfSafe never runs code "
                    "from a model folder"
                )
            pending.extend(v for v in value.values() if isinstance(v, (dict, list)))
        elif isinstance(value, list):
            pending.extend(v for v in value if isinstance(v, (dict, list)))
