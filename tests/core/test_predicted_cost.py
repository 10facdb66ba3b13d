"""Candidates predicted before timed: the fix search ranks the verified candidates alike in memory
by their steps predicted from the work and the device's dtype table where the predictions tell
the ranking's verdict (apart by more than its tenth plus the prediction's error), and times them
only where they do not. The table is injected (fixed), and the timing is an oracle that agrees
with it, so that neither the answers nor the counts depend on this machine."""

from __future__ import annotations

import pytest
import torch

from app.core import health, work
from app.core.fixing import fix_ranking
from app.core.hardware.dtype_speed import DtypeSpeed
from app.core.health import fix, step_work
from app.core.health.cost import StepCost
from app.core.health.step_work import module_flops, plan_seconds
from app.core.precision import plan_weights_mb
from app.core.run import timing
from app.core.run.stage_cost import StageCost
from tests.support.check_answers import with_costs
from tests.support.planted_sd import check, plant, stored_in_fp16
from tests.support.tiny_models import build_tiny_sd_pipeline


def _table(fp16: float, bf16: float) -> DtypeSpeed:
    """A device whose fp16 and bf16 run at these rates (GFLOP/s and G weights/s alike), fp32 at
    half fp16's, casting at bf16's: slow enough that the tiny model's work takes longer than any
    machine's call of it (the prediction stands for the call, `step_work.EXPLAINED`)."""
    rates = {"fp16": fp16, "bf16": bf16, "fp32": fp16 / 2}
    kinds = ("matmul", "conv", "matmul_weights", "conv_weights", "cast")
    return DtypeSpeed("fixed", {d: dict.fromkeys(kinds, r) for d, r in rates.items()})


# bf16 twenty times fp16's rate: the bf16 copy is predicted far faster than fp16 with layers
# in bf16, beyond the band and the error. bf16 at 1.1 times fp16's rate: inside it.
APART = _table(1e-3, 2e-2)
INSIDE = _table(1e-3, 1.1e-3)


def _oracle(table: DtypeSpeed, timed: list[str]):
    """`Timing.stage_costs` and `unet_step_costs` on a device that runs each plan exactly as
    `table` predicts (ranges of 1% either side); the labels timed are kept in `timed`."""
    flops: dict = {}

    def ms(runner, plan) -> float:
        if not flops:  # the tiny UNet's work, counted on one of its own (the loaded one never runs)
            unet = build_tiny_sd_pipeline().unet
            channels, context = unet.config.in_channels, unet.config.cross_attention_dim
            flops.update(
                module_flops(
                    unet,
                    lambda m: m(
                        torch.randn(2, channels, 8, 8),
                        torch.tensor(500.0),
                        torch.randn(2, 77, context),
                    ),
                )
            )
        seconds = plan_seconds(table, flops, runner.model.pipeline, plan, "unet")
        assert seconds is not None
        return round(seconds * 1000, 2)

    def stage_costs(self, name, stage_fn, plans, on_run=timing.no_runs, warm=()):
        timed.extend(plans)
        work.add("timed_runs", timing.COST_ROUNDS * len(plans))  # as `_alternating` counts
        return {
            label: StageCost(
                round(plan_weights_mb(plan, self.model.pipeline), 2),
                ms(self, plan),
                (ms(self, plan) * 0.99, ms(self, plan) * 1.01),
                timing.COST_ROUNDS,
            )
            for label, plan in plans.items()
        }

    def unet_step_costs(self, plans, conditioning, on_run=timing.no_runs, warm=()):
        return {
            label: StepCost(
                ms(self, plan),
                (ms(self, plan) * 0.99, ms(self, plan) * 1.01),
                timing.COST_ROUNDS,
                None,
                round(plan_weights_mb(plan, self.model.pipeline), 1),
            )
            for label, plan in plans.items()
        }

    return stage_costs, unet_step_costs


def _check(table: DtypeSpeed, predicted: bool, prune: bool = True, quick: bool = False):
    """The planted UNet fault stored in fp16, checked in fp16 as on a CPU with native bf16, the
    candidates timed by the oracle of `table`; with `predicted` the table is the device's too.
    Returns the report and the labels timed before the fix was proved."""
    timed: list[str] = []
    stage_costs, unet_step_costs = _oracle(table, timed)
    with pytest.MonkeyPatch.context() as patched:
        patched.setenv("HALFSAFE_CPU_BF16", "native")
        patched.setattr(timing.Timing, "stage_costs", stage_costs)
        patched.setattr(timing.Timing, "unet_step_costs", unet_step_costs)
        patched.setattr(fix, "PRUNE_CANDIDATES", prune)
        if predicted:
            patched.setattr(step_work, "device_speed", lambda device: table)
        proved: list[str] = []

        def progress(stage, done, total) -> None:
            if str(stage).startswith("Fix proved: ") and not proved:
                proved.extend(timed)

        report = check(
            stored_in_fp16(plant(build_tiny_sd_pipeline(), "unet_ff")),
            measure_cost=not quick,  # `--quick`: neither timed nor tabled after the proof
            remember=False,
            on_progress=progress,
            complete_table=not quick,
        )
    return report, proved


def _chosen(report) -> str:
    return next(c.kind for c in report.tried if c.chosen)


