"""Why a check failed, told apart by re-running: a precision limit, an attention kernel, bad
weights (the checkpoint's or a LoRA's) or state that went bad in memory.

fp16 overflow is only one cause of black images. The others look the same in the output but
need different repairs, and a precision change does not help them:

- `weights`: the checkpoint or a LoRA holds NaN/Inf. Proved for a LoRA by re-running without it.
- `precision`: a precision change fixes it (the check's own fix search). A LoRA whose weight
  pushes a layer past 65504 is blamed by name, with the layer, and the largest weight that runs
  finite and agrees with the fp32 run at that weight (a lower weight changes the picture, so it
  is judged against fp32 at the same weight, never against the original picture).
- `kernel`: the same precision on another attention backend gives the right answer. When the
  run went through an attention kernel HalfSafe does not ship (a library that replaced
  PyTorch's SDPA: SageAttention, xformers), that kernel is compared with PyTorch's math kernel on
  the same inputs, call by call (`kernels.comparing`), and named when it alone goes non-finite
  or drifts below the quality threshold; the repair is then to turn it off.
- `state`: a fresh load of the component gives the right answer (a buffer or weight poisoned
  in memory by an earlier run: the "goes away on restart" black images).
- `intermittent`: the same plan re-run on the same inputs gives the right answer, so the NaN
  came from a kernel or device fault that strikes at random (the statistical self-test measures
  how often), not from the model; no precision fix is kept for it. Not tried when the check
  measured a real overflow (fp32 peaks past 65504), which no re-run can cure.

Every attribution is proved by a re-run whose output is finite and agrees with an fp32
reference (`quality.Quality`). Runs on the calling thread; each re-run is one pass of the
check's three stages (`health.probe_run`).
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from app.core.causes.records import (
    _BACKENDS,
    WEIGHT_SEARCH_STEPS,
    Cause,
    KernelBlame,
    LoraBlame,
    layer_name,
)
from app.core.components import Role, Verdict, in_run_order, join_words, module_of, of_role
from app.core.components import words as component_words
from app.core.fixing import fix_candidates, job_plans
from app.core.fixing.quality import QUALITY_THRESHOLD_DB, Quality, compare
from app.core.health import (
    CheckRequest,
    HealthReport,
    ProbeRun,
    component_of_tensor,
    damaged_files,
    probe_run,
)
from app.core.jobs import CancelToken, ProgressCallback, no_progress
from app.core.lora import files as lora
from app.core.memory import is_out_of_memory
from app.core.precision import PrecisionPlan, kernels


class _Runs:
    """The re-runs of one attribution, all at the check's size and as its request asks (the
    schedule, the prompt and its CLIP layer)."""

    def __init__(self, model, plan: PrecisionPlan, size: int, request: CheckRequest):
        self.model = model
        self.plan = plan
        self.size = size
        self.request = request

    def run(self, plan: PrecisionPlan, model=None) -> ProbeRun:
        request = self.request
        return probe_run(
            model or self.model,
            plan,
            size=self.size,
            steps=request.steps,
            scheduler=request.scheduler,
            prompt=request.prompt,
            clip_skip=request.clip_skip,
        )

    def proved(self, plan: PrecisionPlan, reference_plan: PrecisionPlan, model=None):
        """(finite and agreeing, quality, the run): `plan` re-run and compared with
        `reference_plan` run on the same model and LoRA weights."""
        run = self.run(plan, model)
        if not run.finite:
            return False, None, run
        reference = self.run(reference_plan, model)
        if not reference.finite:
            return False, None, run
        quality = compare(run.image, reference.image)
        return quality.passed, quality, run

    def proved_by_stage(
        self, plan: PrecisionPlan, reference_plan: PrecisionPlan, judged: Sequence[str]
    ) -> tuple[bool, Quality | None]:
        """(every stage finite and each `judged` component agreeing, the worst quality):
        `plan` judged as the check judges its candidates, stage by stage on the reference's
        inputs (the text encoders on the prompt, the denoiser on the reference's conditioning,
        the VAE on its latents). A whole image compared after the denoiser's steps would
        judge the fp16 noise the steps amplify, not the component the plan repairs."""
        from app.core.health.stages import Runner
        from app.core.run.watchers import all_finite

        request = self.request
        runner = Runner(
            self.model,
            reference_plan,
            self.size,
            request.prompt,
            request.steps,
            request.scheduler,
            clip_skip=request.clip_skip,
        )
        family = runner.family
        worst: Quality | None = None
        try:
            upsampler = of_role(judged, Role.PROMPT_UPSAMPLER)
            stages = (
                # The prompt upsampler, where it is judged: its generation, every run taking
                # the reference's tokens (`Runner.upsample`).
                *([(upsampler, lambda p, _: runner.upsample(p, False))] if upsampler else []),
                (family.text_encoders(self.model.pipeline), lambda p, _: runner.encode(p, False)),
                ([family.denoiser], lambda p, given: runner.denoise(p, given, False)),
                (["vae"], lambda p, given: runner.decode(p, given, False)),
            )
            given = None
            for names, stage in stages:
                expected = stage(reference_plan, given).output
                output = stage(plan, given).output
                if not all_finite(output) or not all_finite(expected):
                    return False, None
                if any(name in judged for name in names):
                    quality = compare(output, expected)
                    if worst is None or quality.value < worst.value:
                        worst = quality
                given = expected
        finally:
            runner.placed.release()
        return worst is not None and worst.passed, worst


def attribute(
    model,
    report: HealthReport,
    request: CheckRequest,
    *,
    on_progress: ProgressCallback | None = None,
    cancel: CancelToken | None = None,
    reload: Callable[[], Any] | None = None,
) -> Cause | None:
    """Tell the cause of a failed check apart by re-running under the check's plan, in this
    order: bad weights (the checkpoint's, from the load-time scan; a LoRA's NaN/Inf or absurd
    alpha, proved by dropping it, and named even when the check's run stayed finite), a LoRA that overflows a layer (proved with a lower weight), an attention
    kernel (another backend at the same precision), state (a fresh load of the component; the
    model's pipeline gets the fresh component when that proves it), else precision when the
    check's fix is verified. Each re-run is at the check's size (`report.size`) as `request`
    (the check's own) asks. `reload` returns a freshly loaded model; by default the model's
    source is loaded again. The LoRAs' weights are restored at the end. None when nothing
    explains the failure."""
    progress = on_progress or no_progress
    cancel = cancel or CancelToken()
    failed = in_run_order([n for n, c in report.components.items() if c.status.failed])
    applied: list[lora.AppliedLora] = list(getattr(model, "loras", []))
    damaged = any(a.file.damaged for a in applied)
    if (report.verdict is Verdict.HEALTHY or not failed) and not damaged:
        return None
    component = failed[0] if failed else None
    if report.weights_bad_quantized:  # a bad scale first: it can also make its weight NaN
        first = report.weights_bad_quantized[0]
        return Cause(
            "weights",
            component,
            f"The quantized weight {first.tensor} {first.problem}: the file's "
            "quantisation is at fault, not fp16 overflow, and no setting can repair it.",
            "replace the file (or use an unquantized one)",
            "none",
            verified=False,
        )
    if report.weights_non_finite:
        files = damaged_files(report)
        where = (
            "The checkpoint's weights"
            if files == [report.model.source]
            else f"The weights in {', '.join(files)}"
        )
        return Cause(
            "weights",
            component_of_tensor(report.weights_non_finite[0]) or component,
            f"{where} hold NaN or Inf values ({report.weights_non_finite[0]}"
            f"{' and more' if len(report.weights_non_finite) > 1 else ''}): the file is "
            "damaged, and no setting can repair it.",
            "replace the damaged file",
            "none",
            verified=False,
        )
    runs = _Runs(model, report.plan, report.size, request)
    # The re-run is the text-to-image path (`probe_run`): it does not run the VAE's encoder, so
    # it cannot show an encoder's NaN to be intermittent (it would always come out finite).
    if (
        component is not None
        and component != "vae_encoder"
        and not damaged
        and not _measured_overflow(report, failed)
    ):
        cancel.raise_if_cancelled()
        cause = _intermittent_cause(runs, component, progress)
        if cause is not None:
            return cause
    if applied:
        try:
            cause = _lora_cause(runs, report, applied, progress, cancel)
        finally:
            lora.use_weights(model.pipeline, applied)
        if cause is not None or component is None:
            return cause
    if component is None:
        return None
    if report.fix is not None and report.fix.verified:
        # The check's chosen fix (`health.fix.choose_fix`) only switched the attention backend:
        # the same precision works on another kernel, so the kernel is the cause.
        backend = fix_candidates.switched_backend(report.fix.settings, report.plan)
        if backend is not None:
            cause = _kernel(
                component, report.plan.attention_backend, backend, report.fix.quality, failed
            )
            foreign = _foreign_kernel(runs, progress)
            return _blamed(report, cause, *foreign) if foreign is not None else cause
    if _measured_overflow(report, failed) and report.fix is not None and report.fix.verified:
        return _precision_cause(report, component)
    cancel.raise_if_cancelled()
    # A kernel HalfSafe does not ship is compared before a precision fix is believed: such a
    # kernel often fails in one dtype only, so a dtype change "fixes" what turning it off fixes.
    foreign = _foreign_kernel(runs, progress)
    if foreign is not None:
        cause = _foreign_kernel_cause(runs, report, component, *foreign, progress)
        if cause is not None:
            return cause
    cancel.raise_if_cancelled()
    cause = _kernel_cause(runs, report, component, failed, progress)
    if cause is not None:
        return cause
    # State gone bad (NaN in a weight or buffer) survives every precision change, so a
    # verified precision fix rules it out without reloading anything. Where the search fixed
    # some failed parts (a real overflow) and not others, the others are the suspects.
    if report.fix is None or not report.fix.verified:
        cancel.raise_if_cancelled()
        suspects = report.unfixed or [component]
        cause = _state_cause(runs, report, suspects, applied, reload, progress)
        if cause is not None:
            return cause
    if report.fix is not None and report.fix.verified:
        return _precision_cause(report, component)
    return None


def _measured_overflow(report: HealthReport, failed: list[str]) -> bool:
    """Every failed component measured past 65504 in the run that fixed it: a real overflow,
    not NaN from nowhere."""
    return all(
        (report.components[n].headroom or math.inf) < 1.0
        and report.components[n].status == "overflow"
        for n in failed
    )


def _intermittent_cause(runs: _Runs, component: str, progress) -> Cause | None:
    """The check's plan run again, unchanged, on the same inputs: finite and agreeing with fp32
    means the NaN does not come from the model."""
    from app.core.words.causes import cause_words

    progress("Re-running exactly as before", 0, 1)
    ok, quality, _ = runs.proved(runs.plan, job_plans.fp32_reference(runs.plan))
    if not ok or quality is None:
        return None
    words = component_words(component)
    summary = (
        f"The {words} went non-finite, but an identical re-run (same settings, same inputs) "
        f"came out finite and agrees with fp32 ({quality.words()}): "
        f"{cause_words('intermittent')}. No precision fix is kept for it. "
        + statistical_words(runs.plan.device)
    )
    return Cause(
        "intermittent",
        component,
        summary,
        "make it again with the same settings; if it recurs, update the GPU driver and "
        "PyTorch or try another attention backend",
        "rerun",
        verified=True,
        quality=quality,
        headline=(
            f"Healthy model, intermittent fault: the {words}'s NaN did not come back on an "
            "identical re-run, so a kernel or device fault struck at random, not the model."
        ),
    )


def statistical_words(device: str) -> str:
    """What the statistical self-test found on `device`, from its cached result, as a sentence
    (how to run it when it has not been)."""
    try:
        from app.core import hardware

        test = hardware.describe_device(device).self_test
    except Exception:  # noqa: BLE001 - a missing device only costs the sentence
        test = None
    stat = test.statistical if test is not None else None
    measured = [r for r in stat.results if r.calls] if stat is not None else []
    if not measured:
        return (
            "Run `halfsafe gpu --retest` to measure how often this device's kernels fail "
            "(the statistical self-test)."
        )
    flaky = [r for r in measured if r.bad]
    if flaky:
        return "The statistical self-test found: " + "; ".join(r.words() for r in flaky) + "."
    calls = sum(r.calls for r in measured)
    return (
        f"The statistical self-test found no bad result in {calls:,} calls of "
        f"{len(measured)} kernels, so the fault is rarer than it could see, or lies elsewhere."
    )


def _precision_cause(report: HealthReport, component: str) -> Cause:
    fix = report.fix
    assert fix is not None
    return Cause(
        "precision",
        component,
        f"A precision change fixes it: {'; '.join(fix.steps)}.",
        "; ".join(fix.steps),
        "change_precision",
        verified=fix.verified,
        settings=dict(fix.settings),
        quality=fix.quality,
    )


def _lora_cause(runs: _Runs, report, applied, progress, cancel) -> Cause | None:
    pipeline = runs.model.pipeline
    reference = job_plans.fp32_reference(runs.plan)
    progress("Re-running without the LoRAs", 0, 1)
    lora.use_weights(pipeline, [])
    alone = runs.run(runs.plan)
    # A damaged LoRA is named even when the model also fails on its own: it is wrong anyway.
    damaged = [a for a in applied if a.file.damaged]
    if not alone.finite and not damaged:
        return None  # the model fails on its own: the LoRAs are not the cause
    if damaged:
        cancel.raise_if_cancelled()
        ok, quality = False, None
        if alone.finite:
            lora.use_weights(pipeline, [a for a in applied if not a.file.damaged])
            ok, quality, _ = runs.proved(runs.plan, reference)
        first = damaged[0]
        blame = LoraBlame(first.name, first.weight, None, None, list(first.file.non_finite))
        names = ", ".join(a.name for a in damaged)
        words = f"drop the LoRA{'s' if len(damaged) > 1 else ''} {names}"
        others = ", ".join(a.name for a in damaged[1:])
        them = "them" if len(damaged) > 1 else "it"
        if not alone.finite:
            without = f"the model fails on its own too: check it again without {them}."
        elif ok and quality:
            without = f"the model is fine (verified: {quality.words()})."
        else:
            without = "the model is fine (not verified)."
        summary = (
            f"The LoRA {first.name} {first.file.damage_words()}"
            + (f" (and the LoRA{'s' if len(damaged) > 2 else ''} {others} too)" if others else "")
            + f": {'their' if len(damaged) > 1 else 'its'} weights are damaged. Without {them} "
            + without
        )
        return Cause(
            "weights",
            _first_failed(report),
            summary,
            words,
            "drop_lora",
            verified=ok,
            quality=quality,
            lora=blame,
            headline=f"Broken LoRA: {summary[:1].lower()}{summary[1:]} Repair: {words}.",
        )
    for suspect in applied:
        cancel.raise_if_cancelled()
        progress(f"Re-running with the LoRA {suspect.name} alone", 0, 1)
        lora.use_weights(pipeline, [suspect])
        alone_with = runs.run(runs.plan)
        if alone_with.finite:
            continue
        component = alone_with.failed[0] if alone_with.failed else None
        layer = layer_name(alone_with.first_bad_module(component)) if component else None
        blame = LoraBlame(suspect.name, suspect.weight, layer, component, [])
        _lower_weight(runs, applied, suspect, blame, reference, progress, cancel)
        return _overflow_cause(report, suspect, blame)
    if len(applied) < 2:
        return None
    # Each is fine alone, together they fail: lower the strongest, the others at their weights.
    suspect = max(applied, key=lambda a: abs(a.weight))
    component = _first_failed(report)
    layer = layer_name(report.components[component].first_bad_module) if component else None
    blame = LoraBlame(suspect.name, suspect.weight, layer, component, [])
    _lower_weight(runs, applied, suspect, blame, reference, progress, cancel)
    return _overflow_cause(report, suspect, blame, together=[a.name for a in applied])


def _first_failed(report) -> str | None:
    failed = [n for n, c in report.components.items() if c.status.failed]
    return failed[0] if failed else None


def _lower_weight(runs: _Runs, applied, suspect, blame: LoraBlame, reference, progress, cancel):
    """The largest weight of `suspect` (the other LoRAs at theirs) whose run is finite and
    agrees with fp32 at that same weight: bisection between 0 and the user's weight, then the
    answer rounded down to 2 decimals and proved by one more run."""
    pipeline = runs.model.pipeline
    low, high = 0.0, suspect.weight
    best: float | None = None
    for step in range(WEIGHT_SEARCH_STEPS):
        cancel.raise_if_cancelled()
        middle = (low + high) / 2
        progress(
            f"Trying the LoRA {suspect.name} at weight {middle:.3g}", step, WEIGHT_SEARCH_STEPS
        )
        lora.use_weights(pipeline, applied, {suspect.adapter: middle})
        ok, _, _ = runs.proved(runs.plan, reference)
        if ok:
            best, low = middle, middle
        else:
            high = middle
    if best is None:
        return
    rounded = math.floor(abs(best) * 100) / 100 * (1 if best >= 0 else -1)
    if rounded == 0:
        return
    lora.use_weights(pipeline, applied, {suspect.adapter: rounded})
    ok, quality, _ = runs.proved(runs.plan, reference)
    if ok:
        blame.safe_weight, blame.quality = rounded, quality


def _overflow_cause(
    report, suspect: lora.AppliedLora, blame: LoraBlame, together: list[str] | None = None
) -> Cause:
    where = f" at {blame.layer}" if blame.layer else ""
    part = component_words(blame.component) if blame.component else "model"
    fix = report.fix
    repairs = []
    if blame.safe_weight is not None and blame.quality is not None:
        repairs.append(
            f"lower its weight to {blame.safe_weight:g} (--lora {suspect.file.path}:"
            f"{blame.safe_weight:g}; verified at that weight: finite, and "
            f"{blame.quality.words()} at the same weight; the picture changes with the weight)"
        )
    if fix is not None and fix.verified:
        repairs.append("; ".join(fix.steps) + " (keeps the picture)")
    repair = " or ".join(repairs) or "drop it"
    if together:
        summary = (
            f"Together the LoRAs {', '.join(together)} push the {part}{where} past fp16's "
            f"limit; each alone and the model alone are fine. Repair for {suspect.name}, the "
            f"strongest at weight {suspect.weight:g}: {repair}."
        )
    else:
        summary = (
            f"The LoRA {suspect.name} at weight {suspect.weight:g} pushes the {part}{where} "
            f"past fp16's limit; the model alone is fine. Repair: {repair}."
        )
    kind = "precision" if fix is not None and fix.verified else "weights"
    return Cause(
        kind,
        blame.component,
        summary,
        repair,
        "lower_lora_weight" if blame.safe_weight is not None else "drop_lora",
        verified=blame.safe_weight is not None or (fix is not None and fix.verified),
        settings=dict(fix.settings) if fix is not None and fix.verified else {},
        quality=blame.quality,
        lora=blame,
        headline=(
            f"{'Fixable' if report.verdict is Verdict.FIXABLE else 'Broken with this LoRA'}: "
            f"{summary[:1].lower()}{summary[1:]}"
        ),
    )


def _backends(plan: PrecisionPlan) -> list[str]:
    kind = "cuda" if plan.device.startswith("cuda") else "other"
    return [b for b in _BACKENDS[kind] if b != plan.attention_backend]


def _kernel(
    component: str,
    failing: str,
    backend: str,
    quality: Quality | None,
    struck: Sequence[str] = (),
) -> Cause:
    """The kernel cause: `backend` right at the same precision where `failing` is not, for
    `component` and every other part in `struck` (the parts the switch was proved on)."""
    where = f" where the {failing} backend does not" if failing != "auto" else ""
    proof = f"verified fix ({quality.words()})" if quality else "verified fix"
    parts = join_words(in_run_order(list(dict.fromkeys([component, *struck]))))
    several = len(set(struck) | {component}) > 1
    fault = (
        f"one attention kernel fault struck the {parts} alike, not an overflow of each"
        if several
        else "an attention kernel fault, not the model"
    )
    return Cause(
        "kernel",
        component,
        f"At the same precision the {backend} attention backend gives finite output "
        f"that agrees with fp32 ({quality.words() if quality else 'verified'}){where}"
        f"{f' in the {parts}' if several else ''}: {fault}. Fix: use the {backend} attention "
        "backend.",
        f"use the {backend} attention backend",
        "switch_backend",
        verified=True,
        settings={"attention_backend": backend},
        quality=quality,
        # The check's own headline would call a NaN out of an attention layer an overflow.
        headline=(
            f"Fixable: an attention kernel fault in the "
            f"{parts if several else component_words(component)}, not an "
            f"overflow: at the same precision another backend is right; {proof}: use the "
            f"{backend} attention backend."
        ),
    )


def _kernel_cause(
    runs: _Runs, report, component: str, failed: Sequence[str], progress
) -> Cause | None:
    """Another attention backend at the same precision (`fix_candidates.backend_switch`, the plan
    the check's math-kernel candidate is built from), judged against fp32 on diffusers' plain
    processor (`classic`, or `math` when classic is the one failing). A switch the check
    already re-ran as a fix candidate under this very plan is not run again: its result (judged
    against the check's fp32 reference) stands. Every component is tried, the text encoders
    included: transformers' encoders run PyTorch's SDPA as diffusers' layers do, so the backend
    decides their kernel too (only the upcast fix is diffusers' own)."""
    plain = "math" if runs.plan.attention_backend == "classic" else "classic"
    reference_plan = replace(job_plans.fp32_reference(runs.plan), attention_backend=plain)
    for backend in _backends(runs.plan):
        switch = fix_candidates.backend_switch(runs.plan, backend)
        tried = next(
            (
                r
                for r in report.tried
                if r.component == component
                and r.candidate is not None
                and r.candidate.plan == switch.plan
            ),
            None,
        )
        if tried is not None:
            if tried.verified:
                return _kernel(component, runs.plan.attention_backend, backend, tried.quality)
            continue
        progress(f"Re-running with the {backend} attention backend", 0, 1)
        ok, quality = runs.proved_by_stage(switch.plan, reference_plan, failed)
        if ok:
            return _kernel(component, runs.plan.attention_backend, backend, quality, failed)
    return None


def _foreign_kernel(runs: _Runs, progress):
    """(the kernel, what it gave) when the plan's runs go through a kernel HalfSafe does not
    ship (SDPA or a functional op replaced by a library, under the `auto` backend) and that
    kernel, run beside PyTorch's own (the math kernel for attention) on the same inputs for one
    run of the plan, alone goes non-finite or drifts below the quality threshold; None
    otherwise. Every such kernel is compared in the same run (each call goes on with PyTorch's
    values); the first found at fault is named, a NaN before a drift."""
    foreign = kernels.foreign_kernels()
    if not foreign or runs.plan.attention_backend != "auto":
        return None
    names = ", ".join(dict.fromkeys(k.words() for k in foreign))
    progress(f"Comparing {names} with PyTorch's own kernels", 0, 1)
    with contextlib.ExitStack() as stack:
        comparisons = [
            stack.enter_context(kernels.comparing(k, QUALITY_THRESHOLD_DB)) for k in foreign
        ]
        runs.run(runs.plan)
    found = [c for c in comparisons if c.finding is not None]
    found.sort(key=lambda c: (c.finding != "non_finite", c.kernel.fused))
    return (found[0].kernel, found[0]) if found else None


def _foreign_kernel_cause(
    runs: _Runs, report, component: str, foreign, comparison, progress
) -> Cause | None:
    """The repair for a foreign kernel found at fault: the first backend (each runs PyTorch's
    own kernel) whose run at the same precision is finite and agrees with fp32 on PyTorch's
    math kernel. None, with a note, when turning the kernel off is not enough."""
    reference = replace(job_plans.fp32_reference(runs.plan), attention_backend="math")
    for backend in _backends(runs.plan):
        progress(f"Re-running without {foreign.words()}: the {backend} attention backend", 0, 1)
        ok, quality, _ = runs.proved(
            fix_candidates.backend_switch(runs.plan, backend).plan, reference
        )
        if ok:
            cause = _kernel(component, runs.plan.attention_backend, backend, quality)
            return _blamed(report, cause, foreign, comparison)
    report.notes.append(
        f"{foreign.what().capitalize()} {foreign.words()} {_finding_words(comparison)} on "
        "the same inputs, but turning it off alone did not give the right answer."
    )
    return None


def _finding_words(comparison) -> str:
    own = (
        f"PyTorch's own {comparison.kernel.op}"
        if comparison.kernel.fused
        else ("PyTorch's math kernel")
    )
    if comparison.finding == "non_finite":
        return f"gives NaN or Inf where {own} is finite"
    return (
        f"agrees with {own} only to {comparison.worst_snr_db:.1f} dB "
        f"(threshold {QUALITY_THRESHOLD_DB:g} dB)"
    )


def _blamed(report, cause: Cause, foreign, comparison) -> Cause:
    """`cause`, a backend switch, told as turning `foreign` off."""
    component = cause.component
    first_bad = report.components[component].first_bad_module if component else None
    blame = KernelBlame(foreign, comparison, layer_name(first_bad))
    backend = cause.settings.get("attention_backend", "math")
    name = foreign.words()
    what = _finding_words(comparison)
    where = f" (the first layer to go bad: {blame.layer})" if blame.layer else ""
    proof = f"verified: {cause.quality.words()}" if cause.quality else "verified"
    part = component_words(component) if component else "model"
    kind = foreign.what()
    own = f"PyTorch's own {foreign.op}" if foreign.fused else "PyTorch's math kernel"
    summary = (
        f"{kind.capitalize()} {name}, which replaced PyTorch's {foreign.op} here, {what} on "
        f"the same inputs in the {part}{where}: the kernel is at fault, not the model or fp16. "
        f"Turn {foreign.name} off; in HalfSafe, choose the {backend} attention backend, which "
        f"runs PyTorch's own kernels ({proof})."
    )
    return replace(
        cause,
        summary=summary,
        repair=f"turn off {name}: use the {backend} attention backend",
        kernel=blame,
        headline=(
            f"Fixable: {kind} {name} fails in the {part}, not an overflow: on the same inputs "
            f"{own} is right; {proof}: turn {foreign.name} off (the {backend} attention "
            "backend, which runs PyTorch's own kernels)."
        ),
    )


def _state_cause(
    runs: _Runs, report, suspects: list[str], applied, reload, progress
) -> Cause | None:
    """The suspects freshly loaded, LoRAs applied again, and the right answer proved: under the
    check's plan where nothing else failed; otherwise in fp32, where the parts in memory failed
    too and a part that only overflows fp16 runs right, each suspect alone first, so that such a
    part beside them (a second text encoder of the same stage) is not called gone bad."""
    words = join_words(suspects)
    progress(f"Re-running with a freshly loaded {words}", 0, 1)
    try:
        fresh = reload() if reload is not None else _load_again(runs.model)
    except Exception as error:  # noqa: BLE001 - a reload that fails proves nothing either way
        if is_out_of_memory(error):  # but out of memory stops the job (`memory`)
            raise
        return None
    if applied:
        lora.reapply(fresh.pipeline, applied)
    # The pipeline attributes the suspects run in (the VAE's encoder runs in the VAE).
    modules = {module_of(name): getattr(fresh.pipeline, module_of(name), None) for name in suspects}
    if any(module is None for module in modules.values()):
        return None

    def twin_with(names: list[str]):
        twin_pipeline = copy.copy(runs.model.pipeline)
        for name in dict.fromkeys(module_of(n) for n in names):
            object.__setattr__(twin_pipeline, name, modules[name])
        return replace(runs.model, pipeline=twin_pipeline)

    reference = job_plans.fp32_reference(runs.plan)
    overflowing = [n for n, c in report.components.items() if c.status.failed and n not in suspects]
    gone_bad: list[str] = []
    quality: Quality | None = None
    if not overflowing:
        ok, quality, _ = runs.proved(runs.plan, reference, twin_with(suspects))
        gone_bad = list(suspects) if ok and quality is not None else []
    if not gone_bad:
        quality = None  # fp32 is the reference itself: finite is the proof, nothing compared
        if len(suspects) > 1:
            gone_bad = [s for s in suspects if runs.run(reference, twin_with([s])).finite]
        if not gone_bad and runs.run(reference, twin_with(suspects)).finite:
            gone_bad = list(suspects)
    if not gone_bad:
        return None
    # The repair, applied: the model in memory runs the fresh parts from now on.
    for name in dict.fromkeys(module_of(n) for n in gone_bad):
        object.__setattr__(runs.model.pipeline, name, modules[name])
    words = join_words(gone_bad)
    plural = len(gone_bad) > 1
    proof = (
        f"a freshly loaded {words} gives the right answer (verified: finite, {quality.words()})"
        if quality is not None
        else f"freshly loaded, {'they run' if plural else 'it runs'} finite in fp32, where the "
        f"{words} in memory did not"
    )
    return Cause(
        "state",
        gone_bad[0],
        f"The {words} in memory went bad after loading (the file is fine): {proof}. HalfSafe "
        f"reloaded {'them' if plural else 'it'}; in another app, restart it or reload the "
        "model.",
        f"reload the {words}",
        "reload",
        verified=True,
        quality=quality,
        reloaded=tuple(gone_bad),
    )


def _load_again(model):
    from app.core.models import load_model

    return load_model(model.source, vae=model.vae)
