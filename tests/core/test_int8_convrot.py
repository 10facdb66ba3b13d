"""int8 ConvRot, as ComfyUI's October templates ship it: int8 layers whose rows were rotated in
groups by a normalised regular Hadamard matrix before they were quantised per row, the layer's
`comfy_quant` config naming the rotation (`convrot`, `convrot_groupsize`). comfy-kitchen (the
reference implementation, a dev dependency) quantises every file written here and decodes the
reference values; HalfSafe keeps the bytes as stored and turns each weight back per operation.

The check computes an int8 ConvRot layer as comfy-kitchen's int8 linear does (the input rotated
in the compute dtype, where fp16 can overflow before the product), so a model whose rotated
activations pass 65,504 fails here as it fails in the tool; decoding the weight instead would
call it healthy. Both are held below.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from comfy_kitchen.backends.eager import quantization as kitchen
from comfy_kitchen.tensor.int8_utils import _build_hadamard

from app.core import generation, models
from app.core.checkpoint import Checkpoint, scan_weights, write_safetensors
from app.core.checkpoint.stored import (
    INT8_CONVROT,
    StoredTensor,
    from_int8_convrot,
    hadamard,
    stored_bytes,
)
from app.core.checkpoint.stored import plain as plain_values
from app.core.components import FP16_MAX, Status, Verdict
from app.core.formats.forms import stored_form
from app.core.run.probe import ActivationRecorder
from app.core.settings import PrecisionSettings
from tests.support.convrot_files import FAMILIES, build_pipeline, rotation_overflowing_zimage
from tests.support.family_helpers import (
    check,
    offline,  # noqa: F401 - an autouse fixture: no network
)
from tests.support.model_files import save_split_files
from tests.support.quantised_transformers import (
    CASES,
    close,
    comfy_quant,
    language_model_matrix,
    matrices_under,
    quantised_set,
    write_int8,
    written_weights,
)
from tests.support.tiny_models import build_tiny_sd_pipeline

FP16 = PrecisionSettings(precision="fp16")


def convrot_layer(values: torch.Tensor, group: int, *, nested: bool = False):
    """One layer `a` quantised by comfy-kitchen as int8 ConvRot, and its reference values."""
    stored, scale = kitchen.quantize_int8_convrot_weight(values, group)
    rotation = {"convrot": True, "convrot_groupsize": group}
    config = {"format": "int8_tensorwise", **({"params": rotation} if nested else rotation)}
    tensors = {"a.weight": stored, "a.weight_scale": scale, "a.comfy_quant": comfy_quant(config)}
    reference = kitchen.dequantize_int8_convrot_weight(stored, scale, group)
    return tensors, reference


# The decoding, against the reference implementation -------------------------------------------


@pytest.mark.parametrize("group", [4, 16, 64, 256, 1024])
def test_the_rotation_is_comfy_kitchens_symmetric_orthogonal_hadamard(group):
    matrix = hadamard(group)

    assert torch.equal(matrix, _build_hadamard(group))
    assert torch.equal(matrix, matrix.T)
    assert torch.allclose(matrix @ matrix, torch.eye(group), atol=1e-6)


@pytest.mark.parametrize("nested", [False, True], ids=["config", "config-params"])
@pytest.mark.parametrize("group", [4, 16, 64, 256])
def test_a_convrot_layer_reads_as_comfy_kitchen_dequantises_it(tmp_path, group, nested):
    values = torch.randn(24, 512, generator=torch.Generator().manual_seed(group)) * 0.05
    tensors, reference = convrot_layer(values, group, nested=nested)
    path = write_safetensors(tmp_path / "layer_int8_convrot.safetensors", tensors)

    with Checkpoint(path) as checkpoint:
        assert checkpoint.keys() == ["a.weight"]
        weight = checkpoint.get("a.weight")
        assert checkpoint.quantization is not None
        assert checkpoint.quantization.format == "int8_convrot"
        assert checkpoint.findings == {}

    assert isinstance(weight, StoredTensor) and (weight.codec, weight.group) == (
        INT8_CONVROT,
        group,
    )
    assert weight.packed.dtype == torch.int8 and stored_bytes(weight) == 24 * 512 + 24 * 4
    # The reference's fp32 values rounded once to bf16, what every stored weight means.
    assert torch.equal(weight.decoded(), reference.to(torch.bfloat16))
    # Row slices (a fused projection split into diffusers' layers) keep the rows' rotation.
    rows = weight[5:9]
    assert isinstance(rows, StoredTensor) and rows.codec == INT8_CONVROT
    assert torch.equal(rows.decoded(), reference[5:9].to(torch.bfloat16))


@pytest.mark.parametrize("rotation", [{"convrot": False, "convrot_groupsize": 256}, {}])
def test_a_layer_whose_config_names_no_rotation_reads_as_plain_int8(tmp_path, rotation):
    """As ComfyUI reads a config: `convrot` false or absent is no rotation, whatever the size."""
    stored = torch.arange(-128, 128, dtype=torch.int16).to(torch.int8).reshape(8, 32)
    scale = torch.linspace(0.001, 0.01, 8).reshape(8, 1)
    config = comfy_quant({"format": "int8_tensorwise", **rotation})
    path = write_safetensors(
        tmp_path / "int8.safetensors",
        {"a.weight": stored, "a.weight_scale": scale, "a.comfy_quant": config},
    )

    with Checkpoint(path) as checkpoint:
        weight = checkpoint.get("a.weight")
        assert checkpoint.quantization is not None
        assert checkpoint.quantization.format == "int8_scaled"

    assert isinstance(weight, StoredTensor) and weight.codec == "int8"
    assert torch.equal(weight.decoded(), (stored.float() * scale).to(torch.bfloat16))


def test_a_convrot_layer_computes_its_decoded_weights_product_and_the_tools(tmp_path):
    """Rotating the input (as the tool does) and turning the weight back give the same product:
    x H (q s)^T = x ((q s) H)^T, H being symmetric. The tool also rounds the rotated input to
    int8 per row, which HalfSafe does not: that rounding is all that parts the two."""
    generator = torch.Generator().manual_seed(7)
    values = torch.randn(48, 256, generator=generator) * 0.05
    stored, scale = kitchen.quantize_int8_convrot_weight(values, 64)
    weight, bias = from_int8_convrot(stored, scale, 64), torch.randn(48, generator=generator)
    x = torch.randn(3, 5, 256, generator=generator)

    with torch.inference_mode():
        ours = torch.nn.functional.linear(x, weight.to(torch.float32), bias)
        decoded = torch.nn.functional.linear(x, weight.decoded(torch.float32), bias)
        tool = kitchen.int8_linear(x, stored, scale, bias, torch.float32, True, 64)

    assert ours.shape == (3, 5, 48)
    assert torch.allclose(ours, decoded, atol=2e-2)  # decoded is rounded to bf16 first
    exact = x @ kitchen.dequantize_int8_convrot_weight(stored, scale, 64).T + bias
    assert torch.allclose(ours, exact, atol=1e-4)
    # The tool's own int8 rounding of the rotated input: a step of its row's peak over 127.
    step = float(x.abs().amax()) / 127 * float(scale.max()) * 127 * 256**0.5
    assert float((tool - exact).abs().max()) < step


def test_a_convrot_embedding_looks_up_the_rows_comfy_kitchen_looks_up():
    """An embedding table stored as int8 ConvRot: a lookup reads the rows turned back."""
    table = torch.randn(40, 64, generator=torch.Generator().manual_seed(9)) * 0.05
    stored, scale = kitchen.quantize_int8_convrot_weight(table, 16)
    indices = torch.tensor([[3, 0, 39], [7, 7, 12]])

    with torch.inference_mode():
        ours = torch.nn.functional.embedding(indices, from_int8_convrot(stored, scale, 16))
    theirs = kitchen.dequantize_int8_embedding(stored, scale, indices, 16, 2)  # 2: bf16

    assert torch.equal(ours, theirs)


# Where fp16 overflows: the rotated input, as the tool computes it ----------------------------


def peaked_input(group: int, peak: float) -> torch.Tensor:
    """An input whose first group is `peak` times the signs of one row of H: rotated, that
    group's value on the row is sqrt(group) times `peak` (the most a rotation can grow it)."""
    x = torch.randn(2, 2 * group, generator=torch.Generator().manual_seed(1))
    x[:, :group] = peak * torch.sign(hadamard(group)[3])
    return x


