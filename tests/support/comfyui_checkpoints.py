"""Checkpoints for the ComfyUI node package's tests, written in code: a single-file SD1 checkpoint
of the shape ComfyUI's detection reads as SD1, with one attention query planted past fp16's
range (finite in fp32) or none."""

from __future__ import annotations

from pathlib import Path

# The planted layer, in HalfSafe's (diffusers') names.
PLANTED = "down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q"


def tiny_sd1_checkpoint(path: Path, planted: bool = True) -> Path:
    """A single-file SD1 checkpoint ComfyUI's own loader reads as SD1 (320 channels, a
    768-wide context, one level), with `PLANTED` scaled past fp16's range where `planted`, a
    tiny text encoder and VAE; saved in fp16."""
    import torch
    from diffusers import (
        AutoencoderKL,
        PNDMScheduler,
        StableDiffusionPipeline,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel

    from app.core.encoders.tokenizers import clip_tokenizer
    from tests.support.model_files import save_single_file

    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        sample_size=8,
        layers_per_block=1,
        block_out_channels=(320,),
        attention_head_dim=8,
        down_block_types=("CrossAttnDownBlock2D",),
        up_block_types=("CrossAttnUpBlock2D",),
        cross_attention_dim=768,
    ).eval()
    vae = AutoencoderKL(
        latent_channels=4,
        layers_per_block=1,
        block_out_channels=(32, 64),
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
    ).eval()
    text = CLIPTextModel(
        CLIPTextConfig(
            hidden_size=768,
            intermediate_size=37,
            num_hidden_layers=1,
            num_attention_heads=4,
            hidden_act="quick_gelu",
            bos_token_id=0,
            eos_token_id=2,
            pad_token_id=1,
            projection_dim=768,
        )
    ).eval()
    if planted:
        with torch.no_grad():
            unet.get_submodule(PLANTED).weight.mul_(1e5)  # past 65504 in fp16, finite in fp32
    pipeline = StableDiffusionPipeline(
        vae=vae,
        text_encoder=text,
        tokenizer=clip_tokenizer(),
        unet=unet,
        scheduler=PNDMScheduler(),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    return save_single_file(pipeline, path, dtype="fp16")
