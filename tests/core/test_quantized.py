"""Quantized checkpoints: fp8 safetensors (plain and scaled) and GGUF files, built in code from
tiny models, written to files, loaded through the same loaders as any file, and scanned."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter

from app.cli import main
from app.core import causes, health, models
from app.core.checkpoint import Checkpoint, scan_weights, write_safetensors
from app.core.components import Status, Verdict
from app.core.errors import BadFileError
from app.core.formats import layouts
from app.core.formats.gguf import check_gguf_header
from app.core.formats.quantized import dequantize_scaled
from app.core.health.request import CheckRequest, CheckRun
from app.core.models import split
from app.core.settings import PrecisionSettings
from tests.support.cli_output import without_progress
from tests.support.family_helpers import offline  # noqa: F401 - an autouse fixture: no network
from tests.support.model_files import ldm_state_dict, save_split_files
from tests.support.quantized_files import (
    E4M3,
    STEP,
    UNET_LAYER,
    close_to,
    flux_gguf,
    fp8_scaled,
    gguf_split_set,
    is_quantizable,
    sd1_file,
    write_gguf,
)
from tests.support.tiny_models import (
    build_tiny_chroma_pipeline,
    build_tiny_flux_pipeline,
    build_tiny_qwenimage_pipeline,
    build_tiny_sd3_pipeline,
    build_tiny_sd_pipeline,
    build_tiny_zimage_pipeline,
)

FP16 = PrecisionSettings(precision="fp16")


# fp8 safetensors ---------------------------------------------------------------------------


def test_scaled_fp8_single_file_loads_with_every_scale_applied_and_checks_healthy(tmp_path):
    path, stored, exact, original = sd1_file(tmp_path)

    model = models.load_model(str(path))

    assert model.quantization.to_json() == {
        "format": "fp8_scaled",
        "types": ["F8_E4M3"],
        "files": [path.name],
        "dequantized_to": "bf16",
        "dequantized_on_load": [],
    }
    assert model.weights.bad_quantized == [] and model.weights.non_finite == []
    # Every weight read dequantised with its own scale (the scales are far from 1, so a dropped
    # one would be off by hundreds of times).
    with Checkpoint(path) as checkpoint:
        assert "scaled_fp8" not in checkpoint.shapes
        assert not any(k.endswith("scale_weight") for k in checkpoint.shapes)
        for key in exact:
            close_to(checkpoint.get(key), exact[key], original[key])
    unet = model.pipeline.unet.state_dict()
    close_to(
        unet["down_blocks.0.attentions.0.proj_in.weight"].reshape(-1), exact[UNET_LAYER].reshape(-1)
    )

    report = health.check_loaded(
        model,
        CheckRequest(precision=FP16, device="cpu", size=64),
        run=CheckRun(remember=False, measure_cost=False),
    )
    assert report.verdict is Verdict.HEALTHY
    assert any("stored quantized (fp8_scaled: F8_E4M3)" in note for note in report.notes)
    document = report.to_json()
    assert document["model"]["quantization"]["format"] == "fp8_scaled"
    assert document["weights"]["bad_quantized"] == []


def test_a_missing_scale_refuses_the_file_naming_the_tensor(tmp_path):
    path, stored, _, _ = sd1_file(tmp_path)
    del stored[UNET_LAYER.removesuffix("weight") + "scale_weight"]
    write_safetensors(path, stored)

    with pytest.raises(BadFileError) as caught:
        models.load_model(str(path))

    text = str(caught.value)
    assert str(path) in text and f"'{UNET_LAYER}' has no scale" in text
    assert "\n" not in text and text.endswith(".")


def test_the_command_refuses_a_missing_scale_with_exit_2_and_one_line(tmp_path):
    path, stored, _, _ = sd1_file(tmp_path)
    del stored[UNET_LAYER.removesuffix("weight") + "scale_weight"]
    write_safetensors(path, stored)

    done = subprocess.run(
        [sys.executable, "-m", "app", "check", str(path), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert done.returncode == 2
    assert without_progress(done.stderr).count("\n") == 1 and UNET_LAYER in done.stderr
    assert "Traceback" not in done.stderr


def test_the_marker_alone_makes_every_fp8_weight_need_a_scale(tmp_path):
    tensors = {
        "a.weight": torch.randn(8, 8).to(E4M3),
        "scaled_fp8": torch.empty(0, dtype=E4M3),
    }
    path = write_safetensors(tmp_path / "marker.safetensors", tensors)
    with pytest.raises(BadFileError, match="'a.weight' has no scale"):
        Checkpoint(path)


W8 = torch.ones(4, 4).to(E4M3)
# ComfyUI's per-layer config (comfy/ops.py): the layer's format as JSON bytes.
FP8_CONFIG = torch.tensor(list(b'{"format": "float8_e4m3fn"}'), dtype=torch.uint8)
LAYOUT_CASES = {
    "scale without a weight": ({"b.weight_scale": torch.tensor(1.0)}, "belongs to no weight"),
    "layer config without a weight": (
        {"a.weight_scale": torch.tensor(1.0), "b.comfy_quant": FP8_CONFIG},
        "'b.comfy_quant' belongs to no weight",
    ),
    "layer config without a scale": ({"a.comfy_quant": FP8_CONFIG}, "'a.weight' has no scale"),
    "scale of a bf16 weight": (
        {"b.weight": torch.ones(2, dtype=torch.bfloat16), "b.weight_scale": torch.tensor(1.0)},
        "not fp8",
    ),
    "two scales": (
        {"a.weight_scale": torch.tensor(1.0), "a.scale_weight": torch.tensor(1.0)},
        "two scales",
    ),
    "scale of the wrong shape": ({"a.weight_scale": torch.ones(3)}, "where one number"),
    "fp8 scale": ({"a.weight_scale": torch.ones(1).to(E4M3)}, "where one number"),
    "block-scaled dtype": (
        {"a.weight_scale": torch.ones(4, dtype=torch.uint8).view(torch.float8_e8m0fnu)},
        "block-scaled",
    ),
}


@pytest.mark.parametrize("case", sorted(LAYOUT_CASES))
def test_fp8_layouts_that_cannot_be_read_right_are_refused_in_one_sentence(tmp_path, case):
    extra, words = LAYOUT_CASES[case]
    path = write_safetensors(tmp_path / "odd.safetensors", {"a.weight": W8, **extra})
    with pytest.raises(BadFileError) as caught:
        Checkpoint(path)
    text = str(caught.value)
    assert str(path) in text and words in text and "\n" not in text and text.endswith(".")


# NVFP4 and int8 layers, one at a time -----------------------------------------------------


def nvfp4_layer(values, *, comfy: bool, name: str = "a"):
    """One layer's tensors in NVFP4 (ComfyUI's layout or ModelOpt's) and its decoded values."""
    from tests.support.quantised_transformers import comfy_quant, nvfp4, pack_nibbles, tiled

    codes, blocks, second, decoded, _ = nvfp4(values)
    layer = {
        f"{name}.weight": pack_nibbles(codes, high_first=comfy),
        f"{name}.weight_scale": tiled(blocks) if comfy else blocks,
        f"{name}.weight_scale_2": second,
    }
    if comfy:
        layer[f"{name}.comfy_quant"] = comfy_quant({"format": "nvfp4"})
    return layer, decoded


