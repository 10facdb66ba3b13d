"""Stable Diffusion 1.x and 2.x: one CLIP text encoder, a UNet with the CFG batch (epsilon or
v prediction), a 4-channel VAE."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.core.architecture.keys import Shapes, _count_layers
from app.core.detection import UNET, Detection, TextEncoderLayout
from app.core.families.base import Family, FamilyId, LatentFormat, prompt_tensors
from app.core.families.checkpoints import (
    Checkpoint,
    clip_words,
    full_checkpoint,
    token_width,
    unet_folder,
    unet_without_text,
)
from app.core.families.faults import ToolFault
from app.core.images.pictures import Mode

PROBE_CFG = 7.0  # the check's classifier-free guidance scale

# Where a checkpoint of the original layout keeps its CLIP: SD1.x's under transformers names,
# SD2.x's OpenCLIP under its own (some converted SD2 files use SD1's place).
SD1_TEXT = "cond_stage_model.transformer."
SD2_TEXT = "cond_stage_model.model."

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


# SD 2.x's attention overflows fp16 in the UNet. Names that say SD 2.x: v2-1_768-ema-pruned,
# sd21, stable-diffusion-2-1. A tool that states a plain Stable Diffusion pipeline (SD.Next's
# StableDiffusionPipeline) says SD 1.x or 2.x; the model's name may still say which.
ATTENTION_2X = ToolFault(
    family="sd2",
    title="SD 2.x",
    likely="sd2_attention",
    likely_words=(
        "SD 2.x's attention overflowing fp16 in the UNet, as it is known to (the reason "
        "upcast-attention switches exist)"
    ),
    order=("attention", "all"),
    exact_bases=("sd-2", "sd2"),
    vague_bases=("stablediffusion",),
    not_vague_bases=("stablediffusion3",),
    names=(
        re.compile(
            r"(?<![a-z0-9])(?:sd[-_ ]?2(?:[-_. ]?[01])?|stable[-_ ]?diffusion[-_ ]?2(?:[-_. ]?[01])?"
            r"|v2-[01]_(?:512|768)|768-v-ema)(?![0-9])",
            re.IGNORECASE,
        ),
    ),
)


@dataclass(frozen=True)
class StableDiffusionFamily(Family):
    """Stable Diffusion 1.x/2.x: one CLIP text encoder, a UNet, a VAE."""

    id = FamilyId("sd")
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
    tool_faults = (ATTENTION_2X,)
    native_by_prediction = {"sd2": {"v_prediction": 768, "epsilon": 512}}
    # No safety checker: HalfSafe tells a checker's black from NaN-black by its own record.
    checkpoint_pipeline_options = {
        "safety_checker": None,
        "feature_extractor": None,
        "requires_safety_checker": False,
    }
    # The shipped configs (app/resources/configs) its checkpoints load with.
    checkpoint_configs = ("sd1", "sd2", "sd2-v")

    def owns(self, pipeline) -> bool:
        return getattr(pipeline, "unet", None) is not None and (
            getattr(pipeline, "text_encoder_2", None) is None
        )

    takes_clip_skip = True

    def detect_checkpoint(self, file: Checkpoint) -> Detection | None:
        """SD1.x or SD2.x by its one CLIP, in either layout; the last family asked, so a UNet
        of the layout with no text encoder any family reads is named here."""
        if not file.has(UNET):
            return None
        cross = file.cross_words
        if file.has(SD2_TEXT):
            encoder = _sd2_encoder(file.shapes, SD2_TEXT, "openclip")
            why = (
                f"its UNet takes {cross} from an {clip_words(file.shapes, encoder)} text "
                f"encoder (cond_stage_model.model), as SD2.x does{_penultimate_words(encoder)}"
            )
        elif file.has(SD1_TEXT) and _sd2_in_clip_layout(file, file.hf_prefix(SD1_TEXT)):
            encoder = _sd2_encoder(file.shapes, file.hf_prefix(SD1_TEXT), "hf")
            why = (
                f"its UNet takes {cross} from an OpenCLIP-sized "
                f"{clip_words(file.shapes, encoder)} text encoder stored under transformers "
                "names (cond_stage_model.transformer), as SD2.x "
                f"does{_penultimate_words(encoder)}"
            )
        elif file.has(SD1_TEXT):
            encoder = TextEncoderLayout("text_encoder", file.hf_prefix(SD1_TEXT), "hf")
            why = (
                f"its UNet takes {cross} from a {clip_words(file.shapes, encoder)} text "
                "encoder (cond_stage_model.transformer), as SD1.x does"
            )
            return full_checkpoint(
                file, "sd1", self.architectures["sd1"], why, (encoder,), SD_PIPELINE, 512
            )
        else:
            return unet_without_text(file)
        title = self.architectures["sd2"]
        return full_checkpoint(file, "sd2", title, why, (encoder,), SD_PIPELINE, None, "sd2-v")

    def detect_unet_folder(
        self, model_index: Mapping[str, Any], unet: Mapping[str, Any], scheduler: Mapping[str, Any]
    ) -> Detection | None:
        class_name = str(model_index.get("_class_name", ""))
        if not class_name.startswith("StableDiffusion") or "text_encoder_2" in model_index:
            return None
        cross = unet.get("cross_attention_dim")
        cross = cross[0] if isinstance(cross, list) else cross
        architecture = "sd2" if cross == 1024 else "sd1"
        why = f"its {class_name} has one text encoder and a UNet with {cross}-wide text features"
        if architecture == "sd1" and cross != 768:
            why += " (a non-standard width, treated as SD1.x)"
        title = self.architectures[architecture]
        return unet_folder(architecture, title, why, class_name, unet, scheduler)

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


SD_PIPELINE = "StableDiffusionPipeline"


def _sd2_encoder(shapes: Shapes, prefix: str, layout: str) -> TextEncoderLayout:
    """SD2's text encoder, keeping every block the file has unless it holds the full tower.

    SD2 conditions on the output of OpenCLIP ViT-H's 23rd of 24 blocks (then the final norm).
    Original files carry all 24 blocks and the text projection; diffusers' converter writes
    only the 23 blocks diffusers runs and no projection. ViT-H's depth decides for real sizes;
    for other sizes the projection tells a full tower from a converted one.
    """
    probe = TextEncoderLayout("text_encoder", prefix, layout)
    layers = _count_layers(shapes, probe)
    width = token_width(shapes, prefix, layout)
    if width == 1024 and layers in (23, 24):
        full = layers == 24
    elif layout == "hf":
        full = (prefix.removesuffix("text_model.") + "text_projection.weight") in shapes
    else:
        full = (prefix + "text_projection") in shapes
    return TextEncoderLayout("text_encoder", prefix, layout, drop_last_layer=full and layers > 1)


def _penultimate_words(encoder: TextEncoderLayout) -> str:
    if encoder.drop_last_layer:
        return " (its last block is unused: SD2 reads the penultimate layer)"
    return " (the file holds only the blocks SD2 reads, all of them used)"


def _sd2_in_clip_layout(file: Checkpoint, prefix: str) -> bool:
    """A converted SD2 file can store OpenCLIP under transformers names, where SD1's CLIP sits.

    Real SD2 text features are 1024 wide (SD1's 768); at other sizes SD2's UNet gives itself
    away by linear attention projections (SD1's are 1x1 convolutions).
    """
    width, cross = token_width(file.shapes, prefix, "hf"), file.cross
    if cross == 1024 and width == 1024:
        return True
    if cross in (768, None) or width != cross:
        return False
    proj_in = next(
        (s for k, s in file.shapes.items() if k.startswith(UNET) and k.endswith(".proj_in.weight")),
        None,
    )
    return proj_in is not None and len(proj_in) == 2
