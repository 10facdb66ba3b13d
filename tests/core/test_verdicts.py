"""Verdicts a user can trust: the paths where the check used to say something false.

Each test plants a fault in a tiny pipeline (see test_health.py) and asserts what the user reads:
the headline, the per-precision predictions, and that "verified" means finite and right.
"""

from __future__ import annotations

import json

import pytest
import torch

from app.cli.text import health_text
from app.core import health
from app.core.components import Status, Verdict
from app.core.fixing import fix_candidates
from app.core.fixing.quality import QUALITY_THRESHOLD_DB, compare
from app.core.health.request import CheckRequest, CheckRun
from app.core.settings import PrecisionSettings
from tests.support.planted_sd import FF_LAYER, FP16, VAE_LAYER, check, loaded, plant
from tests.support.tiny_models import build_tiny_sd_pipeline, build_tiny_sdxl_pipeline

FP32 = PrecisionSettings(precision="fp32")
# The two VAE layers the planted fault needs kept wider than fp16.
VAE_FIX_LAYERS = ("decoder.up_blocks.0.resnets.0.conv1", "decoder.up_blocks.0.resnets.0.norm2")


def test_fp32_check_puts_the_predicted_fp16_overflow_in_its_first_line():
    report = check(loaded(plant(build_tiny_sd_pipeline(), "vae")), FP32)

    # Nothing overflowed as run: the verdict stays true to the tested settings...
    assert report.verdict is Verdict.HEALTHY
    # ...but the first line never says only "healthy" when fp16 would overflow.
    first_line = health_text(report).splitlines()[0]
    assert first_line == report.headline
    assert first_line.startswith(
        "Safe at your settings (fp32 everywhere). In fp16 the VAE would overflow"
    )
    assert "keep only the VAE in" in first_line
    assert "predicted" in first_line
    # Checked on a CPU, where fp16 is emulated: fp16 advice is for a GPU, never for here.
    assert first_line.endswith("; on this CPU fp32 is the fastest choice.")
    assert ": on a GPU, keep only the VAE in" in first_line
    assert health.markdown_report(report).count(report.headline) == 1

    vae = report.to_json()["components"]["vae"]
    assert vae["precisions"]["fp16"] == {"status": "overflow", "measured": False}
    assert vae["precisions"]["bf16"] == {"status": "ok", "measured": False}
    unet = report.to_json()["components"]["unet"]
    assert unet["precisions"]["fp16"] == {"status": "ok", "measured": False}
    assert report.advice is not None
    assert report.advice.overflowing == ["vae"]
    assert report.advice.settings["vae_precision"] in ("bf16", "fp32")
    assert report.advice.settings["unet_precision"] == "fp16"


def test_fp16_check_measures_fp16_and_the_tried_bf16(cpu_bf16):
    report = check(loaded(plant(build_tiny_sd_pipeline(), "vae")), FP16, remember=False)
    vae = report.components["vae"]
    assert vae.precisions["fp16"].status is Status.OVERFLOW and vae.precisions["fp16"].measured
    # The fix keeps only the overflowing layers wider: in bf16 where it is native, so the fix
    # search ran bf16 (measured, and fine); elsewhere in fp32, and bf16 is only predicted.
    wider = "bf16" if cpu_bf16 == "native" else "fp32"
    assert report.fix.settings == {f"{wider}_modules": [f"vae:{m}" for m in VAE_FIX_LAYERS]}
    assert vae.precisions["bf16"].status is Status.OK
    assert vae.precisions["bf16"].measured is (cpu_bf16 == "native")
    assert report.components["unet"].precisions["fp16"].measured


def test_a_healthy_fp16_model_says_so_plainly():
    report = check(loaded(build_tiny_sd_pipeline()))
    assert report.verdict is Verdict.HEALTHY and report.advice is None
    assert report.headline.startswith(
        "Healthy at your settings (fp16 everywhere): nothing overflowed"
    )