INT8_CONFIG = torch.tensor(list(b'{"format": "int8_tensorwise"}'), dtype=torch.uint8)


@pytest.mark.parametrize("comfy", [True, False], ids=["comfyui", "modelopt"])
def test_an_nvfp4_layer_is_kept_packed_and_reads_as_its_values(tmp_path, comfy):
    from app.core.checkpoint.stored import StoredTensor, stored_bytes

    values = torch.randn(130, 80)  # rows and blocks that do not fill ComfyUI's tiles
    layer, decoded = nvfp4_layer(values, comfy=comfy)
    norm = torch.ones(80, dtype=torch.bfloat16)
    path = write_safetensors(tmp_path / "nvfp4.safetensors", {"b.weight": norm, **layer})

    with Checkpoint(path) as checkpoint:
        assert checkpoint.shapes["a.weight"] == (130, 80)  # the values', not the bytes'
        assert set(checkpoint.keys()) == {"a.weight", "b.weight"}
        weight = checkpoint.get("a.weight")
        assert checkpoint.quantization is not None
        assert checkpoint.quantization.format == "nvfp4"
        assert checkpoint.quantization.types == ["NVFP4"]
    assert isinstance(weight, StoredTensor) and weight.shape == (130, 80)
    # Half a byte per value, one byte per 16 for the block scales, four for the tensor scale.
    assert stored_bytes(weight) == 130 * 40 + 130 * 5 + 4
    assert torch.equal(weight.decoded(torch.float32), decoded.to(torch.bfloat16).float())
    rows = weight[10:20]  # how a layout splits a fused matrix: still packed, the same values
    assert isinstance(rows, StoredTensor) and stored_bytes(rows) == 10 * 45 + 4
    assert torch.equal(rows.decoded(), weight.decoded()[10:20])
    assert torch.equal(torch.cat([weight[:10], weight[10:]]).decoded(), weight.decoded())


@pytest.mark.parametrize("comfy", [True, False], ids=["comfyui", "modelopt"])
def test_an_nvfp4_awq_layer_multiplies_its_input_by_its_smoothing_factor(tmp_path, comfy):
    """NVFP4-AWQ (ModelOpt's export, ComfyUI's encoders made from it): the layer computes
    (x * pre_quant_scale) @ W.T. Kept packed, its weight decodes with the factor folded into
    its columns, which is the same product."""
    import torch.nn.functional as F

    from app.core.checkpoint.stored import StoredTensor, stored_bytes

    values = torch.randn(48, 64)
    layer, decoded = nvfp4_layer(values, comfy=comfy)
    smoothing = torch.linspace(0.25, 4.0, 64)
    layer["a.pre_quant_scale"] = smoothing.to(torch.bfloat16)
    path = write_safetensors(tmp_path / "awq.safetensors", layer)

    with Checkpoint(path) as checkpoint:
        assert set(checkpoint.keys()) == {"a.weight"}  # the factor is the weight's own
        weight = checkpoint.get("a.weight")
    assert isinstance(weight, StoredTensor)
    assert stored_bytes(weight) == 48 * 32 + 48 * 4 + 4 + 64 * 4  # + the factor, in fp32
    factor = smoothing.to(torch.bfloat16).float()
    assert torch.equal(weight.decoded(), (decoded * factor).to(torch.bfloat16))
    x = torch.randn(5, 64)
    # What the file means (the input times the factor, in fp32) is the folded product, which
    # the layer computes from its weight rounded once to bf16.
    meant = F.linear(x * factor, decoded)
    torch.testing.assert_close(F.linear(x, decoded * factor), meant, rtol=1e-5, atol=1e-5)
    folded = (decoded * factor).to(torch.bfloat16).float()
    torch.testing.assert_close(F.linear(x, weight.float()), F.linear(x, folded))
    rows = torch.cat([weight[:16], weight[16:]])  # split and joined as layouts do
    assert isinstance(rows, StoredTensor) and torch.equal(rows.decoded(), weight.decoded())


def test_a_damaged_smoothing_factor_is_a_finding_naming_it(tmp_path):
    layer, _ = nvfp4_layer(torch.randn(16, 32), comfy=False)
    layer["a.pre_quant_scale"] = torch.full((32,), float("nan"))
    path = write_safetensors(tmp_path / "awq.safetensors", layer)

    with Checkpoint(path) as checkpoint:
        checkpoint.get("a.weight")
        finding = checkpoint.findings["a.weight"]
    assert "NaN" in finding.problem and "a.pre_quant_scale" in finding.problem


def test_a_file_mixing_nvfp4_and_fp8_layers_reads_each_with_its_own_scales(tmp_path):
    """ComfyUI's "NVFP4 mixed" files keep some layers in scaled fp8."""
    layer, decoded = nvfp4_layer(torch.randn(16, 32), comfy=True)
    values = torch.randn(8, 8)
    scale = values.abs().max() / 448
    fp8 = {
        "b.weight": (values / scale).to(E4M3),
        "b.weight_scale": scale,
        "b.comfy_quant": FP8_CONFIG,
    }
    path = write_safetensors(tmp_path / "mixed.safetensors", {**layer, **fp8})

    with Checkpoint(path) as checkpoint:
        assert checkpoint.quantization is not None
        assert checkpoint.quantization.format == "nvfp4"
        assert checkpoint.quantization.types == ["F8_E4M3", "NVFP4"]
        assert torch.equal(checkpoint.get("a.weight").decoded(), decoded.to(torch.bfloat16))
        expected = (fp8["b.weight"].float() * scale).to(torch.bfloat16)
        assert torch.equal(checkpoint.get("b.weight").decoded(), expected)


