"""HalfSafe's ComfyUI nodes driven in the real ComfyUI (its source at v0.29 from the vendored
archive, its own loaders, ModelPatcher and KSampler) on a CPU, in ComfyUI's own Python
environment, with a tiny SD1 UNet whose one attention query overflows fp16.

Needs HALFSAFE_COMFYUI (the extracted ComfyUI folder) and HALFSAFE_COMFYUI_PYTHON (a Python
with ComfyUI's requirements and HalfSafe installed without its window), which the test command
(installer/run-tests.sh) sets up; skipped without them."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.support.comfyui_env import COMFYUI, NEEDS_COMFYUI, PACKAGE, PYTHON

ROOT = Path(__file__).resolve().parents[2]
LAYER = "diffusion_model.input_blocks.1.1.transformer_blocks.0.attn1.to_q"
ISLAND = "input_blocks.1.1.transformer_blocks.0.attn1"

pytestmark = NEEDS_COMFYUI


@pytest.fixture(scope="module")
def driven(tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("comfyui")
    env = {**os.environ, "HALFSAFE_DATA_DIR": str(work / "data")}
    done = subprocess.run(
        [PYTHON, str(Path(__file__).with_name("drive.py")), COMFYUI, str(PACKAGE), str(work)],
        capture_output=True,
        text=True,
        timeout=480,
        env=env,
        cwd=work,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_installing_halfsafe_into_comfyuis_environment_brings_no_qt():
    found = subprocess.run(
        [
            PYTHON,
            "-c",
            "import importlib.util as u, app.core.fixing.module_check; "
            "print(u.find_spec('PySide6') is None)",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert found.stdout.strip() == "True", found.stderr


def test_check_names_the_layer_in_comfyuis_names_and_proves_an_island(driven):
    check = driven["check"]
    assert driven["precision"] == {"stored": "fp16", "compute": "fp16", "manual_cast": "False"}
    assert f"First bad layer: {LAYER} (HalfSafe: unet.down_blocks.0.attentions.0." in check["text"]
    assert check["fix"]["islands"] == {ISLAND: "fp32"} and check["fix"]["component"] is None
    assert check["fix"]["quality"]["value"] >= check["fix"]["quality"]["threshold"]
    assert check["image"][0] == 1 and check["image"][3] == 3  # the report as a picture
    assert driven["untouched"]  # the MODEL passed in: no patch, the same weights


def test_check_holds_one_layers_fp32_copy_beside_the_islands_never_the_models(driven):
    # Copies of the diffusion model's weights made while the Check node ran (its fp32
    # reference widens one layer at a time; the proved island is copied once, for the trial).
    copies = driven["copies"]
    assert 0 < copies["peak"] <= copies["largest_layer"] + copies["island"]
    assert copies["peak"] < copies["model_fp32"] / 4


def test_fix_gives_a_finite_call_on_a_clone_copying_only_the_island(driven):
    fix = driven["fix"]
    assert fix["fixed_finite"] and not fix["original_finite"]
    assert fix["original_patches"] == 0
    assert fix["island_params"] == fix["layer_params"] < fix["model_params"] / 50


def test_a_unet_file_alone_is_remembered_under_its_own_key(driven):
    # The desktop loads a UNet file only with a VAE beside it, whose file is then part of its
    # key: the nodes keep the fix under the file's own identity, which the next job finds.
    assert "not remembered" not in driven["check"]["text"]
    remembered = driven["remembered"]
    assert not remembered["unchanged"]
    assert remembered["said"].startswith("HalfSafe Fix: 1 layer(s) kept wider (diffusion_model.")
    assert "The fix remembered for this model on this device: Keep 1 layer(s)" in remembered["said"]


def test_nan_watch_names_the_step_and_layer_with_one_read_at_the_end(driven):
    watch = driven["watch"]
    assert [(f["step"], f["first_bad_layer"]) for f in watch["findings"]] == [(1, LAYER)]
    assert watch["host_syncs"] == 1
    # Scalar reads beyond the sampler's own: those of the one read at the end, not one a step.
    assert watch["syncs_watched"] - watch["syncs_plain"] < 3


def test_bad_input_is_one_sentence_never_an_error(driven):
    for said in driven["bad_input"].values():
        assert said.startswith("HalfSafe cannot check this MODEL (str)") and "\n" not in said


def test_nan_watch_repairs_a_failed_run_with_a_proved_fix(driven):
    """No fix connected, the watch's repair on: the run that went non-finite is sampled again
    with a fix proved on its failing call (or the one remembered for this file), and the sampler
    returns that run's samples: finite, and close to the same sampling in fp32. Repairing costs
    one more read of the flag, only in a run that failed."""
    repaired = driven["repaired"]
    assert not repaired["plain_finite"]
    (finding,) = repaired["findings"]
    assert (finding["step"], finding["first_bad_layer"]) == (1, LAYER)
    assert finding["repaired"], finding["repair"]
    assert finding["repair"].startswith("Repaired: sampled again with the fix")
    assert repaired["repaired_finite"] and repaired["repaired_db"] >= 20
    assert repaired["host_syncs"] == 2
    assert repaired["untouched"]
