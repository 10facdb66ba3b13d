"""The Health check page's verdict in words: the headline of the check shown (this session's, or
the one saved), the precisions it holds at, and what the verdict banner says of it as the next
job runs at one of those precisions, at another, or once the engine stopped; with the line over
it naming the model a check would run on."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, NamedTuple

from app.core.components import Verdict
from app.core.precision import PrecisionPlan
from app.core.precision.words import plan_words
from app.ui import words
from app.ui.health_words import pictures_words, plain_headline

if TYPE_CHECKING:
    from app.core.health import HealthReport
    from app.core.health.saved import SavedReport
    from app.core.models.summary import ModelSummary

_VERDICT_LEVEL = {Verdict.HEALTHY: "good", Verdict.FIXABLE: "warn", Verdict.BROKEN: "bad"}

# The line over the verdict once the engine stopped with a model loaded: the restart reloads it.
MODEL_GONE_WORDS = (
    "The engine stopped, and the model with it: Restart engine, at the top of the window, loads "
    "it again."
)


def model_words(model: ModelSummary | None) -> str:
    """The line over the verdict: the model a check runs on, or where to load one."""
    if model is None:
        return "Load a model on the Models page first; the demo model works on any computer."
    return f"Model: {model.name or model.source} ({words.architecture_name(model.architecture)})."


class Headline(NamedTuple):
    """The banner's level and text for a check, and the precisions (in words) it holds at: a
    verdict made at other settings says nothing of the next job."""

    level: str
    text: str
    holds_at: tuple[str, ...]


def report_headline(
    report: HealthReport,
    pictures: tuple[tuple[str, ...], str | None] | None,
    next_plan: PrecisionPlan | None,
) -> tuple[Headline, str]:
    """The headline of a check run now, with `pictures` (the input picture and mask it ran
    with) while the next job runs at `next_plan`; and its figures, for a tooltip."""
    level = _VERDICT_LEVEL[report.verdict]
    if report.advice is not None and report.advice.overflowing:
        level = "warn"  # safe as run, but not in the fp16 the user is likely to move to
    tested = plan_words(report.plan)
    headline, figures = plain_headline(report.headline)
    text = (
        f"<b>{html.escape(headline)}</b><br>"
        f"Tested on {html.escape(report.device.name)} with {html.escape(tested)}"
        + (f" at {report.size}×{report.size} px" if report.size else "")
        + "."
        + html.escape(pictures_words(pictures, report))
    )
    # It holds at what it ran at, at its fix's, and at the next job's as the settings are now
    # (the fix it remembered, resolved as jobs resolve it): until they change.
    fixed_at = (plan_words(report.fix.plan),) if report.fix is not None else ()
    next_at = (plan_words(next_plan),) if next_plan else ()
    holds_at = (tested, *fixed_at, *next_at)
    return Headline(level, text, holds_at), figures


def saved_headline(saved: SavedReport) -> tuple[Headline, str]:
    """The headline of the last check, as saved: when and where it ran; and its figures, for a
    tooltip."""
    from app.core.health.saved import when_words

    ran_at = f" at {html.escape(saved.ran_at)}" if saved.ran_at else ""
    headline, figures = plain_headline(saved.headline)
    text = (
        f"<b>{html.escape(headline)}</b><br>The last check, on "
        f"{html.escape(saved.device)}{ran_at} on {when_words(saved.saved_at)}: its report "
        "as saved is below; run the health check for each part's chart and the fix's "
        "buttons."
    )
    holds_at = tuple(t for t in (saved.ran_at, saved.fix_runs_at) if t)
    return Headline(_VERDICT_LEVEL[saved.verdict], text, holds_at), figures


def banner_words(
    headline: Headline,
    stale: bool,
    next_job: str | None,
    verified: set[str],
    fix_runs_at: str = "",
) -> tuple[str, str]:
    """The verdict banner's level and text: the headline while the next job runs at a
    precision it holds at (`next_job`, in words; None when not known) or at one a fix applied
    since was `verified` at; otherwise a plain note of that, with no verdict. `stale`: the
    engine stopped since. `fix_runs_at`: the precision a saved report's fix runs at."""
    level, text, holds_at = headline
    if stale:
        return (
            "muted",
            "<b>The engine stopped, so this result is from before that.</b> It holds again "
            f"once the model is loaded again.<br>The last result: {text}",
        )
    if next_job is None or not holds_at or next_job in (*holds_at, *verified):
        if fix_runs_at and next_job == fix_runs_at:
            text += " The fix it proved is in use: your next job runs with it."
        return level, text
    return (
        "info",
        f"<b>Not checked at your settings.</b> The last check of this model ran at "
        f"{html.escape(holds_at[0])}; the next job runs at {html.escape(next_job)}. Run "
        "the health check to check that.",
    )
