"""The PNG's `parameters` text: AUTOMATIC1111's format plus HalfSafe's own pairs, written
through `infotext`'s table of keys."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from app import __version__
from app.core.families import capabilities, family_of
from app.core.fixing.job_fix import JobFix
from app.core.generation.describe import box_text, percent
from app.core.generation.records import GenerationRequest, ImageResult, MemoryRecord
from app.core.hires import BY_KEY
from app.core.images.pictures import Mode
from app.core.lora.files import lora_hashes, prompt_with_tags
from app.core.words import infotext


def parameters(
    entry: ImageResult,
    request: GenerationRequest,
    model,
    device_name: str | None = None,
    memory: MemoryRecord | None = None,
    job_fix: JobFix | None = None,
) -> str:
    """The PNG's `parameters` text, in AUTOMATIC1111's format, plus HalfSafe's own pairs (each
    key, its meaning and how it is written: `infotext.KEYS`)."""
    s = entry.settings
    family = family_of(model.pipeline)
    loras = entry.loras if entry.loras is not None else list(getattr(model, "loras", []))
    values: list[tuple[infotext.Key, Any]] = [
        (infotext.STEPS, request.steps),
        *zip(
            (infotext.SAMPLER, infotext.SCHEDULE_TYPE),
            family.sampler_record(request.scheduler),
            strict=True,
        ),
        *infotext.keyed(family.guidance_parameters(request.cfg)),
        (infotext.SEED, entry.seed),
        (infotext.SIZE, (request.width, request.height)),
        (infotext.MODEL_HASH, model.model_hash),
        (infotext.MODEL, model.name),
        (infotext.LORA_HASHES, lora_hashes(loras)),
        *_vae_parameters(getattr(model, "vae", None)),
        # The starting noise is made on the CPU (`Job.noise`); A1111 assumes GPU noise unless
        # told, and the seed would not reproduce there.
        (infotext.RNG, "CPU"),
        (infotext.CLIP_SKIP, request.clip_skip if request.clip_skip > 1 else None),
        (infotext.STEP_CACHE, f"{entry.step_cache:g}" if entry.step_cache else None),
        (infotext.PROMPT_CACHE, "on" if entry.prompt_cache else None),
        *_hires_parameters(request),
        *_picture_parameters(
            request,
            capabilities.references(family, model.pipeline),
            capabilities.controls(family, model.pipeline),
        ),
        # Which model of its family ran (Z-Image Turbo or Base), which sets steps and CFG.
        (infotext.ARCHITECTURE, getattr(model, "architecture", None)),
        # The effective settings: precisions, backend flags, layer-level fixes, NaN watch, device.
        *infotext.setting_values(s),
        (infotext.DEVICE_NAME, device_name),
        (infotext.MEMORY_BUDGET, memory.budget_words() if memory is not None else None),
        (infotext.STREAMED, list(memory.streamed) if memory and memory.streamed else None),
        (
            infotext.COMPUTED_IN_PLACE,
            list(memory.computed_in_place) if memory and memory.computed_in_place else None,
        ),
        (infotext.NAN_WATCH, entry.status),
        (infotext.NAN_COMPONENT, entry.component),
        (infotext.NAN_STEP, entry.step),
        (infotext.FIXES_APPLIED, entry.fixes_applied),
        (infotext.FIX_FOR_JOB, job_fix.listed() if job_fix is not None else None),
        (infotext.NON_FINITE_PIXELS, percent(entry.non_finite) if entry.non_finite else None),
        (
            infotext.NON_FINITE_REGION,
            box_text(entry.non_finite_box) if entry.non_finite < 1 else None,
        ),
        (infotext.HALFSAFE, __version__),
    ]
    return infotext.write(prompt_with_tags(request.prompt, loras), request.negative_prompt, values)


def _vae_parameters(vae: str | None) -> list[tuple[infotext.Key, Any]]:
    """A1111's `VAE hash` (first 10 hex of the file's sha256, cached like the model's) and
    `VAE` (the file name) for a separate VAE; none for the model's own. A VAE folder has no
    file hash, and a file that cannot be read now is named without one."""
    if not vae:
        return []
    from app.core.checkpoint.hashing import model_hash

    path = Path(vae)
    vae_hash = None
    if path.is_file():
        with contextlib.suppress(OSError):
            vae_hash = model_hash(path)
    return [(infotext.VAE_HASH, vae_hash), (infotext.VAE, path.name)]


def _hires_parameters(request: GenerationRequest) -> list[tuple[infotext.Key, Any]]:
    """A hires fix as A1111 writes it: `Denoising strength` is the second pass's, `Size` stays
    the first pass's."""
    hires = request.hires
    if not hires.on:
        return []
    return [
        (infotext.DENOISING_STRENGTH, f"{hires.denoise:g}"),
        (infotext.HIRES_UPSCALE, f"{hires.scale:g}"),
        (infotext.HIRES_STEPS, hires.steps or None),
        (infotext.HIRES_UPSCALER, BY_KEY[hires.upscaler].words),
    ]


def _picture_parameters(
    request: GenerationRequest, references: int, control: bool
) -> list[tuple[infotext.Key, Any]]:
    """For a job that started from pictures: its mode, A1111's `Denoising strength` (not for
    an edit or a control picture, which have none), an inpainting job's layout (A1111's mask
    blur and "only masked" keys, HalfSafe's canvas extension), and the input pictures' and
    mask's file names (their names only: a path says more than the user chose to share)."""
    if not request.images:
        return []
    mode = request.mode_for(references, control)
    names = ", ".join(Path(image).name for image in request.images)
    no_strength = mode in (Mode.EDIT, Mode.CONTROL)
    canvas = request.canvas if mode is Mode.INPAINT else None
    only_masked = canvas is not None and canvas.only_masked
    return [
        (infotext.DENOISING_STRENGTH, None if no_strength else request.strength),
        (infotext.MASK_BLUR, canvas.mask_blur if canvas is not None else None),
        (infotext.INPAINT_AREA, "Only masked" if only_masked else None),
        (infotext.MASKED_AREA_PADDING, canvas.padding if canvas and only_masked else None),
        (infotext.MODE, mode.value),
        (infotext.INPUT_PICTURE, names),
        (infotext.MASK, Path(request.mask).name if request.mask else None),
        (infotext.CANVAS_EXTENDED, canvas.extended_words() if canvas is not None else None),
    ]
