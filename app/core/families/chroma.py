"""Chroma: Flux-shaped, T5 its only text encoder, modulation from a small network, real CFG."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.core.detection import Detection
from app.core.encoders.t5 import t5_need
from app.core.families.base import FamilyId, prompt_tensors, transformer_width
from app.core.families.flux import (
    BFL_MARKERS,
    CHROMA_MARKER,
    FluxFamily,
    bfl_blocks,
    bfl_table,
    flux_vae_need,
)
from app.core.formats.layouts import (
    Layout,
    Shapes,
    SplitModel,
    count_indices,
    count_words,
    reader,
    within_limits,
)
from app.core.images.pictures import Mode
from app.core.words import infotext

PROBE_CHROMA_CFG = 5.0  # the check's guidance for Chroma (ChromaPipeline's default)


# Chroma in Black Forest Labs' layout, with its distilled_guidance_layer ------------------


def _read_chroma(shapes: Shapes, prefix: str) -> SplitModel:
    w = reader(shapes, prefix)
    hidden, channels = w("distilled_guidance_layer.in_proj.weight", 2)
    config = {
        "_class_name": "ChromaTransformer2DModel",
        **bfl_blocks(shapes, prefix),
        "approximator_num_channels": channels,
        "approximator_hidden_dim": hidden,
        "approximator_layers": count_indices(shapes, prefix + "distilled_guidance_layer.layers."),
    }
    within_limits(config)
    width = config["num_attention_heads"] * config["attention_head_dim"]
    return SplitModel(
        table=bfl_table,
        layout="chroma",
        title="Chroma",
        prefix=prefix,
        config=config,
        architecture="chroma",
        because=(
            f"Chroma: a Flux-shaped transformer in Black Forest Labs' layout ({prefix}double_blocks, "
            f"single_blocks) with {config['num_layers']} double and "
            f"{config['num_single_layers']} single blocks, {width} wide, whose modulation comes "
            f"from a small approximator network (distilled_guidance_layer, "
            f"{count_words(config['approximator_layers'], 'layer')}) instead of Flux's per-block modulation, "
            f"CLIP vector and guidance embedding, taking {config['joint_attention_dim']}-wide T5 "
            "features only; flow matching with real CFG."
        ),
        needs=(
            t5_need("text_encoder", config["joint_attention_dim"]),
            flux_vae_need(config["in_channels"] // 4),
        ),
        pipeline_class="ChromaPipeline",
        configs="flux",  # Flux.1's VAE and FLUX.1-dev's schedule
        scheduler={},
        latent_channels=config["in_channels"] // 4,
    )


LAYOUT = Layout(
    "Chroma-style transformer", (*BFL_MARKERS, CHROMA_MARKER), (), _read_chroma, bfl_table
)


@dataclass(frozen=True)
class ChromaFamily(FluxFamily):
    """Chroma: Flux-shaped (packed 2x2 patches of a 16-channel latent, double and single
    blocks, flow matching) with T5 as its only text encoder, its modulation computed by a small
    network instead of a guidance embedding, and real CFG: a second call on the negative prompt,
    each with T5's attention mask."""

    takes_step_cache = False  # diffusers' cache does not know Chroma's blocks

    id = FamilyId("chroma")
    title = "Chroma"
    architectures = {"chroma": "Chroma"}
    trainer_words = ((r"chroma", "chroma"),)
    lora_kin = ("flux",)  # made from Flux.1 schnell: Flux.1 LoRAs are run on it
    transformer_class = "ChromaTransformer2DModel"
    layout = LAYOUT
    pipeline_class = "ChromaPipeline"
    companion_names = {"text_encoder": "t5xxl", "vae": "ae"}
    # Not inpainting: diffusers 0.42.1's ChromaInpaintPipeline reads a guidance setting that
    # Chroma's transformer does not have, and fails on every call.
    picture_pipelines = {Mode.IMAGE: "ChromaImg2ImgPipeline"}
    edit_pipelines = {}  # Flux.1's Kontext is not Chroma's
    variant_pipelines = ()  # nor its Fill, Depth or Canny

    def detect_folder(
        self,
        model_index: Mapping[str, Any],
        transformer: Mapping[str, Any],
        scheduler: Mapping[str, Any],
    ) -> Detection:
        width = transformer_width(transformer)
        because = (
            f"Chroma: its ChromaPipeline has a Flux-shaped ChromaTransformer2DModel with "
            f"{transformer.get('num_layers')} double and {transformer.get('num_single_layers')} single "
            f"blocks, {width} wide, whose modulation comes from a small approximator network instead "
            "of CLIP and a guidance embedding, and a T5 text encoder only; flow matching with real CFG."
        )
        return Detection(
            "chroma", True, "a Chroma pipeline", because, "flow", 1024, None, "ChromaPipeline"
        )

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
        return [(infotext.CFG_SCALE.name, f"{cfg:g}")]
