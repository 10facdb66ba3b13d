"""Anima as HalfSafe runs every family: a pipeline object with its parts as attributes, a prompt
encoder and a call that takes the encoded prompt, the noise and a step callback. diffusers 0.42.1
has Anima only as a modular pipeline (`AnimaModularPipeline`, its blocks); this adapter keeps
no sampler of its own: the prompt goes through diffusers' text encoder and text conditioner
steps, and a call runs diffusers' own input, latent, timestep and denoising blocks, with one
block added inside the denoising loop that hands the step's latents to the callback (the
progress, the live preview, cancel and the NaN watch's per-step fold, as a classic pipeline's
`callback_on_step_end` does).

Imported only where an Anima model is built or loaded: it subclasses diffusers' classes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from diffusers import DiffusionPipeline
from diffusers.modular_pipelines import AnimaModularPipeline
from diffusers.modular_pipelines.anima.before_denoise import (
    AnimaImageInputStep,
    AnimaImg2ImgPrepareLatentsStep,
    AnimaImg2ImgSetTimestepsStep,
    AnimaPrepareLatentsStep,
    AnimaSetTimestepsStep,
    AnimaTextConditioningStep,
    AnimaTextInputStep,
)
from diffusers.modular_pipelines.anima.denoise import (
    AnimaDenoiseLoopWrapper,
    AnimaLoopAfterDenoiser,
    AnimaLoopBeforeDenoiser,
    AnimaLoopDenoiser,
)
from diffusers.modular_pipelines.anima.encoders import AnimaTextEncoderStep
from diffusers.modular_pipelines.modular_pipeline import SequentialPipelineBlocks

from app.core.families.modular import StepEndStep, assembled, quiet_assembly

# The parts of an Anima pipeline, as diffusers' blocks name them.
PARTS = (
    "text_encoder",
    "tokenizer",
    "t5_tokenizer",
    "text_conditioner",
    "transformer",
    "vae",
    "scheduler",
)


class AnimaStepEndStep(StepEndStep):
    model_name = "anima"


class AnimaCallbackDenoiseStep(AnimaDenoiseLoopWrapper):
    """diffusers' Anima denoising loop (its before-denoiser, denoiser with the guider, and
    scheduler step blocks) with the step callback after each step."""

    block_classes = [
        AnimaLoopBeforeDenoiser,
        AnimaLoopDenoiser(
            guider_input_fields={
                "encoder_hidden_states": ("prompt_embeds", "negative_prompt_embeds")
            }
        ),
        AnimaLoopAfterDenoiser,
        AnimaStepEndStep,
    ]
    block_names = ["before_denoiser", "denoiser", "after_denoiser", "step_end"]

    @property
    def description(self) -> str:
        return "Denoises Anima latents over the scheduler's timesteps, a callback after each."


class AnimaConditionedDenoiseStep(SequentialPipelineBlocks):
    """diffusers' text-to-image core denoising blocks after the text conditioning (which
    HalfSafe runs with the prompt's encoding): the prompt batched, the latents prepared, the
    timesteps set, the loop."""

    block_classes = [
        AnimaTextInputStep,
        AnimaPrepareLatentsStep,
        AnimaSetTimestepsStep,
        AnimaCallbackDenoiseStep,
    ]
    block_names = ["input", "prepare_latents", "set_timesteps", "denoise"]

    @property
    def description(self) -> str:  # pyright: ignore[reportIncompatibleMethodOverride]
        return "Denoises from conditioned Anima prompt embeddings."


class AnimaConditionedImg2ImgStep(SequentialPipelineBlocks):
    """diffusers' image-to-image core denoising blocks after the text conditioning: the
    prompt and the picture's latents batched, the timesteps cut to the strength, the picture's
    latents noised to the first of them, the loop."""

    block_classes = [
        AnimaTextInputStep,
        AnimaImageInputStep,
        AnimaImg2ImgSetTimestepsStep,
        AnimaImg2ImgPrepareLatentsStep,
        AnimaCallbackDenoiseStep,
    ]
    block_names = ["input", "image_input", "set_timesteps", "prepare_latents", "denoise"]

    @property
    def description(self) -> str:  # pyright: ignore[reportIncompatibleMethodOverride]
        return "Denoises a picture's Anima latents from conditioned prompt embeddings."


@dataclass
class AnimaOutput:
    """What a call gives back: the latents (B, C, 1, h, w), as a pipeline's `.images` with
    output_type "latent"."""

    images: Any


class AnimaPipeline(DiffusionPipeline):
    """Anima's parts (a Qwen3 text encoder and its tokenizer, the T5 tokenizer whose ids the
    text conditioner reads, the text conditioner, the Cosmos transformer, Qwen-Image's VAE, a
    flow-matching scheduler) run by diffusers' Anima blocks."""

    model_cpu_offload_seq = "text_encoder->text_conditioner->transformer->vae"
    # What its folder names: diffusers' own (`save_pretrained`).
    folder_class_name = "AnimaModularPipeline"

    def __init__(
        self,
        text_encoder,
        tokenizer,
        t5_tokenizer,
        text_conditioner,
        transformer,
        vae,
        scheduler,
    ) -> None:
        super().__init__()
        self.register_modules(
            text_encoder=text_encoder,
            tokenizer=tokenizer,
            t5_tokenizer=t5_tokenizer,
            text_conditioner=text_conditioner,
            transformer=transformer,
            vae=vae,
            scheduler=scheduler,
        )

    def modular(self, blocks, guidance_scale: float, **replaced) -> AnimaModularPipeline:
        """diffusers' AnimaModularPipeline on `blocks`, with this pipeline's parts (or those
        `replaced`) and a classifier-free guider at `guidance_scale` (at 1 or below it makes
        one call a step, on the prompt alone)."""
        parts = {n: replaced.get(n, getattr(self, n)) for n in PARTS}
        return assembled(AnimaModularPipeline, blocks, parts, guidance_scale)

    def encode_prompt(
        self, prompt: str, negative_prompt: str, device, guidance: bool, max_sequence_length: int
    ) -> dict[str, Any]:
        """The prompt (and with `guidance`, the negative prompt) through diffusers' text
        encoder step (the Qwen3 states, the T5 token ids) and its text conditioning step (the
        text conditioner): "qwen_prompt_embeds" (1, tokens, width) as the text encoder made
        them, "prompt_embeds" (1, tokens, width) as the transformer reads them, and the
        negative's under "negative_"."""
        # diffusers' steps read their parts as attributes: this pipeline has them all.
        encoded: dict[str, Any] = AnimaTextEncoderStep.encode_prompt(
            self,  # pyright: ignore[reportArgumentType]
            prompt=prompt,
            negative_prompt=negative_prompt,
            prepare_unconditional_embeds=guidance,
            max_sequence_length=max_sequence_length,
            device=device,
            dtype=self.text_encoder.dtype,
        )
        tensors: dict[str, Any] = {}
        for prefix in ("", "negative_") if guidance else ("",):
            tensors[prefix + "qwen_prompt_embeds"] = encoded[prefix + "qwen_prompt_embeds"]
            tensors[prefix + "prompt_embeds"] = AnimaTextConditioningStep._condition_prompt_embeds(
                self,  # pyright: ignore[reportArgumentType]
                qwen_prompt_embeds=encoded[prefix + "qwen_prompt_embeds"],
                qwen_attention_mask=encoded[prefix + "qwen_attention_mask"],
                t5_input_ids=encoded[prefix + "t5_input_ids"],
                t5_attention_mask=encoded[prefix + "t5_attention_mask"],
                device=device,
                conditioning_dtype=self.text_conditioner.dtype,
                # What the conditioner made, in its own dtype: the denoising blocks cast it to
                # the transformer's.
                output_dtype=self.text_conditioner.dtype,
            )
        return tensors

    def __call__(
        self,
        prompt_embeds,
        negative_prompt_embeds=None,
        *,
        height: int,
        width: int,
        latents=None,
        num_inference_steps: int = 30,
        guidance_scale: float = 4.0,
        generator=None,
        image=None,
        strength: float = 0.6,
        sigmas: list[float] | None = None,
        output_type: str = "latent",
        callback_on_step_end=None,
        callback_on_step_end_tensor_inputs: list[str] | None = None,
        scheduler=None,
    ) -> AnimaOutput:
        """Denoise from the conditioned prompt (B, tokens, width each) by diffusers' Anima
        blocks: CFG at `guidance_scale` where a negative prompt is given and the scale is
        above 1; `sigmas` (unshifted, from 1 down) as AnimaSetTimestepsStep takes them, by
        default linear from 1 to 1/steps; `scheduler` in place of the pipeline's. With `image`
        (a picture's latents as the VAE's encoder made them, normalised: (B, C, h, w) or
        (B, C, 1, h, w)), image-to-image: the last `strength` of the schedule, from the
        picture noised by `generator`'s draws. Gives the latents (B, C, 1, h, w): only
        output_type "latent" (HalfSafe decodes each image itself)."""
        if output_type != "latent":
            raise ValueError("AnimaPipeline gives latents only (output_type='latent').")
        if callback_on_step_end_tensor_inputs not in (None, ["latents"]):
            raise ValueError("AnimaPipeline's step callback takes the latents only.")
        if negative_prompt_embeds is None:
            guidance_scale = 1.0
        replaced = {"scheduler": scheduler} if scheduler is not None else {}
        blocks = AnimaConditionedDenoiseStep() if image is None else AnimaConditionedImg2ImgStep()
        modular = self.modular(blocks, guidance_scale, **replaced)
        arguments: dict[str, Any] = {
            "prompt_embeds": prompt_embeds,
            "height": height,
            "width": width,
            "num_inference_steps": num_inference_steps,
            "generator": generator,
            "step_callback": callback_on_step_end,
        }
        if negative_prompt_embeds is not None and guidance_scale > 1.0:
            arguments["negative_prompt_embeds"] = negative_prompt_embeds
        if latents is not None:
            arguments["latents"] = latents
        if image is not None:
            arguments["image_latents"] = image.unsqueeze(2) if image.dim() == 4 else image
            arguments["strength"] = strength
        if sigmas is not None:
            arguments["sigmas"] = sigmas
        return AnimaOutput(modular(**arguments, output="latents"))

    def save_pretrained(self, save_directory, **kwargs) -> None:  # type: ignore[override]
        """Written as diffusers writes an Anima model: its modular pipeline's folder (a
        modular_model_index.json naming AnimaModularPipeline, a subfolder per part)."""
        from diffusers.modular_pipelines import AnimaAutoBlocks

        kwargs.setdefault("overwrite_modular_index", True)
        modular = self.modular(AnimaAutoBlocks(), 4.0)
        with quiet_assembly():
            modular.save_pretrained(str(save_directory), **kwargs)