def test_a_prediction_apart_ranks_the_candidates_without_timing_them():
    """bf16 far faster on this device: the bf16 copy and the layers kept in bf16 are predicted
    apart beyond the band and the error, so the bf16 copy is the fix, and nothing is timed
    before it is proved. Without the table nothing tells them apart: the layers kept in bf16
    change fewer layers and are the fix, timed or not."""
    unpredicted, unpredicted_before = _check(APART, predicted=False)
    report, before = _check(APART, predicted=True)
    assert _chosen(report) == "component_bf16"  # predicted a tenth faster, beyond the error
    assert _chosen(unpredicted) == "islands"  # the oracle times the bf16 copy far faster
    assert before == unpredicted_before == []
    proved, unpredicted_proved = report.work.at("proved_fix"), unpredicted.work.at("proved_fix")
    assert proved is not None and unpredicted_proved is not None
    assert proved.timed_runs == unpredicted_proved.timed_runs == 0
    assert proved.predicted_costs == 2 and unpredicted.work.predicted_costs == 0
    rows = {c.kind: c.cost for c in report.tried}
    assert rows["component_bf16"].predicted_ms < rows["islands"].predicted_ms * 0.5
    assert rows["islands"].step_ms is None  # ranked by its prediction, never timed
    document = report.to_json()["fix"]["candidates"]
    assert any("predicted_step_ms" in c["cost"] for c in document)
    shown = health.candidate_rows(report.fix.candidates, {})
    assert any("(predicted)" in cell for row in shown for cell in row)
    # After the proof the fix's cost is timed, and its row shows that figure.
    (fix_row,) = [c for c in unpredicted.tried if c.chosen]
    assert fix_row.cost.step_ms == unpredicted.fix.cost.fix.step_ms


def test_predictions_inside_the_band_leave_the_order_to_what_each_holds_and_changes():
    """bf16 a tenth faster on this device: inside the band plus the error, so neither is timed
    before the fix is proved; the layers kept in bf16, changing fewer layers, are the fix. The
    part in bf16, its step predicted before it runs from the work the layers' run counted, can
    beat nothing met before it: it runs after the proof, for the table alone."""
    report, before = _check(INSIDE, predicted=True)
    assert before == []
    proved = report.work.at("proved_fix")
    assert proved is not None and proved.timed_runs == 0 and proved.predicted_costs == 1
    assert _chosen(report) == "islands"
    rows = {c.kind: c for c in report.tried}
    assert rows["islands"].layers_changed < rows["component_bf16"].layers_changed
    assert rows["component_bf16"].verified and rows["component_bf16"].cost.predicted_ms


@pytest.mark.parametrize("table", [APART, INSIDE], ids=["apart", "inside"])
def test_a_quick_check_names_the_fix_the_whole_check_names(table):
    """Not priced and not tabled, the quick check still ranks by the device's predictions: the
    fix it names (and remembers) is the whole check's, wherever the predictions decide it."""
    whole, _ = _check(table, predicted=True)
    quick, _ = _check(table, predicted=True, quick=True)
    assert quick.fix is not None and whole.fix is not None and quick.fix.verified
    assert _chosen(quick) == _chosen(whole)
    assert quick.fix.settings == whole.fix.settings and quick.fix.cost is None
    if table is APART:  # where the predictions, not what each holds and changes, decide
        assert _chosen(quick) == "component_bf16"


def test_with_predictions_the_pruned_search_gives_the_full_searchs_answers():
    """The whole table, costs and predictions included, is the same whether the search runs
    every candidate first or only those that can still win."""
    for table in (APART, INSIDE):
        assert with_costs(_check(table, True)[0]) == with_costs(_check(table, True, prune=False)[0])


def test_a_prediction_that_explains_little_of_the_call_is_not_used():
    """On a table a million times faster, the tiny model's work is a sliver of its call (most
    of it the operations between the kernels and each call's fixed cost, which the table does
    not hold): nothing is predicted, nothing timed before the proof, and the fix is the one
    what each holds and changes gives, as without a table."""
    fast = _table(1e6, 2e7)
    unpredicted, _ = _check(fast, predicted=False)
    report, before = _check(fast, predicted=True)
    assert before == []
    assert report.work.predicted_costs == 0
    assert all(c.cost is None or c.cost.predicted_ms is None for c in report.tried)
    assert _chosen(report) == _chosen(unpredicted) == "islands"


def test_a_prediction_decides_only_beyond_the_band_and_the_error():
    error = step_work.PREDICTION_ERROR["cpu"]

    def cost(ms: float) -> StageCost:
        return StageCost(100.0, predicted_ms=ms, predicted_error=error)

    # A tenth faster at the error's worst: faster, as timing would find it.
    assert fix_ranking._timing(cost(100 * 0.9 / (1 + error) - 1), cost(100.0)) == "faster"
    assert fix_ranking.predicted_apart(cost(50.0), cost(100.0))
    # Inside the band plus the error: neither is told, both are timed.
    assert not fix_ranking.predicted_apart(cost(85.0), cost(100.0))
    assert not fix_ranking.predicted_apart(cost(100.0), cost(100.0))
    # No prediction: timed.
    assert not fix_ranking.predicted_apart(StageCost(100.0), cost(100.0))
