"""The public entry point, `generate`: check the request, plan the precision, run the job,
repair what the settings allow (by precision, then by the cause the health check finds), and
save the images with their parameters."""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from app.core import samplers, work
from app.core.components import join_words
from app.core.errors import HalfSafeError
from app.core.families import capabilities, family_of
from app.core.fixing import job_plans, remembered_notes
from app.core.fixing.job_fix import JobFix, with_job_fix
from app.core.fixing.remembered_fix import RememberedFix
from app.core.generation import step_cache
from app.core.generation.describe import describe
from app.core.generation.job import Job
from app.core.generation.parameters import parameters
from app.core.generation.records import (
    GenerationRequest,
    GenerationResult,
    ImageResult,
    PreviewCallback,
    settings_of,
)
from app.core.generation.repair import Repair
from app.core.generation.saving import output_folder
from app.core.generation.stages import Outcome, failure
from app.core.identities import DeviceIdentity, ModelIdentity
from app.core.images.canvas import Paste
from app.core.images.pictures import (
    NO_STRENGTH_BECAUSE,
    STRENGTH_DEFAULT,
    Mode,
    check_strength,
    read_pictures,
    steps_run,
)
from app.core.jobs import DONE, CancelToken, ProgressCallback, no_progress
from app.core.memory import is_out_of_memory, said_memory_plan
from app.core.precision import tiling
from app.core.precision.words import fix_words
from app.core.settings import FIELDS, PrecisionSettings


def _checked_request(request: GenerationRequest, mode: Mode) -> GenerationRequest:
    for key in (
        "steps",
        "cfg",
        "seed",
        "width",
        "height",
        "batch",
        "scheduler",
        "clip_skip",
        "step_cache",
    ):
        try:
            FIELDS[key].validate(getattr(request, key))
        except ValueError as error:
            raise HalfSafeError(f"{FIELDS[key].label}: {error}.") from None
    if not isinstance(request.prompt, str) or not isinstance(request.negative_prompt, str):
        raise HalfSafeError("The prompt and the negative prompt must be text.")
    check_strength(request.steps, request.strength, mode)
    request.canvas.checked()
    hires = request.hires.checked()
    hires.checked_size(request.width, request.height)
    if hires.on and mode is not Mode.TEXT:
        raise HalfSafeError(
            "Hires fix is a second pass after text-to-image; this job starts from a picture "
            f"({mode.value}): set Hires upscale to 1, or draw the picture at the larger size."
        )
    if hires.on and hires.steps_run(request.steps) < 1:
        raise HalfSafeError(
            f"Hires denoising strength {hires.denoise:g} of {hires.call_steps(request.steps)} "
            "steps runs no step; raise the strength or the hires steps."
        )
    return request


