"""HalfSafe Check tells an attention kernel fault from an fp16 overflow inside the real ComfyUI
(v0.29 from the vendored archive, on a CPU, computing in fp16 as on a GPU), as the desktop does:
the same denoiser call at the same precision on PyTorch's own attention, judged against fp32.

A tiny single-file SD1 checkpoint with nothing planted, loaded by ComfyUI's checkpoint loader,
runs with ComfyUI's attention replaced by a build that returns NaN on every call (in fp32 too,
so no precision fix could be right): the check names the kernel, its fix switches the backend
and keeps fp16, HalfSafe Fix applies it on a clone, and the store keeps it for the desktop. Then,
on the working kernel, a UNet with one attention query past fp16's range is still an overflow
with its island fix. One ComfyUI process for the module.

Needs HALFSAFE_COMFYUI and HALFSAFE_COMFYUI_PYTHON, as test_nodes.py; skipped without them."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.support.comfyui_checkpoints import tiny_sd1_checkpoint
from tests.support.comfyui_env import COMFYUI, NEEDS_COMFYUI, PACKAGE, PYTHON, run_driver

ROOT = Path(__file__).resolve().parents[2]
ATTENTION = "diffusion_model.input_blocks.1.1.transformer_blocks.0.attn1"
BROKEN = "attention_broken_build"

pytestmark = NEEDS_COMFYUI


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("comfyui_kernels")


@pytest.fixture(scope="module")
def checkpoint(work) -> Path:
    return tiny_sd1_checkpoint(work / "tiny_sd1.safetensors", planted=False)


@pytest.fixture(scope="module")
def driven(work, checkpoint) -> dict:
    done = subprocess.run(
        [PYTHON, str(Path(__file__).with_name("drive_kernels.py")), COMFYUI, str(PACKAGE)]
        + [str(checkpoint), str(work)],
        capture_output=True,
        text=True,
        timeout=480,
        env={**os.environ, "HALFSAFE_DATA_DIR": str(work / "data")},
        cwd=work,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_broken_attention_kernel_is_named_a_kernel_fault_not_an_overflow(driven):
    assert driven["precision"] == {"stored": "fp16", "compute": "fp16", "manual_cast": "False"}
    assert "\nHealthy: every layer stayed finite" in driven["working"]  # the model is sound
    text, fix = driven["check"]["text"], driven["check"]["fix"]
    assert f"First bad layer: {ATTENTION} (HalfSafe: unet." in text
    assert "Attention kernel fault, not an overflow: ComfyUI's attention ran " in text
    assert f".{BROKEN};" in text  # the function ComfyUI's attention dispatched to, by name
    assert "at the same precision (fp16) its pytorch backend" in text
    # The recorded call's evidence: the layer's inputs were finite and in fp16's range.
    assert f"Evidence: the inputs of {ATTENTION} were finite and within fp16's range" in text
    assert "--use-pytorch-cross-attention" in text and "HalfSafe Fix" in text
    # The fix switches the backend and keeps the precision: no island, no wider component.
    assert fix["attention"] == "pytorch"
    assert fix["islands"] == {} and fix["component"] is None
    assert fix["made_at"] == {"unet_precision": "fp16"}
    assert fix["quality"]["value"] >= fix["quality"]["threshold"] == 20
    assert "no precision change" in fix["summary"] and "Keep" not in text


def test_the_fix_node_switches_attention_on_a_clone_and_matches_fp32(driven):
    assert not driven["broken_sampled_finite"]  # the sampler's latent, unfixed: NaN
    fixed = driven["fixed"]
    assert fixed["said"].startswith("HalfSafe Fix: attention switched to ComfyUI's pytorch")
    assert fixed["finite"] and fixed["db"] >= 20  # against fp32 on the working kernel
    assert fixed["sampled_finite"]  # three KSampler steps with the broken kernel installed
    assert fixed["object_patches"] == [] and fixed["compute"] == "fp16"  # no islands, fp16
    assert fixed["override"] == "Switch"
    assert driven["untouched"]  # the MODEL passed in: no patch, no override, same weights


def test_the_nan_watch_puts_a_connected_kernel_switch_on_and_the_run_is_finite(driven):
    """NaN Watch with Check's kernel fix connected puts the whole fix on its clone, the
    attention switch too, as HalfSafe Fix does: the broken kernel's run comes out finite and
    the watch finds nothing (it had put nothing on, said the fix was on, and let the black
    picture through)."""
    assert driven["watched"] == {"sampled_finite": True, "findings": []}


def test_the_store_keeps_the_switch_for_the_fix_node_and_the_desktop_reads_it(
    driven, checkpoint, work, monkeypatch
):
    remembered = driven["remembered"]
    summary = driven["check"]["fix"]["summary"]
    assert f"The fix remembered for this model on this device: {summary}" in remembered["said"]
    assert remembered["finite"] and remembered["db"] >= 20 and remembered["sampled_finite"]
    assert remembered["object_patches"] == []

    import torch

    from app.core.fixing import profiles
    from app.core.hardware.devices import describe_device
    from app.core.models.single_file import file_profile_key

    monkeypatch.setenv("HALFSAFE_DATA_DIR", str(work / "data"))
    found = profiles.lookup(file_profile_key(checkpoint), describe_device(torch.device("cpu")).name)
    assert found.notes == [] and found.fix is not None
    # ComfyUI's pytorch backend is PyTorch's SDPA choosing its kernel: the desktop's `auto`.
    assert dict(found.fix.settings) == {"attention_backend": "auto"}
    assert found.fix.summary == summary and found.fix.verified_by == "health check"


def test_a_real_overflow_on_a_working_kernel_keeps_its_island_fix(driven):
    text, fix = driven["overflow"]["text"], driven["overflow"]["fix"]
    assert f"First bad layer: {ATTENTION}.to_q (HalfSafe: unet." in text
    assert "kernel" not in text.lower()
    assert fix["islands"] == {ATTENTION.removeprefix("diffusion_model."): "fp32"}
    assert not fix.get("attention") and fix["component"] is None


def test_a_layer_kept_wider_takes_each_jobs_own_lora_not_an_earlier_ones(tmp_path):
    """HalfSafe Fix copies the layers it keeps wider from the model ComfyUI's clones share,
    which the standard patcher leaves holding the last job's LoRA merged in: each copy is made
    from the weights as loaded and takes its own job's LoRA (before, a LoRA changed or removed
    since stayed in those layers: 1.0 in every job)."""
    found = run_driver("drive_island_lora.py", [], tmp_path)
    assert found == {
        "fix, LoRA 1.0": 1.0,
        "fix, LoRA 0.5": 0.5,
        "fix, no LoRA": 0.0,
        "no fix, LoRA 1.0": 1.0,
        "fix again, no LoRA": 0.0,
        "plain after": 0.0,
    }