def test_modelopt_nvfp4_reads_as_diffusers_bfl_quantizer_decodes_it():
    """BFL's NVFP4 files are the layout diffusers' BFL quantizer reads: the same values."""
    from diffusers.quantizers.bfl.utils import dequantize_nvfp4

    from app.core.checkpoint.stored import from_nvfp4

    generator = torch.Generator().manual_seed(3)
    packed = torch.randint(0, 256, (48, 32), dtype=torch.uint8, generator=generator)
    # Every e4m3 code but NaN's, with both signs of zero.
    codes = torch.randint(0, 0x7F, (48, 4), dtype=torch.uint8, generator=generator)
    blocks = codes.view(E4M3)
    second = torch.tensor(0.00372)

    ours = from_nvfp4(packed, blocks, second, high_first=False).decoded()

    assert torch.equal(ours, dequantize_nvfp4(packed, blocks, second).to(torch.bfloat16))


@pytest.mark.parametrize("per_row", [False, True], ids=["per-tensor", "per-row"])
def test_an_int8_layer_with_its_scale_reads_as_int8_times_scale(tmp_path, per_row):
    from app.core.checkpoint.stored import StoredTensor

    stored = torch.arange(-128, 128, dtype=torch.int16).to(torch.int8).reshape(8, 32)
    scale = torch.linspace(0.001, 0.01, 8).reshape(8, 1) if per_row else torch.tensor(0.0042)
    path = write_safetensors(
        tmp_path / "int8.safetensors",
        {"a.weight": stored, "a.weight_scale": scale, "a.comfy_quant": INT8_CONFIG},
    )

    with Checkpoint(path) as checkpoint:
        weight = checkpoint.get("a.weight")
        assert checkpoint.quantization is not None
        assert (checkpoint.quantization.format, checkpoint.quantization.types) == (
            "int8_scaled",
            ["INT8"],
        )
    assert isinstance(weight, StoredTensor) and weight.packed.dtype == torch.int8
    assert torch.equal(weight.decoded(), (stored.float() * scale).to(torch.bfloat16))


def test_a_tiny_sd1_file_in_int8_loads_and_checks_healthy(tmp_path):
    pipeline = build_tiny_sd_pipeline(seed=3)
    tensors = ldm_state_dict(pipeline, architecture="sd1")
    stored = {}
    for name, tensor in tensors.items():
        if not is_quantizable(name, tensor):
            stored[name] = tensor
            continue
        rows = tensor.reshape(tensor.shape[0], -1).float()
        scale = (rows.abs().amax(1) / 127).clamp_min(1e-8)
        quantized = (rows / scale[:, None]).round().clamp(-127, 127).to(torch.int8)
        stored[name] = quantized.reshape(tensor.shape)
        stored[name.removesuffix("weight") + "weight_scale"] = scale
    path = write_safetensors(tmp_path / "tiny-sd1-int8.safetensors", stored)

    model = models.load_model(str(path))

    assert (
        model.quantization is not None and model.quantization.to_json()["format"] == "int8_scaled"
    )
    assert model.weights.bad_quantized == [] and model.weights.non_finite == []
    report = health.check_loaded(
        model,
        CheckRequest(precision=FP16, device="cpu", size=64),
        run=CheckRun(remember=False, measure_cost=False),
    )
    assert report.verdict is Verdict.HEALTHY
    assert any("stored quantized (int8_scaled: INT8)" in note for note in report.notes)


NVFP4_VALUES = torch.linspace(-1, 1, 4 * 32).reshape(4, 32)
COMFY_NVFP4, _ = nvfp4_layer(NVFP4_VALUES, comfy=True)
MODELOPT_NVFP4, _ = nvfp4_layer(NVFP4_VALUES, comfy=False)
INT8_LAYER = {
    "a.weight": torch.ones(4, 4, dtype=torch.int8),
    "a.weight_scale": torch.tensor(0.1),
    "a.comfy_quant": INT8_CONFIG,
}


def config(document: str) -> torch.Tensor:
    return torch.tensor(list(document.encode()), dtype=torch.uint8)


SCALED_LAYOUT_CASES = {
    "fp8 rotated": (
        {
            "a.weight": torch.ones(4, 4).to(E4M3),
            "a.weight_scale": torch.tensor(0.1),
            "a.comfy_quant": config('{"format": "float8_e4m3fn", "convrot": true}'),
        },
        "says its float8_e4m3fn weight is stored rotated (ConvRot), which only int8 layers are",
    ),
    "fp8 rotated in params": (
        {
            "a.weight": torch.ones(4, 4).to(E4M3),
            "a.weight_scale": torch.tensor(0.1),
            "a.comfy_quant": config('{"format": "float8_e4m3fn", "params": {"convrot": true}}'),
        },
        "stored rotated (ConvRot), which only int8 layers are",
    ),
    "unknown format": (
        {**INT8_LAYER, "a.comfy_quant": config('{"format": "svdquant_w4a4"}')},
        "names the format 'svdquant_w4a4', which HalfSafe cannot read",
    ),
    "format of another type": (
        {**INT8_LAYER, "a.comfy_quant": config('{"format": "nvfp4"}')},
        "names the format 'nvfp4', but its weight is stored as INT8",
    ),
    "config not JSON": ({**INT8_LAYER, "a.comfy_quant": config("{format")}, "is not JSON"),
    "config without a format": ({**INT8_LAYER, "a.comfy_quant": config("[1]")}, "names no format"),
    "config far too long": (
        {**INT8_LAYER, "a.comfy_quant": torch.full((1 << 20,), 32, dtype=torch.uint8)},
        "is more than 4,096 bytes long",
    ),
    "nvfp4 without block scales": (
        {k: v for k, v in MODELOPT_NVFP4.items() if k != "a.weight_scale"},
        "the NVFP4 weight 'a.weight' has no block scales ('a.weight_scale')",
    ),
    "nvfp4 block scales in row order in a ComfyUI layer": (
        {**COMFY_NVFP4, "a.weight_scale": MODELOPT_NVFP4["a.weight_scale"]},
        "where fp8 e4m3 scales of shape [128, 4] belong (one per 16 values of a row, in "
        "ComfyUI's tiled layout)",
    ),
    "nvfp4 block scales of another dtype": (
        {**MODELOPT_NVFP4, "a.weight_scale": torch.ones(4, 2)},
        "dtype F32, where fp8 e4m3 scales of shape [4, 2] belong",
    ),
    "nvfp4 tensor scale of a bf16 weight": (
        {"b.weight": torch.ones(2, 2, dtype=torch.bfloat16), "b.weight_scale_2": torch.tensor(1.0)},
        "the tensor scale 'b.weight_scale_2' belongs to no NVFP4 weight ('b.weight' is stored "
        "as BF16)",
    ),
    "nvfp4 two tensor scales": (
        {**MODELOPT_NVFP4, "a.weight_scale_2": torch.ones(2)},
        "where one fp32 number belongs",
    ),
    "nvfp4 rows not in blocks of 16": (
        {
            "a.weight": torch.zeros(4, 4, dtype=torch.uint8),
            "a.weight_scale": torch.ones(4, 1).to(E4M3),
            "a.weight_scale_2": torch.tensor(1.0),
        },
        "holds 8 values per row, not a whole number of blocks of 16",
    ),
    "input smoothing beside a bf16 weight": (
        {"b.weight": torch.ones(2, 2, dtype=torch.bfloat16), "b.pre_quant_scale": torch.ones(2)},
        "multiplies its layer's input before the quantized weight (a smoothing factor), which "
        "HalfSafe applies only to an NVFP4 weight ('b.weight' is stored as BF16)",
    ),
    "input smoothing of another width": (
        {**MODELOPT_NVFP4, "a.pre_quant_scale": torch.ones(31)},
        "the smoothing factor 'a.pre_quant_scale' of 'a.weight' has shape [31] and dtype F32, "
        "where one number per input column (32) belongs",
    ),
}


