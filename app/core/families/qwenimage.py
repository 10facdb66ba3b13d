"""Qwen-Image: a Qwen2.5-VL text encoder, an MMDiT `transformer` with real CFG, a causal 3D VAE
(Wan 2.1's layout) with per-channel latent statistics."""

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
    patches_problem,
    prompt_tensors,
)

PROBE_QWEN_CFG = 4.0  # the check's guidance for Qwen-Image (QwenImagePipeline's default)

# The Wan 2.1-layout VAE: 16 channels, normalised per channel; the preview fits its colours.
QWENIMAGE_LATENT = LatentFormat(channels=16)


@dataclass(frozen=True)
class QwenImageFamily(ShiftedSigmas, Family):
    """Qwen-Image: a Qwen2.5-VL text encoder whose last hidden states (the prompt's tokens
    after its system instruction) condition an MMDiT `transformer` on packed 2x2 patches of a
    16-channel latent, by flow matching with real CFG (a second call on the negative prompt,
    its result rescaled to the prompt's norm); a causal 3D VAE (one frame per image) with a
    per-channel latent mean and spread."""

    id = FamilyId.QWENIMAGE
    title = "Qwen-Image"
    architectures = {"qwenimage": "Qwen-Image"}
    latent = QWENIMAGE_LATENT
    transformer_class = "QwenImageTransformer2DModel"

    denoiser: str = "transformer"
    sample_argument: str = "hidden_states"
    max_sequence_length: int = 512  # the reference pipeline's default

    def latent_factor(self, pipeline) -> int:
        return 2 ** len(pipeline.vae.temperal_downsample)

    def encode(self, pipe, prompt: str, negative: str, device, guidance: bool) -> dict[str, Any]:
        tensors: dict[str, Any] = {}
        texts = [("", prompt)] + ([("negative_", negative)] if guidance else [])
        for prefix, text in texts:
            embeds, mask = pipe.encode_prompt(
                prompt=text,
                device=device,
                num_images_per_prompt=1,
                max_sequence_length=self.max_sequence_length,
            )
            tensors[prefix + "prompt_embeds"] = embeds
            if mask is not None:  # None: every token counts
                tensors[prefix + "prompt_embeds_mask"] = mask
        return tensors

    def encoder_outputs(self, pipe, tensors: dict[str, Any]) -> dict[str, list[Any]]:
        return {"text_encoder": prompt_tensors(tensors)}

    def pipeline_embeds(self, embeds: dict[str, Any], batch: int) -> dict[str, Any]:
        # QwenImagePipeline keeps its latents in the embeddings' dtype: fp32 keeps the sampler's
        # latents in fp32 whatever the text encoder ran in (the transformer casts its inputs).
        import torch

        repeated = super().pipeline_embeds(embeds, batch)
        return {k: v.to(torch.float32) if v.is_floating_point() else v for k, v in repeated.items()}

    def probe_denoise(self, pipe, conditioning, size: int, device, timesteps) -> Any:
        """Flow-matching Euler steps through `timesteps`, each a call on the prompt and one
        on the empty negative prompt combined by CFG and rescaled to the prompt's norm, as
        QwenImagePipeline runs them; returns the latents (1, 16, h, w)."""
        import torch
        from diffusers import QwenImagePipeline

        transformer = pipe.transformer
        side = size // self.latent_factor(pipe)
        channels = transformer.config.in_channels // 4
        generator = torch.Generator().manual_seed(0)
        noise = torch.randn((1, channels, side, side), generator=generator)
        latents = QwenImagePipeline._pack_latents(noise, 1, channels, side, side).to(device)
        shapes = [[(1, side // 2, side // 2)]]
        calls = [
            {
                "encoder_hidden_states": conditioning[prefix + "prompt_embeds"],
                "encoder_hidden_states_mask": conditioning.get(prefix + "prompt_embeds_mask"),
            }
            for prefix in ("", "negative_")
        ]
        sigmas = [float(t) / 1000.0 for t in timesteps] + [0.0]
        for sigma, following in zip(sigmas[:-1], sigmas[1:], strict=True):
            t = torch.full([1], sigma, device=device)
            cond, uncond = (
                transformer(
                    hidden_states=latents, timestep=t, img_shapes=shapes, **call, return_dict=False
                )[0].float()
                for call in calls
            )
            combined = uncond + PROBE_QWEN_CFG * (cond - uncond)
            scale = cond.norm(dim=-1, keepdim=True) / combined.norm(dim=-1, keepdim=True)
            latents = latents + (following - sigma) * (combined * scale)
        return self.image_latents(pipe, latents, size, size)

    def size_problem(self, pipeline, width: int, height: int) -> str | None:
        return patches_problem(self, pipeline, width, height)

    def text_to_image_problem(self, pipeline) -> str | None:
        return input_channels_problem(pipeline, "z_dim", 4)

    def noise(self, pipeline, seeds: list[int], height: int, width: int):
        from diffusers import QwenImagePipeline

        # The 3D VAE's latents carry a frame axis of one.
        return packed_noise(
            self, pipeline, QwenImagePipeline._pack_latents, (1,), seeds, height, width
        )

    def call_arguments(self, cfg: float) -> dict[str, Any]:
        return {"true_cfg_scale": cfg}  # real CFG when a negative prompt is given (cfg > 1)

    def image_latents(self, pipeline, latents, height: int, width: int):
        from diffusers import QwenImagePipeline

        factor = self.latent_factor(pipeline)
        frames = QwenImagePipeline._unpack_latents(latents, height, width, factor)
        return frames[:, :, 0]  # (B, C, h, w): the one frame

    def clamped_blocks(self, denoiser) -> list[Any]:
        # diffusers clips each block's fp16 image and text streams to +-65504.
        return list(denoiser.transformer_blocks)

    def decode(self, vae, latents):
        """Undo the per-channel normalisation and decode the one frame."""
        import torch

        channels = vae.config.z_dim
        mean = torch.tensor(vae.config.latents_mean, device=latents.device).view(1, channels, 1, 1)
        std = torch.tensor(vae.config.latents_std, device=latents.device).view(1, channels, 1, 1)
        z = (latents.float() * std + mean).unsqueeze(2)
        return vae.decode(z.to(vae.dtype)).sample[:, :, 0]
