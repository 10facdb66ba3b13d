"""The 4-bit integer formats of the LLM encoders in ComfyUI's templates that no library HalfSafe
uses decodes (GPTQ, AWQ's packing of it, comfy-kitchen's W4A8): each file, written here from its
published layout, is refused in one sentence naming the file, the format and a tensor, and the
command exits 2. (NVFP4-AWQ loads: test_quantized.py.)"""

from __future__ import annotations

import json

import pytest
import torch

from app.cli import main
from app.core.checkpoint import Checkpoint, write_safetensors
from app.core.errors import BadFileError
from tests.support.cli_output import without_progress

N, K, GROUP = 64, 256, 128
LAYER = "model.layers.0.mlp.down_proj"
# A plain part beside the packed layers, as an encoder's files keep its norms and embedding.
PLAIN = {
    "model.embed_tokens.weight": torch.zeros(32, K, dtype=torch.bfloat16),
    "model.layers.0.input_layernorm.weight": torch.ones(K, dtype=torch.bfloat16),
}


def gptq(with_order: bool) -> dict[str, torch.Tensor]:
    """One linear layer as GPTQ exports it (AutoGPTQ, GPTQModel): eight 4-bit values per int32
    down the input dimension, zero points packed along the output one, fp16 group scales, and
    the input channels' group order (`g_idx`; AutoAWQ's export of the packing has none)."""
    layer = {
        f"{LAYER}.qweight": torch.randint(-(2**31), 2**31 - 1, (K // 8, N), dtype=torch.int32),
        f"{LAYER}.qzeros": torch.zeros(K // GROUP, N // 8, dtype=torch.int32),
        f"{LAYER}.scales": torch.full((K // GROUP, N), 0.01, dtype=torch.float16),
    }
    if with_order:
        layer[f"{LAYER}.g_idx"] = torch.arange(K, dtype=torch.int32) // GROUP
    return layer


def w4a8() -> dict[str, torch.Tensor]:
    """One linear layer as comfy-kitchen's asym_w4a8_int8 stores it (ComfyUI's `*_w4a8` files):
    two 4-bit codes a byte, an fp8 scale per 16 values, a scale per output channel, the
    16-entry codebook, and the layer's format."""
    config = json.dumps({"format": "asym_w4a8_int8", "group_size": 16, "convrot_groupsize": 256})
    return {
        f"{LAYER}.weight": torch.zeros(N, K // 2, dtype=torch.int8),
        f"{LAYER}.weight_s_rel": torch.ones(N, K // 16).to(torch.float8_e4m3fn),
        f"{LAYER}.weight_s_channel": torch.full((N,), 0.01),
        f"{LAYER}.weight_codebook": torch.linspace(-1, 1, 16),
        f"{LAYER}.comfy_quant": torch.tensor(list(config.encode()), dtype=torch.uint8),
    }


CASES = {
    "gptq": (gptq(True), f"tensor '{LAYER}.qweight' is stored as GPTQ (4-bit integers"),
    "awq": (gptq(False), f"tensor '{LAYER}.qweight' is stored as GPTQ or AWQ (4-bit"),
    "w4a8": (w4a8(), f"tensor '{LAYER}.weight' is stored as W4A8 (comfy-kitchen's asym_w4a8"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_4_bit_llm_file_is_refused_naming_the_file_the_format_and_a_tensor(
    tmp_path, case, capsys
):
    layer, words = CASES[case]
    path = write_safetensors(tmp_path / "qwen3.5_9b_w4a8.safetensors", {**PLAIN, **layer})

    with pytest.raises(BadFileError) as caught:
        Checkpoint(path)

    text = str(caught.value)
    assert text.startswith(f"{path}: {words}"), text
    assert "HalfSafe cannot read" in text and "\n" not in text and text.endswith(".")
    assert main(["check", str(path), "--device", "cpu"]) == 2
    err = without_progress(capsys.readouterr().err)
    assert [line for line in err.splitlines() if line.startswith("halfsafe: ")] == [
        f"halfsafe: {text}"
    ]


def test_plain_int32_tensors_alone_are_no_packed_format(tmp_path):
    path = write_safetensors(
        tmp_path / "ids.safetensors", {**PLAIN, "position_ids": torch.arange(8)[None]}
    )
    with Checkpoint(path) as checkpoint:
        assert "position_ids" in list(checkpoint.keys())


@pytest.mark.slow  # about 20 s here: writing and reading a 151,669-token embedding
def test_a_w4a8_encoder_beside_a_flux3_klein_file_is_the_sentence_naming_it(tmp_path):
    """The template's case: the transformer in bf16, its Qwen3-VL encoder in W4A8 beside it."""
    from safetensors.torch import load_file

    from app.core.models import load_model
    from tests.support.model_files import save_split_files
    from tests.support.tiny_models import build_tiny_flux3_pipeline

    written = save_split_files(build_tiny_flux3_pipeline(distilled=True), tmp_path / "models")
    tensors = load_file(written["text_encoder"])
    name = next(k for k in sorted(tensors) if k.endswith("mlp.down_proj.weight"))
    rows, columns = tensors.pop(name).shape
    base = name.removesuffix("weight")
    tensors[base + "weight"] = torch.zeros(rows, columns // 2, dtype=torch.int8)
    tensors[base + "weight_s_rel"] = torch.ones(rows, columns // 16).to(torch.float8_e4m3fn)
    tensors[base + "weight_s_channel"] = torch.full((rows,), 0.01)
    tensors[base + "weight_codebook"] = torch.linspace(-1, 1, 16)
    written["text_encoder"].unlink()
    encoder = written["text_encoder"].with_name("qwen3vl_4b_w4a8.safetensors")
    write_safetensors(encoder, tensors)

    with pytest.raises(BadFileError) as caught:
        load_model(str(written["transformer"]))

    assert str(caught.value).startswith(f"{encoder}: tensor '{name}' is stored as W4A8")