def test_remembered_fix_is_named_and_what_happens_without_it_is_said(cpu_bf16):
    first = check(loaded(plant(build_tiny_sd_pipeline(), "vae"), key="remembered-headline"))
    assert first.fix.verified
    again = check(loaded(plant(build_tiny_sd_pipeline(), "vae"), key="remembered-headline"))
    assert again.verdict is Verdict.HEALTHY
    assert again.remembered == first.fix.summary
    # The remembered fix keeps two VAE layers wider (bf16 where native), the rest in fp16: said
    # in its words.
    wider = "bf16" if cpu_bf16 == "native" else "fp32"
    assert again.headline == (
        f"Safe with the fix remembered for this model (fp16, with 2 VAE layers in {wider}): "
        "nothing overflowed."
    )


def _saturate_in_bf16(pipeline, layer: str = "decoder.conv_out"):
    """A planted kernel fault: in bf16 this layer's output is clamped to +-0.01 (finite, wrong),
    as a saturating clamp would do. Forward hooks travel with the placed copies."""

    def clamp(_module, _args, output):
        return output.clamp(-0.01, 0.01) if output.dtype == torch.bfloat16 else output

    pipeline.vae.get_submodule(layer).register_forward_hook(clamp)
    return pipeline


def test_a_finite_but_wrong_fix_is_rejected_and_the_next_one_is_verified(cpu_bf16):
    pipeline = _saturate_in_bf16(plant(build_tiny_sd_pipeline(), "vae"))
    report = check(loaded(pipeline), remember=False)

    assert report.verdict is Verdict.FIXABLE
    assert report.fix.verified
    assert report.fix.quality.value >= QUALITY_THRESHOLD_DB
    if cpu_bf16 == "native":
        # The whole VAE in bf16 was finite but wrong; the layers kept in bf16 do not reach the
        # saturating layer.
        assert set(report.fix.settings) == {"bf16_modules"}
        assert any("bf16 gave finite output that differs" in n for n in report.notes)
    else:
        # Without native bf16 the search keeps the layers in fp32 and never meets the fault.
        assert set(report.fix.settings) == {"fp32_modules"}
        assert not any("bf16" in n for n in report.notes)
    document = report.to_json()["fix"]
    assert document["quality"]["metric"] == "snr_db"
    assert document["quality"]["threshold"] == QUALITY_THRESHOLD_DB


def test_a_wrong_candidate_is_never_the_fix(monkeypatch):
    """With only the wrong (bf16) candidate on offer, the check falls back to everything in
    fp32, which is the reference itself, and never to the finite-but-wrong bf16."""
    pipeline = _saturate_in_bf16(plant(build_tiny_sd_pipeline(), "vae"))

    def wrong_only(component, plan, first_bad, module, bf16_native, wide=None):
        yield fix_candidates.FixCandidate(
            plan.with_dtypes(**{component: "bf16"}),
            {"vae_precision": "bf16"},
            "run the VAE in bf16",
        )

    monkeypatch.setattr("app.core.health.fix.candidate_fixes", wrong_only)
    report = check(loaded(pipeline), remember=False)
    assert report.fix.settings == {"no_half": True}
    assert report.fix.verified
    assert any(
        n.startswith("Run the VAE in bf16 gave finite output that differs") for n in report.notes
    )

    # And with no fallback left, nothing is claimed at all.
    monkeypatch.setattr("app.core.health.check.last_resort", lambda *args: None)
    report = check(loaded(pipeline), remember=False)
    assert report.fix is None
    assert report.verdict is Verdict.BROKEN
    assert report.headline.startswith("Broken")


def test_snr_is_high_for_the_same_output_and_low_for_a_clamped_one():
    reference = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    assert compare(reference.clone(), reference).passed
    assert compare(reference.half(), reference).value > 50
    assert not compare(reference.clamp(-0.01, 0.01), reference).passed
    assert not compare(torch.full_like(reference, float("nan")), reference).passed


