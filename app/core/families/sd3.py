"""Stable Diffusion 3 and 3.5 (Large, Medium): CLIP-L, CLIP-G and T5, an MMDiT `transformer` on
2x2 patches of a 16-channel latent, flow matching with the CFG batch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.core.families.base import (
    Family,
    FamilyId,
    FlowMatching,
    LatentFormat,
    input_channels_problem,
    prompt_tensors,
)

PROBE_SD3_CFG = 4.5  # the check's guidance for SD3.5 (its reference pipelines use 3.5 to 4.5)

# SD3.x's own 16-channel VAE; the preview fits its colours.
SD3_LATENT = LatentFormat(channels=16)


@dataclass(frozen=True)
class SD3Family(FlowMatching, Family):
    """Stable Diffusion 3 / 3.5 (large and medium): CLIP-L and CLIP-G give token features side
    by side and a pooled vector each, T5-XXL the longer token sequence after them; an MMDiT
    `transformer` denoises 2x2 patches of a 16-channel latent by flow matching, with the CFG
    batch (negative first) as SD does."""

    id = FamilyId.SD3
    title = "Stable Diffusion 3.x"
    architectures = {"sd3": "Stable Diffusion 3.x"}
    latent = SD3_LATENT
    transformer_class = "SD3Transformer2DModel"

    denoiser: str = "transformer"
    sample_argument: str = "hidden_states"
    max_sequence_length: int = 256  # T5 tokens, the reference pipeline's default

    def encode(self, pipe, prompt: str, negative: str, device, guidance: bool) -> dict[str, Any]:
        embeds, negative_embeds, pooled, negative_pooled = pipe.encode_prompt(
            prompt=prompt,
            prompt_2=None,
            prompt_3=None,
            device=device,
            num_images_per_prompt=1,
            do_classifier_free_guidance=guidance,
            negative_prompt=negative,
            max_sequence_length=self.max_sequence_length,
        )
        tensors = {
            "prompt_embeds": embeds,
            "negative_prompt_embeds": negative_embeds,
            "pooled_prompt_embeds": pooled,
            "negative_pooled_prompt_embeds": negative_pooled,
        }
        return {k: v for k, v in tensors.items() if v is not None}

    def encoder_outputs(self, pipe, tensors: dict[str, Any]) -> dict[str, list[Any]]:
        clip_tokens = pipe.tokenizer_max_length
        first = pipe.text_encoder.config
        second = pipe.text_encoder_2.config
        hidden = prompt_tensors(tensors)
        pooled = [
            tensors[k]
            for k in ("pooled_prompt_embeds", "negative_pooled_prompt_embeds")
            if k in tensors
        ]
        wide, pooled_wide = first.hidden_size, first.projection_dim
        outputs = {
            "text_encoder": [h[:, :clip_tokens, :wide] for h in hidden]
            + [p[..., :pooled_wide] for p in pooled],
            "text_encoder_2": [h[:, :clip_tokens, wide : wide + second.hidden_size] for h in hidden]
            + [p[..., pooled_wide:] for p in pooled],
        }
        if getattr(pipe, "text_encoder_3", None) is not None:
            outputs["text_encoder_3"] = [h[:, clip_tokens:] for h in hidden]
        return outputs

    def denoiser_inputs(self, conditioning: dict[str, Any], size: int, device) -> dict[str, Any]:
        import torch

        return {
            "encoder_hidden_states": torch.cat(
                [conditioning["negative_prompt_embeds"], conditioning["prompt_embeds"]]
            ),
            "pooled_projections": torch.cat(
                [
                    conditioning["negative_pooled_prompt_embeds"],
                    conditioning["pooled_prompt_embeds"],
                ]
            ),
        }

    def probe_timesteps(self, model, steps: int, scheduler: str, size: int) -> list[float]:
        """The first, middle and last timestep of StableDiffusion3Pipeline's flow-matching
        schedule at the user's step count (shifted as its scheduler config says)."""
        schedule = self.make_scheduler(scheduler, model.pipeline, None)
        schedule.set_timesteps(max(2, steps))
        timesteps = [float(t) for t in schedule.timesteps]
        picked = {timesteps[0], timesteps[len(timesteps) // 2], timesteps[-1]}
        return sorted((round(t, 2) for t in picked), reverse=True)

    def probe_denoise(self, pipe, conditioning, size: int, device, timesteps) -> Any:
        """Flow-matching Euler steps through `timesteps` with the CFG batch; returns the
        latents (1, 16, h, w)."""
        import torch

        transformer = pipe.transformer
        side = size // self.latent_factor(pipe)
        generator = torch.Generator().manual_seed(0)
        channels = transformer.config.in_channels
        latents = torch.randn((1, channels, side, side), generator=generator).to(device)
        extra = self.denoiser_inputs(conditioning, size, device)
        sigmas = [float(t) / 1000.0 for t in timesteps] + [0.0]
        for sigma, following in zip(sigmas[:-1], sigmas[1:], strict=True):
            velocity = transformer(
                hidden_states=torch.cat([latents] * 2),
                timestep=torch.full([2], sigma * 1000.0, device=device),
                **extra,
            ).sample.float()
            uncond, cond = velocity.chunk(2)
            latents = latents + (following - sigma) * (uncond + PROBE_SD3_CFG * (cond - uncond))
        return latents

    def text_to_image_problem(self, pipeline) -> str | None:
        return input_channels_problem(pipeline, "latent_channels", 1)

    def noise(self, pipeline, seeds: list[int], height: int, width: int):
        import torch

        factor = self.latent_factor(pipeline)
        shape = (1, pipeline.transformer.config.in_channels, height // factor, width // factor)
        generators = [torch.Generator().manual_seed(seed) for seed in seeds]
        return torch.cat([torch.randn(shape, generator=g) for g in generators]), generators
