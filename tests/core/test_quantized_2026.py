"""The newest families' transformer files as users download them quantised, beside their
companions as ComfyUI keeps them: Flux.2 Klein, Qwen-Image 2.1 and Krea 2 (and Flux.2 dev, read
and refused), each written here from a tiny transformer in its original key layout (the one
diffusers' single-file converters read) as

- fp8 e4m3 safetensors in ComfyUI's layouts (as its comfy/ops.py, MixedPrecisionOps, and
  comfy/utils.py, convert_old_quants, read them): "mixed", each quantised layer with
  `<layer>.weight_scale`, `<layer>.input_scale` and `<layer>.comfy_quant` (its format as JSON
  bytes) beside bf16 layers; the same with the formats in the header's `_quantization_metadata`
  instead of `comfy_quant` tensors; "scaled", `<layer>.scale_weight` and `scale_input` with the
  `scaled_fp8` marker;
- GGUF as city96's ComfyUI-GGUF tools make one (tools/convert.py, then llama-quantize patched
  with tools/lcpp.patch): 1-D tensors and those of at most 1,024 values in F32, the block
  matrices quantised (Q8_0, or Q4_K encoded here, which the gguf package cannot), and for
  Flux.2, which the converter takes for "flux", its embedders and final layer left in BF16.

Each file is detected as its family and variant from its header; its weights load dequantised
to the values this file decodes from the bytes it wrote, within the quantisation's error of
the weights written; and the health check's verdict is right: a healthy model healthy, an
overflow planted in one of its blocks found at that layer. A text encoder in ComfyUI's fp8
"mixed" layout loads beside them too.

Not known here, so not claimed: which layers a released fp8 file keeps in bf16, the released
files' names, and how Qwen-Image 2.1, Krea 2 and FLUX.3 GGUF files are made (the converter read
has no rules for them: they get the generic ones and a made-up `general.architecture`, which
HalfSafe does not read). The reader depends on none of these.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch

from app.core import models
from app.core.checkpoint import Checkpoint, read_header
from app.core.components import Verdict
from app.core.errors import UnsupportedModelError
from app.core.models import split
from tests.support.family_helpers import (
    check,
    offline,  # noqa: F401 - an autouse fixture: no network
)
from tests.support.quantised_transformers import (
    CASES,
    PLANTED_PEAK,
    Written,
    close,
    language_model_matrix,
    original_weights,
    quantised_set,
    wide_klein,
    write_fp8,
    write_quantised,
    written_weights,
)
from tests.support.tiny_models import tiny_flux2_transformer

# The families ------------------------------------------------------------------------------


FORMATS = (
    "fp8-comfy_quant",
    "fp8-metadata",
    "fp8-scaled",
    "gguf-Q8_0",
    "nvfp4-comfy",
    "nvfp4-modelopt",
    "int8-comfy_quant",
    "int8-convrot",
)


@pytest.fixture(scope="module")
def pipelines():
    """Each family's tiny pipeline, built once (the tests read it, never change it)."""
    return {name: case.build() for name, case in CASES.items()}


# A model folder as ComfyUI keeps it ----------------------------------------------------------


def assert_read_as_written(written: Written, weights) -> None:
    """The reader gives each tensor of the file as this file decodes the bytes it wrote, in
    the weight's shape, and within the quantisation's error of the weight written."""
    with Checkpoint(written.path) as checkpoint:
        assert set(checkpoint.keys()) == set(weights)  # the scales and configs are hidden
        for key, want in written.decoded.items():
            got = checkpoint.get(key)
            assert got.shape == weights[key].shape, key
            assert close(got, want), key
            assert close(got, weights[key].float(), written.error[key]), key


