"""The health check against tiny SD pipelines with planted faults, one fault per case: attention
scores, two components at once, NaN weights and their victims, an fp32 run predicting fp16,
a remembered fix, the report (Markdown, JSON, cost), the command and cancelling.

Each plant scales one layer's weights so that its output passes 65504 in fp16 while staying
finite in fp32. One overflow per component, found at its layer and fixed alone, and a healthy
model in fp16, are every family's contract: test_families.py.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from app.core import health
from app.core.fixing import profiles
from app.core.health import stages
from app.core.health.check import Headline
from app.core.health.request import CheckRequest, CheckRun
from app.core.health.words import flags
from app.core.run import timing
from app.core.settings import PrecisionSettings
from tests.support.planted_sd import (
    ATTN_LAYER,
    FF_LAYER,
    FP16,
    TE_LAYER,
    VAE_LAYER,
    check,
    loaded,
    plant,
)
from tests.support.tiny_models import build_tiny_sd_pipeline

# What the shared VAE check below said as it ran: (stage, done, total) per progress call.
VAE_CHECK_PROGRESS: list[tuple[str, int, int]] = []


@pytest.fixture(scope="module")
def vae_report():
    """One check of a model with an overflowing VAE, cost measured, shared by the report tests."""
    VAE_CHECK_PROGRESS.clear()
    return health.check_loaded(
        loaded(plant(build_tiny_sd_pipeline(), "vae")),
        CheckRequest(precision=FP16, device="cpu", size=64),
        run=CheckRun(remember=False, measure_cost=True),
        on_progress=lambda *event: VAE_CHECK_PROGRESS.append(event),
    )


def test_a_checks_long_phases_count_their_work(vae_report):
    """Trying the fixes and measuring them take most of a check that finds a fault; each counts
    its work (candidate after candidate, timing run after timing run), so the window's bar moves
    instead of sitting at 0 of 1 for the whole phase."""
    stages: dict[str, list[tuple[int, int]]] = {}
    for stage, done, total in VAE_CHECK_PROGRESS:
        stages.setdefault(stage, []).append((done, total))
    # Those tried to prove the fix, then those tried for the table alone, counted as one row.
    proving = [c for stage, c in stages.items() if stage.startswith("Trying a fix")]
    tabled = [c for stage, c in stages.items() if stage.startswith("Completing the table, try")]
    tried = proving + tabled
    candidates = tried[0][0][1]
    assert candidates == len(tried) > 1 and proving
    assert [counts[0][0] for counts in tried] == list(range(candidates))
    assert not any(stage.startswith("Measuring the fixes") for stage in stages)  # never raced
    for stage in ("Measuring the cost of the fix",):
        counts = stages[stage][1:]  # after the announcement, each timing run
        total = counts[-1][1]
        assert total > 1 and counts == [(done, total) for done in range(1, total + 1)], stage


def test_the_headline_comes_before_the_fixes_are_tried(vae_report):
    """What failed and where reaches the user as soon as the probe shows it: before the fp32
    reference and the candidates, the slow part of a check that finds a fault."""
    stages = [stage for stage, _, _ in VAE_CHECK_PROGRESS]
    headlines = [s for s in stages if isinstance(s, Headline)]
    assert len(headlines) == 1
    assert headlines[0].startswith("The VAE went NaN/Inf in fp16") and VAE_LAYER in headlines[0]
    assert stages.index(headlines[0]) < stages.index("Running the fp32 reference")
    assert all(not isinstance(s, Headline) for s in stages[: stages.index(headlines[0])])


def test_measuring_skips_the_warm_ups_the_check_already_ran(vae_report):
    """Every verified candidate ran to be verified, the fix's decode among them: only no-half
    still needs a warm-up run before it is timed. Nothing but the fix's cost is timed; the
    table's rows that are the same call (the fix, the VAE in fp32 as no-half runs it) take its
    figures."""
    verified = [c for c in vae_report.tried if c.verified]
    totals = {stage: total for stage, _, total in VAE_CHECK_PROGRESS}
    rounds = timing.COST_ROUNDS
    assert len(verified) > 1
    assert not any(str(stage).endswith("the fixes for the VAE") for stage in totals)
    assert totals["Measuring the cost of the fix"] == 2 * rounds + 1
    assert vae_report.work.timed_runs == 2 * rounds + 1
    chosen = next(c for c in verified if c.chosen)
    cost = vae_report.fix.cost
    assert chosen.cost.step_ms == cost.fix.step_ms
    fp32 = next(c for c in verified if c.kind == "component_fp32")
    assert (
        fp32.cost.step_ms
        == cost.no_half.step_ms
        == vae_report.fix.baselines["vae"]["no_half"].step_ms
    )


def test_timing_runs_leave_the_other_components_placed():
    """Alternating plans for the VAE's timing re-places only the VAE: the UNet is not copied
    between fp16 and fp32 for every no-half run."""
    from app.core.fixing.job_plans import no_half

    model = loaded(build_tiny_sd_pipeline())
    plan = health.check_loaded(
        model, CheckRequest(precision=FP16, device="cpu", size=64), run=CheckRun(remember=False)
    ).plan
    runner = stages.Runner(model, plan, 64, "a cat", 4, "euler")
    latents = runner.denoise(plan, runner.encode(plan).output, record=False).output
    unets: list[int] = []

    def decode(p, record):
        return runner.decode(p, latents, record)

    try:
        costs = runner.timing.stage_costs(
            "vae",
            decode,
            {"as_tested": plan, "no_half": no_half(plan)},
            lambda done, total: unets.append(id(runner.placed["unet"])),
            warm=["as_tested"],
        )
    finally:
        runner.placed.release()
    # The no-half warm-up placed the whole plan, the tested plan's first run put it back; then
    # the UNet stays put for all the timed runs.
    assert len(set(unets[1:])) == 1 and len(unets) == 2 * timing.COST_ROUNDS + 1
    assert set(costs) == {"as_tested", "no_half"} and (costs["no_half"].step_ms or 0) > 0


def test_the_engine_sends_the_headline_as_a_warning_before_the_fix(tmp_path):
    from app.core.jobs import CancelToken
    from app.core.requests.records import CheckRequest
    from app.engine import jobs
    from app.engine.events import EventState, JobRequest
    from app.engine.server import JobContext, Session

    session = Session(model=loaded(plant(build_tiny_sd_pipeline(), "vae"), key="headline"))
    events = []
    request = CheckRequest(precision=FP16, device="cpu", size=64)
    context = JobContext(JobRequest(1, request), session, events.append, CancelToken())
    result = jobs.check(context, request)

    assert result.report.verdict == "fixable"
    warnings = [e for e in events if e.state is EventState.WARNING]
    assert len(warnings) == 1 and type(warnings[0].message) is str  # crosses as a plain str
    assert "VAE went NaN/Inf" in warnings[0].message and VAE_LAYER in warnings[0].message
    progress = [e.stage for e in events if e.state is EventState.PROGRESS]
    assert not any(isinstance(stage, Headline) for stage in progress)
    first_fix = next(i for i, e in enumerate(events) if e.stage.startswith("Trying a fix"))
    assert events.index(warnings[0]) < first_fix


def failing(report) -> set[str]:
    return {n for n, c in report.components.items() if c.status in ("overflow", "nan")}


def assert_fix_touches_only(report, components: set[str]):
    tested = report.plan.dtypes
    fixed = report.fix.plan.dtypes
    changed = {c for c in tested if tested[c] != fixed[c]}
    assert changed <= components
    assert report.fix.verified is True


def test_attention_score_overflow_is_fixed_by_upcasting_attention():
    classic = PrecisionSettings(precision="fp16", attention_backend="classic")
    report = check(loaded(plant(build_tiny_sd_pipeline(), "attention")), classic, remember=False)

    assert failing(report) == {"unet"}
    assert report.components["unet"].first_bad_module == ATTN_LAYER
    assert report.components["unet"].status == "overflow"
    assert report.fix.settings == {"upcast_attention": True}
    assert report.fix.plan.dtypes == report.plan.dtypes  # no component changed precision
    assert report.fix.plan.upcast_attention is True


def test_safe_processor_fixes_planted_attention_overflow_on_the_sdpa_path():
    """The default SDPA processor ignores upcast flags; ours honours them."""
    from diffusers.models.attention_processor import AttnProcessor

    from app.core.precision import SafeAttnProcessor

    attn = plant(build_tiny_sd_pipeline(), "attention").unet.get_submodule(ATTN_LAYER)
    attn = attn.to(torch.float16)
    x = torch.randn(1, 64, attn.to_q.in_features, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        attn.set_processor(AttnProcessor())
        broken = attn(x.half())
        attn.set_processor(SafeAttnProcessor(upcast=True))
        fixed = attn(x.half())
        exact = attn.float()(x)  # the same layer in fp32, as the reference
    assert not torch.isfinite(broken).all()
    assert torch.isfinite(fixed).all()
    torch.testing.assert_close(fixed.float(), exact, atol=0.05, rtol=0.05)


def test_two_components_at_once_are_both_fixed_and_nothing_else():
    pipeline = plant(plant(build_tiny_sd_pipeline(), "vae"), "unet_ff")
    report = check(loaded(pipeline), remember=False)
    assert report.verdict == "fixable"
    assert failing(report) == {"unet", "vae"}
    assert report.components["unet"].first_bad_module == FF_LAYER
    assert report.components["vae"].first_bad_module == VAE_LAYER
    assert report.components["text_encoder"].status == "ok"
    assert_fix_touches_only(report, {"unet", "vae"})
    assert report.fix.plan.dtypes["text_encoder"] == "fp16"


def test_nan_in_the_weights_is_broken_not_a_precision_problem():
    report = check(loaded(plant(build_tiny_sd_pipeline(), "nan_weights")))
    assert report.verdict == "broken"
    assert report.fix is None
    assert report.weights_non_finite == ["unet.conv_in.weight"]
    assert report.components["unet"].status == "broken_weights"
    assert report.components["text_encoder"].status == "ok"


def test_a_component_fed_nan_by_a_damaged_text_encoder_is_a_victim_not_a_culprit():
    """NaN in the text encoder's weights: the UNet and VAE downstream are fed non-finite values
    and said to be, checked on a finite stand-in, with no fault status of their own."""
    from app.cli import text as cli_text

    pipeline = build_tiny_sd_pipeline()
    with torch.no_grad():
        pipeline.text_encoder.get_submodule(TE_LAYER).weight[0, 0] = float("nan")
    report = check(loaded(pipeline))

    tensor = f"text_encoder.{TE_LAYER}.weight"
    assert report.verdict == "broken" and report.fix is None
    assert report.weights_non_finite == [tensor] and tensor in report.headline
    assert report.components["text_encoder"].status == "broken_weights"
    assert report.components["text_encoder"].fed_by is None
    for name in ("unet", "vae"):
        victim = report.components[name]
        assert victim.fed_by == "text_encoder"
        assert victim.status == "ok" and victim.max_abs is not None  # measured on the stand-in
        assert report.to_json()["components"][name]["fed_by"] == "text_encoder"
        assert health.status_words(victim) == "fed non-finite input by text_encoder"
    assert any(
        n.startswith("The UNet was fed non-finite input by the text encoder") for n in report.notes
    )
    rows = [line for line in cli_text.health_text(report).splitlines() if line.startswith("unet")]
    assert rows and "fed non-finite input by text_encoder" in rows[0] and "NaN" not in rows[0]


def test_fp32_run_predicts_the_fp16_overflow_without_running_fp16():
    report = check(
        loaded(plant(build_tiny_sd_pipeline(), "vae")), PrecisionSettings(precision="fp32")
    )
    assert report.verdict == "healthy"  # nothing overflows in fp32
    vae = report.components["vae"]
    assert vae.dtype == "fp32"
    assert vae.predicted_fp16 == "overflow"
    assert vae.predicted_first_bad_module == VAE_LAYER
    assert vae.headroom < 1
    assert report.components["unet"].predicted_fp16 == "ok"


def test_verified_fix_is_remembered_and_used_on_the_next_load():
    report = check(loaded(plant(build_tiny_sd_pipeline(), "vae"), key="remember-me"))
    assert report.verdict == "fixable"
    from app.core.hardware import describe_device

    stored = profiles.remembered_fix("remember-me", describe_device("cpu").name)
    assert stored is not None
    assert stored.settings == report.fix.settings
    # What it is a fix for: the fp16 the check ran at (Re-verify runs it there).
    assert stored.made_at == {
        "precision": "fp16",
        "text_encoder_precision": "fp16",
        "text_encoder_2_precision": "fp16",
        "text_encoder_3_precision": "fp16",
        "vae_precision": "fp16",
        "unet_precision": "fp16",
        "no_half": False,
        "no_half_vae": False,
    }
    assert stored.parts == ("text_encoder", "unet", "vae")  # the parts its words name

    again = check(loaded(plant(build_tiny_sd_pipeline(), "vae"), key="remember-me"))
    assert again.verdict == "healthy"
    assert again.plan.dtypes["vae"] == report.fix.plan.dtypes["vae"]
    assert again.plan.dtypes["unet"] == "fp16"
    assert any("remembered" in note for note in again.notes)


def test_probe_reads_device_values_once_not_per_module(monkeypatch):
    from app.core.run.probe import ActivationRecorder

    unet = build_tiny_sd_pipeline().unet
    recorder = ActivationRecorder(unet)
    syncs = []
    with monkeypatch.context() as patched:
        for method in ("item", "tolist", "cpu", "__bool__"):
            original = getattr(torch.Tensor, method)

            def counting(self, *a, _original=original, _name=method, **k):
                syncs.append(_name)
                return _original(self, *a, **k)

            patched.setattr(torch.Tensor, method, counting)
        with torch.no_grad():
            out = unet(torch.randn(2, 4, 8, 8), 10, encoder_hidden_states=torch.randn(2, 77, 32))
        during_forward = list(syncs)
    result = recorder.read(out.sample)
    assert during_forward == []
    assert len(result.modules) > 50


def test_markdown_report_names_the_layer_and_the_fix(vae_report):
    text = health.markdown_report(vae_report)
    assert f"`{VAE_LAYER}`" in text
    assert "| vae |" in text
    assert "Verified" in text
    # The VAE went non-finite: its largest value is from the run that fixed it, and says so.
    row = next(line for line in text.splitlines() if line.startswith("| vae | fp16 |"))
    assert "(on the run that fixed it)" in row
    # The fix (the VAE's overflowing layer clamped: verified, holding no more memory and
    # changing the fewest layers), as the flags to run it with: the VAE's.
    assert vae_report.fix is not None
    fix_flags = flags(vae_report.fix.settings)
    assert f"`{fix_flags}`" in text
    assert "--vae-precision" in fix_flags or "-modules vae:" in fix_flags


def test_fix_cost_is_measured_against_no_half(vae_report):
    cost = vae_report.fix.cost
    for step in (cost.fix, cost.no_half):
        assert step.unet_step_ms > 0
        assert step.peak_memory_mb is None  # a CPU reports no device memory
    # The fix keeps the UNet and text encoder in fp16: fewer bytes of weights than no-half.
    assert cost.fix.weights_mb < cost.no_half.weights_mb


def test_report_json_holds_the_contract(vae_report):
    document = vae_report.to_json()
    json.dumps(document, allow_nan=False)  # strict JSON: no NaN/Infinity
    assert set(document) >= {
        "halfsafe",
        "model",
        "device",
        "tested",
        "weights",
        "components",
        "verdict",
        "fix",
        "seconds",
    }
    assert set(document["model"]) >= {"source", "format", "architecture", "prediction"}
    prediction = document["model"]["prediction"]
    assert prediction["type"] == "epsilon" and prediction["zero_terminal_snr"] is False
    assert isinstance(prediction["because"], str)
    assert set(document["device"]) >= {"kind", "name"}
    assert document["tested"]["upcast_attention"] is False
    for component in document["components"].values():
        assert set(component) >= {"status", "max_abs", "headroom", "first_bad_module", "seconds"}
    fix = document["fix"]
    assert fix["verified"] is True and isinstance(fix["summary"], str)
    assert set(fix) >= {"text_encoder", "unet", "vae", "upcast_attention"}


def _cli(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "app", *args], capture_output=True, text=True, cwd=cwd
    )


@pytest.mark.class_free  # exit statuses, a verdict and a layer: no fix is read
def test_cli_exit_statuses(tmp_path):
    healthy = _cli("check", "demo", "--json")
    assert healthy.returncode == 0, healthy.stderr
    assert json.loads(healthy.stdout)["verdict"] == "healthy"

    folder = tmp_path / "overflowing-vae"
    plant(build_tiny_sd_pipeline(), "vae").save_pretrained(folder)
    report_md = tmp_path / "report.md"
    fixable = _cli(
        "check",
        str(folder),
        "--precision",
        "fp16",
        "--size",
        "64",
        "--json",
        "--report",
        str(report_md),
    )
    assert fixable.returncode == 1, fixable.stderr
    document = json.loads(fixable.stdout)
    assert document["verdict"] == "fixable"
    assert document["components"]["vae"]["first_bad_module"] == VAE_LAYER
    assert VAE_LAYER in report_md.read_text()

    missing = _cli("check", str(tmp_path / "nope.safetensors"))
    assert missing.returncode == 2
    assert missing.stderr.count("\n") == 1 and "nope.safetensors" in missing.stderr
    assert "Traceback" not in missing.stderr

    bad_size = _cli("check", "demo", "--size", "100")
    assert bad_size.returncode == 2 and "multiple of 8" in bad_size.stderr


def test_cancel_stops_the_check_and_releases_the_device_copies(monkeypatch):
    from app.core.errors import CancelledError
    from app.core.jobs import CancelToken
    from app.core.precision import PlacedPipeline

    released = []
    original = PlacedPipeline.release
    monkeypatch.setattr(
        PlacedPipeline, "release", lambda self: (released.append(self), original(self))[1]
    )
    token = CancelToken()

    def cancel_at_unet(stage, done, total):
        if stage == "Checking the UNet":
            token.cancel()

    with pytest.raises(CancelledError):
        check(loaded(build_tiny_sd_pipeline()), on_progress=cancel_at_unet, cancel=token)
    assert len(released) == 1
    assert released[0]._placed == {}


def test_a_component_run_in_fp16_with_layers_kept_wider_has_fp16s_headroom():
    """The VAE in fp16 with its overflowing layers kept in bf16 (the fix a check proves for the
    planted VAE): its headroom is about what fp16 held; the bf16 layers' larger values are
    reported apart, never as 'fp16 would overflow' beside 'fp16 ok (measured)'."""
    block = "decoder.up_blocks.0.resnets.0"
    settings = PrecisionSettings(
        precision="fp16", bf16_modules=(f"vae:{block}.conv1", f"vae:{block}.norm2")
    )
    report = check(loaded(plant(build_tiny_sd_pipeline(), "vae")), settings)
    assert report.verdict == "healthy"
    vae = report.components["vae"]
    assert vae.dtype == "fp16" and vae.status.value == "ok"
    assert vae.precisions["fp16"].measured and vae.precisions["fp16"].status.value == "ok"
    assert vae.max_abs < 65504 and vae.headroom > 1
    assert vae.wider_max_abs > 65504
    assert vae.to_json()["wider_max_abs"] == pytest.approx(vae.wider_max_abs)
    # Its chart is about fp16's limit too: no block past it, the kept layers' block included.
    assert vae.blocks and all((b.max_abs or 0) < 65504 for b in vae.blocks)
    # A component with no wider layer keeps its one figure.
    assert report.components["unet"].wider_max_abs is None


def test_a_check_counts_the_copies_it_made_and_their_time(vae_report):
    """Timing the candidates places the failing part again for each run: the record says how
    often and how long that took (on a GPU, copies from the RAM can outweigh the runs)."""
    memory = vae_report.memory
    assert memory is not None
    timed = sum(c.cost.rounds or 0 for c in vae_report.fix.candidates if c.cost)
    assert memory.placements > timed >= 2
    assert memory.placing_s >= 0
    assert json.loads(json.dumps(vae_report.to_json()))["memory"]["placements"] == memory.placements


def test_a_check_run_with_the_remembered_fix_in_the_users_settings_names_it():
    """The fix was applied to the settings (the user's settings hold it, as remembered): the check
    ran with it, so its report and its Markdown say so, never a bare "None needed"."""
    from app.core.health.markdown import markdown_report

    first = check(loaded(plant(build_tiny_sd_pipeline(), "vae"), key="held-fix"))
    assert first.verdict == "fixable"
    held = {k: tuple(v) if isinstance(v, list) else v for k, v in first.fix.settings.items()}
    again = check(
        loaded(plant(build_tiny_sd_pipeline(), "vae"), key="held-fix"),
        PrecisionSettings(precision="fp16", **held),
    )
    assert again.verdict == "healthy"
    assert again.remembered == first.fix.summary
    assert again.headline.startswith("Safe with the fix remembered for this model")
    said = markdown_report(again)
    assert "None needed." not in said
    assert (
        f"None beyond the one it ran with, remembered for this model on this device: {first.fix.summary}"
        in said
    )
