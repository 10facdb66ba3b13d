"""Saved health reports: the last finished check of each model on each device, kept across
restarts and model loads, for the Health check and Fixes pages to show again.

Each report is a file of its own, `reports/<digest>.json` in the data folder, named by a digest
of the model's profile key (the identity remembered fixes are keyed by) and the device's name,
so a damaged file costs only itself. Files are written atomically under `reports.lock`; at most
MAX_SAVED_REPORTS are kept (the oldest make room), each at most MAX_REPORT_BYTES with its
Markdown cut at MAX_MARKDOWN_CHARS. They are read back file by file, bounded before any JSON is
parsed and checked field by field; a damaged file is moved aside (`<name>.damaged-<time>`),
never overwritten, and said in one sentence. Other files in the folder are passed over, up to
MAX_FOLDER_ENTRIES entries in all; a listing that had to leave reports out says so. No torch
here: the GUI reads these files itself.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from app.core import paths
from app.core.components import Verdict
from app.core.files import aside_name, locked, write_atomic
from app.core.fixing.quality import Quality
from app.core.formats.forms import stored_form
from app.core.health.report import CheckResult
from app.core.limits import parse_json, read_regular
from app.core.precision.words import plan_words
from app.core.settings import shown

REPORTS_FOLDER = "reports"
# A report's Markdown is some 2-20 KB: 500 of them are a few MB on disk.
MAX_SAVED_REPORTS = 500
MAX_MARKDOWN_CHARS = 200_000
MAX_REPORT_BYTES = 1 << 20
MAX_TEXT_CHARS = 4000  # a name, a path, a device, a headline, a fix's summary
# Entries of the folder looked at when listing it: it holds HalfSafe's files, but other files
# may be put there (thousands of them cost milliseconds to pass over); past this many, the
# listing stops and says so, so that a folder of millions never holds up the Fixes page.
MAX_FOLDER_ENTRIES = 100_000
# seconds since 1970; a time past this (the year 5138) is damage.
LATEST_TIME = 1e11
_FILE_NAME = re.compile(r"[0-9a-f]{32}\.json")
_TEXTS = ("profile_key", "device", "model_name", "source", "headline", "fix_summary")
# Absent from older files.
_OPTIONAL_TEXTS = ("torch_version", "ran_at", "fix_runs_at", "architecture", "stored_form")
_OPTIONAL_NUMBERS = ("fix_quality_db", "fix_quality_threshold_db")  # likewise


@dataclass(frozen=True)
class SavedReport:
    """One finished check as it was saved: whom it is about, its verdict and headline, the fix
    it found (in the check's words; empty when none) and the whole report as Markdown."""

    profile_key: str
    device: str
    model_name: str
    source: str
    verdict: Verdict
    headline: str
    fix_summary: str
    markdown: str
    saved_at: float
    torch_version: str = ""
    # The precision the check ran at and, for a fixable model, the one its fix runs at, in the
    # one words table (`precision.words.plan_words`): a page shows the headline only while the
    # next job runs at one of them. Empty in a report saved before they were kept.
    ran_at: str = ""
    fix_runs_at: str = ""
    # The fix's agreement with fp32 as numbers (`quality.Quality`): what the pages say of
    # it, without reading the figure back out of `fix_summary`. None when the fix had no
    # finite figure, or in a report saved before they were kept.
    fix_quality_db: float | None = None
    fix_quality_threshold_db: float | None = None
    # The model's architecture ("flux-dev") and the form its files store it in (`formats.forms`:
    # "bf16", "fp8", "gguf-q4_k", ...; "" for none of the published forms): which file the check
    # proved on this device (`advice`). Empty in a report saved before they were kept.
    architecture: str = ""
    stored_form: str = ""

    @property
    def fix_quality(self) -> Quality | None:
        if self.fix_quality_db is None or self.fix_quality_threshold_db is None:
            return None
        return Quality(self.fix_quality_db, threshold=self.fix_quality_threshold_db)

    def holds_at(self, precision: str) -> bool | None:
        """Whether the headline is about a job run at `precision` (said in the same words);
        None when the report does not say what it ran at."""
        if not self.ran_at:
            return None
        return precision in (self.ran_at, self.fix_runs_at)


@dataclass(frozen=True)
class SavedReports:
    """Every saved report that could be read, newest first, and one sentence per damaged file
    (moved aside) and for reports left out of the listing."""

    reports: list[SavedReport]
    notes: list[str] = field(default_factory=list)


def folder() -> Path:
    return paths.data_dir() / REPORTS_FOLDER


def _file(profile_key: str, device: str) -> Path:
    digest = hashlib.sha256(f"{profile_key}\0{device}".encode()).hexdigest()[:32]
    return folder() / f"{digest}.json"


# Writing ----------------------------------------------------------------------------------


def save_report(profile_key: str, result: CheckResult) -> SavedReport | None:
    """Keep `result` as the last report of this model on the device it ran on, replacing the
    one before; past MAX_SAVED_REPORTS the oldest are removed. Returns what was saved, or None
    for a model without a profile key (nothing to file it under). Raises OSError when the file
    cannot be written (the reports already saved are untouched)."""
    if not profile_key:
        return None
    report = result.report
    saved = SavedReport(
        profile_key=profile_key,
        device=_bounded(report.device.name),
        model_name=_bounded(report.model.name),
        source=_bounded(report.model.source),
        verdict=report.verdict,
        headline=_bounded(report.headline),
        fix_summary=_bounded(report.fix.summary if report.fix is not None else ""),
        markdown=_cut(result.markdown, MAX_MARKDOWN_CHARS),
        saved_at=time.time(),
        torch_version=_bounded(report.versions.get("torch")),
        ran_at=_bounded(plan_words(report.plan)),
        fix_runs_at=_bounded(plan_words(report.fix.plan) if report.fix is not None else ""),
        architecture=_bounded(report.model.architecture),
        stored_form=stored_form(report.model.quantization),
    )
    quality = report.fix.quality if report.fix is not None else None
    if quality is not None and math.isfinite(quality.value):
        saved = replace(
            saved, fix_quality_db=quality.value, fix_quality_threshold_db=quality.threshold
        )
    saved, text = _fitted(saved)
    with locked(folder()):
        write_atomic(_file(saved.profile_key, saved.device), text)
        _prune()
    return saved


def forget_report(profile_key: str, device: str) -> None:
    """Remove the report saved for this model on this device, if any."""
    with locked(folder()):
        _file(profile_key, device).unlink(missing_ok=True)


def _bounded(text: Any) -> str:
    return str(text or "")[:MAX_TEXT_CHARS]


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + _cut_note(limit)


def _cut_note(limit: int) -> str:
    return f"\n\n(The rest of this report, past {limit:,} characters, was not saved.)\n"


def _fitted(saved: SavedReport) -> tuple[SavedReport, str]:
    """The report and its file's text within MAX_REPORT_BYTES: a Markdown of wide characters is
    cut further."""
    limit = MAX_MARKDOWN_CHARS
    text = _dumps(saved)
    while len(text.encode("utf-8")) > MAX_REPORT_BYTES:
        limit //= 2
        saved = replace(saved, markdown=_cut(saved.markdown, limit))
        text = _dumps(saved)
    return saved, text


def _dumps(saved: SavedReport) -> str:
    document = {**asdict(saved), "verdict": saved.verdict.value}
    return json.dumps(document, indent=1, ensure_ascii=False) + "\n"


def _prune() -> None:
    """Remove the oldest reports past MAX_SAVED_REPORTS (by the time each file was written).
    Call under the lock."""
    files = sorted(_report_files().files, key=lambda item: item[1], reverse=True)
    for path, _written in files[MAX_SAVED_REPORTS:]:
        path.unlink(missing_ok=True)


# Reading ----------------------------------------------------------------------------------


def saved_reports() -> SavedReports:
    """Every saved report (the newest MAX_SAVED_REPORTS files), newest first. Never raises for
    a bad file: it is moved aside and named in a note. Files that are not reports are passed
    over; reports left out (past MAX_SAVED_REPORTS, or in a folder of more than
    MAX_FOLDER_ENTRIES entries) are said in a note."""
    reports: list[SavedReport] = []
    listing = _report_files()
    notes = listing.notes()
    newest = sorted(listing.files, key=lambda item: item[1], reverse=True)
    if len(newest) > MAX_SAVED_REPORTS:
        older = len(newest) - MAX_SAVED_REPORTS
        notes.append(
            f"{older:,} older saved {'report' if older == 1 else 'reports'} in {folder()} "
            f"{'is' if older == 1 else 'are'} not listed: only the newest "
            f"{MAX_SAVED_REPORTS} are."
        )
    for path, _written in newest[:MAX_SAVED_REPORTS]:
        saved, note = _read_repairing(path)
        if saved is not None:
            reports.append(saved)
        if note is not None:
            notes.append(note)
    reports.sort(key=lambda saved: saved.saved_at, reverse=True)
    return SavedReports(reports, notes)


def last_report(profile_key: str, device: str | None = None) -> SavedReport | None:
    """The report saved for this model on `device` (None: on whichever device checked it
    last), or None. A damaged file is moved aside and counts as none."""
    if not profile_key:
        return None
    if device is not None:
        return _read_repairing(_file(profile_key, device))[0]
    mine = [r for r in saved_reports().reports if r.profile_key == profile_key]
    return mine[0] if mine else None


@dataclass
class _Listing:
    """The report files found in the folder, and what kept any from being looked at."""

    files: list[tuple[Path, float]] = field(default_factory=list)  # (path, time written)
    unlooked: bool = False  # the folder held more than MAX_FOLDER_ENTRIES entries
    problem: str = ""  # why the folder itself cannot be read

    def notes(self) -> list[str]:
        """One sentence for each way reports were left out of the listing."""
        notes = []
        if self.problem:
            notes.append(
                f"The saved reports in {folder()} could not all be listed ({self.problem})."
            )
        if self.unlooked:
            notes.append(
                f"Some saved reports may not be listed: {folder()} holds more than "
                f"{MAX_FOLDER_ENTRIES:,} files, and only the first {MAX_FOLDER_ENTRIES:,} "
                "were looked at (moving the files that are not reports out of it lists them "
                "all)."
            )
        return notes


def _report_files() -> _Listing:
    """The report files in the folder with the time each was written, looking at no more than
    MAX_FOLDER_ENTRIES entries (any other file is passed over by its name alone)."""
    listing = _Listing()
    try:
        entries = os.scandir(folder())
    except FileNotFoundError:
        return listing  # nothing saved yet
    except OSError as error:
        listing.problem = str(error.strerror or error)
        return listing
    with entries:
        for number, entry in enumerate(_entries(entries, listing)):
            if number >= MAX_FOLDER_ENTRIES:
                listing.unlooked = True
                break
            if not _FILE_NAME.fullmatch(entry.name):
                continue
            try:
                written = entry.stat().st_mtime
            except FileNotFoundError:
                continue  # removed meanwhile (forgotten, pruned)
            except OSError:
                written = 0.0  # a link loop, say: reading it says what is wrong
            listing.files.append((Path(entry.path), written))
    return listing


def _entries(entries: Iterator[os.DirEntry[str]], listing: _Listing) -> Iterator[os.DirEntry[str]]:
    """The folder's entries; a read of the folder failing half-way is said, not raised."""
    try:
        yield from entries
    except OSError as error:
        listing.problem = str(error.strerror or error)


def _read_repairing(path: Path) -> tuple[SavedReport | None, str | None]:
    """The report in `path` (None when there is none), and the note when it was damaged. A
    damaged file is moved aside under the lock, after reading it again there (another process
    may have just replaced it)."""
    saved, problem = _read(path)
    if problem is None:
        return saved, None
    try:
        with locked(folder()):
            saved, problem = _read(path)
            if problem is None:
                return saved, None
            target = aside_name(path)
            os.replace(path, target)
    except OSError as error:
        return None, (
            f"{path} is damaged ({problem}) and is left as it is because it could not be moved "
            f"aside ({error.strerror or error}); the other saved reports are kept."
        )
    return None, (
        f"{path} was damaged ({problem}); it is kept as {target}, and the other saved reports "
        "are kept."
    )


def _read(path: Path) -> tuple[SavedReport | None, str | None]:
    """The report in one file, or the reason it cannot be read (no file: neither)."""
    if not os.path.lexists(path):
        return None, None
    try:
        document = parse_json(read_regular(path, MAX_REPORT_BYTES))
    except OSError as error:
        return None, error.strerror or str(error)
    except ValueError as error:
        return None, str(error)
    problem = _problem(path, document)
    if problem is not None:
        return None, problem
    return _report_from(document), None


def _problem(path: Path, document: Any) -> str | None:
    """What is wrong with one decoded file, or None when it is a report HalfSafe wrote."""
    if not isinstance(document, dict):
        return "it is not a JSON object"
    for name in _TEXTS:
        value = document.get(name)
        if not isinstance(value, str) or len(value) > MAX_TEXT_CHARS:
            return f"'{name}' is {shown(value)}, not a text"
    if not document["profile_key"]:
        return "it names no model"
    markdown = document.get("markdown")
    if not isinstance(markdown, str) or len(markdown) > MAX_MARKDOWN_CHARS + len(
        _cut_note(MAX_MARKDOWN_CHARS)
    ):
        return "'markdown' is not the text of a report"
    if document.get("verdict") not in {v.value for v in Verdict}:
        return f"'verdict' is {shown(document.get('verdict'))}"
    saved_at = document.get("saved_at")
    if (
        not isinstance(saved_at, int | float)
        or isinstance(saved_at, bool)
        or not 0 <= saved_at <= LATEST_TIME
    ):
        return f"'saved_at' is {shown(saved_at)}, not a time"
    for name in _OPTIONAL_TEXTS:
        value = document.get(name, "")
        if not isinstance(value, str) or len(value) > MAX_TEXT_CHARS:
            return f"'{name}' is {shown(value)}, not a text"
    for name in _OPTIONAL_NUMBERS:
        value = document.get(name)
        if value is not None and (
            not isinstance(value, int | float)
            or isinstance(value, bool)
            or not -1e6 <= value <= 1e6
        ):
            return f"'{name}' is {shown(value)}, not a figure in dB"
    if path.name != _file(document["profile_key"], document["device"]).name:
        return "it is filed under another model's or device's name"
    return None


def _report_from(document: dict[str, Any]) -> SavedReport:
    figures: dict[str, Any] = {
        name: float(document[name]) for name in _OPTIONAL_NUMBERS if document.get(name) is not None
    }
    return SavedReport(
        **{name: document[name] for name in _TEXTS},
        verdict=Verdict(document["verdict"]),
        markdown=document["markdown"],
        saved_at=float(document["saved_at"]),
        **{name: _bounded(document.get(name)) for name in _OPTIONAL_TEXTS},
        **figures,
    )


def when_words(seconds: float) -> str:
    """'23 Nov 2026, 17:20' (local time) for a time saved in seconds since 1970."""
    return time.strftime("%d %b %Y, %H:%M", time.localtime(seconds))
