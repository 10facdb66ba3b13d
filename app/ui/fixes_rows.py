"""The rows the Fixes page lists (a remembered fix or a saved report, per model and device) and the
words of their cells: when and how a fix was verified, the device, the quality against fp32."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from app.core.components import Verdict
from app.core.fixing.diagnosis import Quality, qualities_in
from app.core.fixing.profiles import RememberedFix, StoredFix
from app.core.health.saved import SavedReport, when_words
from app.ui import words

_TRADEMARKS = re.compile(r"\((?:R|TM)\)|[®™]", re.IGNORECASE)
_CLOCK = re.compile(r"\s*(?:CPU\s*)?@.*$")
_PROCESSOR = re.compile(r"\s+(?:\d+-Core\s+)?(?:Processor|CPU)$", re.IGNORECASE)
_VENDOR = re.compile(r"^(?:NVIDIA\s+(?:GeForce\s+)?|AMD\s+|Intel\s+)(?=\S)")


_VERDICT_LEVEL = {Verdict.HEALTHY: "good", Verdict.FIXABLE: "warn", Verdict.BROKEN: "bad"}


@dataclass(frozen=True)
class LearnedRow:
    """One line of the page: a model on a device, its remembered fix and its last report
    (either may be missing). `source` is where the model was loaded from ("" when unknown)."""

    profile_key: str
    device: str
    name: str
    source: str
    stored: StoredFix | None
    report: SavedReport | None


def learned_rows(
    fixes: list[StoredFix], reports: list[SavedReport], loaded: Any = None
) -> list[LearnedRow]:
    """Each stored fix with the report of its model and device, then each report with no fix.
    A fix's model is named by its report, or by the loaded model when it is that one."""
    by_model = {(r.profile_key, r.device): r for r in reports}
    known = {r.profile_key: r for r in reversed(reports)}  # the newest report of each model
    rows = []
    for stored in fixes:
        report = by_model.get((stored.profile_key, stored.device))
        named = report or known.get(stored.profile_key)
        name, source = (named.model_name, named.source) if named else ("", "")
        if loaded is not None and loaded.profile_key == stored.profile_key:
            name, source = name or loaded.name, source or loaded.source
        name = name or f"A model not checked since ({stored.profile_key[:8]})"
        rows.append(LearnedRow(stored.profile_key, stored.device, name, source, stored, report))
    with_fix = {(s.profile_key, s.device) for s in fixes}
    for report in reports:
        if (report.profile_key, report.device) not in with_fix:
            rows.append(
                LearnedRow(
                    report.profile_key,
                    report.device,
                    report.model_name or report.source,
                    report.source,
                    None,
                    report,
                )
            )
    return rows


def verified_words(fix: RememberedFix) -> str:
    """'health check, 23 Nov 2026, 17:20', and when it was edited by hand since."""
    text = f"{fix.verified_by}, {when_words(fix.saved_at)}"
    if fix.edited_at is not None:
        text += f"; edited by you {when_words(fix.edited_at)}"
    return text


def report_words(report: SavedReport) -> str:
    return f"{words.first_upper(report.verdict.value)}, {when_words(report.saved_at)}"


def day_words(seconds: float) -> str:
    """'23 Nov 2026': `when_words` without the time of day, for a table cell."""
    return when_words(seconds).partition(", ")[0]


def short_device(name: str) -> str:
    """A device's name short enough for a narrow column (its whole name is the tooltip):
    'NVIDIA GeForce RTX 3060' -> 'RTX 3060', 'Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz'
    -> 'Xeon Platinum 8375C', 'AMD Ryzen 9 5950X 16-Core Processor' -> 'Ryzen 9 5950X': the
    product's name, without trademarks, clock, 'Processor' or the vendor it names anyway."""
    text = " ".join(_CLOCK.sub("", _TRADEMARKS.sub("", name)).split())
    text = _VENDOR.sub("", _PROCESSOR.sub("", text))
    return text or name


def quality_words(quality: Quality | None) -> str:
    """How close a fix came to an fp32 run, in plain words and what they stand for (the one
    table, `diagnosis.Quality.plain_words`); "" for no figure."""
    if quality is None:
        return ""
    return f"{words.first_upper(quality.plain_words())}: {quality.figure_words()}."


def _first_quality(text: str) -> Quality | None:
    """The first figure the check wrote into a sentence kept as text (a fix saved before its
    figure was kept as a number)."""
    found = qualities_in(text)
    return found[0] if found else None
