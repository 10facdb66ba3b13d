"""Layer-level fixes: only the layers that overflow (and what their values feed until back in
fp16's range) run wider, the rest of the component stays in fp16.

Each test plants an overflow in one layer of a tiny pipeline (its weights scaled past 65504)
on a device that reports no native bf16, as a pre-Ampere GPU does: the fix must be a few layers
in fp32, not the whole component, proved against fp32, and it must survive the remembered
profile, the exported flags and generation's repair.
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch

from app.cli.arguments import build_parser
from app.core import hardware, health
from app.core.errors import HalfSafeError
from app.core.fixing import fix_candidates, fix_ranking, layer_islands, profiles
from app.core.fixing.quality import QUALITY_THRESHOLD_DB, Quality
from app.core.generation import GenerationRequest, generate
from app.core.images.finished import read_parameters
from app.core.precision import plan_weights_mb
from app.core.run.stage_cost import StageCost
from app.core.settings import FIELDS, PrecisionSettings
from app.core.words.infotext import split_text
from tests.support.planted_sd import TE_LAYER, VAE_LAYER, check, loaded
from tests.support.tiny_models import build_tiny_sd_pipeline

UNET_LAYER = "down_blocks.0.resnets.0.conv1"
FP16 = PrecisionSettings(precision="fp16")

# component, planted layer, factor, the most layers the fix may keep out of fp16
PLANTS = [
    ("vae", VAE_LAYER, 1e6, 2),
    ("unet", UNET_LAYER, 1e6, 2),
    ("text_encoder", TE_LAYER, 1e5, 6),
]


@pytest.fixture
def no_clamp(monkeypatch):
    """The fix table without its clamp: a clamp of the planted VAE layer is verified too, and
    changing one layer where the islands change two, it is chosen before them
    (`fix_ranking.cost_order`); these tests are about the islands."""
    kinds = tuple(k for k in fix_candidates.FIX_KINDS if k.name != "clamp")
    monkeypatch.setattr(fix_candidates, "FIX_KINDS", kinds)


@pytest.fixture
def no_native_bf16(monkeypatch):
    """This CPU described as a GPU without native bf16 (GTX 16xx, RTX 20xx, V100) would be."""
    describe = hardware.describe_device

    def without_bf16(device):
        return dataclasses.replace(describe(device), bf16="unsupported")

    monkeypatch.setattr(hardware, "describe_device", without_bf16)


def planted(component: str, layer: str, factor: float):
    pipeline = build_tiny_sd_pipeline()
    with torch.no_grad():
        getattr(pipeline, component).get_submodule(layer).weight.mul_(factor)
    return pipeline


def row(report, kind: str) -> fix_ranking.CandidateResult:
    (found,) = [c for c in report.fix.candidates if c.kind == kind]
    return found


@pytest.mark.parametrize(("component", "layer", "factor", "most"), PLANTS)
def test_a_planted_overflow_is_fixed_by_a_few_layers_in_fp32(
    no_native_bf16, no_clamp, component, layer, factor, most
):
    report = check(loaded(planted(component, layer, factor)), remember=False)

    assert report.verdict == "fixable"
    assert report.components[component].first_bad_module == layer
    fix = report.fix
    # A few layers, not the component: it stays in fp16 and nothing else changed.
    assert fix.plan.dtypes == report.plan.dtypes
    islands = fix.plan.islands(component)
    assert layer in islands and 1 <= len(islands) <= most
    assert set(islands.values()) == {"fp32"}  # no native bf16 here
    assert fix.settings == {"fp32_modules": [f"{component}:{p}" for p in islands]}
    # Finite and right: proved against the fp32 reference.
    assert fix.verified and fix.quality.value >= QUALITY_THRESHOLD_DB
    # Its weights cost within 10% of fp16's, where the whole component in fp32 costs more.
    pipeline = loaded(planted(component, layer, factor)).pipeline
    fp16_mb = plan_weights_mb(report.plan, pipeline)
    assert plan_weights_mb(fix.plan, pipeline) <= 1.10 * fp16_mb
    whole = row(report, "component_fp32")
    assert whole.verified and not whole.chosen
    assert whole.cost and whole.cost.weights_mb > row(report, "islands").cost.weights_mb
    assert fix.candidates[0].kind == "islands" and fix.candidates[0].chosen
    # What the user reads and copies.
    document = report.to_json()["fix"]
    assert document["modules"] == {component: islands}
    assert document["layers_wider"] == len(islands)
    assert health.flags(fix.settings) == f"--fp32-modules {component}:{','.join(islands)}"


def test_a_clamp_that_saturates_is_shown_rejected_below_the_island(no_native_bf16):
    """In the text encoder the overflowing values feed the residual stream: clamped to
    65504 they stay finite but are wrong, and the fp32 comparison says so."""
    report = check(loaded(planted("text_encoder", TE_LAYER, 1e5)), remember=False)
    clamp, island = row(report, "clamp"), row(report, "islands")
    assert clamp.finite and not clamp.verified and not clamp.chosen
    assert clamp.quality is not None and clamp.quality.value < QUALITY_THRESHOLD_DB
    assert island.chosen
    kinds = [c.kind for c in report.fix.candidates]
    assert kinds.index("islands") < kinds.index("clamp")
    # Said as every fix is said (`precision.words.fix_words`): "Clamp 1 text encoder layer ...".
    assert any(n.startswith("Clamp 1 ") and "not a fix" in n for n in report.notes)
    shown = {c["kind"]: c for c in report.to_json()["fix"]["candidates"]}
    assert shown["clamp"]["verified"] is False
    assert shown["clamp"]["quality"]["value"] < QUALITY_THRESHOLD_DB
    text = health.markdown_report(report)
    assert "clamp" in text and "rejected" in text


def test_the_island_fix_is_remembered_and_applied_by_the_next_check(no_native_bf16, no_clamp):
    first = check(loaded(planted("vae", VAE_LAYER, 1e6), key="islands-profile"))
    assert first.fix.verified
    device = hardware.describe_device(hardware.pick_device("cpu")).name
    remembered = profiles.remembered_fix("islands-profile", device)
    assert remembered is not None
    assert remembered.settings == first.fix.settings

    again = check(loaded(planted("vae", VAE_LAYER, 1e6), key="islands-profile"))
    assert again.verdict == "healthy"
    assert again.plan.islands("vae") == first.fix.plan.islands("vae")
    assert again.plan.dtypes["vae"] == "fp16"
    assert "fp16, with 2 VAE layers in fp32" in again.headline


def test_generation_repairs_with_islands_and_the_png_names_them(no_native_bf16, tmp_path):
    model = loaded(planted("vae", VAE_LAYER, 1e6), key="islands-generation")
    request = GenerationRequest(
        prompt="a lighthouse at dusk",
        steps=3,
        width=64,
        height=64,
        seed=1234,
        output_dir=str(tmp_path / "out"),
    )
    result = generate(model, request, precision=FP16, device="cpu")
    (entry,) = result.images
    assert (entry.status, entry.component) == ("fixed", "vae")
    layers = entry.settings["fp32_modules"]
    assert f"vae:{VAE_LAYER}" in layers and len(layers) <= 2
    assert entry.settings["vae_precision"] == "fp16"
    parameters = split_text(read_parameters(entry.path))[2]
    assert parameters["FP32 layers"] == " ".join(layers)
    assert parameters["VAE precision"] == "fp16"

    # Remembered: the next job runs with the islands from the start and needs no repair.
    again = generate(model, request, precision=FP16, device="cpu")
    (entry,) = again.images
    assert (entry.status, entry.fixes_applied) == ("ok", [])
    assert entry.settings["fp32_modules"] == layers


def test_the_exported_flags_parse_back_to_the_same_settings():
    settings = {"fp32_modules": ["vae:decoder.a", "vae:decoder.b", "unet:mid_block.c"]}
    line = health.flags(settings)
    assert line == "--fp32-modules vae:decoder.a,decoder.b --fp32-modules unet:mid_block.c"
    args = build_parser().parse_args(["check", "model.safetensors", *line.split()])
    assert args.fp32_modules == settings["fp32_modules"]


@pytest.mark.parametrize(
    ("flag", "problem"),
    [
        ("nothing:decoder.a", "is not a component"),
        ("vae", "expected COMPONENT:PATH"),
        ("vae:decoder..a", "dotted module path"),
        ("vae:" + "a" * 300, "at most 200 characters"),
        ("vae:" + ",".join(f"l{i}" for i in range(300)), "more than the 256 allowed"),
    ],
)
def test_a_bad_module_flag_is_refused_in_one_sentence(capsys, flag, problem):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["check", "model.safetensors", "--fp32-modules", flag])
    assert exit_.value.code == 2
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert problem in message and len(message) < 300


def test_a_module_the_model_does_not_have_is_refused_when_it_loads():
    settings = PrecisionSettings(precision="fp16", fp32_modules=("vae:decoder.no_such_layer",))
    with pytest.raises(HalfSafeError) as error:
        check(loaded(build_tiny_sd_pipeline()), settings, remember=False)
    assert str(error.value) == (
        "<tiny>: --fp32-modules names vae:decoder.no_such_layer, which this model does not have."
    )
    assert FIELDS["fp32_modules"].validate(["vae:decoder.conv_in"]) == ["vae:decoder.conv_in"]


def test_islands_run_only_the_named_layers_wider_and_cast_back():
    """The placed VAE holds fp16 weights except the islands; a decode through it is finite."""
    from app.core.precision import PlacedPipeline, resolve_plan

    pipeline = copy.deepcopy(build_tiny_sd_pipeline())
    with torch.no_grad():
        pipeline.vae.get_submodule(VAE_LAYER).weight.mul_(1e6)
    norm = VAE_LAYER.replace("conv1", "norm2")
    settings = PrecisionSettings(precision="fp16", fp32_modules=(f"vae:{VAE_LAYER}", f"vae:{norm}"))
    plan = resolve_plan(settings, device="cpu", components=["unet", "vae"])
    placed = PlacedPipeline(pipeline, plan)
    vae = placed["vae"]
    dtypes = {name: p.dtype for name, p in vae.named_parameters()}
    assert dtypes[f"{VAE_LAYER}.weight"] == torch.float32
    assert dtypes[f"{norm}.weight"] == torch.float32
    assert sum(d == torch.float32 for d in dtypes.values()) == 4  # two weights, two biases
    assert pipeline.vae.get_submodule(VAE_LAYER).weight.dtype == torch.float32  # source kept
    latents = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        pixels = vae.decode(latents.half()).sample
        plain = copy.deepcopy(pipeline.vae).half().decode(latents.half()).sample
    assert torch.isfinite(pixels).all()
    assert not torch.isfinite(plain).all()  # without the islands the same decode overflows


def _result(
    kind: str,
    memory: float,
    ms: tuple[float, float] | None = None,
    db: float = 40.0,
    predicted: float | None = None,
    layers: int = 0,
):
    timed = {"step_ms": sum(ms) / 2, "step_ms_range": ms} if ms is not None else {}
    if predicted is not None:
        timed.update(predicted_ms=predicted, predicted_error=0.6)
    cost = StageCost(memory, **timed)
    return fix_ranking.CandidateResult(
        "vae", kind, kind, {}, 0, db > -1, Quality(db), cost, layers_changed=layers
    )


def test_ranking_is_memory_then_predictions_apart_then_what_each_holds_and_changes():
    order = [
        r.kind
        for r in fix_ranking.rank_candidates(
            [
                _result("component_fp32", 7.1, layers=120),
                _result("clamp", 6.4, db=4.0, layers=1),  # finite, but far from fp32: never ahead
                _result("component_bf16", 6.5, layers=120),
                _result("islands", 6.5, layers=2),
            ]
        )
    ]
    # Without predictions: alike in memory (within 10%), so the layers changed, then the table
    # order decide; the clamp that fails the quality threshold comes after every verified one.
    assert order == ["islands", "component_bf16", "component_fp32", "clamp"]
    less = fix_ranking.rank_candidates(
        [_result("islands", 6.5, layers=2), _result("component_bf16", 6.45, layers=120)]
    )
    assert less[0].kind == "islands"  # alike in memory: the fewest layers changed first
    clamped = fix_ranking.rank_candidates(
        [_result("clamp", 6.45, layers=1), _result("islands", 6.47, layers=2)]
    )
    # A verified clamp holding a little less comes after layers kept wider: its agreement with
    # fp32 holds for the inputs tested, a wider layer's for any.
    assert [r.kind for r in clamped] == ["islands", "clamp"]
    assert fix_ranking.rank_candidates([_result("clamp", 5.0, layers=1), clamped[0]])[0].kind == (
        "clamp"
    )  # past the band, the memory held decides, a clamp or not

    timed = fix_ranking.rank_candidates(
        [_result("islands", 6.5, (400, 460)), _result("component_fp32", 7.1, (10, 15))]
    )
    assert timed[0].kind == "islands"  # a time measured never ranks
    predicted = fix_ranking.rank_candidates(
        [_result("islands", 6.5, predicted=400), _result("component_fp32", 7.1, predicted=10)]
    )
    assert predicted[0].kind == "component_fp32"  # predicted apart beyond the band and error
    inside = fix_ranking.rank_candidates(
        [_result("islands", 6.5, predicted=300), _result("component_bf16", 6.5, predicted=250)]
    )
    assert inside[0].kind == "islands"  # inside the band: what each changes decides
    heavy = fix_ranking.rank_candidates(
        [_result("islands", 6.5, predicted=400), _result("component_fp32", 13.0, predicted=10)]
    )
    assert heavy[0].kind == "islands"  # twice the memory is not bought back by time


def test_each_verified_candidate_passed_over_says_why_in_the_table():
    """The result cell of a verified candidate that was not chosen names the rule that passed
    it over, so a faster rival's loss is read, not guessed (`fix_ranking.passed_over`)."""
    chosen = _result("islands", 6.5, (600, 700))
    rivals = {
        "heavy": _result("component_fp32", 13.0, (10, 15)),
        "slower": _result("component_bf16", 6.45, (1100, 1200)),
        "noise": _result("component_bf16", 6.45, (100, 620)),  # 1.8x faster, ranges overlap
        "margin": _result("component_bf16", 6.45, (590, 598)),  # apart, but less than a tenth
        "timed faster": _result("component_bf16", 6.45, (100, 200)),  # after the proof
        "untimed": _result("component_bf16", 6.45),
    }
    chosen.chosen = True
    said = {
        name: health.candidate_rows([chosen, rival], {})[1][4] for name, rival in rivals.items()
    }
    assert said == {
        "heavy": "verified; holds more memory",
        "slower": "verified; not faster",
        "noise": "verified; faster only within the noise",
        "margin": "verified; faster by less than a tenth",
        "timed faster": "verified; timed faster after the fix was proved (the fix stays)",
        "untimed": "verified; after it by the memory held, the layers changed or the table's order",
    }
    assert health.candidate_rows([chosen], {})[0][4] == "chosen"
    # Predicted faster beyond the band, yet not chosen: the ranking's walk kept another.
    predicted_chosen = _result("islands", 6.5, predicted=600)
    ahead = _result("component_bf16", 6.45, predicted=100)
    assert fix_ranking.passed_over(ahead, predicted_chosen) == "order"
    behind = _result("component_bf16", 6.45, predicted=2000)
    assert fix_ranking.passed_over(behind, predicted_chosen) == "slower"
    # The one timed faster after the proof is said beside the fix, with both figures.
    from app.core.health.words import timed_faster_notes

    (note,) = timed_faster_notes([chosen, rivals["timed faster"]])
    assert "150.0 against 650.0 ms" in note and "stays the one applied" in note


