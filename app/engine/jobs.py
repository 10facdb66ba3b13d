"""The jobs the engine runs: each takes its typed request (`app.core.requests.records`), calls one core
function and returns core's typed result, which crosses to the GUI process as itself.

Core modules that use torch are imported inside the handlers, so the engine process starts fast
and the GUI process can import `app.engine` without pulling torch in.
"""

from __future__ import annotations

import gc
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from app.core.errors import CancelledError, HalfSafeError
from app.core.explain import Explanation
from app.core.generation.records import GenerationResult
from app.core.hardware import HardwareReport
from app.core.health.report import CheckResult
from app.core.jobs import CancelToken, ProgressCallback
from app.core.models.summary import ModelSummary, summarise
from app.core.requests import requested
from app.core.requests.library_check import (
    MAX_MODELS_PER_RUN,
    ModelCheckRow,
    ModelChecks,
    ModelToCheck,
    models_to_check,
)
from app.core.requests.records import (
    CheckModelsRequest,
    CheckRequest,
    ExplainRequest,
    GenerateRequest,
    HardwareRequest,
    LoadRequest,
    PingRequest,
    RememberFixRequest,
)
from app.engine.failures import describe_exception
from app.engine.server import Handler, JobContext


class NoModelError(HalfSafeError):
    """A health check or generation was asked for before any model was loaded."""

    def __init__(self) -> None:
        super().__init__("No model is loaded; load one on the Models page first.")


def _free_model(context: JobContext) -> None:
    context.session.model = None
    context.session.model_summary = None
    context.session.model_request = None
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def load(context: JobContext, request: LoadRequest) -> ModelSummary:
    """Load `request.source`. A source that cannot even be opened (no model, a pickle not
    allowed, a damaged header) is refused before the loaded model is touched. One model at a
    time (a computer rarely holds two of these in memory): the loaded model goes before the new
    one loads, and if the new one then fails or is cancelled, the previous one is loaded again.
    """
    from app.core.models import check_openable

    check_openable(request.source, allow_pickle=request.allow_pickle)
    if request.vae:
        check_openable(request.vae, allow_pickle=request.allow_pickle)
    previous = context.session.model_request
    _free_model(context)
    try:
        return _load_into_session(context, request, context.cancel)
    except Exception:  # a failure or a cancel; an interrupted engine loads nothing more
        if previous is not None:
            _load_again(context, previous)
        raise


def _load_into_session(
    context: JobContext,
    request: LoadRequest,
    cancel: CancelToken,
    on_progress: ProgressCallback | None = None,
) -> ModelSummary:
    from app.core.models import load_model

    model = load_model(
        request.source,
        vae=request.vae or None,
        allow_pickle=request.allow_pickle,
        on_progress=on_progress or context.progress,
        cancel=cancel,
    )
    cancel.raise_if_cancelled()
    context.session.model = model
    context.session.model_summary = summarise(model, request.device)
    context.session.model_request = request
    return context.session.model_summary


def _load_again(context: JobContext, previous: LoadRequest) -> None:
    """Load the model that was loaded before a failed load (not cancellable: the user cancelled
    the new load, not the model they had). If it cannot be loaded either, none is."""
    try:
        _load_into_session(context, previous, CancelToken(), _telling_reload(context, previous))
    except Exception:  # noqa: BLE001 - the first failure is the one the user reads
        _free_model(context)


def _telling_reload(context: JobContext, previous: LoadRequest) -> ProgressCallback:
    """Progress for loading `previous` back, which the job's cancel does not stop."""
    name = Path(previous.source).name
    return lambda stage, done, total: context.tell(f"Loading {name} again: {stage}", done, total)


def _loaded(context: JobContext) -> Any:
    if context.session.model is None:
        raise NoModelError()
    return context.session.model


def check(context: JobContext, request: CheckRequest) -> CheckResult:
    """Check the loaded model as `request` asks (`requested.check`, as `halfsafe check`
    does); a failure is attributed to its cause."""
    model = _loaded(context)
    from app.core.health import markdown_report

    report = requested.check(
        model, request, on_progress=_headlines_as_warnings(context), cancel=context.cancel
    )
    # The check may have remembered a fix: the window's summary of the model says so at once.
    context.session.model_summary = summarise(model, request.device)
    return _saved(
        context,
        model,
        CheckResult(report, markdown_report(report), context.session.model_summary),
    )


def _saved(context: JobContext, model: Any, result: CheckResult) -> CheckResult:
    """Keep the finished check as the model's last report on its device (the Fixes page and
    the Health check page show it again); one that cannot be saved is said, not fatal."""
    from app.core.health.saved import save_report

    try:
        save_report(str(getattr(model, "profile_key", "") or ""), result)
    except OSError as error:
        context.warn(f"The report could not be kept for later ({error.strerror or error}).")
    return result


