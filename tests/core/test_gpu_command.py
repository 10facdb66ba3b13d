"""`halfsafe gpu` on this machine, run as a user would: the JSON holds DESIGN.md's contract and
the plain output is a readable table with the recommendation."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from app.core.settings import PRECISION_KEYS, PrecisionSettings

ROOT = Path(__file__).resolve().parents[2]
DEVICE_KEYS = {
    "kind",
    "index",
    "name",
    "capability",
    "memory_total_mb",
    "driver",
    "fp16",
    "bf16",
    "tf32",
    "quirks",
    "self_test",
    "recommended",
}


def halfsafe(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_gpu_json_holds_the_contract():
    done = halfsafe("gpu", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)

    assert set(report) == {"halfsafe", "torch", "cuda", "devices", "attention_kernels"}
    for kernel in report["attention_kernels"]:  # whatever this environment has installed
        assert set(kernel) == {"name", "version", "patched_sdpa", "function", "diffusers_backend"}
        assert kernel["patched_sdpa"] is False  # nothing replaces SDPA in HalfSafe's own process
    assert isinstance(report["halfsafe"], str) and isinstance(report["torch"], str)
    assert report["cuda"] is None or isinstance(report["cuda"], str)
    assert report["devices"] and report["devices"][-1]["kind"] == "cpu"
    for device in report["devices"]:
        assert set(device) - {"reasons"} == DEVICE_KEYS
        assert device["kind"] in ("cuda", "rocm", "mps", "xpu", "cpu")
        assert device["index"] is None or isinstance(device["index"], int)
        assert isinstance(device["name"], str) and device["name"]
        capability = device["capability"]
        assert capability is None or (
            len(capability) == 2 and all(isinstance(n, int) for n in capability)
        )
        assert device["memory_total_mb"] is None or isinstance(device["memory_total_mb"], int)
        assert device["driver"] is None or isinstance(device["driver"], str)
        assert device["fp16"] in ("fast", "slow", "unreliable", "unsupported")
        assert device["bf16"] in ("native", "emulated", "unsupported")
        assert isinstance(device["tf32"], bool)
        for quirk in device["quirks"]:
            assert set(quirk) == {"id", "summary", "source"}
        test = device["self_test"]
        assert set(test) == {
            "fp16",
            "bf16",
            "details",
            "statistical",
            "statistical_budget_s",
            "statistical_seconds",
            "low_bit",
        }
        # comfy-kitchen is a dev dependency: its low-bit kernels are tried on this CPU too.
        assert isinstance(test["low_bit"], dict)
        assert test["fp16"] in ("pass", "fail", "skipped")
        assert test["bf16"] in ("pass", "fail", "skipped")
        assert isinstance(test["details"], list)
        # The statistical self-test ran within its default budget: one row per operation.
        assert isinstance(test["statistical_budget_s"], float)
        assert test["statistical_budget_s"] > 0
        for row in test["statistical"]:
            assert row["op"] in ("attention", "linear", "matmul")
            assert row["dtype"] in ("fp16", "bf16")
            assert row["status"] in ("measured", "unavailable", "error")
            assert row["bad"] == row["non_finite"] + row["zeros"] + row["wrong"]
            if row["calls"]:
                assert 0 <= row["rate"] <= row["upper_95"] <= 1
                assert row["interval_95"][0] <= row["rate"] <= row["interval_95"][1]
        recommended = device["recommended"]
        assert list(recommended) == list(PRECISION_KEYS)
        PrecisionSettings(**recommended)
        # auto_fix's and vae_tiling's "auto" are choices (vae_tiling's is made per job).
        chosen = [v for k, v in recommended.items() if k not in ("auto_fix", "vae_tiling")]
        assert "auto" not in chosen
        assert set(device["reasons"]) == set(recommended)

    cpu = report["devices"][-1]
    # The self-test ran on the CPU and found its kernels correct.
    assert (cpu["self_test"]["fp16"], cpu["self_test"]["bf16"]) == ("pass", "pass")
    assert {d["op"] for d in cpu["self_test"]["details"]} >= {"conv2d 320->640", "attention:math"}
    assert cpu["recommended"]["precision"] == "fp32"
    assert cpu["recommended"]["no_half"] is True


def test_gpu_prints_a_readable_table():
    done = halfsafe("gpu")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    header = next(line for line in lines if line.startswith("Device"))
    for column in ("Name", "Memory", "fp16", "bf16", "TF32", "Self-test"):
        assert column in header
    row = lines[lines.index(header) + 2]
    assert row.startswith("cpu") and "slow" in row and "pass" in row
    assert "Recommended settings:" in done.stdout
    for key in PRECISION_KEYS:
        assert any(line.strip().startswith(key + " ") for line in lines), key
    assert "Traceback" not in done.stdout + done.stderr


def test_no_self_test_says_it_was_not_run_until_one_is_cached():
    assert "not run" in halfsafe("gpu", "--no-self-test").stdout

    assert halfsafe("gpu", "--json").returncode == 0
    reused = halfsafe("gpu", "--no-self-test").stdout
    cpu_row = next(line for line in reused.splitlines() if line.startswith("cpu "))
    assert "fp16 pass, bf16 pass (cached)" in cpu_row
