"""What a fix costs on this device, as the user's generation will pay it beside no-half:
`StepCost` (`run.stage_cost`) for one plan's call of the part the fix changes (a denoiser
step, a VAE decode, a prompt encode), `FixCost` for the fix and no-half side by side (a `Fix`'s `cost`), and
`priced_component`, which part that is."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.core.fixing.job_plans import held, switched
from app.core.precision.plan import PrecisionPlan
from app.core.run.stage_cost import StepCost


@dataclass(frozen=True)
class FixCost:
    """A call under the fix and under no-half, measured the same way on this device.

    `no_half_as_checked`: no-half was timed computed from the stored weights (narrower than
    fp32), as the check ran its fp32 reference, where a `--no-half` generation would hold an
    fp32 copy within the budget: its figure is the check's, not the generation's, which skips
    the cast at every call (on a CPU up to twice as fast; docs/benchmarks.md)."""

    fix: StepCost
    no_half: StepCost
    no_half_as_checked: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "fix": self.fix.to_json(),
            "no_half": self.no_half.to_json(),
            "no_half_placed": "as_checked" if self.no_half_as_checked else "as_generated",
        }


def priced_component(tested: PrecisionPlan, fixed: PrecisionPlan, denoiser: str) -> str:
    """The part whose call prices the fix from `tested` to `fixed`: the denoiser where the fix
    changes it or a setting every part reads (attention, sums, autocast), else the part it
    changes (the VAE first: every picture is decoded once; a VAE fix no longer costs the
    generation anything per denoiser step)."""
    changed = [n for n in fixed.dtypes if held(fixed, n) != held(tested, n)]
    if switched(fixed, tested):
        return denoiser
    if not changed or denoiser in changed:
        return denoiser
    return "vae" if "vae" in changed else changed[0]


def price_fix(
    runner,
    tested: PrecisionPlan,
    fixed: PrecisionPlan,
    stage_fns: dict[str, Any],
    conditioning: Any,
    on_run: Any,
) -> FixCost:
    """The fix from `tested` to `fixed` priced as the user's generation pays it: one call of
    the part it changes (`priced_component`; `stage_fns`: each checked part's stage, by
    name) under the fix placed as a generation places it (`placement.as_generated`: a copy in
    its dtype where the budget has room, where the check computed its candidates from the
    stored weights), and under no-half, alternating (`Timing.stage_costs`)."""
    from app.core.fixing.job_plans import no_half
    from app.core.precision.placement import as_generated, memory_plan

    denoiser = runner.family.denoiser
    name = priced_component(tested, fixed, denoiser)
    # No-half is timed as the check runs it (from the stored weights where they are narrower,
    # as its fp32 reference ran: no copy of the whole model is made to time it); its weights
    # are stated as a generation holds them.
    plans = {"fix": as_generated(fixed), "no_half": no_half(tested)}
    # The fix's part ran in the check (its verification, or the stage after the fix was
    # found): that run was its warm-up, unless a generation holds it otherwise.
    pipeline = runner.model.pipeline
    same = memory_plan(pipeline, fixed) == memory_plan(pipeline, plans["fix"])
    warm = ["fix"] if same else []
    if name == denoiser or name not in stage_fns:
        costs = runner.timing.unet_step_costs(plans, conditioning, on_run, warm=warm)
    else:
        staged = runner.timing.stage_costs(name, stage_fns[name], plans, on_run, warm=warm)
        costs = {
            label: StepCost(
                c.step_ms or 0.0,
                c.step_ms_range or (0.0, 0.0),
                c.rounds or 0,
                c.peak_memory_mb,
                c.weights_mb,
                name,
            )
            for label, c in staged.items()
        }
    return FixCost(
        fix=costs["fix"],
        no_half=costs["no_half"],
        no_half_as_checked=held_otherwise(pipeline, plans["no_half"], name),
    )


def timed_as_checked(
    pipeline, tested: PrecisionPlan, fixed: PrecisionPlan, cost: FixCost
) -> dict[str, tuple[PrecisionPlan | None, StepCost]]:
    """What `price_fix` timed, by label, with the plan each figure is the call of as the check
    runs it: no-half as the check ran it, the fix's own plan where a generation places it as
    the check did (else None: a copy the check's rows never ran)."""
    from app.core.fixing.job_plans import no_half
    from app.core.precision.placement import as_generated, memory_plan

    same = memory_plan(pipeline, fixed) == memory_plan(pipeline, as_generated(fixed))
    return {"fix": (fixed if same else None, cost.fix), "no_half": (no_half(tested), cost.no_half)}


def held_otherwise(pipeline, plan: PrecisionPlan, name: str) -> bool:
    """Whether a generation would hold the part `name` (a pipeline name; the VAE's encoder is
    the VAE) otherwise than the check ran it under `plan`: a copy in the plan's dtype where the
    check computed it from the stored weights."""
    from app.core.components import module_of
    from app.core.precision.placement import as_generated, memory_plan

    part = module_of(name)

    def held(placed: PrecisionPlan) -> list[Any]:
        return [p for p in memory_plan(pipeline, placed) if p.component == part]

    return held(plan) != held(as_generated(plan))
