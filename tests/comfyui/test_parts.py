"""HalfSafe Check on the VAE and the text encoder, and HalfSafe Fix's VAE, in the real ComfyUI
(v0.29 from the vendored archive) on a CPU, in ComfyUI's own Python: the tiny single-file SD1
checkpoint's MODEL (one attention query planted past fp16) and its tiny VAE, decoding in fp16
as `--fp16-vae` makes it, once as it is and once with one decoder convolution planted past
fp16's range (finite in fp32); and SD1's full-size CLIP-L with seeded weights (ComfyUI's text
encoders have fixed full-size configs, so a tiny one does not load), one MLP layer past fp16's
range, which ComfyUI computes in fp32. One ComfyUI process for the module (drive_parts.py).

Needs HALFSAFE_COMFYUI and HALFSAFE_COMFYUI_PYTHON, as test_nodes.py; skipped without them."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.support.comfyui_checkpoints import tiny_sd1_checkpoint
from tests.support.comfyui_env import COMFYUI, NEEDS_COMFYUI, PACKAGE, PYTHON

ROOT = Path(__file__).resolve().parents[2]
VAE_LAYER = "first_stage_model.decoder.up.1.block.0.conv1"
VAE_ISLAND = "decoder.up.1.block.0"  # the resnet block around it: its output is back in range

pytestmark = NEEDS_COMFYUI


@pytest.fixture(scope="module")
def driven(tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("comfyui_parts")
    checkpoint = tiny_sd1_checkpoint(work / "tiny_sd1.safetensors")
    done = subprocess.run(
        [PYTHON, str(Path(__file__).with_name("drive_parts.py")), COMFYUI, str(PACKAGE)]
        + [str(checkpoint)],
        capture_output=True,
        text=True,
        timeout=540,
        env={**os.environ, "HALFSAFE_DATA_DIR": str(work / "data")},
        cwd=work,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_check_names_the_vae_layer_in_comfyuis_names_and_proves_an_island(driven):
    assert driven["vae_dtype"] == "float16"
    text, fix = driven["check"]["text"], driven["check"]["fix"]
    vae = text[text.index("\nVAE: ") :]
    assert "The VAE computing in fp16, one decode of the diffusion model's denoised" in vae
    assert f"\nFirst bad layer: {VAE_LAYER}.\n" in vae
    assert fix["vae"]["islands"] == {VAE_ISLAND: "fp32"} and fix["vae"]["component"] is None
    assert fix["vae"]["quality"]["value"] >= fix["vae"]["quality"]["threshold"]
    # The diffusion model's own fix is kept beside the VAE's, where HalfSafe Fix reads it.
    assert fix["islands"] == {"input_blocks.1.1.transformer_blocks.0.attn1": "fp32"}


def test_the_report_lists_every_part_with_its_verdict_and_the_worst(driven):
    text = driven["check"]["text"]
    assert text.splitlines()[-1] == (
        "Checked: diffusion model fixable, VAE fixable, text encoder healthy. Overall: fixable."
    )


def test_fix_decodes_finite_and_close_to_fp32_on_a_clone_with_one_block_copied(driven):
    fix = driven["fix"]
    # Against ComfyUI's own decode of the same VAE built in fp32, through VAEDecode's path.
    assert fix["fixed_finite"] and fix["fixed_db"] >= 20
    assert not fix["original_finite"]
    assert fix["patches"] == [VAE_ISLAND] and fix["shares_weights"]
    assert "The VAE: 1 VAE layer(s) kept wider (" in fix["said"]


def test_fix_runs_the_whole_vae_in_fp32_without_copying_its_weights(driven):
    whole = driven["whole_vae"]
    assert whole["finite"] and whole["db"] >= 20
    assert whole["stored"] == ["torch.float16"]  # each layer cast for its call, none stored
    assert not whole["original_finite_after"]
    assert "The VAE: the VAE computes in fp32." in whole["said"]


def test_a_vae_fix_without_a_vae_connected_is_said_and_nothing_invented(driven):
    found = driven["no_vae_connected"]
    assert found["vae"]
    assert "connect the VAE to HalfSafe Fix to apply it" in found["said"]


def test_a_vae_part_that_cannot_be_applied_leaves_the_models_fix_on(driven):
    found = driven["vae_part_fails"]
    assert found["model_fixed"] and found["vae_as_given"]
    assert found["said"].startswith("HalfSafe Fix: 1 layer(s) kept wider (diffusion_model.")
    assert (
        "The VAE is used as it is: The VAE has no layer first_stage_model.decoder.no_such_block "
        "to keep wider." in found["said"]
    )


def test_the_model_vae_and_clip_passed_in_are_unchanged(driven):
    assert driven["untouched"] == {"model": True, "vae": True, "clip": True}


def test_an_unplanted_vae_is_healthy(driven):
    healthy = driven["healthy_vae"]
    vae = healthy["text"][healthy["text"].index("\nVAE: ") :]
    assert "\nHealthy: every layer stayed finite (headroom " in vae
    assert "vae" not in healthy["fix"]
    assert healthy["text"].endswith(
        "Checked: diffusion model fixable, VAE healthy. Not connected: CLIP. Overall: fixable."
    )


def test_the_text_encoder_is_checked_as_comfyui_computes_it(driven):
    # ComfyUI computes its text encoders in fp32 whatever they are stored in: the planted layer
    # passes fp16's range there and stays finite, which the report says, with no false fault.
    text = driven["check"]["text"]
    encoder = text[text.index("\nText encoder: ") :]
    assert "computing in fp32, one encode of the empty prompt." in encoder
    assert "Healthy: every layer stayed finite in fp32" in encoder
    assert "past fp16's range: it would overflow in fp16" in encoder


def test_a_vae_of_another_kind_is_one_sentence_and_the_rest_is_reported(driven):
    text = driven["bad_vae"]
    assert "\nVAE: HalfSafe cannot check this VAE (str): " in text
    assert "\nFixable: Keep 1 layer(s) in fp32: diffusion_model." in text
    assert text.endswith("VAE not checked. Not connected: CLIP. Overall: fixable.")
