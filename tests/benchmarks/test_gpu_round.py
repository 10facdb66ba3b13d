"""The GPU round (`benchmarks/gpu_round.sh`): each half fits one device call, its dry run on the
CPU writes every step's figures, and its cost model fits and projects as it says."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
ROUND = BENCHMARKS / "gpu_round.sh"
sys.path.insert(0, str(BENCHMARKS))

import cost_model  # noqa: E402

# One device call may run 600 s; each half leaves a minute of it for the machine's start-up.
HALF_LIMIT_S = 540
HALVES = ("check", "generate")
# What each half must measure (the list), by step.
WANTED = {
    "check": {"health-sd1", "health-sdxl", "planted-sdxl", "cost-model"},
    "generate": {"fix-cost-truth", "island-guards", "watch-sd1", "watch-sdxl", "option-b"},
}


def steps_of(half: str) -> dict[str, int]:
    """The steps of one half of the round and their boxes in seconds, read from the script."""
    text = ROUND.read_text()
    body = re.search(rf"^{half}_half\(\) \{{\n(.*?)^\}}", text, re.MULTILINE | re.DOTALL)
    assert body, f"no {half}_half function in {ROUND.name}"
    return {name: int(box) for name, box in re.findall(r"^\s*step (\S+) (\d+) ", body[1], re.M)}


@pytest.mark.parametrize("half", HALVES)
def test_each_half_holds_its_steps_within_one_call(half):
    steps = steps_of(half)
    assert set(steps) == WANTED[half]
    assert sum(steps.values()) <= HALF_LIMIT_S, steps
    # Each step writes its own figures, named after it.
    text = ROUND.read_text()
    for name in steps:
        assert f'"$out/{name}.json"' in text


def test_a_wrong_half_is_one_sentence(tmp_path):
    done = subprocess.run(
        ["bash", str(ROUND), "everything", str(tmp_path)], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert done.stderr.strip() == "gpu_round.sh: the half is check or generate, not everything"


def _point(model, size, calls, flops, moved, rates=(20e-6, 1 / 50e12, 1 / 1e12)):
    per_call, per_flop, per_byte = rates
    seconds = calls * per_call + flops * per_flop + moved * per_byte
    return {
        "model": model,
        "size": size,
        "calls": calls,
        "flops": flops,
        "bytes": moved,
        "weights_bytes": 1.7e9 if model == "sd1" else 5.1e9,
        "step_ms": seconds * 1000,
    }


def _points():
    points = []
    for size in (256, 384, 512, 768):
        scale = (size / 512) ** 2
        points.append(_point("sd1", size, 900 + size // 8, 0.8e12 * scale, 2.2e9 + 3e9 * scale))
    for size in (512, 768, 1024):
        scale = (size / 1024) ** 2
        points.append(_point("sdxl", size, 1700 + size // 8, 2.9e12 * scale, 5.4e9 + 9e9 * scale))
    return points


def test_the_fit_recovers_the_rates_that_made_the_steps():
    fitted = cost_model.fit(_points())
    assert fitted["per_call_s"] == pytest.approx(20e-6, rel=1e-3)
    assert fitted["per_flop_s"] == pytest.approx(1 / 50e12, rel=1e-3)
    assert fitted["per_byte_s"] == pytest.approx(1 / 1e12, rel=1e-3)
    assert all(abs(e) < 1e-3 for e in cost_model.left_out_errors(_points()))


def test_a_projection_scales_each_rate_by_the_cards_published_peak():
    h100 = cost_model.published("NVIDIA H100 80GB HBM3")
    assert h100 is not None and h100.name == "H100 SXM"
    assert cost_model.published("NVIDIA H100 PCIe").name == "H100 PCIe"
    assert cost_model.published("cpu") is None
    peaks = {"tflops": h100.tflops, "gb_per_s": h100.gb_per_s, "source": h100.source}
    fitted = {"per_call_s": 20e-6, "per_flop_s": 1 / 500e12, "per_byte_s": 1 / 2e12}
    card = cost_model.PUBLISHED["rtx 3060"]
    projected = cost_model.project(fitted, peaks, card)
    # Half of the H100's published arithmetic there is half of the 3060's here.
    assert 1 / projected["per_flop_s"] == pytest.approx(500e12 * card.tflops / h100.tflops)
    assert 1 / projected["per_byte_s"] == pytest.approx(2e12 * card.gb_per_s / h100.gb_per_s)
    assert projected["per_call_s"] == fitted["per_call_s"]
    # SDXL's fp16 UNet (4.8 GiB) streams on a 6 GB card, and fits a 12 GB one whole.
    assert cost_model.streams_on(cost_model.PUBLISHED["rtx 2060"], 5.1e9)
    assert not cost_model.streams_on(card, 5.1e9)


def test_the_docs_section_is_replaced_between_its_markers_only(tmp_path):
    docs = tmp_path / "benchmarks.md"
    docs.write_text(f"# head\n{cost_model.DOCS_BEGIN}\nold table\n{cost_model.DOCS_END}\ntail\n")
    cost_model.write_docs(docs, "new table")
    assert docs.read_text() == (
        f"# head\n{cost_model.DOCS_BEGIN}\nnew table\n{cost_model.DOCS_END}\ntail\n"
    )
    bare = tmp_path / "bare.md"
    bare.write_text("# nothing marked\n")
    with pytest.raises(SystemExit, match="has no cost-model section"):
        cost_model.write_docs(bare, "new table")
    # The project's own page holds the section the round writes.
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    assert text.count(cost_model.DOCS_BEGIN) == 1 and text.count(cost_model.DOCS_END) == 1


def _table_rows(text: str) -> list[list[str]]:
    section = text.split(cost_model.DOCS_BEGIN, 1)[1].split(cost_model.DOCS_END, 1)[0]
    return [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in section.splitlines()
        if line.startswith("|")
    ]


def _dry_run(half: str, tmp_path: Path) -> Path:
    """One half of the round on the CPU with the tiny models (`--tiny`), every step exit 0 with
    its figures and the machine's torch; the docs page untouched. Returns the output folder."""
    if shutil.which("timeout") is None:
        pytest.skip("coreutils' timeout is not there")
    out = tmp_path / "round"
    docs_before = (ROOT / "docs" / "benchmarks.md").read_text()
    done = subprocess.run(
        ["bash", str(ROUND), half, str(out), "--device", "cpu", "--tiny"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHON": sys.executable, "LOGS": str(tmp_path)},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for name in steps_of(half):
        assert f"== {name}: exit 0," in done.stdout, done.stdout[-4000:]
        document = json.loads((out / f"{name}.json").read_text())
        assert document["machine"]["torch"]
    # The cost model's table goes in the copy of the page the dry run writes, not in the page.
    assert (ROOT / "docs" / "benchmarks.md").read_text() == docs_before
    return out


# Each half on its own (a worker each), as the round runs them: four and five steps, a process
# each, 1-2 min of CPU apiece and a few minutes on a busy 2-core VM.
@pytest.mark.slow
def test_the_dry_run_of_the_check_half_writes_its_figures_and_the_cost_table(tmp_path):
    out = _dry_run("check", tmp_path)
    # What each step was there to measure.
    health = json.loads((out / "health-sd1.json").read_text())["results"][0]
    assert health["generation"] == "app" and health["verdict"] == "healthy"
    assert health["unet_stage_bare_s"] > 0 and health["unet_stage_hooked_s"] > 0
    planted = json.loads((out / "planted-sdxl.json").read_text())["results"][0]
    assert planted["verdict"] == "fixable"
    assert {"first_finding", "proved_fix", "verdict"} <= set(planted["work"]["milestones"])
    assert planted["work"]["calls"]["unet"]
    rows = _table_rows((out / "benchmarks.md").read_text())
    head, rule, body = rows[0], rows[1], rows[2:]
    assert head[-2:] == ["RTX 2060 ms", "RTX 3060 ms"] and "error left out" in head
    assert all(cell.startswith("---") for cell in rule)
    fitted = json.loads((out / "cost-model.json").read_text())
    assert len(body) == len(fitted["points"]) == 2 * len(cost_model.TINY_SIZES)
    for row in body:
        assert len(row) == len(head)
        assert row[0] in ("sd1", "sdxl")
        assert float(row[-1].split()[0]) > 0 and float(row[-2].split()[0]) > 0


@pytest.mark.slow
def test_the_dry_run_of_the_generate_half_writes_its_figures(tmp_path):
    out = _dry_run("generate", tmp_path)
    truth = json.loads((out / "fix-cost-truth.json").read_text())["cases"][0]
    assert truth["stated_step_ms"] > 0 and truth["generation_step_ms"] > 0
    guards = json.loads((out / "island-guards.json").read_text())["rows"]
    assert (
        guards["downstream"]["guard_calls_per_step"] < guards["everywhere"]["guard_calls_per_step"]
    )
    for case in ("sd1", "sdxl"):
        watch = json.loads((out / f"watch-{case}.json").read_text())["cases"]
        assert [c["case"] for c in watch] == [case]
    option_b = json.loads((out / "option-b.json").read_text())
    assert option_b["cases"][0]["case"] == "sd1-tiny-64px"
    assert option_b["summary"]["denoiser_proofs"] >= 1
