"""The jobs the engine runs: each calls one core function and returns plain, picklable data.

Core modules (and with them torch) are imported inside the handlers, so the engine process
starts fast and the GUI process can import `app.engine` without pulling torch in.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import sys
from pathlib import Path
from typing import Any

from app.core.errors import HalfSafeError
from app.core.jobs import CancelToken
from app.core.settings import PrecisionSettings
from app.engine.server import Handler, JobContext


class NoModelError(HalfSafeError):
    """A health check or generation was asked for before any model was loaded."""

    def __init__(self) -> None:
        super().__init__("No model is loaded; load one on the Models page first.")


def _plain(value: Any) -> Any:
    """Builtins only, so the result pickles without core's classes on the other side."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    # Exactly the builtin type: a subclass (torch's TorchVersion is a str, numpy's float64 a
    # float) would pickle as its own class and import its library in the GUI process.
    if value is None or type(value) in (bool, int, float, str):
        return value
    for plain in (bool, int, float, str):
        if isinstance(value, plain):
            return plain(value)
    to_json = getattr(value, "to_json", None)
    if callable(to_json):
        return _plain(to_json())
    return str(value)


def summarise_model(model: Any, device: str = "auto") -> dict[str, Any]:
    """What the GUI shows about a loaded model (no tensors, no pipeline)."""
    fields = (
        "source",
        "name",
        "format",
        "architecture",
        "prediction_type",
        "zero_terminal_snr",
        "prediction_because",
        "native_size",
        "stored_dtype",
        "model_hash",
        "profile_key",
        "quantization",
    )
    summary: dict[str, Any] = {name: _plain(getattr(model, name, None)) for name in fields}
    weights = getattr(model, "weights", None)
    summary["weights"] = _plain(weights) if weights is not None else None
    because = getattr(model, "detected_because", None)
    if isinstance(because, str):
        because = [because]
    summary["detected_because"] = [str(b) for b in (because or [])]
    summary["components"] = _components(getattr(model, "pipeline", None))
    summary["remembered_fix"], summary["profile_notes"] = _remembered_fix(model, device)
    return summary


def _components(pipeline: Any) -> list[str]:
    if pipeline is None:
        return []
    names = ("text_encoder", "text_encoder_2", "unet", "transformer", "vae")
    return [n for n in names if getattr(pipeline, n, None) is not None]


def _remembered_fix(model: Any, device: str) -> tuple[dict[str, Any] | None, list[str]]:
    """The fix stored the last time this model needed one on this device, if any, and a
    sentence if the remembered fixes' file was found damaged (and kept aside)."""
    profile_key = getattr(model, "profile_key", None)
    if not profile_key:
        return None, []
    try:
        from app.core import hardware, profiles

        info = hardware.describe_device(hardware.pick_device(device))
        found = profiles.lookup(profile_key, info.name)
    except Exception:  # noqa: BLE001 - a remembered fix is a convenience, never a blocker
        return None, []
    remembered = found.fix
    if remembered is None:
        return None, found.notes
    return {
        "settings": _plain(remembered.settings),
        "summary": remembered.summary,
        "verified_by": remembered.verified_by,
        "device": info.name,
    }, found.notes


def _free_model(context: JobContext) -> None:
    context.session.model = None
    context.session.model_summary = None
    context.session.model_request = None
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def load(context: JobContext, params: dict[str, Any]) -> dict[str, Any]:
    """params: source (path or "demo"), vae (path or None), allow_pickle (bool), device (for
    looking up a fix remembered on that device).

    A source that cannot even be opened (no model, a pickle not allowed, a damaged header) is
    refused before the loaded model is touched. One model at a time (a computer rarely holds
    two of these in memory): the loaded model goes before the new one loads, and if the new one
    then fails or is cancelled, the previous one is loaded again.
    """
    from app.core.models import check_openable

    allow_pickle = bool(params.get("allow_pickle", False))
    check_openable(params["source"], allow_pickle=allow_pickle)
    if params.get("vae"):
        check_openable(params["vae"], allow_pickle=allow_pickle)
    previous = context.session.model_request
    _free_model(context)
    try:
        _load_into_session(context, params, context.cancel)
    except Exception:  # a failure or a cancel; an interrupted engine loads nothing more
        if previous is not None:
            _load_again(context, previous)
        raise
    return dict(context.session.model_summary or {})


def _load_into_session(context: JobContext, params: dict[str, Any], cancel: CancelToken) -> None:
    from app.core.models import load_model

    model = load_model(
        params["source"],
        vae=params.get("vae") or None,
        allow_pickle=bool(params.get("allow_pickle", False)),
        on_progress=context.progress,
        cancel=cancel,
    )
    cancel.raise_if_cancelled()
    context.session.model = model
    context.session.model_summary = summarise_model(model, params.get("device", "auto"))
    context.session.model_request = dict(params)


def _load_again(context: JobContext, previous: dict[str, Any]) -> None:
    """Load the model that was loaded before a failed load (not cancellable: the user cancelled
    the new load, not the model they had). If it cannot be loaded either, none is."""
    name = Path(str(previous["source"])).name
    context.progress(f"Loading {name} again", 0, 0)
    try:
        _load_into_session(context, previous, CancelToken())
    except Exception:  # noqa: BLE001 - the first failure is the one the user reads
        _free_model(context)


def _loaded(context: JobContext) -> Any:
    if context.session.model is None:
        raise NoModelError()
    return context.session.model


