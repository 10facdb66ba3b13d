"""`check_loaded`, the health check of a loaded model, step by step: the plan it runs (the
device, the fix remembered for this model, the weights found damaged when loading), the text
encoders, the denoiser and the VAE each run once and every component that went non-finite
given its fix (`fix.choose_fix`), everything in fp32 as the last resort, the verdict (a proved
fix said at once), the candidates' tables finished, the notes and precisions of each component,
the fix's cost and the report."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from app import __version__
from app.core import work
from app.core.components import Role, Verdict, in_run_order, join_words, of_role
from app.core.components import words as component_words
from app.core.errors import HalfSafeError
from app.core.families import capabilities, family_of
from app.core.fixing import job_plans, remembered_notes
from app.core.fixing.quality import compare
from app.core.health.cost import price_fix, priced_component, timed_as_checked
from app.core.health.fix import Search, choose_fix, fix_summary, last_resort, take_timed
from app.core.health.observations import (
    Observations,
    at_fault,
    component_report,
    fp16_advice,
    mark_fed_by,
    predicted_islands,
)
from app.core.health.report import (
    CheckMemory,
    ComponentReport,
    Fix,
    HealthReport,
    StreamedPart,
    component_of_tensor,
)
from app.core.health.request import AS_ASKED, CheckRequest, CheckRun
from app.core.health.stages import Runner, finite_stand_in, first_bad_name
from app.core.health.words import timed_faster_notes
from app.core.identities import DeviceIdentity, LoraIdentity, ModelIdentity
from app.core.images.pictures import Mode, Pictures, mode_of, read_pictures
from app.core.jobs import DONE, CancelToken, Headline, ProgressCallback, no_progress
from app.core.memory import said_memory_plan
from app.core.precision import PrecisionPlan, tiling
from app.core.precision.words import low_bit_notes
from app.core.run.probe import ProbeResult
from app.core.run.watchers import Stage, all_finite
from app.core.settings import PrecisionSettings

if TYPE_CHECKING:  # imported when the check runs (hardware and profiles), or only named here
    from app.core.fixing.profiles import RememberedFix
    from app.core.formats.quantized import QuantFinding
    from app.core.hardware.records import DeviceInfo
    from app.core.precision.lowbit import LowBitReport

STAGES = 3  # the progress total: the text encoders, the denoiser, the VAE (+ its encoder)


def found(component: str, dtype: str, first_bad: str | None) -> Headline:
    """The headline for `component` going non-finite in `dtype`, first at `first_bad`."""
    where = f", first at {first_bad}" if first_bad else ""
    return Headline(
        f"The {component_words(component)} went NaN/Inf in {dtype}{where}; "
        "proving a fix against fp32."
    )


def proved(fix_words: list[str]) -> str:
    """The progress stage that reports the fix proved, before its candidates' table is done."""
    return f"Fix proved: {'; '.join(fix_words)}. Completing the table of the fixes tried"


