"""The rows the Fixes page lists (a remembered fix or a saved report, per model and device) and the
words of their cells: when and how a fix was verified, the device, the quality against fp32."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from app.core.components import Verdict
from app.core.fixing.profiles import RememberedFix, StoredFix
from app.core.fixing.quality import Quality, plain_figures, qualities_in
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


def ran_only_in_fp32(report: SavedReport) -> bool:
    """The check ran every part in fp32 (a CPU's Auto, or no-half): it proved nothing about
    half precision, whatever its verdict."""
    ran = report.ran_at
    return ran.startswith("fp32") and "fp16" not in ran and "bf16" not in ran


# What a check that ran only in fp32 did not prove, in a sentence.
FP32_ONLY_WORDS = (
    "It ran every part in fp32, so it proved nothing about half precision (fp16 or bf16): "
    "check again at fp16 or bf16 to know whether this model is safe there."
)


def verdict_words(report: SavedReport) -> str:
    """'Healthy', 'Fixable', 'Broken'; 'Healthy in fp32 only' for a check that ran only in
    fp32 and found nothing to fix (it proved nothing about fp16 or bf16)."""
    said = words.first_upper(report.verdict.value)
    if report.verdict is Verdict.HEALTHY and ran_only_in_fp32(report):
        said += " in fp32 only"
    return said


def report_words(report: SavedReport) -> str:
    return f"{verdict_words(report)}, {when_words(report.saved_at)}"


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
    table, `quality.Quality.plain_words`); "" for no figure."""
    if quality is None:
        return ""
    return f"{words.first_upper(quality.plain_words())}: {quality.figure_words()}."


def _first_quality(text: str) -> Quality | None:
    """The first figure the check wrote into a sentence kept as text (a fix saved before its
    figure was kept as a number)."""
    found = qualities_in(text)
    return found[0] if found else None


def same_row(row: LearnedRow, other: LearnedRow) -> bool:
    mine = row.stored.torch_version if row.stored else None
    theirs = other.stored.torch_version if other.stored else None
    return (row.profile_key, row.device, mine) == (other.profile_key, other.device, theirs)


def place_of(row: LearnedRow) -> tuple[str, str]:
    return row.profile_key, row.device


def torch_of(row: LearnedRow) -> str:
    if row.stored is not None:
        return row.stored.torch_version
    return row.report.torch_version if row.report is not None else ""


def cells(row: LearnedRow, with_torch: bool = False) -> list[str]:
    """The row's cells, each short (`tips` says them whole): the model, the device's short
    name (with torch's version where the model has a fix for another), the fix in the words the
    Models page uses (`words.fix_short`), and the days it was verified and last checked."""
    stored, report = row.stored, row.report
    device = short_device(row.device) + (f" · torch {torch_of(row)}" if with_torch else "")
    if stored is None:
        fix, verified = no_fix_cell(report), "—"
    else:
        fix = words.fix_short(stored.fix.settings, stored.fix.parts) or stored.fix.summary
        edited = stored.fix.edited_at
        verified = (
            f"Edited by you, {day_words(edited)}"
            if edited is not None
            else f"{words.first_upper(stored.fix.verified_by)}, {day_words(stored.fix.saved_at)}"
        )
    last = (
        f"{verdict_words(report)}, {day_words(report.saved_at)}"
        if report is not None
        else "Not checked since"
    )
    return [row.name, device, fix, verified, last]


def tips(row: LearnedRow) -> list[str]:
    """Each cell's tooltip: its text whole, and the sentence behind it."""
    stored, report = row.stored, row.report
    torch = torch_of(row)
    fix = ""
    if stored is not None:
        short = words.fix_short(stored.fix.settings, stored.fix.parts)
        fix = "\n".join(t for t in dict.fromkeys((short, stored.fix.summary)) if t)
    elif report is not None:
        fix = report.fix_summary
    return [
        "\n".join(t for t in (row.name, row.source) if t),
        row.device + (f", torch {torch}" if torch else ""),
        fix,
        verified_words(stored.fix) if stored is not None else "",
        f"{report_words(report)}: {plain_figures(report.headline)}" if report is not None else "",
    ]


def no_fix_cell(report: SavedReport | None) -> str:
    if report is not None and report.verdict is Verdict.HEALTHY and ran_only_in_fp32(report):
        return "None needed in fp32"
    if report is None or report.verdict is Verdict.HEALTHY:
        return "None needed"
    return "None remembered" if report.verdict is Verdict.FIXABLE else "None found"


def no_fix_words(report: SavedReport | None) -> str:
    """What the Fix cell of a row without a remembered fix means, in a sentence."""
    cell = no_fix_cell(report)
    if cell == "None needed in fp32":
        return (
            "none needed in fp32, the only precision the last check ran: whether fp16 or bf16 "
            "needs one is not known."
        )
    if cell == "None needed":
        return "none needed: the last check found this model safe here."
    if cell == "None remembered":
        return (
            "none remembered. The fix the check found changes only plain settings (those are "
            "set in Settings, for every model), or it was not applied."
        )
    return "none found: no precision setting makes this model run finite here."


def fix_quality(fix: RememberedFix) -> str:
    """How close the fix came to an fp32 run, in plain words, from the sentence it was saved
    with; what stands in for the figure when it holds none."""
    if fix.edited_at is not None:
        return "not measured since you edited it."
    return quality_words(_first_quality(fix.summary)) or (
        f"no figure kept: the {fix.verified_by} that proved it did not compare it with an fp32 run."
    )
