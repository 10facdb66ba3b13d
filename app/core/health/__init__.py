"""The model health check: which component and which layer overflows, what fp16 and bf16 would
do to each component on this device, and the cheapest fix that really works, proved by
re-running the part that failed and comparing it with an fp32 reference.

The check runs what a generation runs, only shorter: the text encoder(s) on a real prompt and
the empty prompt, the denoiser at the first, middle and last timesteps of the user's own
sampler schedule with the CFG batch, and the VAE decoding the latent that short run produced.
Every module is watched by `probe.ActivationRecorder`. A component that went non-finite gets
candidate fixes (`fix_candidates.FIX_KINDS`: backend switches, clamps, layer-level precision islands,
a whole component wider), each re-run on that component alone and judged finite or not and
against the fp32 reference; the verified ones are measured on this device, and the cheapest
(`fix_ranking.rank_candidates`) is the fix, the others shown beside it. Only the candidates that
can still be the cheapest run before the fix is named (`fix_ranking.Pruning`), each stopped at
its first non-finite call; the rest run for the table after the fix is reported. What failed
and where is said right after the first non-finite call (`Runner.telling`); `work.milestones`
counts the work done by then, by the proved fix, the verdict and the end.

One responsibility per module, each importing only those before it:
  request       what a check is asked (CheckRequest, its default prompt) and how one call of
                it runs (CheckRun), plain data without torch
  cost          what a fix costs beside no-half (StepCost, FixCost)
  words         the words for plain facts: statuses, a plan's precisions, flags, costs, the
                candidate table (shared by the CLI text, the GUI and the Markdown report)
  report        HealthReport and its parts, their JSON, the headline
  markdown      the report as a Markdown file
  stages        running the pipeline in stages under any plan (Runner), probe_run
  observations  per component: its report, what fp16 and bf16 would do, the fp16 advice
  fix           the search for a fix, the last resort, the fix in one sentence
  check         check_loaded, step by step
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.core.lazy import lazy_exports

if TYPE_CHECKING:
    from app.core.fixing.diagnosis import AT_RISK_HEADROOM
    from app.core.fixing.fix_candidates import FixCandidate, candidate_fixes
    from app.core.health.check import check_loaded
    from app.core.health.cost import FixCost, StepCost
    from app.core.health.markdown import candidate_markdown, markdown_report, write_markdown_report
    from app.core.health.observations import HALF_DTYPES
    from app.core.health.report import (
        Advice,
        ComponentReport,
        Fix,
        HealthReport,
        PrecisionOutcome,
        component_of_tensor,
        damaged_files,
        headline,
        precision_words,
        status_words,
    )
    from app.core.health.request import AS_ASKED, DEFAULT_PROMPT, QUICK, CheckRequest, CheckRun
    from app.core.health.stages import (
        DEFAULT_SCHEDULER,
        DEFAULT_STEPS,
        ProbeRun,
        probe_run,
        probe_timesteps,
    )
    from app.core.health.stages import Runner as _Runner  # benchmarks/health_check.py times stages
    from app.core.health.words import (
        CANDIDATE_COLUMNS,
        RUN_WORDS,
        STATUS_WORDS,
        VERDICT_WORDS,
        candidate_rows,
        cost_comparison,
        cost_words,
        flag,
        flags,
        headroom_words,
        layer_words,
        tested_words,
    )
    from app.core.run.timing import COST_ROUNDS

__all__ = [
    "AS_ASKED",
    "AT_RISK_HEADROOM",
    "CANDIDATE_COLUMNS",
    "COST_ROUNDS",
    "DEFAULT_PROMPT",
    "DEFAULT_SCHEDULER",
    "DEFAULT_STEPS",
    "HALF_DTYPES",
    "QUICK",
    "RUN_WORDS",
    "STATUS_WORDS",
    "VERDICT_WORDS",
    "Advice",
    "CheckRequest",
    "CheckRun",
    "ComponentReport",
    "Fix",
    "FixCandidate",
    "FixCost",
    "HealthReport",
    "PrecisionOutcome",
    "ProbeRun",
    "StepCost",
    "_Runner",
    "candidate_fixes",
    "candidate_markdown",
    "candidate_rows",
    "check_loaded",
    "component_of_tensor",
    "cost_comparison",
    "cost_words",
    "damaged_files",
    "flag",
    "flags",
    "headline",
    "headroom_words",
    "layer_words",
    "markdown_report",
    "precision_words",
    "probe_run",
    "probe_timesteps",
    "status_words",
    "tested_words",
    "write_markdown_report",
]

if not TYPE_CHECKING:  # pyright would take any name from a module with __getattr__
    __getattr__, __dir__ = lazy_exports(
        globals(),
        {
            "app.core.fixing.diagnosis": ["AT_RISK_HEADROOM"],
            "app.core.fixing.fix_candidates": ["FixCandidate", "candidate_fixes"],
            ".check": ["check_loaded"],
            ".cost": ["FixCost", "StepCost"],
            ".markdown": ["candidate_markdown", "markdown_report", "write_markdown_report"],
            ".observations": ["HALF_DTYPES"],
            ".request": ["AS_ASKED", "DEFAULT_PROMPT", "QUICK", "CheckRequest", "CheckRun"],
            ".report": [
                "Advice",
                "ComponentReport",
                "Fix",
                "HealthReport",
                "PrecisionOutcome",
                "component_of_tensor",
                "damaged_files",
                "headline",
                "precision_words",
                "status_words",
            ],
            ".stages": [
                "DEFAULT_SCHEDULER",
                "DEFAULT_STEPS",
                "ProbeRun",
                "probe_run",
                "probe_timesteps",
                "Runner as _Runner",
            ],
            "app.core.run.timing": ["COST_ROUNDS"],
            ".words": [
                "CANDIDATE_COLUMNS",
                "RUN_WORDS",
                "STATUS_WORDS",
                "VERDICT_WORDS",
                "candidate_rows",
                "cost_comparison",
                "cost_words",
                "flag",
                "flags",
                "headroom_words",
                "layer_words",
                "tested_words",
            ],
        },
    )
