"""What every model family is: its identity, its latent format, and the steps the health
check and generation call on it (encode a prompt, step the denoiser, make noise, decode).

A family module (`sd.py`, `flux.py`, ...) subclasses `Family` and overrides what differs;
`registry.py` lists them in the order they are recognised. torch and diffusers are imported
inside the methods that need them, so that naming a family stays cheap (the GUI does).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from app.core import samplers
from app.core.components import Role, of_role
from app.core.detection import Detection
from app.core.families import picture_modes
from app.core.families.faults import ToolFault
from app.core.families.variants import PublishedVariant
from app.core.formats.layouts import Layout
from app.core.images.pictures import FROM_NOISE, Mode
from app.core.words import infotext

if TYPE_CHECKING:
    from app.core.families.checkpoints import Checkpoint


class FamilyId(str):
    """A model family's name: the name in profiles and library entries, and the first word of a
    model's `architecture` (what the JSON reports: "sdxl", "sd2-inpaint", "flux-dev"). Each
    family module names its own (`id`); the registry knows them all (`registry.family`)."""

    __slots__ = ()


@dataclass(frozen=True)
class LatentFormat:
    """What the family's denoiser works on: `channels` per latent cell and, for the live
    preview, a linear map to RGB (`rgb_factors`: one (r, g, b) row per channel, `rgb_bias`)
    known for its VAE. None: the preview fits one to the loaded VAE (`app.core.generation.preview`)."""

    channels: int
    rgb_factors: tuple[tuple[float, float, float], ...] | None = None
    rgb_bias: tuple[float, float, float] = (0.0, 0.0, 0.0)


@dataclass(frozen=True)
class GenerationDefaults:
    """A model's own steps and CFG scale, where its makers publish them (a distilled model's
    few steps without CFG), with where they come from, for sentences ("Z-Image Turbo's")."""

    steps: int
    cfg: float
    whose: str

    def words(self) -> str:
        """ "9 steps at CFG scale 1, Z-Image Turbo's defaults"."""
        return f"{self.steps} steps at CFG scale {self.cfg:g}, {self.whose} defaults"


@dataclass(frozen=True)
class Family:
    """A model family. Subclasses set the class attributes below and override the steps that
    differ; the defaults are a UNet family's (SD)."""

    id: ClassVar[FamilyId]
    title: ClassVar[str]  # for sentences: "Flux.1", "SDXL"
    # HalfSafe's architecture names in this family and how each is shown ("flux-dev":
    # "Flux.1 dev"); the first is the family's own.
    architectures: ClassVar[Mapping[str, str]]
    # Raised when what the family recognises in a file or folder changes without a new
    # architecture name (a marker read differently, a variant told by its name): the library's
    # cache is keyed on it, with the ids and architectures of every family, so rows a scan
    # kept before the change are read again (`library.index.index_version`).
    detection_version: ClassVar[int] = 1
    # The words trainers write for a base model of this family (kohya's ss_base_model_version,
    # modelspec.architecture), each a pattern and the architecture it means, matched in order
    # (the registry's order across families) on the words lowered, with `_`, `.` and spaces as
    # `-` (`library.metadata.base_architecture`).
    trainer_words: ClassVar[tuple[tuple[str, str], ...]] = ()
    latent: ClassVar[LatentFormat]
    # The diffusers class of a loaded pipeline's `transformer` that marks the family (None: a
    # UNet family, told apart by its text encoders).
    transformer_class: ClassVar[str | None] = None
    # The denoiser's output channels per latent channel: 4 where it works on 2x2 patches packed
    # into channels (Flux.1, Chroma), else 1.
    packed_channels: ClassVar[int] = 1
    # How its transformer is kept as a file of its own (ComfyUI's `diffusion_models/`): the
    # keys that mark it, its config from shapes, its key table. None: no such file is read.
    layout: ClassVar[Layout | None] = None
    # The shipped configs (app/resources/configs) its single-file checkpoints of the original
    # Stable Diffusion layout load with (`detect_checkpoint`'s `config_name`).
    checkpoint_configs: ClassVar[tuple[str, ...]] = ()
    # Key fragments that mark this family's weights in a layout HalfSafe does not read (a
    # checkpoint of another tool's making), each with the words for such a file.
    file_markers: ClassVar[tuple[tuple[str, str], ...]] = ()
    # The families (by id) whose LoRAs its models run as their own, having been made from them:
    # such a LoRA that fits only in part is applied with a note, never refused as another's.
    lora_kin: ClassVar[tuple[str, ...]] = ()
    # The diffusers pipeline class a model folder's model_index.json names for this family,
    # when it is recognised by `detect_folder` (None: the UNet families, see architecture).
    pipeline_class: ClassVar[str | None] = None
    # What ComfyUI users call the files its transformer runs with, by component ("clip_l",
    # "t5xxl", "ae"): the stems of the files the model is written to in its own layouts.
    companion_names: ClassVar[Mapping[str, str]] = {}
    # The diffusers pipelines that start from a picture, by mode (image-to-image, inpainting):
    # each takes the picture's latents as the VAE encoder made them (`encode_pixels`).
    picture_pipelines: ClassVar[Mapping[Mode, str]] = {}

    # Whether diffusers' step cache (the first-block cache, `generation.step_cache`) runs on
    # its transformer: its blocks are ones diffusers knows how to skip, and its pipeline keeps
    # the cache's context (the conformance suite holds each family to it).
    takes_step_cache: ClassVar[bool] = False
    # Whether its pipeline keeps the prompt's keys and values from the first step and reuses
    # them in every later step (the prompt cache, `generation.step_cache`; Qwen-Image 2.1's
    # `use_kv_cache`), which `prompt_cache_arguments` turns on (the conformance suite holds
    # each family to it).
    takes_prompt_cache: ClassVar[bool] = False

    # Whether `encode` takes `clip_skip` (A1111's "Clip skip"): the families whose prompt is
    # read from CLIP's hidden states (SD1/SD2, SDXL).
    takes_clip_skip: ClassVar[bool] = False

    # What its models are known to overflow in fp16 in other tools, and how those tools'
    # records say such a model: `explain`'s first guess where the model cannot be checked.
    tool_faults: ClassVar[tuple[ToolFault, ...]] = ()
    # Its denoiser's published sizes, oldest first, where a loader that knows only the first
    # would build a later one wrong (`variants.py`): what explain says before any numbers.
    variants: ClassVar[tuple[PublishedVariant, ...]] = ()

    # Whether its VAE's `force_upcast` says it overflows fp16 (SDXL's original VAE sets it and
    # does; other families set it without needing it).
    force_upcast_means_fp32: ClassVar[bool] = False

    # A checkpoint's own: the native size of each architecture by prediction type, where it
    # differs (SD 2.x's 768-v and 512 models), and the keywords its pipeline is built with.
    native_by_prediction: ClassVar[Mapping[str, Mapping[str, int]]] = {}
    checkpoint_pipeline_options: ClassVar[Mapping[str, Any]] = {}

    # Whether ComfyUI applies this family's rotary embeddings through comfy-kitchen's fused ops
    # (comfy/ldm/flux/math.py's apply_rope and apply_rope1, which its Flux and Chroma layers
    # call): a clean check of a ComfyUI image of it compares those kernels (`explain.kitchen`).
    comfyui_fused_rope: ClassVar[bool] = False

    denoiser: str = "unet"
    sample_argument: str = "sample"  # the denoiser's keyword for the latents
    timestep_argument: str = "timestep"  # and for the timestep

    def owns(self, pipeline) -> bool:
        """Whether a loaded pipeline is of this family."""
        transformer = getattr(pipeline, "transformer", None)
        return transformer is not None and type(transformer).__name__ == self.transformer_class

    def components(self, pipeline) -> list[str]:
        """The pipeline's checkable components, in run order."""
        from app.core.precision import pipeline_components

        return pipeline_components(pipeline)

    def text_encoders(self, pipeline) -> list[str]:
        return of_role(self.components(pipeline), Role.TEXT_ENCODER)

    def detect_checkpoint(self, file: Checkpoint) -> Detection | None:
        """What a single file of the original Stable Diffusion layout is, when it is of this
        family (None: it is not). Families kept as transformer files answer through their
        `layout` instead."""
        return None

    def detect_unet_folder(
        self, model_index: Mapping[str, Any], unet: Mapping[str, Any], scheduler: Mapping[str, Any]
    ) -> Detection | None:
        """What a diffusers folder with a UNet is, when it is of this family (None: it is not);
        `unet` has passed `config_limits.check_unet_config`."""
        return None

    def detect_folder(
        self,
        model_index: Mapping[str, Any],
        transformer: Mapping[str, Any],
        scheduler: Mapping[str, Any],
    ) -> Detection:
        """What a diffusers folder of this family is (`pipeline_class` named in its
        model_index.json; `transformer` its denoiser's config, `scheduler` its scheduler's),
        with the sentence why."""
        raise NotImplementedError

    def generation_defaults(self, architecture: str) -> GenerationDefaults | None:
        """The steps and CFG scale a model of this architecture runs at when the user gives
        none for the job (None: the saved settings' apply, as for most models)."""
        return None

    def profile_name(self, architecture: str) -> str:
        """The architecture's name in the keys of what is saved per model (remembered fixes,
        reports): its own, unless it once had another (a variant told apart later keeps the
        name its saved state was keyed by)."""
        return architecture

    def recognises(self, class_name: str) -> bool:
        """Whether a diffusers folder whose model_index.json names `class_name` is of this
        family (its text-to-image pipeline; `Editing` adds its editing pipelines)."""
        return class_name == self.pipeline_class

    def folder_parts(self, folder: Path) -> dict[str, Any]:
        """Parts of a diffusers folder of this family that HalfSafe builds itself and hands to
        diffusers' loader (where that loader would need a package HalfSafe does not ship);
        raises ValueError or OSError for a part it cannot build."""
        return {}

    def load_folder(
        self, folder: Path, components: Mapping[str, Any], dtypes: Mapping[str, Any]
    ) -> Any:
        """The pipeline of a checked diffusers folder of this family (`components`: name ->
        [library, class] of the parts it holds; `dtypes`: the torch dtype per part and
        "default"), for a family diffusers' `DiffusionPipeline` does not load (one diffusers
        has as a modular pipeline only); None: diffusers loads it."""
        return None

    def pipeline_from_parts(self, components: dict[str, Any]) -> Any:
        """The pipeline of parts read from a transformer file and its companions (`components`
        by pipeline name, the tokenizers and scheduler among them), for a family whose
        pipeline diffusers does not build from them; None: diffusers' `pipeline_class` does."""
        return None

    # -- the steps each family defines ------------------------------------------------------

    def encode(self, pipe, prompt: str, negative: str, device, guidance: bool) -> dict[str, Any]:
        """The prompt as the pipeline's `__call__` takes it (batch 1 each)."""
        raise NotImplementedError

    def upsample(
        self, pipe, prompt: str, device, max_new_tokens: int | None, forced=None, references=()
    ) -> Any:
        """What the pipeline's prompt upsampler (a `prompt_upsampler` component; asked only
        where the pipeline has one) writes for `prompt`: an object with the caption (`text`),
        the new tokens (`tokens`, 1 x n), each step's raw logits (`logits`, 1 x n x vocab;
        None for a job's, `max_new_tokens` None) and whether they were all finite (`finite`),
        at most `max_new_tokens` (None: as many as the model's own pipeline allows, for a job)
        greedily, or the `forced` tokens; an edit's instruction from its `references` (RGB PIL
        images)."""
        raise NotImplementedError

    def clip_skip_problem(self, clip_skip: int) -> str | None:
        """Why a job cannot run at A1111's "Clip skip" `clip_skip` (None: it can)."""
        if clip_skip == 1 or self.takes_clip_skip:
            return None
        return (
            f"Clip skip {clip_skip} applies to the CLIP text encoders of Stable Diffusion 1.x, "
            f"2.x and SDXL; {self.title} does not read its prompt from them: set Clip skip to 1."
        )

    def encoder_outputs(self, pipe, tensors: dict[str, Any]) -> dict[str, list[Any]]:
        """Which parts of the encoded tensors each text encoder produced, in run order (a
        failure is blamed on the first encoder that failed)."""
        raise NotImplementedError

    def denoiser_inputs(self, conditioning: dict[str, Any], size: int, device) -> dict[str, Any]:
        """Keyword arguments of one denoiser call on the probe's batch, beyond the latents
        and the timestep."""
        raise NotImplementedError

    def probe_denoise(self, pipe, conditioning, size: int, device, timesteps) -> Any:
        """The check's denoising through `timesteps` from seeded noise; returns the latents
        (1, C, h, w) the VAE decodes."""
        raise NotImplementedError

    def text_to_image_problem(self, pipeline) -> str | None:
        """Why this model cannot make text-to-image pictures (None: it can)."""
        raise NotImplementedError

    def noise(self, pipeline, seeds: list[int], height: int, width: int):
        """Initial latents as the pipeline takes them, from per-image CPU generators (so a seed
        means the same image on every device); returns (latents, generators)."""
        raise NotImplementedError

    # -- shared defaults --------------------------------------------------------------------

    def pipeline_embeds(self, embeds: dict[str, Any], batch: int) -> dict[str, Any]:
        """The encoded prompt (batch 1) as the pipeline's `__call__` takes it for `batch`
        images."""
        return {k: v.repeat(batch, *([1] * (v.dim() - 1))) for k, v in embeds.items()}

    def decode(self, vae, latents):
        """Latents (B, C, h, w) as the family's pipeline leaves them -> pixels (B, 3, H, W) in
        [-1, 1], or (B, 4, H, W) where the VAE decodes RGBA (the alpha last)."""
        z = latents / vae.config.scaling_factor
        shift = getattr(vae.config, "shift_factor", None)
        if shift:
            z = z + shift
        return vae.decode(z.to(vae.dtype)).sample

    def encode_pixels(self, vae, pixels):
        """Pixels (B, 3, H, W) in [-1, 1] -> latents as the family's picture pipelines take
        them (the inverse of `decode`): the mode of the VAE encoder's distribution, shifted and
        scaled, so that a picture means the same latents on every run."""
        z = vae.encode(pixels.to(vae.dtype)).latent_dist.mode()
        shift = getattr(vae.config, "shift_factor", None)
        if shift:
            z = z - shift
        return z * vae.config.scaling_factor

    def sequence_latents(self, pipeline, mode: Mode, encoded, mask=None) -> list[Any] | None:
        """What the denoiser reads beside the noise in a job of `mode`, from what the check's
        VAE-encoder stage made of its pictures (`encoded`: an edit's references, a picture's
        latents, or inpainting's picture and picture with its hole) and inpainting's `mask`
        (1, 1, H, W): an edit's references (`probe_edit` reads them); None where it reads
        none."""
        return list(encoded) if mode is Mode.EDIT else None

    def redraws_from_noise(self, pipeline, mode: Mode) -> bool:
        """Whether a job of `mode` draws from noise with every step run, so that no strength
        applies: text-to-image, an edit, a control picture, and an inpainting model that reads
        the masked picture only beside the noise (Flux.1 Fill). Else the job starts from the
        picture's latents noised to the strength."""
        return mode in FROM_NOISE

    def encodes_its_pictures(self, pipeline, mode: Mode) -> bool:
        """Whether a job of `mode` has its pipeline encode the pictures (`picture_modes`)."""
        return picture_modes.encodes_its_pictures(self, pipeline, mode)

    def own_encoding_call(self, pipeline, pictures) -> dict[str, Any]:
        """The call arguments that hand a pipeline which `encodes_its_pictures` the pictures of
        a job that is not an edit (an edit's are `edit_call`'s)."""
        raise NotImplementedError

    def pipeline_arguments(self, pipeline, width: int, height: int) -> dict[str, Any]:
        """Call arguments a pipeline of this family needs beyond the common ones to draw at
        exactly width x height (none by default)."""
        return {}

    def picture_pipeline(self, pipe, mode: Mode, latent_channels: int):
        """The family's pipeline for `mode` on `pipe`'s placed components (`picture_modes`)."""
        return picture_modes.picture_pipeline(self, pipe, mode, latent_channels)

    def picture_problem(self, pipeline, mode: Mode) -> str | None:
        """Why this model cannot make pictures in `mode` (None: it can; `picture_modes`)."""
        return picture_modes.picture_problem(self, pipeline, mode)

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
        """The sampler as AUTOMATIC1111 names it in one word: "DPM++ 2M SDE Karras"."""
        return samplers.words(name)

    def sampler_record(self, name: str) -> tuple[str, str | None]:
        """The sampler as AUTOMATIC1111 1.9 and later record it: `Sampler` and `Schedule
        type` (None: the sampler's own schedule)."""
        return samplers.infotext_words(name)

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

    def size_problem(self, pipeline, width: int, height: int) -> str | None:
        """Why this model cannot make a picture of this size (None: it can)."""
        return None

    def call_arguments(self, cfg: float) -> dict[str, Any]:
        """The pipeline call's guidance arguments."""
        return {"guidance_scale": cfg}

    def prompt_cache_arguments(self, on: bool) -> dict[str, Any]:
        """The pipeline call's arguments that turn its prompt cache on or off (none where the
        family has none: `takes_prompt_cache`)."""
        return {}

    def guidance_parameters(self, cfg: float) -> list[tuple[str, Any]]:
        """The guidance as A1111-style PNG parameters."""
        return [(infotext.CFG_SCALE.name, f"{cfg:g}")]

    def image_latents(self, pipeline, latents, height: int, width: int):
        """The pipeline's latents as the VAE takes them, (B, C, h, w)."""
        return latents

    def clamped_blocks(self, denoiser) -> list[Any]:
        """Blocks whose fp16 output the model's own code clamps to +-65504 (so an overflow
        inside them comes out finite and wrong): the NaN watch counts a saturated output as
        an overflow. None in a UNet."""
        return []


