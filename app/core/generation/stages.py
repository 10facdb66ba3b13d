"""The stages of one generation job under a precision plan: the prompt encoded once (with an
editing model's reference pictures where its text encoder reads them), the input picture or
references through the VAE's encoder, the pipeline's denoising loop for the batch under the
NaN watch, and each image decoded, its pixels classified and its outcome recorded."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

from app.core import samplers
from app.core.encoders import t5
from app.core.encoders.prompts import clip_options
from app.core.families import capabilities, family_of
from app.core.fixing.quality import Quality
from app.core.generation import hires_pass, prompt_pass, step_cache
from app.core.generation.passes import Conditioning, Picture
from app.core.generation.preview import colours_for, latent_preview
from app.core.generation.records import GenerationRequest, PreviewCallback
from app.core.generation.watch import EncoderFlag, NanWatch, read_flags
from app.core.images.finished import PixelStats, to_image
from app.core.images.pictures import Mode, Pictures, steps_run
from app.core.jobs import CancelToken, ProgressCallback
from app.core.lora.files import strip_tags
from app.core.precision import PlacedPipeline, PrecisionPlan
from app.core.run import pictures as picture_parts
from app.core.run.stage_run import StageRun, running

PREVIEWS_PER_IMAGE = 6


@dataclass
class Outcome:
    """One image made under one plan: its latents, pixels, and where it went non-finite."""

    plan: PrecisionPlan
    latents: Any  # (1, C, h, w) on the device
    image: Any  # PIL
    stats: PixelStats
    bad_encoder: str | None = None
    bad_step: int | None = None  # 1-based
    unet_input: dict[str, Any] | None = None  # the denoiser call that went non-finite
    watched: bool = True
    denoiser: str = "unet"  # the family's denoiser component
    step_cache: float = 0.0  # the step cache's threshold it was denoised with (0: none)
    prompt_cache: bool = False  # whether the pipeline's prompt cache was on for it
    # A hires fix with a pixel upscaler: the first pass's latents (1, C, h, w), where their
    # decode went non-finite (the VAE's failing input, not `latents`), and the enlarged picture
    # (1, C, H, W) on the CPU that the VAE's encoder read at the final size.
    vae_latents: Any = None
    enlarged: Any = None

    @property
    def cached(self) -> bool:
        """Whether it was denoised with a cache on (the step cache, the prompt cache)."""
        return self.step_cache > 0 or self.prompt_cache


def failure(outcome: Outcome) -> str | None:
    """The component to blame for a non-finite image (None: finite, or unknown when unwatched)."""
    if outcome.bad_encoder:
        return outcome.bad_encoder
    if outcome.bad_step is not None:
        return outcome.denoiser
    if outcome.stats.non_finite > 0:
        return "vae" if outcome.watched else ""
    return None


class Stages:
    """Runs the stages of one request on one PlacedPipeline, on the calling thread.

    The job's whole state is set here, what its probes and repairs find included, so that a job
    is built from one signature; `probes.Probes`, `repair.Repairs` and `job.Job` add methods.
    """

    def __init__(
        self,
        model,
        request: GenerationRequest,
        plan: PrecisionPlan,
        *,
        device,
        bf16_native: bool,
        watch: bool,
        progress: ProgressCallback,
        preview: PreviewCallback | None,
        cancel: CancelToken,
        pictures: Pictures | None = None,
    ) -> None:
        self.model = model
        self.pictures = pictures
        self.request = request
        self.plan = plan
        self.device = device
        self.bf16_native = bf16_native
        self.watch = watch
        self.progress = progress
        self.preview = preview
        self.cancel = cancel
        self.placed = PlacedPipeline(model.pipeline, plan, components=())  # placed per stage
        self.family = family_of(model.pipeline)
        self.do_cfg = request.cfg > 1.0
        self.repair_plan = plan  # every fix found so far, on top of the plan
        self.fix_settings: dict[str, Any] = {}
        self.fix_words: list[str] = []
        self.fixed_components: list[str] = []
        self.first_bad: dict[str, str] = {}  # component -> first layer seen going non-finite
        self.qualities: dict[str, Quality] = {}  # component -> its fix against fp32
        self._references: dict[tuple[str, int], Any] = {}  # fp32 outputs of failing parts
        self.last_probe: Any = None  # the last recorded probe (`_read`)
        self.stage = "Generating"
        self.dropped: list[str] = []  # candidates that failed to run, as sentences
        # For an editing pipeline that encodes its references itself: the device-side flag its
        # VAE encoder's hook kept in the last denoising run.
        self.pipeline_encoder: EncoderFlag | None = None
        # Per (component, id(outcome)): the first bad layer of the probe re-run, and whether
        # that identical re-run went non-finite again (`probes.first_bad_module`).
        self._probed: dict[tuple[str, int], tuple[Any, str | None]] = {}
        self.recurred: dict[tuple[str, int], bool] = {}
        # The step cache's threshold the job denoises with (`step_cache`): 0 once a failure
        # made it rule the cache out, for the rest of the job.
        self.step_cache = request.step_cache
        self.prompt_cache = request.prompt_cache  # likewise, the prompt cache
        self.upsampled: str | None = None  # the prompt upsampler's caption, once written
        self.upsampler_ran = False
        self.notes: list[str] = []  # sentences for the result's warnings

    @contextmanager
    def running_stage(self, plan: PrecisionPlan, components: list[str]) -> Iterator[StageRun]:
        """One stage (`run.stage_run.running`) with only its `components` placed, on a twin
        that calls as the request asks: its scheduler, no progress bar."""
        scheduler = self.family.make_scheduler(
            self.request.scheduler,
            self.model.pipeline,
            self.model.prediction_type,
            zero_terminal_snr=getattr(self.model, "zero_terminal_snr", False),
        )
        with running(self.placed, plan, components) as stage:
            stage.pipe.scheduler = scheduler
            stage.pipe.set_progress_bar_config(disable=True)
            yield stage

    def encode(self, plan: PrecisionPlan, record: str | None = None) -> Conditioning:
        """The prompt and the negative prompt through the text encoders under `plan`, with a
        device-side flag per encoder where the job watches; with `record` (a text encoder),
        every layer of that encoder is recorded and its first bad one kept (`_read`)."""
        from app.core.fixing.probe import ActivationRecorder

        prompt = prompt_pass.written_prompt(self, plan)
        encoders = self.family.text_encoders(self.model.pipeline)
        request = self.request
        saturated: dict[str, list[Any]] = {}
        with self.running_stage(plan, encoders) as stage:
            pipe = stage.pipe
            recorder = stage.watching(ActivationRecorder(self.placed[record])) if record else None
            if self.watch:
                for name in encoders:
                    for block in t5.clamped_blocks(self.placed[name]):
                        stage.hooks.after(block, prompt_pass.saturation_hook(saturated, name))
            negative = strip_tags(request.negative_prompt)
            if self.editing:
                assert self.pictures is not None
                tensors = capabilities.editing(self.family).encode_edit(
                    pipe, prompt, negative, self.device, self.do_cfg, self.pictures.references
                )
            else:
                tensors = self.family.encode(
                    pipe,
                    prompt,
                    negative,
                    self.device,
                    self.do_cfg,
                    **clip_options(request.clip_skip),
                )
            bad = (
                prompt_pass.encoder_flags(self.family, pipe, tensors, saturated)
                if self.watch
                else {}
            )
        self._read(recorder, None)
        return Conditioning(tensors, bad)

    @property
    def editing(self) -> bool:
        return self.pictures is not None and self.pictures.mode is Mode.EDIT

    def encode_picture(
        self, plan: PrecisionPlan, record: bool = False, pixels: Any = None
    ) -> Picture:
        """The input picture through the VAE's encoder under `plan` (and, for inpainting, the
        picture with its hole grey, as an inpainting model takes it beside the mask; for an
        edit, each reference as its pipeline encodes it), or `pixels` (B, C, H, W) in [-1, 1]
        (a hires fix's enlarged picture); with `record`, the first layer that went non-finite
        is kept (`_read`)."""
        import torch

        from app.core.fixing.probe import ActivationRecorder

        with running(self.placed, plan, ["vae"]) as stage:
            vae = self.placed["vae_encoder"]
            recorder = stage.watching(ActivationRecorder(vae)) if record else None
            encoded = self._encoded(vae, pixels)
        bad = torch.stack([~torch.isfinite(part).all() for part in encoded]).any()
        if pixels is None and self.editing:
            self._read(recorder, encoded)
            return Picture([part.float() for part in encoded], None, bad)
        latents, masked = encoded[0], encoded[1] if len(encoded) > 1 else None
        self._read(recorder, latents)
        return Picture(latents.float(), masked.float() if masked is not None else None, bad)

    def _encoded(self, vae, pixels: Any = None) -> list[Any]:
        """What `encode_picture`'s stage encodes, in order: `pixels`; or an edit's references;
        or the input picture and, for inpainting, the picture with its hole."""
        references = None
        if pixels is None and self.editing:
            assert self.pictures is not None
            edits = capabilities.editing(self.family)
            references = edits.edit_pixels(self.model.pipeline, self.pictures)
        return picture_parts.encoded(
            self.family, vae, self.device, self.pictures, references, pixels=pixels
        )

    def noise(self, seeds: list[int]):
        """Initial latents as the family's pipeline takes them and per-image generators (CPU,
        so a seed means the same image on every device); the generators go on to feed
        ancestral samplers' noise."""
        latents, generators = self.family.noise(
            self.model.pipeline, seeds, self.request.height, self.request.width
        )
        return latents.to(self.device), generators

    def denoise(
        self,
        plan: PrecisionPlan,
        conditioning: Conditioning,
        seeds: list[int],
        picture: Picture | None = None,
        second: GenerationRequest | None = None,
    ):
        """The pipeline's denoising loop for these seeds, from noise or from the input
        `picture`'s latents; returns (latents, watch or None). `second` is a hires fix's second
        pass (its size, steps and strength), drawn from `picture`, the first pass's latents
        enlarged."""
        import torch

        colours = _colours(self, plan) if self.preview is not None else None
        # The denoiser alone, and the VAE where the pipeline encodes the pictures itself.
        encodes = self.pictures is not None and picture is None
        with self.running_stage(
            plan, [self.family.denoiser, *(["vae"] if encodes else [])]
        ) as stage:
            pipe = stage.pipe
            batch = len(seeds)
            request = second or self.request
            arguments: dict[str, Any] = {"height": request.height, "width": request.width}
            arguments.update(self.family.pipeline_arguments(pipe, request.width, request.height))
            embeds = self.family.pipeline_embeds(conditioning.embeds, batch)
            generators: list[Any] = []
            mode = Mode.IMAGE if second is not None else picture_mode(self.pictures)
            if picture is None or self.family.redraws_from_noise(pipe, mode):
                latents, generators = self.noise(seeds)
                arguments["latents"] = latents
            if self.editing:
                # The references join the sequence: the pipeline takes their latents, or encodes
                # the pictures itself under a hook that keeps a device-side flag.
                embeds = capabilities.editing(self.family).edit_call(
                    pipe,
                    conditioning.embeds,
                    batch,
                    picture.latents if picture is not None else None,
                    self.pictures,
                    (request.width, request.height),
                )
                if picture is None and self.watch:
                    self.pipeline_encoder = EncoderFlag(
                        self.placed["vae_encoder"], self.device, stage.hooks
                    )
                arguments = _accepted(pipe, arguments)
            elif self.pictures is not None and picture is None:
                # The pipeline encodes its picture itself (Flux.1 Fill), watched by hooks.
                arguments.update(self.family.own_encoding_call(pipe, self.pictures))
                if self.watch:
                    self.pipeline_encoder = EncoderFlag(
                        self.placed["vae_encoder"], self.device, stage.hooks
                    )
                arguments = _accepted(pipe, arguments)
            elif picture is not None and mode is Mode.CONTROL:
                # The control picture's latents, from HalfSafe's watched encoder stage.
                arguments.update(
                    capabilities.control(self.family).control_call(pipe, picture.latents)
                )
                arguments = _accepted(pipe, arguments)
            elif picture is not None:
                pipe = self.family.picture_pipeline(pipe, mode, picture.latents.shape[1])
                pipe.set_progress_bar_config(disable=True)
                # The pipeline draws the noise it adds to the picture from these (on the CPU, so
                # that a seed means the same image on every device).
                generators = [torch.Generator().manual_seed(seed) for seed in seeds]
                arguments.update(image=picture.latents, strength=request.strength)
                if picture.masked is not None:
                    assert self.pictures is not None
                    arguments.update(
                        mask_image=self.pictures.mask_image, masked_image_latents=picture.masked
                    )
                arguments = _accepted(pipe, arguments)
            else:
                arguments = _accepted(pipe, arguments)
            samplers.seeded(pipe.scheduler, seeds)  # DPM++ SDE's Brownian noise: the images' seeds
            # A second-order sampler (Heun, DPM2) calls the denoiser twice per step but the last,
            # and diffusers' callback follows each call: progress counts the calls.
            order = max(1, int(getattr(pipe.scheduler, "order", 1)))
            steps = order * steps_run(request.steps, request.strength, mode) - (order - 1)
            every = max(2, round(steps / PREVIEWS_PER_IMAGE))
            denoiser = self.placed[self.family.denoiser]
            watch = (
                stage.watching(
                    NanWatch(
                        denoiser,
                        batch,
                        sample_argument=self.family.sample_argument,
                        timestep_argument=self.family.timestep_argument,
                        clamped=self.family.clamped_blocks(denoiser),
                        order=order,
                    )
                )
                if self.watch
                else None
            )

            def on_step_end(_pipe, index, _timestep, tensors):
                current = tensors["latents"]
                if watch is not None:
                    watch.after_step(index, current)
                self.progress(self.stage, index + 1, steps)
                if self.preview is not None and (index + 1) % every == 0 and index + 1 < steps:
                    image_latents = self.family.image_latents(
                        pipe, current[:1], request.height, request.width
                    )
                    self.preview(index + 1, latent_preview(image_latents[0], colours))
                self.cancel.raise_if_cancelled()
                return {}

            with step_cache.cached(denoiser, self.step_cache):
                output = pipe(
                    **embeds,
                    **arguments,
                    num_inference_steps=request.steps,
                    **self.family.call_arguments(request.cfg),
                    **self.family.prompt_cache_arguments(self.prompt_cache),
                    generator=generators,
                    output_type="latent",
                    callback_on_step_end=on_step_end,
                    callback_on_step_end_tensor_inputs=["latents"],
                )
        latents = self.family.image_latents(
            self.model.pipeline, output.images, request.height, request.width
        )
        return latents, watch

    def decode(self, plan: PrecisionPlan, latents, record: bool = False):
        """One image's latents (1, C, h, w) -> (H, W, 3) float array in [-1, 1] ((H, W, 4) from a
        VAE that decodes RGBA); with `record`, also the first VAE layer that went non-finite."""
        from app.core.fixing.probe import ActivationRecorder

        with running(self.placed, plan, ["vae"]) as stage:
            vae = self.placed["vae"]
            recorder = stage.watching(ActivationRecorder(vae)) if record else None
            pixels = self.family.decode(vae, latents.float())
        first_bad = self._read(recorder, pixels)
        return pixels[0].permute(1, 2, 0).float().cpu().numpy(), first_bad

    def run(self, plan: PrecisionPlan, seeds: list[int], conditioning=None) -> list[Outcome]:
        """Encode, denoise and decode a batch; the watch's flags are read once, at the end."""
        conditioning = conditioning or self.encode(plan)
        self.cancel.raise_if_cancelled()
        picture = None
        if self.pictures is not None and not self.family.encodes_its_pictures(
            self.model.pipeline, self.pictures.mode
        ):
            picture = self.encode_picture(plan)
        self.pipeline_encoder = None
        latents, watch = self.denoise(plan, conditioning, seeds, picture)
        encoder_bad = (
            picture.bad
            if picture is not None
            else self.pipeline_encoder.bad
            if self.pipeline_encoder is not None
            else None
        )
        watches = [watch]
        second = None
        if self.request.hires.on:
            self.cancel.raise_if_cancelled()
            second = hires_pass.second_pass(self, plan, conditioning, seeds, latents)
            latents = second.latents
            watches.append(second.watch)
        found = _read(
            conditioning, encoder_bad, second, watches, len(seeds), self._first_pass_steps()
        )
        outcomes = []
        for index in range(len(seeds)):
            self.cancel.raise_if_cancelled()
            self.progress("Decoding", index, len(seeds))
            outcomes.append(_outcome(self, plan, latents, index, second, found))
        return outcomes

    def _first_pass_steps(self) -> int:
        return steps_run(self.request.steps, self.request.strength, picture_mode(self.pictures))

    def _read(self, recorder, output) -> str | None:
        """The first bad layer a recorder saw; its whole probe is kept in `last_probe`."""
        if recorder is None:
            return None
        self.last_probe = recorder.read(output)
        return _first_bad(self.last_probe)