@pytest.mark.parametrize("case", sorted(SCALED_LAYOUT_CASES))
def test_nvfp4_and_int8_layouts_that_cannot_be_read_right_are_refused_in_one_sentence(
    tmp_path, case, capsys
):
    extra, words = SCALED_LAYOUT_CASES[case]
    path = write_safetensors(tmp_path / "odd.safetensors", extra)
    with pytest.raises(BadFileError) as caught:
        Checkpoint(path)
    text = str(caught.value)
    assert str(path) in text and words in text and "\n" not in text and text.endswith(".")
    assert main(["check", str(path), "--device", "cpu"]) == 2
    err = without_progress(capsys.readouterr().err)
    assert [line for line in err.splitlines() if line.startswith("halfsafe: ")] == [
        f"halfsafe: {text}"
    ]


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        ({"a.weight_scale_2": torch.tensor(0.0)}, "has the scale 0 (in a.weight_scale_2)"),
        ({"a.weight_scale_2": torch.tensor(float("inf"))}, "has the scale Inf"),
        (
            {"a.weight_scale": torch.full((4, 2), float("nan")).to(E4M3)},
            "has the scale NaN (in a block scale) (in a.weight_scale)",
        ),
        (
            {"a.weight_scale": torch.full((4, 2), -0.5).to(E4M3)},
            "has the scale negative (-0.5, in a block scale)",
        ),
    ],
    ids=["zero tensor scale", "inf tensor scale", "nan block scale", "negative block scale"],
)
def test_a_bad_nvfp4_scale_is_a_finding_naming_the_tensor(tmp_path, damage, words):
    path = write_safetensors(tmp_path / "bad.safetensors", {**MODELOPT_NVFP4, **damage})

    scan = scan_weights(path)

    [finding] = scan.bad_quantized
    assert finding.tensor == "a.weight" and words in finding.problem


def test_block_scales_come_out_of_comfyuis_tiles_in_row_order():
    from app.core.checkpoint.reader import untile_block_scales
    from tests.support.quantised_transformers import tiled

    for rows, columns in [(1, 1), (130, 5), (256, 8), (3, 9)]:
        codes = torch.randint(0, 0x7F, (rows, columns), dtype=torch.uint8).view(E4M3)
        back = untile_block_scales(tiled(codes), rows, columns)
        assert torch.equal(back.view(torch.uint8), codes.view(torch.uint8)), (rows, columns)


@pytest.mark.parametrize(
    ("value", "words"),
    [(0.0, "has the scale 0"), (float("nan"), "has the scale NaN"), (1e9, "has the scale 1e+09")],
    ids=["zero", "nan", "absurd"],
)
def test_a_bad_scale_is_a_broken_weights_finding_naming_the_tensor(tmp_path, value, words):
    path, stored, _, _ = sd1_file(tmp_path)
    scale = UNET_LAYER.removesuffix("weight") + "scale_weight"
    stored[scale] = torch.tensor(value)
    write_safetensors(path, stored)

    model = models.load_model(str(path))

    [finding] = model.weights.bad_quantized
    assert finding.tensor == UNET_LAYER and words in finding.problem and scale in finding.problem
    report = health.check_loaded(
        model,
        CheckRequest(precision=FP16, device="cpu", size=64),
        run=CheckRun(remember=False, measure_cost=False),
    )
    assert report.verdict is Verdict.BROKEN
    assert report.components["unet"].status is Status.BROKEN_WEIGHTS
    # The scale is the cause, named first, also when it made the weight NaN.
    assert UNET_LAYER in report.headline and "not fp16 overflow" in report.headline
    bad = report.to_json()["weights"]["bad_quantized"]
    assert [(b["tensor"], b["component"]) for b in bad] == [(UNET_LAYER, None)]
    assert words in bad[0]["problem"]
    # `halfsafe check` attributes it to the file's weights, naming the tensor, with no repair.
    attributed = causes.check_model(str(path), CheckRequest(precision=FP16, device="cpu", size=64))
    assert attributed.cause is not None and attributed.cause.kind == "weights"
    assert UNET_LAYER in attributed.cause.summary and "quantisation" in attributed.cause.summary
    assert attributed.fix is None and not attributed.cause.verified


@pytest.mark.parametrize("per_row", [False, True], ids=["per-tensor", "per-row"])
def test_a_zero_scale_over_zeros_is_an_all_zero_weight_not_a_finding(tmp_path, per_row):
    """Converters write an all-zero weight (or row) with the scale 0: it decodes right."""
    weight = torch.ones(4, 8).to(E4M3)
    weight[1] = 0
    scale = torch.tensor([0.5, 0.0, 0.5, 0.5]) if per_row else torch.tensor(0.0)
    if not per_row:
        weight = torch.zeros(4, 8).to(E4M3)
    path = write_safetensors(
        tmp_path / "zeros.safetensors", {"a.weight": weight, "a.weight_scale": scale}
    )

    scan = scan_weights(path)

    assert scan.bad_quantized == [] and scan.non_finite == []
    with Checkpoint(path) as checkpoint:
        got = checkpoint.get("a.weight").float()
    expected = weight.float() * scale.reshape(-1, 1) if per_row else torch.zeros(4, 8)
    assert torch.equal(got, expected)