def without_padding_channel(transformer):
    """The Cosmos transformer without its padding-mask input channel, computing the same.

    Cosmos concatenates a padding mask to the latents before its patch embedding; diffusers'
    Anima blocks always give a mask of zeros, so that channel's weights multiply zeros. diffusers
    resizes the mask with torchvision, which HalfSafe does not ship: the channel's columns of
    the patch embedding are dropped instead (the last ones: each patch's features are its
    channels outermost), and the transformer no longer takes the mask. Returns `transformer`
    itself when it takes none; the one given is left as it is."""
    from diffusers import CosmosTransformer3DModel

    if not transformer.config.concat_padding_mask:
        return transformer
    config = {k: v for k, v in transformer.config.items() if not k.startswith("_")}
    config["concat_padding_mask"] = False
    with torch.device("meta"):
        folded = CosmosTransformer3DModel(**config)
    state = transformer.state_dict()
    weight = state["patch_embed.proj.weight"]
    per_channel = weight.shape[1] // (transformer.config.in_channels + 1)
    state["patch_embed.proj.weight"] = weight[:, : weight.shape[1] - per_channel].clone()
    folded.load_state_dict(state, assign=True, strict=True)
    # Buffers not kept in the state (the rotary tables) are made again off the meta device.
    for name, buffer in list(transformer.named_buffers()):
        owner, _, leaf = name.rpartition(".")
        module = folded.get_submodule(owner) if owner else folded
        if getattr(module, leaf).is_meta:
            module.register_buffer(leaf, buffer.clone(), persistent=False)
    return folded.eval()
