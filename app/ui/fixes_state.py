"""How the Fixes page keeps the app's state in step with a fix it changes: the loaded model's
summary, when its remembered fix is edited or forgotten, as the engine's next summary of it would
say; and a row's fix and report forgotten on disk before any page is told."""

from __future__ import annotations

from dataclasses import replace

from app.core.fixing import profiles
from app.core.fixing.profiles import RememberedFix, StoredFix
from app.core.health import saved
from app.ui.fixes_rows import LearnedRow
from app.ui.state import AppState


def forget_row(state: AppState, row: LearnedRow) -> None:
    """Forget `row`'s remembered fix and saved report (OSError where a file could not be
    changed), then tell the pages (`AppState.forgotten`)."""
    # Both forgotten before any page is told: the loaded model's summary changing would have
    # the Health check page read the saved report again, still there.
    if row.stored is not None:
        stored = row.stored
        profiles.forget_fix(stored.profile_key, stored.device, stored.torch_version)
    if row.report is not None:
        saved.forget_report(row.profile_key, row.device)
    if row.stored is not None:
        refresh_loaded(state, row.stored, None)
    state.forgotten.emit(row.profile_key)


def refresh_loaded(state: AppState, stored: StoredFix, fix: RememberedFix | None) -> None:
    """The loaded model's summary, when `stored` is its remembered fix, with `fix` instead
    (None: forgotten), as the engine's next summary of it would say. A fix forgotten also
    ends the status bar's account of the last job, which ran with it: the bar says what
    the next job will run with."""
    model = state.model
    if model is None or not is_loaded_models(state, stored):
        return
    changed = replace(
        model, remembered_fix=fix, remembered_on=stored.device if fix is not None else ""
    )
    state.set_model(changed, state.model_request)
    if fix is None and state.effective is not None:
        state.set_effective(None)


def is_loaded_models(state: AppState, stored: StoredFix) -> bool:
    """Whether `stored` is the fix the loaded model's next job looks up: its model, on
    the device and under the torch the engine runs. The summary's own fix may be older
    than the store's (a generation's repair is remembered after the load), so it is not
    what tells; it does where the engine's device or torch is not known yet."""
    model = state.model
    if model is None or model.profile_key != stored.profile_key:
        return False
    device = state.device_report()
    hardware = state.hardware
    if device is None or hardware is None:
        return model.remembered_on == stored.device and model.remembered_fix == stored.fix
    return device.name == stored.device and hardware.torch == stored.torch_version
