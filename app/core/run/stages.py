"""The stages a job runs, each written once for the check and generation: the prompt upsampler
writing, the text encoders reading the prompt (with an editing model's references where its
encoder reads them), the VAE's encoder reading the input picture, an inpainting's picture with
its hole, an edit's references or a hires fix's enlarged picture, the denoiser (the check's few
steps, `denoise_probe`, or a generation's loop, `denoise_loop`) and the VAE's decode.

What a stage calls is written here; how it is watched is its composer's: each stage hands its
call to the `StageRunner` it was given (the check's records, descends and tells; a generation
records a failing part's layers), which runs it on a `stage_run.StageRun` under the plan.

The text encoders, the denoiser's probe and the decode reach the model through its host alone
(`host.Host`: HalfSafe's placed pipelines, `pipeline_host.PipelineHost`, or any other); the
prompt upsampler, the VAE's encoder and a generation's loop read HalfSafe's pipeline (its
host's `model`, `placed` and `family`)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Protocol

from app.core import samplers
from app.core.components import Role, of_role
from app.core.families import capabilities
from app.core.images.pictures import Mode, Pictures, steps_run
from app.core.run import pictures as picture_parts
from app.core.run.host import Host, Prompt
from app.core.run.stage_run import StageRun, running

# A stage's call: what it runs on the stage's placed components (its `StageRun`).
Call = Callable[[StageRun], Any]


class StageRunner(Protocol):
    """How a composer runs a stage's `call` with the components `names` placed under `plan`:
    `record` is what it records (None: its default), `calls` the calls the stage's one
    component makes. Returns what the composer makes of the run (the check: a `Stage`)."""

    def __call__(
        self, plan, names: list[str], call: Call, /, record: Any = None, calls: int = 1
    ) -> Any: ...


def _no_step(pipe, index: int, latents, steps: int) -> None:
    """The default step callback: nothing."""


@dataclass
class Loop:
    """A denoising loop as its job asks it beyond the stage: `request` (the size, steps,
    strength, guidance and scheduler: a generation's request or its hires fix's second pass),
    the seeds, the mode the picture is drawn in, the caches, and the composer's watch."""

    request: Any
    seeds: list[int]
    mode: Mode
    step_cache: float = 0.0
    prompt_cache: bool = False
    # (stage, the sampler's order) -> the job's watch of the denoiser, attached before the loop
    # and told each step's latents (`after_step`); None: the loop is not watched.
    watch: Callable[[StageRun, int], Any] | None = None
    # Where the pipeline encodes its pictures itself: the job's watch of that encoder.
    watch_encoder: Callable[[StageRun], None] | None = None
    # After each step: (pipe, step index, the latents, the steps): progress, preview, cancel.
    on_step: Callable[[Any, int, Any, int], None] = _no_step
    # The denoiser's step cache around the loop: (denoiser, threshold) -> a context.
    cached: Callable[[Any, float], AbstractContextManager] = field(
        default=lambda denoiser, threshold: nullcontext()
    )