@pytest.mark.slow  # the fix's cost timed beside no-half
def test_the_measured_check_times_the_fix_and_no_half_and_shares_them_with_the_table(
    no_native_bf16,
):
    report = check(loaded(planted("vae", VAE_LAYER, 1e6)), remember=False, measure_cost=True)
    verified = {c.kind: c for c in report.fix.candidates if c.verified}
    assert set(verified) >= {"islands", "component_fp32"}
    chosen = report.fix.candidates[0]
    assert chosen.chosen and chosen.verified
    # The rows that are the call the fix's cost timed show its figures; the others, untimed.
    assert chosen.cost.step_ms == report.fix.cost.fix.step_ms
    assert verified["component_fp32"].cost.step_ms == report.fix.cost.no_half.step_ms
    for candidate in verified.values():
        cost = candidate.cost
        if cost.step_ms is None:
            continue
        assert cost.rounds == health.COST_ROUNDS and cost.step_ms_range is not None
        low, high = cost.step_ms_range
        assert low <= cost.step_ms <= high
    baselines = report.fix.baselines["vae"]
    assert set(baselines) == {"no_half"}
    shown = health.candidate_rows(report.fix.candidates, report.fix.baselines)
    assert shown[-1][1] == "no-half"


def test_another_tool_gets_the_best_verified_fix_it_can_apply():
    """AUTOMATIC1111 cannot keep two layers in fp32: its image's explanation offers the best
    verified fix it has a switch for, while HalfSafe's own flags keep the layer-level one."""
    import types

    from app.core.explain.explanation import _fix_the_tool_can_apply
    from app.core.words.tools import in_tool_terms

    layers = {"fp32_modules": [f"vae:{VAE_LAYER}"]}
    islands = _result("islands", 6.5)
    islands.settings, islands.chosen = layers, True
    whole = _result("component_fp32", 7.1)
    whole.settings = {"vae_precision": "fp32"}
    fix = types.SimpleNamespace(settings=layers, candidates=[islands, whole])

    assert _fix_the_tool_can_apply(fix, "halfsafe") == layers
    for_a1111 = _fix_the_tool_can_apply(fix, "a1111")
    assert for_a1111 == {"vae_precision": "fp32"}
    assert in_tool_terms("a1111", for_a1111, []).flags == ["--no-half-vae"]
    assert not in_tool_terms("a1111", layers, []).covered


