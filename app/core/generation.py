"""Text-to-image generation with a NaN watch: every image is diagnosed, and a component that went
non-finite is repaired on its own, the cheapest way that works.

A job runs in three stages under a precision plan: the text encoder(s) once, the diffusers
pipeline's denoising loop for the whole batch (`output_type="latent"`), then the VAE once per
image. The watch keeps its flags on the device: each denoising step ORs "not all finite" of the
UNet's output and of the latents into a per-image flag and records the first bad step with
`torch.where`, so the loop never waits on the device. The flags are read once, after the loop.

Repair (`auto_fix="auto"`): a VAE that went non-finite decodes the same latents again with the
health check's fixes for the VAE, in `diagnosis.FIX_KINDS` order (the overflowing layers kept
wider, drawn from an fp32 re-run of the failing part, before the whole VAE in bf16 or fp32),
the first that agrees with fp32 winning; a UNet or text encoder that went
non-finite has its image made again with the health check's fix for that component, found by
probing the failing input one forward pass at a time and proved by the full re-run. Whole-model
fp32 is tried only when no single-component fix works. A working fix is remembered for the
model on this device.
"""

from __future__ import annotations

import contextlib
import random
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from app import __version__
from app.core import diagnosis, infotext, paths
from app.core.components import COMPONENTS, RUN_ORDER, join_words
from app.core.components import words as component_words
from app.core.diagnosis import FixCandidate, candidate_fixes
from app.core.errors import CancelledError, HalfSafeError
from app.core.families import family_of
from app.core.families import make_scheduler as make_scheduler  # callers name it from here
from app.core.images import (
    SAMPLER_NAMES,
    ImageSaveError,
    PixelStats,
    image_array,
    save_png,
    to_image,
)
from app.core.jobs import CancelToken, ProgressCallback, no_progress
from app.core.lora import lora_hashes, prompt_with_tags, strip_tags
from app.core.precision import PlacedPipeline, PrecisionPlan, backend_flags
from app.core.preview import colours_for, latent_preview
from app.core.settings import FIELDS, PrecisionSettings

# on_preview(step, image): a small PIL image of the first image of the batch.
PreviewCallback = Callable[[int, Any], None]

STATUSES = ("ok", "fixed", "nan", "black", "safety_checker")
# Run order of the components: a failure is blamed on the first one that went non-finite.
STAGES = RUN_ORDER
PREVIEWS_PER_IMAGE = 6
MAX_REPAIRS_PER_IMAGE = 3


@dataclass
class GenerationRequest:
    """What to draw. `seed` -1 picks a random seed; image i of a batch uses seed + i.
    `output_dir` None means the settings' output folder, else the default pictures folder."""

    prompt: str
    negative_prompt: str = ""
    steps: int = 25
    cfg: float = 7.0
    seed: int = -1
    width: int = 512
    height: int = 512
    batch: int = 1
    scheduler: str = "dpmpp_2m_karras"
    output_dir: str | None = None


@dataclass
class ImageResult:
    """One image and its diagnosis. `step` is 1-based (the denoising step that first went
    non-finite); `fix` is the settings that repaired it, or that would; `image` keeps the PIL
    image so it can be saved again elsewhere."""

    seed: int
    status: str
    component: str | None = None
    step: int | None = None
    fixes_applied: list[str] = field(default_factory=list)
    message: str = ""
    fix: dict[str, Any] | None = None
    path: str = ""
    first_bad_module: str | None = None
    non_finite: float = 0.0  # fraction of pixels that were NaN/inf
    non_finite_box: tuple[int, int, int, int] | None = None  # where they are: x0, y0, x1, y1
    settings: dict[str, Any] = field(default_factory=dict)  # effective settings it was made with
    quality: dict[str, Any] | None = None  # a repair's agreement with fp32 (diagnosis.Quality)
    parameters: str = ""  # the PNG's `parameters` text
    image: Any = field(default=None, repr=False)
    cause: str | None = None  # "precision", "kernel", "weights", "state" (see `causes`)
    loras: list[Any] | None = field(default=None, repr=False)  # None: the model's LoRAs

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "seed": self.seed,
            "status": self.status,
            "component": self.component,
            "step": self.step,
            "fixes_applied": list(self.fixes_applied),
            "message": self.message,
            "fix": dict(self.fix) if self.fix is not None else None,
            "first_bad_module": self.first_bad_module,
            "non_finite": round(self.non_finite, 6),
            "non_finite_box": list(self.non_finite_box) if self.non_finite_box else None,
            "settings": dict(self.settings),  # what this image was made with, repairs included
            "quality": dict(self.quality) if self.quality is not None else None,
            "cause": self.cause,
        }


@dataclass
class GenerationResult:
    images: list[ImageResult]
    settings: dict[str, Any]  # effective precision settings of the job (before any repair)
    seconds: float
    request: GenerationRequest
    model: dict[str, Any] = field(default_factory=dict)
    device: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    @property
    def all_good(self) -> bool:
        """No image is left non-finite or black after the fixes allowed."""
        return all(image.status not in ("nan", "black") for image in self.images)

    def to_json(self) -> dict[str, Any]:
        return {
            "halfsafe": __version__,
            "images": [image.to_json() for image in self.images],
            "settings": dict(self.settings),
            "seconds": round(self.seconds, 3),
            "model": dict(self.model),
            "device": dict(self.device),
            "warnings": list(self.warnings),
        }

    def save(self, folder: str | Path, *, only_unsaved: bool = True) -> list[Path]:
        """Write the images (by default those not yet saved) into `folder`, with their
        parameters. Raises ImageSaveError (carrying this result) when that fails too."""
        written = []
        for entry in self.images:
            if only_unsaved and entry.path:
                continue
            try:
                path = save_png(entry.image, folder, entry.seed, entry.parameters)
            except ImageSaveError as error:
                error.result = self
                raise
            entry.path = str(path)
            written.append(path)
        return written


# --- the NaN watch --------------------------------------------------------------------------


