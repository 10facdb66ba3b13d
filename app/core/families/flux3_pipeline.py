"""FLUX.3 as HalfSafe runs every family: a pipeline object with its parts as attributes, a prompt
encoder and a call that takes the encoded prompt, the noise and a step callback. diffusers 0.42.1
has FLUX.3 only as modular pipelines (`Flux3ModularPipeline` for the base model,
`Flux3DistilledModularPipeline` for the 16-step distilled Klein); this adapter keeps no sampler of
its own: the prompt goes through diffusers' Qwen3-VL prompt reader (the text encoder step's), and
a call runs diffusers' own input, latent, timestep, rotary and denoising blocks, with one block
added inside the denoising loop that hands the step's latents to the callback (the progress, the
live preview, cancel and the NaN watch's per-step fold, as a classic pipeline's
`callback_on_step_end` does). The prompt upsampler (a Qwen3.5 model), where the model has one,
writes the prompt out before it is encoded when a job asks (`upsample_prompt`,
`flux3_upsampler`); without it the prompt is encoded as given, as diffusers' blocks do with that
step popped.

Imported only where a FLUX.3 model is built or loaded: it subclasses diffusers' classes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from diffusers import DiffusionPipeline
from diffusers.modular_pipelines import Flux3DistilledModularPipeline, Flux3ModularPipeline
from diffusers.modular_pipelines.flux3.before_denoise import (
    Flux3DistilledTextRoPEInputsStep,
    Flux3PrepareImageCondLatentsStep,
    Flux3PrepareLatentsStep,
    Flux3SetTimestepsStep,
    Flux3TextRoPEInputsStep,
)
from diffusers.modular_pipelines.flux3.denoise import (
    Flux3DenoiseLoopWrapper,
    Flux3DistilledLoopDenoiser,
    Flux3LoopAfterDenoiser,
    Flux3LoopDenoiser,
)
from diffusers.modular_pipelines.flux3.encoders import Flux3TextEncoderStep
from diffusers.modular_pipelines.flux3.inputs import (
    Flux3DistilledTextInputStep,
    Flux3ImageCondInputStep,
    Flux3TextInputStep,
)
from diffusers.modular_pipelines.modular_pipeline import SequentialPipelineBlocks

from app.core.families.flux3_recipe import (
    BASE_CFG,
    BASE_STEPS,
    DISTILLED_STEPS,
    MAX_SEQUENCE_LENGTH,
    PAD_MULTIPLE,
    TEXT_LAYERS,
)
from app.core.families.flux3_upsampler import JOB_NEW_TOKENS
from app.core.families.modular import StepEndStep, assembled

# The parts of a FLUX.3 pipeline, as diffusers' blocks name them (the tokenizer is Qwen3-VL's
# processor).
PARTS = ("text_encoder", "tokenizer", "transformer", "vae", "scheduler")
# The prompt upsampler's, where the model has one.
UPSAMPLER_PARTS = ("prompt_upsampler", "prompt_upsampler_processor")


class Flux3StepEndStep(StepEndStep):
    model_name = "flux3"


class Flux3CallbackDenoiseStep(Flux3DenoiseLoopWrapper):
    """diffusers' FLUX.3 denoising loop (its denoiser with the guider, and the scheduler step)
    with the step callback after each step."""

    block_classes = [Flux3LoopDenoiser(), Flux3LoopAfterDenoiser(), Flux3StepEndStep()]
    block_names = ["denoiser", "after_denoiser", "step_end"]

    @property
    def description(self) -> str:
        return (
            "Denoises FLUX.3 latent tokens over the scheduler's timesteps, a callback after each."
        )


class Flux3DistilledCallbackDenoiseStep(Flux3DenoiseLoopWrapper):
    """diffusers' distilled FLUX.3 loop (one call a step, told the timestep it jumps to; the
    scheduler step) with the step callback after each step."""

    model_name = "flux3-distilled"
    block_classes = [Flux3DistilledLoopDenoiser(), Flux3LoopAfterDenoiser(), Flux3StepEndStep()]
    block_names = ["denoiser", "after_denoiser", "step_end"]

    @property
    def description(self) -> str:
        return "Denoises distilled FLUX.3 latent tokens, a callback after each step."


class Flux3ConditionedDenoiseStep(SequentialPipelineBlocks):
    """diffusers' text-to-image core denoising blocks of the base model, from the encoded prompt:
    the prompt batched, the latents and their positions prepared, the timesteps set, the text
    positions, the loop. The latents stay tokens (B, cells, 128): HalfSafe unpacks them."""

    block_classes = [
        Flux3TextInputStep(),
        Flux3PrepareLatentsStep(),
        Flux3SetTimestepsStep(num_inference_steps=BASE_STEPS),
        Flux3TextRoPEInputsStep(),
        Flux3CallbackDenoiseStep(),
    ]
    block_names = ["input", "prepare_latents", "set_timesteps", "prepare_rope_inputs", "denoise"]

    @property
    def description(self) -> str:  # pyright: ignore[reportIncompatibleMethodOverride]
        return "Denoises from an encoded FLUX.3 prompt."


class Flux3DistilledConditionedDenoiseStep(SequentialPipelineBlocks):
    """The same for the distilled model: no negative prompt, 16 steps by default."""

    block_classes = [
        Flux3DistilledTextInputStep(),
        Flux3PrepareLatentsStep(),
        Flux3SetTimestepsStep(num_inference_steps=DISTILLED_STEPS),
        Flux3DistilledTextRoPEInputsStep(),
        Flux3DistilledCallbackDenoiseStep(),
    ]
    block_names = ["input", "prepare_latents", "set_timesteps", "prepare_rope_inputs", "denoise"]

    @property
    def description(self) -> str:  # pyright: ignore[reportIncompatibleMethodOverride]
        return "Denoises from an encoded prompt with the distilled FLUX.3."


class Flux3EditDenoiseStep(SequentialPipelineBlocks):
    """The base model's core denoising blocks with reference pictures (diffusers'
    image-conditioned workflow): their latents batched and packed into the transformer's
    sequence (told apart on the position ids' last axis: -1, -2, ...), then as text-to-image."""

    block_classes = [
        Flux3TextInputStep(),
        Flux3ImageCondInputStep(),
        Flux3PrepareLatentsStep(),
        Flux3PrepareImageCondLatentsStep(),
        Flux3SetTimestepsStep(num_inference_steps=BASE_STEPS),
        Flux3TextRoPEInputsStep(),
        Flux3CallbackDenoiseStep(),
    ]
    block_names = [
        "input",
        "cond_input",
        "prepare_latents",
        "prepare_image_cond_latents",
        "set_timesteps",
        "prepare_rope_inputs",
        "denoise",
    ]

    @property
    def description(self) -> str:  # pyright: ignore[reportIncompatibleMethodOverride]
        return "Denoises from an encoded FLUX.3 prompt and reference pictures."


class Flux3DistilledEditDenoiseStep(SequentialPipelineBlocks):
    """The same for the distilled model."""

    block_classes = [
        Flux3DistilledTextInputStep(),
        Flux3ImageCondInputStep(),
        Flux3PrepareLatentsStep(),
        Flux3PrepareImageCondLatentsStep(),
        Flux3SetTimestepsStep(num_inference_steps=DISTILLED_STEPS),
        Flux3DistilledTextRoPEInputsStep(),
        Flux3DistilledCallbackDenoiseStep(),
    ]
    block_names = Flux3EditDenoiseStep.block_names

    @property
    def description(self) -> str:  # pyright: ignore[reportIncompatibleMethodOverride]
        return "Denoises from an encoded prompt and reference pictures with the distilled FLUX.3."


@dataclass
class Flux3Output:
    """What a call gives back: the latent tokens (B, cells, 128), normalised 2x2 patches of the
    VAE's latents, as a pipeline's `.images` with output_type "latent"."""

    images: Any


class Flux3Pipeline(DiffusionPipeline):
    """FLUX.3's parts (a Qwen3-VL text encoder and its processor, the transformer, Flux.2's VAE,
    a flow-matching scheduler) run by diffusers' FLUX.3 blocks: the base model, with CFG."""

    model_cpu_offload_seq = "text_encoder->transformer->vae"
    # What its folder names: diffusers' own (`save_pretrained`).
    folder_class_name: ClassVar[str] = "Flux3ModularPipeline"
    distilled: ClassVar[bool] = False
    default_steps: ClassVar[int] = BASE_STEPS
    # The most tokens a job's prompt upsampler writes: diffusers' blocks take it as an input
    # (max_new_tokens), by default theirs.
    upsampler_new_tokens: int = JOB_NEW_TOKENS

    def __init__(
        self,
        text_encoder,
        tokenizer,
        transformer,
        vae,
        scheduler,
        prompt_upsampler=None,
        prompt_upsampler_processor=None,
    ) -> None:
        super().__init__()
        self.register_modules(
            text_encoder=text_encoder,
            tokenizer=tokenizer,
            transformer=transformer,
            vae=vae,
            scheduler=scheduler,
            prompt_upsampler=prompt_upsampler,
            prompt_upsampler_processor=prompt_upsampler_processor,
        )

    def _modular_class(self):
        return Flux3DistilledModularPipeline if self.distilled else Flux3ModularPipeline

    def _denoise_blocks(self, references: bool):
        if references:
            return Flux3DistilledEditDenoiseStep() if self.distilled else Flux3EditDenoiseStep()
        return (
            Flux3DistilledConditionedDenoiseStep()
            if self.distilled
            else Flux3ConditionedDenoiseStep()
        )

    def modular(self, blocks, guidance_scale: float, **replaced):
        """diffusers' modular pipeline of this variant on `blocks`, with this pipeline's parts (or
        those `replaced`) and, for the base model, a classifier-free guider at `guidance_scale`
        (at 1 or below it makes one call a step, on the prompt alone)."""
        names = PARTS + (UPSAMPLER_PARTS if self.prompt_upsampler is not None else ())
        parts = {n: replaced.get(n, getattr(self, n)) for n in names}
        return assembled(self._modular_class(), blocks, parts, guidance_scale)

    def encode_prompt(self, prompt: str, device) -> Any:
        """One prompt as diffusers' text encoder step reads it (Qwen3-VL's chat form, padded to
        a multiple of 80 tokens): the hidden states after eight of its layers side by side,
        (1, tokens, 8 x width), in the text encoder's dtype. The generation model's inner
        Qwen3-VL model is what runs: its LM head, whose logits nothing reads, would cost a
        151,936-wide row per token (2.5 GB in fp16 for 8,192 tokens)."""
        return Flux3TextEncoderStep._get_qwen3_vl_prompt_embeds(
            text_encoder=getattr(self.text_encoder, "model", self.text_encoder),
            tokenizer=self.tokenizer,
            prompt=prompt,
            device=device,
            max_sequence_length=MAX_SEQUENCE_LENGTH,
            pad_multiple=PAD_MULTIPLE,
            hidden_states_layers=TEXT_LAYERS,
        )

    def upsample_prompt(
        self,
        prompt: str,
        device,
        max_new_tokens: int,
        forced=None,
        logits: bool = True,
        references=(),
    ):
        """The caption the prompt upsampler writes for `prompt` (`flux3_upsampler.generate`:
        at most `max_new_tokens`, greedily, or the `forced` tokens; each step's logits kept
        where `logits`; an edit's from its `references`), in its placed dtype."""
        from app.core.families.flux3_upsampler import generate

        return generate(
            self.prompt_upsampler,
            self.prompt_upsampler_processor,
            prompt,
            device,
            max_new_tokens,
            forced,
            logits,
            references,
        )

    def __call__(
        self,
        prompt_embeds,
        negative_prompt_embeds=None,
        *,
        height: int,
        width: int,
        latents=None,
        num_inference_steps: int | None = None,
        guidance_scale: float = BASE_CFG,
        generator=None,
        sigmas: list[float] | None = None,
        output_type: str = "latent",
        callback_on_step_end=None,
        callback_on_step_end_tensor_inputs: list[str] | None = None,
        scheduler=None,
        image_cond_latents: list[Any] | None = None,
    ) -> Flux3Output:
        """Denoise from the encoded prompt (B, tokens, width each) by diffusers' FLUX.3 blocks:
        the base model with CFG at `guidance_scale` where a negative prompt is given and the
        scale is above 1, the distilled one without (a negative prompt is not read);
        `num_inference_steps` by default the variant's (50, 16); `sigmas` (unshifted, from 1
        down) as Flux3SetTimestepsStep takes them, by default linear from 1 to 1/steps;
        `latents` (B, 128, h, w) as the noise, normalised 2x2 patches; `scheduler` in place of
        the pipeline's; `image_cond_latents`, the reference pictures' latents (1, 128, h_i,
        w_i each, normalised 2x2 patches), read in the transformer's sequence beside the noise
        (an edit). Gives the latent tokens (B, cells, 128): only output_type "latent"
        (HalfSafe decodes each image itself)."""
        if output_type != "latent":
            raise ValueError("Flux3Pipeline gives latents only (output_type='latent').")
        if callback_on_step_end_tensor_inputs not in (None, ["latents"]):
            raise ValueError("Flux3Pipeline's step callback takes the latents only.")
        if negative_prompt_embeds is None or self.distilled:
            guidance_scale = 1.0
        replaced = {"scheduler": scheduler} if scheduler is not None else {}
        blocks = self._denoise_blocks(bool(image_cond_latents))
        modular = self.modular(blocks, guidance_scale, **replaced)
        arguments: dict[str, Any] = {
            "prompt_embeds": prompt_embeds,
            "height": height,
            "width": width,
            "num_inference_steps": num_inference_steps or self.default_steps,
            "generator": generator,
            "step_callback": callback_on_step_end,
        }
        if negative_prompt_embeds is not None and guidance_scale > 1.0:
            arguments["negative_prompt_embeds"] = negative_prompt_embeds
        if latents is not None:
            arguments["latents"] = latents
        if sigmas is not None:
            arguments["sigmas"] = sigmas
        if image_cond_latents:
            arguments["image_cond_latents"] = list(image_cond_latents)
        return Flux3Output(modular(**arguments, output="latents"))

    def save_pretrained(self, save_directory, **kwargs) -> None:  # type: ignore[override]
        """Written as diffusers writes a FLUX.3 model: its modular pipeline's folder (a
        modular_model_index.json naming the variant's modular pipeline, a subfolder per model
        part and the processor; the scheduler, built from its blocks' spec, is not written), the
        prompt upsampler and its processor in theirs where the model has one."""
        from diffusers.modular_pipelines import Flux3AutoBlocks, Flux3DistilledAutoBlocks

        blocks = Flux3DistilledAutoBlocks() if self.distilled else Flux3AutoBlocks()
        if self.prompt_upsampler is None:
            blocks.sub_blocks.pop("prompt_upsampler")  # a part this model does not have
        kwargs.setdefault("overwrite_modular_index", True)
        self.modular(blocks, BASE_CFG).save_pretrained(str(save_directory), **kwargs)


class Flux3DistilledPipeline(Flux3Pipeline):
    """The 16-step distilled FLUX.3 (Klein): a flow-map transformer, told at each step the
    timestep it jumps to, sampled without CFG."""

    folder_class_name: ClassVar[str] = "Flux3DistilledModularPipeline"
    distilled: ClassVar[bool] = True
    default_steps: ClassVar[int] = DISTILLED_STEPS
