"""Tiny pipelines of every family built in code, for tests and benchmarks: SD1.x, SDXL, Flux.1
dev and schnell, SD3 and SD3.5, Chroma, Z-Image and Qwen-Image, each with random weights that
its seed fixes. The tests plant faults in them; the benchmarks time the check on them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from app.core.demo import (
    DEMO_TEXT_ENCODER_CONFIG,
    DEMO_UNET_CONFIG,
    SD_SCHEDULER_CONFIG,
)
from app.core.demo import demo_vae as tiny_vae  # the SD-shaped VAE every tiny SD pipeline uses
from app.core.encoders.tokenizers import (
    clip_tokenizer,
    qwen2_tokenizer,
    qwen3_tokenizer,
    t5_tokenizer,
)


@functools.cache
def shared(make: Callable[..., Any], *args: Any) -> Any:
    """One of each shipped tokenizer (or processor) per process, `make(*args)`, for every tiny
    pipeline built here. Building one from the shipped files takes 0.1-0.6 s (Qwen's BPE the
    longest): a quarter of the tests' time on a 2.5 GHz CPU went there. The pipelines and the
    code under test only read them; a builder that changes one (`mistral3_stand_in_tokenizer`)
    makes its own."""
    return make(*args)


def _seeded(seed: int):
    import torch

    torch.manual_seed(seed)


# A text encoder at most this large is kept for its next build (`_kept`).
KEPT_BYTES = 128 << 20


def _kept(build: Callable[..., Any]) -> Callable[..., Any]:
    """`build`, a text encoder's builder that seeds torch's generator first and draws only from
    it, remembered per process by its arguments: a later build with the same ones is a copy of
    the first, and leaves torch's generator where the build left it, so that the draws after it
    are the same too. Drawing the real vocabularies' embeddings (Qwen's 151,669 rows, twice
    with an LM head) was most of the time a family's tiny pipeline took to build; a copy is a
    few milliseconds. Encoders past `KEPT_BYTES` (a released width's) are built each time."""
    kept: dict[Any, tuple[Any, Any]] = {}

    @functools.wraps(build)
    def built(*args: Any, **kwargs: Any) -> Any:
        import copy

        import torch

        key = (args, tuple(sorted(kwargs.items())))
        if key in kept:
            model, state = kept[key]
            torch.set_rng_state(state)
            return copy.deepcopy(model)
        model = build(*args, **kwargs)
        state = torch.get_rng_state()
        size = sum(t.numel() * t.element_size() for t in model.state_dict().values())
        if size <= KEPT_BYTES:
            kept[key] = (copy.deepcopy(model), state)
        return model

    return built


@_kept
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
        "tokenizer": shared(clip_tokenizer),
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
    vae = tiny_vae(seed + 1)
    vae.register_to_config(scaling_factor=0.13025)  # SDXL's latent scale, as its VAE says
    parts: dict[str, Any] = {
        "vae": vae,
        "text_encoder": tiny_text_encoder(seed + 2, hidden=hidden_1),
        "text_encoder_2": tiny_text_encoder(seed + 4, hidden=hidden_2, projection=hidden_2),
        "tokenizer": shared(clip_tokenizer),
        "tokenizer_2": shared(clip_tokenizer, "!"),
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


@_kept
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
        tokenizer=shared(clip_tokenizer),
        text_encoder_2=tiny_t5(seed + 4),
        tokenizer_2=shared(t5_tokenizer),
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
        tokenizer=shared(clip_tokenizer),
        text_encoder_2=tiny_text_encoder(seed + 4, projection=32, activation="gelu"),
        tokenizer_2=shared(clip_tokenizer, "!"),
        text_encoder_3=tiny_t5(seed + 5, hidden=64),
        tokenizer_3=shared(t5_tokenizer),
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
        tokenizer=shared(t5_tokenizer),
        transformer=transformer,
    )


# Z-Image and Qwen-Image -------------------------------------------------------------------

# Z-Image-Turbo's schedule: flow matching with a fixed shift of 3 (no resolution shift).
ZIMAGE_SCHEDULER_CONFIG: dict[str, Any] = {
    "num_train_timesteps": 1000,
    "shift": 3.0,
    "use_dynamic_shifting": False,
}
# Z-Image (Base)'s: the same with a shift of 6, all that tells its folder from Turbo's.
ZIMAGE_BASE_SCHEDULER_CONFIG: dict[str, Any] = {**ZIMAGE_SCHEDULER_CONFIG, "shift": 6.0}

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


@_kept
def tiny_qwen3(seed: int, hidden: int = 32, layers: int = 2):
    """A Qwen3-shaped decoder (Z-Image's text encoder: its hidden states, no LM head) with the
    real vocabulary size and Qwen3-4B's rotary base and norms."""
    from transformers import Qwen3Config, Qwen3Model

    from app.core.encoders.qwen3 import QWEN3_FIXED

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


@_kept
def tiny_qwen25_vl(seed: int, hidden: int = 64, layers: int = 2):
    """A Qwen2.5-VL-shaped model (Qwen-Image's text encoder) with a tiny vision tower, the real
    vocabulary size, Qwen2.5-VL-7B's rotary base and norms and multimodal rotary sections in
    its proportions. At `hidden` 128 its one head is 128 wide, as the real ones are (what a
    split file's config is read with); narrower, it has 4 heads."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from app.core.encoders.qwen25_vl import QWEN25_VL_FIXED, QWEN25_VL_HEAD

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


def build_tiny_zimage_pipeline(seed: int = 0, base: bool = False):
    """A tiny Z-Image-shaped pipeline: a Qwen3-shaped text encoder, a single-stream transformer
    with one noise and one context refiner block and two main blocks, Flux's 16-channel VAE;
    Turbo's scheduler, or with `base` Z-Image Base's."""
    from diffusers import FlowMatchEulerDiscreteScheduler, ZImagePipeline

    config = ZIMAGE_BASE_SCHEDULER_CONFIG if base else ZIMAGE_SCHEDULER_CONFIG
    return ZImagePipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(**config),
        vae=tiny_flux_vae(seed + 1),
        text_encoder=tiny_qwen3(seed + 2),
        tokenizer=shared(qwen3_tokenizer),
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
        tokenizer=shared(qwen2_tokenizer),
        transformer=transformer,
    )


# Flux.2 dev and Klein -----------------------------------------------------------------------

# Flux.2's schedule (FLUX.2-dev's and Klein's scheduler_config): the pipelines shift by their
# own empirical rule, the scheduler exponentially by resolution.
FLUX2_SCHEDULER_CONFIG: dict[str, Any] = {
    "num_train_timesteps": 1000,
    "shift": 3.0,
    "use_dynamic_shifting": True,
    "base_shift": 0.5,
    "max_shift": 1.15,
    "base_image_seq_len": 256,
    "max_image_seq_len": 4096,
    "time_shift_type": "exponential",
}

# The Mistral 3 chat format for the dev tiny's stand-in tokenizer: the system message and the
# user's prompt in Mistral Small 3.1's markers (content as Flux2Pipeline sends it: a list of
# typed parts).
MISTRAL3_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- set text = message['content'] if message['content'] is string "
    "else message['content'] | selectattr('type', 'equalto', 'text') | map(attribute='text') "
    "| join('') %}"
    "{%- if message['role'] == 'system' %}{{- '[SYSTEM_PROMPT]' + text + '[/SYSTEM_PROMPT]' }}"
    "{%- elif message['role'] == 'user' %}{{- '[INST]' + text + '[/INST]' }}"
    "{%- else %}{{- text }}{%- endif %}"
    "{%- endfor %}"
)


def mistral3_stand_in_tokenizer():
    """The tiny dev pipeline's tokenizer: Mistral's Tekken vocabulary is not shipped, so T5's
    (app/resources/tokenizers/t5) with Mistral 3's chat format stands in. A real Flux.2 dev folder
    carries its own tokenizer."""
    tokenizer = t5_tokenizer()
    tokenizer.chat_template = MISTRAL3_CHAT_TEMPLATE
    return tokenizer


@_kept
def tiny_mistral3(seed: int, hidden: int = 32, layers: int = 31):
    """A Mistral3ForConditionalGeneration (Flux.2 dev's text encoder) with a tiny Pixtral vision
    tower and T5's vocabulary size (its stand-in tokenizer's ids fit); deep enough for the layers
    Flux.2 dev reads (10, 20, 30), with Mistral Small 3.1's rotary base and norms."""
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration

    config = Mistral3Config(
        text_config={
            "model_type": "mistral",
            "vocab_size": 32128,
            "hidden_size": hidden,
            "intermediate_size": hidden * 2,
            "num_hidden_layers": layers,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": hidden // 4,
            "max_position_embeddings": 1024,
            "rope_theta": 1000000000.0,
            "rms_norm_eps": 1e-5,
            "sliding_window": None,
        },
        vision_config={
            "model_type": "pixtral",
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "head_dim": 8,
            "patch_size": 14,
            "image_size": 56,
        },
        image_token_index=10,
        spatial_merge_size=2,
        projector_hidden_act="gelu",
        multimodal_projector_bias=False,
        vision_feature_layer=-1,
    )
    _seeded(seed)
    return Mistral3ForConditionalGeneration(config).eval()


@_kept
def tiny_qwen3_causal(seed: int, hidden: int = 32, layers: int = 28):
    """The Z-Image tiny Qwen3's config with its LM head (Qwen3ForCausalLM, as Flux.2 Klein's
    pipeline holds it), deep enough for the layers Klein reads (9, 18, 27)."""
    from transformers import Qwen3ForCausalLM

    config = tiny_qwen3(seed, hidden, layers).config
    _seeded(seed)
    return Qwen3ForCausalLM(config).eval()


def tiny_flux2_vae(seed: int):
    """AutoencoderKLFlux2 at tiny widths: 32 latent channels, quant convs, and batch-norm
    statistics over the 2x2 patches set away from (0, 1) so that undoing them matters. Its
    norms have the groups a VAE file of these widths is read with (16; the real one's 32)."""
    import torch
    from diffusers import AutoencoderKLFlux2

    _seeded(seed)
    vae = AutoencoderKLFlux2(
        latent_channels=32,
        **_FOUR_LEVELS,
        layers_per_block=1,
        norm_num_groups=16,
    ).eval()
    statistics = {"running_mean": torch.randn(128) * 0.1, "running_var": torch.rand(128) + 0.5}
    with torch.no_grad():
        for name, values in statistics.items():
            getattr(vae.bn, name).copy_(values)
    return vae


def tiny_flux2_transformer(seed: int, guidance: bool, text: int):
    """One double and two single blocks, two 32-wide heads with Flux.2's rotary proportions
    (four equal axes), reading `text` values a token (three hidden states side by side)."""
    from diffusers import Flux2Transformer2DModel

    _seeded(seed)
    return Flux2Transformer2DModel(
        patch_size=1,
        in_channels=128,  # 32 latent channels in 2x2 patches
        num_layers=1,
        num_single_layers=2,
        attention_head_dim=32,
        num_attention_heads=2,
        joint_attention_dim=text,
        timestep_guidance_channels=32,
        axes_dims_rope=(8, 8, 8, 8),
        guidance_embeds=guidance,
    ).eval()


def build_tiny_flux2_pipeline(seed: int = 0):
    """A tiny Flux.2 dev-shaped pipeline: a Mistral 3-shaped text encoder (31 layers, 32 wide),
    a guidance-embedding transformer, Flux.2's 32-channel VAE."""
    from diffusers import FlowMatchEulerDiscreteScheduler, Flux2Pipeline

    parts: dict[str, Any] = {
        "scheduler": FlowMatchEulerDiscreteScheduler(**FLUX2_SCHEDULER_CONFIG),
        "vae": tiny_flux2_vae(seed + 1),
        "text_encoder": tiny_mistral3(seed + 2),
        "tokenizer": mistral3_stand_in_tokenizer(),
        "transformer": tiny_flux2_transformer(seed + 3, guidance=True, text=3 * 32),
    }
    return Flux2Pipeline(**parts)


def build_tiny_flux2_klein_pipeline(seed: int = 0, distilled: bool = False):
    """A tiny Flux.2 Klein-shaped pipeline: a Qwen3-shaped causal LM (28 layers, 32 wide), a
    transformer without guidance embedding, Flux.2's 32-channel VAE; base (real CFG) unless
    `distilled`."""
    from diffusers import FlowMatchEulerDiscreteScheduler, Flux2KleinPipeline

    parts: dict[str, Any] = {
        "scheduler": FlowMatchEulerDiscreteScheduler(**FLUX2_SCHEDULER_CONFIG),
        "vae": tiny_flux2_vae(seed + 1),
        "text_encoder": tiny_qwen3_causal(seed + 2),
        "tokenizer": shared(qwen3_tokenizer),
        "transformer": tiny_flux2_transformer(seed + 3, guidance=False, text=3 * 32),
        "is_distilled": distilled,
    }
    return Flux2KleinPipeline(**parts)


# Qwen-Image 2.1 ---------------------------------------------------------------------------

# Qwen-Image 2.1's schedule as its pipeline runs it: sigmas linear from 1, shifted by the
# image's sequence length between these bounds (Flux.1's rule; the pipeline reads them).
QWENIMAGE21_SCHEDULER_CONFIG: dict[str, Any] = {
    "num_train_timesteps": 1000,
    "shift": 1.0,
    "use_dynamic_shifting": True,
    "base_shift": 0.5,
    "max_shift": 1.15,
    "base_image_seq_len": 256,
    "max_image_seq_len": 4096,
}


@_kept
def tiny_qwen3_vl(seed: int, hidden: int = 64, layers: int = 2):
    """A Qwen3-VL-shaped model (Qwen-Image 2.1's text encoder) with a one-block vision tower (one
    deepstack merger),
    the real vocabulary size, Qwen3-VL-8B's rotary base and norms, 32-wide heads and
    interleaved multimodal rotary sections in its proportions (24, 20, 20 of 64)."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    head = 32
    config = Qwen3VLConfig(
        text_config={
            "vocab_size": QWEN_VOCAB,
            "hidden_size": hidden,
            "intermediate_size": hidden * 2,
            "num_hidden_layers": layers,
            "num_attention_heads": hidden // head,
            "num_key_value_heads": 1,
            "head_dim": head,
            "max_position_embeddings": 1024,
            "rms_norm_eps": 1e-6,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 5000000.0,
                "mrope_section": [6, 5, 5],
                "mrope_interleaved": True,
            },
            "tie_word_embeddings": False,
        },
        vision_config={
            "depth": 1,
            "hidden_size": 144,  # two 72-wide heads, as Qwen3-VL-8B's vision heads are wide
            "intermediate_size": 32,
            "num_heads": 2,
            "out_hidden_size": hidden,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "num_position_embeddings": 64,
            "deepstack_visual_indexes": [0],
        },
        tie_word_embeddings=False,
    )
    _seeded(seed)
    return Qwen3VLForConditionalGeneration(config).eval()


def tiny_qwenimage21_vae(seed: int):
    """Qwen-Image 2.1's residual causal VAE (one frame per image, RGBA in and out): 64 latent
    channels, 16x down, its per-channel latent statistics (the first of the real ones' as the
    class keeps them)."""
    import inspect

    from diffusers import AutoencoderKLQwenImage21

    defaults = inspect.signature(AutoencoderKLQwenImage21.__init__).parameters
    _seeded(seed)
    return AutoencoderKLQwenImage21(
        base_dim=8,
        decoder_base_dim=8,
        z_dim=64,
        dim_mult=[1, 2, 2, 2, 2],
        num_res_blocks=1,
        attn_scales=[],
        temperal_downsample=[False, True, True, True],
        latents_mean=list(defaults["latents_mean"].default),
        latents_std=list(defaults["latents_std"].default),
    ).eval()


def tiny_qwenimage21_transformer(seed: int, text: int = 64):
    from diffusers import QwenImage21Transformer2DModel

    _seeded(seed)
    return QwenImage21Transformer2DModel(
        in_channels=64,
        out_channels=64,
        num_layers=2,
        attention_head_dim=32,
        num_attention_heads=2,
        context_in_dim=text,
        axes_dims_rope=(4, 14, 14),  # Qwen-Image 2.1's proportions (16, 56, 56 of 128 per head)
    ).eval()


def build_tiny_qwenimage21_pipeline(seed: int = 0, text_width: int = 64):
    """A tiny Qwen-Image 2.1-shaped pipeline: a Qwen3-VL-shaped text encoder `text_width` wide
    with Qwen3-VL's processor, a two-block single-stream block-causal transformer on the
    64-channel latent cells, Qwen-Image 2.1's 16x VAE."""
    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImage21Pipeline

    from app.core.encoders.tokenizers import qwen3_vl_processor

    return QwenImage21Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(**QWENIMAGE21_SCHEDULER_CONFIG),
        vae=tiny_qwenimage21_vae(seed + 1),
        text_encoder=tiny_qwen3_vl(seed + 2, hidden=text_width),
        processor=qwen3_vl_processor(),
        transformer=tiny_qwenimage21_transformer(seed + 3, text=text_width),
    )


