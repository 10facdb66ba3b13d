"""Tiny pipelines of every family built in code, for tests and benchmarks: SD1.x, SDXL, Flux.1
dev and schnell, SD3 and SD3.5, Chroma, Z-Image and Qwen-Image, each with random weights that
its seed fixes. The tests plant faults in them; the benchmarks time the check on them.
"""

from __future__ import annotations

from typing import Any

from app.core.demo import (
    DEMO_TEXT_ENCODER_CONFIG,
    DEMO_UNET_CONFIG,
    SD_SCHEDULER_CONFIG,
)
from app.core.demo import demo_vae as tiny_vae  # the SD-shaped VAE every tiny SD pipeline uses
from app.core.tokenizers import clip_tokenizer, qwen2_tokenizer, qwen3_tokenizer, t5_tokenizer


def _seeded(seed: int):
    import torch

    torch.manual_seed(seed)


def tiny_text_encoder(
    seed: int,
    hidden: int = 32,
    layers: int = 2,
    projection: int | None = None,
    activation: str = "quick_gelu",  # CLIP ViT-L's; OpenCLIP ViT-bigG (CLIP-G) uses gelu
) -> Any:  # a CLIPTextModel, or CLIPTextModelWithProjection with `projection`
    """The demo's text encoder at other sizes (the defaults are the demo's)."""
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    config = CLIPTextConfig(
        **{
            **DEMO_TEXT_ENCODER_CONFIG,
            "hidden_size": hidden,
            "intermediate_size": hidden * 2,
            "num_hidden_layers": layers,
            "projection_dim": projection or hidden,
            "hidden_act": activation,
        }
    )
    _seeded(seed)
    model_class = CLIPTextModelWithProjection if projection else CLIPTextModel
    return model_class(config).eval()


def tiny_unet(seed: int, cross_attention_dim: int = 32, sdxl_text_embeds: int | None = None):
    """The demo's UNet attending to other text widths, SDXL's size conditioning with
    `sdxl_text_embeds` (the defaults are the demo's)."""
    from diffusers import UNet2DConditionModel

    config = {**DEMO_UNET_CONFIG, "cross_attention_dim": cross_attention_dim}
    if sdxl_text_embeds is not None:
        # SDXL conditions on pooled text embeddings plus six size/crop numbers.
        config.update(
            addition_embed_type="text_time",
            addition_time_embed_dim=8,
            projection_class_embeddings_input_dim=sdxl_text_embeds + 6 * 8,
        )
    _seeded(seed)
    return UNet2DConditionModel(**config).eval()


def build_tiny_sd_pipeline(seed: int = 0):
    """A tiny SD1.x-shaped txt2img pipeline (fp32, CPU), deterministic for a given seed."""
    from diffusers import EulerDiscreteScheduler, StableDiffusionPipeline

    # As a mapping: diffusers annotates the scheduler as an enum and the checker as required.
    parts: dict[str, Any] = {
        "vae": tiny_vae(seed + 1),
        "text_encoder": tiny_text_encoder(seed + 2),
        "tokenizer": clip_tokenizer(),
        "unet": tiny_unet(seed + 3),
        "scheduler": EulerDiscreteScheduler(**SD_SCHEDULER_CONFIG),
        "safety_checker": None,
        "feature_extractor": None,
        "requires_safety_checker": False,
    }
    return StableDiffusionPipeline(**parts)


def build_tiny_sdxl_pipeline(seed: int = 0):
    """A tiny SDXL-shaped pipeline: two text encoders (the second with a projection)."""
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLPipeline

    hidden_1, hidden_2 = 32, 32
    parts: dict[str, Any] = {
        "vae": tiny_vae(seed + 1),
        "text_encoder": tiny_text_encoder(seed + 2, hidden=hidden_1),
        "text_encoder_2": tiny_text_encoder(seed + 4, hidden=hidden_2, projection=hidden_2),
        "tokenizer": clip_tokenizer(),
        "tokenizer_2": clip_tokenizer(pad_token="!"),
        "unet": tiny_unet(
            seed + 3, cross_attention_dim=hidden_1 + hidden_2, sdxl_text_embeds=hidden_2
        ),
        "scheduler": EulerDiscreteScheduler(**SD_SCHEDULER_CONFIG),
    }
    return StableDiffusionXLPipeline(**parts)


