"""Running the pipeline in stages, as a generation runs it only shorter: the text encoder(s) on
the prompt and the empty prompt, the denoiser at the first, middle and last timesteps of the
user's schedule with the CFG batch, the VAE decoding what that made. Each stage runs under any
`PrecisionPlan` as the shared stages call it (`run.stages.Stages`, composed), through the stage
runner (`run.stage_run.running`), with every module watched (`probe.ActivationRecorder`) and
its components timed; `Runner` also times a step under several plans, alternating, for the
cost of a fix. `probe_run` is the three stages once, end to end.

The runner reaches the model through its host (`run.host.Host`): HalfSafe's placed pipeline by
default (`run.pipeline_host.PipelineHost`), or any other host, whose text encoders, denoiser
probe and decode it runs, records, stops, tells and descends alike (`probe_host`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from app.core.components import FP16_MAX, Role, in_run_order, of_role
from app.core.families import family_of
from app.core.health.request import DEFAULT_PROMPT
from app.core.images.pictures import Pictures
from app.core.precision import PlacedPipeline, PrecisionPlan
from app.core.run.host import Host, Prompt
from app.core.run.pipeline_host import PipelineHost
from app.core.run.probe import ActivationRecorder, ProbeResult, descended
from app.core.run.stage_run import StageRun, running
from app.core.run.stages import Call, Stages
from app.core.run.timing import Timing
from app.core.run.watchers import ComponentTimer, Stage, Stop, all_finite
from app.core.settings import FIELDS

DEFAULT_STEPS = FIELDS["steps"].default


DEFAULT_SCHEDULER = FIELDS["scheduler"].default


# Components are recorded by their outputs alone while they stay finite (`Runner._watch`), in
# every dtype; False records every call in full, as the lean recorder's answers are tested.
LEAN_RECORDER = True
# The tokens the check's prompt upsampler generates. Generation runs the prompt once through
# every layer at full length (the prefill: FLUX.3's system prompt and the request, some 700
# tokens), then one token a call through the KV cache. Every decode call runs the same layers
# on one token at a later position, so sixteen of them run the cached path (its shapes and
# kernels, the cache read back past the prompt) as a caption's hundreds do, for 17 calls
# where a job makes up to 3,585; what they cannot see is a fault that waits for a position
# past the prompt + 16.
UPSAMPLER_CHECK_TOKENS = 16
# tell(component, probe): a first probe's component went non-finite, its first bad layer known.
FindingCallback = Callable[[str, ProbeResult], None]


class Runner:
    """Runs the check's three stages under any plan, on one host: `model`'s placed pipeline
    (a `PlacedPipeline`), or `host` where given (`model` None: its stages that read a pipeline,
    the prompt upsampler's and the VAE's encoder's, and the cost's timed runs, are not run)."""

    def __init__(
        self,
        model,
        plan: PrecisionPlan,
        size: int,
        prompt: str,
        steps: int,
        scheduler: str,
        pictures: Pictures | None = None,
        *,
        clip_skip: int = 1,
        host: Host | None = None,
    ) -> None:
        import torch

        self.model = model
        self.pictures = pictures  # the input picture (and mask) at the probe's size, if any
        if host is None:
            placed = PlacedPipeline(model.pipeline, plan, components=())  # placed per stage
            host = PipelineHost(model, placed, torch.device(plan.device))
        self.host: Host = host
        # HalfSafe's pipeline placed and its family (None on another host).
        self.placed: Any = getattr(host, "placed", None)
        self.family: Any = getattr(host, "family", None)
        self.device = host.device
        # The stages, written once for the check and generation, each run watched here.
        self.stages = Stages(host, pictures, self._watch, probing=True)
        # The VAE's stages are the shared ones as they are (the check picks no input of them):
        # its decode and its encoder reading the input or the enlarged picture.
        self.encode_picture = self.stages.encode_picture
        self.decode = self.stages.decode
        self.size = size
        self.prompt = prompt
        self.clip_skip = clip_skip  # A1111's "Clip skip" the prompt is read at
        self.timesteps = host.probe_timesteps(steps, scheduler, size)
        # The latents the denoiser reads in its sequence beside the noise (an edit's
        # references, or an inpainted picture read so), once the VAE's encoder made them.
        self.references: list[Any] | None = None
        self.timing_now = False  # the stages run now are timed for a cost (`timing`)
        self.timing = Timing(self)
        # A candidate fix's component, whose run ends at its first non-finite call
        # (`stopping_at_bad`), who is told what a first probe found (`telling`), and whether
        # every call is recorded in full (`recording_in_full`).
        self._until_bad: str | None = None
        self._tell: FindingCallback | None = None
        self._in_full = False
        # The tokens the prompt upsampler's first finite run generated, which every later run
        # takes (`upsample`).
        self.upsampled_tokens: Any = None

    @contextmanager
    def stopping_at_bad(self, name: str) -> Iterator[None]:
        """Inside the block a stage that runs `name` alone ends at its first call that gives
        non-finite output (a candidate fix that failed: the calls after it cannot change
        that), and what went non-finite is not told in full."""
        self._until_bad, before = name, self._until_bad
        try:
            yield
        finally:
            self._until_bad = before

    @contextmanager
    def telling(self, tell: FindingCallback) -> Iterator[None]:
        """Inside the block (a stage's first probe), a component run alone that goes
        non-finite is told to `tell(name, probe)` right after its first non-finite call is
        recorded in full, before the rest of the stage runs: the first finding."""
        self._tell, before = tell, self._tell
        try:
            yield
        finally:
            self._tell = before

    @contextmanager
    def recording_in_full(self) -> Iterator[None]:
        """Inside the block every call is recorded in full (the fp32 reference: its layers'
        inputs draw a fix's islands and clamps)."""
        self._in_full, before = True, self._in_full
        try:
            yield
        finally:
            self._in_full = before

    @property
    def one_step(self) -> list[float]:
        """The timestep a timed denoiser run takes: the middle one of the probe's. A step's
        cost is what is timed, and one call of it is a step (three made each timed run three
        times as long, and the check's timing three times as costly)."""
        middle = len(self.timesteps) // 2
        return self.timesteps[middle : middle + 1]

    @property
    def enlarged(self) -> Any:
        """A hires fix with a pixel upscaler: the picture the VAE decoded at the probe's size,
        which the VAE's encoder reads as the second pass reads the enlarged first picture."""
        return self.stages.enlarged

    @enlarged.setter
    def enlarged(self, pixels: Any) -> None:
        self.stages.enlarged = pixels

    @property
    def encodes_pictures(self) -> bool:
        """Whether the path checked runs the VAE's encoder (an input picture, or a pixel
        upscaler's enlarged picture)."""
        return self.pictures is not None or self.enlarged is not None

    def _watch(
        self,
        plan: PrecisionPlan,
        names: list[str],
        run: Call,
        record: bool | None = True,
        calls: int = 1,
    ) -> Stage:
        """One run of a stage's components `names` under `plan` (`calls`: the calls of its
        component that it makes), each recorded (`record`) and timed. Components are recorded
        lean (outputs, and wider than fp16 the attention scores' bound), all a finite run
        needs; where one went non-finite, its calls run again under the full recorder to name
        the layer at fault (its inputs decide which layer made the first NaN), the same inputs
        giving the same values. A candidate fix's run (`stopping_at_bad`) ends at its first
        non-finite call, told no further. A first probe run wider than fp16 past 65504 runs
        again in full: fp16's first layer past it and its islands read every layer's inputs.
        `record` None is True (`run.stages.StageRunner`'s default)."""
        record = record is not False
        lean = record and LEAN_RECORDER and not self._in_full
        alone = names[0] if len(names) == 1 else None
        candidate = alone is not None and alone == self._until_bad
        telling = alone is not None and record and self._tell is not None
        stage = self._run_stage(
            plan,
            names,
            run,
            "lean" if lean else "full" if record else None,
            until_bad=calls if candidate or telling else None,
            tell_at_bad=telling and not lean and not candidate,
        )
        if not lean:
            return stage
        wider = [n for n in names if self.host.compute_dtype(n, plan) != "fp16"]
        if any(stage.probes[n].non_finite for n in names):
            if not candidate:
                return self._descend(plan, names, run, stage)
            if wider:  # its record is the full one a candidate run wider always had
                return self._run_stage(plan, names, run, "full", until_bad=calls)
            return stage
        if record and self._tell and any(stage.probes[n].max_abs > FP16_MAX for n in wider):
            full = self._run_stage(plan, names, run, "full")
            return Stage(full.probes, stage.seconds, stage.output)
        return stage

    def _descend(self, plan: PrecisionPlan, names: list[str], run: Call, lean: Stage) -> Stage:
        """A stage whose lean record went non-finite, told in full: its one component's calls
        run again under the full recorder up to the first that went non-finite (the denoiser's
        first timestep, for a fault that fires there: one call, not the stage's three), merged
        with the lean record of every call (`probe.descended`). Where the lean run ended at
        that call (a first probe's: `telling`), the full run goes on to the stage's end and is
        the stage's record; where the full run names no layer (or the stage runs several
        components), the whole stage runs again in full. Where the full run of the same calls
        came out finite, the NaN did not come back: the lean record stays the stage's (a fault
        `causes` then shows to be intermittent)."""
        (probe,) = lean.probes.values() if len(names) == 1 else (None,)
        if probe is not None and probe.first_bad_call is not None:
            name, told_at = names[0], probe.first_bad_call + 1
            if lean.cut_short:
                full = self._run_stage(plan, names, run, "full", tell_after=told_at)
                if full.probes[name].non_finite:
                    return full
                # The same calls on the same inputs came out finite: the NaN did not come back.
                # The lean record of it is the evidence (`causes` re-runs it to say so), and the
                # stage goes on from the finite run's output.
                return Stage(lean.probes, full.seconds, full.output)
            full = self._run_stage(plan, names, run, "full", stop_after=told_at)
            if not full.probes[name].non_finite:
                return lean  # as above: the NaN did not come back
            told = descended(probe, full.probes[name])
            if told is not None:
                if self._tell is not None:
                    self._tell(name, told)
                return Stage({name: told}, lean.seconds, lean.output)
        return self._run_stage(plan, names, run, "full")

    def _run_stage(
        self,
        plan: PrecisionPlan,
        names: list[str],
        run: Call,
        recorder: str | None,
        stop_after: int | None = None,
        until_bad: int | None = None,
        tell_after: int | None = None,
        tell_at_bad: bool = False,
    ) -> Stage:
        """`_watch`'s one run, under the `recorder` named ("lean", "full", or None); with
        `stop_after`, the run ends once its one component made that many calls (its output is
        then None); with `until_bad` (the calls it makes), at its first non-finite call before
        the last (`Stage.cut_short`), or with `tell_at_bad` there its record is told and the
        run goes on; with `tell_after`, what its record holds after that many calls is told
        (`telling`). A record is told only where it names the layer at fault."""
        with running(self.placed, plan, names) as stage:  # these components alone
            recorders, timers, stop = _watchers(
                self, stage, plan, names, recorder, stop_after, until_bad, tell_after, tell_at_bad
            )
            started = time.perf_counter()
            try:
                output = run(stage)
            except Stop.Enough:
                output = None
        probes = {n: r.read(output if len(names) == 1 else None) for n, r in recorders.items()}
        seconds = {n: t.seconds for n, t in timers.items()}
        if names in (["vae"], ["vae_encoder"]) and not seconds[names[0]]:
            seconds[names[0]] = time.perf_counter() - started  # no decoder or encoder of its own
        return Stage(probes, seconds, output, cut_short=stop.cut_short)

    def upsample(self, plan: PrecisionPlan, record: bool = True) -> Stage:
        """The prompt upsampler writing the check's prompt out, by generation: the prefill and
        `UPSAMPLER_CHECK_TOKENS` decode calls, greedily. Its output is each step's raw logits
        (1, tokens, vocab). The first run whose logits are finite keeps its tokens, and every
        later run (the fp32 reference, a candidate fix) generates those, so that each step's
        logits are compared on the same text, whatever a near tie between two tokens picked."""
        stage = self.stages.upsample(
            plan, self.prompt, UPSAMPLER_CHECK_TOKENS, self.upsampled_tokens, record
        )
        if stage.output is None:  # a run stopped at a call (`_descend`)
            return stage
        logits, tokens = stage.output["logits"], stage.output["tokens"]
        if self.upsampled_tokens is None and all_finite(logits):
            self.upsampled_tokens = tokens[0]
        return replace(stage, output=logits)

    def encode(self, plan: PrecisionPlan, record: bool = True) -> Stage:
        """The check's prompt and the empty prompt through the text encoders."""
        names = self.stages.text_encoders(plan)
        stage = self.stages.encode(plan, Prompt(self.prompt, clip_skip=self.clip_skip), record)
        if record:
            # The encoder's own output decides its status, whatever the pipeline did after.
            finite = all_finite(stage.output)
            for probe in stage.probes.values():
                probe.output_finite = probe.output_finite and (finite or len(names) > 1)
        return stage

    def denoise(
        self,
        plan: PrecisionPlan,
        conditioning: dict[str, Any],
        record: bool = True,
        timesteps: list[float] | None = None,
    ) -> Stage:
        """The denoiser stepped through `timesteps` (by default the probe's: the first, middle
        and last timesteps of the user's schedule) from seeded noise, as the family samples
        (SD: Euler with the CFG batch; Flux: flow-matching Euler with its guidance embedding),
        with the latents the VAE's encoder stage made in its sequence (`references`)."""
        steps = list(timesteps or (self.one_step if self.timing_now else self.timesteps))
        return self.stages.denoise_probe(
            plan, conditioning, self.size, steps, self.references, record
        )


def _watchers(
    runner: Runner,
    stage: StageRun,
    plan: PrecisionPlan,
    names: list[str],
    recorder: str | None,
    stop_after: int | None,
    until_bad: int | None,
    tell_after: int | None,
    tell_at_bad: bool,
) -> tuple[dict[str, ActivationRecorder], dict[str, ComponentTimer], Stop]:
    """`_run_stage`'s watchers of its placed components, in the order their hooks run (the
    recorders, the timers, the stop), each leaving with the stage."""
    host = runner.host
    recorders = (
        {
            n: stage.watching(
                ActivationRecorder(
                    host.placed[n],
                    lean=recorder == "lean",
                    calls_of=host.counted(n),
                    scores=recorder == "full" or host.compute_dtype(n, plan) != "fp16",
                )
            )
            for n in names
        }
        if recorder
        else {}
    )
    timers = {
        n: ComponentTimer(
            stage.hooks,
            host.counted(n),
            runner.device,
            host.compute_dtype(n, plan) or "",
            n,
            recorder=recorder,
            timed=runner.timing_now,
        )
        for n in names
    }
    on_call = on_bad = None
    if (tell_after is not None or tell_at_bad) and runner._tell is not None and recorders:
        name, tell = names[0], runner._tell

        def told(done: int) -> None:
            if tell_at_bad or done == tell_after:
                probe = recorders[name].read()
                if probe.first_bad_module() is not None:
                    tell(name, probe)

        on_call, on_bad = (None, told) if tell_at_bad else (told, None)
    first = host.counted(names[0])
    stop = Stop(stage.hooks, first, stop_after, until_bad, on_call, on_bad)
    return recorders, timers, stop


def probe_timesteps(model, steps: int, scheduler: str, size: int | None = None) -> list[float]:
    """Where the check runs the denoiser: the first, the middle and the last timestep of the
    user's sampler at the user's step count.

    Three are enough because what decides a denoiser's activations is the noise level, through
    the input's scale and the timestep embedding, and both change monotonically along the
    schedule: the ends bound them. The first step sees pure noise at the largest sigma; the last
    sees an almost clean latent at the smallest timestep the sampler ever uses (t=0 for Karras
    schedules), where faults that only fire at low noise live and where every real image ends.
    The middle step catches a fault peaked inside the range. The probe integrates with Euler
    steps between these three, so the latent at each one is a plausible one for its noise level.
    A flow-matching family (Flux) probes its own sigma schedule at this size (sigma x 1000).
    """
    return family_of(model.pipeline).probe_timesteps(
        model, steps, scheduler, size or model.native_size
    )


@dataclass
class ProbeRun:
    """One end-to-end run of the check's three stages under one plan: the decoded image and
    every component's probe."""

    image: Any
    probes: dict[str, ProbeResult]

    @property
    def failed(self) -> list[str]:
        """The components whose output went non-finite, in run order."""
        return in_run_order([n for n, p in self.probes.items() if p.non_finite])

    @property
    def finite(self) -> bool:
        return not self.failed and all_finite(self.image)

    def first_bad_module(self, component: str) -> str | None:
        probe = self.probes.get(component)
        return first_bad_name(probe) if probe is not None else None


def probe_run(
    model,
    plan: PrecisionPlan,
    *,
    size: int,
    steps: int = DEFAULT_STEPS,
    scheduler: str = DEFAULT_SCHEDULER,
    prompt: str = DEFAULT_PROMPT,
    clip_skip: int = 1,
) -> ProbeRun:
    """Run the prompt upsampler where the model has one, the text encoder(s), the denoiser at
    the probe's timesteps and the VAE once under `plan`, as the check's first pass does,
    recording every module; the device copies are released at the end. Runs on the calling
    thread."""
    runner = Runner(model, plan, size, prompt, steps, scheduler, clip_skip=clip_skip)
    return _probed(runner, plan)


def probe_host(
    host: Host,
    plan: PrecisionPlan,
    *,
    size: int,
    steps: int = DEFAULT_STEPS,
    scheduler: str = DEFAULT_SCHEDULER,
    prompt: str = DEFAULT_PROMPT,
) -> ProbeRun:
    """`probe_run` over any host (`run.host.Host`): its text encoders, its denoiser at the
    probe's timesteps and its decode, once under `plan`, every module recorded."""
    return _probed(Runner(None, plan, size, prompt, steps, scheduler, host=host), plan)


def _probed(runner: Runner, plan: PrecisionPlan) -> ProbeRun:
    """The probe's stages run once by `runner`, its placements taken off at the end."""
    upsampler = of_role(plan.dtypes, Role.PROMPT_UPSAMPLER)
    try:
        upsampled = runner.upsample(plan).probes if upsampler else {}
        encoded = runner.encode(plan)
        denoised = runner.denoise(plan, encoded.output)
        decoded = runner.decode(plan, denoised.output)
    finally:
        runner.placed.release()
    probes = {**upsampled, **encoded.probes, **denoised.probes, **decoded.probes}
    return ProbeRun(decoded.output, probes)


def first_bad_name(probe: ProbeResult) -> str | None:
    bad = probe.first_bad_module()
    return bad.name if bad else None


def finite_stand_in(value: Any) -> Any:
    """`value` (a stage's output: tensors in dicts, lists and tuples) with every floating
    tensor that holds NaN or Inf replaced by zeros of its shape: zeroed embeddings are what
    SDXL and SD3 give the denoiser for an empty negative prompt, a plausible input."""
    import torch

    if isinstance(value, torch.Tensor):
        from app.core import work

        work.add("host_syncs", value.is_floating_point())
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            return torch.zeros_like(value)
        return value
    if isinstance(value, dict):
        return {k: finite_stand_in(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(finite_stand_in(v) for v in value)
    return value
