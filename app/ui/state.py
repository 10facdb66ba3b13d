"""What the views share: the user's settings, the loaded model, the hardware report.

Lives in the GUI thread. Every settings change is validated, saved at once (atomically, by
core, merged under a lock with what another HalfSafe process saved) and announced, so the next
job picks it up without a restart.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Signal

from app.core.hardware import DeviceInfo, HardwareReport, device_entry
from app.core.models.summary import ModelSummary
from app.core.precision.words import USUAL_PARTS
from app.core.requests.records import LoadRequest
from app.core.settings import FIELDS, PRECISION_KEYS, PrecisionSettings, Settings, update_settings

if TYPE_CHECKING:
    from app.core.precision import PrecisionPlan


class AppState(QObject):
    """Signals (GUI thread):
    settings_changed(list[str]): the keys that changed, already saved.
    model_changed(object): the loaded model's `ModelSummary`, or None.
    hardware_changed(object): the `HardwareReport` (what `gpu --json` prints, typed).
    effective_changed(object): the last job's precision in words (str), or None.
    save_failed(str): a plain sentence; the change applies to this session only.
    forgotten(str): a model's remembered fix or saved health report was forgotten (its
    profile key): what a page shows of it no longer holds.
    """

    settings_changed = Signal(list)
    model_changed = Signal(object)
    hardware_changed = Signal(object)
    effective_changed = Signal(object)
    save_failed = Signal(str)
    forgotten = Signal(str)

    def __init__(self, settings: Settings, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.settings = settings
        self.model: ModelSummary | None = None
        self.model_request: LoadRequest | None = None
        self.hardware: HardwareReport | None = None
        self.effective: str | None = None  # the last job's precision, in words
        self.save_error: str | None = None

    # Settings ---------------------------------------------------------------------------------

    def set_setting(self, key: str, value: Any) -> None:
        """Validate, store and save one setting. Raises ValueError with the reason if invalid."""
        self.apply({key: value})

    def apply(self, values: Mapping[str, Any]) -> list[str]:
        """Set several settings at once (a fix, a recommendation); saved once. Returns the
        keys that changed. Raises ValueError (nothing changed) if any value is invalid."""
        checked = {
            key: FIELDS[key].validate(value) for key, value in values.items() if key in FIELDS
        }
        changed = [key for key, value in checked.items() if self.settings[key] != value]
        if not changed:
            return []
        for key in changed:
            self.settings[key] = checked[key]
        try:
            saved = update_settings({key: checked[key] for key in changed}, base=self.settings)
            self.save_error = None
        except OSError as error:
            # The change still applies to this session; the user is told it was not saved.
            self.save_error = f"Settings could not be saved ({error.strerror or error})."
            self.save_failed.emit(self.save_error)
        else:
            changed += self._adopt(saved, changed)
        self.settings_changed.emit(changed)
        return changed

    def _adopt(self, saved: Settings, changed: list[str]) -> list[str]:
        """Take over what another HalfSafe process saved meanwhile (the file now holds it, so
        this window shows what the next start will); returns those keys."""
        adopted = [k for k in saved if k not in changed and saved[k] != self.settings[k]]
        for key in adopted:
            self.settings[key] = saved[key]
        return adopted

    def precision(self) -> PrecisionSettings:
        """The precision settings for the next job."""
        return self.settings.precision()

    def device(self) -> str:
        return str(self.settings["device"])

    # Hardware ---------------------------------------------------------------------------------

    def set_hardware(self, report: HardwareReport) -> None:
        self.hardware = report
        self.hardware_changed.emit(report)

    def device_report(self) -> DeviceInfo | None:
        """The report's device that the settings pick (auto: the first listed)."""
        return device_entry(self.hardware.devices if self.hardware else [], self.device())

    def expected_plan(self) -> PrecisionPlan | None:
        """The plan the next job will run under, resolved as a job resolves it: the settings
        against this device's report, the loaded model's parts, what its VAE asks for and the
        fix remembered for it (the usual parts when no model is loaded). None until the device
        is known. Asks the device nothing: the window never touches it."""
        device = self.device_report()
        if device is None:
            return None
        from app.core.precision import resolve_plan

        model = self.model
        fix = model.remembered_fix if model is not None else None
        return resolve_plan(
            self.precision(),
            device=device.torch_device,
            components=(model.components if model is not None else ()) or USUAL_PARTS,
            device_info=device,
            vae_needs_fp32=model is not None and model.vae_needs_fp32,
            remembered=fix.settings if fix is not None else None,
            ask_device=False,
        )

    def recommended(self) -> dict[str, Any]:
        device = self.device_report()
        recommended = device.recommended if device is not None else {}
        return {k: v for k, v in recommended.items() if k in FIELDS}

    def reasons(self) -> dict[str, str]:
        device = self.device_report()
        return dict(device.reasons) if device is not None else {}

    def recommended_settings(self) -> dict[str, Any]:
        """Precision settings (and device) at their defaults, with this computer's
        recommendation laid over those that have no Auto. A setting whose default is Auto stays
        Auto: Auto already resolves to the recommendation, and also follows the fix remembered
        for the loaded model and the model's own needs, which a pinned value would shut out."""
        values: dict[str, Any] = {key: FIELDS[key].default for key in PRECISION_KEYS}
        values["device"] = FIELDS["device"].default
        values.update(
            {
                key: value
                for key, value in self.recommended().items()
                if key in PRECISION_KEYS and values[key] != "auto" and key != "max_vram_gb"
            }
        )
        return values

    def reset_to_recommended(self) -> list[str]:
        """Apply `recommended_settings`; generation defaults and folders are left alone."""
        return self.apply(self.recommended_settings())

    # Model ------------------------------------------------------------------------------------

    def components(self) -> tuple[str, ...]:
        """The loaded model's components ("unet" or "transformer", ...), which say a fix's
        words (a transformer's, not a UNet's); none while no model is loaded."""
        return tuple(self.model.components) if self.model is not None else ()

    def set_model(self, summary: ModelSummary | None, request: LoadRequest | None = None) -> None:
        if summary != self.model:
            self.effective = None  # the last job's precision: not the next job's any more
        self.model = summary
        self.model_request = request if summary is not None else None
        self.model_changed.emit(summary)

    def set_effective(self, settings: str | None) -> None:
        """The last job's precision, in words for the status bar."""
        self.effective = settings
        self.effective_changed.emit(settings)
