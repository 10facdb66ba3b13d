"""HalfSafe Check's text encoder check on ComfyUI's Lens GPT-OSS text encoder, in the real
ComfyUI (v0.29 from the vendored archive) on a CPU, in ComfyUI's own Python: a tiny encoder
file (GPT-OSS's layout, its tokenizer JSON inside) loaded by `comfy.sd.load_clip` in fp16, as it
is and with one attention projection planted past fp16's range. Lens answers the empty prompt
with zeros and runs no layer, and computes in the dtype it stores (fp16), where ComfyUI's other
text encoders compute in fp32. One ComfyUI process for the module (drive_lens_clip.py).

Needs HALFSAFE_COMFYUI and HALFSAFE_COMFYUI_PYTHON, as test_nodes.py; skipped without them."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.support.comfyui_env import COMFYUI, NEEDS_COMFYUI, PACKAGE, PYTHON

ROOT = Path(__file__).resolve().parents[2]
PLANTED = "cond_stage_model.gpt_oss.transformer.layers.0.self_attn.q_proj"
FIRST_LINE = (
    "The text encoder stored in fp16, computing in fp16, one encode of the prompt "
    "'a photo of a cat'."
)

pytestmark = NEEDS_COMFYUI


@pytest.fixture(scope="module")
def driven(tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("comfyui_lens")
    done = subprocess.run(
        [PYTHON, str(Path(__file__).with_name("drive_lens_clip.py")), COMFYUI, str(PACKAGE)]
        + [str(work)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HALFSAFE_DATA_DIR": str(work / "data")},
        cwd=work,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_comfyui_loads_the_file_as_lens_in_fp16_and_it_skips_the_empty_prompt(driven):
    for name in ("sound", "planted"):
        found = driven[name]
        assert found["encoder"] == "LensGptOssClipModel"
        assert found["stored"] == ["torch.float16"] and found["output_dtype"] == "torch.float16"
        assert found["empty_tokens"] == {"gpt_oss": [[]]}  # nothing for a layer to run on
        assert found["prompt_tokens"] > driven["txt_offset"]  # the prompt's words reach it


def test_an_encoder_that_skips_the_empty_prompt_is_checked_on_words(driven):
    # Not "healthy" on an encode that ran no layer: the prompt with words is encoded, its
    # layers recorded, and the report says which prompt and the fp16 headroom it measured.
    sound = driven["sound"]
    assert sound["verdict"] == "healthy"
    assert sound["lines"][0] == FIRST_LINE
    assert sound["lines"][1].startswith("Healthy: every layer stayed finite (headroom ")


def test_an_overflow_in_a_lens_layer_is_named_and_its_fp32_fix_is_true(driven):
    planted = driven["planted"]
    assert not planted["finite"] and planted["fp32_finite"]  # the fault, and what fp32 does
    assert planted["lines"][0] == FIRST_LINE
    assert planted["first_bad_layer"] == PLANTED
    assert f"First bad layer: {PLANTED}." in planted["lines"]
    assert planted["verdict"] == "fixable"
    assert planted["fix"]["component"] == "fp32" and planted["fix"]["islands"] == {}
    assert "--fp32-text-enc" in planted["fix"]["summary"]


def test_the_check_leaves_the_encoder_as_it_found_it(driven):
    assert driven["sound"]["untouched"] and driven["planted"]["untouched"]


def test_halfsafe_fix_with_the_clip_connected_makes_its_encode_the_fp32_one(driven):
    """The check's text-encoder fix applied by HalfSafe Fix: its CLIP output encodes in fp32
    (each module that keeps a compute dtype told fp32 by an object patch, nothing copied) and
    agrees with the encoder built in fp32; the CLIP passed in still encodes as it did."""
    fixed = driven["planted"]["fixed"]
    assert "The CLIP: the text encoder computes in fp32" in fixed["said"]
    assert fixed["finite"] and fixed["dtype"] == "torch.float32"
    assert fixed["db"] >= 40
    assert fixed["patches"] > 0 and not fixed["copied"]
    before, after = fixed["original_patches"]
    assert before == after and fixed["untouched"]
