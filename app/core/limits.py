"""Bounds on what a file can make HalfSafe do: which files it opens, how much it reads, how big a
model it builds.

Every model file is untrusted, and a few hostile bytes can name a size that costs gigabytes or
minutes: a config with `layers_per_block: 100000`, a 20M-entry vocabulary, a FIFO named
`config.json` that blocks a reader forever. Everything here runs BEFORE anything is allocated
from such a size: files are opened only when they are regular files, JSON is read with a size
and nesting cap, and every size a config sets is checked against what real models of that kind
use, with a wide margin (the coming families, Flux, SD3.5, Z-Image and Qwen-Image, fit too).

A check that fails raises ValueError (or an OSError for files) whose text completes the
sentence "<file>: ..."; the loaders turn it into BadFileError. No torch here.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, BinaryIO

# Layers of one text encoder: CLIP ViT-L 12, OpenCLIP ViT-H 24, ViT-bigG 32, T5-XXL 24,
# Qwen2.5-VL-7B (Qwen-Image) 28, Qwen3-4B (Z-Image) 36; even Llama-70B has 80.
MAX_TEXT_LAYERS = 128
# Resnet layers per UNet or VAE level: 2 in SD1.x, SD2.x, SDXL and their VAEs (3 per decoder
# level, which diffusers derives from the same number).
MAX_LAYERS_PER_BLOCK = 16
# Transformer blocks in one UNet attention (transformer_layers_per_block): SDXL 10.
MAX_TRANSFORMER_DEPTH = 128
# Levels of a UNet or VAE (entries of block_out_channels): 4 in every Stable Diffusion model.
MAX_LEVELS = 8
# Channels of one UNet or VAE level: SD1.x 1280, SDXL 1280, the SD VAEs 512.
MAX_CHANNELS = 8192
# Image and latent channels: 3 and 4 in SD1.x/SDXL, 16 in SD3/Flux, 9 for inpainting UNets.
MAX_IMAGE_CHANNELS = 128
# A transformer's input channels: latent channels in 2x2 patches and what it reads beside them
# (Flux.1 Fill: 64 + 64 + 256 = 384).
MAX_TRANSFORMER_INPUTS = 1024
# Widths of text encoders and attention (hidden, MLP, cross-attention, projection sizes):
# CLIP-bigG 1280/5120, T5-XXL 4096/10240, Qwen2.5-VL-7B 3584/18944, Flux 3072/12288.
MAX_WIDTH = 65_536
# A transformer block's MLP width per unit of its own (mlp_ratio): Flux.2 and Qwen-Image 2.1
# use 3, most transformers 4.
MAX_MLP_RATIO = 16
# A VAE level's width per unit of its base width (dim_mult): Qwen-Image 2.1's VAE uses 8.
MAX_WIDTH_MULTIPLE = 64
# Attention heads (and SD1.x's attention_head_dim, which counts heads): SDXL 20, T5-XXL 64.
MAX_HEADS = 1024
# Vocabulary: CLIP 49,408, T5 32,128, Qwen2 151,646 (151,936 padded), Gemma 3 262,144.
MAX_VOCAB = 300_000
# BPE merges: CLIP 48,894, Qwen2 151,387.
MAX_MERGES = 300_000
# Text positions: CLIP 77, T5 512 (relative), Qwen2.5-VL 128,000 (rotary).
MAX_POSITIONS = 1 << 18
# Pixels of a picture HalfSafe reads or makes (explain's reader, input pictures, a final picture
# with the hires fix's upscale): 8944 x 8944; below PIL's decompression-bomb warning (89 million).
MAX_PIXELS = 80_000_000
# Training timesteps of a noise schedule: 1000 in every SD scheduler and in flow matching.
MAX_TRAIN_TIMESTEPS = 10_000
# UNet sample_size, in latents: SD1.x 64, SD2.x 96, SDXL 128 (2048 px at most).
MAX_LATENT_SIZE = 256
# VAE sample_size, in pixels: SD1.x 512, SD2.x 768, SDXL 1024.
MAX_IMAGE_SIZE = 2048
# Convolution kernels: 3 in every SD UNet and VAE.
MAX_KERNEL = 15
# One tensor: Gemma 3's token embedding, 262,144 x 3,840, is 1.0e9 elements; eight times that.
MAX_TENSOR_ELEMENTS = 1 << 33
# One dimension of a tensor (a 0-element tensor can still name any size): vocabularies reach
# 262,144; nothing real comes near 2**31.
MAX_TENSOR_DIMENSION = 1 << 31
# Dimensions of a tensor: 4 for convolutions, 5 for video models.
MAX_TENSOR_RANK = 8
# JSON configs: a UNet config is 2 KB; tokenizer files reach a few MB (CLIP's vocab.json 1 MB,
# Qwen2's tokenizer.json 7 MB, Gemma 3's 33 MB).
MAX_CONFIG_BYTES = 1 << 20
MAX_TOKENIZER_BYTES = 64 << 20
# Nesting of a JSON document: configs nest 2-3 levels, tokenizer.json 5.
MAX_JSON_DEPTH = 32
# Digits of a block index in a tensor name or of a part of a version read as a number: real
# models number a few hundred blocks, but an index of 1e12 must still be read, to be refused by
# the bounds above as the size it claims. Past this, the part is a name (int() refuses a text
# of thousands of digits).
MAX_INDEX_DIGITS = 18
# GGUF headers (walked in gguf.check_gguf_header before anything maps the file).
# Tensors in one GGUF file: a Flux.1 transformer has about 780, SD3.5 Large about 1,200, Wan
# 14B about 1,100, the largest language models (Llama 3 70B, Mixtral) under 1,000. The header
# walk costs 10-30 us per tensor, and the companion search walks every file beside a model,
# so this bound is what keeps a folder of hostile files to seconds.
MAX_GGUF_TENSORS = 1 << 13
# Metadata entries: a diffusion GGUF has a handful, a language model's a few dozen, and
# ComfyUI-GGUF adds one original shape per reshaped tensor.
MAX_GGUF_KEYS = 1 << 14
# Array elements over all metadata: a language model's vocabulary and merges are 150k-260k each.
MAX_GGUF_ARRAY_ITEMS = 1 << 22
# Strings among them, each walked one by one: Qwen2's 151,936 tokens and 151,387 merges, Gemma
# 3's 262,144 tokens and its merges.
MAX_GGUF_ARRAY_STRINGS = 1 << 20
# One string (a key, a tensor name, a chat template in the metadata).
MAX_GGUF_STRING = 1 << 20
MAX_GGUF_ALIGNMENT = 1 << 16


# Files ------------------------------------------------------------------------------------


class NotRegularFileError(OSError):
    """The name is a pipe, socket, device or folder where a file belongs."""


class FileTooLargeError(OSError):
    """The file is larger than any real file of its kind."""


_KINDS = (
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a device"),
    (stat.S_ISBLK, "a device"),
    (stat.S_ISDIR, "a folder"),
)


def _kind(mode: int) -> str:
    return next((words for test, words in _KINDS if test(mode)), "not a regular file")


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """Open `path` for binary reading if, and only if, it is a regular file (a symlink to one is
    fine).

    A plain open() of a FIFO waits for a writer forever, and a device can be read endlessly.
    The file is opened non-blocking (so a FIFO returns at once) and the decision is made on the
    opened descriptor, which a rename cannot swap; then blocking reads are restored. Raises
    NotRegularFileError (an OSError) for anything else, or the OSError of the open.
    """
    nonblocking = getattr(os, "O_NONBLOCK", 0)  # POSIX; Windows has no FIFOs to wait on
    fd = os.open(path, os.O_RDONLY | nonblocking | getattr(os, "O_BINARY", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFileError(
                errno.EINVAL, f"it is {_kind(mode)}, not a regular file", str(path)
            )
        if nonblocking:
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def is_regular_file(path: str | os.PathLike[str]) -> bool:
    """True for a regular file (or a symlink to one); never opens it, never blocks."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def read_regular(path: str | os.PathLike[str], limit: int) -> bytes:
    """The whole content of a regular file of at most `limit` bytes (see `open_regular`).

    Raises FileTooLargeError before reading when the file is larger, and also when it grows
    past `limit` while being read.
    """
    with open_regular(path) as handle:
        size = os.fstat(handle.fileno()).st_size
        if size > limit:
            raise FileTooLargeError(errno.EFBIG, _too_large(size, limit), str(path))
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise FileTooLargeError(errno.EFBIG, _too_large(len(data), limit), str(path))
    return data