# Flux.1's flow-matching schedule (the reference scheduler_config of FLUX.1-dev; schnell's
# differs only in not shifting by resolution, use_dynamic_shifting false).
FLUX_SCHEDULER_CONFIG: dict[str, Any] = {
    "num_train_timesteps": 1000,
    "shift": 3.0,
    "use_dynamic_shifting": True,
    "base_shift": 0.5,
    "max_shift": 1.15,
    "base_image_seq_len": 256,
    "max_image_seq_len": 4096,
}


# The tiny VAEs' four levels, as a mapping: diffusers annotates these variable-length tuples
# as one-item tuples.
_FOUR_LEVELS: dict[str, Any] = {
    "down_block_types": ("DownEncoderBlock2D",) * 4,
    "up_block_types": ("UpDecoderBlock2D",) * 4,
    "block_out_channels": (16, 32, 32, 32),
}


# A PretrainedConfig option that T5Config passes on (its stub does not list it).
_UNTIED: dict[str, Any] = {"tie_word_embeddings": False}


def tiny_t5(seed: int, hidden: int = 32, layers: int = 2):
    """A T5 v1.1-shaped encoder (gated-GELU feed-forward, as T5-XXL) with the real vocabulary
    size, so the shipped tokenizer's ids fit."""
    from transformers import T5Config, T5EncoderModel

    config = T5Config(
        vocab_size=32128,
        d_model=hidden,
        d_kv=8,
        d_ff=hidden * 2,
        num_layers=layers,
        num_heads=4,
        feed_forward_proj="gated-gelu",
        is_encoder_decoder=False,
        use_cache=False,
        **_UNTIED,
    )
    _seeded(seed)
    return T5EncoderModel(config).eval()


def tiny_vae16(seed: int, scaling_factor: float, shift_factor: float):
    """A 16-channel VAE with no quant convs, as Flux's and SD3's (their latent scale and
    shift given)."""
    from diffusers import AutoencoderKL

    _seeded(seed)
    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        latent_channels=16,
        **_FOUR_LEVELS,
        layers_per_block=1,
        norm_num_groups=8,
        use_quant_conv=False,
        use_post_quant_conv=False,
        scaling_factor=scaling_factor,
        shift_factor=shift_factor,
    ).eval()


def tiny_flux_vae(seed: int):
    """A 16-channel VAE with Flux's latent scale and shift."""
    return tiny_vae16(seed, scaling_factor=0.3611, shift_factor=0.1159)


def tiny_flux_transformer(seed: int, guidance: bool = True, text: int = 32):
    from diffusers import FluxTransformer2DModel

    _seeded(seed)
    return FluxTransformer2DModel(
        patch_size=1,
        in_channels=64,  # 16 latent channels in 2x2 patches
        num_layers=1,
        num_single_layers=2,
        attention_head_dim=32,
        num_attention_heads=2,
        joint_attention_dim=text,
        pooled_projection_dim=text,
        guidance_embeds=guidance,
        axes_dims_rope=(4, 14, 14),  # Flux's proportions (16, 56, 56 of 128 per head)
    ).eval()


def build_tiny_flux_pipeline(seed: int = 0, guidance: bool = True):
    """A tiny Flux.1-shaped pipeline: dev with `guidance` (its guidance embedding), else
    schnell. CLIP-L-shaped and T5-shaped encoders, one double and two single blocks."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline

    config = dict(
        FLUX_SCHEDULER_CONFIG, use_dynamic_shifting=guidance, shift=3.0 if guidance else 1.0
    )
    return FluxPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(**config),
        vae=tiny_flux_vae(seed + 1),
        text_encoder=tiny_text_encoder(seed + 2),
        tokenizer=clip_tokenizer(),
        text_encoder_2=tiny_t5(seed + 4),
        tokenizer_2=t5_tokenizer(),
        transformer=tiny_flux_transformer(seed + 3, guidance),
    )


SD3_SCHEDULER_CONFIG: dict[str, Any] = {"num_train_timesteps": 1000, "shift": 3.0}


def build_tiny_sd3_pipeline(seed: int = 0, medium: bool = False, qk_norm: bool = True):
    """A tiny SD3.5-shaped pipeline: CLIP-L- and CLIP-G-shaped encoders with projections, a
    T5-shaped third encoder, a two-block MMDiT with RMS-normed q/k (as SD3.5), and a
    16-channel VAE with SD3's latent scale and shift. `medium`: SD3.5 Medium's MMDiT-X, whose
    first block has a second attention over the image tokens, and a larger position table.
    Without `qk_norm`, SD3 Medium's MMDiT: no query/key norm, one 64-wide head."""
    from diffusers import (
        FlowMatchEulerDiscreteScheduler,
        SD3Transformer2DModel,
        StableDiffusion3Pipeline,
    )

    vae = tiny_vae16(seed + 1, scaling_factor=1.5305, shift_factor=0.0609)  # SD3's
    _seeded(seed + 3)
    transformer = SD3Transformer2DModel(
        sample_size=16,
        patch_size=2,
        in_channels=16,
        num_layers=2,
        attention_head_dim=16 if qk_norm else 64,  # SD3's heads are 64 wide
        num_attention_heads=2 if qk_norm else 1,
        joint_attention_dim=64,  # T5's width; the CLIP features (32 + 32) are padded to it
        caption_projection_dim=32 if qk_norm else 64,  # the blocks' width
        pooled_projection_dim=64,  # CLIP-L's and CLIP-G's pooled vectors side by side
        out_channels=16,
        pos_embed_max_size=48 if medium else 32,
        qk_norm="rms_norm" if qk_norm else None,
        dual_attention_layers=(0,) if medium else (),
    ).eval()
    return StableDiffusion3Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(**SD3_SCHEDULER_CONFIG),
        vae=vae,
        text_encoder=tiny_text_encoder(seed + 2, projection=32),
        tokenizer=clip_tokenizer(),
        text_encoder_2=tiny_text_encoder(seed + 4, projection=32, activation="gelu"),
        tokenizer_2=clip_tokenizer(pad_token="!"),
        text_encoder_3=tiny_t5(seed + 5, hidden=64),
        tokenizer_3=t5_tokenizer(),
        transformer=transformer,
    )


