"""The check with its LoRAs and the cause of a failure: the health check, then attribution
(`attribution.attribute`) where it failed, the cause adopted into the report and a verified
fix remembered."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from app.core.causes.attribution import attribute
from app.core.causes.records import Cause
from app.core.components import Role, Verdict, of_role
from app.core.components import words as component_words
from app.core.families import family_of
from app.core.fixing import fix_candidates
from app.core.fixing.job_plans import no_half
from app.core.health import AS_ASKED, CheckRequest, CheckRun, Fix, HealthReport, check_loaded
from app.core.health.cost import FixCost, StepCost, held_otherwise
from app.core.jobs import CancelToken, ProgressCallback
from app.core.lora import files as lora
from app.core.precision import PrecisionPlan


def check_model(
    source: str,
    request: CheckRequest,
    *,
    vae: str | None = None,
    text_encoders: list[str] | None = None,
    on_progress: ProgressCallback | None = None,
    cancel: CancelToken | None = None,
) -> HealthReport:
    """`halfsafe check` from a file: load the model `source` names (with `vae` and
    `text_encoders` in place of its own, `request.allow_pickle` for a pickle file), apply
    `request.loras` (None: none), check it as `request` asks (`health.check_loaded`) and,
    when something failed, attribute the failure (`attribute`)."""
    from app.core.models import load_model

    model = load_model(
        source,
        vae=vae,
        text_encoders=text_encoders,
        allow_pickle=request.allow_pickle,
        on_progress=on_progress,
        cancel=cancel,
    )
    lora.load_requested(model, list(request.loras or ()), allow_pickle=request.allow_pickle)
    return check_and_attribute(model, request, on_progress=on_progress, cancel=cancel)


def check_and_attribute(
    model,
    request: CheckRequest,
    *,
    run: CheckRun = AS_ASKED,
    on_progress: ProgressCallback | None = None,
    cancel: CancelToken | None = None,
    reload: Callable[[], Any] | None = None,
) -> HealthReport:
    """Check a loaded model (LoRAs as applied) as `request` asks, run as `run` says
    (`health.check_loaded`, which the request reaches whole), and attribute a failure to its
    cause; a verified kernel or state repair becomes the report's fix. See `attribute` for
    `reload`. A verified fix is remembered (`run.remember`) only once the cause is known and
    the whole check has run."""

    def checked() -> HealthReport:
        # Remembered below, once the cause is known and the whole check has run.
        once = replace(run, remember=False)
        return check_loaded(model, request, run=once, on_progress=on_progress, cancel=cancel)

    report = checked()
    applied_loras = list(getattr(model, "loras", []))  # the report names them; these hold them
    lora_notes = [
        problem for applied in applied_loras if (problem := applied.file.problems()) is not None
    ]
    lora_notes.extend(getattr(model, "lora_warnings", []))  # a LoRA that only partly fits
    report.notes.extend(lora_notes)
    damaged = [a for a in applied_loras if a.file.damaged]
    if report.verdict is Verdict.HEALTHY and not damaged:
        return report
    cause = attribute(model, report, request, on_progress=on_progress, cancel=cancel, reload=reload)
    report.cause = cause
    if cause is not None and cause.kind == "state" and _failed_beside(report, cause):
        # The parts gone bad are reloaded; what else failed is checked again on them.
        report = _beside_state(checked(), cause)
        report.notes[:0] = lora_notes
    elif cause is not None and cause.kind == "intermittent":
        _not_the_model(report)
    elif cause is not None:

        def priced(plans: dict[str, PrecisionPlan]) -> dict[str, StepCost]:
            return _step_costs(model, report, plans, request)

        _adopt(report, cause, priced if run.measure_cost else None, model.pipeline)
    if damaged:
        # A LoRA with NaN/Inf or an absurd alpha is wrong at every precision and weight, even
        # where a run happens to stay finite (an absurd alpha in fp32): never healthy, and a
        # precision "fix" that only runs it finite is no fix.
        report.verdict = Verdict.BROKEN
        if cause is not None and cause.action == "drop_lora":
            report.fix = None
    # A fix found with LoRAs applied may be theirs, not the model's: it is not remembered for
    # the model (the next run without them would pay for it).
    if run.remember and not applied_loras:
        _remember(model, report)
    return report


def _remember(model, report: HealthReport) -> None:
    """Store the check's verified fix for the model on this device, once the whole check has
    run (a check stopped half-way, by an error or running out of memory, remembers nothing):
    a precision fix, or the attention backend that a kernel fault needs. A fix for another
    cause (a component gone bad in memory, a LoRA) is not the model's to remember."""
    fix, cause = report.fix, report.cause
    if report.verdict is not Verdict.FIXABLE or fix is None or not fix.verified:
        return
    # A state repair is the moment's (a reload); the precision fix the check found beside it,
    # on the reloaded parts, is the model's.
    if cause is not None and cause.kind not in ("precision", "kernel", "state"):
        return
    if not fix.settings:
        return
    from app.core.fixing import profiles
    from app.core.fixing.job_plans import proved_with

    profiles.remember_fix(
        model.profile_key,
        report.device.name,
        proved_with(report.remembered_ran, fix.settings, fix.plan),
        fix.summary,
        "health check",
        made_at=report.plan.dtype_settings(),
        parts=model.components,
        warn=report.notes.append,
    )