def assert_loaded_as_written(model, pipeline, written: Written) -> None:
    """The transformer built from the file holds the pipeline's own weights (rounded to bf16,
    as written; by its own names, not through a key table) within the error of the file's
    tensor each comes from, and not all of them exactly (a quantised file is not its original)."""
    read = split.read_model(read_header(written.path).shapes())
    assert read is not None
    bound = {
        name: float(written.error[original].max())
        for original, names, _ in read.rows()
        for name in names
    }
    want = {
        k: v.detach().to(torch.bfloat16).float()
        for k, v in pipeline.transformer.state_dict().items()
    }
    state = model.pipeline.transformer.state_dict()
    assert set(state) == set(want)
    for key, value in want.items():
        assert close(state[key], value, bound[key]), key
    assert any(not torch.equal(state[k].float(), v) for k, v in want.items())


QUANTISED_TYPES = {"F8_E4M3", "Q8_0", "Q4_K", "NVFP4", "INT8", "INT8_CONVROT"}


def quantization_of(written: Written) -> dict[str, Any]:
    """The `model.quantization` a model read from this file alone reports."""
    types = set(written.types.values())
    if written.path.suffix == ".gguf":
        stored = {"format": "gguf", "types": sorted(types)}
    elif "NVFP4" in types:
        stored = {"format": "nvfp4", "types": ["NVFP4"]}
    elif types & {"INT8", "INT8_CONVROT"}:
        fmt = "int8_convrot" if "INT8_CONVROT" in types else "int8_scaled"
        stored = {"format": fmt, "types": sorted(types & {"INT8", "INT8_CONVROT"})}
    else:
        stored = {"format": "fp8_scaled", "types": ["F8_E4M3"]}
    return {
        **stored,
        "files": [written.path.name],
        "dequantized_to": "bf16",
        "dequantized_on_load": [],
    }


# The layouts written: the ones diffusers' own converters read ---------------------------------

CONVERTERS = {
    "flux2-klein": "convert_flux2_transformer_checkpoint_to_diffusers",
    "flux2-dev": "convert_flux2_transformer_checkpoint_to_diffusers",
    "qwenimage21": "convert_qwen_image21_transformer_checkpoint_to_diffusers",
    "krea2": "convert_krea2_transformer_checkpoint_to_diffusers",
    "flux3-klein": "convert_flux3_transformer_checkpoint_to_diffusers",
}


def dev_transformer():
    """A tiny Flux.2 dev transformer (its guidance embedding is what tells it from Klein); dev
    files are refused before any companion is read, so no pipeline is needed."""
    return tiny_flux2_transformer(3, guidance=True, text=96)


@pytest.mark.parametrize("name", list(CONVERTERS))
def test_the_weights_written_here_are_in_the_layout_diffusers_converters_read(pipelines, name):
    """Every file here is made from these weights: diffusers' single-file converter for the
    family reads them back into the pipeline's own transformer, so their names and fused,
    swapped or flattened tensors are the released files' and not only this project's table."""
    from diffusers.loaders import single_file_utils

    from app.core.families.flux2 import LAYOUT

    if name == "flux2-dev":
        transformer = dev_transformer()
        weights = original_weights(transformer, LAYOUT)
    else:
        transformer = pipelines[name].transformer
        weights = written_weights(pipelines[name])

    convert = getattr(single_file_utils, CONVERTERS[name])
    theirs = convert({k: v.clone() for k, v in weights.items()})

    state = {k: v.to(torch.bfloat16) for k, v in transformer.state_dict().items()}
    assert set(theirs) == set(state)
    assert all(torch.equal(theirs[k], v) for k, v in state.items())


# Detection ---------------------------------------------------------------------------------


@pytest.mark.parametrize("form", FORMATS)
@pytest.mark.parametrize("name", list(CASES))
def test_a_quantised_transformer_file_is_detected_as_its_family_from_its_header(
    tmp_path, pipelines, name, form
):
    from app.core.library import scan_library

    case = CASES[name]
    written = quantised_set(tmp_path, pipelines[name], case, form)

    read = split.read_model(read_header(written.path).shapes())

    assert read is not None and read.architecture == case.architecture
    assert read.because.startswith(case.because)
    entries = scan_library([str(tmp_path / "models")], include_defaults=False, use_cache=False)
    (entry,) = [e for e in entries if e.path == str(written.path)]
    assert (entry.architecture, entry.supported, entry.error) == (case.architecture, True, None)
    assert entry.companions is not None and None not in entry.companions.values()
    assert entry.stored_dtype == "mixed"


