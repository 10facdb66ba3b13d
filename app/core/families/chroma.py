"""Chroma: Flux-shaped, T5 its only text encoder, modulation from a small network, real CFG."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.core.families.base import FamilyId, prompt_tensors
from app.core.families.flux import FluxFamily

PROBE_CHROMA_CFG = 5.0  # the check's guidance for Chroma (ChromaPipeline's default)


@dataclass(frozen=True)
class ChromaFamily(FluxFamily):
    """Chroma: Flux-shaped (packed 2x2 patches of a 16-channel latent, double and single
    blocks, flow matching) with T5 as its only text encoder, its modulation computed by a small
    network instead of a guidance embedding, and real CFG: a second call on the negative prompt,
    each with T5's attention mask."""

    id = FamilyId.CHROMA
    title = "Chroma"
    architectures = {"chroma": "Chroma"}
    transformer_class = "ChromaTransformer2DModel"

    @staticmethod
    def max_sequence_length(pipe) -> int:
        return 512

    def encode(self, pipe, prompt: str, negative: str, device, guidance: bool) -> dict[str, Any]:
        embeds, _, mask, negative_embeds, _, negative_mask = pipe.encode_prompt(
            prompt=prompt,
            negative_prompt=negative,
            device=device,
            num_images_per_prompt=1,
            do_classifier_free_guidance=guidance,
            max_sequence_length=self.max_sequence_length(pipe),
        )
        tensors = {
            "prompt_embeds": embeds,
            "prompt_attention_mask": mask,
            "negative_prompt_embeds": negative_embeds,
            "negative_prompt_attention_mask": negative_mask,
        }
        return {k: v for k, v in tensors.items() if v is not None}

    def encoder_outputs(self, pipe, tensors: dict[str, Any]) -> dict[str, list[Any]]:
        return {"text_encoder": prompt_tensors(tensors)}

    def probe_denoise(self, pipe, conditioning, size: int, device, timesteps) -> Any:
        """Flow-matching Euler steps through `timesteps`, each a call on the prompt and one on
        the empty negative prompt combined by CFG, as ChromaPipeline runs them."""
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
        calls = []
        for prefix in ("negative_", ""):
            embeds = conditioning[prefix + "prompt_embeds"]
            mask = pipe._prepare_attention_mask(
                1,
                latents.shape[1],
                latents.dtype,
                conditioning.get(prefix + "prompt_attention_mask"),
            )
            calls.append(
                {
                    "encoder_hidden_states": embeds,
                    "txt_ids": torch.zeros(embeds.shape[1], 3, device=device),
                    "attention_mask": mask,
                }
            )
        sigmas = [float(t) / 1000.0 for t in timesteps] + [0.0]
        for sigma, following in zip(sigmas[:-1], sigmas[1:], strict=True):
            t = torch.full([1], sigma, device=device)
            uncond, cond = (
                transformer(
                    hidden_states=latents, timestep=t, img_ids=image_ids, **call
                ).sample.float()
                for call in calls
            )
            velocity = uncond + PROBE_CHROMA_CFG * (cond - uncond)
            latents = latents + (following - sigma) * velocity
        return FluxPipeline._unpack_latents(latents, size, size, self.latent_factor(pipe))

    def call_arguments(self, cfg: float) -> dict[str, Any]:
        return {"guidance_scale": cfg}  # real CFG: a second call on the negative prompt

    def guidance_parameters(self, cfg: float) -> list[tuple[str, Any]]:
        return [("CFG scale", f"{cfg:g}")]
