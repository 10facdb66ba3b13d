"""Checkpoints for the ComfyUI node package's tests, written in code: a single-file SD1 checkpoint
of the shape ComfyUI's detection reads as SD1, with one attention query planted past fp16's
range (finite in fp32) or none."""

from __future__ import annotations

from pathlib import Path

# The planted layer, in HalfSafe's (diffusers') names.
PLANTED = "down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q"


# The text encoder's planted layer in the checkpoint with the full-size CLIP-L.
PLANTED_CLIP = "encoder.layers.5.mlp.fc1"


def tiny_vae():
    """The checkpoints' VAE: SD's 4-channel latent, two 1-block levels (drawn from the seed set
    before it)."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        latent_channels=4,
        layers_per_block=1,
        block_out_channels=(32, 64),
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
    ).eval()


def tiny_sd1_checkpoint(path: Path, planted: bool = True, full_clip: bool = False) -> Path:
    """A single-file SD1 checkpoint ComfyUI's own loader reads as SD1 (320 channels, a
    768-wide context, one level), with `PLANTED` scaled past fp16's range where `planted`, a
    tiny text encoder and VAE; saved in fp16. With `full_clip` the text encoder is CLIP-L at
    its released size (which ComfyUI's loader loads; 123 M parameters, seeded), its
    `PLANTED_CLIP` scaled past fp16's range too where `planted` (finite in fp32)."""
    import torch
    from diffusers import (
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
    vae = tiny_vae()
    sizes = (
        {"intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12}
        if full_clip
        else {"intermediate_size": 37, "num_hidden_layers": 1, "num_attention_heads": 4}
    )
    text = CLIPTextModel(
        CLIPTextConfig(
            hidden_size=768,
            **sizes,
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
            if full_clip:
                text.get_submodule(PLANTED_CLIP).weight.mul_(1e5)
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


# The planted layer of the SDXL checkpoint, in HalfSafe's names: the first attention query of
# the middle level (ComfyUI's input_blocks.4.1, as drive.PLANTED_SDXL).
PLANTED_SDXL = "down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_q"


def tiny_sdxl_checkpoint(path: Path, planted: bool = True) -> Path:
    """A single-file SDXL checkpoint ComfyUI's own loader reads as SDXL: the UNet at SDXL's
    released depths (transformers 0, 2 and 10 deep, 10 in the middle; a 2048-wide context, a
    2816-wide ADM of 1280 pooled and six 256-wide size embeddings) with 320 channels at every
    level (283 M parameters; the channel widths are not part of ComfyUI's match), `PLANTED_SDXL`
    scaled past fp16's range where `planted`; two-layer text encoders at CLIP-L's and CLIP-G's
    widths (768 and 1280, which the context and the pooled vector read); a tiny VAE. In fp16."""
    import torch
    from diffusers import (
        EulerDiscreteScheduler,
        StableDiffusionXLPipeline,
        UNet2DConditionModel,
    )
    from transformers import (
        CLIPTextConfig,
        CLIPTextModel,
        CLIPTextModelWithProjection,
    )

    from app.core.encoders.tokenizers import clip_tokenizer
    from tests.support.model_files import save_single_file

    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        sample_size=8,
        layers_per_block=2,
        block_out_channels=(320, 320, 320),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
        transformer_layers_per_block=(1, 2, 10),
        attention_head_dim=5,  # heads: 320 channels of 64, as SDXL's num_head_channels
        cross_attention_dim=2048,
        use_linear_projection=True,
        addition_embed_type="text_time",
        addition_time_embed_dim=256,
        projection_class_embeddings_input_dim=2816,
    ).eval()
    vae = tiny_vae()
    vae.register_to_config(scaling_factor=0.13025)

    def encoder(width: int, heads: int, activation: str, projection: bool):
        config = CLIPTextConfig(
            hidden_size=width,
            intermediate_size=37,
            num_hidden_layers=2,  # SDXL reads the penultimate layer's states
            num_attention_heads=heads,
            hidden_act=activation,
            bos_token_id=0,
            eos_token_id=2,
            pad_token_id=1,
            projection_dim=width,
        )
        return (CLIPTextModelWithProjection if projection else CLIPTextModel)(config).eval()

    if planted:
        with torch.no_grad():
            unet.get_submodule(PLANTED_SDXL).weight.mul_(1e5)  # past 65504 in fp16
    pipeline = StableDiffusionXLPipeline(
        vae=vae,
        text_encoder=encoder(768, 4, "quick_gelu", False),
        text_encoder_2=encoder(1280, 4, "gelu", True),
        tokenizer=clip_tokenizer(),
        tokenizer_2=clip_tokenizer(pad_token="!"),
        unet=unet,
        scheduler=EulerDiscreteScheduler(),
    )
    return save_single_file(pipeline, path, dtype="fp16")
