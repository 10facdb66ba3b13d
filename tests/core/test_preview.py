"""The live preview shows a latent in its picture's colours: for every family, the preview of a
latent is close to what the VAE decodes it to, channel for channel (16-channel latents were
shown through SD1.5's four colour rows, which ignored 12 channels)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from app.core.families import FAMILIES, family_of
from app.core.families.sd import SD_LATENT
from app.core.generation.preview import LatentColours, colours_for, latent_preview
from tests.support import tiny_models

TRANSFORMER_PIPELINES = {
    "flux": tiny_models.build_tiny_flux_pipeline,
    "chroma": tiny_models.build_tiny_chroma_pipeline,
    "sd3": tiny_models.build_tiny_sd3_pipeline,
    "zimage": tiny_models.build_tiny_zimage_pipeline,
    "qwenimage": tiny_models.build_tiny_qwenimage_pipeline,
}
CELLS = 12


def _decoded_and_previews(family, vae, colours):
    """A latent the fit never saw, the colours its cells decode to (0..255), and its preview."""
    generator = torch.Generator().manual_seed(123)
    latent = torch.randn((1, family.latent.channels, CELLS, CELLS), generator=generator)
    latent = latent * 0.8 + 0.3
    with torch.no_grad():
        pixels = family.decode(vae, latent).float()
    factor = pixels.shape[-1] // CELLS
    cells = pixels.reshape(1, 3, CELLS, factor, CELLS, factor).mean(dim=(3, 5))[0]
    decoded = np.clip(cells.permute(1, 2, 0).numpy() / 2 + 0.5, 0, 1) * 255
    return decoded, np.asarray(latent_preview(latent[0], colours), dtype=np.float32)


@pytest.mark.parametrize("name", sorted(TRANSFORMER_PIPELINES))
def test_a_16_channel_preview_shows_the_colours_the_vae_decodes(name):
    pipeline = TRANSFORMER_PIPELINES[name]()
    family = family_of(pipeline)
    assert family.latent.channels == 16 == len(colours_for(family, pipeline.vae).factors)

    colours = colours_for(family, pipeline.vae)
    decoded, preview = _decoded_and_previews(family, pipeline.vae, colours)
    sd_rows = LatentColours(SD_LATENT.rgb_factors or (), SD_LATENT.rgb_bias, fitted=False)
    _, old_preview = _decoded_and_previews(family, pipeline.vae, sd_rows)

    error = float(np.abs(preview - decoded).mean())
    old_error = float(np.abs(old_preview - decoded).mean())
    agreement = float(np.corrcoef(preview.ravel(), decoded.ravel())[0, 1])
    assert colours.fitted
    assert agreement > 0.5, agreement
    assert error < old_error / 3, (error, old_error)


def test_a_family_with_published_colours_uses_them_without_a_decode():
    for family in FAMILIES:
        if family.latent.rgb_factors is None:
            continue
        colours = colours_for(family, vae=None)  # no VAE needed: nothing is decoded
        assert colours is not None and not colours.fitted
        assert len(colours.factors) == family.latent.channels


def test_a_vae_that_gives_no_finite_pixels_leaves_the_preview_grey():
    pipeline = tiny_models.build_tiny_flux_pipeline()
    family = family_of(pipeline)
    with torch.no_grad():
        pipeline.vae.decoder.conv_out.bias.fill_(float("nan"))
    assert colours_for(family, pipeline.vae) is None

    latent = torch.zeros((16, 4, 4))
    latent[0] = 1.0
    pixels = np.asarray(latent_preview(latent, None))
    assert (pixels[..., 0] == pixels[..., 1]).all() and (pixels[..., 1] == pixels[..., 2]).all()


def test_nan_in_the_latent_shows_black():
    family = FAMILIES[-1]
    colours = colours_for(family, vae=None)
    latent = torch.zeros((family.latent.channels, 4, 4))
    latent[:, 1, 2] = float("nan")
    pixels = np.asarray(latent_preview(latent, colours))
    assert (pixels[1, 2] == 0).all() and (pixels[0, 0] > 0).any()
