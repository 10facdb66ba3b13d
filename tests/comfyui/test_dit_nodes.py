"""HalfSafe's ComfyUI nodes on the DiT families ComfyUI v0.29 loads from a tiny file: Flux.1,
Flux.2 Klein and SD3.5, each a tiny transformer in its released key layout (written by
HalfSafe's layouts), loaded by ComfyUI's own `load_diffusion_model` and run in fp16 on a CPU,
with no CLIP connected (the check's text is zeros of the model's own widths). One planted file
(one attention's query projection past fp16's range, finite in fp32) and one healthy file of
the same family per ComfyUI process.

Needs HALFSAFE_COMFYUI and HALFSAFE_COMFYUI_PYTHON, as test_nodes.py; skipped without them."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.support.comfyui_dits import TINY_DITS, write_tiny_dit
from tests.support.comfyui_env import COMFYUI, NEEDS_COMFYUI, PACKAGE, PYTHON

ROOT = Path(__file__).resolve().parents[2]
ZEROS = "No CLIP connected: the text was zeros of the model's own text width."

pytestmark = NEEDS_COMFYUI


@pytest.fixture(scope="module", params=sorted(TINY_DITS))
def driven(request, tmp_path_factory) -> tuple[str, dict]:
    family = request.param
    work = tmp_path_factory.mktemp(f"comfyui_{family}")
    planted = write_tiny_dit(family, work, planted=True)
    healthy = write_tiny_dit(family, work, planted=False)
    command = [PYTHON, str(Path(__file__).with_name("drive_dit.py")), COMFYUI, str(PACKAGE)]
    command += [str(planted), str(healthy)] + (["--watch"] if family == "flux" else [])
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=480,
        env={**os.environ, "HALFSAFE_DATA_DIR": str(work / "data")},
        cwd=work,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return family, json.loads(done.stdout.strip().splitlines()[-1])


def test_check_names_the_planted_layer_in_comfyuis_names_and_proves_an_island(driven):
    family, found = driven
    check = found["check"]
    assert found["precision"] == {"stored": "fp16", "compute": "fp16", "manual_cast": "False"}
    assert ZEROS in check["text"]
    layer = f"diffusion_model.{TINY_DITS[family].comfyui_layer}"
    assert f"First bad layer: {layer}." in check["text"]
    # The island closes where fp32's values are back in fp16's range: the block around it.
    block = ".".join(TINY_DITS[family].comfyui_layer.split(".")[:2])
    assert check["fix"]["islands"] == {block: "fp32"} and check["fix"]["component"] is None
    assert check["fix"]["quality"]["value"] >= check["fix"]["quality"]["threshold"]
    assert found["untouched"]  # the MODEL passed in: no patch, the same weights


def test_fix_makes_the_call_match_fp32_on_a_clone(driven):
    _, found = driven
    fix = found["fix"]
    assert fix["patches"] == [f"diffusion_model.{next(iter(found['check']['fix']['islands']))}"]
    assert fix["fixed_finite"] and fix["fixed_db"] >= 20
    # Unfixed, the call is wrong: non-finite (SD3.5), or finite where ComfyUI's Flux code
    # replaces fp16's inf and NaN with +-65504 and zeros, and then far from fp32.
    assert not fix["original_finite"] or fix["original_db"] < 0
    assert found["untouched"]


def test_a_clamp_holds_its_layer_in_every_familys_model_code(driven):
    """A clamp is put on through ComfyUI's wrapper of the model's call, which every model
    calls (SD3's MMDiT never calls the diffusion model's own wrapper)."""
    _, found = driven
    assert found["clamp_calls"] >= 1


def test_flux_hides_the_overflow_in_its_output_and_the_check_says_so(driven):
    family, found = driven
    said = "the model's own code replaced the non-finite values"
    assert (said in found["check"]["text"]) == found["fix"]["original_finite"]
    if family.startswith("flux"):
        assert found["fix"]["original_finite"]


def test_a_healthy_file_of_the_family_is_healthy(driven):
    _, found = driven
    healthy = found["healthy"]
    assert healthy["fix"] is None
    assert ZEROS in healthy["text"] and "\nHealthy: every layer stayed finite" in healthy["text"]


@pytest.mark.parametrize("driven", ["flux"], indirect=True)
def test_nan_watch_names_the_step_and_layer_flux_hides_from_its_output(driven):
    family, found = driven
    watch = found["watch"]
    layer = f"diffusion_model.{TINY_DITS[family].comfyui_layer}"
    assert [(f["step"], f["first_bad_layer"]) for f in watch["findings"]] == [(1, layer)]
    assert watch["host_syncs"] == 1 and watch["syncs_watched"] - watch["syncs_plain"] < 3
    assert watch["with_fix"] == []  # the check's fix connected: every step stays finite


@pytest.mark.parametrize("driven", ["flux"], indirect=True)
def test_nan_watch_samples_a_failed_run_again_with_a_proved_fix(driven):
    """No fix connected, the watch's repair on: the run whose blocks passed fp16's range is
    sampled again with a fix (proved on the failing call, or remembered), and what the sampler
    returns is that run's, close to the same sampling with the model in fp32."""
    _, found = driven
    repaired = found["watch"]["repaired"]
    (finding,) = repaired["findings"]
    assert finding["repaired"] and finding["repair"].startswith("Repaired: sampled again")
    assert repaired["repaired_finite"] and repaired["repaired_db"] >= 20
    assert repaired["untouched"]


@pytest.mark.parametrize("driven", ["flux"], indirect=True)
def test_an_overflow_the_blocks_code_holds_at_65504_is_no_healthy_verdict(driven):
    """A residual add past fp16's range, outside any layer, which ComfyUI's Flux block turns
    into 65504: every layer is finite, but the output at fp16's largest value is judged against
    fp32, which it does not match, and a fix is proved: no layer's output overflows in fp32
    either (the add does), so no layer kept wider holds it, and the whole diffusion model runs
    in fp32 (it was "Healthy: every layer stayed finite (headroom 1x)")."""
    _, found = driven
    saturated = found["saturated"]
    assert "Healthy" not in saturated["text"]
    assert "reached fp16's largest value (65504)" in saturated["text"]
    assert "First bad layer: diffusion_model.single_blocks.0" in saturated["text"]
    fix = saturated["fix"]
    assert fix is not None and fix["component"] == "fp32", saturated["text"]
    assert "Overall: fixable" in saturated["text"]