def test_an_attention_score_overflow_tries_the_attention_fixes_and_upcast_wins():
    from tests.support.planted_sd import ATTN_LAYER, plant

    # diffusers' classic processor computes the scores in the layer's dtype: they overflow.
    classic = PrecisionSettings(precision="fp16", attention_backend="classic")
    report = check(loaded(plant(build_tiny_sd_pipeline(), "attention")), classic, remember=False)
    assert report.components["unet"].first_bad_module == ATTN_LAYER
    kinds = {c.kind: c for c in report.fix.candidates}
    # The attention fixes the field uses were tried and judged, none taken on trust: upcast on
    # the processor in use, and another kernel (the math one, through HalfSafe's processor).
    assert {"upcast_attention", "math_attention"} <= set(kinds)
    assert "classic_attention" not in kinds  # already the classic processor
    assert kinds["math_attention"].settings == {
        "attention_backend": "math",
        "attention_reduced_precision": False,
    }
    assert kinds["upcast_attention"].verified and kinds["upcast_attention"].chosen
    # Scores are no layer's output: no layer measured past 65504, so no island or clamp.
    assert "clamp" not in kinds and "islands" not in kinds
    assert report.fix.plan.dtypes == report.plan.dtypes


def test_islands_stay_wider_under_autocast(no_native_bf16, no_clamp):
    """A1111's default, fp16 under autocast: the island layers run outside autocast, so they
    really compute in fp32 and the fix holds."""
    autocast = PrecisionSettings(precision="autocast")
    report = check(loaded(planted("vae", VAE_LAYER, 1e6)), autocast, remember=False)
    assert report.plan.autocast_active
    island = row(report, "islands")
    assert island.verified and island.chosen
    assert report.fix.plan.dtypes["vae"] == "fp16" and report.fix.plan.autocast