def check_loaded(
    model,
    request: CheckRequest,
    *,
    run: CheckRun = AS_ASKED,
    on_progress: ProgressCallback | None = None,
    cancel: CancelToken | None = None,
) -> HealthReport:
    """Check a loaded model as `request` asks: on its `device` under its `precision`, probed
    at its `size` (None: the model's own).

    The request is the job as the user describes it and travels whole, so a field added to it
    reaches the check without touching the callers in between; its `loras` and `allow_pickle`
    are applied by the caller before (`requests.requested.check`). `run` is how this call runs
    (`CheckRun`: the caller's policy, not the job's); progress and cancel are the callbacks
    every core job takes.

    `steps` and `scheduler` are the user's sampler settings: the denoiser is probed at the
    first, middle and last timesteps of that schedule; the `prompt` is read at `clip_skip`, as
    the user's jobs read it. With an input picture (`images`, and `mask` for inpainting, laid
    out by `canvas`) the check runs the path such a job runs: the picture, resized to the
    probe's size, through the VAE's encoder (reported as `vae_encoder`) before the denoiser.
    With `pixel_upscale` (a hires fix whose upscaler enlarges the decoded picture, checked at
    its final size) the picture the VAE decoded also goes through the VAE's encoder at that
    size (reported as `vae_encoder`), as the second pass encodes the enlarged first picture.

    Runs on the calling thread and takes seconds on a GPU. Side effects: components are copied
    to the device for the duration (released at the end), and a verified fix is stored in the
    model's remembered profile (unless not `run.remember`). With `run.measure_cost`, a verified
    fix is also timed against no-half, alternating. Without `run.use_remembered` the fix
    remembered for the model is left out: the check runs exactly the settings given (an
    image's recorded ones, to reproduce it).
    """
    started = time.perf_counter()
    progress = on_progress or no_progress
    cancel = cancel or CancelToken()
    size = _checked_size(model, request.size)
    family = family_of(model.pipeline)
    references, control = (
        capabilities.references(family, model.pipeline),
        capabilities.controls(family, model.pipeline),
    )
    mode = mode_of(request.images, request.mask, references, control, request.canvas.extends)
    problem = family.clip_skip_problem(request.clip_skip)
    if problem is not None:
        raise HalfSafeError(f"{model.name}: {problem}")
    problem = family.picture_problem(model.pipeline, mode)
    # A model that cannot draw from text alone is still checked on that path, unless it is an
    # editing model: its check without the pictures would not be the path its jobs run.
    if problem is not None and (mode is not Mode.TEXT or references):
        raise HalfSafeError(f"{model.name}: {problem}")
    pictures = read_pictures(
        request.images, request.mask, size, size, references, control, request.canvas
    )
    start = _start(model, request.precision, request.device, run.use_remembered)
    start.plan = tiling.resolve(start.plan, getattr(model.pipeline, "vae", None), size, size)
    # A check is a fix search: every plan it runs holds the stored weights, never a wider copy.
    start.plan = replace(start.plan, compute_in_place=True)
    if problem is not None and (
        control or family.picture_problem(model.pipeline, Mode.INPAINT) is None
    ):  # an inpainting (Fill among them) or control model, checked without its picture
        start.notes.append(WITHOUT_PICTURE[Mode.CONTROL if control else Mode.INPAINT])
    # A hires fix follows text-to-image: its pixel path is checked only there.
    pixel_upscale = request.pixel_upscale and pictures is None
    if pixel_upscale:
        start.notes.append(PIXEL_UPSCALE_NOTE.format(size=size))
    # The request as checked: its size resolved, its pixel path where it runs.
    checked = replace(request, size=size, pixel_upscale=pixel_upscale)
    check = _Check(model, start, checked, pictures, run.measure_cost, progress, cancel)
    said_memory_plan(model.pipeline, start.plan, progress)
    # Counted, and with the loaded world set aside from the collector (`work`).
    with work.counting() as counted, work.frozen_world():
        try:
            check.prompt_upsampler()
            encoded = check.text_encoders()
            if pictures is not None:
                check.vae_encoder()
            denoised = check.denoiser(encoded)
            decoded = check.vae(denoised)
            if checked.pixel_upscale:
                check.enlarged_encoder(decoded)
            last_resort(
                check.runner,
                check.search,
                check.seen,
                check.reports,
                check.first_probes,
                start.plan,
                start.broken,
                progress,
                cancel,
            )
            verdict = check.decide()
            # The fix is reported: the table's rest, unless the check stops at the proof.
            untried = check.search.finish(progress, cancel, complete=run.complete_table)
            if untried and verdict is Verdict.FIXABLE:
                check.notes.append(_stopped_at_the_proof(untried, run.measure_cost))
            check.note_inputs_beyond_range()
            check.weigh_precisions()
            fix, islands = check.conclude(verdict, run.remember)
        finally:
            # Also on cancel or error: drop the device copies and hand cached memory back.
            check.runner.placed.release()
        counted.reach("done")
        progress(DONE, check.stages, check.stages)
    report = _report(model, start, size, check, verdict, fix, islands, started, counted)
    report.low_bit_kernels = _low_bit_kernels(model, size, start.info)
    if report.low_bit_kernels is not None:
        report.notes += low_bit_notes(report.low_bit_kernels.to_json())
    return report


