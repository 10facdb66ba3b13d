"""Model families as data plus the few steps that differ between them.

A family says which components a pipeline has (by role, see `components.py`), how to encode a
prompt into the named tensors its denoiser takes, which of those tensors come from which text
encoder (so the NaN watch can blame the right one), how the check's probe steps the denoiser
through the user's schedule, and how generation makes its noise, its sampler and its pixels'
latents. The health check and generation loop over a family's components and call these steps;
neither names an architecture. A new family is one more class here.

Families: Stable Diffusion 1.x/2.x and SDXL (UNet, epsilon or v prediction, CFG batch),
Flux.1 dev/schnell (a `transformer` on packed 2x2 latent patches, flow matching, a 16-channel
VAE with a shift, CLIP-L pooled + T5 sequence, guidance as an embedding instead of a CFG batch)
Chroma (Flux-shaped, T5 only, real CFG), SD3/SD3.5 (an MMDiT `transformer`, CLIP-L + CLIP-G
+ T5, flow matching with the CFG batch), Z-Image (a Qwen3 text encoder, a single-stream
`transformer` that takes lists, Flux's VAE) and Qwen-Image (a Qwen2.5-VL text encoder, an MMDiT
`transformer` with real CFG, a 3D VAE with per-channel latent statistics).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.core.components import Role, of_role
from app.core.errors import HalfSafeError
from app.core.settings import SCHEDULERS

PROBE_CFG = 7.0  # the check's classifier-free guidance scale (SD family)
PROBE_GUIDANCE = 3.5  # the check's distilled guidance (Flux.1 dev's guidance embedding)
PROBE_CHROMA_CFG = 5.0  # the check's guidance for Chroma (ChromaPipeline's default)
PROBE_SD3_CFG = 4.5  # the check's guidance for SD3.5 (its reference pipelines use 3.5 to 4.5)
PROBE_QWEN_CFG = 4.0  # the check's guidance for Qwen-Image (QwenImagePipeline's default)


@dataclass(frozen=True)
class Family:
    """Stable Diffusion 1.x/2.x: one CLIP text encoder, a UNet, a VAE."""

    name: str = "sd"

    def components(self, pipeline) -> list[str]:
        """The pipeline's checkable components, in run order."""
        from app.core.precision import pipeline_components

        return pipeline_components(pipeline)

    def text_encoders(self, pipeline) -> list[str]:
        return of_role(self.components(pipeline), Role.TEXT_ENCODER)

    def encode(self, pipe, prompt: str, negative: str, device, guidance: bool) -> dict[str, Any]:
        """The prompt as the pipeline's `__call__` takes it: prompt_embeds and, with guidance,
        negative_prompt_embeds (batch 1 each), read as AUTOMATIC1111 reads it (emphasis, BREAK,
        77-token chunks: `app.core.prompts`)."""
        from app.core.prompts import encode_sd

        return encode_sd(pipe, prompt, negative, device, guidance)

    def encoder_outputs(self, pipe, tensors: dict[str, Any]) -> dict[str, list[Any]]:
        """Which parts of the encoded tensors each text encoder produced."""
        return {"text_encoder": _hidden(tensors)}

    def denoiser_inputs(self, conditioning: dict[str, Any], size: int, device) -> dict[str, Any]:
        """Keyword arguments of one UNet call on the CFG batch (negative first), beyond the
        latents and the timestep."""
        import torch

        text = torch.cat([conditioning["negative_prompt_embeds"], conditioning["prompt_embeds"]])
        return {"encoder_hidden_states": text}

    # -- the denoiser ------------------------------------------------------------------------

    denoiser: str = "unet"
    sample_argument: str = "sample"  # the denoiser's keyword for the latents
    timestep_argument: str = "timestep"  # and for the timestep

    def pipeline_embeds(self, embeds: dict[str, Any], batch: int) -> dict[str, Any]:
        """The encoded prompt (batch 1) as the pipeline's `__call__` takes it for `batch`
        images."""
        return {k: v.repeat(batch, *([1] * (v.dim() - 1))) for k, v in embeds.items()}

    def decode(self, vae, latents):
        """Latents (B, C, h, w) as the family's pipeline leaves them -> pixels (B, 3, H, W)."""
        z = latents / vae.config.scaling_factor
        shift = getattr(vae.config, "shift_factor", None)
        if shift:
            z = z + shift
        return vae.decode(z.to(vae.dtype)).sample

    def latent_factor(self, pipeline) -> int:
        """Pixels per latent cell along one side (8 for every VAE here)."""
        return 2 ** (len(pipeline.vae.config.block_out_channels) - 1)

    def make_scheduler(
        self,
        name: str,
        pipeline,
        prediction_type: str | None,
        *,
        zero_terminal_snr: bool = False,
    ) -> Any:
        return make_scheduler(
            name, pipeline.scheduler.config, prediction_type, zero_terminal_snr=zero_terminal_snr
        )

    def sampler_words(self, name: str) -> str:
        """The sampler as AUTOMATIC1111's PNG info names it."""
        from app.core.images import SAMPLER_NAMES

        return SAMPLER_NAMES[name]

    def probe_timesteps(self, model, steps: int, scheduler: str, size: int) -> list[float]:
        """The first, middle and last timestep of the user's schedule (see health)."""
        schedule = self.make_scheduler(
            scheduler,
            model.pipeline,
            model.prediction_type,
            zero_terminal_snr=getattr(model, "zero_terminal_snr", False),
        )
        schedule.set_timesteps(max(2, steps))
        timesteps = [int(t) for t in schedule.timesteps]
        picked = [timesteps[0], timesteps[len(timesteps) // 2], timesteps[-1]]
        return sorted(set(picked), reverse=True)

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

    def size_problem(self, pipeline, width: int, height: int) -> str | None:
        """Why this model cannot make a picture of this size (None: it can)."""
        return None

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

    def call_arguments(self, cfg: float) -> dict[str, Any]:
        """The pipeline call's guidance arguments."""
        return {"guidance_scale": cfg}

    def guidance_parameters(self, cfg: float) -> list[tuple[str, Any]]:
        """The guidance as A1111-style PNG parameters."""
        return [("CFG scale", f"{cfg:g}")]

    def image_latents(self, pipeline, latents, height: int, width: int):
        """The pipeline's latents as the VAE takes them, (B, C, h, w)."""
        return latents

    def clamped_blocks(self, denoiser) -> list[Any]:
        """Blocks whose fp16 output the model's own code clamps to +-65504 (so an overflow
        inside them comes out finite and wrong): the NaN watch counts a saturated output as
        an overflow. None in a UNet."""
        return []


@dataclass(frozen=True)
class SDXLFamily(Family):
    """SDXL: two CLIP text encoders whose hidden states lie side by side, pooled embeddings from
    the second, and size conditioning for the UNet."""

    name: str = "sdxl"

    def encode(self, pipe, prompt: str, negative: str, device, guidance: bool) -> dict[str, Any]:
        from app.core.prompts import encode_sdxl

        return encode_sdxl(pipe, prompt, negative, device, guidance)

    def encoder_outputs(self, pipe, tensors: dict[str, Any]) -> dict[str, list[Any]]:
        hidden = _hidden(tensors)
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


class _FlowMatching:
    """Families trained for flow matching (Flux, Chroma, SD3): whatever the sampler setting
    says, they sample with their own flow-matching Euler, which A1111/Forge name "Euler"."""

    def make_scheduler(
        self,
        name: str,
        pipeline,
        prediction_type: str | None,
        *,
        zero_terminal_snr: bool = False,  # flow matching has no betas to rescale
    ) -> Any:
        from diffusers import FlowMatchEulerDiscreteScheduler

        return FlowMatchEulerDiscreteScheduler.from_config(pipeline.scheduler.config)

    def sampler_words(self, name: str) -> str:
        return "Euler"


class _ShiftedSigmas(_FlowMatching):
    """Families whose pipeline sets sigmas linear from 1 to 1/steps and lets the scheduler
    shift them, by the image's sequence length where its config says so (Flux, Chroma,
    Z-Image, Qwen-Image: the same `calculate_shift` rule)."""

    def latent_factor(self, pipeline) -> int:  # as Family's (the mixin comes first)
        return 2 ** (len(pipeline.vae.config.block_out_channels) - 1)

    def _sigmas(self, pipeline, steps: int, size: int) -> list[float]:
        """The sigmas the pipeline runs at this step count and size: linear from 1 to 1/steps,
        shifted as its scheduler config says (by resolution where it shifts dynamically)."""
        import numpy as np
        from diffusers.pipelines.flux.pipeline_flux import calculate_shift

        scheduler = self.make_scheduler("euler", pipeline, None)
        config = scheduler.config
        side = size // self.latent_factor(pipeline) // 2
        mu = calculate_shift(
            side * side,
            config.get("base_image_seq_len", 256),
            config.get("max_image_seq_len", 4096),
            config.get("base_shift", 0.5),
            config.get("max_shift", 1.15),
        )
        sigmas = np.linspace(1.0, 1 / steps, steps).tolist()
        scheduler.set_timesteps(sigmas=sigmas, mu=mu)
        return [float(s) for s in scheduler.sigmas[:-1]]

    def probe_timesteps(self, model, steps: int, scheduler: str, size: int) -> list[float]:
        """The first, middle and last timestep (sigma x 1000) of the flow-matching schedule
        that the pipeline runs at the user's step count and this size."""
        sigmas = self._sigmas(model.pipeline, max(2, steps), size)
        picked = {sigmas[0], sigmas[len(sigmas) // 2], sigmas[-1]}
        return sorted((round(s * 1000.0, 2) for s in picked), reverse=True)


@dataclass(frozen=True)
class FluxFamily(_ShiftedSigmas, Family):
    """Flux.1 dev and schnell: CLIP-L gives a pooled vector, T5 the token sequence; a
    `transformer` denoises 2x2 patches of a 16-channel latent by flow matching; dev takes the
    guidance scale as an embedding (one batch, no negative prompt), schnell takes none."""

    name: str = "flux"
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
        return _input_channels_problem(
            pipeline, "latent_channels", 4, " (a Fill, Depth or Canny model?)"
        )

    def noise(self, pipeline, seeds: list[int], height: int, width: int):
        from diffusers import FluxPipeline

        return _packed_noise(self, pipeline, FluxPipeline._pack_latents, (), seeds, height, width)

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


@dataclass(frozen=True)
class ChromaFamily(FluxFamily):
    """Chroma: Flux-shaped (packed 2x2 patches of a 16-channel latent, double and single
    blocks, flow matching) with T5 as its only text encoder, its modulation computed by a small
    network instead of a guidance embedding, and real CFG: a second call on the negative prompt,
    each with T5's attention mask."""

    name: str = "chroma"

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
        return {"text_encoder": _hidden(tensors)}

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


@dataclass(frozen=True)
class SD3Family(_FlowMatching, Family):
    """Stable Diffusion 3 / 3.5 (large and medium): CLIP-L and CLIP-G give token features side
    by side and a pooled vector each, T5-XXL the longer token sequence after them; an MMDiT
    `transformer` denoises 2x2 patches of a 16-channel latent by flow matching, with the CFG
    batch (negative first) as SD does."""

    name: str = "sd3"
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
        hidden = _hidden(tensors)
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
        return _input_channels_problem(pipeline, "latent_channels", 1)

    def noise(self, pipeline, seeds: list[int], height: int, width: int):
        import torch

        factor = self.latent_factor(pipeline)
        shape = (1, pipeline.transformer.config.in_channels, height // factor, width // factor)
        generators = [torch.Generator().manual_seed(seed) for seed in seeds]
        return torch.cat([torch.randn(shape, generator=g) for g in generators]), generators


@dataclass(frozen=True)
class ZImageFamily(_ShiftedSigmas, Family):
    """Z-Image (Turbo and base): a Qwen3 text encoder whose second-to-last hidden states, the
    prompt's tokens only in the chat format, condition a single-stream `transformer` (refiner
    blocks for the noise and the caption, then joint blocks) on 2x2 patches of Flux's
    16-channel latent, by flow matching. The transformer takes lists (one latent and one
    caption per image) and predicts the negative velocity. CFG is optional: Turbo samples
    without it (CFG scale 1); the pipeline's `guidance_scale` is the user's CFG scale minus 1
    (prompt + s x (prompt - negative))."""

    name: str = "zimage"
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
        return {"text_encoder": _hidden(tensors)}

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
        return _patches_problem(self, pipeline, width, height)

    def text_to_image_problem(self, pipeline) -> str | None:
        return _input_channels_problem(pipeline, "latent_channels", 1)

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


@dataclass(frozen=True)
class QwenImageFamily(_ShiftedSigmas, Family):
    """Qwen-Image: a Qwen2.5-VL text encoder whose last hidden states (the prompt's tokens
    after its system instruction) condition an MMDiT `transformer` on packed 2x2 patches of a
    16-channel latent, by flow matching with real CFG (a second call on the negative prompt,
    its result rescaled to the prompt's norm); a causal 3D VAE (one frame per image) with a
    per-channel latent mean and spread."""

    name: str = "qwenimage"
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
        return {"text_encoder": _hidden(tensors)}

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
        return _patches_problem(self, pipeline, width, height)

    def text_to_image_problem(self, pipeline) -> str | None:
        return _input_channels_problem(pipeline, "z_dim", 4)

    def noise(self, pipeline, seeds: list[int], height: int, width: int):
        from diffusers import QwenImagePipeline

        # The 3D VAE's latents carry a frame axis of one.
        return _packed_noise(
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


def _patches_problem(family: Family, pipeline, width: int, height: int) -> str | None:
    """A family on 2x2 patches of the latent needs each side a multiple of twice the VAE's
    factor (16 px): its pipeline refuses or silently resizes anything else."""
    step = 2 * family.latent_factor(pipeline)
    if width % step or height % step:
        return (
            f"this model makes pictures whose sides are multiples of {step} px, "
            f"not {width}x{height}."
        )
    return None


def _hidden(tensors: dict[str, Any]) -> list[Any]:
    return [tensors[k] for k in ("prompt_embeds", "negative_prompt_embeds") if k in tensors]


def family_of(pipeline) -> Family:
    """The family a loaded pipeline belongs to, from the components it has."""
    transformer = getattr(pipeline, "transformer", None)
    if transformer is not None and type(transformer).__name__ == "FluxTransformer2DModel":
        return FluxFamily()
    if transformer is not None and type(transformer).__name__ == "ChromaTransformer2DModel":
        return ChromaFamily()
    if transformer is not None and type(transformer).__name__ == "SD3Transformer2DModel":
        return SD3Family()
    if transformer is not None and type(transformer).__name__ == "ZImageTransformer2DModel":
        return ZImageFamily()
    if transformer is not None and type(transformer).__name__ == "QwenImageTransformer2DModel":
        return QwenImageFamily()
    if getattr(pipeline, "text_encoder_2", None) is not None:
        return SDXLFamily()
    return Family()


def make_scheduler(
    name: str, config, prediction_type: str | None = None, *, zero_terminal_snr: bool = False
) -> Any:
    """A diffusers scheduler for one of `settings.SCHEDULERS`, from the model's scheduler
    config. The model's prediction type (epsilon or v_prediction) is carried over; a
    zero-terminal-SNR model gets rescaled betas and trailing timesteps (each sampler here
    supports both)."""
    from diffusers import (
        DDIMScheduler,
        DPMSolverMultistepScheduler,
        EulerAncestralDiscreteScheduler,
        EulerDiscreteScheduler,
    )

    extra: dict[str, Any] = {}
    if prediction_type:
        extra["prediction_type"] = prediction_type
    if zero_terminal_snr:
        extra.update(rescale_betas_zero_snr=True, timestep_spacing="trailing")
    if name == "euler":
        return EulerDiscreteScheduler.from_config(config, **extra)
    if name == "euler_a":
        return EulerAncestralDiscreteScheduler.from_config(config, **extra)
    if name == "dpmpp_2m_karras":
        return DPMSolverMultistepScheduler.from_config(
            config,
            algorithm_type="dpmsolver++",
            solver_order=2,
            use_karras_sigmas=True,
            **extra,
        )
    if name == "ddim":
        return DDIMScheduler.from_config(config, **extra)
    raise HalfSafeError(f"Unknown sampler {name!r}: use one of {', '.join(SCHEDULERS)}.")


def _packed_noise(family, pipeline, pack, frames: tuple[int, ...], seeds, height, width):
    """Seeded noise per image (made on the CPU, as every family's), packed into 2x2 latent
    patches by the pipeline's own `pack`; `frames` are extra axes before the channels."""
    import torch

    factor = family.latent_factor(pipeline)
    channels = pipeline.transformer.config.in_channels // 4
    h, w = 2 * (height // (factor * 2)), 2 * (width // (factor * 2))
    generators = [torch.Generator().manual_seed(seed) for seed in seeds]
    packed = [
        pack(torch.randn((1, *frames, channels, h, w), generator=g), 1, channels, h, w)
        for g in generators
    ]
    return torch.cat(packed), generators


def _input_channels_problem(pipeline, latent_key: str, per_latent: int, hint: str = ""):
    """A transformer that takes other than `per_latent` input channels per VAE latent channel
    (the VAE config's `latent_key`) is not a text-to-image model (a Fill, Depth or Canny one)."""
    channels = pipeline.transformer.config.in_channels
    latent = getattr(pipeline.vae.config, latent_key)
    if channels != latent * per_latent:
        return (
            f"its transformer takes {channels} input channels where text-to-image with this "
            f"{latent}-channel VAE takes {latent * per_latent}{hint}."
        )
    return None