def build_tiny_chroma_pipeline(seed: int = 0):
    """A tiny Chroma-shaped pipeline: a T5-shaped encoder, one double and two single blocks
    with Chroma's modulation approximator, Flux's 16-channel VAE and schedule."""
    from diffusers import ChromaPipeline, ChromaTransformer2DModel, FlowMatchEulerDiscreteScheduler

    _seeded(seed + 3)
    transformer = ChromaTransformer2DModel(
        patch_size=1,
        in_channels=64,
        num_layers=1,
        num_single_layers=2,
        attention_head_dim=32,
        num_attention_heads=2,
        joint_attention_dim=32,
        axes_dims_rope=(4, 14, 14),
        approximator_num_channels=8,
        approximator_hidden_dim=32,
        approximator_layers=1,
    ).eval()
    return ChromaPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(**FLUX_SCHEDULER_CONFIG),
        vae=tiny_flux_vae(seed + 1),
        text_encoder=tiny_t5(seed + 2),
        tokenizer=t5_tokenizer(),
        transformer=transformer,
    )


# Z-Image and Qwen-Image -------------------------------------------------------------------

# Z-Image-Turbo's schedule: flow matching with a fixed shift of 3 (no resolution shift).
ZIMAGE_SCHEDULER_CONFIG: dict[str, Any] = {
    "num_train_timesteps": 1000,
    "shift": 3.0,
    "use_dynamic_shifting": False,
}

# Qwen-Image's schedule: a resolution-dependent exponential shift, ending at sigma 0.02.
QWENIMAGE_SCHEDULER_CONFIG: dict[str, Any] = {
    "num_train_timesteps": 1000,
    "shift": 1.0,
    "use_dynamic_shifting": True,
    "base_shift": 0.5,
    "max_shift": 0.9,
    "base_image_seq_len": 256,
    "max_image_seq_len": 8192,
    "shift_terminal": 0.02,
    "time_shift_type": "exponential",
}


QWEN_VOCAB = 151669  # the tokenizer's entries with its special tokens: every id it gives fits


def tiny_qwen3(seed: int, hidden: int = 32, layers: int = 2):
    """A Qwen3-shaped decoder (Z-Image's text encoder: its hidden states, no LM head) with the
    real vocabulary size and Qwen3-4B's rotary base and norms."""
    from transformers import Qwen3Config, Qwen3Model

    from app.core.encoders import QWEN3_FIXED

    config = Qwen3Config(
        **QWEN3_FIXED,
        vocab_size=QWEN_VOCAB,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden // 4,
    )
    _seeded(seed)
    return Qwen3Model(config).eval()