def _low_bit_kernels(model, size: int, info: DeviceInfo) -> LowBitReport | None:
    """comfy-kitchen's int8 kernels at the shapes of the model's layers stored int8, on the
    checked device (`precision.lowbit`): what ComfyUI would run them with there. None for a
    model with no such layer or without comfy-kitchen."""
    from app.core.precision import lowbit

    dtype = "bf16" if info.bf16 == "native" or info.kind == "cpu" else "fp16"
    return lowbit.model_report(model.pipeline, size, info.torch_device, dtype)


@dataclass
class _Start:
    """What the check starts from: the device, the plan it runs (the user's settings, or the fix
    remembered for this model on this device), the notes so far, and the weights found damaged
    when the model was loaded with the components they break."""

    info: DeviceInfo
    plan: PrecisionPlan
    remembered: RememberedFix | None
    notes: list[str]
    bad_weights: list[str]
    bad_quantized: list[QuantFinding]
    broken: set[str | None]


# The note on a check of a hires fix's pixel path (`pixel_upscale`).
PIXEL_UPSCALE_NOTE = (
    "The hires fix enlarges the decoded picture and encodes it again: the VAE's encoder was "
    "checked at {size} px too, on the picture the VAE decoded there."
)

# The note on a check made without the picture a model draws after, by the mode its jobs run.
WITHOUT_PICTURE = {
    mode: "This model draws only after a picture, and this check ran without one: the VAE's "
    "encoder was not checked, and the denoiser read zeros where the picture goes. Check again "
    f"with the {what} your jobs use to check the path they run."
    for mode, what in (
        (Mode.INPAINT, "picture and mask"),
        (Mode.CONTROL, "depth map or edge picture"),
    )
}


def _fed_by(first: Stage, before: list[str], probe: ProbeResult) -> str | None:
    """The part of a stage, among those that ran `before` a part in it, whose non-finite output
    that part read: None unless the part went non-finite with no layer of its own going so
    first (its inputs already were) after one of them failed."""
    if not probe.non_finite or first_bad_name(probe) is not None:
        return None
    return next((n for n in before if first.probes[n].non_finite), None)


def _checked_size(model, size: int | None) -> int:
    """The probe size in pixels (the model's own by default), refused when the family cannot
    run it."""
    size = size or model.native_size
    if size < 64 or size % 8:
        raise HalfSafeError(f"The check size must be a multiple of 8 and at least 64, not {size}.")
    problem = family_of(model.pipeline).size_problem(model.pipeline, size, size)
    if problem is not None:
        raise HalfSafeError(f"{model.name}: {problem}")
    return size


def _start(model, precision: PrecisionSettings, device: str, use_remembered: bool = True) -> _Start:
    """The device, the remembered fix (unless not `use_remembered`) and the plan, with their
    notes; then the damaged weights."""
    from app.core.fixing.job_start import start_job

    started = start_job(model, precision, device, use_remembered=use_remembered)
    info, plan, remembered = started.info, started.plan, started.remembered
    notes = list(plan.warnings) + started.profile_notes + list(getattr(model, "notes", []))
    notes.extend(remembered_notes.remembered_words(remembered, plan))
    bad_weights, bad_quantized, broken = _damaged_weights(model, notes)
    return _Start(info, plan, remembered, notes, bad_weights, bad_quantized, broken)


def _damaged_weights(
    model, notes: list[str]
) -> tuple[list[str], list[QuantFinding], set[str | None]]:
    """The tensors the load found NaN or Inf and the quantized ones that decode wrongly, and the
    components they break; a note when the model is stored quantized and decodes plausibly."""
    bad_weights = sorted(model.weights.non_finite)
    bad_quantized = list(getattr(model.weights, "bad_quantized", []))
    broken = {component_of_tensor(name) for name in bad_weights} | {
        f.component or component_of_tensor(f.tensor) for f in bad_quantized
    }
    quantization = getattr(model, "quantization", None)
    if quantization and not bad_quantized:
        notes.append(
            f"The model is stored quantized ({quantization.format}: "
            f"{', '.join(quantization.types)}), {quantization.held_words()}; "
            "its scales and decoded values are plausible."
        )
    return bad_weights, bad_quantized, broken


