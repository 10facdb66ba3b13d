"""Hires fix, as AUTOMATIC1111 and Forge run it ("Hires. fix") and ComfyUI users build it (an
upscale between two samplers): the picture drawn at the first size, its latents upscaled, and
a second image-to-image pass at the final size that redraws the last `denoise` of a schedule.

The second pass runs the denoiser and the VAE at the final size, the classic place an SDXL VAE
overflows in fp16 although the first size was fine; so a check of such an image runs at the
final size (`final_size`).

Upscalers: the latent ones, by A1111's names and modes (its `latent_upscale_modes`: "Latent" is
bilinear, "Latent (antialiased)" bilinear with antialiasing, and so on); ComfyUI's
LatentUpscale methods read as the same. Pixel upscalers (Lanczos, an ESRGAN model) decode the
first picture, enlarge it and encode it again; HalfSafe does not run that path and says so,
naming the latent upscaler closest to it.

Plain data; torch is imported inside `upscale`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from app.core.errors import HalfSafeError

SCALE_MAX = 4.0  # A1111's slider stops at 4
STEPS_MAX = 150  # A1111's slider: 0 (the first pass's steps) to 150
DENOISE_DEFAULT = 0.7  # A1111's default denoising strength for the second pass


@dataclass(frozen=True)
class Upscaler:
    key: str
    words: str  # A1111's name, as the PNG writes it
    mode: str  # torch.nn.functional.interpolate's mode
    antialias: bool = False


UPSCALERS: tuple[Upscaler, ...] = (
    Upscaler("latent", "Latent", "bilinear"),
    Upscaler("latent_antialiased", "Latent (antialiased)", "bilinear", True),
    Upscaler("latent_bicubic", "Latent (bicubic)", "bicubic"),
    Upscaler("latent_bicubic_antialiased", "Latent (bicubic antialiased)", "bicubic", True),
    Upscaler("latent_nearest", "Latent (nearest)", "nearest"),
    Upscaler("latent_nearest_exact", "Latent (nearest-exact)", "nearest-exact"),
    Upscaler("latent_area", "Latent (area)", "area"),  # ComfyUI's "area"
)
BY_KEY = {u.key: u for u in UPSCALERS}
DEFAULT = "latent"
KEYS = tuple(BY_KEY)

# ComfyUI's LatentUpscale / LatentUpscaleBy `upscale_method`s.
_COMFY = {
    "bilinear": "latent",
    "bicubic": "latent_bicubic",
    "nearest-exact": "latent_nearest_exact",
    "area": "latent_area",
}
# Upscalers that work on pixels, by the words tools write; anything else unknown.
_PIXEL_WORDS = ("lanczos", "nearest", "esrgan", "swinir", "dat", "ldsr", "scunet", "ultrasharp")


def key_for(words: str | None) -> str | None:
    """HalfSafe's key for an upscaler in A1111's, ComfyUI's or HalfSafe's words (None: one
    HalfSafe does not run)."""
    if not words:
        return None
    text = words.strip()
    folded = text.lower()
    for upscaler in UPSCALERS:
        if folded in (upscaler.key, upscaler.words.lower()):
            return upscaler.key
    return _COMFY.get(folded)


def refusal(words: str) -> str:
    """The sentence for an upscaler HalfSafe does not run, naming the closest it does."""
    folded = words.lower()
    if folded == "bislerp":
        return f"HalfSafe does not run the upscale method {words}; the closest it runs is Latent."
    if any(word in folded for word in _PIXEL_WORDS) or folded in ("none",):
        return (
            f"HalfSafe does not run the pixel upscaler {words} (it decodes the first picture, "
            "enlarges it and encodes it again); the closest it runs is Latent (antialiased)."
        )
    return f"HalfSafe does not know the upscaler {words}; the closest it runs is Latent."


@dataclass(frozen=True)
class Hires:
    """A job's second pass: `scale` times the first size (1: no second pass), `steps` of it
    run (0: as many as the first pass's), redrawing the last `denoise` of the schedule, from
    latents enlarged by `upscaler`."""

    scale: float = 1.0
    steps: int = 0
    denoise: float = DENOISE_DEFAULT
    upscaler: str = DEFAULT

    @property
    def on(self) -> bool:
        return self.scale > 1.0

    def checked(self) -> Hires:
        """Itself, or HalfSafeError naming the value out of range."""
        if not isinstance(self.scale, (int, float)) or not 1.0 <= self.scale <= SCALE_MAX:
            raise HalfSafeError(
                f"Hires upscale: {self.scale!r} is not between 1 (off) and {SCALE_MAX:g}."
            )
        if not self.on:
            return self
        if not isinstance(self.steps, int) or not 0 <= self.steps <= STEPS_MAX:
            raise HalfSafeError(
                f"Hires steps: {self.steps!r} is not between 0 (as many as the first pass) "
                f"and {STEPS_MAX}."
            )
        if not isinstance(self.denoise, (int, float)) or not 0.0 < self.denoise <= 1.0:
            raise HalfSafeError(
                f"Hires denoising strength: {self.denoise!r} is not between 0 and 1 (0.7 "
                "redraws the last 70 % of the schedule)."
            )
        if self.upscaler not in BY_KEY:
            raise HalfSafeError(refusal(str(self.upscaler)))
        return self

    def final_size(self, width: int, height: int) -> tuple[int, int]:
        """The second pass's size: the first size times `scale`, down to a multiple of 8 (as
        A1111 sizes its latents)."""
        return (int(width * self.scale) // 8 * 8, int(height * self.scale) // 8 * 8)

    def call_steps(self, first_steps: int) -> int:
        """`num_inference_steps` for the second pass's picture pipeline, which runs the last
        `denoise` of them: A1111's count, its `Hires steps` run when set (the schedule
        stretched to `steps / denoise`), else `denoise` of the first pass's steps."""
        if self.steps:  # the least count whose last `denoise` is `steps` whole steps
            return max(self.steps, math.ceil(self.steps / self.denoise - 1e-9))
        return first_steps

    def steps_run(self, first_steps: int) -> int:
        """How many denoising steps the second pass runs (a picture pipeline runs the last
        `int(count * strength)` of `count`)."""
        count = self.call_steps(first_steps)
        return min(int(count * self.denoise), count)

    @property
    def words(self) -> str:
        """ "hires fix 2x (Latent), 10 steps at 0.7"."""
        steps = f"{self.steps} steps" if self.steps else "the same steps"
        return (
            f"hires fix {self.scale:g}x ({BY_KEY[self.upscaler].words}), {steps} at "
            f"{self.denoise:g}"
        )


def upscale(latents, size: tuple[int, int], upscaler: str, factor: int):
    """Latents (B, C, h, w) enlarged to the latent size of a picture `size` (width, height)
    px, `factor` px per latent, in fp32 and back to their dtype."""
    import torch.nn.functional as F

    chosen = BY_KEY[upscaler]
    width, height = size
    target = (height // factor, width // factor)
    options = {"antialias": chosen.antialias} if chosen.mode in ("bilinear", "bicubic") else {}
    if chosen.mode in ("bilinear", "bicubic"):
        options["align_corners"] = False
    out = F.interpolate(latents.float(), size=target, mode=chosen.mode, **options)
    return out.to(latents.dtype)
