"""What a generation job is asked for and what it gives back: the request, each image's result
and diagnosis, the job's result (saved as PNG files, or turned into `--json`'s object)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app import __version__
from app.core.fixing.job_fix import JobFix
from app.core.fixing.quality import Quality
from app.core.hires import Hires
from app.core.identities import DeviceIdentity, ModelIdentity
from app.core.images.canvas import SIDES, Canvas
from app.core.images.pictures import STRENGTH_DEFAULT, Mode, mode_of
from app.core.memory import MemoryRecord
from app.core.precision import PrecisionPlan
from app.core.settings import PrecisionSettings
from app.core.settings.values import SettingValue

if TYPE_CHECKING:
    from PIL import Image

    from app.core.lora.files import AppliedLora

# on_preview(step, image): a small PIL image of the first image of the batch.
PreviewCallback = Callable[[int, Any], None]

STATUSES = ("ok", "fixed", "nan", "black", "safety_checker")


# An image's status in words, for every place that names it: the terminal, the window's
# gallery and banner, the explanation of an image another tool made.
IMAGE_STATUS_WORDS = {
    "ok": "fine",
    "fixed": "fixed",
    "nan": "NaN-black",
    "black": "dark, but not NaN",
    "safety_checker": "blanked by the safety checker",
}

# What a job says of its prompt upsampler.
UPSAMPLER_WORDS = {
    "non_finite": (
        "The prompt upsampler went NaN/Inf in {dtype} while writing the prompt out, so the "
        "prompt was encoded as typed; a health check of the model names its layer and proves "
        "a fix."
    ),
}


@dataclass
class GenerationRequest:
    """What to draw. `seed` -1 picks a random seed; image i of a batch uses seed + i.
    `output_dir` None means the settings' output folder, else the default pictures folder."""

    prompt: str
    negative_prompt: str = ""
    steps: int = 25
    cfg: float = 7.0
    seed: int = -1
    width: int = 512
    height: int = 512
    batch: int = 1
    scheduler: str = "dpmpp_2m_karras"
    output_dir: str | None = None
    # Image-to-image and inpainting (see `pictures`): the input picture, the mask (white is
    # painted again) and how much of the picture is drawn again (the last `strength` of the
    # schedule runs). No picture: text-to-image. For an editing model, `images` are the
    # pictures to edit (no mask, no strength).
    images: list[str] = field(default_factory=list)
    mask: str | None = None
    strength: float = STRENGTH_DEFAULT
    # How an inpainting job lays out its picture (`canvas`): the mask's blur, only the masked
    # area at full resolution, the canvas extended (outpainting: inpainting without a mask).
    canvas: Canvas = field(default_factory=Canvas)
    # A1111's "Clip skip": the prompt read this many CLIP layers from the end (SD1/SD2, SDXL).
    clip_skip: int = 1
    # Hires fix: a second pass at a larger size from the first pass's latents (text-to-image).
    hires: Hires = field(default_factory=Hires)
    # The step cache's threshold (`step_cache`; 0: every step computed in full).
    step_cache: float = 0.0
    # The pipeline's prompt cache (`prompt_cache`; only for families that keep one).
    prompt_cache: bool = False
    # Whether a model's prompt upsampler writes the prompt out before it is encoded.
    upsample_prompt: bool = True

    def drawn_size(self) -> tuple[int, int]:
        """(width, height) of the picture the job's last pass draws and its VAE decodes."""
        if self.hires.on:
            return self.hires.final_size(self.width, self.height)
        return self.width, self.height

    def mode_for(self, references: int = 0, control: bool = False) -> Mode:
        """Text-to-image, image-to-image, inpainting, for a model that edits up to `references`
        pictures editing, or for a `control` model drawing after a control picture;
        HalfSafeError for a mask without a picture, or more pictures than the model takes
        (`pictures.mode_of`)."""
        return mode_of(self.images, self.mask, references, control, self.canvas.extends)


