"""Where every job starts, the check's and a generation's alike: the device it runs on, the fix
remembered for this model on that device, and the plan the user's settings and that fix make.

Both paths take these from here, so a check proves a fix under the same plan the next
generation runs (the plan is the promise a verdict makes about the user's own job).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.core.fixing import job_plans, profiles
from app.core.settings import PrecisionSettings

if TYPE_CHECKING:
    from app.core.fixing.remembered_fix import RememberedFix
    from app.core.hardware.records import DeviceInfo
    from app.core.precision import PrecisionPlan


@dataclass
class JobStart:
    """The device (`torch_device`, and what it is: `info`), the remembered fix the plan holds
    (None when there is none or it was not asked for), the plan, and the profiles file's own
    notes (a damaged file moved aside)."""

    torch_device: Any
    info: DeviceInfo
    remembered: RememberedFix | None
    plan: PrecisionPlan
    profile_notes: list[str]


def start_job(
    model, precision: PrecisionSettings, device: str, *, use_remembered: bool = True
) -> JobStart:
    """The device picked for `device` ("auto", "cpu", "cuda:1", ...), the fix remembered for
    `model` on it (unless not `use_remembered`), and the plan the job runs under."""
    from app.core import hardware

    torch_device = hardware.pick_device(device)
    info = hardware.describe_device(torch_device)
    found = profiles.lookup(model.profile_key, info.name)
    remembered = found.fix if use_remembered else None
    plan = job_plans.plan_for_model(
        model,
        precision,
        device=torch_device,
        device_info=info,
        remembered=remembered.settings if remembered else None,
    )
    return JobStart(torch_device, info, remembered, plan, list(found.notes))
