"""Builders for the checkpoint files the model tests read: good ones, and the bad-input corpus.

Everything is written in code into tmp_path; nothing is downloaded.
"""

from __future__ import annotations

import json
import pickle
import struct
from pathlib import Path

import torch
from safetensors.torch import save_file


def raw_safetensors(
    path: Path, header: object, data: bytes = b"", *, length: int | None = None
) -> Path:
    """A safetensors file written byte by byte: any header, any length field, any data."""
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    length = len(text) if length is None else length
    path.write_bytes(struct.pack("<Q", length) + text + data)
    return path


def small_safetensors(
    path: Path,
    tensors: dict[str, torch.Tensor] | None = None,
    metadata: dict[str, str] | None = None,
) -> Path:
    tensors = (
        tensors
        if tensors is not None
        else {
            "a": torch.arange(6, dtype=torch.float32).reshape(2, 3),
            "b": torch.ones(4, dtype=torch.float16),
        }
    )
    save_file(tensors, str(path), metadata=metadata)
    return path


def shapes_file(path: Path, shapes: dict[str, tuple[int, ...]], dtype=torch.float16) -> Path:
    """A safetensors file with the given names and shapes (zeros), for detection tests."""
    save_file({k: torch.zeros(s, dtype=dtype) for k, s in shapes.items()}, str(path))
    return path


class Payload:
    """Unpickling this runs `open(marker, "w")`: proof of code execution if the marker appears."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def pickle_with_payload(path: Path, marker: Path) -> Path:
    """A plain pickle (old .ckpt style) whose loading would create `marker`."""
    payload = {
        "state_dict": {"model.diffusion_model.conv": torch.zeros(2)},
        "hook": Payload(marker),
    }
    path.write_bytes(pickle.dumps(payload, protocol=2))
    return path


def torch_zip_with_payload(path: Path, marker: Path) -> Path:
    """A torch.save zip checkpoint (modern .ckpt/.pt) carrying the same payload."""
    torch.save({"state_dict": {"w": torch.zeros(2)}, "hook": Payload(marker)}, str(path))
    return path


def tiny_sd1_matching_rules(seed: int = 0):
    """A tiny SD1.x pipeline whose non-weight settings (heads, norm groups, activation) are the
    ones HalfSafe infers, so a round trip must reproduce its outputs exactly."""
    from diffusers import (
        AutoencoderKL,
        PNDMScheduler,
        StableDiffusionPipeline,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel

    from app.core.encoders.tokenizers import clip_tokenizer

    torch.manual_seed(seed)
    unet = UNet2DConditionModel(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(32, 64),
        norm_num_groups=32,
        attention_head_dim=8,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32,
    ).eval()
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        latent_channels=4,
        layers_per_block=1,
        block_out_channels=(32, 64),
        norm_num_groups=32,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
    ).eval()
    text = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=49408,
            hidden_size=32,
            intermediate_size=37,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=77,
            hidden_act="quick_gelu",
            bos_token_id=0,
            eos_token_id=2,
            pad_token_id=1,
            projection_dim=32,
        )
    ).eval()
    return StableDiffusionPipeline(
        vae=vae,
        text_encoder=text,
        tokenizer=clip_tokenizer(),
        unet=unet,
        scheduler=PNDMScheduler(),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )


def tiny_sd2(seed: int = 0, *, in_channels: int = 4):
    """A tiny SD2.x-shaped pipeline: OpenCLIP-style text encoder (gelu), linear projections."""
    from diffusers import (
        AutoencoderKL,
        DDIMScheduler,
        StableDiffusionPipeline,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel

    from app.core.encoders.tokenizers import clip_tokenizer

    torch.manual_seed(seed)
    unet = UNet2DConditionModel(
        sample_size=8,
        in_channels=in_channels,
        out_channels=4,
        layers_per_block=2,
        block_out_channels=(32, 64),
        norm_num_groups=32,
        attention_head_dim=(8, 8),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=64,
        use_linear_projection=True,
    ).eval()
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        latent_channels=4,
        layers_per_block=1,
        block_out_channels=(32, 64),
        norm_num_groups=32,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
    ).eval()
    text = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=49408,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=77,
            hidden_act="gelu",
            projection_dim=64,
        )
    ).eval()
    return StableDiffusionPipeline(
        vae=vae,
        text_encoder=text,
        tokenizer=clip_tokenizer("!"),
        unet=unet,
        scheduler=DDIMScheduler(prediction_type="v_prediction"),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )


def tiny_sd1_inpaint(seed: int = 0):
    """The demo's SD1.x shapes with a 9-channel (inpainting) UNet input."""
    from diffusers import StableDiffusionPipeline, UNet2DConditionModel

    from tests.support.tiny_models import build_tiny_sd_pipeline

    base = build_tiny_sd_pipeline(seed)
    config = dict(base.unet.config)
    config["in_channels"] = 9
    torch.manual_seed(seed)
    unet = UNet2DConditionModel.from_config(config).eval()
    return StableDiffusionPipeline(
        vae=base.vae,
        text_encoder=base.text_encoder,
        tokenizer=base.tokenizer,
        unet=unet,
        scheduler=base.scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )


def state_dicts_equal(a, b, dtype=None) -> list[str]:
    """Names whose tensors differ between two modules (after casting `a` to `dtype`)."""
    sa, sb = a.state_dict(), b.state_dict()
    if set(sa) != set(sb):
        return sorted(set(sa) ^ set(sb))
    return [k for k in sa if not torch.equal(sa[k].to(dtype or sa[k].dtype), sb[k])]
