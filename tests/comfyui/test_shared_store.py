"""One store of remembered fixes for the desktop and the nodes: a fix proved by `halfsafe check`
(HalfSafe's own Python) is used by HalfSafe Fix in ComfyUI's Python with no fix connected, and
one proved by HalfSafe Check is the remembered fix `halfsafe check` runs with. Both sides key
the file by HalfSafe's identity of it and the device by HalfSafe's name of it; each runs in its
own environment, on the CPU, as a separate process.

The model is a single-file SD1 checkpoint loaded by ComfyUI's own checkpoint loader: a UNet of
the shape ComfyUI's detection reads as SD1 (320 channels, a 768-wide context, one level), one
attention query scaled past fp16's range, and a tiny text encoder and VAE (which ComfyUI is
not asked to load: its text encoders have fixed full-size configs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.comfyui_checkpoints import PLANTED, tiny_sd1_checkpoint
from tests.support.comfyui_env import NEEDS_COMFYUI, run_driver
from tests.support.desktop_check import desktop_check

ROOT = Path(__file__).resolve().parents[2]
# Where the planted region sits in ComfyUI's names (HalfSafe's on the left).
COMFY_BLOCK = ("down_blocks.0.attentions.0", "input_blocks.1.1")

pytestmark = NEEDS_COMFYUI


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return tiny_sd1_checkpoint(tmp_path_factory.mktemp("store") / "tiny_sd1.safetensors")


def in_comfyui(checkpoint: Path, home: Path, action: str) -> dict:
    return run_driver("drive_store.py", [str(checkpoint), action], home)


def comfy_path(entry: str) -> str:
    """HalfSafe's `unet:PATH` in the planted region as ComfyUI's object-patch key."""
    return "diffusion_model." + entry.removeprefix("unet:").replace(*COMFY_BLOCK)


def test_a_fix_the_desktop_proved_is_used_by_the_fix_node(checkpoint, tmp_path):
    report = desktop_check(checkpoint, tmp_path)
    assert report["verdict"] == "fixable" and report["fix"]["verified"]
    settings = report["fix"]["settings"]
    assert report["components"]["unet"]["first_bad_module"] == PLANTED

    found = in_comfyui(checkpoint, tmp_path, "fix")
    assert found["precision"]["compute"] == "fp16"
    fix = found["fix"]
    # The desktop picks among verified fixes by their cost on this machine: whichever it
    # remembered is the one the node applies, with no fix connected.
    wider = [e for k in ("fp32_modules", "bf16_modules") for e in settings.get(k, [])]
    assert fix["islands"] == sorted(comfy_path(e) for e in wider)
    expected = {"bf16": "bfloat16", "fp32": "float32"}.get(settings.get("unet_precision", ""))
    assert fix["compute"] == expected
    if settings.get("clamp_modules"):
        assert "clamped to fp16's range" in fix["said"]
    assert report["fix"]["summary"] in fix["said"]
    assert fix["fixed_finite"] and not fix["original_finite"]
    assert fix["original_patches"] == 0  # the MODEL passed in is not changed


def test_a_fix_the_check_node_proved_is_the_one_the_desktop_runs_with(checkpoint, tmp_path):
    found = in_comfyui(checkpoint, tmp_path, "check")
    proved = found["check"]["fix"]
    assert proved and proved["islands"] == {COMFY_BLOCK[1] + ".transformer_blocks.0.attn1": "fp32"}
    assert "not remembered" not in found["check"]["text"]

    report = desktop_check(checkpoint, tmp_path)
    assert report["remembered"] == proved["summary"]
    assert report["verdict"] == "healthy"  # its fp16 run, with the node's island kept in fp32
    assert report["tested"]["unet"] == "fp16"
    assert report["headline"].startswith("Safe with the fix remembered for this model")