# Editing: Flux.1 Kontext and Qwen-Image-Edit (the same parts, their editing pipelines) ------


def build_tiny_flux_kontext_pipeline(seed: int = 0):
    """A tiny Flux.1 Kontext-shaped pipeline: the tiny Flux.1 dev's parts (its transformer reads
    the reference's latents in its sequence) in diffusers' FluxKontextPipeline."""
    from diffusers import FluxKontextPipeline

    dev = build_tiny_flux_pipeline(seed, guidance=True)
    return FluxKontextPipeline(**dev.components)


def build_tiny_flux_fill_pipeline(seed: int = 0):
    """A tiny Flux.1 Fill-shaped pipeline: the tiny Flux.1 dev's text encoders and VAE, and a
    transformer that reads beside the noise the masked picture's latents and the mask (8x8
    values per latent cell), 2x2-packed: 64 + 64 + 256 input channels, 64 output channels, as
    Black Forest Labs' Fill dev has them."""
    from diffusers import FluxFillPipeline, FluxTransformer2DModel

    dev = build_tiny_flux_pipeline(seed, guidance=True)
    _seeded(seed + 3)
    transformer = FluxTransformer2DModel(
        **{**dev.transformer.config, "in_channels": 384, "out_channels": 64}
    ).eval()
    parts = {
        k: v for k, v in dev.components.items() if k not in ("image_encoder", "feature_extractor")
    }
    return FluxFillPipeline(**{**parts, "transformer": transformer})


