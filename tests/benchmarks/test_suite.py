"""The benchmark suite: its entry point runs end to end on the demo model, and its summary
holds each figure to the right target. Timings themselves are never asserted here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import common  # noqa: E402
import run  # noqa: E402


@pytest.mark.slow  # every section's script in its own process: a minute and a half on 2 cores
def test_smoke_profile_prints_a_summary_and_writes_json(tmp_path):
    out = tmp_path / "smoke.json"
    finished = subprocess.run(
        [sys.executable, str(BENCHMARKS / "run.py"), "--profile", "smoke", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    summary = finished.stdout.split("== summary", 1)[1]
    for section in run.PROFILES["smoke"]:
        assert f"\n{section} " in summary, f"no {section} row in:\n{summary}"

    document = json.loads(out.read_text())
    assert document["profile"] == "smoke"
    assert document["machine"]["torch"] and document["machine"]["diffusers"]
    assert set(document["sections"]) == set(run.PROFILES["smoke"])
    for runs in document["sections"].values():
        assert all("error" not in r for r in runs)

    precision = document["sections"]["precision"][0]["results"][0]
    by_choice = {c["choice"]: c for c in precision["choices"]}
    assert set(by_choice) == {"fp16", "bf16", "fp16_upcast", "fp16_vae32", "fp32"}
    assert by_choice["fp32"]["step_vs_no_half"] == 1.0
    assert all(c["finite"] for c in by_choice.values())
    # Weights are counted exactly: fp16 holds half the bytes of fp32.
    assert by_choice["fp16"]["weights_mib"] == pytest.approx(
        by_choice["fp32"]["weights_mib"] / 2, abs=0.1
    )
    assert by_choice["fp16"]["dtypes"]["vae"] == "fp16"
    assert by_choice["fp16_vae32"]["dtypes"] == {**by_choice["fp16"]["dtypes"], "vae": "fp32"}
    assert by_choice["fp16_upcast"]["flags"]["upcast_attention"] is True


def test_unknown_section_is_one_sentence(tmp_path):
    finished = subprocess.run(
        [sys.executable, str(BENCHMARKS / "run.py"), "--only", "gpu-magic"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert finished.returncode == 2
    assert "unknown section 'gpu-magic'" in finished.stderr


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux /proc only")
def test_peak_memory_sees_a_freed_allocation():
    import torch

    with common.PeakMemory("cpu") as meter:
        block = torch.ones(25_000_000)  # 95.4 MiB, written
        del block
    assert meter.mib is not None
    assert 90 < meter.mib < 200
    with common.PeakMemory("cpu") as quiet:
        torch.ones(10).sum()
    assert quiet.mib < 20


def _choice(key, step, peak):
    return {
        "choice": key,
        "words": key,
        "step_ms": step,
        "peak_mib": peak,
        "step_vs_no_half": step / 100,
        "peak_vs_no_half": peak / 1000,
    }


def _precision_document():
    return {
        "results": [
            {
                "model": "sd1",
                "size": 512,
                "choices": [
                    _choice("fp16", 50, 500),
                    _choice("fp16_upcast", 55, 520),
                    _choice("fp16_vae32", 120, 600),  # slower than no-half: missed
                    _choice("fp32", 100, 1000),
                ],
            }
        ]
    }


def test_precision_targets_on_a_gpu_need_time_and_memory():
    rows = {r.case.split(": ")[1]: r for r in run._precision(_precision_document(), "cuda")}
    assert rows["fp16_upcast"].met is True
    assert rows["fp16_vae32"].met is False
    assert rows["fp16"].met is None  # plain fp16 is not a fix; reported, not judged
    assert "fp32" not in rows


def test_precision_targets_on_a_cpu_hold_memory_only():
    rows = {r.case.split(": ")[1]: r for r in run._precision(_precision_document(), "cpu")}
    assert rows["fp16_vae32"].met is True
    assert rows["fp16_vae32"].target == "smaller than no-half"


def test_generation_rows_judge_the_watch_against_one_percent():
    case = {
        "case": "sd1",
        "size": 512,
        "dtype": "fp16",
        "steps": 20,
        "watched_s": 1.02,
        "plain_s": 1.0,
        "callback_only_s": 1.01,
        "watch_overhead_pct": 1.8,
        "watch_ops_us_per_step": 40.0,
        "sync_check": {"added_by_watch_inside_loop": 0},
    }
    rows = run._generation({"cases": [case]}, "cuda")
    assert [r.met for r in rows] == [False, None, True]


def test_every_precision_choice_resolves_to_the_plan_it_names():
    """The GPU-only choices never run on this machine: their settings must still be real
    settings that resolve to what their names say."""
    import precision

    from app.core.precision import resolve_plan
    from app.core.settings import PrecisionSettings

    components = ["text_encoder", "unet", "vae"]
    plans = {
        c.key: resolve_plan(
            PrecisionSettings(auto_fix="off", **c.settings), device="cuda", components=components
        )
        for c in precision.CHOICES
    }
    assert set(plans["fp16"].dtypes.values()) == {"fp16"}
    assert set(plans["bf16"].dtypes.values()) == {"bf16"}
    assert set(plans["fp32"].dtypes.values()) == {"fp32"}
    assert plans["fp16_vae32"].dtypes == {**plans["fp16"].dtypes, "vae": "fp32"}
    assert plans["fp16_upcast"].upcast_attention and not plans["fp16"].upcast_attention
    assert plans["fp32"].allow_tf32 and not plans["fp32_no_tf32"].allow_tf32
    assert plans["fp16_accumulation"].fp16_accumulation and not plans["fp16"].fp16_accumulation
    assert not plans["fp16_full_reduction"].fp16_reduced_precision_reduction
    assert plans["fp16"].fp16_reduced_precision_reduction
    assert plans["autocast"].autocast and plans["autocast"].dtypes == plans["fp16"].dtypes
    assert not plans["fp16"].autocast
    assert {c.key for c in precision.CHOICES if c.gpu_only} == {
        "autocast",
        "fp32_no_tf32",
        "fp16_accumulation",
        "fp16_full_reduction",
    }


def _wait_row(first_line_s: float, check_s: float, generation_s: float = 10.0) -> dict:
    import user_wait

    row = {"first_line_s": first_line_s, "check_s": check_s, "generation_s": generation_s}
    return {**row, **user_wait.judged(row, generation_s)}


def test_wait_rows_hold_the_first_line_to_10_and_the_fix_to_25_percent():
    cli = {"check": {"wall_s": 8.5, "reported_s": 0.53, "first_line_s": 8.1}}
    document = {
        "steps": 20,
        "results": [
            {
                "model": "demo-overflow",
                "size": 128,
                "precision": "fp16",
                "warm": {"ours": [_wait_row(0.9, 2.0)], "baseline": [_wait_row(3.0, 4.0)]},
                "cli": {"ours": [cli]},
            }
        ],
    }
    rows = run._wait(document, "cpu")
    assert [(r.case.split(": ")[1], r.met) for r in rows] == [
        ("first line vs 20-step generation", True),  # 9% of the generation
        ("proved fix (whole check) vs generation", True),  # 20%
        ("first line vs 20-step generation", False),
        ("proved fix (whole check) vs generation", False),
        ("CLI check, wall vs reported", None),
    ]
    assert "(baseline)" in rows[2].case and "(baseline)" not in rows[0].case
    assert rows[4].ours == "8.50 s" and rows[4].baseline == "0.53 s reported"


def test_wait_phases_come_from_the_check_stages_in_order():
    import user_wait

    marks = [
        (0.0, "Checking the text encoder"),
        (1.0, "Checking the VAE"),
        (2.0, "Running the fp32 reference"),
        (2.5, "Trying a fix: run the VAE in fp32"),
        (4.0, "Measuring the fixes for the VAE"),
        (5.0, "Fix proved: run the VAE in fp32. Completing the table of the fixes tried"),
        (5.5, "Completing the table, trying clamp 2 VAE layers to fp16's range"),
        (6.0, "Completing the table, timing the fixes for the VAE"),
        (7.0, "Measuring the cost of the fix"),
        (8.0, "Done"),
    ]
    assert user_wait.phases(marks, 8.25) == [
        {"phase": "probe", "s": 2.0},
        {"phase": "fp32 reference", "s": 0.5},
        {"phase": "fix: run the VAE in fp32", "s": 1.5},
        {"phase": "measuring the fixes", "s": 1.0},
        {"phase": "the table", "s": 0.5},
        {"phase": "the table: clamp 2 VAE layers to fp16's range", "s": 0.5},
        {"phase": "the table: timing", "s": 1.0},
        {"phase": "the fix's cost", "s": 1.0},
        {"phase": "report", "s": 0.25},
    ]
    assert user_wait.phases([], 1.0) == []  # a model built in place reports no load stage


def test_the_family_projection_counts_published_shapes_and_judges_cards_as_placement_does():
    import family_memory

    document = family_memory.run(type("Args", (), {"families": "sd15,sdxl,flux1", "json": None})())
    families = document["families"]
    # The published parameter counts, counted on the meta device.
    assert round(families["sd15"]["parts"]["unet"]["parameters"] / 1e6) == 860
    assert round(families["flux1"]["parts"]["transformer"]["parameters"] / 1e8) == 119
    # SDXL's fp16 UNet (4.8 GiB) is over a 6 GB card's budget (4.0 GiB) and streams; Flux.1's
    # Q4_0 transformer streams on an 8 GB card and fits whole on a 24 GB one.
    assert families["sdxl"]["rows"]["16-bit"]["cards"]["6"] == "streams unet"
    assert families["sdxl"]["rows"]["16-bit"]["cards"]["8"] == "whole"
    assert families["flux1"]["rows"]["Q4_0"]["cards"]["8"] == "streams transformer"
    assert families["flux1"]["rows"]["Q4_0"]["cards"]["24"] == "whole"
    assert family_memory.card_budget(6) == pytest.approx((5.5 - 1.5) * 2**30)
    budget = family_memory.card_budget(8)
    # A part whose resident layers and largest block exceed the budget cannot run at all.
    parts = {
        "unet": {"forms": {"x": {"whole": 9 * 2**30, "resident": budget, "block": 1, "blocks": 3}}}
    }
    assert family_memory.verdict(parts, "x", budget).startswith("no (unet needs")


def test_the_check_split_finds_each_share_in_a_real_checks_profile():
    """`check_split.py` splits a job's profile by function names in HalfSafe and diffusers: on
    a real check of the tiny SD model every share it reads is there (a renamed function would
    read as nothing spent), and the UNet calls are the check's three probed steps."""
    import cProfile
    import pstats

    import check_split

    from app.core import health
    from app.core.health.request import CheckRequest, CheckRun
    from app.core.settings import PrecisionSettings
    from tests.support.planted_sd import loaded
    from tests.support.tiny_models import build_tiny_sd_pipeline

    model = loaded(build_tiny_sd_pipeline(), "split")
    profile = cProfile.Profile()
    profile.enable()
    report = health.check_loaded(
        model,
        CheckRequest(precision=PrecisionSettings(precision="bf16"), device="cpu", size=64),
        run=CheckRun(remember=False, measure_cost=False),
    )
    profile.disable()
    found = check_split.shares(pstats.Stats(profile))
    assert report.verdict == "healthy"
    assert found["unet_n"] == check_split.PROBED_STEPS
    checked = ("placing", "text", "check_denoiser", "decode", "recorder", "unet_calls")
    assert all(found[share] > 0 for share in checked), found
