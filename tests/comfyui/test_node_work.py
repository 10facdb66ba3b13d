"""HalfSafe Check in ComfyUI does no more work than `halfsafe check` on the same file: the
diffusion model's calls (all, and those in fp32) and the copies it makes, counted, never timed.
The file is a single-file SD1 checkpoint with one attention query planted past fp16's range,
loaded by ComfyUI's own checkpoint loader; the desktop checks it in fp16 as ComfyUI computes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.support.comfyui_checkpoints import tiny_sd1_checkpoint
from tests.support.comfyui_env import COMFYUI, NEEDS_COMFYUI, PYTHON
from tests.support.desktop_check import desktop_check, environment

ROOT = Path(__file__).resolve().parents[2]

pytestmark = NEEDS_COMFYUI


def test_the_check_node_does_no_more_work_than_the_desktop_check(tmp_path):
    checkpoint = tiny_sd1_checkpoint(tmp_path / "tiny_sd1.safetensors")
    desktop = desktop_check(checkpoint, tmp_path / "desktop")
    done = subprocess.run(
        [PYTHON, str(Path(__file__).with_name("drive_work.py")), COMFYUI]
        + [str(ROOT / "comfyui-halfsafe"), str(checkpoint)],
        capture_output=True,
        text=True,
        timeout=300,
        env=environment(tmp_path / "node"),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    node = json.loads(done.stdout.strip().splitlines()[-1])
    print(json.dumps({"desktop": desktop["work"], "node": node["work"]}))

    assert desktop["verdict"] == node["verdict"] == "fixable"
    theirs, ours = desktop["work"], node["work"]
    node_calls = ours["calls"]["unet"]
    assert 0 < sum(node_calls.values()) <= sum(theirs["calls"]["unet"].values())
    assert 0 < node_calls.get("fp32", 0) <= theirs["calls"]["unet"].get("fp32", 0)
    assert 0 < ours["placements"] <= theirs["placements"]
    # The report tells the same counts.
    each = ", ".join(f"{n} in {dtype}" for dtype, n in sorted(node_calls.items()))
    assert (
        f"The check ran the diffusion model {sum(node_calls.values())} times ({each})"
        in (node["text"])
    )
