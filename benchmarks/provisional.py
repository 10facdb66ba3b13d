"""A provisional proof of the fixes of a denoiser that went non-finite: each candidate re-run on
the first failing timestep alone (one denoiser call) and compared with the fp32 denoiser run on
that same timestep (one call), where the full proof (`fix.choose_fix`) runs the probe's three
timesteps for the reference and for each candidate. An experiment, measured against the full
proof by `option_b.py` beside it; the check does not run it.

The one call starts from the seeded noise at that timestep's noise level, as the probe's first
call does at the first timestep: where the denoiser first failed at a later timestep, its input
there is not the latent the probe's earlier steps made.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from app.core import work
from app.core.components import module_of
from app.core.fixing import fix_ranking
from app.core.fixing.fix_candidates import FixCandidate, candidate_fixes
from app.core.fixing.job_plans import fp32_reference
from app.core.fixing.quality import compare
from app.core.health.fix import unrun_result
from app.core.health.stages import Runner, Stage, first_bad_name
from app.core.precision import PrecisionPlan
from app.core.run.probe import ProbeResult


@dataclass
class ProvisionalProof:
    """What the provisional proof found for one failing denoiser: the call and timestep it ran,
    each candidate's row (in `candidate_fixes` order) judged as the full proof judges its own,
    and the denoiser calls each run made (a family that runs the CFG batch as two calls makes
    two a timestep)."""

    component: str
    call: int  # the first failing call of the first probe (0-based)
    timestep: float
    rows: list[fix_ranking.CandidateResult] = field(default_factory=list)
    reference_calls: int = 0
    row_calls: list[int] = field(default_factory=list)  # per row, in order

    @property
    def calls(self) -> int:
        """The denoiser calls of the whole provisional proof: the reference's and every
        candidate's."""
        return self.reference_calls + sum(self.row_calls)

    @property
    def chosen(self) -> fix_ranking.CandidateResult | None:
        """The candidate the provisional rows rank first (`fix_ranking.rank_candidates`, by
        memory and `FIX_KINDS` order: nothing is timed), None where none passed."""
        ranked = fix_ranking.rank_candidates(self.rows)
        return ranked[0] if ranked and ranked[0].verified else None

    def calls_to_choose(self) -> int:
        """The denoiser calls a provisional proof makes to name its choice: the reference's, and
        one per candidate that could still win when its turn came (`fix_ranking.Pruning`, in
        `verification_order`, as the full proof prunes its own)."""
        pruning = fix_ranking.Pruning(predicting=False)
        calls = dict(zip(map(id, self.rows), self.row_calls, strict=True))
        made = self.reference_calls
        for row in fix_ranking.verification_order(self.rows):
            if pruning.could_win(row):
                made += calls[id(row)]
                pruning.add(row)
        return made


def first_failing_call(probe: ProbeResult) -> int:
    """The 0-based component call in which `probe` first went non-finite. A lean probe names
    it; a probe recorded in full is read from its modules' completion order: every call of the
    component completes the same modules, the component itself last (its `order` + 1 of them a
    call). 0 where neither says (nothing went non-finite)."""
    if probe.first_bad_call is not None:
        return probe.first_bad_call
    root = probe.modules.get("")
    bad = [m.first_bad for m in probe.modules.values() if m.first_bad is not None]
    if root is None or not bad:
        return 0
    return min(bad) // (root.order + 1)


def provisional_proof(
    runner: Runner,
    name: str,
    conditioning: Any,
    probe: ProbeResult,
    tested: PrecisionPlan,
    bf16_native: bool,
) -> ProvisionalProof:
    """The provisional proof of the denoiser `name`, which went non-finite in its first probe
    (`probe`) under the `tested` plan on `conditioning`: the fp32 reference run on the first
    failing timestep alone, the candidates drawn from it (`candidate_fixes`, as the full proof
    draws them from its three-step reference), each run on that timestep and judged finite and
    against the reference (`quality.compare`). Runs on the calling thread through the runner's
    own denoiser stage; the calls are counted into a record of their own (`work.counting`),
    not the running job's."""
    call = first_failing_call(probe)
    timestep = runner.timesteps[min(call, len(runner.timesteps) - 1)]
    proof = ProvisionalProof(name, call, timestep)
    with work.counting() as counted:
        with runner.recording_in_full():  # its record draws the candidates
            reference = runner.denoise(fp32_reference(tested), conditioning, True, [timestep])
        proof.reference_calls = counted.calls_of(name)
        candidates = candidate_fixes(
            module_of(name),
            tested,
            first_bad_name(probe),
            getattr(runner.model.pipeline, module_of(name)),
            bf16_native,
            reference.probes.get(name),
        )
        for candidate in candidates:
            before = counted.calls_of(name)
            # As the full proof runs a candidate: one that goes non-finite is not run again
            # under the full recorder to name its layer (`Runner.stopping_at_bad`).
            with runner.stopping_at_bad(name):
                stage = runner.denoise(candidate.plan, conditioning, True, [timestep])
            proof.rows.append(_row(runner, name, candidate, stage, reference, tested))
            proof.row_calls.append(counted.calls_of(name) - before)
    return proof


def _row(
    runner: Runner,
    name: str,
    candidate: FixCandidate,
    stage: Stage,
    reference: Stage,
    tested: PrecisionPlan,
) -> fix_ranking.CandidateResult:
    """A candidate's provisional row: its row before it runs (`fix.unrun_result`: its memory
    the plan's, as an untimed full proof ranks it), finite when nothing in its one call went
    non-finite (as the full proof reads its re-run's record), its quality against the
    reference's."""
    finite = not stage.probes[name].non_finite
    return replace(
        unrun_result(name, candidate, runner.model.pipeline, tested),
        finite=finite,
        quality=compare(stage.output, reference.output) if finite else None,
    )