def test_weights_decoding_far_beyond_any_real_model_are_named(tmp_path):
    tensors = {"a.weight": torch.full((4, 4), 384.0).to(E4M3), "a.weight_scale": torch.tensor(50.0)}
    path = write_safetensors(tmp_path / "huge.safetensors", tensors)

    scan = scan_weights(path)

    assert [f.tensor for f in scan.bad_quantized] == ["a.weight"]
    assert "as large as 1.92e+04" in scan.bad_quantized[0].problem


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("scale", [None, 0.00123, 0.0, float("nan")])
def test_every_fp8_code_decodes_as_an_fp32_product_rounded_once(dtype, scale):
    codes = torch.arange(256, dtype=torch.uint8).view(dtype).reshape(16, 16)
    factor = torch.tensor(scale) if scale is not None else None
    expected = (codes.float() * (scale if scale is not None else 1.0)).to(torch.bfloat16)

    got = dequantize_scaled(codes, factor)

    assert got.dtype == torch.bfloat16 and got.shape == codes.shape
    assert torch.equal(got.isnan(), expected.isnan())
    assert torch.equal(got.nan_to_num(nan=7.0), expected.nan_to_num(nan=7.0))


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=["e4m3", "e5m2"])
def test_a_plain_fp8_single_file_loads(tmp_path, dtype):
    pipeline = build_tiny_sd_pipeline(seed=3)
    tensors = ldm_state_dict(pipeline, architecture="sd1")
    stored = {
        k: v.to(dtype) if is_quantizable(k, v) else v.half() if v.is_floating_point() else v
        for k, v in tensors.items()
    }
    path = write_safetensors(tmp_path / "tiny-sd1-fp8.safetensors", stored)

    model = models.load_model(str(path))

    assert model.quantization is not None and model.quantization.to_json()["format"] == "fp8"
    assert model.weights.non_finite == [] and model.weights.bad_quantized == []
    assert model.stored_dtype == "mixed"  # fp8 weights, fp16 biases and norms
    got = model.pipeline.unet.state_dict()["down_blocks.0.attentions.0.proj_in.weight"]
    assert torch.equal(got.float().reshape(-1), stored[UNET_LAYER].float().reshape(-1))


@pytest.mark.parametrize("prefix", ["", "model.diffusion_model."], ids=["plain", "comfy-full"])
def test_scaled_fp8_split_flux_files_dequantise_in_every_file(tmp_path, prefix):
    """The transformer per-row `weight_scale`d (under ComfyUI's full-save prefix too), the T5
    companion ComfyUI-style, the VAE per tensor: every reader (the transformer's, the text
    encoders', the VAE's) goes through the one dequantising path."""
    pipeline = build_tiny_flux_pipeline()
    written = save_split_files(pipeline, tmp_path / "models", "flux1-fp8")
    with Checkpoint(written["transformer"]) as checkpoint:
        transformer = {k: checkpoint.get(k).clone() for k in checkpoint.shapes}
    stored, exact = fp8_scaled(transformer, style="weight_scale", per_row=True)
    write_safetensors(written["transformer"], {prefix + k: v for k, v in stored.items()})
    with Checkpoint(written["text_encoder_2"]) as checkpoint:
        t5 = {k: checkpoint.get(k).clone() for k in checkpoint.shapes}
    t5_stored, t5_exact = fp8_scaled(t5)
    write_safetensors(written["text_encoder_2"], t5_stored)
    with Checkpoint(written["vae"]) as checkpoint:
        vae = {k: checkpoint.get(k).clone() for k in checkpoint.shapes}
    vae_stored, _ = fp8_scaled(vae, style="weight_scale")
    write_safetensors(written["vae"], vae_stored)

    model = models.load_model(str(written["transformer"]))

    assert model.format == "split_files"
    assert model.quantization is not None
    assert model.quantization.to_json()["format"] == "fp8_scaled"
    assert model.quantization.to_json()["files"] == [
        "flux1-fp8.safetensors",
        "t5xxl.safetensors",
        "ae.safetensors",
    ]
    assert model.weights.bad_quantized == [] and model.weights.non_finite == []
    config = {**pipeline.transformer.config, "_class_name": "FluxTransformer2DModel"}
    state = model.pipeline.transformer.state_dict()
    reference = {k: exact[k] if k in exact else stored[k].float() for k in transformer}
    expected = {k: tuple(v.shape) for k, v in state.items()}
    mapped = layouts.to_diffusers(split.layout_of("flux").table(config), reference, expected)
    for key, value in mapped.items():
        close_to(state[key], value)
    t5_state = model.pipeline.text_encoder_2.state_dict()
    key = "encoder.block.0.layer.1.DenseReluDense.wo.weight"
    close_to(t5_state[key], t5_exact[key], t5[key].float())


SD3_COMPONENTS = ("text_encoder", "text_encoder_2", "text_encoder_3", "transformer", "vae")
SD3_T5_LAYER = "text_encoders.t5xxl.transformer.encoder.block.0.layer.1.DenseReluDense.wo.weight"


def sd35_fp8_scaled(tmp_path):
    """SD3.5 Large as `sd3.5_large_fp8_scaled.safetensors` holds it: one file with the MMDiT,
    CLIP-L, CLIP-G and T5 inside, their matrices fp8 e4m3 with ComfyUI's `scale_weight`s and
    `scaled_fp8` marker, the VAE in bf16. Returns its path, the tensors written, and a file of
    the exact dequantised values (fp32) beside it, to load for reference."""
    pipeline = build_tiny_sd3_pipeline()
    root = tmp_path / "models"
    path = save_split_files(pipeline, root, "sd3.5_large_fp8_scaled", single_file=True)[
        "transformer"
    ]
    with Checkpoint(path) as checkpoint:
        tensors = {k: checkpoint.get(k).clone() for k in checkpoint.shapes}
    vae = {k: v.to(torch.bfloat16) for k, v in tensors.items() if k.startswith("first_stage")}
    stored, exact = fp8_scaled({k: v for k, v in tensors.items() if k not in vae})
    stored.update(vae)
    write_safetensors(path, stored)
    plain = {k: v for k, v in tensors.items() if k in exact or k in vae or k in stored}
    reference = {k: exact[k] if k in exact else stored[k].float() for k in plain}
    (root / "exact").mkdir()
    return path, stored, write_safetensors(root / "exact" / "sd3.5_large.safetensors", reference)


