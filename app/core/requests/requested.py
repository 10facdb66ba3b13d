"""A check or a generation run as its request record (`app.core.requests.records`) asks, on a loaded
model: the one entry the engine's jobs and the `halfsafe` command both call, so the window and
the terminal run the same job from the same record.

Torch is imported only when a job runs: importing this module stays as light as the records.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from app.core.errors import HalfSafeError
from app.core.jobs import CancelToken, ProgressCallback
from app.core.lora.request import LoraRequest
from app.core.requests.records import CheckRequest, GenerateRequest

if TYPE_CHECKING:
    from app.core.families.base import GenerationDefaults
    from app.core.generation.records import GenerationResult, PreviewCallback
    from app.core.health.report import HealthReport
    from app.core.health.request import CheckRun


def check(
    model: Any,
    request: CheckRequest,
    *,
    run: CheckRun | None = None,
    on_progress: ProgressCallback | None = None,
    cancel: CancelToken | None = None,
) -> HealthReport:
    """Check `model` (a `models.LoadedModel`) as `request` asks, run as `run` says (None: as a
    user asks, `health.AS_ASKED`), a failure attributed to its cause
    (`causes.check_and_attribute`, which hands the request on whole to the check).
    `request.loras` None leaves the model's LoRAs as they are; otherwise exactly those are
    applied first. A model whose family states its own steps (`model_defaults`) is probed at
    those, the schedule its images run."""
    from app.core.causes import check_and_attribute
    from app.core.memory import said_as_sentence

    if request.loras is not None:
        use_loras(model, request.loras, "", allow_pickle=request.allow_pickle)
    defaults = model_defaults(model)
    if defaults is not None:
        # The probe covers the ends of the sampler schedule the user's images run.
        request = replace(request, steps=defaults.steps)
    with said_as_sentence("checking the model"):
        if run is None:
            return check_and_attribute(model, request, on_progress=on_progress, cancel=cancel)
        return check_and_attribute(model, request, run=run, on_progress=on_progress, cancel=cancel)


def generate(
    model: Any,
    request: GenerateRequest,
    *,
    on_progress: ProgressCallback | None = None,
    on_preview: PreviewCallback | None = None,
    cancel: CancelToken | None = None,
) -> GenerationResult:
    """Make the images `request.generation` describes with `model`, with `request.loras` and
    the LoRAs its prompt names in `<lora:...>` tags applied (and no others). Raises what
    `generation.generate` raises, ImageSaveError included."""
    from app.core.generation import generate as run_generation
    from app.core.memory import said_as_sentence

    use_loras(model, request.loras, request.generation.prompt, allow_pickle=request.allow_pickle)
    with said_as_sentence("generating"):
        return run_generation(
            model,
            request.generation,
            precision=request.precision,
            device=request.device,
            on_progress=on_progress,
            on_preview=on_preview,
            cancel=cancel,
            fix=request.fix,
        )


def model_defaults(model: Any) -> GenerationDefaults | None:
    """The steps and CFG scale the loaded `model` runs at where the user gives none (Z-Image
    Turbo's 9 steps without CFG, Base's 28 at CFG 4); None where its family states none and the
    saved settings apply."""
    from app.core.families.registry import generation_defaults

    return generation_defaults(getattr(model, "architecture", None))


def use_loras(
    model: Any, loras: Sequence[LoraRequest] | None, prompt: str, *, allow_pickle: bool
) -> None:
    """Apply exactly `loras` and those `prompt` names to `model`. A record that crossed from
    another process is checked again: an entry whose weight is no usable number is one
    sentence."""
    from app.core.lora.files import check_weight, load_requested

    requests = []
    for entry in loras or ():
        try:
            weight = check_weight(float(entry.weight), str(entry.path))
        except (TypeError, ValueError) as error:
            raise HalfSafeError(f"A LoRA entry is not usable: {error}.") from None
        requests.append(LoraRequest(str(entry.path), weight))
    load_requested(model, requests, allow_pickle=allow_pickle, prompt=prompt)