class NanWatch:
    """Per-image, device-side record of non-finite values in one denoising run.

    Hooks the UNet: after each call, "output not all finite" is folded per image (the CFG
    halves of the batch belong to the same image) and ORed into `bad`; the first bad step is
    kept in `first_step` with `torch.where`, and so is the UNet input of that call, which lets a
    repair probe exactly the forward pass that failed. `after_step` does the same for the
    latents and advances the step. Nothing here synchronises with the device; `read` is the one
    transfer. Create and use it on the job's thread; remove it when the run ends.
    """

    def __init__(
        self,
        unet,
        batch: int,
        *,
        keep_failing_input: bool = True,
        sample_argument: str = "sample",
        timestep_argument: str = "timestep",
        clamped: list[Any] | tuple[Any, ...] = (),
    ) -> None:
        import inspect

        import torch

        device = next(unet.parameters()).device
        self.sample_argument = sample_argument  # the denoiser's keyword for the latents
        self.timestep_argument = timestep_argument
        self._signature = inspect.signature(unet.forward)  # names positional arguments
        self._listed = False  # the denoiser takes and returns one tensor per image (Z-Image)
        self.batch = batch
        self.step = 0
        self.bad = torch.zeros(batch, dtype=torch.bool, device=device)
        self.first_step = torch.full((batch,), -1, dtype=torch.long, device=device)
        self._keep = keep_failing_input
        self._pending: tuple[Any, Any, dict[str, Any]] | None = None
        self._sample: Any = None  # (copies, batch, C, h, w): each image's first bad input
        self._timestep: Any = None  # (batch,)
        self._kwargs: dict[str, Any] = {}
        self._copies = 1
        self._saturated = None  # per image: a clamped block's fp16 output hit 65504 this call
        self._handles = [
            unet.register_forward_pre_hook(self._before, with_kwargs=True),
            unet.register_forward_hook(self._after, with_kwargs=True),
        ]
        # Blocks the model clamps to fp16's limit: a saturated output is an overflow too.
        self._handles += [block.register_forward_hook(self._block_after) for block in clamped]

    def _per_image(self, flags):
        n = flags.shape[0]
        if n % self.batch:
            return flags.any().expand(self.batch)
        return flags.view(n // self.batch, self.batch).any(0)

    def _before(self, module, args, kwargs):
        import torch

        if self._keep:
            try:
                named = dict(self._signature.bind_partial(*args, **kwargs).arguments)
            except TypeError:
                return
            for name, parameter in self._signature.parameters.items():
                if parameter.kind is parameter.VAR_KEYWORD:  # **kwargs: their own names
                    named.update(named.pop(name, {}))
            sample = named.pop(self.sample_argument, None)
            timestep = named.pop(self.timestep_argument, None)
            if isinstance(sample, list):
                self._listed = True
                sample = torch.stack(sample)
            self._pending = (sample, timestep, named)

    def _block_after(self, module, args, output):
        import torch

        from app.core.components import FP16_MAX

        for tensor in output if isinstance(output, tuple) else (output,):
            if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.float16:
                continue
            hit = (tensor.abs() >= FP16_MAX).flatten(1).any(1) | ~torch.isfinite(tensor).flatten(
                1
            ).all(1)
            self._saturated = hit if self._saturated is None else self._saturated | hit

    def _after(self, module, args, kwargs, output):
        import torch

        out = output[0] if isinstance(output, tuple) else output.sample
        if isinstance(out, list):
            out = torch.stack(out)
        flags = ~torch.isfinite(out).flatten(1).all(1)
        if self._saturated is not None and self._saturated.shape == flags.shape:
            flags = flags | self._saturated
        self._saturated = None
        bad = self._per_image(flags)
        newly = bad & ~self.bad
        self.first_step = torch.where(newly, self.step, self.first_step)
        if self._keep and self._pending is not None:
            self._keep_input(newly)
        self.bad = self.bad | bad

    def _keep_input(self, newly) -> None:
        import torch

        if self._pending is None:
            return
        sample, timestep, rest = self._pending
        self._pending = None
        if sample is None or sample.shape[0] % self.batch:
            return
        copies = sample.shape[0] // self.batch
        per_image = sample.view(copies, self.batch, *sample.shape[1:])
        if self._sample is None or self._sample.shape != per_image.shape:
            self._sample = torch.zeros_like(per_image)
            self._timestep = torch.zeros(self.batch, device=sample.device)
        where = newly.view(1, self.batch, *([1] * (per_image.dim() - 2)))
        self._sample = torch.where(where, per_image, self._sample)
        t = timestep.float() if isinstance(timestep, torch.Tensor) else float(timestep)
        self._timestep = torch.where(newly, t, self._timestep)
        self._kwargs = rest
        self._copies = copies

    def after_step(self, step: int, latents) -> None:
        """Fold the latents after denoising step `step` (0-based) into the flags."""
        import torch

        bad = self._per_image(~torch.isfinite(latents).flatten(1).all(1))
        newly = bad & ~self.bad
        self.first_step = torch.where(newly, step, self.first_step)
        self.bad = self.bad | bad
        self.step = step + 1

    def flags(self) -> list[Any]:
        """The device tensors `read` would transfer, for reading together with others."""
        return [self.bad, self.first_step]

    def failing_input(self, index: int) -> dict[str, Any] | None:
        """The UNet call that first went non-finite for image `index`, as forward arguments
        (sample, timestep and the rest, for that image only); None if none was kept."""
        if self._sample is None:
            return None
        sample = self._sample[:, index]
        kwargs = {
            k: _select(v, index, self._copies, self.batch)
            for k, v in self._kwargs.items()
            if k != "return_dict"
        }
        return {
            self.sample_argument: list(sample.unbind(0)) if self._listed else sample,
            self.timestep_argument: self._timestep[index : index + 1],
            **kwargs,
        }

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def _select(value: Any, index: int, copies: int, batch: int) -> Any:
    """Image `index` out of a CFG-batched argument (dicts walked, per-image lists picked from;
    other values kept)."""
    import torch

    if isinstance(value, torch.Tensor):
        if value.dim() and value.shape[0] == copies * batch:
            return value.reshape(copies, batch, *value.shape[1:])[:, index]
        return value
    if isinstance(value, dict):
        return {k: _select(v, index, copies, batch) for k, v in value.items()}
    if isinstance(value, list) and len(value) == copies * batch:  # one entry per image
        return [value[copy * batch + index] for copy in range(copies)]
    return value


def read_flags(tensors: list[Any]) -> list[int]:
    """Bring several small device tensors to the host in one transfer, as integers."""
    import torch

    if not tensors:
        return []
    return torch.cat([t.reshape(-1).long() for t in tensors]).cpu().tolist()


# --- one generation job ---------------------------------------------------------------------


@dataclass
class _Conditioning:
    """Prompt embeddings for one image (batch 1) and, per text encoder, a device-side flag."""

    embeds: dict[str, Any]
    bad: dict[str, Any]


@dataclass
class _Outcome:
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


@dataclass
class _Repair:
    outcome: _Outcome
    fixes: list[str] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    first_bad_module: str | None = None
    quality: diagnosis.Quality | None = None  # the worst of its repairs against fp32
    # "kernel" when the repairs only switched the attention backend (the same precision, as
    # `causes` classifies a check's fix), else "precision".
    cause: str = "precision"


def _failure(outcome: _Outcome) -> str | None:
    """The component to blame for a non-finite image (None: finite, or unknown when unwatched)."""
    if outcome.bad_encoder:
        return outcome.bad_encoder
    if outcome.bad_step is not None:
        return outcome.denoiser
    if outcome.stats.non_finite > 0:
        return "vae" if outcome.watched else ""
    return None


class _Job:
    """Runs the stages of one request on one PlacedPipeline, on the calling thread."""

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
    ) -> None:
        self.model = model
        self.request = request
        self.plan = plan
        self.device = device
        self.bf16_native = bf16_native
        self.watch = watch
        self.progress = progress
        self.preview = preview
        self.cancel = cancel
        self.placed = PlacedPipeline(model.pipeline, plan)
        self.family = family_of(model.pipeline)
        self.do_cfg = request.cfg > 1.0
        self.repair_plan = plan  # every fix found so far, on top of the plan
        self.fix_settings: dict[str, Any] = {}
        self.fix_words: list[str] = []
        self.fixed_components: list[str] = []
        self.first_bad: dict[str, str] = {}  # component -> first layer seen going non-finite
        self.qualities: dict[str, diagnosis.Quality] = {}  # component -> its fix against fp32
        self._references: dict[tuple[str, int], Any] = {}  # fp32 outputs of failing parts
        self.last_probe: Any = None  # the last recorded probe (`_read`)
        self.stage = "Generating"
        self.dropped: list[str] = []  # candidates that failed to run, as sentences

    # -- stages ----------------------------------------------------------------------------

    def _colours(self):
        """The live preview's colours for this model, fitted to its VAE once per VAE dtype
        (see `preview`): an fp16 VAE that overflows gives none, an fp32 one still may."""
        vae = self.placed["vae"]
        key = str(vae.dtype)
        if key not in self.model.preview_colours:
            self.model.preview_colours[key] = colours_for(self.family, vae)
        return self.model.preview_colours[key]

    def _pipeline(self, plan: PrecisionPlan):
        self.placed.apply(plan)
        pipe = self.placed.pipeline()
        pipe.scheduler = self.family.make_scheduler(
            self.request.scheduler,
            self.model.pipeline,
            self.model.prediction_type,
            zero_terminal_snr=getattr(self.model, "zero_terminal_snr", False),
        )
        pipe.set_progress_bar_config(disable=True)
        return pipe

    def encode(self, plan: PrecisionPlan) -> _Conditioning:
        import torch

        pipe = self._pipeline(plan)
        request = self.request
        saturated: dict[str, list[Any]] = {}
        hooks = []
        if self.watch:
            for name in self.family.text_encoders(self.model.pipeline):
                for block in _clamped_encoder_blocks(self.placed[name]):
                    hooks.append(block.register_forward_hook(_saturation_hook(saturated, name)))
        try:
            with backend_flags(plan), torch.inference_mode():
                tensors = self.family.encode(
                    pipe,
                    strip_tags(request.prompt),  # A1111's <lora:...> tags are not words
                    strip_tags(request.negative_prompt),
                    self.device,
                    self.do_cfg,
                )
                bad = self._encoder_flags(pipe, tensors, saturated) if self.watch else {}
        finally:
            for hook in hooks:
                hook.remove()
        return _Conditioning(tensors, bad)

    def _encoder_flags(
        self, pipe, tensors: dict[str, Any], saturated: dict[str, list[Any]]
    ) -> dict[str, Any]:
        """Per text encoder, a device-side flag: did its part of the embeddings go non-finite,
        or did one of its blocks saturate at fp16's limit (T5 clamps an overflow there)."""
        import torch

        flags = {}
        for name, parts in self.family.encoder_outputs(pipe, tensors).items():
            checks = [~torch.isfinite(p).all() for p in parts] + saturated.get(name, [])
            flags[name] = torch.stack(checks).any()
        return flags

    def noise(self, seeds: list[int]):
        """Initial latents as the family's pipeline takes them and per-image generators (CPU,
        so a seed means the same image on every device); the generators go on to feed
        ancestral samplers' noise."""
        latents, generators = self.family.noise(
            self.model.pipeline, seeds, self.request.height, self.request.width
        )
        return latents.to(self.device), generators

    def denoise(self, plan: PrecisionPlan, conditioning: _Conditioning, seeds: list[int]):
        """The pipeline's denoising loop for these seeds; returns (latents, watch or None)."""
        import torch

        pipe = self._pipeline(plan)
        batch = len(seeds)
        latents, generators = self.noise(seeds)
        steps = self.request.steps
        every = max(2, round(steps / PREVIEWS_PER_IMAGE))
        denoiser = self.placed[self.family.denoiser]
        watch = (
            NanWatch(
                denoiser,
                batch,
                sample_argument=self.family.sample_argument,
                timestep_argument=self.family.timestep_argument,
                clamped=self.family.clamped_blocks(denoiser),
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
                    pipe, current[:1], self.request.height, self.request.width
                )
                self.preview(index + 1, latent_preview(image_latents[0], self._colours()))
            self.cancel.raise_if_cancelled()
            return {}

        embeds = self.family.pipeline_embeds(conditioning.embeds, batch)
        try:
            with backend_flags(plan), torch.inference_mode():
                output = pipe(
                    **embeds,
                    height=self.request.height,
                    width=self.request.width,
                    num_inference_steps=steps,
                    **self.family.call_arguments(self.request.cfg),
                    latents=latents,
                    generator=generators,
                    output_type="latent",
                    callback_on_step_end=on_step_end,
                    callback_on_step_end_tensor_inputs=["latents"],
                )
        finally:
            if watch is not None:
                watch.remove()
        latents = self.family.image_latents(
            self.model.pipeline, output.images, self.request.height, self.request.width
        )
        return latents, watch

    def decode(self, plan: PrecisionPlan, latents, record: bool = False):
        """One image's latents (1, C, h, w) -> (H, W, 3) float array in [-1, 1]; with `record`,
        also the first VAE layer that went non-finite."""
        import torch

        from app.core.probe import ActivationRecorder

        self.placed.apply(plan)
        vae = self.placed["vae"]
        recorder = ActivationRecorder(vae) if record else None
        try:
            with backend_flags(plan), torch.inference_mode():
                pixels = self.family.decode(vae, latents.float())
        finally:
            if recorder is not None:
                recorder.remove()
        first_bad = self._read(recorder, pixels)
        return pixels[0].permute(1, 2, 0).float().cpu().numpy(), first_bad

    def run(self, plan: PrecisionPlan, seeds: list[int], conditioning=None) -> list[_Outcome]:
        """Encode, denoise and decode a batch; the watch's flags are read once, at the end."""
        conditioning = conditioning or self.encode(plan)
        self.cancel.raise_if_cancelled()
        latents, watch = self.denoise(plan, conditioning, seeds)
        encoders = list(conditioning.bad)
        flags = read_flags([*conditioning.bad.values(), *(watch.flags() if watch else [])])
        bad_encoders = [name for name, bad in zip(encoders, flags, strict=False) if bad]
        per_image = flags[len(encoders) :]
        outcomes = []
        for index in range(len(seeds)):
            self.cancel.raise_if_cancelled()
            self.progress("Decoding", index, len(seeds))
            image_latents = latents[index : index + 1]
            pixels, _ = self.decode(plan, image_latents)
            image, stats = to_image(pixels)
            bad = bool(per_image[index]) if watch else False
            step = per_image[len(seeds) + index] if watch else -1
            outcomes.append(
                _Outcome(
                    plan=plan,
                    latents=image_latents,
                    image=image,
                    stats=stats,
                    bad_encoder=bad_encoders[0] if bad_encoders else None,
                    bad_step=step + 1 if bad and step >= 0 else None,
                    unet_input=watch.failing_input(index) if watch and bad else None,
                    watched=self.watch,
                    denoiser=self.family.denoiser,
                )
            )
        return outcomes

    # -- probes ------------------------------------------------------------------------------

    def unet_forward(self, plan: PrecisionPlan, inputs: dict[str, Any], record: bool = False):
        """One denoiser call on a kept failing input: (its output, first bad module)."""
        import torch

        from app.core.probe import ActivationRecorder

        self.placed.apply(plan)
        unet = self.placed[self.family.denoiser]
        arguments = dict(inputs)
        recorder = ActivationRecorder(unet) if record else None
        try:
            with backend_flags(plan), torch.inference_mode():
                out = unet(**arguments, return_dict=False)[0]
            if isinstance(out, list):  # a denoiser that returns one tensor per image (Z-Image)
                out = torch.stack(out)
        finally:
            if recorder is not None:
                recorder.remove()
        first_bad = self._read(recorder, out)
        return out, first_bad

    def encoder_probe(self, plan: PrecisionPlan, component: str, record: bool = False):
        """Encode the prompt under `plan`: (this encoder finite?, first bad module)."""
        from app.core.probe import ActivationRecorder

        self.placed.apply(plan)
        recorder = ActivationRecorder(self.placed[component]) if record else None
        watching, self.watch = self.watch, True
        try:
            conditioning = self.encode(plan)
        finally:
            self.watch = watching
            if recorder is not None:
                recorder.remove()
        bad = read_flags([conditioning.bad[component]])[0]
        first_bad = self._read(recorder, None)
        return not bad, first_bad

    def _read(self, recorder, output) -> str | None:
        """The first bad layer a recorder saw; its whole probe is kept in `last_probe`."""
        if recorder is None:
            return None
        self.last_probe = recorder.read(output)
        return _first_bad(self.last_probe)

    def wide_probe(self, component: str, outcome: _Outcome):
        """Every layer's peaks of the failing part re-run in fp32 on the inputs it failed with
        (a `probe.ProbeResult`, from which `diagnosis` draws the layers to keep wider), or None
        when no input was kept to re-run."""
        plan = diagnosis.fp32_reference(outcome.plan)
        self.last_probe = None
        if component == "vae":
            self.decode(plan, outcome.latents, record=True)
        elif component == outcome.denoiser:
            if outcome.unet_input is None:
                return None
            self.unet_forward(plan, outcome.unet_input, record=True)
        else:
            self.encoder_probe(plan, component, record=True)
        return self.last_probe

    def first_bad_module(self, component: str, outcome: _Outcome) -> str | None:
        """Re-run only the part that failed under the plan it failed with, recording every
        layer, to name the innermost layer that went non-finite first (kept per component)."""
        if component == "vae":
            name = self.decode(outcome.plan, outcome.latents, record=True)[1]
        elif component == outcome.denoiser:
            if outcome.unet_input is None:
                return self.first_bad.get(component)
            name = self.unet_forward(outcome.plan, outcome.unet_input, record=True)[1]
        else:
            name = self.encoder_probe(outcome.plan, component, record=True)[1]
        if name:
            self.first_bad[component] = name
        return name

    def part_output(self, component: str, plan: PrecisionPlan, outcome: _Outcome) -> Any:
        """The failing part's output under `plan`, on the inputs it failed with: the decoded
        pixels, one UNet call on the kept input, or the prompt's embeddings (None when no
        input was kept to re-run)."""
        import torch

        if component == "vae":
            return torch.from_numpy(self.decode(plan, outcome.latents)[0])
        if component == outcome.denoiser:
            if outcome.unet_input is None:
                return None
            return self.unet_forward(plan, outcome.unet_input)[0]
        return self.encode(plan).embeds

    def verify(self, component: str, plan: PrecisionPlan, outcome: _Outcome):
        """Whether `plan` repairs the failing part, from one forward pass: finite, and in
        agreement with an fp32 reference of the same inputs (`diagnosis.compare`); returns
        (passed, the part's output). The reference is run once per failing part;
        `self.qualities[component]` keeps the last figure. Passed when no input was kept to
        re-run (the full re-run then decides)."""
        output = self.part_output(component, plan, outcome)
        if output is None:
            return True, None
        key = (component, id(outcome))
        if key not in self._references:
            reference_plan = diagnosis.fp32_reference(outcome.plan)
            self._references[key] = self.part_output(component, reference_plan, outcome)
        quality = diagnosis.compare(output, self._references[key])
        self.qualities[component] = quality
        return quality.passed, output

    def quick_check(self, component: str, plan: PrecisionPlan, outcome: _Outcome) -> bool:
        return self.verify(component, plan, outcome)[0]

    # -- repair ------------------------------------------------------------------------------

    def candidates(self, component: str, outcome: _Outcome):
        """Fixes to try for `component`, cheapest first, on top of the fixes already found.

        A generator: the layer probe that decides whether upcasting attention is worth a try
        runs only when the fixes found for earlier images do not already work.
        """
        base = self.repair_plan
        if _relevant_change(component, outcome.plan, base):
            yield FixCandidate(base, dict(self.fix_settings), "; ".join(self.fix_words))
        first_bad = self.first_bad_module(component, outcome)
        yield from candidate_fixes(
            component,
            base,
            first_bad,
            self.placed[component],
            self.bf16_native,
            lambda: self.wide_probe(component, outcome),
        )
        if component != "vae" and any(d != "fp32" for d in base.dtypes.values()):
            yield diagnosis.everything_fp32(base)

    def repair(self, index: int, seed: int, outcome: _Outcome, total: int) -> _Repair:
        """Repair one image: the failing part only, cheapest fix first, until it is finite."""
        result = _Repair(outcome)
        for _ in range(MAX_REPAIRS_PER_IMAGE):
            component = _failure(result.outcome)
            if not component:
                break
            repaired = None
            for candidate in self.candidates(component, result.outcome):
                self.cancel.raise_if_cancelled()
                self.progress(f"Image {index + 1} of {total}: {candidate.words}", 0, 1)
                try:
                    repaired = self._try(component, candidate, result.outcome, seed)
                except CancelledError:
                    raise
                except Exception as error:  # noqa: BLE001 - a candidate that cannot run is dropped
                    self.dropped.append(
                        f"Trying to {candidate.words} failed ({type(error).__name__}: "
                        f"{str(error).strip()[:200]}); it was not used."
                    )
                    continue
                if repaired is not None:
                    self._accept(component, candidate)
                    quality = self.qualities.get(component)
                    if quality is not None and (
                        result.quality is None or quality.value < result.quality.value
                    ):
                        result.quality = quality
                    result.fixes.append(candidate.words)
                    result.settings.update(candidate.settings)
                    result.outcome = repaired
                    break
            if result.first_bad_module is None:
                result.first_bad_module = self.first_bad.get(component)
            if repaired is None:
                break
        if diagnosis.switched_backend(result.settings, self.plan) is not None:
            result.cause = "kernel"
        return result

    def _try(self, component: str, candidate: FixCandidate, outcome: _Outcome, seed: int):
        passed, output = self.verify(component, candidate.plan, outcome)
        if not passed:
            return None
        if component == "vae" and output is not None:  # the verified decode is the image
            image, stats = to_image(output.numpy())
            return replace(outcome, plan=candidate.plan, image=image, stats=stats)
        self.stage = "Making the image again"
        try:
            again = self.run(candidate.plan, [seed])[0]
        finally:
            self.stage = "Generating"
        still = _failure(again)
        if still and STAGES.index(still) <= STAGES.index(component):
            return None
        return again

    def _accept(self, component: str, candidate: FixCandidate) -> None:
        self.repair_plan = candidate.plan
        self.fix_settings.update(candidate.settings)
        if candidate.words not in self.fix_words and candidate.settings:
            self.fix_words.append(candidate.words)
        if component not in self.fixed_components:
            self.fixed_components.append(component)

    def suggest(self, component: str, outcome: _Outcome, verify: bool) -> FixCandidate | None:
        """The fix to offer without applying it: with `verify`, the cheapest that one forward
        pass shows finite; without, the component's wider dtype (bf16 where native, else fp32)."""
        if not component:
            return None
        if verify:
            for candidate in self.candidates(component, outcome):
                self.cancel.raise_if_cancelled()
                if self.quick_check(component, candidate.plan, outcome):
                    return candidate
            return None
        dtype = outcome.plan.dtypes.get(component)
        key = COMPONENTS[component].setting
        words = component_words(component)
        if dtype == "fp16" and self.bf16_native:
            return FixCandidate(outcome.plan, {key: "bf16"}, f"run the {words} in bf16")
        if dtype != "fp32":
            return FixCandidate(outcome.plan, {key: "fp32"}, f"run the {words} in fp32")
        return None

    # -- safety checker ----------------------------------------------------------------------

    def safety_check(self, images: list[Any]) -> tuple[list[bool], list[Any]]:
        """Run the pipeline's safety checker, if it has one: (flagged, images as it left them)."""
        import numpy as np
        import torch
        from PIL import Image

        pipeline = self.model.pipeline
        checker = getattr(pipeline, "safety_checker", None)
        extractor = getattr(pipeline, "feature_extractor", None)
        if checker is None or extractor is None or not images:
            return [False] * len(images), images
        module = _placed_checker(checker, self.device)
        params = list(module.parameters())
        dtype = params[0].dtype if params else torch.float32
        clip_input = extractor(images, return_tensors="pt").pixel_values.to(self.device, dtype)
        arrays = np.stack([image_array(image) for image in images])
        with torch.inference_mode():
            checked, flagged = module(images=arrays, clip_input=clip_input)
        flagged = [bool(f) for f in flagged]
        out = []
        for image, array, hit in zip(images, checked, flagged, strict=True):
            if hit:
                unit = np.clip(np.asarray(array, dtype=np.float32), 0.0, 1.0)
                image = Image.fromarray((unit * 255).round().astype(np.uint8), "RGB")
            out.append(image)
        return flagged, out


def _relevant_change(component: str, tried: PrecisionPlan, base: PrecisionPlan) -> bool:
    """Whether the fixes found so far change anything `component` runs with."""
    if tried.dtypes.get(component) != base.dtypes.get(component):
        return True
    flags = (
        "fp16_accumulation",
        "attention_reduced_precision",
        "fp16_reduced_precision_reduction",
    )
    if any(getattr(tried, f) != getattr(base, f) for f in flags):
        return True
    return COMPONENTS[component].has_attention and tried.upcast_attention != base.upcast_attention


def _clamped_encoder_blocks(module) -> list[Any]:
    """The blocks of a T5 encoder: transformers clamps their fp16 output to 65504 (64504 once
    an inf appeared), so a T5 overflow comes out finite and wrong instead of NaN."""
    from app.core.diagnosis import is_t5

    encoder = getattr(module, "encoder", None)
    return list(getattr(encoder, "block", None) or []) if is_t5(module) else []


def _saturation_hook(saturated: dict[str, list[Any]], name: str):
    """A forward hook that keeps, on the device, whether a block's fp16 output reached the
    clamp (no host sync)."""
    from app.core.components import FP16_MAX

    def hook(module, args, output):
        import torch

        hidden = output[0] if isinstance(output, tuple) else output
        if isinstance(hidden, torch.Tensor) and hidden.dtype == torch.float16:
            saturated.setdefault(name, []).append((hidden.abs() >= FP16_MAX - 1000).any())

    return hook


def _first_bad(probe) -> str | None:
    bad = probe.first_bad_module()
    return bad.name if bad is not None and bad.name else None


# The safety checker's copy on the job's device, per loaded checker; dropped with the model.
_CHECKERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _placed_checker(checker, device):
    """The safety checker on the job's device (the loaded pipeline stays on the CPU)."""
    import copy

    first = next(checker.parameters(), None)
    if first is None or first.device == device:
        return checker
    cached = _CHECKERS.get(checker)
    if cached is not None and cached[0] == str(device):
        return cached[1]
    _CHECKERS.pop(checker, None)  # free the copy on another device first
    placed = copy.deepcopy(checker).to(device)
    _CHECKERS[checker] = (str(device), placed)
    return placed


# --- the public entry points ----------------------------------------------------------------


def _checked_request(request: GenerationRequest) -> GenerationRequest:
    for key in ("steps", "cfg", "seed", "width", "height", "batch", "scheduler"):
        try:
            FIELDS[key].validate(getattr(request, key))
        except ValueError as error:
            raise HalfSafeError(f"{FIELDS[key].label}: {error}.") from None
    if not isinstance(request.prompt, str) or not isinstance(request.negative_prompt, str):
        raise HalfSafeError("The prompt and the negative prompt must be text.")
    return request


def _seeds(request: GenerationRequest) -> list[int]:
    seed = request.seed if request.seed >= 0 else random.randrange(2**32 - 1)
    return [(seed + i) % 2**32 for i in range(request.batch)]


def generate(
    model,
    request: GenerationRequest,
    *,
    precision: PrecisionSettings,
    device: str = "auto",
    on_progress: ProgressCallback | None = None,
    on_preview: PreviewCallback | None = None,
    cancel: CancelToken | None = None,
) -> GenerationResult:
    """Generate `request.batch` images with `model` (a `models.LoadedModel`), diagnose each,
    repair what `precision.auto_fix` allows, and save them as PNG files.

    Runs on the calling thread. `on_progress(stage, step, total)` is called once per denoising
    step; `on_preview(step, image)` every few steps with a small latent preview (that reads the
    latents back, the only device sync in the loop, and only when a preview is wanted);
    `cancel` is honoured at the end of every denoising step and between images. With
    `nan_check` off there is no watch and no repair; the finished pixels are still classified,
    which costs nothing on the device. Side effects: components are copied to the device for the
    job, a working repair is stored in the model's remembered profile, images are written to
    `request.output_dir` (else the settings' output folder, else the default pictures folder).
    Raises HalfSafeError for a bad request, CancelledError when cancelled, and ImageSaveError
    (whose `.result` holds every image) when an image cannot be written.
    """
    started = time.perf_counter()
    progress = on_progress or no_progress
    result = _generate_unsaved(
        model,
        request,
        precision=precision,
        device=device,
        on_progress=on_progress,
        on_preview=on_preview,
        cancel=cancel,
    )
    if precision.nan_check and precision.auto_fix == "auto":
        _repair_by_cause(model, result, precision, device, progress, cancel or CancelToken())
    for entry in result.images:
        entry.parameters = _parameters(entry, result.request, model)
    progress("Saving", 0, len(result.images))
    folder = _output_folder(result.request)
    try:
        result.save(folder)
    finally:
        result.seconds = time.perf_counter() - started
    progress("Done", len(result.images), len(result.images))
    return result


def _generate_unsaved(
    model,
    request: GenerationRequest,
    *,
    precision: PrecisionSettings,
    device: str = "auto",
    on_progress: ProgressCallback | None = None,
    on_preview: PreviewCallback | None = None,
    cancel: CancelToken | None = None,
) -> GenerationResult:
    """`generate` up to the images and their diagnosis and precision repairs, unsaved."""
    from app.core import hardware, profiles

    started = time.perf_counter()
    request = _checked_request(request)
    progress = on_progress or no_progress
    cancel = cancel or CancelToken()
    pipeline = model.pipeline
    family = family_of(pipeline)
    problem = family.text_to_image_problem(pipeline) or family.size_problem(
        pipeline, request.width, request.height
    )
    if problem is not None:
        raise HalfSafeError(f"{model.name}: {problem}")

    torch_device = hardware.pick_device(device)
    info = hardware.describe_device(torch_device)
    found = profiles.lookup(model.profile_key, info.name)
    remembered = found.fix
    plan = diagnosis.plan_for_model(
        model,
        precision,
        device=torch_device,
        device_info=info,
        remembered=remembered.settings if remembered else None,
    )
    warnings = list(plan.warnings) + found.notes
    warnings.extend(
        problem
        for applied in getattr(model, "loras", [])
        if (problem := applied.file.problems()) is not None
    )
    warnings.extend(getattr(model, "lora_warnings", []))
    warnings.extend(profiles.remembered_words(remembered, plan))
    sampler = family.sampler_words(request.scheduler)
    if sampler != SAMPLER_NAMES[request.scheduler]:
        warnings.append(
            f"This model samples with its own {sampler} (flow matching); the sampler setting "
            f"{SAMPLER_NAMES[request.scheduler]} does not apply to it."
        )
    watch = bool(precision.nan_check)
    auto_fix = precision.auto_fix if watch else "off"
    job = _Job(
        model,
        request,
        plan,
        device=torch_device,
        bf16_native=getattr(info, "bf16", None) == "native",
        watch=watch,
        progress=progress,
        preview=on_preview,
        cancel=cancel,
    )
    seeds = _seeds(request)
    entries: list[ImageResult] = []
    try:
        progress("Encoding the prompt", 0, request.steps)
        outcomes = job.run(plan, seeds)
        finals: list[tuple[_Outcome, _Repair | None, str | None, int | None]] = []
        for index, (seed, outcome) in enumerate(zip(seeds, outcomes, strict=True)):
            component = _failure(outcome)
            step = outcome.bad_step if component == outcome.denoiser else None
            repair = None
            if component and auto_fix == "auto":
                try:
                    repair = job.repair(index, seed, outcome, len(seeds))
                except RuntimeError as error:  # out of memory in fp32, say: keep the batch going
                    warnings.append(
                        f"Image {index + 1}: the repair stopped with an error ({error}); the "
                        "image is kept as it came out."
                    )
                else:
                    outcome = repair.outcome
            finals.append((outcome, repair, component, step))
        flagged, checked = job.safety_check(
            [o.image for o, *_ in finals if o.stats.non_finite == 0]
        )
        verdicts = iter(zip(flagged, checked, strict=True))
        for seed, (outcome, repair, component, step) in zip(seeds, finals, strict=True):
            hit = False
            if outcome.stats.non_finite == 0:
                hit, outcome.image = next(verdicts)
            suggestion = None
            still = _failure(outcome)
            if still is not None and auto_fix in ("off", "ask"):
                suggestion = job.suggest(still, outcome, verify=auto_fix == "ask")
            entries.append(
                _describe(
                    seed,
                    outcome,
                    repair,
                    component,
                    step,
                    hit,
                    suggestion,
                    auto_fix,
                    watch,
                    request,
                    precision,
                )
            )
            if entries[-1].first_bad_module is None and entries[-1].component:
                entries[-1].first_bad_module = job.first_bad.get(entries[-1].component)
        if job.fix_settings and any(e.status == "fixed" for e in entries):
            merged = {**(remembered.settings if remembered else {}), **job.fix_settings}
            parts = join_words(job.fixed_components)
            summary = (
                f"The {parts} went non-finite during generation; fix: "
                f"{'; '.join(job.fix_words)}. Verified by repairing the image, which came out "
                "finite."
            )
            profiles.remember_fix(
                model.profile_key, info.name, merged, summary, "generation repair"
            )
    finally:
        job.placed.release()
    warnings.extend(dict.fromkeys(job.dropped))

    result = GenerationResult(
        images=entries,
        settings=_settings_of(plan, precision),
        seconds=0.0,
        request=request,
        model={
            "source": model.source,
            "name": model.name,
            "architecture": model.architecture,
            "hash": model.model_hash,
            "loras": [applied.to_json() for applied in getattr(model, "loras", [])],
        },
        device={"kind": info.kind, "name": info.name},
        warnings=warnings,
    )
    result.seconds = time.perf_counter() - started
    return result


# Repairs that follow a cause other than precision (see `causes`): what `_repair_by_cause` does.
_CAUSE_REPAIRS = ("switch_backend", "reload", "drop_lora")


def _repair_by_cause(
    model, result: GenerationResult, precision: PrecisionSettings, device: str, progress, cancel
) -> None:
    """Images still NaN after the precision repairs: the health check at the request's size
    attributes the failure (`causes.check_and_attribute`), and a verified repair that is not a
    precision change (another attention backend, a freshly loaded component, dropping a LoRA
    whose tensors hold NaN) makes those images again with the same seeds. Each image says the
    cause; an image the repair did not make finite keeps its first result."""
    from app.core import causes, lora

    failing = [i for i, e in enumerate(result.images) if e.status == "nan"]
    if not failing:
        return
    request = result.request
    progress("Finding the cause", 0, 1)
    report = causes.check_and_attribute(
        model,
        precision=precision,
        device=device,
        size=max(64, min(request.width, request.height) // 8 * 8),
        steps=request.steps,
        scheduler=request.scheduler,
        on_progress=progress,
        cancel=cancel,
        remember=False,
        measure_cost=False,
    )
    cause = report.cause
    if cause is None:
        return
    for index in failing:
        result.images[index].cause = cause.kind
    if not cause.verified or cause.action not in _CAUSE_REPAIRS:
        for index in failing:
            result.images[index].message += f" {cause.summary}"
        return
    again = precision
    if cause.action == "switch_backend":
        again = replace(precision, **cause.settings)
    loras = list(getattr(model, "loras", []))
    used = loras
    if cause.action == "drop_lora":
        used = [a for a in loras if not a.file.damaged]
        lora.use_weights(model.pipeline, used)
    try:
        for index in failing:
            cancel.raise_if_cancelled()
            first = result.images[index]
            one = replace(request, seed=first.seed, batch=1)
            remade = _generate_unsaved(
                model, one, precision=again, device=device, on_progress=progress, cancel=cancel
            ).images[0]
            if remade.status in ("nan", "black"):
                first.message += f" {cause.summary} Made again that way, it still came out bad."
                continue
            remade.status = "fixed"
            remade.cause = cause.kind
            remade.component = first.component
            remade.step = first.step
            remade.first_bad_module = first.first_bad_module
            remade.fixes_applied = [*remade.fixes_applied, cause.repair]
            remade.fix = dict(cause.settings)
            remade.quality = cause.quality.to_json() if cause.quality is not None else None
            remade.loras = list(used)
            remade.message = f"{cause.summary} The image was made again that way."
            result.images[index] = remade
    finally:
        if used is not loras:
            lora.use_weights(model.pipeline, loras)
    if cause.action == "switch_backend" and any(e.cause == "kernel" for e in result.images):
        from app.core import profiles

        device_name = result.device.get("name", "")
        remembered = profiles.remembered_fix(model.profile_key, device_name)
        profiles.remember_fix(
            model.profile_key,
            device_name,
            {**(remembered.settings if remembered else {}), **cause.settings},
            cause.summary,
            "generation repair",
        )


def _settings_of(plan: PrecisionPlan, precision: PrecisionSettings) -> dict[str, Any]:
    return {
        **plan.effective_settings(),
        "nan_check": precision.nan_check,
        "auto_fix": precision.auto_fix,
    }


def _describe(
    seed: int,
    outcome: _Outcome,
    repair: _Repair | None,
    component: str | None,
    step: int | None,
    safety_hit: bool,
    suggestion: FixCandidate | None,
    auto_fix: str,
    watched: bool,
    request: GenerationRequest,
    precision: PrecisionSettings,
) -> ImageResult:
    stats = outcome.stats
    fixes = list(repair.fixes) if repair else []
    still = _failure(outcome)
    entry = ImageResult(
        seed=seed,
        status="ok",
        component=component or None,
        step=step,
        fixes_applied=fixes,
        first_bad_module=repair.first_bad_module if repair else None,
        non_finite=stats.non_finite,
        non_finite_box=stats.non_finite_box,
        settings=_settings_of(outcome.plan, precision),
        image=outcome.image,
    )
    where = _where(component, step, request.steps)
    if still is not None:
        entry.status = "nan"
        entry.component = still or None
        if still != component:
            entry.step = outcome.bad_step if still == outcome.denoiser else None
            where = _where(still, entry.step, request.steps)
        share = (
            "the image came out black"
            if stats.all_non_finite
            else f"{_percent(stats.non_finite)} of its pixels came out black"
            f"{_box_words(stats.non_finite_box)}"
        )
        if not watched:
            entry.message = (
                f"This image holds NaN values ({_percent(stats.non_finite)} of its pixels"
                f"{_box_words(stats.non_finite_box)}); "
                "the NaN watch was off, so which part failed is not known: turn it on to find "
                "and repair it."
            )
        elif suggestion is not None:
            entry.fix = dict(suggestion.settings)
            tested = "passed a quick test" if auto_fix == "ask" else "should fix it"
            entry.message = f"{where}, so {share}; the fix '{suggestion.words}' {tested}."
        elif auto_fix == "auto":
            entry.message = (
                f"{where}, so {share}, and no precision setting made it finite: run the "
                "health check on this model."
            )
        elif auto_fix == "ask":
            entry.message = (
                f"{where}, so {share}, and no precision setting passed a quick test: run the "
                "health check on this model."
            )
        else:
            entry.message = (
                f"{where}, so {share}, though it already runs in fp32: run the health check "
                "on this model."
            )
        return entry
    if fixes and repair is not None:
        entry.fix = dict(repair.settings)
        entry.cause = repair.cause  # a precision change (or only another backend) made it finite
        entry.quality = repair.quality.to_json() if repair.quality is not None else None
    if safety_hit:
        entry.status = "safety_checker"
        entry.message = (
            "The model's safety checker flagged this image and replaced it with a black one; "
            "nothing overflowed."
        )
    elif stats.near_black:
        entry.status = "black"
        entry.message = (
            "This image is almost completely black but holds no NaN, so nothing overflowed; "
            "that may be what the prompt asks for, so try another seed or a brighter prompt."
        )
    elif fixes:
        entry.status = "fixed"
        how = (
            "the same latents were decoded again"
            if component == "vae"
            else "the image was made again"
        )
        entry.message = f"{where}; {how} with the fix '{'; '.join(fixes)}', and it came out finite."
    else:
        entry.message = (
            "No problem found: every value stayed finite."
            if watched
            else "The image looks fine; the NaN watch was off, so only its pixels were checked."
        )
    return entry


def _where(component: str | None, step: int | None, steps: int) -> str:
    """ "the UNet went non-finite (NaN) at step 3 of 20", "the VAE went non-finite (NaN)"."""
    words = component_words(component) if component else "model"
    at = f" at step {step} of {steps}" if step is not None else ""
    when = " while decoding" if component == "vae" else ""
    return f"The {words} went non-finite (NaN){at}{when}"


def _box_text(box: tuple[int, int, int, int] | None) -> str | None:
    """'x 64-127, y 0-63' (inclusive pixel ranges) for a box, None without one."""
    if box is None:
        return None
    x0, y0, x1, y1 = box
    return f"x {x0}-{x1 - 1}, y {y0}-{y1 - 1}"


def _box_words(box: tuple[int, int, int, int] | None) -> str:
    text = _box_text(box)
    return f", all within {text}" if text else ""


def _percent(fraction: float) -> str:
    value = fraction * 100
    if value >= 99.95:
        return "100%"
    return f"{value:.1f}%" if value >= 0.1 else "under 0.1%"


def _parameters(entry: ImageResult, request: GenerationRequest, model) -> str:
    """The PNG's `parameters` text, in AUTOMATIC1111's format, plus HalfSafe's own pairs (each
    key, its meaning and how it is written: `infotext.KEYS`)."""
    s = entry.settings
    family = family_of(model.pipeline)
    loras = entry.loras if entry.loras is not None else list(getattr(model, "loras", []))
    values: list[tuple[infotext.Key, Any]] = [
        (infotext.STEPS, request.steps),
        (infotext.SAMPLER, family.sampler_words(request.scheduler)),
        *infotext.keyed(family.guidance_parameters(request.cfg)),
        (infotext.SEED, entry.seed),
        (infotext.SIZE, (request.width, request.height)),
        (infotext.MODEL_HASH, model.model_hash),
        (infotext.MODEL, model.name),
        (infotext.LORA_HASHES, lora_hashes(loras)),
        *_vae_parameters(getattr(model, "vae", None)),
        # The starting noise is made on the CPU (`_Job.noise`); A1111 assumes GPU noise unless
        # told, and the seed would not reproduce there.
        (infotext.RNG, "CPU"),
        # The effective settings: precisions, backend flags, layer-level fixes, NaN watch, device.
        *infotext.setting_values(s),
        (infotext.NAN_WATCH, entry.status),
        (infotext.NAN_COMPONENT, entry.component),
        (infotext.NAN_STEP, entry.step),
        (infotext.FIXES_APPLIED, entry.fixes_applied),
        (infotext.NON_FINITE_PIXELS, _percent(entry.non_finite) if entry.non_finite else None),
        (
            infotext.NON_FINITE_REGION,
            _box_text(entry.non_finite_box) if entry.non_finite < 1 else None,
        ),
        (infotext.HALFSAFE, __version__),
    ]
    return infotext.write(prompt_with_tags(request.prompt, loras), request.negative_prompt, values)


def _vae_parameters(vae: str | None) -> list[tuple[infotext.Key, Any]]:
    """A1111's `VAE hash` (first 10 hex of the file's sha256, cached like the model's) and
    `VAE` (the file name) for a separate VAE; none for the model's own. A VAE folder has no
    file hash, and a file that cannot be read now is named without one."""
    if not vae:
        return []
    from app.core.checkpoint import model_hash

    path = Path(vae)
    vae_hash = None
    if path.is_file():
        with contextlib.suppress(OSError):
            vae_hash = model_hash(path)
    return [(infotext.VAE_HASH, vae_hash), (infotext.VAE, path.name)]


def _output_folder(request: GenerationRequest) -> Path:
    from app.core import paths
    from app.core.settings import load_settings

    if request.output_dir:
        return Path(request.output_dir).expanduser()
    chosen = load_settings().settings["output_folder"]
    return Path(chosen).expanduser() if chosen else paths.default_output_dir()


def rescue_unsaved(error: ImageSaveError) -> ImageSaveError:
    """After a failed save, write the images that are still only in memory to HalfSafe's own
    `unsaved` folder, and return the error with what became of them: saved there instead, or
    (that folder failing too) plainly not saved. The returned error keeps `.result`, so a
    caller that lives on (the GUI) can still hold the images in memory."""
    if error.result is None:
        return error
    rescue = paths.data_dir() / "unsaved"
    try:
        error.result.save(rescue)
    except ImageSaveError as second:
        unsaved = sum(1 for entry in error.result.images if not entry.path)
        noun = "image was" if unsaved == 1 else "images were"
        return ImageSaveError(
            f"{error} {second} So {unsaved} generated {noun} not saved.", error.result
        )
    return ImageSaveError(f"{error} The images were saved to {rescue} instead.", error.result)
