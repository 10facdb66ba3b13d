"""A fix one job is asked to run with (`JobFix`), over the settings it was given, for that job
only: the way "Apply fix and regenerate" runs the fix it names even where the user's own choice
(a VAE set to fp16 by hand) would override a remembered fix. The user's settings stay as they
are; the job's record says what the fix replaced.

The merge rule: each plain setting of the fix replaces the job's value, whatever it was (auto
or the user's own); a layer list is added to the job's own list of that kind. What it replaced
that the user had chosen (a value other than auto, off or empty) is `overrode`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from app.core.errors import HalfSafeError
from app.core.settings import FIELDS, PRECISION_KEYS, PrecisionSettings
from app.core.settings.values import SettingValue

# A value that is no choice of the user's: the field left to HalfSafe.
_UNCHOSEN: tuple[Any, ...] = ("auto", False, None)


@dataclass(frozen=True)
class JobFix:
    """The fix a job ran with for that job only (`settings`, in settings values), and the
    user's own choices it replaced (`overrode`: each setting's value as the user had it)."""

    settings: dict[str, SettingValue]
    overrode: dict[str, SettingValue] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"settings": dict(self.settings), "overrode": dict(self.overrode)}

    def listed(self) -> list[str]:
        """Each setting it set as the image's record lists it (`infotext.FIX_FOR_JOB`), as the
        Settings page names it, with the user's own value it replaced: ['VAE precision bf16
        (over fp16)', 'FP32 layers vae:a'] ."""

        def said(value: Any) -> str:
            if isinstance(value, bool):
                return "on" if value else "off"
            if isinstance(value, list | tuple):
                return " ".join(map(str, value))
            return str(value)

        return [
            f"{FIELDS[key].label} {said(value)}"
            + (f" (over {said(self.overrode[key])})" if key in self.overrode else "")
            for key, value in self.settings.items()
        ]


def with_job_fix(
    precision: PrecisionSettings, fix: Mapping[str, Any] | None
) -> tuple[PrecisionSettings, JobFix | None]:
    """`precision` with `fix` laid over it (the rule above), and the record of it; the same
    settings and None when there is no fix. Raises HalfSafeError, in one sentence, for a fix
    naming a setting that is not a precision setting or holding a value it cannot take."""
    if not fix:
        return precision, None
    if not isinstance(fix, Mapping):
        raise HalfSafeError("The fix for this job must be precision settings by name.")
    values = precision.to_dict()
    overrode: dict[str, SettingValue] = {}
    for key, value in fix.items():
        if key not in PRECISION_KEYS or key == "device":
            raise HalfSafeError(
                f"The fix for this job names '{key}', which is no precision setting."
            )
        try:
            FIELDS[key].validate(value)
        except ValueError as error:
            raise HalfSafeError(f"The fix for this job: {FIELDS[key].label}: {error}.") from None
        own = values[key]
        if FIELDS[key].kind == "modules":
            values[key] = [*own, *(entry for entry in value if entry not in own)]
            continue
        if own not in _UNCHOSEN and own != value:
            overrode[key] = own
        values[key] = value
    return PrecisionSettings.from_mapping(values), JobFix(dict(fix), overrode)
