"""A VAE fix HalfSafe Check proves is remembered for the VAE's file and applied by HalfSafe Fix
with no fix connected in the next job (a fresh ComfyUI process), for a VAE the checkpoint
carried and for a VAE file; and the desktop's `halfsafe check` of that checkpoint runs with the
remembered fix, its VAE part included. In the real ComfyUI (v0.29) on a CPU, in ComfyUI's own
Python; the tiny SD1 checkpoint (one attention query planted past fp16) with one decoder
convolution of its VAE planted past fp16's range (finite in fp32), decoding in fp16.

Needs HALFSAFE_COMFYUI and HALFSAFE_COMFYUI_PYTHON, as test_nodes.py; skipped without them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.comfyui_checkpoints import tiny_sd1_checkpoint
from tests.support.comfyui_env import NEEDS_COMFYUI, run_driver
from tests.support.desktop_check import desktop_check

PLANTED_VAE = "first_stage_model.decoder.up.1.block.0.conv1.weight"
VAE_ISLAND = "decoder.up.1.block.0"  # ComfyUI's name of the block the check keeps wider
HALFSAFE_ISLAND = "vae:decoder.up_blocks.0.resnets.0"  # the same block in HalfSafe's names

pytestmark = NEEDS_COMFYUI


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """The checkpoint with its VAE planted, and that VAE alone in a file of its own."""
    from app.core.checkpoint import Checkpoint, write_safetensors

    folder = tmp_path_factory.mktemp("remembered_vae")
    plain = tiny_sd1_checkpoint(folder / "plain.safetensors")
    with Checkpoint(plain) as read:
        names = read.keys()
        tensors = {k: read.get(k) for k in names}
    tensors[PLANTED_VAE] = tensors[PLANTED_VAE].float().mul(1e6).half()
    checkpoint = write_safetensors(folder / "tiny_sd1_vae.safetensors", tensors)
    prefix = "first_stage_model."
    vae = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
    return {"checkpoint": checkpoint, "vae": write_safetensors(folder / "vae.safetensors", vae)}


def in_comfyui(files: dict[str, Path], vae: Path, home: Path, action: str) -> dict:
    return run_driver("drive_remembered.py", [str(files["checkpoint"]), str(vae), action], home)


@pytest.mark.parametrize("carrier", ["checkpoint", "vae"], ids=["checkpoint_vae", "vae_file"])
def test_a_vae_fix_the_check_proved_is_applied_by_fix_in_the_next_job(files, tmp_path, carrier):
    checked = in_comfyui(files, files[carrier], tmp_path, "check")
    assert checked["vae_dtype"] == "float16"
    proved = checked["check"]["fix"]["vae"]
    assert proved["islands"] == {VAE_ISLAND: "fp32"}
    assert "not remembered" not in checked["check"]["text"]

    fixed = in_comfyui(files, files[carrier], tmp_path, "fix")["fix"]

    # Against ComfyUI's own decode of the same VAE built in fp32, through VAEDecode's path.
    assert not fixed["original_finite"]
    assert fixed["fixed_finite"]
    assert fixed["fixed_db"] >= proved["quality"]["threshold"]
    assert fixed["vae_patches"] == [VAE_ISLAND] and fixed["untouched"]
    assert "The VAE: 1 VAE layer(s) kept wider (" in fixed["said"]
    # The diffusion model's part is remembered for the checkpoint whichever file the VAE is.
    assert fixed["model_patches"] == ["diffusion_model.input_blocks.1.1.transformer_blocks.0.attn1"]


def test_the_desktop_runs_with_the_vae_part_the_check_node_remembered(files, tmp_path):
    in_comfyui(files, files["checkpoint"], tmp_path, "check")

    report = desktop_check(files["checkpoint"], tmp_path)

    assert report["remembered"] and "VAE" in report["remembered"]
    assert report["tested"]["unet"] == "fp16" and report["tested"]["vae"] == "fp16"
    # Its fp16 run, with the node's islands kept in fp32 (the VAE's in HalfSafe's names).
    assert report["components"]["vae"]["status"] == "ok"
    assert report["verdict"] == "healthy"
    stored = json.loads((tmp_path / "data" / "profiles.json").read_text())
    (entry,) = stored.values()
    assert HALFSAFE_ISLAND in entry["settings"]["fp32_modules"]