def test_an_input_whose_rotation_passes_65504_overflows_in_fp16_as_in_the_tool():
    values = torch.randn(32, 512, generator=torch.Generator().manual_seed(2)) * 0.02
    stored, scale = kitchen.quantize_int8_convrot_weight(values, 256)
    x = peaked_input(256, 5000.0).half()  # rotated: 16 * 5000 = 80,000 > 65,504
    weight = from_int8_convrot(stored, scale, 256)
    layer = torch.nn.Linear(512, 32, bias=False)
    layer.weight = torch.nn.Parameter(weight, requires_grad=False)

    tool = kitchen.int8_linear(x, stored, scale, None, torch.float16, True, 256)
    with torch.inference_mode():
        ours = layer.to(torch.float16)(x)
        # What a decoded weight would compute: finite, where the tool's output is not.
        decoded = torch.nn.functional.linear(x, weight.decoded(torch.float16))
        wide = layer.to(torch.float32)(x.float())
        bf16 = layer.to(torch.bfloat16)(x.bfloat16())

    assert not bool(tool.isfinite().all()) and not bool(ours.isfinite().all())
    assert bool(decoded.isfinite().all()) and float(decoded.abs().max()) < FP16_MAX
    # The layer kept wider (an island in fp32 or bf16) rotates its input there: finite.
    assert bool(wide.isfinite().all()) and bool(bf16.isfinite().all())