@dataclass
class ImageResult:
    """One image and its diagnosis. `step` is 1-based (the denoising step that first went
    non-finite); `fix` is the settings that repaired it, or that would; `image` keeps the PIL
    image so it can be saved again elsewhere."""

    seed: int
    status: str
    component: str | None = None
    step: int | None = None
    fixes_applied: list[str] = field(default_factory=list)
    message: str = ""
    fix: dict[str, SettingValue] | None = None
    path: str = ""
    first_bad_module: str | None = None
    non_finite: float = 0.0  # fraction of pixels that were NaN/inf
    non_finite_box: tuple[int, int, int, int] | None = None  # where they are: x0, y0, x1, y1
    settings: dict[str, SettingValue] = field(
        default_factory=dict
    )  # effective settings it was made with
    quality: Quality | None = None  # a repair's agreement with fp32
    parameters: str = ""  # the PNG's `parameters` text
    image: Image.Image | None = field(default=None, repr=False)
    cause: str | None = None  # "precision", "kernel", "weights", "state" (see `causes`)
    # The step cache's threshold this image was made with: 0 for one made again without it.
    step_cache: float = 0.0
    # Whether the prompt cache was on for it: False for one made again without it.
    prompt_cache: bool = False
    loras: list[AppliedLora] | None = field(default=None, repr=False)  # None: the model's LoRAs
    # The image as PNG bytes, with its parameters, where it could not be saved (`path` empty)
    # and leaves the engine for the window, which can still save it elsewhere.
    png: bytes | None = field(default=None, repr=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "seed": self.seed,
            "status": self.status,
            "component": self.component,
            "step": self.step,
            "fixes_applied": list(self.fixes_applied),
            "message": self.message,
            "fix": dict(self.fix) if self.fix is not None else None,
            "first_bad_module": self.first_bad_module,
            "non_finite": round(self.non_finite, 6),
            "non_finite_box": list(self.non_finite_box) if self.non_finite_box else None,
            "settings": dict(self.settings),  # what this image was made with, repairs included
            "quality": self.quality.to_json() if self.quality is not None else None,
            "cause": self.cause,
            "step_cache": self.step_cache,
            "prompt_cache": self.prompt_cache,
        }


@dataclass
class GenerationResult:
    """A generation job's images, the settings it ran with, the model (with the LoRAs it ran
    with) and the device that made them."""

    images: list[ImageResult]
    settings: dict[str, SettingValue]  # effective precision settings of the job (before any repair)
    seconds: float
    request: GenerationRequest
    model: ModelIdentity
    device: DeviceIdentity
    warnings: list[str] = field(default_factory=list)
    # Why some images are not saved (`ImageResult.png` holds them): one sentence, or "".
    save_error: str = ""
    mode: Mode = Mode.TEXT  # what the job made its pictures from
    memory: MemoryRecord | None = None  # None: no memory budget applied
    # A fix the job was asked to run with, for this job only, over the settings it was given
    # (`job_fix.JobFix`: what it set, and which of the user's own choices it replaced).
    job_fix: JobFix | None = None
    # The caption the model's prompt upsampler wrote, which the text encoders read (None: the
    # prompt was encoded as given).
    upsampled_prompt: str | None = None

    @property
    def all_good(self) -> bool:
        """No image is left non-finite or black after the fixes allowed."""
        return all(image.status not in ("nan", "black") for image in self.images)

    def to_json(self) -> dict[str, Any]:
        return {
            "halfsafe": __version__,
            "images": [image.to_json() for image in self.images],
            "settings": dict(self.settings),
            "seconds": round(self.seconds, 3),
            "model": self.model.generation_json(),
            "device": self.device.to_json(),
            "mode": self.mode.value,
            "pictures": [*self.request.images, *([self.request.mask] if self.request.mask else [])],
            "canvas": self._canvas_json(),
            "clip_skip": self.request.clip_skip,
            "hires": self._hires_json(),
            "step_cache": self.request.step_cache,
            "prompt_cache": self.request.prompt_cache,
            "warnings": list(self.warnings),
            "memory": self.memory.to_json() if self.memory is not None else None,
            "fix_for_job": self.job_fix.to_json() if self.job_fix is not None else None,
            "upsampled_prompt": self.upsampled_prompt,
        }

    def _hires_json(self) -> dict[str, Any] | None:
        """The second pass (`hires.Hires`), or None when the job had none."""
        hires = self.request.hires
        if not hires.on:
            return None
        width, height = self.request.drawn_size()
        return {
            "scale": hires.scale,
            "steps": hires.steps,
            "denoise": hires.denoise,
            "upscaler": hires.upscaler,
            "size": [width, height],
        }

    def _canvas_json(self) -> dict[str, Any] | None:
        """An inpainting job's layout (`canvas.Canvas`), or None for another mode."""
        if self.mode is not Mode.INPAINT:
            return None
        canvas = self.request.canvas
        return {
            "mask_blur": canvas.mask_blur,
            "only_masked": canvas.only_masked,
            "padding": canvas.padding,
            "extend": dict(zip(SIDES, canvas.extend, strict=True)),
        }

    def save(self, folder: str | Path, *, only_unsaved: bool = True) -> list[Path]:
        """Write the images (by default those not yet saved) into `folder`, with their
        parameters. Raises ImageSaveError (carrying this result) when that fails too."""
        from app.core.images.finished import (  # PNG writing: not for the window
            ImageSaveError,
            save_png,
        )

        written = []
        for entry in self.images:
            if only_unsaved and entry.path:
                continue
            try:
                path = save_png(entry.image, folder, entry.seed, entry.parameters)
            except ImageSaveError as error:
                error.result = self
                raise
            entry.path = str(path)
            written.append(path)
        return written


def settings_of(plan: PrecisionPlan, precision: PrecisionSettings) -> dict[str, Any]:
    return {
        **plan.effective_settings(),
        "nan_check": precision.nan_check,
        "auto_fix": precision.auto_fix,
    }