def test_an_fp32_check_predicts_the_layers_to_keep_for_fp16_and_they_work():
    """Run wider (a CPU, no-half), the check cannot see fp16 fail, but its per-layer peaks name
    the layers fp16 would need in fp32: predicted, and here proved by a second check."""
    fp32 = PrecisionSettings(precision="fp32")
    report = check(loaded(planted("vae", VAE_LAYER, 1e6)), fp32, remember=False)
    assert report.verdict == "healthy" and report.advice is not None
    layers = report.advice.layer_settings
    assert layers["vae_precision"] == "fp16" and layers["unet_precision"] == "fp16"
    assert f"vae:{VAE_LAYER}" in layers["fp32_modules"] and len(layers["fp32_modules"]) <= 2
    assert report.to_json()["advice"]["layer_settings"] == layers
    assert "Or, keeping only the layers measured past fp16's range" in health.markdown_report(
        report
    )

    settings = PrecisionSettings.from_mapping({**fp32.to_dict(), **layers})
    again = check(loaded(planted("vae", VAE_LAYER, 1e6)), settings, remember=False)
    assert again.verdict == "healthy"
    assert again.plan.dtypes["vae"] == "fp16" and len(again.plan.islands("vae")) <= 2


# An overflow planted where an attention computes: the VAE mid-block attention's output
# projection, and a UNet self-attention's query projection (kept wider alone, an fp32 query
# meets fp16 keys and values in the attention op, which refuses mixed dtypes).
VAE_ATTENTION = "decoder.mid_block.attentions.0"
UNET_ATTENTION = "down_blocks.0.attentions.0.transformer_blocks.0.attn1"
ATTENTION_PLANTS = [
    ("vae", f"{VAE_ATTENTION}.to_out.0", VAE_ATTENTION, 2e6),
    ("unet", f"{UNET_ATTENTION}.to_q", UNET_ATTENTION, 1e5),
]