def _headlines_as_warnings(context: JobContext) -> ProgressCallback:
    """A job's progress callback: a headline (what failed, at which layer, found before the
    fixes are proved; how the parts are held in memory) goes out at once as a warning event,
    a plain string; the rest as progress."""
    from app.core.jobs import Headline

    def on_progress(stage: str, done: int, total: int) -> None:
        if isinstance(stage, Headline):
            context.warn(str(stage))
        else:
            context.progress(stage, done, total)

    return on_progress


def generate(context: JobContext, request: GenerateRequest) -> GenerationResult:
    """Make the images `request` asks for with the loaded model (`requested.generate`, as
    `halfsafe generate` does): a `GenerationResult` whose images are saved files. An image that
    could not be saved anywhere travels as PNG bytes (`ImageResult.png`), so the window still
    holds it and can save it elsewhere; `save_error` is the sentence that says so."""
    model = _loaded(context)
    from app.core.generation import rescue_unsaved
    from app.core.images.finished import ImageSaveError, png_bytes

    try:
        result = requested.generate(
            model,
            request,
            on_progress=_headlines_as_warnings(context),
            on_preview=context.preview,
            cancel=context.cancel,
        )
    except ImageSaveError as error:
        rescued = rescue_unsaved(error)
        if rescued.result is None:
            raise rescued from None
        result, save_error = rescued.result, str(rescued)
    else:
        save_error = ""
    images = [
        replace(
            entry,
            image=None,
            loras=None,
            png=None if entry.path else png_bytes(entry.image, entry.parameters),
        )
        for entry in result.images
    ]
    return replace(result, images=images, save_error=save_error)


def explain(context: JobContext, request: ExplainRequest) -> Explanation:
    """Explain the image `request.path` (an `Explanation`). The model the image names is found
    in the library and checked; the engine's loaded model is reused when it is that file,
    otherwise the found file is loaded for this job only and freed after it."""
    from app.core.explain import explain_image

    explanation = explain_image(
        request.path,
        device=request.device,
        loaded=context.session.model,
        on_progress=context.progress,
        cancel=context.cancel,
        model=request.model,
        remake=request.remake,
    )
    # The library's folders served the search for files here; they stay in this process.
    return replace(explanation, model=replace(explanation.model, roots=[]))


def hardware(context: JobContext, request: HardwareRequest) -> HardwareReport:
    from app.core.hardware.report import hardware_report

    context.progress("Checking devices", 0, 1)
    return hardware_report(self_test=request.self_test, retest=request.retest)


def ping(context: JobContext, request: PingRequest) -> dict[str, Any]:
    """Proves the engine is up and answering."""
    return {"pid": os.getpid(), "python": sys.version.split()[0]}


def remember_fix(context: JobContext, request: RememberFixRequest) -> ModelSummary:
    """Store `request`'s fix for the loaded model on its device, where a health check or a
    repair stores the fixes it proves; fields the user leaves on Auto (or empty, for layer
    lists) follow it from the next job on. Returns the loaded model's summary, with the fix
    now remembered."""
    model = _loaded(context)
    from app.core import hardware
    from app.core.fixing import profiles

    info = hardware.describe_device(hardware.pick_device(request.device))
    verified_by = "generation repair" if request.verified_by == "generation" else "health check"
    held = profiles.remembered_fix(model.profile_key, info.name)
    # The check that proved it remembered it already, with what of the fix remembered before
    # its proof stood on (`job_plans.proved_with`): that entry, and when it was made, stay.
    same = (
        held is not None
        and all(held.settings.get(k) == v for k, v in request.settings.items())
        and held.verified_by == verified_by
        and held.edited_at is None
    )
    if not same:
        profiles.remember_fix(
            model.profile_key,
            info.name,
            dict(request.settings),
            request.summary,
            verified_by,
            made_at=request.made_at,
            parts=model.components,
            warn=context.warn,
        )
    context.session.model_summary = summarise(model, request.device)
    return context.session.model_summary


