"""A hires fix's second pass in a generation: the first pass's latents enlarged by a latent
upscaler, or decoded, enlarged as pictures and encoded again at the final size by a pixel one,
then drawn again there (`stages.JobStages` runs it after the first pass)."""

from __future__ import annotations

from dataclasses import replace

from app.core.generation.passes import Conditioning, Picture, SecondPass
from app.core.hires import enlarge, enlarges_pixels, upscale
from app.core.precision import PrecisionPlan
from app.core.run.stage_run import running


def second_pass(
    stages, plan: PrecisionPlan, conditioning: Conditioning, seeds, latents
) -> SecondPass:
    """Hires fix: the first pass's latents (B, C, h, w) enlarged by the request's upscaler
    (a latent one), or decoded, enlarged as pictures and encoded again at the final size (a
    pixel one, `enlarged_picture`), and drawn again at the final size."""
    hires = stages.request.hires
    width, height = stages.request.drawn_size()
    done = SecondPass(None, None)
    if enlarges_pixels(hires.upscaler):
        picture, done = enlarged_picture(stages, plan, latents, (width, height))
    else:
        factor = stages.family.latent_factor(stages.model.pipeline)
        enlarged = upscale(latents, (width, height), hires.upscaler, factor)
        picture = Picture(enlarged, None, None)
    second = replace(
        stages.request,
        width=width,
        height=height,
        steps=hires.call_steps(stages.request.steps),
        strength=hires.denoise,
    )
    stages.stage = "Hires fix"
    try:
        done.latents, done.watch = stages.denoise(plan, conditioning, seeds, picture, second)
    finally:
        stages.stage = "Generating"
    return done


def enlarged_picture(
    stages, plan: PrecisionPlan, latents, size: tuple[int, int]
) -> tuple[Picture, SecondPass]:
    """A pixel upscaler's path, image by image: the first pass's latents decoded by the
    VAE, the picture enlarged to `size` (width, height) px and encoded by the VAE's encoder
    there; with device-side flags of each part going non-finite from finite input."""
    import torch

    hires = stages.request.hires
    encoded, pictures, decode_bad, encode_bad = [], [], [], []
    with running(stages.placed, plan, ["vae"]):
        vae, encoder = stages.placed["vae"], stages.placed["vae_encoder"]
        for index in range(latents.shape[0]):
            stages.progress("Enlarging the picture", index, latents.shape[0])
            stages.cancel.raise_if_cancelled()
            first = latents[index : index + 1]
            pixels = stages.family.decode(vae, first.float())
            picture = enlarge(pixels, size, hires.upscaler).to(stages.device)
            again = stages.family.encode_pixels(encoder, picture)
            decode_bad.append(torch.isfinite(first).all() & ~torch.isfinite(pixels).all())
            encode_bad.append(torch.isfinite(picture).all() & ~torch.isfinite(again).all())
            encoded.append(again.float())
            pictures.append(picture.cpu())
    done = SecondPass(
        None,
        None,
        first_latents=latents,
        enlarged=torch.cat(pictures),
        decode_bad=torch.stack(decode_bad),
        encode_bad=torch.stack(encode_bad),
    )
    return Picture(torch.cat(encoded), None, None), done