def test_an_sd35_fp8_scaled_file_with_everything_inside_loads_every_part_dequantised(tmp_path):
    path, _, reference = sd35_fp8_scaled(tmp_path)

    model = models.load_model(str(path))

    assert (model.architecture, model.format) == ("sd3", "single_file")
    assert model.quantization.to_json() == {
        "format": "fp8_scaled",
        "types": ["F8_E4M3"],
        "files": [path.name],
        "dequantized_to": "bf16",
        "dequantized_on_load": [],
    }
    assert model.weights.bad_quantized == [] and model.weights.non_finite == []
    # Each part (the MMDiT through the layout's table, the CLIPs, the T5, the VAE) holds the
    # exact dequantised values, rounded once to bf16.
    exact = models.load_model(str(reference))
    for component in SD3_COMPONENTS:
        got = getattr(model.pipeline, component).state_dict()
        want = getattr(exact.pipeline, component).state_dict()
        assert set(got) == set(want), component
        for key, value in want.items():
            close_to(got[key], value.float())
    report = health.check_loaded(
        model,
        CheckRequest(precision=FP16, device="cpu", size=64),
        run=CheckRun(remember=False, measure_cost=False),
    )
    assert report.verdict is Verdict.HEALTHY
    assert report.to_json()["model"]["quantization"]["format"] == "fp8_scaled"


def test_a_bad_scale_inside_an_sd35_file_names_the_part_that_holds_it(tmp_path):
    path, stored, _ = sd35_fp8_scaled(tmp_path)
    stored[SD3_T5_LAYER.removesuffix("weight") + "scale_weight"] = torch.tensor(0.0)
    write_safetensors(path, stored)

    model = models.load_model(str(path))

    [finding] = model.weights.bad_quantized
    assert finding.to_json() == {
        "tensor": SD3_T5_LAYER,
        "file": path.name,
        "component": "text_encoder_3",
        "problem": f"has the scale 0 (in {SD3_T5_LAYER.removesuffix('weight')}scale_weight)",
    }


# GGUF --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("qtype", "folder"),
    [
        (GGMLQuantizationType.Q8_0, "diffusion_models"),
        (GGMLQuantizationType.Q4_0, "unet"),
        (GGMLQuantizationType.F16, "diffusion_models"),
    ],
    ids=["Q8_0", "Q4_0-in-unet", "F16"],
)
def test_a_flux_gguf_transformer_loads_with_its_companions_within_quantisation_error(
    tmp_path, qtype, folder
):
    pipeline, bfl, path = flux_gguf(tmp_path, qtype, folder)

    model = models.load_model(str(path))

    assert model.format == "split_files" and model.architecture == "flux-dev"
    assert model.quantization is not None and model.quantization.to_json()["format"] == "gguf"
    assert qtype.name in model.quantization.to_json()["types"]
    assert model.weights.non_finite == [] and model.weights.bad_quantized == []
    state = model.pipeline.transformer.state_dict()
    for key, reference in pipeline.transformer.state_dict().items():
        got = state[key].float()
        bound = reference.abs().max() * STEP[qtype.name] + 1e-6
        assert (got - reference).abs().max() <= bound * 1.05, key
    # A quantised file is not its original: the Q types must differ somewhere.
    if qtype != GGMLQuantizationType.F16:
        assert any(
            not torch.equal(state[k].float(), v)
            for k, v in pipeline.transformer.state_dict().items()
        )


# The other layouts' GGUF transformers, as city96 converts them: (builder, architecture).
GGUF_LAYOUTS = {
    "chroma": (build_tiny_chroma_pipeline, "chroma"),
    "sd3": (build_tiny_sd3_pipeline, "sd3"),
    "zimage": (build_tiny_zimage_pipeline, "zimage-turbo"),  # its name says neither: Turbo
    # Its text encoder file is read with Qwen2.5-VL's 128-wide heads.
    "qwenimage": (lambda: build_tiny_qwenimage_pipeline(text_width=128), "qwenimage"),
}


@pytest.mark.parametrize("layout", list(GGUF_LAYOUTS))
def test_a_gguf_transformer_of_every_layout_loads_and_is_listed_with_its_companions(
    tmp_path, layout
):
    from app.core.library import scan_library

    build, architecture = GGUF_LAYOUTS[layout]
    pipeline, _, path = gguf_split_set(
        tmp_path, build(), GGMLQuantizationType.Q8_0, name=f"{layout}-tiny"
    )

    model = models.load_model(str(path))

    assert (model.format, model.architecture) == ("split_files", architecture)
    assert model.quantization is not None and model.quantization.to_json()["files"] == [path.name]
    assert "Q8_0" in model.quantization.to_json()["types"]
    assert model.weights.non_finite == [] and model.weights.bad_quantized == []
    state = model.pipeline.transformer.state_dict()
    for key, reference in pipeline.transformer.state_dict().items():
        bound = reference.abs().max() * STEP["Q8_0"] + 1e-6
        assert (state[key].float() - reference).abs().max() <= bound * 1.05, key
    (entry,) = scan_library([str(path.parent)], include_defaults=False, use_cache=False)
    assert (entry.path, entry.architecture, entry.supported) == (str(path), architecture, True)
    assert entry.companions is not None and None not in entry.companions.values()


SD3_PATCHES = "x_embedder.proj.weight"  # 4-D, rows of 2 values: flattened by ComfyUI-GGUF


def test_a_tensor_flattened_for_quantisation_is_read_in_its_recorded_shape(tmp_path):
    from app.core.library import scan_library

    pipeline, original, path = gguf_split_set(
        tmp_path, build_tiny_sd3_pipeline(), GGMLQuantizationType.Q8_0, name="sd3.5-tiny"
    )
    write_gguf(path, original, flattened=(SD3_PATCHES,))
    stored = next(t for t in GGUFReader(path).tensors if t.name == SD3_PATCHES)
    assert len(stored.shape) == 2  # as written: rows of one block
    with Checkpoint(path) as checkpoint:
        assert checkpoint.shapes[SD3_PATCHES] == original[SD3_PATCHES].shape
        assert checkpoint.dtypes[SD3_PATCHES] == "GGUF_Q8_0"

    model = models.load_model(str(path))

    got = model.pipeline.transformer.pos_embed.proj.weight.float()
    reference = pipeline.transformer.pos_embed.proj.weight
    assert (got - reference).abs().max() <= reference.abs().max() * STEP["Q8_0"] * 1.05
    # The library reads the same shapes from the header alone.
    (entry,) = scan_library([str(path.parent)], include_defaults=False, use_cache=False)
    assert (entry.architecture, entry.supported) == ("sd3", True)


