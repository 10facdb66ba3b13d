"""Plain-text renderings of core results for the terminal (`halfsafe check`)."""

from __future__ import annotations

from app.core.health import (
    STATUS_WORDS,
    HealthReport,
    cost_comparison,
    cost_words,
    flags,
    precision_words,
)

_VERDICTS = {
    "healthy": "HEALTHY at the tested settings: nothing overflowed.",
    "fixable": "FIXABLE: something overflowed, and a fix was found.",
    "broken": "BROKEN: no precision setting gives finite output that agrees with fp32.",
}


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def health_text(report: HealthReport) -> str:
    """The human-readable report `halfsafe check` prints; its first line is the headline."""
    lines = [
        report.headline,
        "",
        f"Model:   {report.model['source']} ({report.model['architecture']}, {report.model['format']})",
        f"Device:  {report.device['name']} ({report.device['kind']}), probed at "
        f"{report.size}x{report.size}, timesteps {', '.join(map(str, report.timesteps))}",
        "Tested:  "
        + ", ".join(f"{k} {v}" for k, v in report.plan.dtypes.items())
        + (", upcast attention" if report.plan.upcast_attention else ""),
        "",
        f"{'component':<16}{'status':<26}{'max |x|':>10}{'headroom':>10}  first bad layer",
    ]
    for name, c in report.components.items():
        lines.append(
            f"{name:<16}{STATUS_WORDS[c.status]:<26}{_number(c.max_abs):>10}"
            f"{_number(c.headroom):>10}  {c.first_bad_module or '-'}"
        )
        where = (
            f"; first past 65504 at {c.predicted_first_bad_module}"
            if (c.predicted_first_bad_module)
            else ""
        )
        lines.append(f"{'':<16}{precision_words(c)}{where}")
    lines.append("")
    if report.weights_non_finite:
        lines.append(
            f"Damaged tensors: {', '.join(report.weights_non_finite[:5])}"
            + (" ..." if len(report.weights_non_finite) > 5 else "")
        )
    lines.append(f"Verdict: {_VERDICTS[report.verdict.value]}")
    if report.remembered:
        lines.append(f"Ran with: the fix remembered for this model: {report.remembered}")
    fix = report.fix
    if fix:
        lines.append(f"Fix:     {fix.summary}")
        lines.append(f"Apply:   {flags(fix.settings)}")
        if fix.cost:
            lines.append(
                f"Cost:    {cost_words(fix.cost.get('fix', {}))} with the fix; "
                f"{cost_words(fix.cost.get('no_half', {}))} with --no-half"
            )
            comparison = cost_comparison(fix.cost)
            if comparison:
                lines.append(f"         {comparison}")
    elif report.advice is not None and report.advice.overflowing:
        lines.append(f"For fp16: {flags(report.advice.settings)}")
    for note in report.notes:
        lines.append(f"Note:    {note}")
    lines.append(f"Checked in {report.seconds:.2f} s.")
    return "\n".join(lines)