def _colours(stages: Stages, plan: PrecisionPlan):
    """The live preview's colours for this model, fitted to its VAE once per VAE dtype
    (see `preview`): an fp16 VAE that overflows gives none, an fp32 one still may. The
    VAE's fit is a stage of its own, before the denoiser's places the denoiser alone."""
    key = plan.dtypes["vae"]
    if key not in stages.model.preview_colours:
        fitted = stages.family.latent.rgb_factors is None  # decoded by the placed VAE
        with running(stages.placed, plan, ["vae"]) if fitted else nullcontext():
            colours = colours_for(stages.family, stages.placed["vae"])
        stages.model.preview_colours[key] = colours
    return stages.model.preview_colours[key]


@dataclass
class _Found:
    """What the job's flags said, read at once: the text encoders or VAE's encoder that went
    non-finite (run order), per image the hires fix's enlarging flags, and per image its
    denoising passes' finding (`_passes`)."""

    bad_encoders: list[str]
    enlarging: list[list[int]]
    passes: list[tuple[bool, int, Any]]


def _read(conditioning, encoder_bad, second, watches, batch: int, first_steps: int) -> _Found:
    """Every device-side flag of a job read in one transfer (`read_flags`), in run order: the
    parts that run once a job (the text encoders, the VAE's encoder), the hires fix's per-image
    flags, then each denoising pass's."""
    encoders = list(conditioning.bad) + (["vae_encoder"] if encoder_bad is not None else [])
    once = [*conditioning.bad.values(), *([encoder_bad] if encoder_bad is not None else [])]
    per_image = second.flags() if second is not None else []
    flags = read_flags([*once, *per_image, *(f for w in watches if w for f in w.flags())])
    bad_encoders = [name for name, bad in zip(encoders, flags, strict=False) if bad]
    flags = flags[len(encoders) :]
    enlarging = [flags[i * batch : (i + 1) * batch] for i in range(len(per_image))]
    flags = flags[len(per_image) * batch :]
    return _Found(bad_encoders, enlarging, _passes(flags, watches, batch, first_steps))


