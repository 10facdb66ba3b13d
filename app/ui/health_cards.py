"""The Health check page's report, as cards: the fix with its measured cost and every candidate
tried, damaged weights, a card per model part with its chart (the part that failed first at the
top), the report's notes, and the last report as saved."""

from __future__ import annotations

import html
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QGridLayout, QLabel, QPushButton, QWidget

from app.core.components import Status
from app.core.fixing.fix_ranking import CHOSEN_WORDS
from app.core.health import (
    CANDIDATE_COLUMNS,
    RUN_WORDS,
    STATUS_WORDS,
    ComponentReport,
    Fix,
    FixCost,
    HealthReport,
    candidate_rows,
    headroom_words,
    precision_words,
)
from app.core.health.words import FROM_THE_FIX_WORDS, call_words
from app.core.precision.words import plan_words
from app.ui import words
from app.ui.chart import ActivationChart
from app.ui.health_words import cost_comparison_words
from app.ui.widgets import Card, Chip, hline, label

# The order of the parts' cards: what failed first, then what came close, then the rest.
_SEVERITY = {
    Status.BROKEN_WEIGHTS: 0,
    Status.NAN: 0,
    Status.OVERFLOW: 0,
    Status.AT_RISK: 1,
    Status.OK: 2,
}


@dataclass
class ReportCards:
    """A report's widgets in page order, with the cards and charts by part name and each
    candidate's "Apply instead" (its settings in its `fix_settings` property)."""

    widgets: list[QWidget] = field(default_factory=list)
    cards: dict[str, Card] = field(default_factory=dict)
    charts: dict[str, ActivationChart] = field(default_factory=dict)
    alternative_buttons: list[Any] = field(default_factory=list)


def report_cards(report: HealthReport, apply_fix: Callable[[dict[str, Any]], None]) -> ReportCards:
    """The widgets that show `report` under its verdict; `apply_fix` takes the settings of the
    candidate whose "Apply instead" is clicked."""
    built = ReportCards()
    if report.fix is not None:
        built.widgets.append(_fix_card(report.fix, apply_fix, built.alternative_buttons))
    bad_weights = report.weights_non_finite
    if bad_weights:
        card = Card("Damaged weights")
        card.header.addWidget(Chip("Broken file", "bad"))
        shown = ", ".join(bad_weights[:5]) + (" …" if len(bad_weights) > 5 else "")
        card.body.addWidget(
            label(
                f"{len(bad_weights)} stored tensors hold NaN or infinite values ({shown}). "
                "The file is damaged; no precision setting can repair it. Download it again.",
                wrap=True,
                selectable=True,
            )
        )
        built.widgets.append(card)
    # The part that failed first: that is what the user came to see. Otherwise pipeline order.
    components = sorted(report.components.items(), key=lambda item: _SEVERITY[item[1].status])
    for name, component in components:
        card = _component_card(name, component, report, built.charts)
        built.cards[name] = card
        built.widgets.append(card)
    if report.notes:
        notes = "<br>".join(f"• {html.escape(n)}" for n in report.notes)
        built.widgets.append(label(notes, "muted", wrap=True))
    return built


def saved_report_card(markdown: str) -> Card:
    """The last check's report as it was saved (its Markdown: every part's figures, the fix,
    the candidates), shown after a restart; its own title line is the card's."""
    card = Card("The last report, as saved")
    body = markdown.split("\n", 1)[1] if markdown.startswith("# ") else markdown
    text = QLabel()
    text.setTextFormat(Qt.TextFormat.MarkdownText)
    text.setText(body.strip())
    text.setWordWrap(True)
    text.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    card.body.addWidget(text)
    return card


def _component_card(
    name: str,
    component: ComponentReport,
    report: HealthReport,
    charts: dict[str, ActivationChart],
) -> Card:
    """One part's card: its status, largest value against fp16's limit, headroom, the first
    layer to go wrong, each half precision, and its chart (added to `charts`)."""
    status = component.status
    card = Card(words.component_name(name))
    role = words.COMPONENT_ROLES.get(name)
    if role:
        card.header.insertWidget(1, label(f"— {role}", "muted"))
    dtype = component.dtype
    fp16 = component.precisions.get("fp16")
    if component.fed_by and not status.failed:  # not its own fault
        chip = Chip(words.fed_by_words(component.fed_by), "muted")
    elif status is Status.OK and dtype != "fp16" and fp16 is not None and fp16.status.failed:
        # Fine as run, but not in the precision most users move to: never a plain green Ok.
        chip = Chip(f"Ok in {dtype}; fp16 {STATUS_WORDS[fp16.status]}", "warn")
    else:
        chip = Chip(words.first_upper(STATUS_WORDS[status]), words.STATUS_LEVEL[status])
    card.header.addWidget(chip)
    if component.wider_max_abs is not None:
        largest = (
            f"Largest value held in fp16: <b>{words.big_number(component.max_abs)}</b> — the "
            "fp16 limit is 65,504. The layers kept wider reached "
            f"{words.big_number(component.wider_max_abs)}, which their precision holds."
        )
    else:
        # A part that went non-finite has its largest value from the run that fixed it:
        # its own run in fp16 held no finite one that large.
        run = FROM_THE_FIX_WORDS if status.failed else f"run in {dtype}"
        largest = (
            f"Largest value: <b>{words.big_number(component.max_abs)}</b>"
            + (f" ({run})" if dtype else "")
            + " — the fp16 limit is 65,504."
        )
    facts = [largest, html.escape(headroom_words(component.headroom, status))]
    first_bad = component.first_bad_module
    if first_bad:
        facts.append(
            f"First layer to go wrong: {html.escape(words.describe_module(name, first_bad))}"
            f" (<code>{html.escape(first_bad)}</code>)."
        )
    if component.precisions:
        said = precision_words(component, len(report.plan.islands(name)))
        facts.append("In each half precision: " + html.escape(said) + ".")
    predicted = component.precisions.get("fp16")
    if predicted is not None and not predicted.measured and predicted.status is not Status.OK:
        where = component.predicted_first_bad_module
        facts.append(
            f"Tested in {dtype}; in fp16 it would "
            + ("overflow" if predicted.status is Status.OVERFLOW else "come close to overflowing")
            + (f", first at {html.escape(words.describe_module(name, where))}" if where else "")
            + "."
        )
    card.body.addWidget(label("<br>".join(facts), wrap=True))
    if component.blocks:
        chart = ActivationChart()
        chart.set_blocks(component.blocks)
        charts[name] = chart
        card.body.addWidget(chart)
    return card