def _too_large(size: int, limit: int) -> str:
    return f"it is {_megabytes(size)}, more than the {_megabytes(limit)} any real one needs"


def _megabytes(size: int) -> str:
    return f"{size / (1 << 20):.1f} MB" if size >= 1 << 20 else f"{size / 1024:.0f} KB"


# JSON -------------------------------------------------------------------------------------


def parse_json(raw: bytes) -> Any:
    """Parse a JSON document, refusing one nested deeper than MAX_JSON_DEPTH levels.

    Raises ValueError with the reason: not UTF-8, not JSON, or nested too deeply (a document
    of 100,000 brackets would otherwise exhaust Python's recursion inside json or later).
    """
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ValueError("it is not UTF-8 text") from None
    try:
        document = json.loads(text)
    except RecursionError:
        raise ValueError(_too_deep()) from None
    except ValueError as error:
        raise ValueError(f"it is not valid JSON ({str(error).split(':')[0]})") from None
    if json_depth(document) > MAX_JSON_DEPTH:
        raise ValueError(_too_deep())
    return document


def _too_deep() -> str:
    return (
        f"it is nested more than {MAX_JSON_DEPTH} levels deep, which no real config is "
        "(it is damaged or hostile)"
    )


def json_depth(document: Any) -> int:
    """How many levels of lists and objects nest in a parsed document (iterative, so any depth
    that json could parse is measured without recursion)."""
    deepest = 0
    pending: list[tuple[Any, int]] = [(document, 1)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, dict):
            children: Iterable[Any] = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > MAX_JSON_DEPTH:
            return deepest
        pending.extend((child, depth + 1) for child in children)
    return deepest


