"""Applying a fix from the GUI: what belongs to the model is remembered for it, the rest is set.

A fix that names a model's layers (`fp32_modules`, `bf16_modules`, `clamp_modules`) is that
model's alone: written into the settings, it would apply to every model, and one without those
layers would refuse to load. Such parts are sent to the engine, which remembers them for the
loaded model on its device (as a health check or a repair remembers the fixes it proves); fields
left empty follow them from the next job on. Everything else in a fix is a plain setting.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from app.core.models.summary import ModelSummary
from app.core.requests.records import RememberFixRequest
from app.core.settings import FIELDS
from app.core.settings.values import setting_entries
from app.engine.events import EngineEvent, EventState
from app.ui.engine_client import EngineClient
from app.ui.state import AppState


def split_fix(settings: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the settings to set, the model's own part to remember for it)."""
    shared = {k: v for k, v in settings.items() if k in FIELDS and FIELDS[k].kind != "modules"}
    own = {k: v for k, v in settings.items() if k in FIELDS and FIELDS[k].kind == "modules"}
    return shared, own


def layers_ran(own: Mapping[str, Any], settings: Mapping[str, Any]) -> bool:
    """Whether a job whose effective settings were `settings` ran the layer lists `own` at all:
    every part they name ran narrower than the lists widen it to (an fp32 layer in an fp16 or
    bf16 part; a clamp in an fp16 part). A part that ran wholly in fp32 (a remembered fix, or
    the user's own setting) makes its layers moot: its image proves nothing of them."""
    from app.core.components import COMPONENTS

    widths = {"fp16": 0, "bf16": 1, "fp32": 2}
    wanted = {"fp32_modules": "fp32", "bf16_modules": "bf16", "clamp_modules": "bf16"}
    for key, entries in own.items():
        for entry in entries or ():
            part = str(entry).partition(":")[0]
            spec = COMPONENTS.get(part)
            ran = settings.get(spec.setting) if spec is not None else None
            if ran in (None, "auto"):
                ran = settings.get("precision")
            if ran not in widths or widths[ran] >= widths[wanted.get(key, "fp32")]:
                return False
    return True


def ran_with(settings: Mapping[str, Any] | None, fix: Mapping[str, Any]) -> bool:
    """Whether a job whose effective settings were `settings` ran with `fix`: each of its plain
    settings as the fix sets it, and each layer it names in the job's list of that kind."""
    if not settings:
        return False
    shared, own = split_fix(fix)
    if any(settings.get(key) != value for key, value in shared.items()):
        return False
    return all(set(entries or ()) <= set(settings.get(key) or ()) for key, entries in own.items())


# A setting's value that is no choice of the user's: the field left to HalfSafe, where a fix
# remembered for the model applies (as a job merges a fix over the settings).
_UNCHOSEN: tuple[Any, ...] = ("auto", False, None)


@dataclass(frozen=True)
class FixInPlace:
    """Where a fix stands for the next job, as the settings and the model's remembered fix
    make it now: whether the user's settings hold its plain settings, whether the fix
    remembered for the model holds them (with the settings left to it), and whether its layer
    lists are remembered for the model (or are being remembered)."""

    settings_hold: bool = False
    remembered_holds: bool = False
    layers_remembered: bool = False

    @property
    def plain_in_place(self) -> bool:
        return self.settings_hold or self.remembered_holds


def fix_in_place(
    state: AppState, fix: Mapping[str, Any], remembering: Mapping[str, Any] | None = None
) -> FixInPlace:
    """Where `fix` stands for the next job now (`FixInPlace`); `remembering`: layer lists sent
    to be remembered for the model whose answer has not come back yet."""
    shared, own = split_fix(fix)
    settings = state.settings
    model = state.model
    remembered = dict(model.remembered_fix.settings) if model and model.remembered_fix else {}
    held_by_settings = bool(shared) and all(settings[k] == v for k, v in shared.items())
    held_by_remembered = bool(shared) and all(
        remembered.get(k) == v and settings[k] in (v, *_UNCHOSEN) for k, v in shared.items()
    )

    def holds(lists: Mapping[str, Any]) -> bool:
        return all(set(v or ()) <= set(setting_entries(lists, k)) for k, v in own.items())

    layers = bool(own) and (holds(remembered) or holds(remembering or {}))
    return FixInPlace(held_by_settings, held_by_remembered and not held_by_settings, layers)


def set_aside_by(state: AppState, fix: Mapping[str, Any]) -> dict[str, Any]:
    """The user's own settings that set aside `fix` (the model's remembered fix) for a job
    run now: each plain setting it sets that the user chose otherwise, as the user has it."""
    shared, own = split_fix(fix)
    settings = state.settings
    mine = {k: settings[k] for k, v in shared.items() if settings[k] not in (v, *_UNCHOSEN)}
    # Layer lists of the user's own of a kind the fix names replace the remembered ones.
    mine.update({k: settings[k] for k in own if settings[k]})
    return mine


def apply_fix(
    state: AppState,
    client: EngineClient,
    settings: Mapping[str, Any],
    summary: str,
    on_failed: Callable[[EngineEvent], None] | None = None,
    made_at: Mapping[str, Any] | None = None,
) -> list[str]:
    """Apply a fix the health check verified (`made_at`: the precision it was proved at, as
    settings): set its plain settings and have the engine remember its layer lists for the
    loaded model; returns the setting keys that changed (ValueError, nothing changed, for a bad
    value). The remembering is a job queued ahead of any job submitted after this call, so the
    next generation or check runs with it."""
    shared, own = split_fix(settings)
    for key, value in own.items():
        FIELDS[key].validate(value)
    # Layer lists of the user's own of a kind the fix names replace the model's remembered
    # ones: applying the fix hands that kind back to it (the list left empty: Auto).
    overriding = {key: [] for key in own if state.settings[key]}
    changed = state.apply({**shared, **overriding})
    if own:
        remember_for_model(state, client, own, summary, "health check", on_failed, made_at)
    return changed


def remember_for_model(
    state: AppState,
    client: EngineClient,
    own: Mapping[str, Any],
    summary: str,
    verified_by: str,
    on_failed: Callable[[EngineEvent], None] | None = None,
    made_at: Mapping[str, Any] | None = None,
) -> int:
    """Queue the engine job that remembers a verified fix's layer lists for the loaded model
    on this device (`verified_by`: what proved it; `made_at`: the precision it was proved at,
    as settings, when known); the model's summary shown is refreshed."""
    request = RememberFixRequest(
        settings=dict(own),
        summary=summary,
        verified_by=verified_by,
        device=state.device(),
        made_at=dict(made_at or {}),
    )

    def remembered(event: EngineEvent) -> None:
        if event.state == EventState.RESULT and event.result:
            state.set_model(event.result_as(ModelSummary), state.model_request)
        elif event.state == EventState.ERROR and on_failed is not None:
            on_failed(event)

    return client.submit(request, remembered)
