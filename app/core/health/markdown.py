"""The report as a Markdown file to paste into a bug report: versions, device, model, the
component table, the fix and every candidate tried."""

from __future__ import annotations

from pathlib import Path

from app.core.components import Verdict
from app.core.errors import HalfSafeError
from app.core.fixing import fix_ranking
from app.core.fixing.quality import QUALITY_THRESHOLD_DB
from app.core.health.report import Fix, HealthReport, precision_words, status_words
from app.core.health.words import (
    CANDIDATE_COLUMNS,
    RUN_WORDS,
    candidate_rows,
    cost_comparison,
    cost_words,
    flags,
    largest_words,
)
from app.core.words.causes import cause_words


def _fmt_number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def candidate_markdown(fix: Fix) -> str:
    rows = candidate_rows(fix.candidates, fix.baselines)
    if not rows:
        return ""
    head = "| " + " | ".join(CANDIDATE_COLUMNS) + " |\n|" + "---|" * len(CANDIDATE_COLUMNS)
    body = "\n".join("| " + " | ".join(r) + " |" for r in rows)
    return f"{head}\n{body}\n"


def markdown_report(report: HealthReport) -> str:
    """A Markdown report to paste into a bug report: versions, device, model, table, fix."""
    v = report.versions
    rows = "\n".join(
        f"| {n} | {c.dtype} | {status_words(c)} | {largest_words(c)} | "
        f"{_fmt_number(c.headroom)} | {('`' + c.first_bad_module + '`') if c.first_bad_module else '-'} "
        f"| {precision_words(c, len(report.plan.islands(n)))} |"
        for n, c in report.components.items()
    )
    fix = "None needed." if report.verdict is Verdict.HEALTHY else "None: the model is broken."
    if report.verdict is Verdict.HEALTHY and report.remembered:
        fix = (
            "None beyond the one it ran with, remembered for this model on this device: "
            f"{report.remembered}"
        )
    if report.fix:
        cost = report.fix.cost
        fix = f"{report.fix.summary}\n\nSettings: `{flags(report.fix.settings)}`"
        if cost:
            fix += (
                f"\n\nCost: {cost_words(cost.fix)} with the fix; "
                f"{cost_words(cost.no_half)} with no-half. "
                f"{cost_comparison(cost, report.fix.settings)}"
            )
        table = candidate_markdown(report.fix)
        if table:
            fix += (
                "\n\n### Candidates\n\nEvery fix tried, judged against fp32 "
                f"({QUALITY_THRESHOLD_DB:g} dB)"
                + (f" and timed on this device ({RUN_WORDS})" if report.fix.baselines else "")
                + (
                    f"; {fix_ranking.CHOSEN_WORDS}.\n\n"
                    if any(c.chosen for c in report.fix.candidates)
                    else "; none is chosen: the cause's repair replaced them.\n\n"
                )
                + table
            )
    elif report.advice is not None and report.advice.overflowing:
        fix = f"To run in fp16: `{flags(report.advice.settings)}` (not verified on this device)."
        if report.advice.layer_settings:
            fix += (
                "\n\nOr, keeping only the layers measured past fp16's range in fp32: "
                f"`{flags(report.advice.layer_settings)}` (not verified on this device)."
            )
    notes = "".join(f"- {n}\n" for n in report.notes)
    model, device = report.model, report.device
    return (
        f"# HalfSafe health check: {model.name or model.source}\n\n"
        f"**{report.headline}**\n\n"
        f"- Verdict: **{report.verdict.value}**\n"
        f"- Model: `{model.source}` ({model.architecture}, {model.format})\n"
        f"- Device: {device.name} ({device.kind})\n"
        + "".join(f"- LoRA: `{applied.name}` at {applied.weight:g}\n" for applied in report.loras)
        + (
            f"- Cause: **{report.cause.kind}**{_kernel_words(report.cause)} "
            f"({cause_words(report.cause.kind)}); repair: {report.cause.repair} "
            f"({'verified' if report.cause.verified else 'not verified'})\n"
            if report.cause is not None
            else ""
        )
        + f"- Versions: HalfSafe {v.get('halfsafe')}, torch {v.get('torch')}, diffusers "
        f"{v.get('diffusers')}" + (f", CUDA {v['cuda']}" if v.get("cuda") else "") + "\n"
        f"- Probe size: {report.size}x{report.size}, timesteps "
        f"{', '.join(map(str, report.timesteps))}; check took {report.seconds:.2f} s\n\n"
        "| component | dtype | status | max abs | headroom | first bad layer | half precisions |\n"
        "|---|---|---|---|---|---|---|\n"
        f"{rows}\n\n## Fix\n\n{fix}\n" + (f"\n## Notes\n\n{notes}" if notes else "")
    )


def write_markdown_report(report: HealthReport, path: str | Path) -> Path:
    from app.core.files import write_atomic

    try:
        return write_atomic(Path(path), markdown_report(report))
    except OSError as error:
        raise HalfSafeError(
            f"{path}: cannot write the report ({error.strerror or error})."
        ) from None


def _kernel_words(cause) -> str:
    """ " (sageattention 2.1.1)": the attention kernel a kernel cause names, if it names one."""
    blame = getattr(cause, "kernel", None)
    return f" ({blame.kernel.words()})" if blame is not None else ""