def _outcome(stages: Stages, plan: PrecisionPlan, latents, index: int, second, found: _Found):
    """Image `index` of the batch decoded, classified and recorded with where it failed."""
    image_latents = latents[index : index + 1]
    pixels, _ = stages.decode(plan, image_latents)
    image, stats = to_image(pixels)
    bad, step, failed_watch = found.passes[index]
    bad_encoder = found.bad_encoders[0] if found.bad_encoders else None
    vae_latents = enlarged = None
    if second is not None and second.enlarged is not None:
        enlarged = second.enlarged[index : index + 1]
        # Before the second pass, in run order: the first picture's decode, its encoding.
        if bad_encoder is None and found.enlarging[0][index]:
            bad_encoder = "vae"
            vae_latents = second.first_latents[index : index + 1]
        elif bad_encoder is None and found.enlarging[1][index]:
            bad_encoder = "vae_encoder"
    return Outcome(
        plan=plan,
        latents=image_latents,
        image=image,
        stats=stats,
        bad_encoder=bad_encoder,
        bad_step=step + 1 if bad and step >= 0 else None,
        unet_input=failed_watch.failing_input(index) if failed_watch else None,
        watched=stages.watch,
        denoiser=stages.family.denoiser,
        step_cache=stages.step_cache,
        prompt_cache=stages.prompt_cache,
        vae_latents=vae_latents,
        enlarged=enlarged,
    )


def _passes(flags: list[int], watches: list[Any], batch: int, first_steps: int):
    """Per image: (went non-finite in a denoising pass, its 0-based step counted across the
    passes (-1: none), the watch that saw it or None), from the watches' flags as read (each
    watch's per-image flags, then its per-image first steps)."""
    read = [watch for watch in watches if watch is not None]
    found = []
    for index in range(batch):
        bad, step, seen = False, -1, None
        offset = 0
        for number, watch in enumerate(read):
            base = 2 * batch * number
            if flags[base + index]:
                bad, seen = True, watch
                step = flags[base + batch + index] + offset
                break
            offset += first_steps
        found.append((bad, step, seen))
    return found


def picture_mode(pictures: Pictures | None) -> Mode:
    return pictures.mode if pictures is not None else Mode.TEXT


def _accepted(pipe, arguments: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments that `pipe` takes: a picture pipeline that reads the size from the
    picture (SD's image-to-image) has no height or width."""
    import inspect

    taken = inspect.signature(type(pipe).__call__).parameters
    return {k: v for k, v in arguments.items() if k in taken}


def _first_bad(probe) -> str | None:
    bad = probe.first_bad_module()
    return bad.name if bad is not None and bad.name else None