def read_json_object(path: str | os.PathLike[str], limit: int = MAX_CONFIG_BYTES) -> dict[str, Any]:
    """A JSON object from a regular file of at most `limit` bytes, nested at most
    MAX_JSON_DEPTH levels. Raises OSError (missing, unreadable, not a regular file, too large)
    or ValueError (not UTF-8, not JSON, too deep, not an object)."""
    document = parse_json(read_regular(path, limit))
    if not isinstance(document, dict):
        raise ValueError("it holds JSON but not an object")
    return document


# Model sizes ------------------------------------------------------------------------------

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
# A transformer's width (heads x head width), which sizes every weight: Flux's 3072.
MAX_TRANSFORMER_WIDTH = 16_384
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
# Any other number in a schedule (a key of a scheduler HalfSafe does not name): none of a real
# one comes near.
MAX_SCHEDULE_NUMBER = 1e6
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
        raise ValueError(f"its {key} is {_show(axes)} where a list of whole numbers belongs")
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
            raise ValueError(f"its {key} is {_show(nested)} where an object belongs")
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
            raise ValueError(f"its trained_betas holds {_show(beta)} where a rate below 1 belongs")
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
                f"its {key} is {_show(value)}, outside +-{MAX_SCHEDULE_NUMBER:g} (no real "
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
                raise ValueError(f"its {key} is {_show(value)} where a whole number belongs")
            if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
                raise ValueError(f"its {key} is {_show(value)} where a whole number belongs")
            if not low <= value <= high:
                raise ValueError(
                    f"its {key} is {_show(value)}, outside {low} to {high:,} ({usual}), "
                    "so HalfSafe will not build it"
                )