def test_a_recorded_shape_that_does_not_hold_the_tensor_is_refused(tmp_path):
    _, original, path = gguf_split_set(
        tmp_path, build_tiny_sd3_pipeline(), GGMLQuantizationType.Q8_0, name="sd3.5-tiny"
    )
    write_gguf(path, original, flattened=(SD3_PATCHES,), recorded=[3, 5])

    with pytest.raises(BadFileError) as caught:
        models.load_model(str(path))

    text = str(caught.value)
    assert str(path) in text and f"original shape of '{SD3_PATCHES}'" in text
    assert "\n" not in text


def test_a_t5_gguf_companion_in_llama_cpp_names_loads_beside_a_gguf_transformer(tmp_path):
    """city96's T5 GGUF files name tensors as llama.cpp does (token_embd, enc.blk.N.attn_q);
    they are found beside the transformer by content and read under transformers' names."""
    from gguf import MODEL_ARCH, get_tensor_name_map

    pipeline, _, path = flux_gguf(tmp_path, GGMLQuantizationType.Q8_0)
    t5_file = tmp_path / "models" / "text_encoders" / "t5xxl.safetensors"
    with Checkpoint(t5_file) as checkpoint:
        t5 = {k: checkpoint.get(k).clone() for k in checkpoint.shapes}
    t5_file.unlink()
    table = get_tensor_name_map(MODEL_ARCH.T5ENCODER, 2)
    named = {table.get_name(k.removesuffix(".weight")) + ".weight": v for k, v in t5.items()}
    assert {"token_embd.weight", "enc.blk.0.attn_q.weight", "enc.output_norm.weight"} <= set(named)
    write_gguf(t5_file.with_name("t5-v1_1-xxl-encoder-Q8_0.gguf"), named)

    model = models.load_model(str(path))

    assert model.quantization is not None
    assert model.quantization.to_json()["files"] == [path.name, "t5-v1_1-xxl-encoder-Q8_0.gguf"]
    state = model.pipeline.text_encoder_2.state_dict()
    for key, reference in pipeline.text_encoder_2.state_dict().items():
        bound = reference.abs().max() * STEP["Q8_0"] + 1e-6
        assert (state[key].float() - reference).abs().max() <= bound * 1.05, key


def test_a_t5_gguf_naming_more_blocks_than_any_real_encoder_is_refused_from_its_header(
    tmp_path,
):
    # The name table for llama.cpp's T5 names grows with the block count: a header of tiny
    # tensors naming thousands of blocks would cost seconds and memory for each read of it.
    from app.core.checkpoint import read_header
    from app.core.limits import MAX_TEXT_LAYERS

    blocks = MAX_TEXT_LAYERS + 72
    tensors = {"token_embd.weight": torch.zeros(4, 4)}
    tensors |= {f"enc.blk.{i}.attn_q.weight": torch.zeros(1) for i in range(blocks)}
    path = write_gguf(tmp_path / "t5-many-blocks.gguf", tensors, GGMLQuantizationType.F16)

    with pytest.raises(BadFileError) as caught:
        read_header(path)

    message = str(caught.value)
    assert message.startswith(f"{path}: it names {blocks} T5 encoder blocks (enc.blk.N)")
    assert message.endswith(".") and message.count(". ") == 0


def test_clip_and_vae_gguf_companions_under_their_safetensors_names_load(tmp_path):
    pipeline, _, path = flux_gguf(tmp_path, GGMLQuantizationType.Q8_0)
    for part in ("vae/ae", "text_encoders/clip_l"):
        file = tmp_path / "models" / f"{part}.safetensors"
        with Checkpoint(file) as checkpoint:
            tensors = {k: checkpoint.get(k).clone() for k in checkpoint.shapes}
        file.unlink()
        write_gguf(file.with_suffix(".gguf"), tensors)

    model = models.load_model(str(path))

    assert model.quantization is not None
    assert model.quantization.to_json()["files"] == [path.name, "clip_l.gguf", "ae.gguf"]
    for component in ("text_encoder", "vae"):
        state = getattr(model.pipeline, component).state_dict()
        for key, reference in getattr(pipeline, component).state_dict().items():
            bound = reference.abs().max() * STEP["Q8_0"] + 1e-6
            assert (state[key].float() - reference).abs().max() <= bound * 1.05, key


def test_a_nan_planted_in_a_gguf_file_is_found_by_name(tmp_path):
    _, bfl, path = flux_gguf(tmp_path, GGMLQuantizationType.Q8_0)
    bad = "double_blocks.0.img_mlp.0.weight"
    with Checkpoint(path) as checkpoint:
        assert checkpoint.dtypes[bad] == "GGUF_Q8_0"
    start = next(i.start for i in check_gguf_header(path) if i.name == bad)
    with open(path, "r+b") as handle:  # the first block's fp16 scale becomes NaN
        handle.seek(start)
        handle.write(np.array([np.nan], dtype=np.float16).tobytes())

    assert scan_weights(path).non_finite == [bad]
    model = models.load_model(str(path))
    assert model.weights.non_finite == ["transformer.transformer_blocks.0.ff.net.0.proj.weight"]


def test_a_gguf_scanned_on_its_own_lists_its_types(tmp_path):
    _, bfl, path = flux_gguf(tmp_path, GGMLQuantizationType.Q8_0)
    with Checkpoint(path) as checkpoint:
        assert set(checkpoint.keys()) == set(bfl)
        assert checkpoint.quantization is not None
        assert {"Q8_0", "F32"} <= set(checkpoint.quantization.types)
        assert checkpoint.stored_dtype() == "mixed"
    scan = scan_weights(path)
    assert scan.tensors == len(bfl) and scan.non_finite == []


def test_the_library_lists_a_gguf_transformer_with_its_companions(tmp_path):
    from app.core.library import scan_library

    _, _, path = flux_gguf(tmp_path, GGMLQuantizationType.Q8_0)

    (entry,) = scan_library([str(path.parent)], include_defaults=False, use_cache=False)

    assert entry.path == str(path) and entry.error is None
    assert (entry.format, entry.architecture, entry.supported) == ("split_files", "flux-dev", True)
    assert entry.stored_dtype == "mixed"  # Q8_0 matrices, F32 biases and norms
    assert entry.companions is not None and entry.companions["vae"] is not None
    assert entry.missing is None


