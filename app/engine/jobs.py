"""The jobs the engine runs: each takes its typed request (`app.core.requests`), calls one core
function and returns core's typed result, which crosses to the GUI process as itself.

Core modules that use torch are imported inside the handlers, so the engine process starts fast
and the GUI process can import `app.engine` without pulling torch in.
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from app.core.errors import HalfSafeError
from app.core.explain import Explanation
from app.core.generation.records import GenerationResult
from app.core.hardware import HardwareReport
from app.core.health.report import CheckResult
from app.core.jobs import CancelToken, ProgressCallback
from app.core.lora import LoraRequest
from app.core.models.summary import ModelSummary, summarise
from app.core.requests import (
    CheckRequest,
    ExplainRequest,
    GenerateRequest,
    HardwareRequest,
    LoadRequest,
    PingRequest,
    RememberFixRequest,
)
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
    context: JobContext, request: LoadRequest, cancel: CancelToken
) -> ModelSummary:
    from app.core.models import load_model

    model = load_model(
        request.source,
        vae=request.vae or None,
        allow_pickle=request.allow_pickle,
        on_progress=context.progress,
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
    context.progress(f"Loading {Path(previous.source).name} again", 0, 0)
    try:
        _load_into_session(context, previous, CancelToken())
    except Exception:  # noqa: BLE001 - the first failure is the one the user reads
        _free_model(context)


def _loaded(context: JobContext) -> Any:
    if context.session.model is None:
        raise NoModelError()
    return context.session.model


def check(context: JobContext, request: CheckRequest) -> CheckResult:
    """Check the loaded model as `request` asks; a failure is attributed to its cause
    (`causes.check_and_attribute`)."""
    model = _loaded(context)
    from app.core.causes import check_and_attribute
    from app.core.health import markdown_report

    if request.loras is not None:
        _use_loras(model, request.loras, "", request.allow_pickle)
    report = check_and_attribute(
        model,
        precision=request.precision,
        device=request.device,
        size=request.size,
        steps=request.steps,
        scheduler=request.scheduler,
        on_progress=_headlines_as_warnings(context),
        cancel=context.cancel,
    )
    return CheckResult(report, markdown_report(report))


def _headlines_as_warnings(context: JobContext) -> ProgressCallback:
    """The check's progress callback: its headline (what failed, at which layer, found before
    the fixes are proved) goes out at once as a warning event, a plain string; the rest as
    progress."""
    from app.core.health.check import Headline

    def on_progress(stage: str, done: int, total: int) -> None:
        if isinstance(stage, Headline):
            context.warn(str(stage))
        else:
            context.progress(stage, done, total)

    return on_progress


def generate(context: JobContext, request: GenerateRequest) -> GenerationResult:
    """Make the images `request` asks for with the loaded model: a `GenerationResult` whose
    images are saved files. An image that could not be saved anywhere travels as PNG bytes
    (`ImageResult.png`), so the window still holds it and can save it elsewhere;
    `save_error` is the sentence that says so."""
    model = _loaded(context)
    from app.core.generation import generate as run_generation
    from app.core.generation import rescue_unsaved
    from app.core.images import ImageSaveError, png_bytes

    _use_loras(model, request.loras, request.generation.prompt, request.allow_pickle)
    try:
        result = run_generation(
            model,
            request.generation,
            precision=request.precision,
            device=request.device,
            on_progress=context.progress,
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


def _use_loras(
    model: Any, loras: Sequence[LoraRequest] | None, prompt: str, allow_pickle: bool
) -> None:
    from app.core.lora import check_weight, load_requested

    requests = []
    for entry in loras or ():
        try:
            weight = check_weight(float(entry.weight), str(entry.path))
        except (TypeError, ValueError) as error:
            raise HalfSafeError(f"A LoRA entry is not usable: {error}.") from None
        requests.append(LoraRequest(str(entry.path), weight))
    load_requested(model, requests, allow_pickle=allow_pickle, prompt=prompt)


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
    )
    # The library's folders served the search for files here; they stay in this process.
    return replace(explanation, model=replace(explanation.model, roots=[]))


def hardware(context: JobContext, request: HardwareRequest) -> HardwareReport:
    from app.core.hardware.report import hardware_report

    context.progress("Checking devices", 0, 1)
    return hardware_report(self_test=request.self_test, retest=request.retest)


def ping(context: JobContext, request: PingRequest | None) -> dict[str, Any]:
    """Proves the engine is up and answering."""
    return {"pid": os.getpid(), "python": sys.version.split()[0]}


def remember_fix(context: JobContext, request: RememberFixRequest) -> ModelSummary:
    """Store `request`'s fix for the loaded model on its device, where a health check or a
    repair stores the fixes it proves; fields the user leaves on Auto (or empty, for layer
    lists) follow it from the next job on. Returns the loaded model's summary, with the fix
    now remembered."""
    model = _loaded(context)
    from app.core import hardware, profiles

    info = hardware.describe_device(hardware.pick_device(request.device))
    profiles.remember_fix(
        model.profile_key,
        info.name,
        dict(request.settings),
        request.summary,
        "generation" if request.verified_by == "generation" else "health check",
    )
    context.session.model_summary = summarise(model, request.device)
    return context.session.model_summary


HANDLERS: dict[str, Handler] = {
    "load": load,
    "remember_fix": remember_fix,
    "check": check,
    "generate": generate,
    "explain": explain,
    "hardware": hardware,
    "ping": ping,
}