def _failed_beside(report: HealthReport, cause: Cause) -> bool:
    """Whether a part other than those the state cause reloaded failed on its own inputs."""
    reloaded = cause.reloaded or (cause.component,)
    return any(c.status.failed and name not in reloaded for name, c in report.components.items())


def _beside_state(report: HealthReport, cause: Cause) -> HealthReport:
    """The check run again once the parts gone bad in memory were reloaded: its verdict and
    precision fix for what else failed (a real overflow), with the state cause beside it."""
    if report.verdict is Verdict.HEALTHY:
        report.cause = cause
        _adopt(report, cause)
        return report
    said = report.headline
    report.cause = cause
    report.notes.append(cause.summary)
    if report.verdict is Verdict.FIXABLE and report.fix is not None:
        report.fix.steps = [cause.repair, *report.fix.steps]
    cause.headline = f"{said} Before that, {cause.summary[:1].lower()}{cause.summary[1:]}"
    return report


def _not_the_model(report: HealthReport) -> None:
    """An intermittent fault: the model is healthy, and a precision fix the check found (its
    candidates ran finite only because the fault did not strike again) is dropped."""
    cause = report.cause
    assert cause is not None  # attributed as intermittent just before
    report.fix = None
    report.verdict = Verdict.HEALTHY
    report.notes.append(cause.summary)


def _step_costs(
    model, report: HealthReport, plans: dict[str, PrecisionPlan], request: CheckRequest
) -> dict[str, StepCost]:
    """A denoiser step under each of `plans` (label -> plan), timed as the check times its fix
    (`Timing.unet_step_costs`, alternating), on the request's prompt encoded under the first
    plan, at the size the check ran."""
    from app.core.health.stages import Runner

    first = next(iter(plans.values()))
    runner = Runner(
        model,
        first,
        report.size,
        request.prompt,
        request.steps,
        request.scheduler,
        clip_skip=request.clip_skip,
    )
    try:
        conditioning = runner.encode(first, record=False).output
        return runner.timing.unet_step_costs(plans, conditioning)
    finally:
        runner.placed.release()