def build_tiny_flux_control_pipeline(seed: int = 0):
    """A tiny Flux.1 Depth/Canny-shaped pipeline: the tiny Flux.1 dev's text encoders and VAE,
    and a transformer that reads a control picture's latents beside the noise (64 + 64 input
    channels, 64 output channels), in diffusers' FluxControlPipeline."""
    from diffusers import FluxControlPipeline, FluxTransformer2DModel

    dev = build_tiny_flux_pipeline(seed, guidance=True)
    _seeded(seed + 3)
    transformer = FluxTransformer2DModel(
        **{**dev.transformer.config, "in_channels": 128, "out_channels": 64}
    ).eval()
    parts = {
        k: v for k, v in dev.components.items() if k not in ("image_encoder", "feature_extractor")
    }
    return FluxControlPipeline(**{**parts, "transformer": transformer})


def build_tiny_qwenimage_edit_pipeline(seed: int = 0, plus: bool = True, text_width: int = 64):
    """A tiny Qwen-Image-Edit-shaped pipeline: the tiny Qwen-Image's parts, with the Qwen2.5-VL
    processor its text encoder reads the reference pictures through (14-px patches, as the
    tiny vision tower's), in QwenImageEditPlusPipeline (`plus`, up to three pictures) or
    QwenImageEditPipeline."""
    from diffusers import QwenImageEditPipeline, QwenImageEditPlusPipeline

    from app.core.families.qwenimage import edit_processor

    parts = build_tiny_qwenimage_pipeline(seed, text_width=text_width).components
    kind = QwenImageEditPlusPipeline if plus else QwenImageEditPipeline
    return kind(**parts, processor=edit_processor())


