"""A fix's cost is what the user's generation will pay under it.

The check computes its candidates from the stored weights layer by layer, where a generation
holds a copy in the fix's dtype when the budget has room: memory is counted as the generation
places the plan, and the fix is timed on that placement, by one call of the part it changes (a
VAE fix by the VAE's decode, not by denoiser steps it does not change). Counts and bytes, not
times: they do not depend on the machine.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from app.core import health
from app.core.fixing.job_plans import no_half
from app.core.health.cost import held_otherwise, priced_component
from app.core.health.request import CheckRequest, CheckRun
from app.core.health.words import NO_HALF_AS_CHECKED_WORDS, cost_comparison
from app.core.precision import PlacedPipeline, placement, resolve_plan
from app.core.run import timing
from app.core.settings import PrecisionSettings
from tests.support.planted_sd import FP16, VAE_LAYER, loaded, plant
from tests.support.tiny_models import build_tiny_sd_pipeline

COMPONENTS = ["text_encoder", "unet", "vae"]


def _check(pipeline, measure_cost: bool):
    return health.check_loaded(
        loaded(pipeline),
        CheckRequest(precision=FP16, device="cpu", size=64),
        run=CheckRun(remember=False, measure_cost=measure_cost),
    )


@pytest.fixture(scope="module")
def vae_fault():
    """A planted VAE overflow, checked with and without the fix's cost."""
    pipeline = plant(build_tiny_sd_pipeline(), "vae")
    return _check(copy.deepcopy(pipeline), False), _check(pipeline, True)


def test_a_vae_fix_is_priced_by_the_vae_decode_not_by_denoiser_steps(vae_fault):
    unpriced, priced = vae_fault
    assert priced.fix is not None and priced.fix.verified
    cost = priced.fix.cost
    assert cost.fix.component == cost.no_half.component == "vae"
    # Pricing it runs no denoiser step: the UNet runs as often as in the check without a cost.
    assert priced.work.calls_of("unet") == unpriced.work.calls_of("unet")
    # It runs VAE decodes: a warm-up for no-half (the fix's decode ran in the check), then the
    # rounds, alternating.
    extra = priced.work.calls_of("vae") - unpriced.work.calls_of("vae")
    rounds = timing.COST_ROUNDS
    timed_for_candidates = sum(c.cost.rounds or 0 for c in priced.fix.candidates if c.cost)
    assert extra >= 2 * rounds + 1
    assert priced.work.calls_of("vae", "fp32") > unpriced.work.calls_of("vae", "fp32")
    assert extra <= 2 * rounds + 1 + timed_for_candidates + 2 * rounds + 2
    said = priced.to_json()["fix"]["cost"]["fix"]
    assert said["component"] == "vae" and said["step_ms"] > 0
    assert said["unet_step_ms"] is None  # not a denoiser's step
    assert "Per VAE decode the fix" in health.cost_comparison(cost, priced.fix.settings)


def test_the_stated_weights_are_those_the_generation_places(vae_fault):
    """The bytes the report states for the fix and for no-half are the bytes a generation's
    placement of each plan holds (each component as `generate` places it), counted alike."""
    _, priced = vae_fault
    pipeline = plant(build_tiny_sd_pipeline(), "vae")
    cost = priced.fix.cost
    for plan, stated in ((priced.fix.plan, cost.fix), (None, cost.no_half)):
        if plan is None:
            settings = PrecisionSettings(no_half=True)
            plan = resolve_plan(settings, device="cpu", components=COMPONENTS)
        placed = PlacedPipeline(pipeline, placement.as_generated(plan))
        assert stated.weights_mb == pytest.approx(placed.placed_bytes / 2**20, abs=0.05)
        placed.release()


def _fp16_stored():
    return build_tiny_sd_pipeline().to(torch.float16)


def test_an_fp32_part_costs_twice_its_fp16_bytes_where_it_fits():
    """A check computes an fp32 candidate from the fp16 weights (its runs peak alike the fp16
    ones); the user's generation holds an fp32 copy: twice the bytes, stated so."""
    pipeline = _fp16_stored()
    fp16 = resolve_plan(FP16, device="cpu", components=COMPONENTS)
    unet_fp32 = fp16.with_dtypes(unet="fp32")
    unet_bytes = sum(p.numel() for p in pipeline.unet.parameters()) * 2
    in_check = placement.memory_plan(pipeline, placement.replace(unet_fp32, compute_in_place=True))
    assert [p.stored_dtype for p in in_check if p.component == "unet"] == ["fp16"]
    extra = placement.generation_held_mb(pipeline, unet_fp32)
    extra -= placement.generation_held_mb(pipeline, fp16)
    assert extra == pytest.approx(unet_bytes / 2**20, rel=1e-6)


