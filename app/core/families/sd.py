"""Stable Diffusion 1.x and 2.x: one CLIP text encoder, a UNet with the CFG batch (epsilon or
v prediction), a 4-channel VAE."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.core.families.base import Family, FamilyId, LatentFormat, prompt_tensors
from app.core.images.pictures import Mode

PROBE_CFG = 7.0  # the check's classifier-free guidance scale

# A linear map from SD1.x/2.x latents to RGB, a published approximation fitted to their VAE's
# output (good enough for a thumbnail; no VAE call needed).
SD_LATENT = LatentFormat(
    channels=4,
    rgb_factors=(
        (0.3512, 0.2297, 0.3227),
        (0.3250, 0.4974, 0.2350),
        (-0.2829, 0.1762, 0.2721),
        (-0.2120, -0.2616, -0.7177),
    ),
)


@dataclass(frozen=True)
class StableDiffusionFamily(Family):
    """Stable Diffusion 1.x/2.x: one CLIP text encoder, a UNet, a VAE."""

    id = FamilyId.SD
    title = "Stable Diffusion 1.x/2.x"
    architectures = {"sd1": "Stable Diffusion 1.x", "sd2": "Stable Diffusion 2.x"}
    trainer_words = (
        (r"stable-diffusion-v?2|^sd-?v?2", "sd2"),
        (r"stable-diffusion-v?1|^sd-?v?1", "sd1"),
    )
    picture_pipelines = {
        Mode.IMAGE: "StableDiffusionImg2ImgPipeline",
        Mode.INPAINT: "StableDiffusionInpaintPipeline",
    }
    latent = SD_LATENT

    def owns(self, pipeline) -> bool:
        return getattr(pipeline, "unet", None) is not None and (
            getattr(pipeline, "text_encoder_2", None) is None
        )

    takes_clip_skip = True

    def encode(
        self, pipe, prompt: str, negative: str, device, guidance: bool, clip_skip: int = 1
    ) -> dict[str, Any]:
        """The prompt as the pipeline's `__call__` takes it: prompt_embeds and, with guidance,
        negative_prompt_embeds (batch 1 each), read as AUTOMATIC1111 reads it (emphasis, BREAK,
        77-token chunks, Clip skip: `app.core.encoders.prompts`)."""
        from app.core.encoders.prompts import encode_sd

        return encode_sd(pipe, prompt, negative, device, guidance, clip_skip)

    def encoder_outputs(self, pipe, tensors: dict[str, Any]) -> dict[str, list[Any]]:
        """Which parts of the encoded tensors each text encoder produced."""
        return {"text_encoder": prompt_tensors(tensors)}

    def denoiser_inputs(self, conditioning: dict[str, Any], size: int, device) -> dict[str, Any]:
        """Keyword arguments of one UNet call on the CFG batch (negative first), beyond the
        latents and the timestep."""
        import torch

        text = torch.cat([conditioning["negative_prompt_embeds"], conditioning["prompt_embeds"]])
        return {"encoder_hidden_states": text}

    def probe_denoise(self, pipe, conditioning, size: int, device, timesteps) -> Any:
        """Euler steps through `timesteps` from seeded noise, with the CFG batch (negative
        first); returns the latents (1, C, h, w) the VAE decodes."""
        import torch
        from diffusers import EulerDiscreteScheduler

        unet = pipe.unet
        scheduler: Any = EulerDiscreteScheduler.from_config(pipe.scheduler.config)
        scheduler.set_timesteps(timesteps=[int(t) for t in timesteps], device=device)
        side = size // self.latent_factor(pipe)
        generator = torch.Generator().manual_seed(0)
        latents = torch.randn((1, 4, side, side), generator=generator)
        latents = latents.to(device) * scheduler.init_noise_sigma
        extra = self.denoiser_inputs(conditioning, size, device)
        for t in scheduler.timesteps:
            x = scheduler.scale_model_input(torch.cat([latents] * 2), t)
            if unet.config.in_channels > 4:  # inpainting: an empty mask and masked image
                pad = unet.config.in_channels - 4
                x = torch.cat([x, x.new_zeros(2, pad, side, side)], dim=1)
            noise = unet(x, t, **extra).sample.float()
            uncond, cond = noise.chunk(2)
            latents = scheduler.step(uncond + PROBE_CFG * (cond - uncond), t, latents).prev_sample
        return latents

    def text_to_image_problem(self, pipeline) -> str | None:
        """Why this model cannot make text-to-image pictures (None: it can)."""
        channels = pipeline.unet.config.in_channels
        if channels != 4:
            return (
                f"this is an inpainting model ({channels} input channels); text-to-image "
                "needs a regular model."
            )
        return None

    def noise(self, pipeline, seeds: list[int], height: int, width: int):
        """Initial latents as the pipeline takes them, from per-image CPU generators (so a seed
        means the same image on every device); returns (latents, generators)."""
        import torch

        factor = self.latent_factor(pipeline)
        shape = (1, pipeline.unet.config.in_channels, height // factor, width // factor)
        generators = [torch.Generator().manual_seed(seed) for seed in seeds]
        return torch.cat([torch.randn(shape, generator=g) for g in generators]), generators