def _adopt(
    report: HealthReport,
    cause: Cause,
    priced: Callable[[dict[str, PrecisionPlan]], dict[str, StepCost]] | None = None,
    pipeline: Any = None,
) -> None:
    """A verified kernel or state repair is the fix (the precision search could not find one,
    or found a costlier one that only hid the fault). Beside a kernel repair the precision fix
    the check found stays as the cause's alternative where it keeps the attention backend, and
    with `priced` both are timed against no-half on the loaded `pipeline`, so the user sees what
    each costs."""
    fix = report.fix
    backend = cause.settings.get("attention_backend")
    if (
        cause.kind == "kernel"
        and fix is not None
        and fix.verified
        and fix_candidates.switched_backend(fix.settings, report.plan) == backend
    ):
        report.notes.append(cause.summary)  # the chosen fix is that backend already
        return
    if cause.kind in ("kernel", "state") and cause.verified:
        plan = replace(report.plan, **cause.settings) if cause.settings else report.plan
        # The candidates the check tried stay beside the repair; the one that is this
        # backend switch, if the check tried it, is the chosen one.
        candidates = list(fix.candidates) if fix is not None else list(report.tried)
        for c in candidates:
            c.chosen = c.candidate is not None and c.candidate.plan == plan
        report.fix = Fix(
            plan,
            dict(cause.settings),
            cause.summary,
            verified=True,
            quality=cause.quality,
            steps=[cause.repair],
            candidates=candidates,
            baselines=dict(fix.baselines) if fix is not None else {},
        )
        report.verdict = Verdict.FIXABLE
        # The search's fix is the way that keeps the attention backend; one that switches it
        # too only adds a precision change to the repair, and is no alternative to it.
        backend_now = report.plan.attention_backend
        keeps = (
            fix is not None and fix.settings.get("attention_backend", backend_now) == backend_now
        )
        if cause.kind == "kernel" and fix is not None and fix.verified and keeps:
            _beside_kernel(report.fix, fix, cause, report, priced, pipeline)
    report.notes.append(cause.summary)


def _beside_kernel(
    repair: Fix,
    precision: Fix,
    cause: Cause,
    report: HealthReport,
    priced: Callable[[dict[str, PrecisionPlan]], dict[str, StepCost]] | None,
    pipeline: Any = None,
) -> None:
    """The precision fix the check found, kept beside the kernel repair as its alternative,
    and both priced (a denoiser step under each and under no-half) where `priced` is given."""
    cause.alternative = precision
    changes = "; ".join(precision.steps)
    precision.summary = (
        f"Keep the attention backend and change precision: {changes} (verified"
        f"{f': {precision.quality.words()}' if precision.quality else ''})."
    )
    wide = no_half(report.plan)
    if priced is not None:
        plans = {"repair": repair.plan, "no_half": wide}
        if precision.plan != wide:  # no-half itself is timed once
            plans["precision"] = precision.plan
        costs = priced(plans)
        # No-half timed as the check times it (`Timing.unet_step_costs`: from the stored
        # weights), which a generation may hold otherwise (`cost.held_otherwise`).
        as_checked = pipeline is not None and held_otherwise(
            pipeline, wide, family_of(pipeline).denoiser
        )
        repair.cost = FixCost(costs["repair"], costs["no_half"], as_checked)
        precision.cost = FixCost(
            costs.get("precision", costs["no_half"]), costs["no_half"], as_checked
        )
    backend = cause.settings.get("attention_backend")
    said = (
        f" Or keep the attention backend and change precision, as the check's own search "
        f"found: {changes} (verified), which pays for what only the kernel needed."
    )
    denoiser = of_role(list(report.components), Role.DENOISER)
    if repair.cost is not None and precision.cost is not None and denoiser:
        said += (
            f" A {component_words(denoiser[0])} step takes "
            f"{repair.cost.fix.unet_step_ms:.1f} ms with the {backend} attention backend, "
            + (
                f"{precision.cost.fix.unet_step_ms:.1f} ms with the precision fix and "
                f"{repair.cost.no_half.unet_step_ms:.1f} ms with --no-half."
                if precision.plan != wide
                else f"{repair.cost.no_half.unet_step_ms:.1f} ms with the precision fix "
                "(--no-half)."
            )
        )
    cause.summary += said
    repair.summary = cause.summary