class _Check:
    """One run of the check: the runner, and what the stages found so far (each component's
    first probe and report, every run by dtype, the fix search), on the calling thread."""

    def __init__(
        self,
        model,
        start: _Start,
        request: CheckRequest,
        pictures: Pictures | None,
        measure_cost: bool,
        progress: ProgressCallback,
        cancel: CancelToken,
    ) -> None:
        """`request` is the request as checked (its size resolved, its pixel path where it
        runs: `check_loaded`); `pictures` its input pictures as read, None for text-to-image."""
        self.model = model
        self.start = start
        self.request = request
        self.plan = start.plan
        self.notes = start.notes
        self.broken = start.broken
        size = request.size
        assert size is not None  # resolved by `check_loaded`
        prompt, steps, scheduler = request.prompt, request.steps, request.scheduler
        clip_skip, pixel_upscale = request.clip_skip, request.pixel_upscale
        self.runner = Runner(
            model, start.plan, size, prompt, steps, scheduler, pictures, clip_skip=clip_skip
        )
        # The progress total: the VAE's encoder is a stage of its own where it runs.
        self.stages = STAGES + (pictures is not None or pixel_upscale)
        self.vae_stage = self.stages - 1 - pixel_upscale  # an enlarged picture's encoder after
        self.seen = Observations()
        self.search = Search(start.plan)
        self.bf16_native = getattr(start.info, "bf16", None) == "native"
        self.measure_cost = measure_cost
        self.progress = progress
        self.cancel = cancel
        self.reports: dict[str, ComponentReport] = {}
        self.first_probes: dict[str, ProbeResult] = {}
        self.told: set[str] = set()  # the components whose finding was told
        self.text_encoder_names: list[str] = []
        # What the denoiser was given (a finite stand-in when the encoders' output was not),
        # and the first component at fault upstream of a stage fed non-finite values.
        self.conditioning: Any = None
        # Each checked part's stage (what a fix of it is priced by), by name.
        self.stage_fns: dict[str, Callable[[PrecisionPlan, bool], Stage]] = {}
        self.fed_by: str | None = None

    def settle(
        self,
        stage_fn: Callable[[PrecisionPlan, bool], Stage],
        names: list[str],
        first: Stage,
        as_tested: Stage | None = None,
    ) -> Stage:
        """Report each component of a stage and, for one that failed, find its fix: the
        cheapest candidate whose re-run is finite and agrees with fp32. `first` ran under the
        fixes found so far, `as_tested` as the user runs it (`as_tested`)."""
        search, progress = self.search, self.progress
        self.stage_fns.update(dict.fromkeys(names, stage_fn))
        if as_tested is not None:  # what each precision does: as the user runs it first
            self.seen.add(as_tested, self.plan)
        self.seen.add(first, search.plan)
        good = first
        reference: Stage | None = None
        for index, name in enumerate(names):
            probe = self.first_probes[name] = first.probes[name]
            verify: ProbeResult | None = None
            tested = as_tested.probes[name] if as_tested is not None else probe
            covered = tested.non_finite and not probe.non_finite
            if covered:  # failed as the user runs it: covered where the fixes agree with fp32
                quality, reference = _against_fp32(self.runner, stage_fn, search.plan, first)
                probe = self.first_probes[name] = tested
                if covered := quality.passed:
                    verify, search.qualities[name] = first.probes[name], quality
                    self.seen.add_covered(name, verify)
            feeder = _fed_by(first, names[:index], probe)
            if feeder is not None and good is not first and not good.probes[name].non_finite:
                # It read a failed part's output in this stage (Anima's text conditioner reads
                # the text encoder's states) and went bad there, not in a layer of its own:
                # its run is the one under that part's fix.
                probe = self.first_probes[name] = good.probes[name]
            if name in self.broken or covered:
                pass
            elif probe.non_finite and good is not first and not good.probes[name].non_finite:
                verify = good.probes[name]  # the fix found for a sibling fixed this one too
            elif probe.non_finite:
                self.tell(name, probe)
                if reference is None:
                    progress("Running the fp32 reference", 0, 1)
                    with self.runner.recording_in_full():  # its record draws the islands
                        reference = stage_fn(job_plans.fp32_reference(search.plan), True)
                chosen = choose_fix(
                    name,
                    stage_fn,
                    search,
                    reference,
                    self.runner,
                    self.seen,
                    first_bad_name(probe),
                    self.bf16_native,
                    progress,
                    self.cancel,
                )
                if chosen is not None:
                    # The fp32 reference shows the true magnitude (a clamp's run would not).
                    verify, good = reference.probes[name], chosen
                if verify is None:
                    search.unfixed.append(name)
            self.reports[name] = component_report(
                name,
                self.plan.dtype_of(name),
                probe,
                verify,
                first.seconds.get(name, 0.0),
                self.runner.placed[name],
                name in self.broken,
            )
            if probe is not first.probes[name] and feeder is not None:
                stand_in = f"the {component_words(feeder)}'s output under its fix"
                mark_fed_by(self.reports, [name], feeder, self.notes, stand_in)
        return good

    def tell(self, name: str, probe: ProbeResult) -> None:
        """What failed and where, said once per component as soon as it is known (a first
        probe's non-finite call, recorded in full: `Runner.telling`); the first one is the
        check's first finding."""
        if name in self.told or name in self.broken:
            return
        self.told.add(name)
        work.reach("first_finding")
        dtype = self.search.plan.dtype_of(name)
        self.progress(found(name, dtype, first_bad_name(probe)), 0, 0)

    def as_tested(self, part: str, run: Callable[[PrecisionPlan], Stage]) -> Stage | None:
        """Where a fix found for an earlier part reaches `part` (`job_plans.changes_part`), its
        stage `run` as the user runs it, told as a first probe: a fault that fix covers is
        named. None where the fixes leave the part alone."""
        if not job_plans.changes_part(part, self.search.plan, self.plan):
            return None
        return self.first_probe(lambda: run(self.plan))

    def first_probe(self, stage: Callable[[], Stage]) -> Stage:
        """A stage's first run, told as it goes (`tell`)."""
        with self.runner.telling(self.tell):
            return stage()

    def prompt_upsampler(self) -> None:
        """Before the text encoders, where the model has one: the prompt upsampler generating
        (`Runner.upsample`). The text encoders read the check's prompt as given: the caption a
        bounded generation writes is cut short, and their check does not depend on it."""
        names = of_role(self.plan.dtypes, Role.PROMPT_UPSAMPLER)
        if names:
            self.progress("Checking the prompt upsampler", 0, self.stages)
            self.cancel.raise_if_cancelled()
            first = self.first_probe(lambda: self.runner.upsample(self.plan))
            self.settle(self.runner.upsample, names, first)

    def text_encoders(self) -> Stage:
        """The first stage: the text encoder(s) on the prompt and the empty prompt."""
        runner = self.runner
        self.progress("Checking the text encoder", 0, self.stages)
        self.cancel.raise_if_cancelled()
        self.text_encoder_names = runner.host.text_encoders(self.plan)
        first = self.first_probe(lambda: runner.encode(self.plan))
        return self.settle(runner.encode, self.text_encoder_names, first)

    def vae_encoder(self) -> None:
        """For a job that starts from a picture: the picture through the VAE's encoder. The
        denoiser's probe still starts from seeded noise; the latents its pipeline reads in the
        denoiser's sequence beside the noise (an edit's references, or the picture where an
        inpainting pipeline reads it so: `Family.sequence_latents`) feed it there (zeroed where
        nothing fixed the encoder)."""
        runner = self.runner
        self.progress("Checking the VAE encoder", 1, self.stages)
        self.cancel.raise_if_cancelled()
        as_tested = self.as_tested("vae_encoder", runner.encode_picture)
        first = self.first_probe(lambda: runner.encode_picture(self.search.plan))
        good = self.settle(runner.encode_picture, ["vae_encoder"], first, as_tested)
        assert runner.pictures is not None  # only a check of a job that starts from a picture
        references = runner.family.sequence_latents(
            self.model.pipeline, runner.pictures.mode, good.output, runner.pictures.mask
        )
        if references is not None:
            if not all_finite(references):
                self.fed_by = at_fault(["vae_encoder"], self.reports)
                references = finite_stand_in(references)
            runner.references = references

    # A stage fed non-finite values by an earlier one is checked on a finite stand-in, and its
    # components are reported as fed by the first component at fault upstream.

    def denoiser(self, encoded: Stage) -> Stage:
        """The second stage: the denoiser at the probe's timesteps, on the encoders' output
        (their non-finite values zeroed when nothing fixed them)."""
        runner = self.runner
        denoiser = runner.family.denoiser
        self.progress(f"Checking the {component_words(denoiser)}", self.vae_stage - 1, self.stages)
        self.cancel.raise_if_cancelled()
        conditioning = encoded.output
        if not all_finite(conditioning):  # nothing fixed an encoder: zero what is non-finite
            self.fed_by = at_fault(self.text_encoder_names, self.reports)
            conditioning = finite_stand_in(conditioning)
        self.conditioning = conditioning
        as_tested = self.as_tested(denoiser, lambda p: runner.denoise(p, conditioning))
        denoised = self.settle(
            lambda p, record: runner.denoise(p, conditioning, record),
            [denoiser],
            self.first_probe(lambda: runner.denoise(self.search.plan, conditioning)),
            as_tested,
        )
        mark_fed_by(self.reports, [denoiser], self.fed_by, self.notes, "zeroed embeddings")
        return denoised

    def vae(self, denoised: Stage) -> Stage:
        """The third stage: the VAE decoding the denoiser's latent (a seeded noise latent when
        nothing fixed the denoiser); returns the decode under the fix found, if any."""
        import torch

        runner = self.runner
        self.progress("Checking the VAE", self.vae_stage, self.stages)
        self.cancel.raise_if_cancelled()
        latents = denoised.output
        stand_in = f"what the {component_words(runner.family.denoiser)} made of its stand-in"
        if not all_finite(latents):  # nothing fixed the denoiser: decode a plausible latent
            self.fed_by = self.fed_by or at_fault([runner.family.denoiser], self.reports)
            stand_in = "a seeded noise latent"
            latents = torch.randn(latents.shape, generator=torch.Generator().manual_seed(1)).to(
                latents.device
            )
        as_tested = self.as_tested("vae", lambda p: runner.decode(p, latents))
        decoded = self.settle(
            lambda p, record: runner.decode(p, latents, record),
            ["vae"],
            self.first_probe(lambda: runner.decode(self.search.plan, latents)),
            as_tested,
        )
        mark_fed_by(self.reports, ["vae"], self.fed_by, self.notes, stand_in)
        return decoded

    def enlarged_encoder(self, decoded: Stage) -> None:
        """For a hires fix with a pixel upscaler: the picture the VAE decoded at the check's
        size through the VAE's encoder, as the second pass encodes the enlarged first picture
        at that size (a seeded noise picture when nothing fixed the VAE's decode)."""
        import torch

        runner = self.runner
        self.progress("Checking the VAE encoder", self.stages - 1, self.stages)
        self.cancel.raise_if_cancelled()
        pixels = decoded.output
        fed_by = None
        if not all_finite(pixels):
            fed_by = self.fed_by or at_fault(["vae"], self.reports)
            noise = torch.rand(pixels.shape, generator=torch.Generator().manual_seed(1))
            pixels = noise * 2.0 - 1.0
        runner.enlarged = pixels.detach().float().clamp(-1.0, 1.0).cpu()
        as_tested = self.as_tested("vae_encoder", runner.encode_picture)
        first = self.first_probe(lambda: runner.encode_picture(self.search.plan))
        self.settle(runner.encode_picture, ["vae_encoder"], first, as_tested)
        mark_fed_by(self.reports, ["vae_encoder"], fed_by, self.notes, "a seeded noise picture")

    def note_inputs_beyond_range(self) -> None:
        """A note for each component whose input was already non-finite, with no layer of its
        own at fault."""
        for name, probe in self.first_probes.items():
            root = probe.modules.get("")
            if probe.first_bad_module() is None and root is not None and root.non_finite:
                self.notes.append(
                    f"The {component_words(name)} received values already beyond fp16's "
                    "range from the part before it, so no layer inside it is to blame."
                )

    def weigh_precisions(self) -> None:
        """What fp16 and bf16 do for each component, from every run of it, and a note where
        fp16 is at risk only through attention scores."""
        for name, report in self.reports.items():
            report.precisions = self.seen.precisions(name, name in self.broken)
            note = self.seen.score_note(name)
            if note:
                self.notes.append(note)

    def decide(self) -> Verdict:
        """The verdict, known once every stage ran; a proved fix is reported at once, before
        its candidates' table is finished (`Search.finish`), and each milestone is counted."""
        failed = [n for n, r in self.reports.items() if r.status.failed]
        if self.broken or self.search.unfixed:
            verdict = Verdict.BROKEN
        elif failed:
            verdict = Verdict.FIXABLE
            quality = min(self.search.qualities.values(), key=lambda q: q.value, default=None)
            if quality is not None and quality.passed:
                work.reach("proved_fix")
                self.progress(proved(self.search.words), 0, 1)
        else:
            verdict = Verdict.HEALTHY
        work.reach("verdict")
        return verdict

    def conclude(self, verdict: Verdict, remember: bool) -> tuple[Fix | None, dict[str, list[str]]]:
        """For a fixable model the proved fix (timed and remembered as asked), for a healthy
        one the layers a wider run measured past fp16's range."""
        self.notes.extend(self.search.rejected)
        if verdict is Verdict.BROKEN:
            self.notes.extend(_why_broken(self.start, self.broken, self.search.unfixed))
            return None, {}
        if verdict is Verdict.FIXABLE:
            failed = [n for n, r in self.reports.items() if r.status.failed]
            fix = _proved_fix(self.search, self.plan, failed)
            if self.measure_cost:
                self.measure_fix_cost(fix)
            if remember and fix.verified:
                _remember(self.model, self.start, fix, self.notes)
            return fix, {}
        return None, predicted_islands(self.reports, self.first_probes, self.runner.placed)

    def measure_fix_cost(self, fix: Fix) -> None:
        """The fix priced as the user's generation pays it, beside no-half (`price_fix`)."""
        stage = "Measuring the cost of the fix"
        self.progress(stage, 0, 1)

        def measured(done: int, total: int) -> None:
            self.cancel.raise_if_cancelled()
            self.progress(stage, done, total)

        fix.cost = price_fix(
            self.runner, self.plan, self.search.plan, self.stage_fns, self.conditioning, measured
        )
        # The table's rows that are the call just timed take its figures; a row timed faster
        # than the proved fix is said beside it, and the fix stays.
        name = priced_component(self.plan, self.search.plan, self.runner.family.denoiser)
        pipeline = self.model.pipeline
        timed = timed_as_checked(pipeline, self.plan, self.search.plan, fix.cost)
        baselines = take_timed(self.search, name, timed)
        if baselines:
            fix.baselines[name] = baselines
        self.notes.extend(timed_faster_notes(fix.candidates))