def _check_ratios(config: Mapping[str, Any], table: Mapping[str, tuple[float, float, str]]) -> None:
    for key, (low, high, usual) in table.items():
        value = config.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"its {key} is {_show(value)} where a number belongs")
        if not low <= value <= high:
            raise ValueError(
                f"its {key} is {_show(value)}, outside {low:g} to {high:g} ({usual}), "
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
            raise ValueError(f"its {key} is {_show(value)} where a number belongs")


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


def _show(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, float) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_tensor_shape(shape: Iterable[int]) -> str | None:
    """Why a tensor shape is beyond any real model's (rank, a dimension or the element count),
    or None. Works on shapes of zero-element tensors too, which cost no bytes in a file."""
    shape = list(shape)
    if len(shape) > MAX_TENSOR_RANK:
        return f"has {len(shape)} dimensions, more than the {MAX_TENSOR_RANK} any real weight has"
    if any(d > MAX_TENSOR_DIMENSION for d in shape):
        return f"has shape {_show(shape)}, a dimension larger than any real weight's"
    if math.prod(shape) > MAX_TENSOR_ELEMENTS:
        return f"has {math.prod(shape):.2g} elements, more than any real weight"
    return None


def index_in_name(part: str, digits: int = MAX_INDEX_DIGITS) -> int | None:
    """The number a part of a tensor name or a version ("12" in "blocks.12.attn", "41" in
    "0.41") writes in ASCII digits, at most `digits` of them; None for anything else. str's
    isdigit() holds for "²" and "٣", which int() refuses or reads as another number, and int()
    refuses a text of thousands of digits: such a part is a name, never a number."""
    if 0 < len(part) <= digits and part.isascii() and part.isdigit():
        return int(part)
    return None


# Tokenizer files ----------------------------------------------------------------------------


def check_vocabulary(path: str | os.PathLike[str]) -> None:
    """A BPE vocabulary (vocab.json): an object of token -> id, at most MAX_VOCAB entries."""
    vocabulary = parse_json(read_regular(path, MAX_TOKENIZER_BYTES))
    if not isinstance(vocabulary, dict):
        raise ValueError("its vocabulary is not a JSON object of tokens to ids")
    if len(vocabulary) > MAX_VOCAB:
        raise ValueError(
            f"its vocabulary has {len(vocabulary)} entries, more than the {MAX_VOCAB:,} of any "
            "real tokenizer (CLIP has 49,408)"
        )
    for token, number in vocabulary.items():
        if isinstance(number, bool) or not isinstance(number, int) or not 0 <= number < MAX_VOCAB:
            raise ValueError(
                f"its vocabulary gives token {_show(token)} the id {_show(number)} where a "
                f"whole number from 0 to {MAX_VOCAB - 1} belongs"
            )


def check_merges(path: str | os.PathLike[str]) -> None:
    """BPE merges (merges.txt): UTF-8 lines of two tokens each, after an optional #version."""
    try:
        text = read_regular(path, MAX_TOKENIZER_BYTES).decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("its merges file is not UTF-8 text") from None
    lines = text.split("\n")
    if len(lines) > MAX_MERGES + 2:
        raise ValueError(
            f"it has {len(lines)} merges, more than the {MAX_MERGES:,} of any real tokenizer"
        )
    for number, line in enumerate(lines, start=1):
        line = line.rstrip("\r")
        if not line or (number == 1 and line.startswith("#version")):
            continue
        if len(line.split()) != 2:
            raise ValueError(
                f"line {number} of its merges is {_show(line)}, where two tokens belong"
            )


def check_component_files(folder: Path, component: str | None = None) -> None:
    """Every file a loader may open in one diffusers component folder: regular files only,
    JSON bounded in size and depth, tokenizer vocabularies and merges well formed.

    `component` (default: the folder's name) says which config checks apply. Raises
    ComponentFileError, which names the file and the reason.
    """
    component = component or folder.name
    try:
        entries = sorted(folder.iterdir())
    except OSError as error:
        raise ComponentFileError(folder, error.strerror or str(error)) from None
    for entry in entries:
        try:
            mode = os.stat(entry).st_mode
        except OSError:
            continue  # a dangling link: no loader can open it either
        if stat.S_ISDIR(mode):
            continue
        if not stat.S_ISREG(mode):
            raise ComponentFileError(entry, f"it is {_kind(mode)}, not a regular file")
        try:
            _check_component_file(component, entry)
        except (OSError, ValueError) as error:
            reason = error.strerror if isinstance(error, OSError) else str(error)
            raise ComponentFileError(entry, reason or str(error)) from None


class ComponentFileError(ValueError):
    """One file of a component folder failed its check; `path` says which."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(reason)


def _check_component_file(component: str, path: Path) -> None:
    name = path.name
    if name == "vocab.json" and component.startswith("tokenizer"):
        check_vocabulary(path)
    elif name == "merges.txt":
        check_merges(path)
    elif name.endswith(".json"):
        configs = ("config.json", "scheduler_config.json")
        limit = MAX_CONFIG_BYTES if name in configs else MAX_TOKENIZER_BYTES
        document = parse_json(read_regular(path, limit))
        if name != "tokenizer.json":  # the tokenizers library's own format: no loader's config
            check_no_custom_code(document)
        if name in configs:
            if not isinstance(document, dict):
                raise ValueError("it holds JSON but not an object")
            check_component_config(component, document)
        elif name == "tokenizer_config.json" and isinstance(document, dict):
            check_tokenizer_config(document)


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


# Names from an image or a prompt -----------------------------------------------------------


class OutsideFoldersError(ValueError):
    """A name from an image or a prompt that would reach outside the model folders: an absolute
    path, a drive or network share, a `..` step, or a link that leads out of its folder."""


def relative_name(name: str) -> PurePosixPath:
    """`name` as a path below some folder, with either slash. Raises OutsideFoldersError for
    anything that is not: absolute (`/x`, `C:\\x`, `C:x`, `\\\\server\\share`), from the home
    folder (`~`), with a `..` step, or not a file name at all (empty, a NUL character)."""
    text = name.strip()
    if not text or "\0" in text:
        raise OutsideFoldersError("it is not a file name")
    windows = PureWindowsPath(text)
    posix = PurePosixPath(text.replace("\\", "/"))
    if windows.drive or windows.root or posix.is_absolute():
        raise OutsideFoldersError("it is an absolute path")
    if posix.parts[0].startswith("~"):
        raise OutsideFoldersError("it starts from a home folder")
    if ".." in posix.parts:
        raise OutsideFoldersError("it steps out of its folder with '..'")
    return posix


def within(path: str | os.PathLike[str], folders: Iterable[str | os.PathLike[str]]) -> bool:
    """True when `path`, every link followed, lies inside one of `folders` (links followed too),
    so a link inside a model folder that leads elsewhere is outside."""
    try:
        target = Path(path).resolve()
    except (OSError, RuntimeError, ValueError):
        return False
    for folder in folders:
        try:
            if target.is_relative_to(Path(folder).resolve()):
                return True
        except (OSError, RuntimeError, ValueError):
            continue
    return False


def find_in_folders(
    name: str, folders: Iterable[str | os.PathLike[str]], suffixes: Iterable[str] = ("",)
) -> Path | None:
    """The first regular file `folder / (name + suffix)` that lies inside that folder, for a
    `name` that came from an image or a prompt; None when no folder has one.

    This is where such names are resolved, so that they reach only the model folders: a name
    that is absolute or climbs out (`relative_name`) raises OutsideFoldersError before any file
    is looked at, and so does one whose only matches are links leading out of their folder.
    Only stats files; never opens one.
    """
    relative = relative_name(name)
    escaped = False
    for folder in folders:
        for suffix in suffixes:
            candidate = Path(folder) / f"{relative}{suffix}"
            if not is_regular_file(candidate):
                continue
            if within(candidate, [folder]):
                return candidate
            escaped = True
    if escaped:
        raise OutsideFoldersError("it is a link to a file outside the model folders")
    return None