def _strength_run(
    request: GenerationRequest, mode: Mode, from_noise: bool
) -> tuple[GenerationRequest, list[str]]:
    """The request as it runs, and a sentence where a strength other than the default (which
    every job carries unasked) was asked for a picture job that draws from noise with every
    step, to which none applies: an edit, a control picture, and Flux.1 Fill's inpainting,
    which runs at strength 1 and whose record says so."""
    if mode is Mode.TEXT or not from_noise:
        return request, []
    asked = request.strength
    recorded = mode in (Mode.IMAGE, Mode.INPAINT)  # the record of an edit has no strength
    if recorded:
        request = replace(request, strength=1.0)
    if asked in (STRENGTH_DEFAULT, 1.0):
        return request, []
    ran = ": it ran at 1" if recorded else ""
    because = NO_STRENGTH_BECAUSE.get(mode, NO_STRENGTH_BECAUSE[Mode.INPAINT])
    return request, [f"{because}, so the strength {asked:g} does not apply to it{ran}."]


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
    fix: Mapping[str, Any] | None = None,
) -> GenerationResult:
    """Generate `request.batch` images with `model` (a `models.LoadedModel`), diagnose each,
    repair what `precision.auto_fix` allows, and save them as PNG files. `fix`: a fix for this
    job only, over `precision`, the user's own choices included (`job_fix.with_job_fix`); the
    result records it (`GenerationResult.job_fix`).

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
    from app.core.fixing import profiles

    started = time.perf_counter()
    began = time.time()  # as a stored fix's time is written
    progress = on_progress or no_progress
    precision, job_fix = with_job_fix(precision, fix)
    result, learned = _generate_unsaved(
        model,
        request,
        precision=precision,
        device=device,
        on_progress=on_progress,
        on_preview=on_preview,
        cancel=cancel,
        job_fix=job_fix,
    )
    if precision.nan_check and precision.auto_fix == "auto":
        learned = _repair_by_cause(
            model, result, precision, device, progress, cancel or CancelToken(), learned
        )
    previous = profiles.remembered_fix(model.profile_key, result.device.name)
    if learned is not None and previous is not None and previous.saved_at > began:
        # A fix was stored while this job ran (a check here, or in ComfyUI on the same file):
        # it stands; this job's repair, proved on the fix it started with, does not replace it.
        result.warnings.append(
            "A fix was remembered for this model while this job ran; it is kept, and this "
            "job's repair is not remembered over it."
        )
        learned = None
    if learned is not None and previous is not None:
        was = fix_words(previous.settings, previous.parts or model.components)
        now = fix_words(learned.settings, model.components)
        if _keeps_the_checked_fix(previous, learned):
            # One note, in place of "ran without it": the job repaired, the fix was not in
            # place, and the next job at these settings repairs again.
            result.warnings = [w for w in result.warnings if w not in learned.remembered_note]
            result.warnings.append(
                remembered_notes.overridden_repair_words(previous, learned.overrode_remembered, now)
            )
            learned = None
        elif dict(previous.settings) != learned.settings:
            result.warnings.append(
                "The fix remembered for this model on this device is now the one this job "
                f"proved: {now} (it was: {was})."
            )
    if learned is not None:  # the job ran to its end: what it proved is kept for the next
        profiles.remember_fix(
            model.profile_key,
            result.device.name,
            learned.settings,
            learned.summary,
            "generation repair",
            made_at=learned.made_at,
            parts=model.components,
            warn=result.warnings.append,
        )
    for entry in result.images:
        entry.parameters = parameters(
            entry, result.request, model, result.device.name, result.memory, result.job_fix
        )
    progress("Saving", 0, len(result.images))
    folder = output_folder(result.request)
    try:
        result.save(folder)
    finally:
        result.seconds = time.perf_counter() - started
    progress(DONE, len(result.images), len(result.images))
    return result


@dataclass(frozen=True)
class _Learned:
    """A fix a generation proved by repairing its images, remembered for the model on this
    device only once the whole job has run (one stopped half-way remembers nothing)."""

    settings: dict[str, Any]
    summary: str
    made_at: dict[str, Any] = field(default_factory=dict)  # `RememberedFix.made_at`
    # The user's own settings that overrode some of the remembered fix (each as the user had
    # it), so the job ran without it: the repair proves what works at those settings, not that
    # the remembered fix was wrong.
    overrode_remembered: dict[str, Any] = field(default_factory=dict)
    remembered_note: tuple[str, ...] = ()  # what the job's notes said of the remembered fix


def generate_unsaved(
    model,
    request: GenerationRequest,
    *,
    precision: PrecisionSettings,
    device: str = "auto",
    on_progress: ProgressCallback | None = None,
    cancel: CancelToken | None = None,
) -> GenerationResult:
    """`generate`'s images and their diagnosis, neither saved nor remembered: a picture made to
    be compared (`explain --remake`), not kept. A repair still runs where `precision.auto_fix`
    allows, and the fix it proved is not kept for the model."""
    return _generate_unsaved(
        model, request, precision=precision, device=device, on_progress=on_progress, cancel=cancel
    )[0]


def _keeps_the_checked_fix(previous: RememberedFix, learned: _Learned) -> bool:
    """Whether a remembered fix stays although this job repaired its images another way: the
    health check proved it (against fp32), and the job ran without it because the user's own
    settings overrode it. A generation's repair proves only a finite image."""
    return (
        previous.verified_by == "health check"
        and bool(learned.overrode_remembered)
        and dict(previous.settings) != learned.settings
    )


@dataclass
class _Prepared:
    """A job's request as it will run, checked against the model before any of its numbers:
    its mode, the pictures it reads, and the note a strength that redraws everything makes."""

    request: GenerationRequest
    mode: Mode
    pictures: Any
    strength_note: list[str]


