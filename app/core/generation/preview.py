"""The live preview: a latent shown in its picture's colours without running the VAE.

A latent cell maps to the colour of the pixels it decodes to by a linear map (one RGB row per
latent channel, plus a bias). Where the family's latent format publishes that map (SD1.x/2.x,
SDXL), it is used as it is. Otherwise (the 16-channel VAEs of Flux.1, SD3.x, Z-Image and
Qwen-Image) the map is fitted once to the loaded model's own VAE: seeded latents are decoded,
each cell's decoded pixels averaged, and the map that best predicts them found by least squares.
That costs one small decode per loaded model, made on the first preview.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FIT_CELLS = 16  # latent cells along each side of the fitting batch
FIT_IMAGES = 2
_RIDGE = 1e-3  # keeps the least squares well posed when a channel barely varies


@dataclass(frozen=True)
class LatentColours:
    """latent (C, h, w) -> RGB in [-1, 1]: rgb = factors^T . latent + bias."""

    factors: tuple[tuple[float, float, float], ...]  # one (r, g, b) row per latent channel
    bias: tuple[float, float, float]
    fitted: bool  # True: fitted to the loaded VAE; False: the family's published map


def colours_for(family, vae) -> LatentColours | None:
    """The preview colours of `family`'s latents: its published map, else one fitted to `vae`
    (a decode of FIT_IMAGES x FIT_CELLS^2 cells on the VAE's device, in its dtype, run as a
    stage of its own by the caller: `run.stage_run.running`). None when the VAE gives no finite
    pixels to fit to (an fp16 overflow): the preview is then grey."""
    latent = family.latent
    if latent.rgb_factors is not None:
        return LatentColours(latent.rgb_factors, latent.rgb_bias, fitted=False)
    return fit_colours(family, vae)


def fit_colours(family, vae) -> LatentColours | None:
    """The linear map from `family`'s latents (as its pipeline holds them: scaled, shifted or
    normalised) to the mean colour of the pixels each latent cell decodes to."""
    import torch

    channels = family.latent.channels
    generator = torch.Generator().manual_seed(0)
    latents = torch.randn((FIT_IMAGES, channels, FIT_CELLS, FIT_CELLS), generator=generator)
    from app.core.precision.streaming import device_of

    device = device_of(vae)
    # The colours only: a VAE that decodes RGBA also makes an alpha, which has no colour.
    pixels = family.decode(vae, latents.to(device))[:, :3].float().cpu()
    factor = pixels.shape[-1] // FIT_CELLS
    if factor < 1 or pixels.shape[-2] != FIT_CELLS * factor:
        return None
    cells = pixels.reshape(FIT_IMAGES, 3, FIT_CELLS, factor, FIT_CELLS, factor).mean(dim=(3, 5))
    inputs = latents.permute(0, 2, 3, 1).reshape(-1, channels).double()
    targets = cells.permute(0, 2, 3, 1).reshape(-1, 3).double()
    finite = torch.isfinite(targets).all(dim=1)
    if int(finite.sum()) < 2 * (channels + 1):
        return None
    inputs = torch.cat([inputs[finite], torch.ones(int(finite.sum()), 1, dtype=inputs.dtype)], 1)
    targets = targets[finite]
    gram = inputs.T @ inputs + _RIDGE * torch.eye(channels + 1, dtype=inputs.dtype)
    solution = torch.linalg.solve(gram, inputs.T @ targets)  # (channels + 1, 3)
    rows = solution.tolist()
    factors = tuple((r[0], r[1], r[2]) for r in rows[:channels])
    bias = (rows[channels][0], rows[channels][1], rows[channels][2])
    return LatentColours(factors, bias, fitted=True)


def latent_preview(latents: Any, colours: LatentColours | None):
    """A small RGB picture of one latent (C, h, w) array or tensor: 1/8 of the final size (the
    viewer scales it). Cost: a C x 3 matrix product. Without colours, the channels' mean in
    grey; NaN shows as black."""
    import numpy as np
    from PIL import Image

    if hasattr(latents, "detach"):
        latents = latents.detach().float().cpu().numpy()
    latents = np.asarray(latents, dtype=np.float32)
    if latents.ndim == 4:
        latents = latents[0]
    if colours is None:
        grey = latents.mean(axis=0)
        rgb = np.repeat(grey[:, :, None], 3, axis=2)
    else:
        factors = np.asarray(colours.factors, dtype=np.float32)
        used = min(len(factors), latents.shape[0])
        rgb = np.einsum("chw,cr->hwr", latents[:used], factors[:used])
        rgb = rgb + np.asarray(colours.bias, dtype=np.float32)
    rgb = np.nan_to_num(rgb, nan=-1.0)
    unit = np.clip(rgb / 2 + 0.5, 0.0, 1.0)
    return Image.fromarray((unit * 255).round().astype(np.uint8), "RGB")
