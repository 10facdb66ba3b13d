"""What the app shows about a loaded model: `ModelSummary`, plain data with no tensors and no
pipeline, so it crosses to the GUI process as itself."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from app.core.components import PIPELINE_PARTS
from app.core.errors import HalfSafeError
from app.core.families import capabilities
from app.core.fixing.remembered_fix import RememberedFix
from app.core.formats.weight_findings import StoredQuantization, WeightScan
from app.core.images.pictures import Mode
from app.core.models.loaded import LoadedModel

# The pipeline parts a summary lists, in pipeline order.


@dataclass(frozen=True)
class ModelSummary:
    """A loaded model in facts: where it came from, what it is, how its weights are stored and
    what their scan found, and the fix remembered for it on the device jobs run on (with the
    name of that device), if any. `profile_notes`: a sentence each when the remembered fixes'
    file was found damaged (and kept aside) by this load. `picture_modes`: for image-to-image
    and inpainting (`pictures.Mode`), "" where this model runs the mode, else the one sentence
    why not; empty when not known (a summary made without a pipeline): the job then decides.
    `references`: how many pictures it edits at most (0: it is not an editing model);
    `control`: whether it draws after a control picture (Flux.1 Depth, Canny), which a picture
    given alone then is; `draws_from_noise`: its picture modes that draw from noise with every
    step, so that no strength applies (an edit, a control picture, Flux.1 Fill's
    inpainting). `layers`: every layer's path in each component, which a fix may name (the
    window checks an edited fix against them)."""

    source: str
    name: str
    format: str
    architecture: str
    prediction_type: str
    native_size: int
    stored_dtype: str
    profile_key: str
    weights: WeightScan | None = None
    model_hash: str | None = None
    zero_terminal_snr: bool = False
    prediction_because: str = ""
    quantization: StoredQuantization | None = None
    detected_because: tuple[str, ...] = ()
    components: tuple[str, ...] = ()
    remembered_fix: RememberedFix | None = None
    remembered_on: str = ""  # the device the remembered fix is for
    profile_notes: tuple[str, ...] = ()
    picture_modes: Mapping[Mode, str] = field(default_factory=dict)
    references: int = 0
    control: bool = False
    draws_from_noise: tuple[Mode, ...] = ()
    layers: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    vae_needs_fp32: bool = False  # its VAE asks for fp32 (SDXL's original: `force_upcast`)

    def unknown_layers(self, entries: list[str]) -> list[str]:
        """The "component:layer" entries that name no layer of this model (none when its
        layers are not known)."""
        if not self.layers:
            return []
        known = {component: set(paths) for component, paths in self.layers.items()}
        unknown = []
        for entry in entries:
            component, _, path = entry.partition(":")
            if path not in known.get(component, set()):
                unknown.append(entry)
        return unknown


def summarise(model: LoadedModel, device: str = "auto") -> ModelSummary:
    """The summary of `model`, with the fix remembered for it on `device` (a settings value)."""
    from app.core.fixing.job_plans import vae_needs_fp32

    because = model.detected_because
    remembered, on, notes = _remembered_fix(model.profile_key, device)
    pipeline = model.pipeline
    layers = _layers(pipeline)
    return ModelSummary(
        source=str(model.source),
        name=str(model.name),
        format=str(model.format),
        architecture=str(model.architecture),
        prediction_type=str(model.prediction_type),
        native_size=int(model.native_size),
        stored_dtype=str(model.stored_dtype),
        profile_key=str(model.profile_key),
        weights=model.weights,
        model_hash=model.model_hash,
        zero_terminal_snr=bool(model.zero_terminal_snr),
        prediction_because=str(model.prediction_because),
        quantization=model.quantization,
        detected_because=tuple([because] if isinstance(because, str) else because or ()),
        components=model.components,
        remembered_fix=remembered,
        remembered_on=on,
        profile_notes=tuple(notes + _missing_layer_notes(remembered, pipeline)),
        picture_modes=_picture_modes(pipeline),
        layers=layers,
        vae_needs_fp32=vae_needs_fp32(model),
        **_picture_facts(pipeline),
    )


def _layers(pipeline) -> dict[str, tuple[str, ...]]:
    """Each component's layer paths (as `named_modules()` names them)."""
    found: dict[str, tuple[str, ...]] = {}
    for name in PIPELINE_PARTS:
        module = getattr(pipeline, name, None)
        if module is not None and hasattr(module, "named_modules"):
            found[name] = tuple(path for path, _ in module.named_modules() if path)
    return found


def _missing_layer_notes(remembered: RememberedFix | None, pipeline) -> list[str]:
    """A sentence when the remembered fix names layers this model does not have (an edit, or
    a fix kept from another version of the model): said at load, before any job."""
    if remembered is None:
        return []
    from app.core.fixing.job_plans import unknown_layers

    missing = [entry for _, entry in unknown_layers(remembered.settings, pipeline)]
    if not missing:
        return []
    return [
        f"The fix remembered for this model names {', '.join(missing)}, which this model does "
        "not have: jobs leave that out and use the rest of the fix (edit it on the Fixes page)."
    ]


def _picture_modes(pipeline) -> dict[Mode, str]:
    """Which picture modes the model's family runs for this pipeline, asked here in the
    engine (the window never imports torch): "" for a mode it runs, else the sentence why not."""
    from app.core.families.registry import family_of

    try:
        family = family_of(pipeline)
    except HalfSafeError:
        return {}
    return {
        mode: family.picture_problem(pipeline, mode) or "" for mode in (Mode.IMAGE, Mode.INPAINT)
    }


def _picture_facts(pipeline) -> dict[str, Any]:
    """`references`, `control` and `draws_from_noise` of the summary, from the model's family."""
    from app.core.families.registry import family_of

    try:
        family = family_of(pipeline)
    except HalfSafeError:
        return {}
    references, control = (
        capabilities.references(family, pipeline),
        capabilities.controls(family, pipeline),
    )
    modes = [Mode.IMAGE, Mode.INPAINT]
    modes += [Mode.EDIT] if references else []
    modes += [Mode.CONTROL] if control else []
    return {
        "references": references,
        "control": control,
        "draws_from_noise": tuple(m for m in modes if family.redraws_from_noise(pipeline, m)),
    }


def _remembered_fix(profile_key: str, device: str) -> tuple[RememberedFix | None, str, list[str]]:
    """The fix stored the last time this model needed one on this device, the device's name,
    and a sentence if the remembered fixes' file was found damaged (and kept aside)."""
    if not profile_key:
        return None, "", []
    try:
        from app.core import hardware
        from app.core.fixing import profiles

        info = hardware.describe_device(hardware.pick_device(device))
        found = profiles.lookup(profile_key, info.name)
    except Exception:  # noqa: BLE001 - a remembered fix is a convenience, never a blocker
        return None, "", []
    return found.fix, info.name if found.fix is not None else "", list(found.notes)