def _inside_an_attention(module, path: str) -> bool:
    """Whether `path` is a strict part of an attention (its projection, its norm)."""
    parts = path.split(".")
    return any(
        layer_islands.is_attention(module.get_submodule(".".join(parts[:end])))
        for end in range(1, len(parts))
    )


@pytest.mark.parametrize(("component", "layer", "attention", "factor"), ATTENTION_PLANTS)
def test_an_attention_overflow_is_fixed_by_whole_attentions_and_generate_runs_it(
    no_native_bf16, tmp_path, component, layer, attention, factor
):
    model = loaded(planted(component, layer, factor), key=f"attention-{component}")
    report = check(model, remember=False)

    assert report.verdict == "fixable" and report.fix.verified
    chosen = row(report, "islands")
    assert chosen.chosen and chosen.verified
    islands = report.fix.plan.islands(component)
    assert attention in islands
    module = getattr(model.pipeline, component)
    assert not [p for p in islands if _inside_an_attention(module, p)]
    assert f"{component}:{attention}" in report.fix.settings["fp32_modules"]

    # The fix as the user applies it: generate runs exactly those islands, finite, no repair.
    fixed = PrecisionSettings.from_mapping({**FP16.to_dict(), **report.fix.settings})
    request = GenerationRequest(
        prompt="a lighthouse at dusk",
        steps=3,
        width=64,
        height=64,
        seed=7,
        output_dir=str(tmp_path / "out"),
    )
    (entry,) = generate(model, request, precision=fixed, device="cpu").images
    assert (entry.status, entry.fixes_applied) == ("ok", [])
    assert entry.settings["fp32_modules"] == report.fix.settings["fp32_modules"]
    assert np.isfinite(np.asarray(entry.image, dtype=np.float32)).all()