def _remember(model, start: _Start, fix: Fix, notes: list[str]) -> None:
    """Store the check's fix in the model's remembered profile for this device, with what of
    the fix remembered before the check ran with (`job_plans.proved_with`)."""
    from app.core.fixing import profiles

    ran = job_plans.remembered_ran(start.plan, start.remembered)
    profiles.remember_fix(
        model.profile_key,
        start.info.name,
        job_plans.proved_with(ran, fix.settings, fix.plan),
        fix.summary,
        "health check",
        made_at=start.plan.dtype_settings(),
        parts=model.components,
        warn=notes.append,
    )


def _why_broken(start: _Start, broken: set[str | None], unfixed: list[str]) -> list[str]:
    """Why no precision fix is claimed for a broken model: damaged weights, badly quantized
    ones, or the components (`unfixed`) no candidate made finite and right; `broken` holds the
    components the damaged weights break."""
    notes = []
    if start.bad_weights:
        notes.append(
            "The weights themselves hold NaN or Inf values: this file is damaged, "
            "and no precision setting can repair it."
        )
    if start.bad_quantized:
        bad_quantized = start.bad_quantized
        more = f" (and {len(bad_quantized) - 1} more)" if len(bad_quantized) > 1 else ""
        notes.append(
            f"Quantized weights decode wrongly: {bad_quantized[0].sentence}{more}. "
            "This is the file's quantisation (or the tool that converted it), not fp16 "
            "overflow, and no precision setting can repair it."
        )
    if not broken:
        unfixed = in_run_order(unfixed)
        notes.append(
            f"The {join_words(unfixed)} {'gives' if len(unfixed) == 1 else 'give'} no "
            "finite output that agrees with fp32 under any precision setting, so the cause "
            "is not precision (the weights, a LoRA, a kernel or state gone bad in memory: "
            "see the cause, where one was found)."
        )
    return notes