def _prepared(model, request: GenerationRequest) -> _Prepared:
    """The request checked against the model's family (what the job is, its size, clip skip,
    hires, caches) and its pictures read; HalfSafeError naming the model otherwise."""
    pipeline = model.pipeline
    family = family_of(pipeline)
    references, control = (
        capabilities.references(family, pipeline),
        capabilities.controls(family, pipeline),
    )
    mode = request.mode_for(references, control)
    problem = family.picture_problem(pipeline, mode)  # what the job is, before its numbers
    if problem is not None:
        raise HalfSafeError(f"{model.name}: {problem}")
    request, strength_note = _strength_run(request, mode, family.redraws_from_noise(pipeline, mode))
    request = _checked_request(request, mode)
    problem = (
        family.size_problem(pipeline, request.width, request.height)
        or family.size_problem(pipeline, *request.drawn_size())
        or family.clip_skip_problem(request.clip_skip)
        or (family.picture_problem(pipeline, Mode.IMAGE) if request.hires.on else None)
        or (step_cache.problem(family) if request.step_cache else None)
        or (step_cache.prompt_problem(family) if request.prompt_cache else None)
    )
    if problem is not None:
        raise HalfSafeError(f"{model.name}: {problem}")
    pictures = read_pictures(
        request.images,
        request.mask,
        request.width,
        request.height,
        references,
        control,
        request.canvas,
    )
    return _Prepared(request, mode, pictures, strength_note)


def _job_notes(model, request: GenerationRequest, plan, start, strength_note) -> list[str]:
    """The notes a job starts with: the plan's, the profiles file's, the strength's, each
    LoRA's, and a sampler setting this model does not sample with."""
    warnings = list(plan.warnings) + start.profile_notes + strength_note
    warnings.extend(
        problem
        for applied in getattr(model, "loras", [])
        if (problem := applied.file.problems()) is not None
    )
    warnings.extend(getattr(model, "lora_warnings", []))
    return warnings


def _sampler_note(model, request: GenerationRequest) -> list[str]:
    """A sentence when the model samples with its own sampler, not the one set."""
    sampler = family_of(model.pipeline).sampler_words(request.scheduler)
    if sampler == samplers.words(request.scheduler):
        return []
    return [
        f"This model samples with its own {sampler} (flow matching); the sampler setting "
        f"{samplers.words(request.scheduler)} does not apply to it."
    ]


# One image as it came out of the job: its outcome (after a repair, if one ran), the repair,
# the component that failed first and the denoising step it failed at.
_Final = tuple[Outcome, Repair | None, str | None, int | None]


def _run_and_repair(job: Job, plan, seeds: list[int], auto_fix: str, warnings: list[str]):
    """Every image of the job, each repaired where it failed and the auto repair is on. A
    repair that stops with an error keeps the batch going (the image is kept as it came out);
    out of memory stops the job."""
    finals: list[_Final] = []
    outcomes = job.run(plan, seeds)
    for index, (seed, outcome) in enumerate(zip(seeds, outcomes, strict=True)):
        component = failure(outcome)
        step = outcome.bad_step if component == outcome.denoiser else None
        repair = None
        if component and auto_fix == "auto":
            try:
                repair = job.repairs.repair(index, seed, outcome, len(seeds))
            except RuntimeError as error:
                if is_out_of_memory(error):
                    raise
                warnings.append(
                    f"Image {index + 1}: the repair stopped with an error ({error}); the "
                    "image is kept as it came out."
                )
            else:
                outcome = repair.outcome
        finals.append((outcome, repair, component, step))
    return finals


def _described(
    job: Job,
    seeds: list[int],
    finals: list[_Final],
    auto_fix: str,
    watch: bool,
    request: GenerationRequest,
    precision: PrecisionSettings,
) -> list[ImageResult]:
    """Each image's result: the safety checker's verdict on the finite ones, and for one that
    still failed whether the failure recurs and the fix suggested (by `auto_fix`)."""
    flagged, checked = job.safety_check([o.image for o, *_ in finals if o.stats.non_finite == 0])
    verdicts = iter(zip(flagged, checked, strict=True))
    entries: list[ImageResult] = []
    for seed, (outcome, repair, component, step) in zip(seeds, finals, strict=True):
        hit = False
        if outcome.stats.non_finite == 0:
            hit, outcome.image = next(verdicts)
        suggestion = None
        intermittent = False
        still = failure(outcome)
        # A denoiser that went non-finite with a cache on: the cache comes first (a part
        # re-run alone runs without it, so it would look intermittent).
        cached = still is not None and still == outcome.denoiser and outcome.cached
        if still is not None and auto_fix == "ask" and not cached:
            # The quick test starts by running the failing part again unchanged: a NaN that
            # does not come back is no precision problem, so no precision fix is offered.
            intermittent = not job.repairs.recurs(still, outcome)
        if still is not None and auto_fix in ("off", "ask") and not (intermittent or cached):
            suggestion = job.repairs.suggest(still, outcome, verify=auto_fix == "ask")
        entry = describe(
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
            intermittent=intermittent,
            cached=cached,
        )
        if entry.first_bad_module is None and entry.component:
            entry.first_bad_module = job.first_bad.get(entry.component)
        entries.append(entry)
    return entries