class FlowMatching:
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

    def sampler_record(self, name: str) -> tuple[str, str | None]:
        return "Euler", None


class ShiftedSigmas(FlowMatching):
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


def patches_problem(
    family: Family, pipeline, width: int, height: int, patch: int = 2
) -> str | None:
    """A family on patches of the latent (2x2 in every one here) needs each side a multiple
    of the patch times the VAE's factor (16 px): its pipeline refuses anything else, or
    silently makes a smaller picture than the job asked for, or fails to pack a picture's
    latents."""
    step = patch * family.latent_factor(pipeline)
    if width % step or height % step:
        return (
            f"this model makes pictures whose sides are multiples of {step} px, "
            f"not {width}x{height}."
        )
    return None


def transformer_width(config: Mapping[str, Any]) -> int:
    """A diffusers transformer config's width: heads x head width (0 where it says neither)."""
    return int(config.get("num_attention_heads", 0)) * int(config.get("attention_head_dim", 0))


def prompt_tensors(tensors: dict[str, Any]) -> list[Any]:
    return [tensors[k] for k in ("prompt_embeds", "negative_prompt_embeds") if k in tensors]


def make_scheduler(
    name: str, config, prediction_type: str | None = None, *, zero_terminal_snr: bool = False
) -> Any:
    """A diffusers scheduler for one of `settings.SCHEDULERS`, from the model's scheduler
    config (`samplers.make`)."""
    return samplers.make(name, config, prediction_type, zero_terminal_snr=zero_terminal_snr)


def packed_noise(
    family, pipeline, pack, frames: tuple[int, ...], seeds, height, width, channels: int = 0
):
    """Seeded noise per image (made on the CPU, as every family's), packed into 2x2 latent
    patches by the pipeline's own `pack`; `frames` are extra axes before the channels, and
    `channels` the latent channels (by default a quarter of the transformer's input)."""
    import torch

    factor = family.latent_factor(pipeline)
    channels = channels or pipeline.transformer.config.in_channels // 4
    h, w = 2 * (height // (factor * 2)), 2 * (width // (factor * 2))
    generators = [torch.Generator().manual_seed(seed) for seed in seeds]
    packed = [
        pack(torch.randn((1, *frames, channels, h, w), generator=g), 1, channels, h, w)
        for g in generators
    ]
    return torch.cat(packed), generators


def input_channels_problem(pipeline, latent_key: str, per_latent: int, hint: str = ""):
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