def _proved_fix(search: Search, plan: PrecisionPlan, failed: list[str]) -> Fix:
    """The fix the search found for the `failed` components of a check that ran `plan`;
    verified when the worst of their re-runs agrees with the fp32 reference."""
    quality = min(search.qualities.values(), key=lambda q: q.value, default=None)
    return Fix(
        search.plan,
        search.settings,
        fix_summary(failed, search.words, plan, search.plan, quality),
        verified=quality is not None and quality.passed,
        quality=quality,
        steps=list(search.words),
        candidates=list(search.candidates),
        baselines=dict(search.baselines),
    )


def _against_fp32(runner, stage_fn, plan: PrecisionPlan, ran: Stage):
    """A stage's run (`ran`, under `plan`) judged against the fp32 reference of the same stage,
    recorded in full (its record draws the islands should the part still need a fix of its
    own): (the quality, the reference)."""
    with runner.recording_in_full():
        reference = stage_fn(job_plans.fp32_reference(plan), True)
    return compare(ran.output, reference.output), reference


def _stopped_at_the_proof(untried: int, timed: bool) -> str:
    """The note of a check that stopped at the proved fix, `untried` candidates not run."""
    fixes = "fix was" if untried == 1 else "fixes were"
    then = "." if timed else ", and the fix was not timed."
    return f"The check stopped at the proved fix: {untried} other {fixes} not tried for the table{then}"


