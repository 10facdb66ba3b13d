"""One generation job: the stages of a request (encode, denoise, decode) under a precision plan,
the probes that re-run only the part that failed, the repair that finds the cheapest working
fix for it, and the safety checker's pass over the finished images."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field, replace
from typing import Any

from app.core import diagnosis
from app.core.components import COMPONENTS, RUN_ORDER
from app.core.components import words as component_words
from app.core.diagnosis import FixCandidate, candidate_fixes
from app.core.errors import CancelledError
from app.core.families import family_of
from app.core.generation.records import GenerationRequest, PreviewCallback
from app.core.generation.watch import NanWatch, read_flags
from app.core.images import PixelStats, image_array, to_image
from app.core.jobs import CancelToken, ProgressCallback
from app.core.lora import strip_tags
from app.core.precision import PlacedPipeline, PrecisionPlan, backend_flags
from app.core.preview import colours_for, latent_preview

# Run order of the components: a failure is blamed on the first one that went non-finite.
STAGES = RUN_ORDER
PREVIEWS_PER_IMAGE = 6
MAX_REPAIRS_PER_IMAGE = 3


@dataclass
class _Conditioning:
    """Prompt embeddings for one image (batch 1) and, per text encoder, a device-side flag."""

    embeds: dict[str, Any]
    bad: dict[str, Any]


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


@dataclass
class Repair:
    outcome: Outcome
    fixes: list[str] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    first_bad_module: str | None = None
    quality: diagnosis.Quality | None = None  # the worst of its repairs against fp32
    # "kernel" when the repairs only switched the attention backend (the same precision, as
    # `causes` classifies a check's fix), else "precision".
    cause: str = "precision"


def failure(outcome: Outcome) -> str | None:
    """The component to blame for a non-finite image (None: finite, or unknown when unwatched)."""
    if outcome.bad_encoder:
        return outcome.bad_encoder
    if outcome.bad_step is not None:
        return outcome.denoiser
    if outcome.stats.non_finite > 0:
        return "vae" if outcome.watched else ""
    return None


class Job:
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

    def run(self, plan: PrecisionPlan, seeds: list[int], conditioning=None) -> list[Outcome]:
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
                Outcome(
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

    def wide_probe(self, component: str, outcome: Outcome):
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

    def first_bad_module(self, component: str, outcome: Outcome) -> str | None:
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

    def part_output(self, component: str, plan: PrecisionPlan, outcome: Outcome) -> Any:
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

    def verify(self, component: str, plan: PrecisionPlan, outcome: Outcome):
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

    def quick_check(self, component: str, plan: PrecisionPlan, outcome: Outcome) -> bool:
        return self.verify(component, plan, outcome)[0]

    # -- repair ------------------------------------------------------------------------------

    def candidates(self, component: str, outcome: Outcome):
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

    def repair(self, index: int, seed: int, outcome: Outcome, total: int) -> Repair:
        """Repair one image: the failing part only, cheapest fix first, until it is finite."""
        result = Repair(outcome)
        for _ in range(MAX_REPAIRS_PER_IMAGE):
            component = failure(result.outcome)
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

    def _try(self, component: str, candidate: FixCandidate, outcome: Outcome, seed: int):
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
        still = failure(again)
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

    def suggest(self, component: str, outcome: Outcome, verify: bool) -> FixCandidate | None:
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