def test_the_probe_records_a_convrot_layers_rotated_input_as_its_peak():
    """An fp32 run predicts fp16 from each layer's peaks: a ConvRot layer's include its input
    as the tool rotates it, so the layer is named although its output stays small."""
    values = torch.randn(32, 512, generator=torch.Generator().manual_seed(2)) * 0.02
    stored, scale = kitchen.quantize_int8_convrot_weight(values, 256)
    model = torch.nn.Sequential(torch.nn.Identity(), torch.nn.Linear(512, 32, bias=False))
    model[1].weight = torch.nn.Parameter(from_int8_convrot(stored, scale, 256), requires_grad=False)

    for lean in (False, True):
        with torch.inference_mode(), ActivationRecorder(model, lean=lean) as recorder:
            output = model(peaked_input(256, 5000.0))
        result = recorder.read(output)

        assert float(output.abs().max()) < FP16_MAX
        stats = result.modules["1"]
        assert stats.max_abs == pytest.approx(80000.0, rel=1e-3)
        if not lean:
            assert stats.input_max_abs == pytest.approx(5000.0, rel=1e-3)
            over = result.first_over_fp16()
            assert over is not None and over.name == "1"


@pytest.mark.slow
def test_a_model_whose_rotated_inputs_pass_65504_is_fixable_at_that_layer(tmp_path):
    written, weights, modulations = rotation_overflowing_zimage(tmp_path / "int8")
    model = models.load_model(str(written.path))

    report = check(model)
    wide = check(model, PrecisionSettings(precision="fp32"))

    bad = report.components["transformer"]
    assert report.verdict is Verdict.FIXABLE
    assert bad.first_bad_module == "noise_refiner.0.adaLN_modulation.0"
    assert report.fix is not None and report.fix.verified
    islands = report.to_json()["fix"]["modules"]["transformer"]
    assert set(islands) == {k.removesuffix(".weight") for k in modulations}
    # Run in fp32, the check predicts it: the rotated input is the layer's peak.
    assert wide.components["transformer"].max_abs == pytest.approx(80000.0, rel=2e-3)
    headroom = wide.components["transformer"].headroom
    assert headroom is not None and headroom < 1
    # The same values in a bf16 file compute without the rotation: healthy in fp16. That is the
    # difference between the two forms of one model, not an error of either check.
    with Checkpoint(written.path) as checkpoint:
        decoded = {k: plain_values(checkpoint.get(k)).to(torch.bfloat16) for k in checkpoint.shapes}
    plain = check(models.load_model(bf16_set(tmp_path / "bf16", "zimage", decoded)))
    assert plain.verdict is Verdict.HEALTHY

    # Generating in fp16, the layers overflow as the tool's do, and the NaN watch repairs it.
    request = generation.GenerationRequest(
        prompt="a red cat", steps=2, cfg=1.0, seed=3, width=64, height=64, output_dir=str(tmp_path)
    )
    result = generation.generate(model, request, precision=FP16, device="cpu")
    (image,) = result.images
    assert (image.status, image.component) == ("fixed", "transformer")