def check(context: JobContext, params: dict[str, Any]) -> dict[str, Any]:
    """params: precision (settings mapping), device, size (px or None), steps and scheduler
    (the user's sampler: the denoiser is probed at its schedule's ends), loras (optional list
    of {"path", "weight"}: the check runs with exactly these). A failure is attributed to its
    cause (`causes.check_and_attribute`)."""
    model = _loaded(context)
    from app.core.causes import check_and_attribute
    from app.core.health import (
        DEFAULT_SCHEDULER,
        DEFAULT_STEPS,
        markdown_report,
    )

    if "loras" in params:
        _use_loras(model, params, "")
    report = check_and_attribute(
        model,
        precision=PrecisionSettings.from_mapping(params.get("precision", {})),
        device=params.get("device", "auto"),
        size=params.get("size"),
        steps=int(params.get("steps") or DEFAULT_STEPS),
        scheduler=str(params.get("scheduler") or DEFAULT_SCHEDULER),
        on_progress=context.progress,
        cancel=context.cancel,
    )
    return {"report": _plain(report.to_json()), "markdown": markdown_report(report)}


def generate(context: JobContext, params: dict[str, Any]) -> dict[str, Any]:
    """params: request (GenerationRequest fields), precision (settings mapping), device,
    loras (optional list of {"path", "weight"}). The LoRAs given and those the prompt names in
    `<lora:name:weight>` tags are the ones the images are made with."""
    model = _loaded(context)
    from app.core.generation import GenerationRequest, rescue_unsaved
    from app.core.generation import generate as run_generation
    from app.core.images import ImageSaveError

    request = GenerationRequest(**params["request"])
    _use_loras(model, params, request.prompt)
    try:
        result = run_generation(
            model,
            request,
            precision=PrecisionSettings.from_mapping(params.get("precision", {})),
            device=params.get("device", "auto"),
            on_progress=context.progress,
            on_preview=context.preview,
            cancel=context.cancel,
        )
    except ImageSaveError as error:
        rescued = rescue_unsaved(error)
        if rescued.result is None:
            raise rescued from None
        return _generation_document(context, params, rescued.result, str(rescued))
    return _generation_document(context, params, result)


def _use_loras(model: Any, params: dict[str, Any], prompt: str) -> None:
    from app.core.lora import LoraRequest, check_weight, load_requested

    requests = []
    for entry in params.get("loras") or []:
        try:
            weight = check_weight(float(entry.get("weight", 1.0)), str(entry["path"]))
        except (TypeError, ValueError, KeyError) as error:
            raise HalfSafeError(f"A LoRA entry is not usable: {error}.") from None
        requests.append(LoraRequest(str(entry["path"]), weight))
    load_requested(
        model, requests, allow_pickle=bool(params.get("allow_pickle", False)), prompt=prompt
    )


def _generation_document(
    context: JobContext, params: dict[str, Any], result: Any, save_error: str = ""
) -> dict[str, Any]:
    """A generation's result as plain data. An image that could not be saved anywhere travels
    as PNG bytes (`png`), so the window still holds it and can save it elsewhere; `save_error`
    is the sentence that says so."""
    from app.core.images import png_bytes

    document = _plain(result.to_json())
    document["request"] = dict(params["request"])
    document["model_name"] = (context.session.model_summary or {}).get("name")
    if save_error:
        document["save_error"] = save_error
        for image, entry in zip(document["images"], result.images, strict=True):
            if not entry.path and entry.image is not None:
                image["png"] = png_bytes(entry.image, entry.parameters)
    return document


def explain(context: JobContext, params: dict[str, Any]) -> dict[str, Any]:
    """params: path (an image), device (where the check runs). The model the image names is
    found in the library and checked; the engine's loaded model is reused when it is that file,
    otherwise the found file is loaded for this job only and freed after it."""
    from app.core.explain import explain_image

    explanation = explain_image(
        params["path"],
        device=params.get("device", "auto"),
        loaded=context.session.model,
        on_progress=context.progress,
        cancel=context.cancel,
    )
    return _plain(explanation.to_json())


def hardware(context: JobContext, params: dict[str, Any]) -> dict[str, Any]:
    """params: self_test (bool), retest (bool)."""
    from app.core.hardware.report import hardware_report

    context.progress("Checking devices", 0, 1)
    report = hardware_report(
        self_test=bool(params.get("self_test", True)), retest=bool(params.get("retest", False))
    )
    return _plain(report.to_json())


def ping(context: JobContext, params: dict[str, Any]) -> dict[str, Any]:
    """Proves the engine is up and answering."""
    return {"pid": os.getpid(), "python": sys.version.split()[0]}


def remember_fix(context: JobContext, params: dict[str, Any]) -> dict[str, Any]:
    """params: settings (a fix: settings values), summary (its sentence), verified_by (what
    proved it: "health check" or "generation"), device. Stores the fix for the loaded model on
    that device, where a health check or a repair stores the fixes it proves; fields the user
    leaves on Auto (or empty, for layer lists) follow it from the next job on. Returns the
    loaded model's summary, with the fix now remembered."""
    model = _loaded(context)
    from app.core import hardware, profiles

    device = params.get("device", "auto")
    info = hardware.describe_device(hardware.pick_device(device))
    profiles.remember_fix(
        model.profile_key,
        info.name,
        dict(params["settings"]),
        str(params.get("summary") or ""),
        "generation" if params.get("verified_by") == "generation" else "health check",
    )
    context.session.model_summary = summarise_model(model, device)
    return dict(context.session.model_summary)


HANDLERS: dict[str, Handler] = {
    "load": load,
    "remember_fix": remember_fix,
    "check": check,
    "generate": generate,
    "explain": explain,
    "hardware": hardware,
    "ping": ping,
}