# Krea 2 -----------------------------------------------------------------------------------

# Krea 2's schedule: the resolution-dependent exponential shift, 0.5 at 256 patches to 1.15 at
# 6,400 (Krea2Pipeline's docstring); Turbo shifts by a fixed 1.15 instead (`is_distilled`).
KREA2_SCHEDULER_CONFIG: dict[str, Any] = {
    "num_train_timesteps": 1000,
    "shift": 1.0,
    "use_dynamic_shifting": True,
    "base_shift": 0.5,
    "max_shift": 1.15,
    "base_image_seq_len": 256,
    "max_image_seq_len": 6400,
    "time_shift_type": "exponential",
}
# The tiny encoder's layers whose hidden states the tiny transformer reads (index 0 is the
# embedding): as Krea 2 reads Qwen3-VL-4B, never the final norm's output.
KREA2_TINY_TAPS = (1, 2, 3)


@_kept
def tiny_qwen3_vl_4b(seed: int, hidden: int = 32, layers: int = 4):
    """A Qwen3-VL-4B-shaped model (Krea 2's text encoder, read as a Qwen3VLModel; Qwen-Image
    2.1's 8B-shaped one, a Qwen3VLForConditionalGeneration, is `tiny_qwen3_vl`) with a one-block
    vision tower, the real vocabulary size, Qwen3-VL-4B's rotary base, norms and interleaved
    multimodal rotary sections in its proportions (24, 20, 20 of a 128-wide head: 6, 5, 5 of
    its 32-wide heads)."""
    from transformers import Qwen3VLConfig, Qwen3VLModel

    config = Qwen3VLConfig(
        text_config={
            "vocab_size": QWEN_VOCAB,
            "hidden_size": hidden,
            "intermediate_size": hidden * 2,
            "num_hidden_layers": layers,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 32,
            "max_position_embeddings": 1024,
            "rms_norm_eps": 1e-6,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 5000000.0,
                "mrope_section": [6, 5, 5],
                "mrope_interleaved": True,
            },
        },
        vision_config={
            "depth": 1,
            "hidden_size": 64,  # one 64-wide head, as the 4B's vision heads are wide
            "intermediate_size": 32,
            "num_heads": 1,
            "out_hidden_size": hidden,
            "num_position_embeddings": 16,
            "deepstack_visual_indexes": [0],
        },
        tie_word_embeddings=True,
    )
    _seeded(seed)
    return Qwen3VLModel(config).eval()