class Stages:
    """The stages of one job on one `host` (`host.Host`), run through the composer's
    `run_stage`. `probing`: the check's reading of an edit's references (at the probe's cost)
    rather than the pipeline's. `enlarged`: a hires fix's enlarged picture that the VAE's
    encoder reads where the job has no input picture (the check's; a generation hands its own
    `pixels`)."""

    def __init__(
        self,
        host: Host,
        pictures: Pictures | None,
        run_stage: StageRunner,
        *,
        probing: bool,
    ) -> None:
        self.host = host
        self.device = host.device
        self.pictures = pictures
        # What the stages a pipeline alone runs read (`PipelineHost`'s): None on other hosts.
        self.model: Any = getattr(host, "model", None)
        self.placed: Any = getattr(host, "placed", None)
        self.family: Any = getattr(host, "family", None)
        self.probing = probing
        self.enlarged: Any = None
        self._run = run_stage

    @property
    def editing(self) -> bool:
        return self.pictures is not None and self.pictures.mode is Mode.EDIT

    @property
    def _references(self) -> Any:
        """The reference pictures an edit's prompt upsampler and text encoder read beside the
        prompt (none for other jobs)."""
        return self.pictures.references if self.pictures is not None and self.editing else ()

    def text_encoders(self, plan) -> list[str]:
        """The text encoders the plan places, in the host's order."""
        return self.host.text_encoders(plan)

    def upsample(
        self, plan, prompt: str, tokens: int | None = None, forced=None, record: Any = None
    ) -> Any:
        """The prompt upsampler writing `prompt` out (`Family.upsample`): at most `tokens` new
        tokens (None: as many as its pipeline allows), or the `forced` ones. The call's output
        is {"logits", "tokens", "written"}: each step's raw logits, the tokens, and what the
        family's upsampler gave (its caption, whether its logits were finite)."""

        def call(stage: StageRun):
            written = self.family.upsample(
                stage.pipe, prompt, self.device, tokens, forced, self._references
            )
            return {"logits": written.logits, "tokens": written.tokens, "written": written}

        return self._run(plan, of_role(plan.dtypes, Role.PROMPT_UPSAMPLER), call, record)

    def encode(
        self,
        plan,
        prompt: Prompt,
        record: Any = None,
        around: Callable[[StageRun, list[str], Call], Any] | None = None,
    ) -> Any:
        """The prompt and the negative prompt through the text encoders: an editing model's
        with the references where its text encoder reads them. `around(stage, names, call)`,
        where given, runs the call inside the stage (a job's hooks before it, flags after)."""
        names = self.text_encoders(plan)

        def call(stage: StageRun):
            return self.host.encode(stage, prompt, self._references if self.editing else None)

        watched = call if around is None else lambda stage: around(stage, names, call)
        return self._run(plan, names, watched, record)

    def encode_picture(self, plan, record: Any = None, pixels: Any = None) -> Any:
        """The VAE's encoder reading `pixels` (B, C, H, W) in [-1, 1] (a hires fix's enlarged
        picture; by default `enlarged` where the job has no input picture), else an edit's
        references (as the check or the pipeline reads them), else the input picture and, for
        inpainting, the picture with its hole grey. The call's output: the latents, or a list
        of them (an edit's references; an inpainting's picture and picture with its hole)."""
        if pixels is None and self.pictures is None:
            pixels = self.enlarged

        def call(stage: StageRun):
            references = None
            if pixels is None and self.editing:
                assert self.pictures is not None
                edits = capabilities.editing(self.family)
                read = edits.probed_references if self.probing else edits.edit_pixels
                references = read(self.model.pipeline, self.pictures)
            latents = picture_parts.encoded(
                self.family,
                self.placed["vae_encoder"],
                self.device,
                self.pictures,
                references,
                pixels=pixels,
            )
            return latents[0] if len(latents) == 1 and references is None else latents

        return self._run(plan, ["vae_encoder"], call, record)

    def denoise_probe(
        self,
        plan,
        conditioning: dict[str, Any],
        size: int,
        timesteps: list[float],
        references: list[Any] | None = None,
        record: Any = None,
    ) -> Any:
        """The denoiser stepped through `timesteps` from seeded noise at `size`, as the family
        samples (the check's probe), with the `references`' latents in its sequence where the
        VAE's encoder made them (an edit, an inpainting read so)."""

        def call(stage: StageRun):
            return self.host.denoise(stage, conditioning, size, timesteps, references)

        return self._run(plan, [self.host.denoiser], call, record, calls=len(timesteps))

    def decode(self, plan, latents, record: Any = None) -> Any:
        """The VAE decoding `latents` (B, C, h, w): pixels (B, C, H, W) in [-1, 1]."""

        def call(stage: StageRun):
            return self.host.decode(stage, latents)

        return self._run(plan, ["vae"], call, record)

    def noise(self, seeds: list[int], height: int, width: int):
        """Initial latents as the family's pipeline takes them, and per-image generators (on
        the CPU, so a seed means the same image on every device), which go on to feed
        ancestral samplers' noise."""
        latents, generators = self.family.noise(self.model.pipeline, seeds, height, width)
        return latents.to(self.device), generators

    def denoise_loop(self, plan, embeds: dict[str, Any], picture: Any, loop: Loop):
        """The pipeline's denoising loop for `loop`'s seeds, from noise or from `picture`'s
        latents (its `latents` and, for inpainting, `masked`; an edit's references as a list),
        under `loop`'s watch; returns (the latents as images take them, the watch or None)."""
        request, seeds = loop.request, loop.seeds
        # The denoiser alone, and the VAE where the pipeline encodes the pictures itself.
        encodes = self.pictures is not None and picture is None
        names = [self.family.denoiser, *(["vae"] if encodes else [])]
        with running(self.placed, plan, names) as stage:
            pipe = stage.pipe
            pipe.scheduler = self.family.make_scheduler(
                request.scheduler,
                self.model.pipeline,
                self.model.prediction_type,
                zero_terminal_snr=getattr(self.model, "zero_terminal_snr", False),
            )
            pipe.set_progress_bar_config(disable=True)
            if encodes and loop.watch_encoder is not None:
                loop.watch_encoder(stage)
            pipe, embeds, arguments, generators = self._loop_call(pipe, embeds, picture, loop)
            samplers.seeded(pipe.scheduler, seeds)  # DPM++ SDE's Brownian noise: the seeds
            # A second-order sampler (Heun, DPM2) calls the denoiser twice per step but the last,
            # and diffusers' callback follows each call: steps count the calls.
            order = max(1, int(getattr(pipe.scheduler, "order", 1)))
            steps = order * steps_run(request.steps, request.strength, loop.mode) - (order - 1)
            watch = loop.watch(stage, order) if loop.watch is not None else None

            def on_step_end(_pipe, index, _timestep, tensors):
                if watch is not None:
                    watch.after_step(index, tensors["latents"])
                loop.on_step(pipe, index, tensors["latents"], steps)
                return {}

            denoiser = self.placed[self.family.denoiser]
            with loop.cached(denoiser, loop.step_cache):
                output = pipe(
                    **embeds,
                    **arguments,
                    num_inference_steps=request.steps,
                    **self.family.call_arguments(request.cfg),
                    **self.family.prompt_cache_arguments(loop.prompt_cache),
                    generator=generators,
                    output_type="latent",
                    callback_on_step_end=on_step_end,
                    callback_on_step_end_tensor_inputs=["latents"],
                )
        latents = self.family.image_latents(
            self.model.pipeline, output.images, request.height, request.width
        )
        return latents, watch

    def _loop_call(self, pipe, embeds: dict[str, Any], picture: Any, loop: Loop):
        """The loop's pipeline (a picture pipeline where it draws from a picture), its prompt
        and call arguments, and the generators its noise is drawn from, for the job's mode:
        an edit, a pipeline that encodes its picture itself, a control picture, a picture's
        latents, or noise."""
        import torch

        request, seeds, mode = loop.request, loop.seeds, loop.mode
        batch = len(seeds)
        arguments: dict[str, Any] = {"height": request.height, "width": request.width}
        arguments.update(self.family.pipeline_arguments(pipe, request.width, request.height))
        prompt = self.family.pipeline_embeds(embeds, batch)
        generators: list[Any] = []
        if picture is None or self.family.redraws_from_noise(pipe, mode):
            latents, generators = self.noise(seeds, request.height, request.width)
            arguments["latents"] = latents
        if self.editing:
            # The references join the sequence: the pipeline takes their latents, or encodes
            # the pictures itself (watched: `Loop.watch_encoder`).
            prompt = capabilities.editing(self.family).edit_call(
                pipe,
                embeds,
                batch,
                picture.latents if picture is not None else None,
                self.pictures,
                (request.width, request.height),
            )
        elif self.pictures is not None and picture is None:
            # The pipeline encodes its picture itself (Flux.1 Fill).
            arguments.update(self.family.own_encoding_call(pipe, self.pictures))
        elif picture is not None and mode is Mode.CONTROL:
            # The control picture's latents, from the VAE's encoder stage.
            arguments.update(capabilities.control(self.family).control_call(pipe, picture.latents))
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
        return pipe, prompt, _accepted(pipe, arguments), generators


def _accepted(pipe, arguments: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments that `pipe` takes: a picture pipeline that reads the size from the
    picture (SD's image-to-image) has no height or width."""
    import inspect

    taken = inspect.signature(type(pipe).__call__).parameters
    return {k: v for k, v in arguments.items() if k in taken}
