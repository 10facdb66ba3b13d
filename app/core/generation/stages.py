"""The stages of one generation job under a precision plan: the prompt encoded once (with an
editing model's reference pictures where its text encoder reads them), the input picture or
references through the VAE's encoder, the pipeline's denoising loop for the batch under the
NaN watch, and each image decoded, its pixels classified and its outcome recorded. What each
stage calls is the shared stages' (`run.stages.Stages`, composed); the job adds its watch."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

from app.core.encoders import t5
from app.core.families import family_of
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
from app.core.run.host import Prompt
from app.core.run.pipeline_host import PipelineHost
from app.core.run.stage_run import StageRun, running
from app.core.run.stages import Loop, Stages

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


class JobStages:
    """Runs the stages of one request on one PlacedPipeline, on the calling thread: the shared
    stages (`run.stages.Stages`, in `stages`), with the NaN watch's flags and a failing part's
    recorder attached.

    What a job's probes and repairs find is theirs (`probes.Probes`, `repair.Repairs`), which
    `job.Job` holds beside these stages.
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
        self.host = PipelineHost(model, self.placed, device)  # what the stages drive
        self.stages = Stages(self.host, pictures, self.stage_call, probing=False)
        self.family = family_of(model.pipeline)
        self.do_cfg = request.cfg > 1.0
        self.first_bad: dict[str, str] = {}  # component -> first layer seen going non-finite
        self.last_probe: Any = None  # the last recorded probe (`_read`)
        self.stage = "Generating"
        # For an editing pipeline that encodes its references itself: the device-side flag its
        # VAE encoder's hook kept in the last denoising run.
        self.pipeline_encoder: EncoderFlag | None = None
        # The step cache's threshold the job denoises with (`step_cache`): 0 once a failure
        # made it rule the cache out, for the rest of the job.
        self.step_cache = request.step_cache
        self.prompt_cache = request.prompt_cache  # likewise, the prompt cache
        self.upsampled: str | None = None  # the prompt upsampler's caption, once written
        self.upsampler_ran = False
        self.notes: list[str] = []  # sentences for the result's warnings

    def stage_call(
        self, plan: PrecisionPlan, names: list[str], call, record: Any = None, calls: int = 1
    ):
        """How a generation runs one shared stage (`run.stages.StageRunner`): its components
        placed alone (`run.stage_run.running`), with every layer of the component `record`
        names (True: the stage's own) recorded; returns (the call's output, the recorder or
        None), the recorder read by the caller (`_read`)."""
        from app.core.run.probe import ActivationRecorder

        with running(self.placed, plan, names) as stage:
            watched = names[0] if record is True else record
            recorder = stage.watching(ActivationRecorder(self.placed[watched])) if record else None
            return call(stage), recorder

    @contextmanager
    def running_stage(self, plan: PrecisionPlan, components: list[str]) -> Iterator[StageRun]:
        """One stage (`run.stage_run.running`) with only its `components` placed, on a twin
        that calls as the request asks: its scheduler, no progress bar (the benchmarks' own
        loop)."""
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
        prompt = Prompt(
            prompt_pass.written_prompt(self, plan),
            strip_tags(self.request.negative_prompt),
            self.do_cfg,
            self.request.clip_skip,
        )
        (tensors, bad), recorder = self.stages.encode(plan, prompt, record, self._flagged)
        self.read_recorder(recorder, None)
        return Conditioning(tensors, bad)

    def _flagged(self, stage: StageRun, names: list[str], call) -> tuple[Any, dict[str, Any]]:
        """The text encoders' `call` inside their stage, and where the job watches, a
        device-side flag per encoder: its output non-finite, or one of its blocks saturated
        at fp16's limit (hooks on the blocks T5 clamps)."""
        saturated: dict[str, list[Any]] = {}
        if self.watch:
            for name in names:
                for block in t5.clamped_blocks(self.placed[name]):
                    stage.hooks.after(block, prompt_pass.saturation_hook(saturated, name))
        tensors = call(stage)
        if not self.watch:
            return tensors, {}
        return tensors, prompt_pass.encoder_flags(self.family, stage.pipe, tensors, saturated)

    @property
    def editing(self) -> bool:
        return self.stages.editing

    def picture(self, plan: PrecisionPlan, record: bool = False, pixels: Any = None) -> Picture:
        """The input picture through the VAE's encoder under `plan` (`run.stages.Stages.
        encode_picture`: for inpainting also the picture with its hole; for an edit, each
        reference as its pipeline encodes it), or `pixels` (B, C, H, W) in [-1, 1] (a hires
        fix's enlarged picture), with a device-side flag; with `record`, the first layer that
        went non-finite is kept (`_read`)."""
        import torch

        encoded, recorder = self.stages.encode_picture(plan, record, pixels)
        parts = encoded if isinstance(encoded, list) else [encoded]
        bad = torch.stack([~torch.isfinite(part).all() for part in parts]).any()
        if pixels is None and self.editing:
            self.read_recorder(recorder, parts)
            return Picture([part.float() for part in parts], None, bad)
        latents, masked = parts[0], parts[1] if len(parts) > 1 else None
        self.read_recorder(recorder, latents)
        return Picture(latents.float(), masked.float() if masked is not None else None, bad)

    def noise(self, seeds: list[int]):
        """Initial latents and per-image generators at the request's size
        (`run.stages.Stages.noise`)."""
        return self.stages.noise(seeds, self.request.height, self.request.width)

    def denoise(
        self,
        plan: PrecisionPlan,
        conditioning: Conditioning,
        seeds: list[int],
        picture: Picture | None = None,
        second: GenerationRequest | None = None,
    ):
        """The pipeline's denoising loop for these seeds (`run.stages.Stages.denoise_loop`),
        from noise or from the input `picture`'s latents, under the NaN watch where the job
        watches; returns (latents, watch or None). `second` is a hires fix's second pass (its
        size, steps and strength), drawn from `picture`, the first pass's latents enlarged."""
        colours = _colours(self, plan) if self.preview is not None else None
        request = second or self.request
        mode = Mode.IMAGE if second is not None else picture_mode(self.pictures)
        batch = len(seeds)

        def watch(stage: StageRun, order: int) -> NanWatch:
            denoiser = self.placed[self.family.denoiser]
            return stage.watching(
                NanWatch(
                    denoiser,
                    batch,
                    sample_argument=self.family.sample_argument,
                    timestep_argument=self.family.timestep_argument,
                    clamped=self.family.clamped_blocks(denoiser),
                    order=order,
                )
            )

        def watch_encoder(stage: StageRun) -> None:
            self.pipeline_encoder = EncoderFlag(
                self.placed["vae_encoder"], self.device, stage.hooks
            )

        def on_step(pipe, index: int, current, steps: int) -> None:
            self.progress(self.stage, index + 1, steps)
            every = max(2, round(steps / PREVIEWS_PER_IMAGE))
            if self.preview is not None and (index + 1) % every == 0 and index + 1 < steps:
                image_latents = self.family.image_latents(
                    pipe, current[:1], request.height, request.width
                )
                self.preview(index + 1, latent_preview(image_latents[0], colours))
            self.cancel.raise_if_cancelled()

        loop = Loop(
            request,
            seeds,
            mode,
            step_cache=self.step_cache,
            prompt_cache=self.prompt_cache,
            watch=watch if self.watch else None,
            watch_encoder=watch_encoder if self.watch else None,
            on_step=on_step,
            cached=step_cache.cached,
        )
        return self.stages.denoise_loop(plan, conditioning.embeds, picture, loop)

    def decoded(self, plan: PrecisionPlan, latents, record: bool = False):
        """One image's latents (1, C, h, w) decoded (`run.stages.Stages.decode`) -> (H, W, 3)
        float array in [-1, 1] ((H, W, 4) from a VAE that decodes RGBA); with `record`, also
        the first VAE layer that went non-finite."""
        pixels, recorder = self.stages.decode(plan, latents.float(), record)
        first_bad = self.read_recorder(recorder, pixels)
        return pixels[0].permute(1, 2, 0).float().cpu().numpy(), first_bad

    def run(self, plan: PrecisionPlan, seeds: list[int], conditioning=None) -> list[Outcome]:
        """Encode, denoise and decode a batch; the watch's flags are read once, at the end."""
        conditioning = conditioning or self.encode(plan)
        self.cancel.raise_if_cancelled()
        picture = None
        if self.pictures is not None and not self.family.encodes_its_pictures(
            self.model.pipeline, self.pictures.mode
        ):
            picture = self.picture(plan)
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

    def read_recorder(self, recorder, output) -> str | None:
        """The first bad layer a recorder saw; its whole probe is kept in `last_probe`."""
        if recorder is None:
            return None
        self.last_probe = recorder.read(output)
        return _first_bad(self.last_probe)


def _colours(stages: JobStages, plan: PrecisionPlan):
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


def _outcome(stages: JobStages, plan: PrecisionPlan, latents, index: int, second, found: _Found):
    """Image `index` of the batch decoded, classified and recorded with where it failed."""
    image_latents = latents[index : index + 1]
    pixels, _ = stages.decoded(plan, image_latents)
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


def _first_bad(probe) -> str | None:
    bad = probe.first_bad_module()
    return bad.name if bad is not None and bad.name else None