def test_a_saved_island_naming_one_projection_runs_as_the_whole_attention(tmp_path):
    """A setting (or a remembered fix) that names only an attention's query projection runs,
    and is reported, as that whole attention: check and generate alike."""
    model = loaded(planted("unet", f"{UNET_ATTENTION}.to_q", 1e5), key="one-projection")
    settings = PrecisionSettings(precision="fp16", fp32_modules=(f"unet:{UNET_ATTENTION}.to_q",))
    report = check(model, settings, remember=False)
    assert report.verdict == "healthy"
    assert report.plan.islands("unet") == {UNET_ATTENTION: "fp32"}
    assert "part of an attention" in report.plan.reasons["fp32_modules"]
    request = GenerationRequest(
        prompt="a lighthouse", steps=3, width=64, height=64, seed=3, output_dir=str(tmp_path)
    )
    (entry,) = generate(model, request, precision=settings, device="cpu").images
    assert entry.status == "ok"
    assert entry.settings["fp32_modules"] == [f"unet:{UNET_ATTENTION}"]


def test_a_candidate_that_fails_to_run_is_dropped_with_a_note(no_native_bf16, monkeypatch):
    """The query projection alone in fp32 (what islands once were) cannot run: that candidate
    is dropped with a sentence, never offered, and the check still reaches its verdict."""

    def split_attention(ctx: fix_candidates.FixContext) -> fix_candidates.FixCandidate | None:
        if ctx.component != "unet":
            return None
        plan = ctx.plan.with_modules("unet", {f"{UNET_ATTENTION}.to_q": "fp32"})
        settings = {"fp32_modules": [f"unet:{UNET_ATTENTION}.to_q"]}
        return fix_candidates.FixCandidate(plan, settings, "split")

    kinds = (fix_candidates.FixKind("split", split_attention, "a split attention"),)
    monkeypatch.setattr(fix_candidates, "FIX_KINDS", kinds + fix_candidates.FIX_KINDS)
    report = check(loaded(planted("unet", f"{UNET_ATTENTION}.to_q", 1e5)), remember=False)

    assert report.verdict == "fixable" and report.fix.verified
    assert "split" not in {c.kind for c in report.fix.candidates}
    (note,) = [n for n in report.notes if "failed to run" in n]
    assert note.startswith("Keep 1 UNet layer in fp32 failed to run (RuntimeError: ")
    assert note.endswith("not a fix.")


def test_a_fix_of_the_denoiser_is_said_with_the_denoiser_the_model_has():
    """The denoiser setting governs a UNet or a DiT's transformer (DESIGN.md): a candidate
    says the one its model has, from the components its plan places."""
    from app.core.precision import PrecisionPlan
    from app.core.precision.words import fix_words

    settings = {"unet_precision": "bf16", "vae_precision": "fp32"}
    dit = PrecisionPlan(device="cpu", dtypes={"transformer": "bf16", "vae": "fp32"})
    sd = PrecisionPlan(device="cpu", dtypes={"unet": "bf16", "vae": "fp32"})
    assert fix_candidates.FixCandidate(dit, settings).words == (
        "run the transformer in bf16; run the VAE in fp32"
    )
    assert (
        fix_candidates.FixCandidate(sd, settings).words
        == "run the UNet in bf16; run the VAE in fp32"
    )
    # Where the model is not known, the first kind of component that setting governs.
    assert fix_words(settings) == "run the UNet in bf16; run the VAE in fp32"