def check_models(context: JobContext, request: CheckModelsRequest) -> ModelChecks:
    """Check each model `request` names (or every model in the library) in turn: load it, check
    it as `request` says, keep its report. A model that cannot be loaded or checked gets one
    sentence in its row and the run goes on; a cancel ends the run (between models, or during
    one, whose row is left out). The model loaded before the run is loaded again at the end,
    whatever happened; the record says which model is loaded then."""
    targets = _models_for_run(context, request)
    previous = context.session.model_request
    rows: list[ModelCheckRow] = []
    cancelled = False
    try:
        for index, target in enumerate(targets[:MAX_MODELS_PER_RUN]):
            context.cancel.raise_if_cancelled()
            place = (index, min(len(targets), MAX_MODELS_PER_RUN))
            rows.append(_check_one(context, request, target, place))
    except CancelledError:
        cancelled = True
    finally:
        restore_problem = _restore(context, previous)
    return ModelChecks(
        rows=tuple(rows),
        cancelled=cancelled,
        not_checked=max(0, len(targets) - MAX_MODELS_PER_RUN),
        loaded=context.session.model_summary,
        loaded_request=context.session.model_request,
        restore_problem=restore_problem,
    )


def _models_for_run(context: JobContext, request: CheckModelsRequest) -> list[ModelToCheck]:
    if request.models is not None:
        return [ModelToCheck(source, Path(source).name) for source in request.models]
    from app.core.library import scan_library

    context.progress("Looking for models", 0, 0)
    entries = scan_library(
        list(request.folders), on_progress=context.progress, cancel=context.cancel
    )
    return models_to_check(entries)


def _check_one(
    context: JobContext, request: CheckModelsRequest, target: ModelToCheck, place: tuple[int, int]
) -> ModelCheckRow:
    """Load `target` (unless it is the loaded model) and check it; its row either way."""
    if target.problem is not None:
        return ModelCheckRow(target.source, target.name, None, target.problem)
    index, count = place

    def progress(stage: str, _done: int, _total: int) -> None:
        context.progress(f"{target.name} ({index + 1} of {count}): {stage}", index, count)

    phase = "load"
    try:
        model = _load_for_run(context, target, request.device, progress)
        phase = "check"
        report = _check_for_run(context, model, request, progress).report
    except CancelledError:
        raise
    except Exception as error:  # noqa: BLE001 - one model's failure is its row's; the run goes on
        return ModelCheckRow(
            target.source, target.name, None, describe_exception(error, phase).message
        )
    fix = report.fix.summary if report.fix is not None else report.remembered or ""
    return ModelCheckRow(target.source, target.name, report.verdict, report.headline, fix)


def _load_for_run(
    context: JobContext, target: ModelToCheck, device: str, progress: ProgressCallback
) -> Any:
    """The loaded model when it is `target`, else `target` loaded in its place (refused before
    the loaded model is let go when it cannot even be opened)."""
    loaded = context.session.model_request
    if (
        context.session.model is not None
        and loaded is not None
        and loaded.source == target.source
        and (target.vae is None or loaded.vae == target.vae)
    ):
        return context.session.model
    from app.core.models import check_openable

    check_openable(target.source, allow_pickle=False)
    _free_model(context)
    request = LoadRequest(target.source, vae=target.vae, device=device)
    _load_into_session(context, request, context.cancel, progress)
    return context.session.model


def _check_for_run(
    context: JobContext, model: Any, request: CheckModelsRequest, progress: ProgressCallback
) -> CheckResult:
    """The check `check` runs, on the model alone (no LoRA), its report kept."""
    from app.core.health import markdown_report

    alone = CheckRequest(
        precision=request.precision,
        device=request.device,
        size=request.size,
        steps=request.steps,
        scheduler=request.scheduler,
        clip_skip=request.clip_skip,
        loras=(),
    )
    report = requested.check(model, alone, on_progress=progress, cancel=context.cancel)
    return _saved(context, model, CheckResult(report, markdown_report(report)))


def _restore(context: JobContext, previous: LoadRequest | None) -> str:
    """Load `previous` again unless it is still loaded (none: free the last one checked), even
    after a cancel. Returns "" or the sentence saying why it could not be loaded."""
    if context.session.model_request == previous and (
        previous is None or context.session.model is not None
    ):
        return ""
    _free_model(context)
    if previous is None:
        return ""
    name = Path(previous.source).name
    try:
        _load_into_session(context, previous, CancelToken(), _telling_reload(context, previous))
    except Exception as error:  # noqa: BLE001 - the run's rows stand; the sentence says what failed
        _free_model(context)
        return f"{name} could not be loaded again: {describe_exception(error, 'load').message}"
    return ""


# Each job by the class of its request.
HANDLERS: dict[type, Handler] = {
    LoadRequest: load,
    RememberFixRequest: remember_fix,
    CheckRequest: check,
    CheckModelsRequest: check_models,
    GenerateRequest: generate,
    ExplainRequest: explain,
    HardwareRequest: hardware,
    PingRequest: ping,
}