# Loading -----------------------------------------------------------------------------------


@pytest.mark.parametrize("form", FORMATS)
@pytest.mark.parametrize("name", list(CASES))
def test_a_quantised_transformer_loads_dequantised_within_its_quantisations_error(
    tmp_path, pipelines, name, form
):
    case, pipeline = CASES[name], pipelines[name]
    weights = written_weights(pipeline)
    written = quantised_set(tmp_path, pipeline, case, form, weights)
    assert QUANTISED_TYPES & set(written.types.values())

    assert_read_as_written(written, weights)
    model = models.load_model(str(written.path))

    assert (model.format, model.architecture) == ("split_files", case.architecture)
    assert model.quantization is not None
    assert model.quantization.to_json() == quantization_of(written)
    assert model.weights.bad_quantized == [] and model.weights.non_finite == []
    assert_loaded_as_written(model, pipeline, written)


def test_a_klein_q4_k_gguf_loads_within_q4_ks_error_and_checks_healthy(tmp_path, pipelines):
    """Q4_K, as a Q4_K_S file of city96's tools holds Flux.2's blocks (its rules raise no
    Flux.2 layer to Q5_K or Q6_K; a Q4_K_M file's fused qkv would be Q5_K, which this file
    does not write): the embedders and final layer BF16, norms F32."""
    case, pipeline = CASES["flux2-klein"], wide_klein(pipelines["flux2-klein"])
    weights = written_weights(pipeline)
    written = quantised_set(tmp_path, pipeline, case, "gguf-Q4_K", weights)
    assert set(written.types.values()) == {"Q4_K", "BF16", "F32"}

    assert_read_as_written(written, weights)
    model = models.load_model(str(written.path))

    assert model.architecture == "flux2-klein"
    assert model.quantization is not None
    assert model.quantization.to_json() == quantization_of(written)
    assert model.weights.bad_quantized == [] and model.weights.non_finite == []
    assert_loaded_as_written(model, pipeline, written)
    assert check(model).verdict == Verdict.HEALTHY


@pytest.mark.parametrize("name", list(CASES))
def test_a_text_encoder_in_comfyuis_fp8_mixed_layout_loads_beside_a_gguf_transformer(
    tmp_path, pipelines, name
):
    case, pipeline = CASES[name], pipelines[name]
    written = quantised_set(tmp_path, pipeline, case, "gguf-Q8_0")
    (encoder_file,) = (tmp_path / "models" / "text_encoders").iterdir()
    with Checkpoint(encoder_file) as checkpoint:
        tensors = {k: checkpoint.get(k).clone() for k in checkpoint.shapes}
    encoder = write_fp8(encoder_file, tensors, language_model_matrix, "comfy_quant")
    assert "F8_E4M3" in encoder.types.values()

    model = models.load_model(str(written.path))

    assert model.quantization is not None and model.quantization.to_json()["format"] == "mixed"
    assert model.quantization.to_json()["files"] == [written.path.name, encoder_file.name]
    assert model.weights.bad_quantized == []
    loaded = model.pipeline.text_encoder.state_dict()
    mine = pipeline.text_encoder.state_dict()
    original = {**{k.removeprefix("model."): v for k, v in mine.items()}, **mine}
    for key, value in loaded.items():
        reference = original[key].float()
        if language_model_matrix(key, value):  # fp8 e4m3 with its scale, as written above
            error = reference.abs() / 16 + reference.abs().max() / 448 * 2**-10
            assert close(value, reference, error), key
        else:
            assert close(value, reference), key
    assert any(
        not torch.equal(v.float(), original[k].float())
        for k, v in loaded.items()
        if language_model_matrix(k, v)
    )


# Flux.2 dev: told from Klein, read, and refused for its tokenizer ---------------------------