def test_an_fp32_part_that_does_not_fit_the_budget_costs_its_stored_bytes():
    """Under a budget the fp32 copy would pass, a generation keeps the fp16 weights and
    computes in fp32 layer by layer: the fix holds no more than fp16 does."""
    pipeline = _fp16_stored()
    unet_mb = sum(p.numel() for p in pipeline.unet.parameters()) * 2 / 2**20
    budget = 1.5 * unet_mb  # the fp16 UNet fits, an fp32 copy (2x) does not
    fp16 = placement.replace(
        resolve_plan(FP16, device="cpu", components=COMPONENTS), memory_budget_mb=budget
    )
    unet_fp32 = fp16.with_dtypes(unet="fp32")
    held = placement.generation_held_mb(pipeline, unet_fp32)
    placed = PlacedPipeline(pipeline, placement.as_generated(unet_fp32), ["unet"])
    assert "unet" in placed.computed_in_place
    unet_held = placed.placed_bytes / 2**20
    placed.release()
    assert unet_held == pytest.approx(unet_mb, rel=1e-6)
    assert held == pytest.approx(placement.generation_held_mb(pipeline, fp16), rel=1e-6)


def test_the_part_a_fix_changes_prices_it():
    fp16 = resolve_plan(FP16, device="cpu", components=COMPONENTS)
    vae_islands = fp16.with_modules("vae", {VAE_LAYER: "fp32"})
    assert priced_component(fp16, vae_islands, "unet") == "vae"
    assert priced_component(fp16, fp16.with_dtypes(vae="fp32"), "unet") == "vae"
    assert priced_component(fp16, fp16.with_dtypes(text_encoder="fp32"), "unet") == "text_encoder"
    assert priced_component(fp16, fp16.with_dtypes(unet="bf16", vae="fp32"), "unet") == "unet"
    upcast = placement.replace(fp16, upcast_attention=True)
    assert priced_component(fp16, upcast, "unet") == "unet"  # every part's attention


def _old_memory(result, pipeline):
    """A candidate as the ranking weighed it before: the peak of the check's own run where the
    device reports one, else every parameter at its plan's dtype, with no budget."""
    from app.core.precision import plan_weights_mb
    from app.core.run.stage_cost import StageCost

    assert result.candidate is not None
    old = StageCost(plan_weights_mb(result.candidate.plan, pipeline))
    return dataclasses.replace(result, cost=old, chosen=False)


@pytest.mark.parametrize(
    ("fault", "stored"),
    [("vae", "fp32"), ("unet_ff", "fp32"), ("unet_ff", "fp16")],
)
def test_the_planted_corpus_picks_the_fix_it_picked_before_on_a_cpu(fault, stored):
    """On a CPU (no peak reported, no budget short of a copy) memory as the generation holds it
    ranks the planted faults' candidates as the weights did before: every case keeps its fix
    (docs/benchmarks.md lists the cases and where a GPU's ranking differs)."""
    from app.core.fixing import fix_ranking

    pipeline = plant(build_tiny_sd_pipeline(), fault)
    if stored == "fp16":
        pipeline = pipeline.to(torch.float16)
    report = health.check_loaded(
        loaded(copy.deepcopy(pipeline)),
        CheckRequest(precision=FP16, device="cpu", size=64),
        run=CheckRun(remember=False, measure_cost=False),
    )
    assert report.fix is not None and report.fix.verified
    ranked = report.fix.candidates
    before = fix_ranking.rank_candidates([_old_memory(r, pipeline) for r in ranked if r.candidate])
    assert [r.kind for r in before if r.verified] == [r.kind for r in ranked if r.verified]


def test_no_half_timed_from_fp16_weights_is_said_to_be_the_checks_figure():
    """No-half is timed as the check runs its fp32 reference: from the stored weights. Where
    those are fp16 and a --no-half generation would hold an fp32 copy, the report says its
    figure is the check's (JSON and the comparison sentence); where the model is stored in
    fp32 (the planted VAE below) the two are one placement and nothing is said."""
    pipeline = plant(build_tiny_sd_pipeline(), "unet_ff").to(torch.float16)
    report = _check(pipeline, True)
    assert report.fix is not None and report.fix.cost is not None
    cost = report.fix.cost
    assert cost.no_half_as_checked
    assert report.to_json()["fix"]["cost"]["no_half_placed"] == "as_checked"
    said = cost_comparison(cost, report.fix.settings)
    assert said.endswith(NO_HALF_AS_CHECKED_WORDS)


def test_no_half_stored_in_fp32_is_timed_as_generated(vae_fault):
    _, priced = vae_fault
    cost = priced.fix.cost
    assert cost is not None and not cost.no_half_as_checked
    assert priced.to_json()["fix"]["cost"]["no_half_placed"] == "as_generated"
    assert NO_HALF_AS_CHECKED_WORDS not in cost_comparison(cost, priced.fix.settings)


def test_no_half_that_a_generation_too_computes_from_fp16_weights_is_its_figure():
    """Under a budget an fp32 copy would pass, a --no-half generation computes from the fp16
    weights as the check did: the check's figure is the generation's."""
    pipeline = _fp16_stored()
    unet_mb = sum(p.numel() for p in pipeline.unet.parameters()) * 2 / 2**20
    tested = placement.replace(
        resolve_plan(FP16, device="cpu", components=COMPONENTS), compute_in_place=True
    )
    wide = no_half(tested)
    assert held_otherwise(pipeline, wide, "unet")
    short = placement.replace(wide, memory_budget_mb=1.5 * unet_mb)
    assert not held_otherwise(pipeline, short, "unet")
