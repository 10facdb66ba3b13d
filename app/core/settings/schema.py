"""The schema: every option declared once (`SCHEMA`, `FIELDS`) with its choices, default, words
and group, and a fresh copy of the defaults.
"""

from __future__ import annotations

from typing import Any

from app.core import hires, samplers
from app.core.components import COMPONENT_SETTINGS
from app.core.settings.validation import Field

DTYPE_CHOICES = ("auto", "fp16", "bf16", "fp32")
# The base precision also takes `autocast`: fp16 weights under torch.autocast, AUTOMATIC1111's
# default; a per-component setting is a plain dtype.
PRECISION_CHOICES = (*DTYPE_CHOICES, "autocast")
ATTENTION_BACKENDS = ("auto", "flash", "efficient", "cudnn", "math", "classic")
AUTO_FIX_CHOICES = ("off", "ask", "auto")
VAE_TILING_CHOICES = ("auto", "on", "off")
SCHEDULERS = samplers.KEYS  # each sampler, alone and with each schedule it runs

GROUPS = ("Device", "Precision", "Attention", "Accumulation", "NaN safety", "Generation", "Folders")


_DTYPE_HELP = (
    "fp16 is fastest and halves memory but overflows past 65504; bf16 has fp32's range with "
    "less precision and needs a recent GPU; fp32 is always safe and costs about twice the "
    "time and memory. 'auto' picks from your GPU and the model's health check."
)