# What the scans find: the layer named, the model broken ---------------------------------------

DAMAGE = {
    "zero scale over values": (
        {"a.weight_scale": "zero row"},
        "has the scale 0 (in a.weight_scale)",
    ),
    "NaN scale": ({"a.weight_scale": float("nan")}, "has the scale NaN (in a.weight_scale)"),
    "negative scale": ({"a.weight_scale": -0.01}, "has the scale negative (-0.01)"),
    "absurd scale": ({"a.weight_scale": 1e9}, "has the scale 1e+09, outside"),
    "group not dividing the rows": (
        {"convrot_groupsize": 64, "width": 96},
        "has 96 inputs per row, not a whole number of its rotation groups of 64, so its weight "
        "cannot be turned back (in a.comfy_quant)",
    ),
    "group not a power of 4": (
        {"convrot_groupsize": 32},
        "names the rotation group size 32, where ConvRot's rotation needs a power of 4",
    ),
    "group not a number": ({"convrot_groupsize": "256"}, 'names the rotation group size "256"'),
    "rotation not named plainly": (
        {"convrot": "hadamard"},
        'names its rotation as "hadamard", not true or false, so whether its weight is stored '
        "rotated is unknown (in a.comfy_quant)",
    ),
}


def damaged_layer(damage: dict) -> dict[str, torch.Tensor]:
    width = damage.get("width", 64)
    values = torch.randn(8, width, generator=torch.Generator().manual_seed(4)) * 0.05
    stored, scale = kitchen.quantize_int8_convrot_weight(values, 16 if width % 64 else 64)
    config = {"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": 64}
    config |= {k: v for k, v in damage.items() if k in ("convrot", "convrot_groupsize")}
    if "a.weight_scale" in damage:
        bad = damage["a.weight_scale"]
        scale = scale.clone()
        scale[2] = 0.0 if bad == "zero row" else bad
    return {"a.weight": stored, "a.weight_scale": scale, "a.comfy_quant": comfy_quant(config)}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_a_damaged_convrot_layer_is_a_finding_naming_the_tensor(tmp_path, case):
    damage, words = DAMAGE[case]
    path = write_safetensors(tmp_path / "bad_int8_convrot.safetensors", damaged_layer(damage))

    scan = scan_weights(path)

    [finding] = scan.bad_quantized
    assert finding.tensor == "a.weight" and words in finding.problem, finding.problem


@pytest.mark.parametrize("damage", [pytest.param("scale", marks=pytest.mark.slow), "group"])
def test_a_convrot_model_with_a_damaged_layer_is_broken_naming_the_tensor(tmp_path, damage):
    case = CASES["qwenimage21"]
    key, _ = case.block
    written = quantised_set(tmp_path, build_pipeline("qwenimage21"), case, "int8-convrot")
    assert key in written.rotated
    with Checkpoint(written.path) as checkpoint:
        tensors = {k: checkpoint._stored(k).clone() for k in checkpoint.header.tensors}  # type: ignore[union-attr]
    layer = key.removesuffix(".weight")
    if damage == "scale":
        tensors[f"{layer}.weight_scale"][3] = float("nan")
        words = f"has the scale NaN (in {layer}.weight_scale)"
    else:
        config = {"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": 256}
        tensors[f"{layer}.comfy_quant"] = comfy_quant(config)
        words = f"groups of 256, so its weight cannot be turned back (in {layer}.comfy_quant)"
    write_safetensors(written.path, tensors)

    model = models.load_model(str(written.path))
    report = check(model)

    [finding] = model.weights.bad_quantized
    assert finding.tensor == key and words in finding.problem
    assert report.verdict is Verdict.BROKEN and report.fix is None
    assert report.components["transformer"].status is Status.BROKEN_WEIGHTS
    assert key in report.headline


# Tiny models of the families, written as int8 ConvRot ------------------------------------------