def tiny_qwen25_vl(seed: int, hidden: int = 64, layers: int = 2):
    """A Qwen2.5-VL-shaped model (Qwen-Image's text encoder) with a tiny vision tower, the real
    vocabulary size, Qwen2.5-VL-7B's rotary base and norms and multimodal rotary sections in
    its proportions. At `hidden` 128 its one head is 128 wide, as the real ones are (what a
    split file's config is read with); narrower, it has 4 heads."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from app.core.encoders import QWEN25_VL_FIXED, QWEN25_VL_HEAD

    heads = 1 if hidden == QWEN25_VL_HEAD else 4
    half = hidden // heads // 2  # half a head's width, split 2:3:3 as the 7B's 16:24:24
    config = Qwen2_5_VLConfig(
        text_config={
            **QWEN25_VL_FIXED,
            "vocab_size": QWEN_VOCAB,
            "hidden_size": hidden,
            "intermediate_size": hidden * 2,
            "num_hidden_layers": layers,
            "num_attention_heads": heads,
            "num_key_value_heads": 1 if heads == 1 else 2,
            "max_position_embeddings": 1024,
            "rope_scaling": {
                "type": "mrope",
                "mrope_section": [half // 4, half * 3 // 8, half * 3 // 8],
            },
            "tie_word_embeddings": False,
        },
        vision_config={
            "depth": 1,
            "hidden_size": 160,  # two 80-wide heads, as the 7B's vision heads are wide
            "intermediate_size": 32,
            "num_heads": 2,
            "out_hidden_size": hidden,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "window_size": 112,
            "fullatt_block_indexes": [7, 15, 23, 31],
        },
        tie_word_embeddings=False,
    )
    _seeded(seed)
    return Qwen2_5_VLForConditionalGeneration(config).eval()


def tiny_zimage_transformer(seed: int, text: int = 32):
    from diffusers import ZImageTransformer2DModel

    _seeded(seed)
    return ZImageTransformer2DModel(
        all_patch_size=(2,),
        all_f_patch_size=(1,),
        in_channels=16,
        dim=64,
        n_layers=2,
        n_refiner_layers=1,
        n_heads=2,
        n_kv_heads=2,
        cap_feat_dim=text,
        axes_dims=[8, 12, 12],  # Z-Image's proportions (32, 48, 48 of 128 per head)
        # as a split file is built with (ZIMAGE_AXES_LENS in app.core.families.zimage)
        axes_lens=[1536, 512, 512],
    ).eval()


def build_tiny_zimage_pipeline(seed: int = 0):
    """A tiny Z-Image-shaped pipeline: a Qwen3-shaped text encoder, a single-stream transformer
    with one noise and one context refiner block and two main blocks, Flux's 16-channel VAE."""
    from diffusers import FlowMatchEulerDiscreteScheduler, ZImagePipeline

    return ZImagePipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(**ZIMAGE_SCHEDULER_CONFIG),
        vae=tiny_flux_vae(seed + 1),
        text_encoder=tiny_qwen3(seed + 2),
        tokenizer=qwen3_tokenizer(),
        transformer=tiny_zimage_transformer(seed + 3),
    )


def tiny_qwenimage_vae(seed: int):
    """Qwen-Image's causal 3D VAE (one frame per image), 16 latent channels, 8x down."""
    from diffusers import AutoencoderKLQwenImage

    _seeded(seed)
    return AutoencoderKLQwenImage(
        base_dim=16,
        z_dim=16,
        dim_mult=[1, 2, 2, 2],
        num_res_blocks=1,
        attn_scales=[],
        temperal_downsample=[False, True, True],
    ).eval()


def build_tiny_qwenimage_pipeline(seed: int = 0, text_width: int = 64):
    """A tiny Qwen-Image-shaped pipeline: a Qwen2.5-VL-shaped text encoder `text_width` wide,
    a two-block MMDiT on 2x2 patches of a 16-channel latent, Qwen-Image's 3D VAE."""
    from diffusers import (
        FlowMatchEulerDiscreteScheduler,
        QwenImagePipeline,
        QwenImageTransformer2DModel,
    )

    _seeded(seed + 3)
    transformer = QwenImageTransformer2DModel(
        patch_size=2,
        in_channels=64,
        out_channels=16,
        num_layers=2,
        attention_head_dim=32,
        num_attention_heads=2,
        joint_attention_dim=text_width,
        axes_dims_rope=(4, 14, 14),  # Qwen-Image's proportions (16, 56, 56 of 128 per head)
    ).eval()
    return QwenImagePipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(**QWENIMAGE_SCHEDULER_CONFIG),
        vae=tiny_qwenimage_vae(seed + 1),
        text_encoder=tiny_qwen25_vl(seed + 2, hidden=text_width),
        tokenizer=qwen2_tokenizer(),
        transformer=transformer,
    )
