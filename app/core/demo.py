"""The built-in demo model: a tiny SD1.x-shaped pipeline built in code, no download.

The `demo` model is the tiny SD1.x-shaped pipeline with weights trained by tools/train_demo.py
(shipped in app/resources/demo/, a few MB) on prompts like "a red circle on a blue background", at
128 px, on any machine: it draws the prompted colours of shape and background (the shape itself
only roughly). `demo-overflow` is the same model with one VAE layer scaled so
that fp16 overflows (fp32 and bf16 give the same picture), to show the NaN repair.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from app.core.errors import BadFileError
from app.core.jobs import ProgressCallback, no_progress
from app.core.paths import resource

DEMO_VERSION = 3
DEMO_STAGE = "Building the demo model"
DEMO_LABEL = "HalfSafe demo (a tiny model that draws coloured shapes)"
DEMO_SIZE = 128
DEMO_WEIGHTS = "demo"  # app/resources/demo/: text_encoder, vae, unet .safetensors and demo.json

# The built-in models, by the name the user gives as MODEL.
DEMO_MODELS: dict[str, str] = {
    "demo": DEMO_LABEL,
    "demo-overflow": "HalfSafe demo, overflowing (its VAE overflows in fp16 on purpose)",
}
# The layer that demo-overflow scales, and by how much its largest weight grows: far enough that
# its output passes 65504 in fp16, while the weights themselves still fit. The GroupNorm right
# after it divides the scale out again, so fp32 and bf16 draw the same picture.
OVERFLOW_LAYER = "decoder.up_blocks.0.resnets.0.conv1"
OVERFLOW_WEIGHT_MAX = 16384.0

# What the demo was trained to draw: "a <colour> <shape> on a <colour> background", two different
# colours (tools/train_demo.py draws these scenes; docs/cli.md lists the same words). Purple is a
# saturated violet: classifier-free guidance pushes a colour away from the palette's mean, and a
# duller purple, (130, 60, 170), nearer that mean, came out blue at CFG 7 (right at CFG 3).
DEMO_COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (210, 40, 40),
    "green": (40, 160, 70),
    "blue": (40, 80, 210),
    "yellow": (235, 200, 40),
    "purple": (160, 50, 200),
    "white": (240, 240, 240),
}
DEMO_SHAPES = ("circle", "square", "triangle")


def demo_prompt(shape: str, colour: str, background: str) -> str:
    """The caption form the demo was trained on."""
    return f"a {colour} {shape} on a {background} background"


# Stable Diffusion's noise schedule, shared by SD1.x, SD2.x and SDXL.
SD_SCHEDULER_CONFIG: dict[str, Any] = {
    "num_train_timesteps": 1000,
    "beta_start": 0.00085,
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "prediction_type": "epsilon",
    "timestep_spacing": "leading",
    "steps_offset": 1,
}


def _seeded(seed: int):
    import torch

    torch.manual_seed(seed)


# The demo's text encoder: CLIP ViT-L's architecture (quick_gelu, the real vocabulary) scaled
# down to 32 wide and two layers.
DEMO_TEXT_ENCODER_CONFIG: dict[str, Any] = {
    "vocab_size": 49408,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 77,
    "projection_dim": 32,
    "hidden_act": "quick_gelu",
    "bos_token_id": 49406,
    "eos_token_id": 49407,
    "pad_token_id": 49407,
}
# The demo's UNet: SD1.x's architecture scaled down to three levels of 32-64 channels,
# attending to the 32-wide text encoder.
DEMO_UNET_CONFIG: dict[str, Any] = {
    "sample_size": DEMO_SIZE // 8,
    "in_channels": 4,
    "out_channels": 4,
    "down_block_types": ("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
    "up_block_types": ("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
    "block_out_channels": (32, 64, 64),
    "layers_per_block": 1,
    "norm_num_groups": 16,
    "attention_head_dim": 8,
    "cross_attention_dim": 32,
}


def demo_text_encoder(seed: int):
    """The demo's text encoder (DEMO_TEXT_ENCODER_CONFIG); random weights from `seed`, fp32."""
    from transformers import CLIPTextConfig, CLIPTextModel

    config = CLIPTextConfig(**DEMO_TEXT_ENCODER_CONFIG)
    _seeded(seed)
    return CLIPTextModel(config).eval()


