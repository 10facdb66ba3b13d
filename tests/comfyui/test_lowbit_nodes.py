"""HalfSafe's ComfyUI nodes on low-bit files, the kind users download to fit in 4-12 GB: the
tiny planted SD1 UNet of test_nodes.py with the Linear weights of its transformer blocks saved
as scaled fp8 (older files' `scaled_fp8` layout), fp8 and int8 with a per-tensor `weight_scale`,
and int8 ConvRot (per-row scales on Hadamard-rotated weights), each loaded by ComfyUI v0.29's
own loader into its quantized layers (comfy-kitchen's QuantizedTensor, as ComfyUI installs it)
and run in fp16 on a CPU. An island must compute its layer from the weight dequantized (the
scale applied, the rotation undone), not from the stored values, and copy nothing else.

One ComfyUI process runs all the layouts (drive_lowbit.py). Needs HALFSAFE_COMFYUI and
HALFSAFE_COMFYUI_PYTHON, as test_nodes.py; skipped without them."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.support.comfyui_env import COMFYUI, NEEDS_COMFYUI, PACKAGE, PYTHON

ROOT = Path(__file__).resolve().parents[2]
FORMATS = ("scaled_fp8", "fp8", "int8", "int8_convrot")
ATTENTION = "input_blocks.1.1.transformer_blocks.0.attn1"
PLANTED = f"{ATTENTION}.to_q"  # no bias
ATTENTION_OUT = f"{ATTENTION}.to_out.0"  # with a bias
LOW_BIT_LAYERS = 40  # the Linear layers of the tiny UNet's transformer blocks

pytestmark = NEEDS_COMFYUI


@pytest.fixture(scope="module")
def driven(tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("comfyui_lowbit")
    done = subprocess.run(
        [
            PYTHON,
            str(Path(__file__).with_name("drive_lowbit.py")),
            COMFYUI,
            str(PACKAGE),
            str(work),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HALFSAFE_DATA_DIR": str(work / "data")},
        cwd=work,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(FORMATS) <= set(found)
    return found


@pytest.mark.parametrize("layout", FORMATS)
def test_comfyui_loads_each_file_into_its_quantized_layers(driven, layout):
    found = driven[layout]
    assert found["quantized"] == LOW_BIT_LAYERS and found["planted_quantized"]
    assert found["precision"]["compute"] == "fp16"
    # The report says what the quantized layers hold, not only the plain weights' dtype.
    form = {
        "scaled_fp8": "fp8 with a scale",
        "fp8": "fp8 with a scale",
        "int8": "int8 with a scale",
        "int8_convrot": "int8 ConvRot",
    }[layout]
    held = found["precision"]["low_bit"]
    assert held == f"{LOW_BIT_LAYERS} layers in {form}"
    assert f"stored in fp16 ({held})" in driven[layout]["check"]["text"]


@pytest.mark.parametrize("layout", FORMATS)
@pytest.mark.parametrize("layer", [PLANTED, ATTENTION_OUT])
def test_an_island_of_a_low_bit_layer_computes_the_files_weight_dequantized(driven, layout, layer):
    # Against the layer computed here from the file's own tensors (stored values times their
    # scale, ConvRot's rotation undone) in the island's dtype: a plain torch Linear holding
    # that weight, not ComfyUI's quantized op nor its stored values.
    island = driven[layout]["islands"][layer]
    assert island["bias"] == (layer == ATTENTION_OUT)
    for dtype, torch_dtype in (("fp32", "torch.float32"), ("bf16", "torch.bfloat16")):
        made = island[dtype]
        assert made["kind"] == "torch.nn.modules.linear.Linear"
        assert made["weights"] == [f"Parameter {torch_dtype}"]
        assert made["out_dtype"] == "torch.float32"  # handed back in the dtype it came in
        assert made["error"] <= (1e-6 if dtype == "fp32" else 1e-3), (dtype, made["error"])


@pytest.mark.parametrize("layout", FORMATS)
def test_check_names_the_low_bit_layer_and_proves_an_island(driven, layout):
    check = driven[layout]["check"]
    assert f"First bad layer: diffusion_model.{PLANTED} " in check["text"]
    fix = check["fix"]
    assert fix["islands"] == {ATTENTION: "fp32"} and fix["component"] is None
    assert fix["quality"]["value"] >= fix["quality"]["threshold"]
    assert driven[layout]["untouched"]  # the MODEL passed in: no patch, the same weights


@pytest.mark.parametrize("layout", FORMATS)
def test_fix_is_finite_and_close_to_fp32_copying_only_the_island(driven, layout):
    fix = driven[layout]["fix"]
    assert fix["fixed_finite"] and not fix["original_finite"]
    assert fix["fixed_db"] >= 20
    assert fix["patches"] == [f"diffusion_model.{ATTENTION}"]
    # The island's layers in fp32, plain tensors (none kept quantized); its weights only.
    assert fix["patch_weights"] == ["Parameter torch.float32"]
    assert fix["patch_params"] == fix["island_params"] < fix["model_params"] / 50
    # Every other low-bit layer is the one ComfyUI loaded, its weight still the stored one.
    assert fix["outside"] == LOW_BIT_LAYERS - 4 and fix["outside_kept"]


def test_a_weight_held_in_a_layout_the_nodes_cannot_dequantize_is_one_sentence(driven):
    said = driven["odd_layout"]
    assert said.startswith("its weight is held as Packed, a layout HalfSafe cannot widen yet")
    assert "\n" not in said