def held_per_weight(part) -> float:
    """The bytes a part's int8 ConvRot weights hold per weight: their int8 values and a 4-byte
    scale per row, nothing decoded (1.1 from rows of 40 values on)."""
    rotated = [p for p in part.parameters() if getattr(p, "codec", None) == INT8_CONVROT]
    assert rotated
    assert all(stored_bytes(p) == p.numel() + 4 * p.shape[0] for p in rotated)
    return sum(stored_bytes(p) for p in rotated) / sum(p.numel() for p in rotated)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_a_convrot_transformer_loads_kept_as_stored_within_its_error(tmp_path, name):
    case, pipeline = FAMILIES[name], build_pipeline(name)
    weights = written_weights(pipeline)
    written = quantised_set(tmp_path, pipeline, case, "int8-convrot", weights)
    assert len(written.rotated) > 5

    model = models.load_model(str(written.path))

    assert (model.format, model.architecture) == ("split_files", case.architecture)
    assert model.quantization is not None
    assert model.quantization.to_json()["format"] == "int8_convrot"
    assert "INT8_CONVROT" in model.quantization.types
    assert stored_form(model.quantization) == "int8-convrot"  # as `advise` names the form
    assert model.weights.bad_quantized == [] and model.weights.non_finite == []
    transformer = model.pipeline.transformer
    assert held_per_weight(transformer) <= 1.1
    with Checkpoint(written.path) as checkpoint:
        for key in written.rotated:
            assert close(checkpoint.get(key), written.decoded[key]), key
            assert close(checkpoint.get(key), weights[key].float(), written.error[key]), key


def planted(name: str) -> tuple[dict[str, torch.Tensor], str]:
    """The family's weights with its block layer scaled until its largest weight is 8,000 (as
    test_quantized_2026 plants one), and that layer's diffusers name."""
    from tests.support.quantised_transformers import PLANTED_PEAK

    key, layer = FAMILIES[name].block
    weights = written_weights(build_pipeline(name))
    values = weights[key].float()
    weights[key] = (values * (PLANTED_PEAK / values.abs().max())).to(torch.bfloat16)
    return weights, layer


def bf16_set(root, name: str, weights) -> str:
    """The family's files as ComfyUI keeps them, its transformer file holding `weights`."""
    case = FAMILIES[name]
    written = save_split_files(build_pipeline(name), root / "models", case.stem)
    write_safetensors(written["transformer"], weights)
    return str(written["transformer"])


def verdict_of(report) -> tuple:
    fix = report.to_json()["fix"]
    bad = {n: c.first_bad_module for n, c in report.components.items() if c.first_bad_module}
    return report.verdict, bad, fix and {k: v for k, v in fix.items() if k in ("modules",)}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FAMILIES))
def test_a_planted_overflow_gets_the_bf16_originals_verdict_layer_and_fix(tmp_path, name):
    weights, layer = planted(name)
    written = quantised_set(
        tmp_path / "int8", build_pipeline(name), FAMILIES[name], "int8-convrot", weights
    )
    key, _ = FAMILIES[name].block
    assert key in written.rotated  # the planted layer is stored rotated

    original = check(models.load_model(bf16_set(tmp_path / "bf16", name, weights)))
    rotated = check(models.load_model(str(written.path)))

    assert original.verdict is Verdict.FIXABLE
    assert original.components["transformer"].first_bad_module == layer
    assert verdict_of(rotated) == verdict_of(original)
    assert rotated.fix is not None and rotated.fix.verified


def test_a_256_group_transformer_loads_and_checks_as_its_bf16_original(tmp_path):
    """Released files rotate in groups of 256: Klein with a 256-wide transformer."""
    from tests.support.quantised_transformers import wide_klein

    case = CASES["flux2-klein"]
    pipeline = wide_klein(case.build())
    weights = written_weights(pipeline)
    written = save_split_files(pipeline, tmp_path / "models", case.stem)
    written["transformer"].unlink()
    path = written["transformer"].with_name(f"{case.stem}_int8_convrot.safetensors")
    quantised = write_int8(path, weights, matrices_under(case.fp8_layers), 256)
    assert any(weights[k].shape[1] == 256 for k in quantised.rotated)

    model = models.load_model(str(path))

    groups = {
        p.group for p in model.pipeline.transformer.parameters() if isinstance(p, StoredTensor)
    }
    assert groups == {256}
    assert model.weights.bad_quantized == []
    assert check(model).verdict is Verdict.HEALTHY