def test_the_report_json_names_the_quantisation(tmp_path):
    _, _, path = flux_gguf(tmp_path, GGMLQuantizationType.Q8_0)
    model = models.load_model(str(path))
    report = health.check_loaded(
        model,
        CheckRequest(precision=FP16, device="cpu", size=64),
        run=CheckRun(remember=False, measure_cost=False),
    )
    document = json.loads(json.dumps(report.to_json()))
    assert document["model"]["quantization"]["format"] == "gguf"
    assert document["model"]["quantization"]["files"] == [path.name]
    assert report.verdict is Verdict.HEALTHY


IQ4_NL_VALUES = np.array(
    (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113), dtype=np.float32
)


def iq4_nl(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """IQ4_NL blocks as llama.cpp lays them out (the gguf package decodes but cannot encode
    them): per 32 values an fp16 scale, then 16 bytes of 4-bit indices into a fixed table, value
    j in the low half of byte j and value j + 16 in the high half. Returns (the bytes, rows by
    row bytes; the values they decode to)."""
    blocks = values.reshape(-1, 32).astype(np.float32)
    peak = blocks[np.arange(len(blocks)), np.abs(blocks).argmax(axis=1)]
    scale = (peak / -127).astype(np.float16)
    safe = np.where(scale == 0, 1, scale.astype(np.float32))
    index = np.abs(blocks[:, :, None] / safe[:, None, None] - IQ4_NL_VALUES).argmin(axis=2)
    packed = (index[:, :16] | index[:, 16:] << 4).astype(np.uint8)
    raw = np.concatenate([scale[:, None].view(np.uint8), packed], axis=1)
    decoded = scale.astype(np.float32)[:, None] * IQ4_NL_VALUES[index]
    rows = values.shape[0]
    return raw.reshape(rows, -1), decoded.reshape(values.shape)


def test_an_iq4_nl_gguf_tensor_is_dequantised_not_read_as_integers(tmp_path):
    values = torch.randn(8, 64, generator=torch.Generator().manual_seed(0)).numpy()
    raw, decoded = iq4_nl(values)
    path = tmp_path / "flux1-dev-IQ4_NL.gguf"
    writer = GGUFWriter(path, "flux")
    writer.add_tensor("w", raw, raw_dtype=GGMLQuantizationType.IQ4_NL)
    writer.add_tensor("b", np.ones(8, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with Checkpoint(path) as checkpoint:
        assert checkpoint.shapes["w"] == (8, 64) and checkpoint.dtypes["w"] == "GGUF_IQ4_NL"
        weight = checkpoint.get("w")
        assert weight.dtype == torch.bfloat16
        torch.testing.assert_close(weight.float(), torch.from_numpy(decoded), rtol=2**-8, atol=0)
        # Within IQ4_NL's error of the original: half the table's widest step, 24 of 127.
        limit = 12 / 127 * np.abs(values.reshape(-1, 32)).max(axis=1).max()
        assert float((weight.float() - torch.from_numpy(values)).abs().max()) <= limit * 1.01
        assert checkpoint.quantization is not None
        assert checkpoint.quantization.types == ["F32", "IQ4_NL"]


def test_a_bf16_file_with_only_the_scaled_fp8_marker_is_bf16(tmp_path):
    from app.core.library import scan_library

    path = write_safetensors(
        tmp_path / "model.safetensors",
        {
            "a.weight": torch.ones(4, 4, dtype=torch.bfloat16),
            "scaled_fp8": torch.zeros(2, dtype=torch.float8_e4m3fn),
        },
    )
    with Checkpoint(path) as checkpoint:
        assert checkpoint.quantization is None and checkpoint.stored_dtype() == "bf16"
        assert checkpoint.keys() == ["a.weight"]
    (entry,) = scan_library([str(tmp_path)], include_defaults=False, use_cache=False)
    assert entry.stored_dtype == "bf16"


def test_an_fp8_weight_with_an_empty_scale_is_one_sentence(tmp_path):
    path = write_safetensors(
        tmp_path / "model.safetensors",
        {
            "a.weight": torch.ones(0, 4).to(torch.float8_e4m3fn),
            "a.weight_scale": torch.ones(0),
        },
    )
    with pytest.raises(BadFileError) as refused:
        Checkpoint(path)
    assert str(refused.value) == (
        f"{path}: the scale 'a.weight_scale' of 'a.weight' is empty (it holds no number), so "
        "the weight's true values are unknown."
    )


def test_nvfp4_block_scales_of_0_over_stored_values_are_broken_weights(tmp_path):
    """The tensor scale 0 was caught, block scales only for NaN and negative: all 0 over
    codes that are not made the layer 0 and the check healthy."""
    zeroed = {**MODELOPT_NVFP4, "a.weight_scale": torch.zeros(4, 2).to(E4M3)}
    path = write_safetensors(tmp_path / "zeroed.safetensors", zeroed)

    [finding] = scan_weights(path).bad_quantized

    assert finding.tensor == "a.weight"
    assert finding.problem == (
        "decodes to 0 everywhere although its stored values are not 0: its block scales are "
        "0, so the layer is lost (in a.weight_scale)"
    )
    # An all-zero weight is written as zero codes: 0 whatever its block scales.
    zeros = {**zeroed, "a.weight": torch.zeros_like(MODELOPT_NVFP4["a.weight"])}
    assert scan_weights(write_safetensors(tmp_path / "z.safetensors", zeros)).bad_quantized == []


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0"])
def test_gguf_block_scales_of_0_over_stored_values_are_broken_weights(tmp_path, qtype):
    from gguf.constants import GGML_QUANT_SIZES

    kind = GGMLQuantizationType[qtype]
    _, _, path = flux_gguf(tmp_path, kind)
    bad = "double_blocks.0.img_mlp.0.weight"
    info = next(i for i in check_gguf_header(path) if i.name == bad)
    _, size = GGML_QUANT_SIZES[kind]
    with open(path, "r+b") as handle:  # every block's fp16 scale becomes 0
        handle.seek(info.start)
        data = bytearray(handle.read(info.nbytes))
        for start in range(0, len(data), size):
            data[start : start + 2] = bytes(2)
        handle.seek(info.start)
        handle.write(bytes(data))

    found = {f.tensor: f.problem for f in scan_weights(path).bad_quantized}

    assert list(found) == [bad] and "decodes to 0 everywhere" in found[bad]