def _fix_card(
    fix: Fix, apply_fix: Callable[[dict[str, Any]], None], alternative_buttons: list[Any]
) -> Card:
    """The fix: what it does, how close it comes to fp32, what it runs as and changes, its
    measured cost, and every candidate tried (each "Apply instead" added to
    `alternative_buttons`)."""
    card = Card("The fix")
    card.header.addWidget(
        Chip(
            "Verified" if fix.verified else "Not verified",
            "good" if fix.verified else "warn",
        )
    )
    quality = fix.quality
    if quality is None:
        card.body.addWidget(label(html.escape(fix.summary), wrap=True, rich=True))
    else:
        # The check's data, said in the one table's words (`quality.Quality`).
        words_, figure = quality.plain_words(), quality.figure_words()
        summary = fix.summary.replace(quality.words(), words_)
        card.body.addWidget(label(html.escape(summary), wrap=True, rich=True))
        card.body.addWidget(
            label(
                f"Against full precision (fp32): <b>{words_}</b> ({html.escape(figure)})",
                wrap=True,
            )
        )
    card.body.addWidget(label(f"Runs as: <b>{html.escape(plan_words(fix.plan))}</b>", wrap=True))
    settings = dict(fix.settings)
    if settings:
        card.body.addWidget(
            label(
                "Settings it changes: <b>" + html.escape(words.settings_listed(settings)) + "</b>",
                wrap=True,
            )
        )
    if fix.cost:
        card.body.addWidget(hline())
        card.body.addWidget(label("Measured cost", "muted"))
        card.body.addLayout(_cost_grid(fix.cost))
        comparison = cost_comparison_words(fix.cost, fix.settings)
        if comparison:
            card.body.addWidget(label(comparison, wrap=True))
    if fix.candidates:
        card.body.addWidget(hline())
        card.body.addWidget(
            label(
                "Every fix tried, judged against fp32 and measured on this device "
                f"({CHOSEN_WORDS}; any other verified one can be applied instead). Times "
                f"are in {RUN_WORDS}.",
                "muted",
                wrap=True,
            )
        )
        card.body.addLayout(_candidate_grid(fix, apply_fix, alternative_buttons))
    return card


def _candidate_grid(
    fix: Fix, apply_fix: Callable[[dict[str, Any]], None], alternative_buttons: list[Any]
) -> QGridLayout:
    """The candidates table (core's rows, the CLI's and the report's), with an "Apply
    instead" button on each verified candidate that was not chosen."""
    grid = QGridLayout()
    grid.setHorizontalSpacing(16)
    for column, text in enumerate(CANDIDATE_COLUMNS):
        grid.addWidget(label(text, "muted", wrap=True), 0, column)
    candidates = iter(fix.candidates)
    for row, cells in enumerate(candidate_rows(fix.candidates, fix.baselines), start=1):
        for column, text in enumerate(cells):
            cell = QLabel(words.breakable(text))
            cell.setWordWrap(True)  # a timing's range goes under it: the table fits 1024 px
            grid.addWidget(cell, row, column)
        if cells[4] == "baseline":
            continue
        candidate = next(candidates)
        if candidate.verified and not candidate.chosen:
            button = QPushButton("Apply instead")
            button.setToolTip(words.settings_listed(candidate.settings))
            settings = dict(candidate.settings)
            button.clicked.connect(lambda _=False, s=settings: apply_fix(s))
            button.setProperty("fix_settings", settings)
            grid.addWidget(button, row, len(CANDIDATE_COLUMNS))
            alternative_buttons.append(button)
    grid.setColumnStretch(1, 1)
    return grid


def _cost_grid(cost: FixCost) -> QGridLayout:
    """The fix's step time, peak memory and weights beside everything in fp32."""
    grid = QGridLayout()
    grid.setHorizontalSpacing(24)
    headers = ("", f"Time per {call_words(cost.fix)}", "Peak GPU memory", "Weights")
    for column, text in enumerate(headers):
        grid.addWidget(label(text, "muted"), 0, column)
    rows = (("With the fix", cost.fix), ("Everything in fp32 (no-half)", cost.no_half))
    for row, (name, values) in enumerate(rows, start=1):
        grid.addWidget(QLabel(name), row, 0)
        grid.addWidget(QLabel(words.milliseconds(values.step_ms)), row, 1)
        grid.addWidget(QLabel(words.megabytes(values.peak_memory_mb)), row, 2)
        grid.addWidget(QLabel(words.megabytes(values.weights_mb)), row, 3)
    grid.setColumnStretch(4, 1)
    return grid
