"""Text-to-image generation with a NaN watch: every image is diagnosed, and a component that went
non-finite is repaired on its own, the cheapest way that works.

A job runs in three stages under a precision plan: the text encoder(s) once, the diffusers
pipeline's denoising loop for the whole batch (`output_type="latent"`), then the VAE once per
image. The watch keeps its flags on the device: each denoising step ORs "not all finite" of the
UNet's output and of the latents into a per-image flag and records the first bad step with
`torch.where`, so the loop never waits on the device. The flags are read once, after the loop.

Repair (`auto_fix="auto"`): a VAE that went non-finite decodes the same latents again with the
health check's fixes for the VAE, in `fix_candidates.FIX_KINDS` order (the overflowing layers kept
wider, drawn from an fp32 re-run of the failing part, before the whole VAE in bf16 or fp32),
the first that agrees with fp32 winning; a UNet or text encoder that went
non-finite has its image made again with the health check's fix for that component, found by
probing the failing input one forward pass at a time and proved by the full re-run. Whole-model
fp32 is tried only when no single-component fix works. A working fix is remembered for the
model on this device.

One responsibility per module, each importing only those before it:
  records      GenerationRequest, ImageResult, GenerationResult: what a job is asked and gives
  watch        NanWatch: the device-side flags of the denoising loop (no host sync per step)
  passes       what the stages hand each other: embeddings, picture latents, a second pass
  hires_pass   a hires fix's second pass: enlarged (in latents or pixels), drawn again
  prompt_pass  the prompt the encoders read (the upsampler's caption) and their flags
  stages       one job's stages: the prompt encoded, the batch denoised, each image decoded
  probes       the part that failed re-run alone: its first bad layer, a fix checked against fp32
  repair       an image repaired, cheapest fix first, or the fix to offer
  job          Job: the stages, probes and repairs, and the safety checker
  describe     the words of an outcome: each image's status and message
  parameters   the PNG's `parameters` text, through `infotext`'s table
  saving       the output folder, and the `unsaved` folder when saving fails
  entry        generate: the request checked, the job run, repaired, saved
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.core.lazy import lazy_exports

if TYPE_CHECKING:
    from app.core.families import make_scheduler as make_scheduler  # callers name it from here
    from app.core.generation.entry import generate
    from app.core.generation.job import Job as _Job  # the job benchmarks/common.py builds

    # tests/core/test_infotext.py
    from app.core.generation.parameters import parameters as _parameters
    from app.core.generation.records import (
        STATUSES,
        GenerationRequest,
        GenerationResult,
        ImageResult,
        PreviewCallback,
    )
    from app.core.generation.repair import MAX_REPAIRS_PER_IMAGE, STAGES
    from app.core.generation.saving import rescue_unsaved
    from app.core.generation.stages import PREVIEWS_PER_IMAGE
    from app.core.generation.watch import NanWatch, read_flags

__all__ = [
    "MAX_REPAIRS_PER_IMAGE",
    "PREVIEWS_PER_IMAGE",
    "STAGES",
    "STATUSES",
    "GenerationRequest",
    "GenerationResult",
    "ImageResult",
    "NanWatch",
    "PreviewCallback",
    "_Job",
    "_parameters",
    "generate",
    "make_scheduler",
    "read_flags",
    "rescue_unsaved",
]

if not TYPE_CHECKING:  # pyright would take any name from a module with __getattr__
    __getattr__, __dir__ = lazy_exports(
        globals(),
        {
            "app.core.families": ["make_scheduler"],
            ".entry": ["generate"],
            ".job": ["Job as _Job"],
            ".parameters": ["parameters as _parameters"],
            ".records": [
                "STATUSES",
                "GenerationRequest",
                "GenerationResult",
                "ImageResult",
                "PreviewCallback",
            ],
            ".repair": ["MAX_REPAIRS_PER_IMAGE", "STAGES"],
            ".saving": ["rescue_unsaved"],
            ".stages": ["PREVIEWS_PER_IMAGE"],
            ".watch": ["NanWatch", "read_flags"],
        },
    )