def _fault_below(pipeline, threshold: int):
    """A UNet fault that fires only at low noise: the feed-forward layer's output is scaled past
    fp16's range whenever the timestep is below `threshold`."""
    unet = pipeline.unet
    state = {"t": 1000.0}

    def remember_timestep(_module, args, kwargs):
        t = args[1] if len(args) > 1 else kwargs["timestep"]
        state["t"] = float(torch.as_tensor(t).flatten()[0])

    def blow_up(_module, _args, output):
        return output * 1e6 if state["t"] < threshold else output

    unet.register_forward_pre_hook(remember_timestep, with_kwargs=True)
    unet.get_submodule(FF_LAYER).register_forward_hook(blow_up)
    return pipeline


@pytest.mark.parametrize("scheduler", ["dpmpp_2m_karras", "euler"])
def test_a_fault_at_the_lowest_noise_level_is_found(scheduler):
    report = check(
        loaded(_fault_below(build_tiny_sd_pipeline(), 180)), scheduler=scheduler, steps=20
    )
    assert report.timesteps[0] > 900 and report.timesteps[-1] < 180
    assert report.components["unet"].status is Status.OVERFLOW
    assert report.components["unet"].first_bad_module == FF_LAYER
    assert report.verdict is Verdict.FIXABLE


def test_an_sdxl_second_encoder_fault_leaves_the_first_encoder_alone():
    pipeline = build_tiny_sdxl_pipeline()
    mlp = pipeline.text_encoder_2.get_submodule("text_model.encoder.layers.0.mlp")
    with torch.no_grad():  # past 65504 inside the MLP only: its output is back in range
        mlp.fc1.weight.mul_(1e5)
        mlp.fc1.bias.mul_(1e5)
        mlp.fc2.weight.mul_(1e-5)
    report = check(loaded(pipeline), remember=False)
    assert report.components["text_encoder_2"].status is Status.OVERFLOW
    assert report.components["text_encoder"].status is Status.OK
    fixed = report.fix.plan
    assert fixed.dtypes["text_encoder"] == "fp16" and not fixed.islands("text_encoder")
    assert fixed.dtypes["text_encoder_2"] in ("bf16", "fp32") or fixed.islands("text_encoder_2")
    assert report.fix.verified


def test_block_chart_shows_a_peak_hidden_inside_a_block():
    report = check(loaded(plant(build_tiny_sd_pipeline(), "vae")), FP32)
    vae = report.components["vae"]
    block = next(b for b in vae.blocks if VAE_LAYER.startswith(b.module + "."))
    # The planted layer's output passes 65504 inside the block, whatever the block returns.
    assert block.max_abs is not None and block.max_abs > 65504
    assert block.max_abs == pytest.approx(vae.max_abs)
    assert block.level == "bad"


def test_costs_are_measured_alike_with_their_spread(vae_report):
    cost = vae_report.fix.cost
    for step in (cost.fix, cost.no_half):
        low, high = step.unet_step_ms_range
        assert low <= step.unet_step_ms <= high
        assert step.rounds == health.COST_ROUNDS
    sentence = health.cost_comparison(cost)
    assert sentence.startswith("Per VAE decode")  # a VAE fix, priced by the VAE


def test_report_json_is_strict_and_carries_the_new_fields(vae_report):
    document = json.loads(json.dumps(vae_report.to_json(), allow_nan=False))
    assert document["headline"] == vae_report.headline
    # The layers the chosen fix keeps wider (which verified fix wins depends on the measured
    # times, so the fix is read from the report, not assumed).
    plan = vae_report.fix.plan
    assert document["fix"]["modules"] == {
        c: dict(plan.islands(c)) for c in plan.modules if plan.islands(c)
    }
    assert set(document["fix"]["modules"]) <= {"vae"}
    for component in document["components"].values():
        assert set(component["precisions"]) == {"fp16", "bf16"}


@pytest.mark.parametrize(
    ("fix", "no_half", "expected"),
    [
        # One slow no-half run stretches its range over the fix's; the medians still differ.
        ((520, (500, 560)), (96, (90, 600)), "the fix was 5.4x as slow as no-half"),
        ((40, (38, 45)), (96, (90, 110)), "the fix was 2.4x as fast as no-half"),
        ((95, (80, 120)), (96, (90, 110)), "could not be told apart"),
        ((100, (99, 101)), (105, (80, 130)), "could not be told apart"),  # under 10%
    ],
)
def test_the_cost_sentence_tells_times_apart_by_their_medians(fix, no_half, expected):
    from app.core.health.cost import FixCost, StepCost

    def step(median_range):
        median, spread = median_range
        return StepCost(median, spread, health.COST_ROUNDS, None, 10.0)

    assert expected in health.cost_comparison(FixCost(step(fix), step(no_half)))