# Text encoders written as int8 ConvRot (Qwen3-VL's qwen3vl_4b_int8_convrot, Qwen3's) ------------


@pytest.mark.parametrize("name", ["flux3-klein", "qwenimage21", "zimage"])
def test_a_convrot_text_encoder_loads_kept_as_stored_beside_a_convrot_transformer(tmp_path, name):
    case, pipeline = FAMILIES[name], build_pipeline(name)
    written = quantised_set(tmp_path, pipeline, case, "int8-convrot")
    (encoder_file,) = (tmp_path / "models" / "text_encoders").iterdir()
    with Checkpoint(encoder_file) as checkpoint:
        tensors = {k: checkpoint.get(k).clone() for k in checkpoint.shapes}
    encoder_file.unlink()
    renamed = encoder_file.with_name(encoder_file.stem + "_int8_convrot.safetensors")
    encoder = write_int8(renamed, tensors, language_model_matrix, 16)
    assert len(encoder.rotated) > 3

    model = models.load_model(str(written.path))

    assert model.quantization is not None
    assert model.quantization.to_json()["files"] == [written.path.name, renamed.name]
    assert model.weights.bad_quantized == []
    loaded = model.pipeline.text_encoder
    rotated = [p for p in loaded.parameters() if getattr(p, "codec", None) == INT8_CONVROT]
    assert len(rotated) == len(encoder.rotated)
    assert held_per_weight(loaded) <= 1 + 4 / 32  # these tiny encoders' rows are 32 wide
    assert check(model).verdict is Verdict.HEALTHY


# The same image ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", ["flux3-klein", "zimage"])
def test_a_convrot_model_generates_the_image_its_decoded_weights_generate(tmp_path, name):
    """The int8 ConvRot file and a bf16 file of the values it decodes to make one picture, within
    fp16's noise (the rotated layers compute with the input rotated, the bf16 ones with the
    weight turned back)."""
    case, pipeline = FAMILIES[name], build_pipeline(name)
    written = quantised_set(tmp_path / "int8", pipeline, case, "int8-convrot")
    decoded = {k: v.to(torch.bfloat16) for k, v in written.decoded.items()}
    bf16 = bf16_set(tmp_path / "bf16", name, decoded)

    pictures = []
    for path in (str(written.path), bf16):
        request = generation.GenerationRequest(
            prompt="a red cat",
            steps=3,
            cfg=1.0,
            seed=3,
            width=64,
            height=64,
            output_dir=str(tmp_path / "out"),
        )
        result = generation.generate(models.load_model(path), request, precision=FP16, device="cpu")
        (image,) = result.images
        assert image.status == "ok" and image.image is not None
        pictures.append(np.asarray(image.image.convert("RGB"), dtype=np.float32))

    assert pictures[0].std() > 0
    assert np.abs(pictures[0] - pictures[1]).mean() < 2.0  # of 255: fp16's noise
    assert np.abs(pictures[0] - pictures[1]).max() < 32.0


# A single file: SD1's linear layers as int8 ConvRot -------------------------------------------


def test_a_single_file_with_convrot_layers_loads_and_checks_healthy(tmp_path):
    from tests.support.model_files import ldm_state_dict
    from tests.support.quantized_files import is_quantizable

    tensors = ldm_state_dict(build_tiny_sd_pipeline(seed=3), architecture="sd1")
    matrices = lambda n, t: is_quantizable(n, t) and t.ndim == 2  # noqa: E731
    written = write_int8(tmp_path / "tiny-sd1_int8_convrot.safetensors", tensors, matrices, 16)
    assert len(written.rotated) > 10

    model = models.load_model(str(written.path))

    assert model.quantization is not None
    assert model.quantization.to_json()["format"] == "int8_convrot"
    assert model.weights.bad_quantized == []
    assert held_per_weight(model.pipeline.unet) <= 1.1
    assert check(model).verdict is Verdict.HEALTHY
