"""Z-Image (Turbo and base): a Qwen3 text encoder, a single-stream `transformer` that takes lists,
Flux's 16-channel VAE."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.core.families.base import (
    Family,
    FamilyId,
    ShiftedSigmas,
    input_channels_problem,
    patches_problem,
    prompt_tensors,
)
from app.core.families.flux import FLUX_LATENT


@dataclass(frozen=True)
class ZImageFamily(ShiftedSigmas, Family):
    """Z-Image (Turbo and base): a Qwen3 text encoder whose second-to-last hidden states, the
    prompt's tokens only in the chat format, condition a single-stream `transformer` (refiner
    blocks for the noise and the caption, then joint blocks) on 2x2 patches of Flux's
    16-channel latent, by flow matching. The transformer takes lists (one latent and one
    caption per image) and predicts the negative velocity. CFG is optional: Turbo samples
    without it (CFG scale 1); the pipeline's `guidance_scale` is the user's CFG scale minus 1
    (prompt + s x (prompt - negative))."""

    id = FamilyId.ZIMAGE
    title = "Z-Image"
    architectures = {"zimage": "Z-Image"}
    latent = FLUX_LATENT
    transformer_class = "ZImageTransformer2DModel"

    denoiser: str = "transformer"
    sample_argument: str = "x"
    timestep_argument: str = "t"
    max_sequence_length: int = 512  # Qwen3 tokens, the reference pipeline's default

    def encode(self, pipe, prompt: str, negative: str, device, guidance: bool) -> dict[str, Any]:
        embeds, negative_embeds = pipe.encode_prompt(
            prompt=prompt,
            device=device,
            do_classifier_free_guidance=guidance,
            negative_prompt=negative,
            max_sequence_length=self.max_sequence_length,
        )
        # Each a list of (tokens, width), one per prompt: kept as (1, tokens, width) tensors.
        tensors = {"prompt_embeds": embeds[0][None]}
        if negative_embeds:
            tensors["negative_prompt_embeds"] = negative_embeds[0][None]
        return tensors

    def encoder_outputs(self, pipe, tensors: dict[str, Any]) -> dict[str, list[Any]]:
        return {"text_encoder": prompt_tensors(tensors)}

    def pipeline_embeds(self, embeds: dict[str, Any], batch: int) -> dict[str, Any]:
        # ZImagePipeline takes one (tokens, width) tensor per image, in a list.
        return {k: [v[0]] * batch for k, v in embeds.items()}

    def probe_denoise(self, pipe, conditioning, size: int, device, timesteps) -> Any:
        """Flow-matching Euler steps through `timesteps`, each one transformer call on the
        prompt and the empty negative prompt together (both conditionings are checked), stepped
        with the prompt's prediction as Turbo samples; returns the latents (1, 16, h, w)."""
        import torch

        transformer = pipe.transformer
        side = size // self.latent_factor(pipe)
        generator = torch.Generator().manual_seed(0)
        channels = transformer.config.in_channels
        latents = torch.randn((1, channels, side, side), generator=generator).to(device)
        captions = [
            conditioning["prompt_embeds"][0],
            conditioning["negative_prompt_embeds"][0],
        ]
        sigmas = [float(t) / 1000.0 for t in timesteps] + [0.0]
        for sigma, following in zip(sigmas[:-1], sigmas[1:], strict=True):
            frame = latents[0].unsqueeze(1)  # (C, 1, h, w): one frame
            out = transformer(
                [frame, frame],
                torch.full([2], 1.0 - sigma, device=device),
                captions,
                return_dict=False,
            )[0]
            velocity = -out[0].float().squeeze(1)[None]
            latents = latents + (following - sigma) * velocity
        return latents

    def size_problem(self, pipeline, width: int, height: int) -> str | None:
        return patches_problem(self, pipeline, width, height)

    def text_to_image_problem(self, pipeline) -> str | None:
        return input_channels_problem(pipeline, "latent_channels", 1)

    def noise(self, pipeline, seeds: list[int], height: int, width: int):
        import torch

        factor = self.latent_factor(pipeline)
        channels = pipeline.transformer.config.in_channels
        h, w = 2 * (height // (factor * 2)), 2 * (width // (factor * 2))
        generators = [torch.Generator().manual_seed(seed) for seed in seeds]
        latents = [torch.randn((1, channels, h, w), generator=g) for g in generators]
        return torch.cat(latents), generators

    def call_arguments(self, cfg: float) -> dict[str, Any]:
        return {"guidance_scale": max(cfg - 1.0, 0.0)}