SCHEMA: tuple[Field, ...] = (
    Field(
        "device",
        "device",
        "auto",
        "Device",
        "Which device runs the model: auto picks the best GPU, else the CPU. "
        "Use cuda:N to pick one of several NVIDIA GPUs.",
        "Device",
        cli=False,
    ),
    Field(
        "max_vram_gb",
        "float",
        0.0,
        "Memory budget (GB)",
        "The most GPU memory HalfSafe's copy of a model part may take, to leave room for other "
        "programs: a part that would not fit in a wider precision (the fp32 reference of a "
        "health check, a fix or no-half that widens fp16 weights) keeps its weights as stored "
        "and computes layer by layer in the wider precision; a part whose stored weights do not "
        "fit streams its blocks to the GPU one at a time. Both are slower but give the same "
        "results. 0: no budget of your own (the device's free memory at the start of each job, "
        "less room for its activations: a GPU's own, or for a CPU or an Apple GPU the "
        "computer's, beside the model it holds).",
        "Device",
        minimum=0.0,
        maximum=4096.0,
        cli=True,
        flag="max-vram",
    ),
    Field(
        "vae_tiling",
        "choice",
        "auto",
        "VAE tiling",
        "Decode (and encode) the picture in overlapping tiles, so that a large picture's VAE "
        "fits in less GPU memory, at the cost of slightly different pixels along the seams. "
        "auto tiles on a GPU when the decode at the asked size would not fit the memory left "
        "beside the VAE; on always tiles a picture larger than one tile; off never tiles.",
        "Device",
        choices=VAE_TILING_CHOICES,
        cli=True,
    ),
    Field(
        "precision",
        "choice",
        "auto",
        "Precision",
        "Base number format for every part of the model. "
        + _DTYPE_HELP
        + " 'autocast' is AUTOMATIC1111's default: fp16 weights under PyTorch's autocast, which "
        "runs softmax and normalisation in fp32 on NVIDIA and AMD GPUs (on a CPU it runs like "
        "fp16).",
        "Precision",
        choices=PRECISION_CHOICES,
        cli=True,
    ),
    # One per component setting, from the components table.
    *(
        Field(
            setting.key,
            "choice",
            "auto",
            setting.label,
            setting.help,
            "Precision",
            choices=DTYPE_CHOICES,
            cli=True,
        )
        for setting in COMPONENT_SETTINGS
    ),
    Field(
        "t5_fp32_feed_forward",
        "bool",
        False,
        "T5 feed-forward output in fp32",
        "Keep the output projection of every T5 feed-forward layer (wo) in fp32 while the rest "
        "of the T5 text encoder (Flux, SD3) runs in half precision: the known fix for T5-XXL's "
        "fp16 overflow, which transformers applies when it loads T5 in fp16. Costs almost "
        "nothing.",
        "Precision",
        cli=True,
    ),
    Field(
        "fp32_modules",
        "modules",
        [],
        "Layers in fp32",
        "Named layers (COMPONENT:PATH, e.g. vae:decoder.up_blocks.0.resnets.0.conv1) that run "
        "in fp32 while the rest of their component runs in half precision: the health check's "
        "layer-level fix, which pays for precision only where the model overflows. Values "
        "leave these layers in fp32 until the next layer casts them back.",
        "Precision",
        cli=True,
    ),
    Field(
        "bf16_modules",
        "modules",
        [],
        "Layers in bf16",
        "Named layers, as for the layers in fp32, that run in bf16 instead (fp32's range at "
        "half the memory) for GPUs with native bf16.",
        "Precision",
        cli=True,
    ),
    Field(
        "clamp_modules",
        "modules",
        [],
        "Clamp layer outputs",
        "Named layers whose fp16 output is clamped to +-65504 (what some pipelines do for Flux "
        "and SDXL). Finite, but a clamp that cuts real values changes the image: use it only "
        "when the health check verified it against fp32.",
        "Precision",
        cli=True,
    ),
    Field(
        "no_half",
        "bool",
        False,
        "No half precision (everything fp32)",
        "Run every part in fp32, like --no-half. Always safe; about 2x slower and 2x the "
        "memory. Prefer a targeted fix from the health check.",
        "Precision",
        cli=True,
    ),
    Field(
        "no_half_vae",
        "bool",
        False,
        "VAE in fp32 (no-half-VAE)",
        "Run only the VAE in fp32, like --no-half-vae. The usual cure for black SDXL images; "
        "costs a little memory and a fraction of a second per image.",
        "Precision",
        cli=True,
    ),
    Field(
        "upcast_attention",
        "bool",
        False,
        "Upcast attention to fp32",
        "Compute attention scores and softmax in fp32 with any attention backend. Fixes "
        "overflow in attention (SD2.x, Apple MPS) for a small slowdown of attention layers.",
        "Attention",
        cli=True,
    ),
    Field(
        "attention_backend",
        "choice",
        "auto",
        "Attention backend",
        "Which attention kernel runs: flash and efficient are fastest and lean on memory; "
        "cudnn is fast on recent NVIDIA GPUs; math is the plain reference; classic is "
        "diffusers' original processor, the slowest and most memory-hungry.",
        "Attention",
        choices=ATTENTION_BACKENDS,
        cli=True,
    ),
    Field(
        "attention_reduced_precision",
        "bool",
        False,
        "Reduced-precision math attention",
        "Let the math attention kernel reduce in fp16/bf16. Slightly faster, and can "
        "overflow where fp32 reduction would not. Off is safer.",
        "Attention",
        cli=True,
    ),
    Field(
        "allow_tf32",
        "bool",
        True,
        "TF32 for fp32 work",
        "Use TensorFloat-32 for fp32 matrix multiplies and convolutions on Ampere and newer "
        "NVIDIA GPUs: several times faster fp32, same range, fewer mantissa bits. Has no "
        "effect elsewhere.",
        "Accumulation",
        cli=True,
        flag="tf32",
    ),
    Field(
        "fp16_reduced_precision_reduction",
        "bool",
        True,
        "fp16 reduced-precision reduction",
        "Let fp16 matrix multiplies sum partial results (split-K) in fp16. PyTorch's default "
        "and a little faster; turning it off can cure an overflow where the true result fits.",
        "Accumulation",
        cli=True,
    ),
    Field(
        "fp16_accumulation",
        "bool",
        False,
        "Full fp16 accumulation",
        "Accumulate fp16 matrix multiplies entirely in fp16. Much faster on consumer GPUs, "
        "and the riskiest setting here: sums past 65504 become inf. Needs PyTorch 2.7+.",
        "Accumulation",
        cli=True,
    ),
    Field(
        "nan_check",
        "bool",
        True,
        "NaN watch",
        "Watch every denoising step for values that went non-finite, at no per-step cost, so a "
        "broken image is caught where it broke and repaired. Off (like --disable-nan-check): "
        "no watch and no repair; finished images are still labelled NaN or black.",
        "NaN safety",
    ),
    Field(
        "auto_fix",
        "choice",
        "auto",
        "When an image goes NaN",
        "off: keep the broken image and say why; ask: offer the fix; auto: repair only the "
        "part that failed (for a VAE, decode the same latents again) and remember the fix.",
        "NaN safety",
        choices=AUTO_FIX_CHOICES,
    ),
    Field(
        "steps",
        "int",
        25,
        "Steps",
        "Denoising steps per image: more is slower and finer.",
        "Generation",
        minimum=1,
        maximum=1000,
    ),
    Field(
        "cfg",
        "float",
        7.0,
        "CFG scale",
        "How strongly the image follows the prompt. 5-9 suits most models.",
        "Generation",
        minimum=1.0,
        maximum=30.0,
    ),
    Field(
        "width",
        "int",
        512,
        "Width",
        "Image width in pixels (a multiple of 8).",
        "Generation",
        minimum=64,
        maximum=4096,
        step=8,
    ),
    Field(
        "height",
        "int",
        512,
        "Height",
        "Image height in pixels (a multiple of 8).",
        "Generation",
        minimum=64,
        maximum=4096,
        step=8,
    ),
    Field(
        "batch",
        "int",
        1,
        "Batch size",
        "Images generated together; each costs memory.",
        "Generation",
        minimum=1,
        maximum=16,
    ),
    Field(
        "seed",
        "int",
        -1,
        "Seed",
        "-1 picks a random seed for each run.",
        "Generation",
        minimum=-1,
        maximum=2**32 - 1,
    ),
    Field(
        "scheduler",
        "choice",
        samplers.DEFAULT,
        "Sampler",
        "The sampler and its noise schedule, by AUTOMATIC1111's names: DPM++ 2M Karras is a "
        "good default; Euler a and the SDE samplers add fresh noise every step; DDIM is "
        "deterministic. Flow-matching models (Flux, SD3, Qwen-Image, ...) use their own Euler.",
        "Generation",
        choices=SCHEDULERS,
    ),
    Field(
        "clip_skip",
        "int",
        1,
        "Clip skip",
        "Read the prompt this many layers from the end of CLIP (Stable Diffusion 1.x, 2.x and "
        "SDXL): 1 is the model's own; anime SD 1.x models are made for 2.",
        "Generation",
        minimum=1,
        maximum=12,
    ),
    Field(
        "hires_scale",
        "float",
        1.0,
        "Hires upscale",
        "Hires fix: draw the picture, enlarge it this many times and draw it again at that "
        "size (1: off). The second pass runs the VAE at the larger size, where SDXL's VAE "
        "often overflows in fp16.",
        "Generation",
        minimum=1.0,
        maximum=hires.SCALE_MAX,
    ),
    Field(
        "hires_steps",
        "int",
        0,
        "Hires steps",
        "Hires fix: the second pass's steps (0: as many as the first pass runs at its strength).",
        "Generation",
        minimum=0,
        maximum=hires.STEPS_MAX,
    ),
    Field(
        "hires_denoise",
        "float",
        hires.DENOISE_DEFAULT,
        "Hires denoising strength",
        "Hires fix: how much of the enlarged picture the second pass draws again.",
        "Generation",
        minimum=0.01,
        maximum=1.0,
    ),
    Field(
        "hires_upscaler",
        "choice",
        hires.DEFAULT,
        "Hires upscaler",
        "Hires fix: how the first picture is enlarged, by AUTOMATIC1111's names: its latents "
        "(Latent, ...), or its pixels (Lanczos, Nearest), which the VAE encodes again.",
        "Generation",
        choices=hires.KEYS,
    ),
    Field(
        "step_cache",
        "float",
        0.0,
        "Step cache",
        "Skip most of a step's work while the model's first block changes by less than this "
        "share (diffusers' first-block cache; 0: off, 0.05 to 0.15 is usual). Faster, and the "
        "image changes a little; only for transformers whose blocks the cache can skip (other "
        "models refuse it). A NaN a cache holds repeats in every later step: an image that "
        "goes NaN is made again without it first.",
        "Generation",
        minimum=0.0,
        maximum=1.0,
    ),
    Field(
        "upsample_prompt",
        "bool",
        True,
        "Prompt upsampler",
        "Where the model has a prompt upsampler (FLUX.3's Qwen3.5 LLM), let it write your "
        "prompt out as a detailed caption before it is encoded, as the model's own pipeline "
        "does; off: the prompt is encoded as you wrote it. Models without one ignore it.",
        "Generation",
    ),
    Field(
        "prompt_cache",
        "bool",
        False,
        "Prompt cache",
        "Keep the prompt's keys and values from the first step and reuse them in every later "
        "step (Qwen-Image 2.1's key/value cache): a little faster, the same image within "
        "rounding; only for models whose pipeline keeps one (other models refuse it). A NaN a "
        "cache holds repeats in every later step: an image that goes NaN is made again "
        "without it first.",
        "Generation",
    ),
    Field(
        "negative_prompt",
        "text",
        "",
        "Negative prompt",
        "What the image should not contain, used when a job gives none.",
        "Generation",
    ),
    Field(
        "model_folders",
        "paths",
        [],
        "Model folders",
        "Extra folders to scan for checkpoints, besides the usual AUTOMATIC1111, ComfyUI and "
        "StabilityMatrix folders found on this computer.",
        "Folders",
    ),
    Field(
        "output_folder",
        "path",
        "",
        "Output folder",
        "Where images are saved. Empty means the HalfSafe folder in your Pictures.",
        "Folders",
    ),
)

FIELDS: dict[str, Field] = {f.key: f for f in SCHEMA}


def defaults() -> dict[str, Any]:
    """A fresh copy of every field's default."""
    return {f.key: list(f.default) if isinstance(f.default, list) else f.default for f in SCHEMA}
