"""Flux.1 dev and schnell: CLIP-L pooled + T5 sequence, a `transformer` on packed 2x2 patches of
a 16-channel latent by flow matching, guidance as an embedding instead of a CFG batch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.core.families.base import (
    Family,
    FamilyId,
    LatentFormat,
    ShiftedSigmas,
    input_channels_problem,
    packed_noise,
)

PROBE_GUIDANCE = 3.5  # the check's distilled guidance (Flux.1 dev's guidance embedding)

# Flux.1's VAE (also Chroma's and Z-Image's): 16 channels; the preview fits its colours.
FLUX_LATENT = LatentFormat(channels=16)


@dataclass(frozen=True)
class FluxFamily(ShiftedSigmas, Family):
    """Flux.1 dev and schnell: CLIP-L gives a pooled vector, T5 the token sequence; a
    `transformer` denoises 2x2 patches of a 16-channel latent by flow matching; dev takes the
    guidance scale as an embedding (one batch, no negative prompt), schnell takes none."""

    id = FamilyId.FLUX
    title = "Flux.1"
    architectures = {"flux": "Flux.1", "flux-dev": "Flux.1 dev", "flux-schnell": "Flux.1 schnell"}
    latent = FLUX_LATENT
    transformer_class = "FluxTransformer2DModel"

    denoiser: str = "transformer"
    sample_argument: str = "hidden_states"

    @staticmethod
    def max_sequence_length(pipe) -> int:
        # Flux.1 dev reads 512 T5 tokens, schnell 256 (the reference pipelines' defaults).
        return 512 if pipe.transformer.config.guidance_embeds else 256

    def encode(self, pipe, prompt: str, negative: str, device, guidance: bool) -> dict[str, Any]:
        embeds, pooled, _ = pipe.encode_prompt(
            prompt=prompt,
            prompt_2=None,
            device=device,
            num_images_per_prompt=1,
            max_sequence_length=self.max_sequence_length(pipe),
        )
        return {"prompt_embeds": embeds, "pooled_prompt_embeds": pooled}

    def encoder_outputs(self, pipe, tensors: dict[str, Any]) -> dict[str, list[Any]]:
        return {
            "text_encoder": [tensors["pooled_prompt_embeds"]],
            "text_encoder_2": [tensors["prompt_embeds"]],
        }

    def denoiser_inputs(self, conditioning: dict[str, Any], size: int, device) -> dict[str, Any]:
        import torch

        embeds = conditioning["prompt_embeds"]
        return {
            "encoder_hidden_states": embeds,
            "pooled_projections": conditioning["pooled_prompt_embeds"],
            "txt_ids": torch.zeros(embeds.shape[1], 3, device=device),
        }

    def probe_denoise(self, pipe, conditioning, size: int, device, timesteps) -> Any:
        """Flow-matching Euler steps through `timesteps` (x + (sigma_next - sigma) * v, the
        last step to sigma 0), one batch with the guidance embedding; returns (1, 16, h, w)."""
        import torch
        from diffusers import FluxPipeline

        transformer = pipe.transformer
        side = size // self.latent_factor(pipe)
        channels = transformer.config.in_channels // 4
        generator = torch.Generator().manual_seed(0)
        noise = torch.randn((1, channels, side, side), generator=generator)
        latents = FluxPipeline._pack_latents(noise, 1, channels, side, side).to(device)
        image_ids = FluxPipeline._prepare_latent_image_ids(
            1, side // 2, side // 2, device, torch.float32
        )
        extra = self.denoiser_inputs(conditioning, size, device)
        if transformer.config.guidance_embeds:
            extra["guidance"] = torch.full([1], PROBE_GUIDANCE, device=device)
        sigmas = [float(t) / 1000.0 for t in timesteps] + [0.0]
        for sigma, following in zip(sigmas[:-1], sigmas[1:], strict=True):
            velocity = transformer(
                hidden_states=latents,
                timestep=torch.full([1], sigma, device=device),
                img_ids=image_ids,
                **extra,
            ).sample.float()
            latents = latents + (following - sigma) * velocity
        return FluxPipeline._unpack_latents(latents, size, size, self.latent_factor(pipe))

    def text_to_image_problem(self, pipeline) -> str | None:
        return input_channels_problem(
            pipeline, "latent_channels", 4, " (a Fill, Depth or Canny model?)"
        )

    def noise(self, pipeline, seeds: list[int], height: int, width: int):
        from diffusers import FluxPipeline

        return packed_noise(self, pipeline, FluxPipeline._pack_latents, (), seeds, height, width)

    def call_arguments(self, cfg: float) -> dict[str, Any]:
        # dev: the guidance embedding's scale (schnell ignores it); never a negative batch.
        return {"guidance_scale": cfg}

    def guidance_parameters(self, cfg: float) -> list[tuple[str, Any]]:
        # As Forge writes Flux's: no CFG batch (scale 1), the embedding's scale beside it.
        return [("CFG scale", "1"), ("Distilled CFG Scale", f"{cfg:g}")]

    def clamped_blocks(self, denoiser) -> list[Any]:
        # diffusers clips the fp16 residual stream of every double and single block to +-65504
        # by hand (as ComfyUI does): an overflow inside a block leaves it saturated, not inf.
        return [*denoiser.transformer_blocks, *denoiser.single_transformer_blocks]

    def image_latents(self, pipeline, latents, height: int, width: int):
        from diffusers import FluxPipeline

        return FluxPipeline._unpack_latents(latents, height, width, self.latent_factor(pipeline))
