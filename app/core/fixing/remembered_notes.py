"""What a job says of the fix remembered for its model: whether it ran with it, what of it was
left out, and what the user's own settings set aside (`remembered_words`,
`overridden_repair_words`); the notes a check and a generation make of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.core.components import join_words
from app.core.fixing.job_fix import JobFix
from app.core.fixing.remembered_fix import RememberedFix
from app.core.settings import FIELDS


def ran_with_remembered(remembered: RememberedFix | None, plan: Any) -> bool:
    """Whether a job under `plan` ran with the remembered fix: it set some of the job's
    settings (`plan.remembered_used`), or the user's own settings held all of it (a fix applied
    to the settings) with no layer of it missing from the model."""
    if remembered is None:
        return False
    if getattr(plan, "remembered_used", ()):
        return True
    held = set(getattr(plan, "remembered_held", ()))
    wanted = {k for k, v in remembered.settings.items() if v not in ("auto", False, [], ())}
    if not wanted:
        # A fix of defaults alone (a kernel switch to PyTorch's own attention, proved in
        # ComfyUI, is `attention_backend: auto`): the job ran with it where it ran them.
        ran = [getattr(plan, k) == v for k, v in remembered.settings.items() if hasattr(plan, k)]
        return bool(ran) and all(ran)
    return wanted <= held and not getattr(plan, "remembered_dropped", ())


def remembered_words(
    remembered: RememberedFix | None, plan: Any, job_fix: JobFix | None = None
) -> list[str]:
    """The note a job makes of a remembered fix: used (it set some of the settings the job ran
    with: `plan.remembered_used`), or there but overridden by the user's own settings; and the
    layers it names that this model does not have (`plan.remembered_dropped`), left out. A job
    run with a fix of its own (`job_fix`) makes no note of it: its record says what ran
    (`GenerationResult.job_fix`), and the window says it from there, as things stand when it
    is read (a fix made the setting since is no longer "for that job only"); the remembered
    fix that fix holds is then no setting of the user's, and is not said either."""
    if remembered is None:
        return []
    held = set(getattr(plan, "remembered_held", ()))
    if job_fix is not None and held and held <= set(job_fix.settings):
        return []  # the job's fix is the remembered one, which its record says
    return _remembered_only_words(remembered, plan)


def overridden_words(overrode: Mapping[str, Any]) -> str:
    """The user's own settings a fix set aside, as the settings page names them: 'VAE
    precision fp16 and Precision fp16'."""

    def value_words(value: Any) -> str:
        if isinstance(value, bool):
            return "on" if value else "off"
        return str(value)

    return join_words([f"{FIELDS[key].label} {value_words(v)}" for key, v in overrode.items()])


def overridden_repair_words(
    remembered: RememberedFix, overrode: Mapping[str, Any], repair: str
) -> str:
    """What a job says when the user's own settings (`overrode`) set the remembered fix aside
    and the job repaired its images another way (`repair`), which the next job at the same
    settings repeats: the fix was not in place, and how to put it there."""
    from app.core.precision.words import fix_words

    does = fix_words(remembered.settings, remembered.parts)
    labels = _labels(overrode)
    return (
        f"Your own {overridden_words(overrode)} set aside the fix remembered for this model on "
        f"this device ({does}), so this job ran without it, went non-finite and was repaired "
        f"after ({repair}); every job at these settings will be repaired again, which is "
        f"slower. To run the fix from the start, set {labels} to Auto, or make the fix your "
        "setting. The remembered fix stays: the health check proved it against fp32, where "
        "this repair only came out finite."
    )


def _labels(overrode: Mapping[str, Any]) -> str:
    return join_words([FIELDS[key].label for key in overrode])


def _remembered_only_words(remembered: RememberedFix, plan: Any) -> list[str]:
    """`remembered_words` for a job with no fix of its own."""
    from app.core.precision.words import fix_words

    # What it does, short: how it was proved is on the Fixes page, not in every job's notes.
    does = fix_words(remembered.settings, remembered.parts)
    dropped = tuple(getattr(plan, "remembered_dropped", ()))
    missing = ""
    if dropped:
        layers = ", ".join(dropped)
        missing = f"{layers}, which this model does not have"
    if getattr(plan, "remembered_used", ()):
        words = f"Using the fix remembered for this model on this device: {does}."
        if missing:
            words += f" Left out of it: {missing} (edit it on the Fixes page)."
        return [words]
    from app.core.fixing.job_plans import without_layers

    if ran_with_remembered(remembered, plan):
        # The job's own settings held the same fix (a fix applied to this job, say): it ran
        # with it, though not because it is remembered.
        return [
            f"Your settings include the fix remembered for this model on this device ({does}), "
            "so the job ran with it."
        ]
    if missing and not without_layers(remembered.settings, dropped):
        return [
            f"The fix remembered for this model on this device names only {missing}, so this "
            "job ran without it: edit or forget it on the Fixes page."
        ]
    if missing:
        return [
            f"The fix remembered for this model on this device names {missing}, and your "
            "settings override the rest of it, so this job ran without it."
        ]
    return [
        f"A fix is remembered for this model on this device ({does}), but your settings "
        "override it, so this job ran without it."
    ]
