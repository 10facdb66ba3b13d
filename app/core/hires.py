"""Hires fix, as AUTOMATIC1111 and Forge run it ("Hires. fix") and ComfyUI users build it (an
upscale between two samplers): the picture drawn at the first size, enlarged, and a second
image-to-image pass at the final size that redraws the last `denoise` of a schedule.

The second pass runs the denoiser and the VAE at the final size, the classic place an SDXL VAE
overflows in fp16 although the first size was fine; so a check of such an image runs at the
final size (`final_size`).

Upscalers: the latent ones, by A1111's names and modes (its `latent_upscale_modes`: "Latent" is
bilinear, "Latent (antialiased)" bilinear with antialiasing, and so on), ComfyUI's LatentUpscale
methods read as the same; and the pixel ones that need no model file: A1111's Lanczos and
Nearest (Pillow on the 8-bit picture, as A1111 resizes) and ComfyUI's ImageScale methods after a
VAEDecode (lanczos as A1111's, the others torch's interpolation of the picture in [0, 1]). A
pixel upscaler decodes the first picture, enlarges it (`enlarge`) and encodes it again with the
VAE at the final size, so the VAE's encoder runs there too, and the check probes it. An upscaler
that is a model file of its own (ESRGAN, 4x-UltraSharp, SwinIR, ...) is refused, naming Lanczos.

Plain data; torch and Pillow are imported inside `upscale` and `enlarge`.
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
    words: str  # A1111's name, as the PNG writes it (where it has none, ComfyUI's + "(pixels)")
    mode: str  # torch.nn.functional.interpolate's mode, or Pillow's filter where `pillow`
    antialias: bool = False
    pixels: bool = False  # enlarges the decoded picture, which the VAE encodes again
    pillow: bool = False  # on the 8-bit picture with Pillow, as A1111 resizes


UPSCALERS: tuple[Upscaler, ...] = (
    Upscaler("latent", "Latent", "bilinear"),
    Upscaler("latent_antialiased", "Latent (antialiased)", "bilinear", True),
    Upscaler("latent_bicubic", "Latent (bicubic)", "bicubic"),
    Upscaler("latent_bicubic_antialiased", "Latent (bicubic antialiased)", "bicubic", True),
    Upscaler("latent_nearest", "Latent (nearest)", "nearest"),
    Upscaler("latent_nearest_exact", "Latent (nearest-exact)", "nearest-exact"),
    Upscaler("latent_area", "Latent (area)", "area"),  # ComfyUI's "area"
    Upscaler("lanczos", "Lanczos", "lanczos", pixels=True, pillow=True),
    Upscaler("nearest", "Nearest", "nearest", pixels=True, pillow=True),
    # ComfyUI's ImageScale / ImageScaleBy methods on the decoded picture (its lanczos is the
    # Lanczos above: Pillow on the 8-bit picture).
    Upscaler("pixel_bilinear", "Bilinear (pixels)", "bilinear", pixels=True),
    Upscaler("pixel_bicubic", "Bicubic (pixels)", "bicubic", pixels=True),
    Upscaler("pixel_nearest_exact", "Nearest-exact (pixels)", "nearest-exact", pixels=True),
    Upscaler("pixel_area", "Area (pixels)", "area", pixels=True),
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
# ComfyUI's ImageScale methods, as `explain` records them ("lanczos (pixels)").
_COMFY_PIXELS = {
    "lanczos": "lanczos",
    "bilinear": "pixel_bilinear",
    "bicubic": "pixel_bicubic",
    "nearest-exact": "pixel_nearest_exact",
    "area": "pixel_area",
}
# A1111's "None": no upscaler of its own, so its resize ends in Pillow's Lanczos (A1111's
# `Upscaler.upscale` finishes every upscale so): HalfSafe's Lanczos.
_A1111_NONE = "none"
# Upscalers that are model files of their own (A1111's ESRGAN, SwinIR, LDSR, ScuNET, DAT and the
# files users add, named by their stem; ComfyUI's UpscaleModelLoader, by the file's name), by
# the words their names hold.
_MODEL_WORDS = (
    "esrgan", "swinir", "dat", "ldsr", "scunet", "ultrasharp", "hat", "x-", "4x", "2x", "8x",
    "x4", "x2", "x8", ".pth", ".pt", ".safetensors", ".ckpt", ".bin",
)  # fmt: skip


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
    if folded == _A1111_NONE:
        return "lanczos"
    if folded.endswith(" (pixels)"):
        return _COMFY_PIXELS.get(folded.removesuffix(" (pixels)").strip())
    return _COMFY.get(folded)


def enlarges_pixels(key: str) -> bool:
    """Whether the upscaler `key` enlarges the decoded picture (the VAE encodes it again)."""
    return BY_KEY[key].pixels


def refusal(words: str) -> str:
    """The sentence for an upscaler HalfSafe does not run, naming the closest it does."""
    folded = words.lower()
    if folded == "bislerp":
        return f"HalfSafe does not run the upscale method {words}; the closest it runs is Latent."
    if any(word in folded for word in _MODEL_WORDS):
        return (
            f"HalfSafe does not run the upscaler {words} (a model file of its own that enlarges "
            "the decoded picture); the closest it runs is Lanczos."
        )
    return f"HalfSafe does not know the upscaler {words}; the closest it runs is Latent."


def is_model_upscaler(words: str) -> bool:
    """Whether an upscaler a tool names is a model file of its own (ESRGAN, 4x-UltraSharp,
    ...): it enlarges the decoded picture, which the VAE encodes again, as a pixel upscaler."""
    return key_for(words) is None and any(word in words.lower() for word in _MODEL_WORDS)


@dataclass(frozen=True)
class Hires:
    """A job's second pass: `scale` times the first size (1: no second pass), `steps` of it
    run (0: as many as the first pass's), redrawing the last `denoise` of the schedule, from
    latents enlarged by `upscaler` (or the decoded picture enlarged and encoded again, for a
    pixel upscaler)."""

    scale: float = 1.0
    steps: int = 0
    denoise: float = DENOISE_DEFAULT
    upscaler: str = DEFAULT

    @property
    def on(self) -> bool:
        return self.scale > 1.0

    @property
    def pixels(self) -> bool:
        """Whether the second pass starts from the decoded first picture enlarged (a pixel
        upscaler), which the VAE's encoder encodes again at the final size."""
        return self.on and self.upscaler in BY_KEY and BY_KEY[self.upscaler].pixels

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

    def checked_size(self, width: int, height: int) -> tuple[int, int]:
        """The final picture's (width, height), this pass included; HalfSafeError where it
        is past the pixels HalfSafe reads back as a picture (`limits.MAX_PIXELS`, as explain's
        reader and the input pictures are bounded): 4096x4096 upscaled 4x would be 268 million
        pixels, hours of work and tens of GB."""
        from app.core.limits import MAX_PIXELS

        wide, high = self.final_size(width, height) if self.on else (width, height)
        if wide * high > MAX_PIXELS:
            upscaled = f" upscaled {self.scale:g}x by the hires fix" if self.on else ""
            raise HalfSafeError(
                f"{width}x{height}{upscaled} is a {wide}x{high} picture "
                f"({wide * high / 1e6:.0f} million pixels), past the "
                f"{MAX_PIXELS // 1_000_000} million HalfSafe draws: lower the size"
                f"{' or the upscale' if self.on else ''}."
            )
        return wide, high

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


def enlarge(pixels, size: tuple[int, int], upscaler: str):
    """Decoded pictures (B, C, H, W) in [-1, 1] enlarged to `size` (width, height) px by the
    pixel upscaler `upscaler`, as the tool that names it does: A1111's Lanczos and Nearest (and
    ComfyUI's lanczos) with Pillow on the 8-bit picture (all NaN where the picture held a
    non-finite pixel), ComfyUI's other methods with torch's interpolation of the picture
    clamped to [0, 1], as its VAEDecode leaves it. Returns fp32 pixels in [-1, 1] on the
    pictures' device; no side effects."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    chosen = BY_KEY[upscaler]
    if not chosen.pixels:
        raise ValueError(f"{upscaler} is a latent upscaler")
    width, height = size
    unit = ((pixels.float() + 1.0) / 2.0).clamp(0.0, 1.0)
    if not chosen.pillow:
        return F.interpolate(unit, size=(height, width), mode=chosen.mode) * 2.0 - 1.0
    from PIL import Image

    resample = Image.Resampling.LANCZOS if chosen.mode == "lanczos" else Image.Resampling.NEAREST
    # As A1111 and ComfyUI make the 8-bit picture: 255 times, truncated.
    eight = (torch.nan_to_num(unit, nan=0.0) * 255.0).to(torch.uint8).permute(0, 2, 3, 1).cpu()
    out = []
    for picture in eight.numpy():
        channels = [
            Image.fromarray(np.ascontiguousarray(picture[..., c]), "L").resize(
                (width, height), resample=resample
            )
            for c in range(picture.shape[-1])
        ]
        out.append(np.stack([np.asarray(c) for c in channels], axis=0))
    enlarged = torch.from_numpy(np.stack(out)).float() / 255.0 * 2.0 - 1.0
    # A picture that went non-finite stays so (the 8-bit round trip would hide it), so that
    # the failure reaches the final image, where the watch and the pixel diagnosis see it.
    finite = torch.isfinite(pixels).flatten(1).all(1).cpu().view(-1, 1, 1, 1)
    return torch.where(finite, enlarged, torch.nan).to(pixels.device)
