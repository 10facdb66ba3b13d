"""What a check answered, less its times (or with every candidate's cost), to hold two ways of
running the check to the same answers."""

from __future__ import annotations


def answers(report) -> dict:
    """Everything a check says but its times."""
    fix = report.fix
    return {
        "verdict": report.verdict,
        "components": {
            name: (
                c.status,
                c.first_bad_module,
                c.max_abs,
                c.headroom,
                c.wider_max_abs,
                [(b.module, b.max_abs, b.non_finite) for b in c.blocks],
                {d: (o.status, o.measured) for d, o in c.precisions.items()},
                c.fed_by,
                c.predicted_first_bad_module,  # read from the layers' inputs
            )
            for name, c in report.components.items()
        },
        "fix": None
        if fix is None
        else (fix.settings, fix.verified, fix.quality, fix.summary, fix.steps),
        "candidates": [
            (c.component, c.words, c.finite, c.quality, c.verified, c.chosen, c.modules)
            for c in report.tried
        ],
        "notes": report.notes,
        "headline": report.headline,
        "advice": report.advice,  # its islands are read from the layers' inputs
    }


def with_costs(report) -> dict:
    """The answers and every candidate's and baseline's cost."""
    fix = report.fix
    return {
        **answers(report),
        "costs": [c.cost for c in report.tried],
        "baselines": fix.baselines if fix is not None else None,
        "fix_cost": fix.cost if fix is not None else None,
    }
