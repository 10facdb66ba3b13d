"""SDXL (and its Illustrious, Pony and NoobAI fine-tunes): two CLIP text encoders, pooled
embeddings and size conditioning for the UNet, a 4-channel VAE."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.core.detection import UNET, Detection, TextEncoderLayout
from app.core.families.base import FamilyId, LatentFormat, prompt_tensors
from app.core.families.checkpoints import Checkpoint, clip_words, full_checkpoint, unet_folder
from app.core.families.faults import ToolFault
from app.core.families.sd import StableDiffusionFamily
from app.core.images.pictures import Mode

# Where a checkpoint of the original layout keeps SDXL's two text encoders (CLIP ViT-L under
# transformers names, OpenCLIP ViT-bigG under its own), and the refiner's one.
SDXL_TEXT_1 = "conditioner.embedders.0.transformer."
SDXL_TEXT_2 = "conditioner.embedders.1.model."
SDXL_REFINER_TEXT = "conditioner.embedders.0.model."

# SDXL's VAE latents to RGB: a published approximation, as SD's.
SDXL_LATENT = LatentFormat(
    channels=4,
    rgb_factors=(
        (0.3651, 0.4232, 0.4341),
        (-0.2533, -0.0042, 0.1068),
        (0.1076, 0.1111, -0.0362),
        (-0.3165, -0.2492, -0.2188),
    ),
    rgb_bias=(0.1084, -0.0175, -0.0011),
)


# SDXL's original VAE overflows fp16 while it decodes. Names that say SDXL (case-insensitive,
# bounded by non-letters): sd_xl_base, "Juggernaut XL", ponyDiffusionV6XL; camel case:
# juggernautXL_v9, dreamshaperXL.
ORIGINAL_VAE = ToolFault(
    family="sdxl",
    title="SDXL",
    likely="sdxl_vae",
    likely_words=(
        "SDXL's original VAE overflowing fp16 while it decodes, as it is known to (the reason "
        "fp16-fixed SDXL VAEs exist)"
    ),
    order=("vae", "attention", "all"),
    bases=("sdxl", "stablediffusionxl"),
    names=(
        re.compile(r"sd[-_ ]?xl|(?<![a-z])xl(?![a-z])", re.IGNORECASE),
        re.compile(r"[a-z]XL(?![a-z])"),
    ),
    vae_names=(re.compile(r"sd[-_ ]?xl", re.IGNORECASE),),
)


@dataclass(frozen=True)
class SDXLFamily(StableDiffusionFamily):
    """SDXL: two CLIP text encoders whose hidden states lie side by side, pooled embeddings from
    the second, and size conditioning for the UNet."""

    id = FamilyId("sdxl")
    title = "SDXL"
    tool_faults = (ORIGINAL_VAE,)
    force_upcast_means_fp32 = True
    native_by_prediction = {}
    checkpoint_pipeline_options = {"force_zeros_for_empty_prompt": True, "add_watermarker": False}
    architectures = {"sdxl": "SDXL"}
    trainer_words = (
        (r"xl.*refiner", "sdxl-refiner"),
        (r"sdxl|stable-diffusion-xl|^sd-xl", "sdxl"),
    )
    picture_pipelines = {
        Mode.IMAGE: "StableDiffusionXLImg2ImgPipeline",
        Mode.INPAINT: "StableDiffusionXLInpaintPipeline",
    }
    latent = SDXL_LATENT
    checkpoint_configs = ("sdxl",)

    def owns(self, pipeline) -> bool:
        return getattr(pipeline, "unet", None) is not None and (
            getattr(pipeline, "text_encoder_2", None) is not None
        )

    takes_clip_skip = True

    def detect_checkpoint(self, file: Checkpoint) -> Detection | None:
        """SDXL by its two text encoders (CLIP ViT-L beside OpenCLIP ViT-bigG); its refiner,
        with the second alone, is named and refused."""
        if not file.has(UNET):
            return None
        if file.has(SDXL_TEXT_1) and file.has(SDXL_TEXT_2):
            encoders = (
                TextEncoderLayout("text_encoder", file.hf_prefix(SDXL_TEXT_1), "hf"),
                TextEncoderLayout("text_encoder_2", SDXL_TEXT_2, "openclip"),
            )
            why = (
                f"its UNet takes {file.cross_words} plus size embeddings (label_emb) and it "
                f"carries two text encoders, {clip_words(file.shapes, encoders[0])} and "
                f"{clip_words(file.shapes, encoders[1])}"
            )
            return full_checkpoint(file, "sdxl", self.title, why, encoders, SDXL_PIPELINE, 1024)
        if file.has(SDXL_REFINER_TEXT) and not file.has(SDXL_TEXT_2):
            return Detection(
                "sdxl-refiner",
                False,
                "an SDXL refiner",
                "it has the SDXL refiner's single OpenCLIP text encoder "
                "(conditioner.embedders.0.model) and a UNet with "
                f"{file.cross_words}; HalfSafe runs base models, not refiners.",
            )
        return None

    def detect_unet_folder(
        self, model_index: Mapping[str, Any], unet: Mapping[str, Any], scheduler: Mapping[str, Any]
    ) -> Detection | None:
        if "text_encoder_2" not in model_index or unet.get("addition_embed_type") != "text_time":
            return None
        class_name = str(model_index.get("_class_name", ""))
        cross = unet.get("cross_attention_dim")
        cross = cross[0] if isinstance(cross, list) else cross
        why = (
            f"its {class_name} has two text encoders and a UNet with {cross}-wide text "
            "features and text/time embeddings"
        )
        return unet_folder("sdxl", self.title, why, class_name, unet, scheduler)

    def encode(
        self, pipe, prompt: str, negative: str, device, guidance: bool, clip_skip: int = 1
    ) -> dict[str, Any]:
        from app.core.encoders.prompts import encode_sdxl

        return encode_sdxl(pipe, prompt, negative, device, guidance, clip_skip)

    def encoder_outputs(self, pipe, tensors: dict[str, Any]) -> dict[str, list[Any]]:
        hidden = prompt_tensors(tensors)
        first = getattr(pipe, "text_encoder", None)
        split = first.config.hidden_size if first is not None else 0
        pooled = [
            tensors[k]
            for k in ("pooled_prompt_embeds", "negative_pooled_prompt_embeds")
            if k in tensors
        ]
        outputs = {"text_encoder": [h[..., :split] for h in hidden]} if split else {}
        outputs["text_encoder_2"] = [h[..., split:] for h in hidden] + pooled
        return outputs  # in run order: a failure is blamed on the first encoder that failed

    def denoiser_inputs(self, conditioning: dict[str, Any], size: int, device) -> dict[str, Any]:
        import torch

        inputs = super().denoiser_inputs(conditioning, size, device)
        time_ids = torch.tensor(
            [[size, size, 0, 0, size, size]] * 2, device=device, dtype=torch.float32
        )
        pooled = torch.cat(
            [conditioning["negative_pooled_prompt_embeds"], conditioning["pooled_prompt_embeds"]]
        )
        inputs["added_cond_kwargs"] = {"text_embeds": pooled, "time_ids": time_ids}
        return inputs


SDXL_PIPELINE = "StableDiffusionXLPipeline"