@pytest.mark.parametrize("form", ["fp8-comfy_quant", "gguf-Q8_0"])
def test_a_quantised_flux2_dev_file_is_read_as_dev_and_refused_in_one_sentence(tmp_path, form):
    from app.core.families.flux2 import LAYOUT
    from app.core.library import scan_library

    weights = original_weights(dev_transformer(), LAYOUT)
    case = replace(CASES["flux2-klein"], stem="flux2-dev")
    written = write_quantised(tmp_path / "models" / "diffusion_models", weights, case, form)

    read = split.read_model(read_header(written.path).shapes())

    assert read is not None and read.architecture == "flux2-dev"
    assert read.because.startswith("Flux.2 dev: a transformer in Black Forest Labs' layout")
    assert "guidance embedding (guidance_in)" in read.because
    assert_read_as_written(written, weights)
    with pytest.raises(UnsupportedModelError) as caught:
        models.load_model(str(written.path))
    message = str(caught.value)
    assert message.startswith(f"{written.path}: Flux.2 dev reads its prompt with Mistral's Tekken")
    assert "\n" not in message and message.count(". ") == 0
    # The library says the same, not that a text encoder it could never take is missing.
    (entry,) = scan_library([str(tmp_path / "models")], include_defaults=False, use_cache=False)
    assert (entry.architecture, entry.supported) == ("flux2-dev", False)
    assert entry.missing == message.removeprefix(f"{written.path}: ")


# The check ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "form", ["fp8-comfy_quant", "gguf-Q8_0", "nvfp4-comfy", "int8-comfy_quant", "int8-convrot"]
)
@pytest.mark.parametrize("name", list(CASES))
def test_a_healthy_quantised_model_checks_healthy(tmp_path, pipelines, name, form):
    written = quantised_set(tmp_path, pipelines[name], CASES[name], form)

    report = check(models.load_model(str(written.path)))

    assert report.verdict == Verdict.HEALTHY and report.fix is None
    assert {c.status for c in report.components.values()} == {"ok"}
    document = report.to_json()
    assert document["model"]["quantization"] == quantization_of(written)
    assert document["weights"]["bad_quantized"] == []


# Different file forms for each family: GGUF, both of ComfyUI's fp8 layouts, NVFP4 in ComfyUI's
# and ModelOpt's layouts, int8.
PLANTED_IN = [
    ("flux2-klein", "gguf-Q8_0"),
    ("flux2-klein", "nvfp4-comfy"),
    ("qwenimage21", "fp8-comfy_quant"),
    ("qwenimage21", "int8-comfy_quant"),
    ("krea2", "int8-convrot"),
    ("krea2", "fp8-scaled"),
    ("krea2", "nvfp4-modelopt"),
    ("flux3-klein", "fp8-scaled"),
    ("flux3-klein", "gguf-Q8_0"),
]


@pytest.mark.parametrize(("name", "form"), PLANTED_IN)
def test_an_overflow_planted_in_a_quantised_block_is_found_at_its_layer(
    tmp_path, pipelines, name, form
):
    case, pipeline = CASES[name], pipelines[name]
    key, layer = case.block
    weights = written_weights(pipeline)
    planted = weights[key].float()
    weights[key] = (planted * (PLANTED_PEAK / planted.abs().max())).to(torch.bfloat16)
    written = quantised_set(tmp_path, pipeline, case, form, weights)
    assert written.types[key] in QUANTISED_TYPES  # the planted layer is stored quantised
    model = models.load_model(str(written.path))
    assert model.weights.bad_quantized == []  # a large weight, not a wrongly decoded one

    report = check(model)

    assert report.verdict == Verdict.FIXABLE
    bad = report.components["transformer"]
    assert bad.status in ("overflow", "nan") and bad.first_bad_module == layer
    assert all(c.status == "ok" for n, c in report.components.items() if n != "transformer")
    assert report.fix is not None and report.fix.verified
    assert set(report.to_json()["fix"]["modules"]) == {"transformer"}