def tiny_krea2_transformer(seed: int, text: int = 32, text_layers: int = len(KREA2_TINY_TAPS)):
    """Krea 2's single-stream transformer, two blocks of two 32-wide query heads sharing one
    key/value head, on 2x2 patches of a 16-channel latent, with one layer-wise and one
    refiner text-fusion block; rotary axes in Krea 2's proportions (32, 48, 48 of 128)."""
    from diffusers import Krea2Transformer2DModel

    _seeded(seed)
    return Krea2Transformer2DModel(
        in_channels=64,
        num_layers=2,
        attention_head_dim=32,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=128,
        timestep_embed_dim=32,
        text_hidden_dim=text,
        num_text_layers=text_layers,
        text_num_attention_heads=2,
        text_num_key_value_heads=2,
        text_intermediate_size=text * 2,
        num_layerwise_text_blocks=1,
        num_refiner_text_blocks=1,
        axes_dims_rope=(8, 12, 12),
    ).eval()


def build_tiny_krea2_pipeline(
    seed: int = 0, distilled: bool = False, released_taps: bool = False, text: int = 32
):
    """A tiny Krea 2-shaped pipeline: a four-layer Qwen3-VL-shaped text encoder `text` wide
    read at three layers, a two-block single-stream transformer, Qwen-Image's 3D VAE;
    `distilled` makes it a Turbo. With `released_taps`, the encoder has Qwen3-VL-4B's 36 layers
    and is read where Krea 2 reads it (what a split file is run with)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, Krea2Pipeline

    from app.core.families.krea2 import KREA2_TAPS

    taps = KREA2_TAPS if released_taps else KREA2_TINY_TAPS
    return Krea2Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(**KREA2_SCHEDULER_CONFIG),
        vae=tiny_qwenimage_vae(seed + 1),
        text_encoder=tiny_qwen3_vl_4b(seed + 2, hidden=text, layers=36 if released_taps else 4),
        tokenizer=shared(qwen2_tokenizer),
        transformer=tiny_krea2_transformer(seed + 3, text=text, text_layers=len(taps)),
        text_encoder_select_layers=taps,
        is_distilled=distilled,
        patch_size=2,
    )


def tiny_anima_transformer(
    seed: int, text: int = 32, padding_channel: bool = True, layers: int = 2
):
    """Cosmos-Predict2's DiT in the shape Anima keeps it (rotary scales, the padding-mask input
    channel, no learnable positions) at a tiny width, `layers` blocks deep (Anima 2.9B's 40);
    with `padding_channel`, as its files store it, else as HalfSafe runs it
    (`without_padding_channel`)."""
    from diffusers import CosmosTransformer3DModel

    from app.core.families.anima_pipeline import without_padding_channel

    _seeded(seed)
    transformer = CosmosTransformer3DModel(
        in_channels=16,
        out_channels=16,
        num_attention_heads=2,
        attention_head_dim=16,
        num_layers=layers,
        text_embed_dim=text,
        adaln_lora_dim=8,
        max_size=(128, 240, 240),
        patch_size=(1, 2, 2),
        rope_scale=(1.0, 4.0, 4.0),
        concat_padding_mask=True,
        extra_pos_embed_type=None,
    ).eval()
    return transformer if padding_channel else without_padding_channel(transformer)


def tiny_anima_conditioner(seed: int, source: int = 32, target: int = 32):
    """Anima's LLM adapter: T5-vocabulary query tokens cross-attending to Qwen3 states, padded
    to 512 tokens as the released one."""
    from diffusers import AnimaTextConditioner

    _seeded(seed)
    return AnimaTextConditioner(
        source_dim=source,
        target_dim=target,
        model_dim=target,
        num_layers=2,
        num_attention_heads=4,
    ).eval()


def build_tiny_anima_pipeline(seed: int = 0, layers: int = 2):
    """A tiny Anima: a Qwen3-shaped text encoder with the real vocabulary, the text conditioner
    over it, the Cosmos DiT as HalfSafe runs it (`layers` blocks: 40 are Anima 2.9B's),
    Qwen-Image's causal 3D VAE, flow matching shifted by 3; HalfSafe's AnimaPipeline over
    diffusers' blocks."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    from app.core.families.anima_pipeline import AnimaPipeline

    return AnimaPipeline(
        text_encoder=tiny_qwen3(seed),
        tokenizer=shared(qwen2_tokenizer),
        t5_tokenizer=shared(t5_tokenizer),
        text_conditioner=tiny_anima_conditioner(seed + 1),
        transformer=tiny_anima_transformer(seed + 2, padding_channel=False, layers=layers),
        vae=tiny_qwenimage_vae(seed + 3),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
    )


# FLUX.3 -------------------------------------------------------------------------------------


@_kept
def tiny_flux3_text_encoder(seed: int, hidden: int = 32):
    """Qwen3-VL-4B's shape as FLUX.3 reads it (a Qwen3VLForConditionalGeneration, its LM head
    tied): `tiny_qwen3_vl_4b`'s config with all 36 layers, so that the eight FLUX.3 reads
    (4, 8, ..., 32) are inner layers' states, never the final norm's output."""
    from transformers import Qwen3VLForConditionalGeneration

    config = tiny_qwen3_vl_4b(seed, hidden=hidden, layers=36).config
    _seeded(seed)
    return Qwen3VLForConditionalGeneration(config).eval()


def tiny_flux3_transformer(seed: int, distilled: bool, text: int = 8 * 32):
    """One per-mode block per token mode and two joint single blocks, two 32-wide heads with
    FLUX.3's rotary proportions (four equal axes), reading eight 32-wide hidden states a token;
    `distilled`: the flow map's second timestep embedder."""
    from diffusers import Flux3Transformer2DModel

    _seeded(seed)
    return Flux3Transformer2DModel(
        in_channels=128,  # 32 latent channels in 2x2 patches
        cond_in_channels=128,
        num_layers=1,
        num_single_layers=2,
        attention_head_dim=32,
        num_attention_heads=2,
        joint_attention_dim=text,
        timestep_channels=32,
        axes_dims_rope=(8, 8, 8, 8),
        flow_map=distilled,
    ).eval()


@_kept
def tiny_prompt_upsampler(seed: int, hidden: int = 32):
    """A Qwen3.5-shaped prompt upsampler (FLUX.3's, a Qwen3_5ForConditionalGeneration): two
    decoder layers, one of each kind Qwen3.5 interleaves (a gated delta-net linear attention,
    then full attention), 16-wide heads, partial rotary with interleaved multimodal sections,
    a one-block vision tower, and the shipped Qwen tokenizer's vocabulary and picture tokens
    (the real model's vocabulary is wider: every id the tokenizer gives fits)."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    config = Qwen3_5Config(
        text_config={
            "vocab_size": QWEN_VOCAB,
            "hidden_size": hidden,
            "intermediate_size": hidden * 2,
            "num_hidden_layers": 2,
            "layer_types": ["linear_attention", "full_attention"],
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 16,
            "linear_key_head_dim": 8,
            "linear_value_head_dim": 8,
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 2,
            "max_position_embeddings": 4096,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000000.0,
                "mrope_section": [2, 1, 1],
                "mrope_interleaved": True,
            },
        },
        vision_config={
            "depth": 1,
            "hidden_size": 32,
            "intermediate_size": 32,
            "num_heads": 2,
            "out_hidden_size": hidden,
            "num_position_embeddings": 64,
        },
        # The shipped Qwen processor's picture tokens (Qwen3.5's own tokenizer has its own).
        image_token_id=151655,
        video_token_id=151656,
        vision_start_token_id=151652,
        vision_end_token_id=151653,
    )
    _seeded(seed)
    return Qwen3_5ForConditionalGeneration(config).eval()


def build_tiny_flux3_pipeline(seed: int = 0, distilled: bool = False, upsampler: bool = False):
    """A tiny FLUX.3: a 36-layer Qwen3-VL-shaped text encoder with Qwen3-VL's processor, the
    transformer (a flow map when `distilled`), Flux.2's 32-channel VAE, flow matching with
    FLUX.3's constant shift; HalfSafe's adapter over diffusers' blocks (the base model's, or the
    distilled Klein's); with `upsampler`, a Qwen3.5-shaped prompt upsampler (the Qwen
    processor's chat template)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    from app.core.encoders.tokenizers import qwen3_vl_processor
    from app.core.families.flux3_pipeline import Flux3DistilledPipeline, Flux3Pipeline
    from app.core.families.flux3_recipe import FLUX3_SHIFT

    pipeline = Flux3DistilledPipeline if distilled else Flux3Pipeline
    return pipeline(
        text_encoder=tiny_flux3_text_encoder(seed),
        tokenizer=qwen3_vl_processor(),
        transformer=tiny_flux3_transformer(seed + 1, distilled),
        vae=tiny_flux2_vae(seed + 2),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=FLUX3_SHIFT),
        prompt_upsampler=tiny_prompt_upsampler(seed + 3) if upsampler else None,
        prompt_upsampler_processor=qwen3_vl_processor() if upsampler else None,
    )