@pytest.fixture(scope="module")
def vae_report():
    return health.check_loaded(
        loaded(plant(build_tiny_sd_pipeline(), "vae")),
        CheckRequest(precision=FP16, device="cpu", size=64),
        run=CheckRun(remember=False, measure_cost=True),
    )


def test_an_fp32_run_warns_of_attention_scores_that_could_pass_fp16s_limit():
    """Scores live inside the attention kernel, never as a layer's output: the fp32 run bounds
    them, so "fp16 would be safe too" is never said of a model whose scores could overflow."""
    from tests.support.planted_sd import ATTN_LAYER

    report = check(loaded(plant(build_tiny_sd_pipeline(), "attention")), FP32)
    unet = report.components["unet"]
    assert unet.precisions["fp16"].status is Status.AT_RISK
    assert not unet.precisions["fp16"].measured
    assert "would be safe" not in report.headline
    assert "In fp16 the UNet would come close to fp16's limit" in report.headline
    assert any(ATTN_LAYER in n and "attention scores" in n for n in report.notes)

    healthy = check(loaded(build_tiny_sd_pipeline()), FP32)
    assert healthy.components["unet"].precisions["fp16"].status is Status.OK
    assert "fp16 would be safe too" in healthy.headline


def test_a_fix_summary_names_the_parts_it_leaves_as_a_list_in_words():
    from app.core.fixing.quality import Quality
    from app.core.health.fix import fix_summary
    from app.core.precision import PrecisionPlan

    tested = PrecisionPlan(
        device="cpu", dtypes={"text_encoder": "fp16", "unet": "fp16", "vae": "fp16"}
    )
    fixed = tested.with_dtypes(vae="fp32")
    said = fix_summary(["vae"], ["run the VAE in fp32"], tested, fixed, Quality(60.0))
    assert said.endswith(" The text encoder and UNet keep their precision.")
    only = fix_summary(["vae"], ["x"], tested, fixed.with_dtypes(unet="fp32"), None)
    assert only.endswith(" The text encoder keeps its precision.")


def test_a_part_run_with_layers_kept_wider_says_so_beside_its_measured_outcome():
    from app.core.components import Status
    from app.core.health import PrecisionOutcome
    from app.core.health.report import ComponentReport, precision_words

    vae = ComponentReport(
        "vae",
        "fp16",
        Status.OK,
        300.0,
        218.0,
        None,
        0.1,
        precisions={
            "fp16": PrecisionOutcome(Status.OK, True),
            "bf16": PrecisionOutcome(Status.OK, False),
        },
    )
    assert precision_words(vae) == "fp16 ok (measured), bf16 ok (predicted)"
    assert precision_words(vae, 2) == (
        "fp16 with 2 layers kept wider ok (measured), bf16 ok (predicted)"
    )


def test_two_parts_kept_wider_are_each_said_once(cpu_bf16):
    """The text encoder and the UNet both overflow and are both fixed with layers kept wider:
    the fix's words name each part's layers once (a later part's layer list carries the earlier
    part's layers too, which its words do not repeat), and the settings hold both."""
    from tests.support.planted_sd import PLANTS

    pipeline = PLANTS["text_encoder"](plant(build_tiny_sd_pipeline(), "unet_ff"))
    report = check(loaded(pipeline), remember=False)

    assert report.fix is not None and report.fix.verified
    settings = report.fix.settings
    lists = [e for k in ("fp32_modules", "bf16_modules") for e in settings.get(k, [])]
    assert {e.partition(":")[0] for e in lists} == {"text_encoder", "unet"}, settings
    summary = report.fix.summary
    for part in ("text encoder", "UNet"):
        said = [s for s in summary.split("; ") if f" {part} layer" in s]
        assert len(said) == 1, summary