def demo_vae(seed: int, scaling_factor: float = 0.18215):
    """The demo's VAE: SD's architecture (four levels, 4 latent channels) scaled down to 16-32
    channels; random weights from `seed`, fp32."""
    from diffusers import AutoencoderKL

    # A config mapping: diffusers annotates these variable-length tuples as one-item tuples.
    config: dict[str, Any] = {
        "in_channels": 3,
        "out_channels": 3,
        "latent_channels": 4,
        "down_block_types": ("DownEncoderBlock2D",) * 4,
        "up_block_types": ("UpDecoderBlock2D",) * 4,
        "block_out_channels": (16, 32, 32, 32),
        "layers_per_block": 1,
        "norm_num_groups": 8,
        "sample_size": DEMO_SIZE,
        "scaling_factor": scaling_factor,
    }
    _seeded(seed)
    return AutoencoderKL(**config).eval()


def demo_unet(seed: int):
    """The demo's UNet (DEMO_UNET_CONFIG); random weights from `seed`, fp32."""
    from diffusers import UNet2DConditionModel

    _seeded(seed)
    return UNet2DConditionModel(**DEMO_UNET_CONFIG).eval()


def build_demo_pipeline(name: str = "demo", progress: ProgressCallback = no_progress):
    """The built-in model `name` (one of DEMO_MODELS): the tiny SD1.x pipeline (fp32, CPU) with
    the trained weights from app/resources/demo/. Reads about 7 MB; no network. `progress` hears
    each part built and each weights file read ("Building the demo model", n of 7).

    A missing or damaged weights file raises BadFileError naming it.
    """
    import torch
    from diffusers import EulerDiscreteScheduler, StableDiffusionPipeline

    from app.core.encoders.tokenizers import clip_tokenizer

    if name not in DEMO_MODELS:
        raise ValueError(name)
    folder = resource(DEMO_WEIGHTS)
    summary = _read_summary(folder / "demo.json")
    seed = DEMO_VERSION * 1000
    builders: dict[str, Callable[[], Any]] = {
        "vae": lambda: demo_vae(seed + 1, scaling_factor=summary["scaling_factor"]),
        "text_encoder": lambda: demo_text_encoder(seed + 2),
        "tokenizer": clip_tokenizer,
        "unet": lambda: demo_unet(seed + 3),
    }
    weighted = ("text_encoder", "vae", "unet")
    total = len(builders) + len(weighted)
    parts: dict[str, Any] = {}
    for built, (component, build) in enumerate(builders.items()):
        progress(DEMO_STAGE, built, total)
        parts[component] = build()
    for read, component in enumerate(weighted, start=len(builders)):
        progress(DEMO_STAGE, read, total)
        _load_weights(parts[component], folder / f"{component}.safetensors")
    progress(DEMO_STAGE, total, total)
    parts.update(
        scheduler=EulerDiscreteScheduler(
            **{**SD_SCHEDULER_CONFIG, "prediction_type": summary["prediction_type"]}
        ),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    if name == "demo-overflow":
        layer = parts["vae"].get_submodule(OVERFLOW_LAYER)
        with torch.no_grad():
            scale = OVERFLOW_WEIGHT_MAX / float(layer.weight.abs().max())
            layer.weight.mul_(scale)
            layer.bias.mul_(scale)
    return StableDiffusionPipeline(**parts)


def _read_summary(path) -> dict[str, Any]:
    import json

    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
        scaling = float(summary["scaling_factor"])
        prediction = summary.get("prediction_type", "epsilon")
        if prediction not in ("epsilon", "v_prediction"):
            raise ValueError(f"unknown prediction type {prediction!r}")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise BadFileError(
            path, f"the demo model's settings cannot be read ({error}); reinstall HalfSafe."
        ) from None
    if not 0.01 < scaling < 100:
        raise BadFileError(path, "the demo model's scaling factor is out of range.")
    return {"scaling_factor": scaling, "prediction_type": prediction}


def _load_weights(component, path) -> None:
    """Load a shipped component's weights (stored fp16) into `component`, kept in fp32."""
    import torch
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(path))
        expected = component.state_dict()
        if set(tensors) != set(expected) or any(
            tensors[key].shape != expected[key].shape for key in expected
        ):
            raise ValueError("its tensors do not match the demo model")
        component.load_state_dict({key: t.to(torch.float32) for key, t in tensors.items()})
    except (OSError, ValueError, SafetensorError) as error:
        raise BadFileError(
            path, f"the demo model's weights cannot be read ({error}); reinstall HalfSafe."
        ) from None