def _report(
    model,
    start: _Start,
    size: int,
    check: _Check,
    verdict: Verdict,
    fix: Fix | None,
    islands: dict[str, list[str]],
    started: float,
    counted: work.Work,
) -> HealthReport:
    """The finished check as a report; `started` is when check_loaded began (perf_counter)."""

    info, plan, remembered = start.info, start.plan, start.remembered
    pictures = check.runner.pictures  # the job's input the check ran, None for text-to-image
    return HealthReport(
        model=ModelIdentity.of(model),
        device=DeviceIdentity.of(info),
        plan=plan,
        size=size,
        weights_non_finite=start.bad_weights,
        components=check.reports,
        verdict=verdict,
        fix=fix,
        seconds=time.perf_counter() - started,
        notes=start.notes,
        versions=_versions(),
        remembered=(
            remembered.summary
            if remembered and remembered_notes.ran_with_remembered(remembered, plan)
            else None
        ),
        timesteps=check.runner.timesteps,
        advice=(
            fp16_advice(check.reports, plan, check.bf16_native, islands)
            if verdict is Verdict.HEALTHY
            else None
        ),
        loras=[LoraIdentity.of(applied) for applied in getattr(model, "loras", [])],
        tried=list(check.search.candidates),
        remembered_ran=job_plans.remembered_ran(plan, remembered),
        unfixed=in_run_order(check.search.unfixed),
        weights_bad_quantized=list(start.bad_quantized),
        mode=(pictures.mode if pictures else Mode.TEXT).value,
        pictures=list(pictures.sources) if pictures else [],
        memory=CheckMemory(
            budget_mb=plan.memory_budget_mb,
            budget_from=plan.memory_budget_from,
            vae_tiling=plan.vae_tiling,
            vae_tile_px=plan.vae_tile_px,
            peak_placed_mb=round(check.runner.placed.peak_bytes / 2**20, 1),
            placements=check.runner.placed.placements,
            placing_s=round(check.runner.placed.placing_seconds, 2),
            computed_in_place=tuple(sorted(check.runner.placed.computed_in_place)),
            streamed={
                name: StreamedPart(**streamed.to_json())
                for name, streamed in sorted(check.runner.placed.streamed.items())
            },
        ),
        work=counted,
    )


def _versions() -> dict[str, str]:
    import diffusers
    import torch

    return {
        "halfsafe": __version__,
        # Plain str: torch's TorchVersion would import torch wherever the report is unpickled.
        "torch": str(torch.__version__),
        "diffusers": str(diffusers.__version__),
        "cuda": torch.version.cuda or "",
        "hip": getattr(torch.version, "hip", None) or "",
    }