def _learned_fix(
    job: Job,
    plan,
    remembered: RememberedFix | None,
    precision: PrecisionSettings,
    remembered_note: tuple[str, ...],
) -> _Learned:
    """The precision fix the job's repairs proved, merged with what of the remembered fix the
    job ran with.

    A setting the user overrode (a VAE in fp16 where the fix ran it in fp32) took no part in
    this proof, and beside the repair it would make a fix that contradicts itself ("2 VAE
    layers in bf16; the VAE in fp32")."""
    ran_with = {*plan.remembered_used, *plan.remembered_held}
    usable = (
        job_plans.without_layers(remembered.settings, plan.remembered_dropped) if remembered else {}
    )
    merged = {**job_plans.remembered_ran(plan, remembered), **job.repairs.fix_settings}
    parts = join_words(job.repairs.fixed_components)
    # What of it the user's settings overrode (a layer the model lacks is no override).
    asked = precision.to_dict()
    overridden = {
        key: asked[key]
        for key, value in usable.items()
        if key not in ran_with and value not in ("auto", False, [], ()) and key in asked
    }
    return _Learned(
        merged,
        f"The {parts} went non-finite during generation; fix: "
        f"{'; '.join(job.repairs.fix_words)}. Verified by repairing the image, which came out "
        "finite.",
        plan.dtype_settings(),
        overrode_remembered=overridden,
        remembered_note=remembered_note,
    )


@work.setting_world_aside
def _generate_unsaved(
    model,
    request: GenerationRequest,
    *,
    precision: PrecisionSettings,
    device: str = "auto",
    on_progress: ProgressCallback | None = None,
    on_preview: PreviewCallback | None = None,
    cancel: CancelToken | None = None,
    job_fix: JobFix | None = None,
) -> tuple[GenerationResult, _Learned | None]:
    """`generate` up to the images and their diagnosis and precision repairs, unsaved; and the
    precision fix those repairs proved (the remembered one's settings under it), if any."""
    from app.core.fixing.job_start import start_job

    started = time.perf_counter()
    prepared = _prepared(model, request)
    request, mode, pictures = prepared.request, prepared.mode, prepared.pictures
    progress = on_progress or no_progress
    cancel = cancel or CancelToken()

    start = start_job(model, precision, device)
    info, remembered = start.info, start.remembered
    drawn_width, drawn_height = request.drawn_size()
    plan = tiling.resolve(
        start.plan, getattr(model.pipeline, "vae", None), drawn_height, drawn_width
    )
    warnings = _job_notes(model, request, plan, start, prepared.strength_note)
    remembered_note = tuple(remembered_notes.remembered_words(remembered, plan, job_fix))
    warnings.extend(remembered_note)
    warnings.extend(_sampler_note(model, request))
    watch = bool(precision.nan_check)
    auto_fix = precision.auto_fix if watch else "off"
    job = Job(
        model,
        request,
        plan,
        device=start.torch_device,
        bf16_native=getattr(info, "bf16", None) == "native",
        watch=watch,
        progress=progress,
        preview=on_preview,
        cancel=cancel,
        pictures=pictures,
    )
    seeds = _seeds(request)
    learned: _Learned | None = None
    memory = said_memory_plan(model.pipeline, plan, progress)
    try:
        progress("Encoding the prompt", 0, steps_run(request.steps, request.strength, mode))
        finals = _run_and_repair(job, plan, seeds, auto_fix, warnings)
        entries = _described(job, seeds, finals, auto_fix, watch, request, precision)
        if job.repairs.fix_settings and any(e.status == "fixed" for e in entries):
            learned = _learned_fix(job, plan, remembered, precision, remembered_note)
    finally:
        job.placed.release()
    warnings.extend(dict.fromkeys(job.repairs.dropped))
    warnings.extend(job.notes)
    if pictures is not None and pictures.paste is not None:
        for entry in entries:
            _pasted(entry, pictures.paste, request)

    result = GenerationResult(
        images=entries,
        settings=settings_of(plan, precision),
        seconds=0.0,
        request=request,
        model=ModelIdentity.of(model),
        device=DeviceIdentity.of(info),
        warnings=warnings,
        mode=mode,
        memory=memory,
        job_fix=job_fix,
        upsampled_prompt=job.upsampled,
    )
    result.seconds = time.perf_counter() - started
    return result, learned


