"""What an image's record or a tool's log can make `halfsafe explain` do: a log that is a FIFO is
one sentence at once, a log of long blank runs is read in time linear in its size (16 MB, the
most read, in seconds), and a record naming tens of thousands of low-bit files, attention
kernels or step caches prints a bounded report, its lists cut with a count of the rest. Through
the real command, in a subprocess under a timeout: a hang fails the test, not the suite."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from PIL import Image

from app.core.explain import records, suspects
from tests.support.cli_output import run_halfsafe, without_progress
from tests.support.image_files import comfy_prompt, png_text

SECONDS = 90  # generous for a loaded 2-core machine; each command takes a few seconds
BLANKS = suspects.MAX_LOG_BYTES - 100  # the most of a log read, less the line that follows


def black_png(path: Path, texts: dict[str, str] | None = None) -> Path:
    """A NaN-black picture, with the text chunks `texts` (a generation record) if given."""
    if texts:
        return png_text(path, texts, Image.new("RGB", (64, 64)))
    Image.new("RGB", (64, 64)).save(path)
    return path


def assert_one_sentence(done, path: Path) -> str:
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    err = without_progress(done.stderr)
    assert err.count("\n") == 1 and err.startswith("halfsafe: "), err
    assert str(path) in err and "Traceback" not in err
    return err


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")
def test_a_log_that_is_a_fifo_is_one_sentence_at_once(tmp_path):
    log = tmp_path / "comfyui.log"
    os.mkfifo(log)

    done = run_halfsafe("explain", str(black_png(tmp_path / "b.png")), "--log", str(log))

    assert "named pipe" in assert_one_sentence(done, log)


def test_a_log_of_a_long_blank_run_is_read_in_linear_time(tmp_path):
    """Blanks where the colon belongs, as many as a log is read: two quantifiers that could
    share the run took minutes for 400 KB of it."""
    log = tmp_path / "comfyui.log"
    text = "unet unexpected" + " " * BLANKS + "\nunet unexpected: ['blocks.0.x.weight']\n"
    log.write_text(text, encoding="utf-8")

    done = run_halfsafe(
        "explain",
        str(black_png(tmp_path / "b.png")),
        "--log",
        str(log),
        "--json",
        timeout=SECONDS,
    )

    assert done.returncode in (0, 1), done.stderr[-2000:]
    found = json.loads(done.stdout)["log"]["unexpected_keys"]
    assert found == [{"part": "unet", "count": 1, "first": "blocks.0.x.weight"}]


@pytest.mark.parametrize("version", ["0.²", "0." + "4" * 5000, "٠.٤١"])
def test_a_version_of_odd_digits_is_no_version(version):
    assert suspects.version_tuple(version) is None


def loaders(count: int) -> str:
    """A ComfyUI prompt whose one loader names `count` int8 files."""
    nodes = json.loads(comfy_prompt("model.safetensors"))
    files = {f"file_{i}": f"flux_{i}_int8.safetensors" for i in range(count)}
    nodes["90"] = {"class_type": "UNETLoader", "inputs": files}
    return json.dumps(nodes)


def many_nodes(count: int, class_type: str, **inputs) -> str:
    """A ComfyUI prompt with `count` nodes of `class_type` beside its sampler."""
    nodes = json.loads(comfy_prompt("model.safetensors"))
    for i in range(count):
        nodes[str(100 + i)] = {"class_type": f"{class_type}{i}", "inputs": dict(inputs)}
    return json.dumps(nodes)


@pytest.mark.parametrize(
    ("prompt", "listed", "total"),
    [
        (loaders(50_000), "low_bit_files", 50_000),
        (
            many_nodes(15_000, "PathchSageAttentionKJ", sage_attention="auto"),
            "attention_kernels",
            15_000,
        ),
        (many_nodes(15_000, "EasyCache", reuse_threshold=0.2), "step_caches", 15_000),
    ],
    ids=["50,000 low-bit files", "15,000 attention kernels", "15,000 step caches"],
)
def test_a_record_of_endless_lists_prints_a_bounded_report(tmp_path, prompt, listed, total):
    path = black_png(tmp_path / "many.png", {"prompt": prompt})

    as_json = run_halfsafe("explain", str(path), "--json", timeout=SECONDS)
    as_text = run_halfsafe("explain", str(path), timeout=SECONDS)

    assert as_json.returncode in (0, 1), as_json.stderr[-2000:]
    assert len(as_json.stdout) < 64_000 and len(as_text.stdout) < 16_000
    record = json.loads(as_json.stdout)["record"]
    kept = {"low_bit_files": record["low_bit_files"]}.get(listed, record.get(listed))
    assert len(kept) == records.MAX_LISTED
    assert record["not_listed"] == {listed: total - records.MAX_LISTED}
    assert f"{total - records.MAX_LISTED:,} more" in as_text.stdout


def test_docs_name_what_a_record_leaves_out():
    docs = (Path(__file__).resolve().parents[2] / "docs" / "json.md").read_text(encoding="utf-8")
    assert "`record.not_listed`" in docs