def _pasted(entry: ImageResult, paste: Paste, request: GenerationRequest) -> None:
    """An inpainting image blended back into its picture (`canvas.Paste`), once its pixels
    have been diagnosed at the size they were drawn: the saved image is the picture's size,
    the non-finite share is of its area (the drawn box is all of it, or only the masked
    area's box), and the non-finite box says where it lies there."""
    if entry.image is None:
        return
    entry.image = paste.onto(entry.image)
    entry.non_finite *= paste.box_share
    if entry.non_finite_box is not None:
        entry.non_finite_box = paste.place_box(entry.non_finite_box, request.width, request.height)


# Repairs that follow a cause other than precision (see `causes`): what `_repair_by_cause` does
# ("rerun": an intermittent fault, the images made again unchanged).
_CAUSE_REPAIRS = ("switch_backend", "reload", "drop_lora", "rerun")


def _repair_by_cause(
    model,
    result: GenerationResult,
    precision: PrecisionSettings,
    device: str,
    progress,
    cancel,
    learned: _Learned | None,
) -> _Learned | None:
    """Images still NaN after the precision repairs, and images a precision repair made
    finite while an attention kernel HalfSafe does not ship ran (such a kernel often fails in
    one dtype only, so a dtype change hides what turning it off fixes): the health check at
    the request's size attributes the failure (`causes.check_and_attribute`), and a verified
    repair that is not a precision change (another attention backend, a freshly loaded
    component, dropping a LoRA whose tensors hold NaN) makes those images again with the same
    seeds. Each image says the cause; an image the repair did not make finite keeps its first
    result. Returns the fix to remember: `learned`, or the backend switch that replaces it."""
    from app.core import causes
    from app.core.fixing import profiles
    from app.core.health.request import CheckRequest, CheckRun
    from app.core.lora import files as lora
    from app.core.precision import kernels

    failing = [i for i, e in enumerate(result.images) if e.status == "nan"]
    foreign = bool(kernels.foreign_kernels())
    hidden = [
        i
        for i, e in enumerate(result.images)
        if foreign
        and result.settings.get("attention_backend") == "auto"
        and e.status == "fixed"
        and e.cause in (None, "precision")
    ]
    if not failing and not hidden:
        return learned
    request = result.request
    progress("Finding the cause", 0, 1)
    report = causes.check_and_attribute(
        model,
        CheckRequest(
            precision=precision,
            device=device,
            size=max(64, min(request.drawn_size()) // 8 * 8),  # a hires fix's final size
            steps=request.steps,
            scheduler=request.scheduler,
            images=tuple(request.images),
            mask=request.mask,
            canvas=request.canvas,
            clip_skip=request.clip_skip,
            pixel_upscale=request.hires.pixels,
        ),
        # The cause and its proved repair alone: no table, nothing timed.
        run=CheckRun(remember=False, measure_cost=False, complete_table=False),
        on_progress=progress,
        cancel=cancel,
    )
    cause = report.cause
    if cause is None:
        return learned
    if cause.kind != "kernel":
        hidden = []  # the precision repairs stand: the kernel is not at fault
    for index in failing + hidden:
        result.images[index].cause = cause.kind
    if not cause.verified or cause.action not in _CAUSE_REPAIRS:
        for index in failing:
            result.images[index].message += f" {cause.summary}"
        # A kernel at fault that no switch repaired: its precision repair is not the model's.
        return None if hidden else learned
    again = precision
    if cause.action == "switch_backend":
        again = replace(precision, **cause.settings)
    loras = list(getattr(model, "loras", []))
    used = loras
    if cause.action == "drop_lora":
        used = [a for a in loras if not a.file.damaged]
        lora.use_weights(model.pipeline, used)
    try:
        for index in sorted(failing + hidden):
            cancel.raise_if_cancelled()
            first = result.images[index]
            one = replace(request, seed=first.seed, batch=1)
            remade = _generate_unsaved(
                model, one, precision=again, device=device, on_progress=progress, cancel=cancel
            )[0].images[0]
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
            remade.quality = cause.quality
            remade.loras = list(used)
            remade.message = f"{cause.summary} The image was made again that way."
            result.images[index] = remade
    finally:
        if used is not loras:
            lora.use_weights(model.pipeline, loras)
    if cause.action == "switch_backend" and any(e.cause == "kernel" for e in result.images):
        # The backend switch replaces the precision repair the kernel's fault seemed to need.
        remembered = profiles.remembered_fix(model.profile_key, result.device.name)
        return _Learned(
            {**(remembered.settings if remembered else {}), **cause.settings},
            cause.summary,
            dict(remembered.made_at) if remembered else {},
        )
    return learned
