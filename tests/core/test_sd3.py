"""What only SD3.x (MMDiT, CLIP-L + CLIP-G + T5-XXL) does, on tiny pipelines built in code:
Stability AI's layout as split files (Large- and Medium-shaped, SD3 Medium) and as one file
with everything inside, its three text encoders given by flag and placed by what they are, a
missing or misfit one named, an overflow in SD3.5 Medium's second attention, and NaN in its T5
making the transformer and the VAE victims. A diffusers folder, the health check over all five
components with planted overflows in the T5 feed-forward (the third text encoder), a joint
block and the VAE, and generation repairing a joint block are every family's contract:
test_families.py.
"""

from __future__ import annotations

import pytest
import torch

from app.core import models
from app.core.errors import BadFileError, UnsupportedModelError
from app.core.families import family_of
from app.core.families.sd3 import SD3Family
from tests.support.family_helpers import (
    check,
    in_memory,
    offline,  # noqa: F401 - an autouse fixture: no network
    same_weights,
)
from tests.support.model_files import save_split_files
from tests.support.tiny_models import build_tiny_sd3_pipeline

COMPONENTS = ("text_encoder", "text_encoder_2", "text_encoder_3", "transformer", "vae")
T5_LAYER = "encoder.block.0.layer.1.DenseReluDense.wo"


def loaded(pipeline, key: str):
    return in_memory(pipeline, key, "sd3")


# --- Stability AI's layout: split files and one file ---------------------------------------


def _same_outputs(a, b) -> None:
    """The config read from the shapes runs the weights as the original does: the transformer
    and all three text encoders give the same numbers."""
    config = a.transformer.config
    inputs = {
        "hidden_states": torch.randn(1, config.in_channels, 8, 8),
        "encoder_hidden_states": torch.randn(1, 5, config.joint_attention_dim),
        "pooled_projections": torch.randn(1, config.pooled_projection_dim),
        "timestep": torch.tensor([500.0]),
    }
    prompt = {"prompt": "a red cat", "prompt_2": None, "prompt_3": None, "device": "cpu"}
    with torch.no_grad():
        mine = [a.transformer(**inputs).sample]
        theirs = [b.transformer(**inputs).sample]
        mine += a.encode_prompt(**prompt, do_classifier_free_guidance=False, max_sequence_length=16)
        theirs += b.encode_prompt(
            **prompt, do_classifier_free_guidance=False, max_sequence_length=16
        )
    for x, y in zip(mine, theirs, strict=True):
        # The same numbers up to float rounding (a memory-mapped weight can take another
        # kernel path); a wrong head count, norm, activation or pooling would be far off.
        assert (x is None and y is None) or torch.allclose(x, y, rtol=1e-5, atol=1e-6)


SHAPES = {
    # as builder arguments, title, transformer key prefix (both as ComfyUI users have them)
    "large": ({}, "SD3.5 Large", "model.diffusion_model."),
    "medium": ({"medium": True}, "SD3.5 Medium", ""),
    "sd3-medium": ({"qk_norm": False}, "SD3 Medium", ""),
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_split_files_round_trip_offline_with_identical_weights_and_outputs(tmp_path, shape):
    arguments, title, prefix = SHAPES[shape]
    medium = shape == "medium"
    pipeline = build_tiny_sd3_pipeline(**arguments)
    written = save_split_files(pipeline, tmp_path / "models", f"sd3.5_{shape}", prefix=prefix)
    header = models.read_safetensors_header(written["transformer"]).shapes()
    assert prefix + "joint_blocks.1.context_block.attn.qkv.weight" in header
    assert (prefix + "joint_blocks.0.x_block.attn2.qkv.weight" in header) is medium
    assert written["text_encoder_2"].name == "clip_g.safetensors"

    model = models.load_model(str(written["transformer"]))  # companions found beside it

    assert (model.architecture, model.format, model.prediction_type) == (
        "sd3",
        "split_files",
        "flow",
    )
    assert model.detected_because.startswith(
        f"{title}-shaped: an MMDiT in Stability AI's layout ({prefix}joint_blocks)"
    )
    assert ("1 of them with a second attention (MMDiT-X)" in model.detected_because) is medium
    assert isinstance(family_of(model.pipeline), SD3Family)
    assert tuple(model.pipeline.transformer.config.dual_attention_layers) == (
        (0,) if medium else ()
    )
    same_weights(pipeline, model.pipeline, COMPONENTS)
    _same_outputs(pipeline, model.pipeline)


def test_stability_single_file_with_its_text_encoders_and_vae_inside(tmp_path):
    pipeline = build_tiny_sd3_pipeline()
    written = save_split_files(pipeline, tmp_path / "models", "sd3.5_large", single_file=True)
    assert list(written) == ["transformer"]
    header = models.read_safetensors_header(written["transformer"]).shapes()
    assert "model.diffusion_model.joint_blocks.0.x_block.attn.qkv.weight" in header
    assert "text_encoders.clip_g.transformer.text_projection.weight" in header
    assert "text_encoders.t5xxl.transformer.shared.weight" in header
    assert "first_stage_model.decoder.conv_in.weight" in header

    model = models.load_model(str(written["transformer"]))

    assert (model.architecture, model.format) == ("sd3", "single_file")
    assert "the file carries its CLIP-L, CLIP-G, T5 and VAE too" in model.detected_because
    same_weights(pipeline, model.pipeline, COMPONENTS)
    _same_outputs(pipeline, model.pipeline)


def test_text_encoders_given_by_flag_are_placed_by_what_they_are(tmp_path):
    pipeline = build_tiny_sd3_pipeline()
    written = save_split_files(pipeline, tmp_path / "models")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    moved = {c: p.rename(elsewhere / p.name) for c, p in written.items()}

    model = models.load_model(
        str(moved["transformer"]),
        # CLIP-G first: its name, not its place on the command line, makes it the second CLIP.
        text_encoders=[str(moved[c]) for c in ("text_encoder_2", "text_encoder_3", "text_encoder")],
        vae=str(moved["vae"]),
    )

    same_weights(pipeline, model.pipeline, COMPONENTS)


def test_a_text_encoder_given_that_fits_nothing_left_is_named(tmp_path):
    written = save_split_files(build_tiny_sd3_pipeline(), tmp_path / "models")
    t5 = str(written["text_encoder_3"])

    with pytest.raises(UnsupportedModelError) as caught:
        models.load_model(str(written["transformer"]), text_encoders=[t5, t5])

    message = str(caught.value)
    assert message.startswith(t5)
    assert (
        "T5 text encoder (Flux.1's, Chroma's or Stable Diffusion 3.x's), but the SD3.5 Large "
        "transformer model.safetensors needs its CLIP-L text encoder (clip_l) and its CLIP-G "
        "text encoder (clip_g) (it fits its T5 text encoder (t5xxl), already given as "
        "t5xxl.safetensors)."
    ) in message


def test_split_file_with_a_missing_companion_says_which_in_one_sentence(tmp_path):
    written = save_split_files(build_tiny_sd3_pipeline(medium=True), tmp_path / "models")
    written["text_encoder_2"].unlink()
    written["vae"].unlink()

    with pytest.raises(UnsupportedModelError) as caught:
        models.load_model(str(written["transformer"]))

    message = str(caught.value)
    assert str(written["transformer"]) in message
    assert (
        "this SD3.5 Medium transformer file needs its CLIP-G text encoder (clip_g) and its "
        "16-channel SD3 VAE, which are neither given (--text-encoder PATH and --vae PATH)"
    ) in message
    assert "text_encoders" in message and "vae" in message
    assert message.count(". ") == 0 and message.endswith(".")


def test_clips_whose_pooled_vectors_do_not_make_the_transformers_input_are_named(tmp_path):
    from app.core.checkpoint import write_safetensors
    from tests.support.tiny_models import tiny_text_encoder

    written = save_split_files(build_tiny_sd3_pipeline(), tmp_path / "models")
    narrow = tiny_text_encoder(9, projection=16)  # a CLIP-L projecting to 16, not 32
    write_safetensors(written["text_encoder"], dict(narrow.state_dict()))

    with pytest.raises(UnsupportedModelError) as caught:
        models.load_model(str(written["transformer"]))

    assert "its CLIP text encoders' pooled vectors (16 + 32) are not the 64 values" in str(
        caught.value
    )


def test_overflow_in_the_second_attention_of_a_loaded_medium_file_is_found(tmp_path):
    written = save_split_files(build_tiny_sd3_pipeline(medium=True), tmp_path / "models")
    model = models.load_model(str(written["transformer"]))
    layer = "transformer_blocks.0.attn2.to_out.0"
    with torch.no_grad():
        model.pipeline.transformer.get_submodule(layer).weight.mul_(1e6)

    report = check(model)

    assert report.verdict == "fixable"
    failed = {n for n, c in report.components.items() if c.status in ("overflow", "nan")}
    assert failed == {"transformer"}
    assert report.components["transformer"].first_bad_module == layer
    assert report.fix.verified is True


def test_a_transformer_file_with_absurd_sizes_is_refused_before_anything_is_built(tmp_path):
    from safetensors.torch import load_file, save_file

    written = save_split_files(build_tiny_sd3_pipeline(), tmp_path / "models")
    tensors = load_file(written["transformer"])
    # A header naming block 5000: no tensor data, a model of 5000 blocks to allocate.
    tensors["joint_blocks.4999.x_block.attn.qkv.weight"] = torch.empty(0, 32)
    save_file(tensors, written["transformer"])

    with pytest.raises(BadFileError) as caught:
        models.load_model(str(written["transformer"]))

    message = str(caught.value)
    assert "the weights' shapes describe a model no real file holds" in message
    assert "its num_layers is 5000, outside 1 to 128" in message


def test_library_lists_split_files_with_companions_and_a_full_file_as_one(tmp_path):
    from app.core.library import scan_library

    root = tmp_path / "models"
    written = save_split_files(build_tiny_sd3_pipeline(), root, "sd3.5_large")
    full = save_split_files(build_tiny_sd3_pipeline(), root, "sd3.5_full", single_file=True)

    entries = scan_library(
        [str(root / "diffusion_models"), str(root / "checkpoints")],
        include_defaults=False,
        use_cache=False,
    )

    by_path = {e.path: e for e in entries}
    split = by_path[str(written["transformer"])]
    assert (split.architecture, split.format, split.supported) == ("sd3", "split_files", True)
    assert split.companions == {c: str(p) for c, p in written.items() if c != "transformer"}
    one = by_path[str(full["transformer"])]
    assert (one.architecture, one.format, one.supported) == ("sd3", "single_file", True)
    assert one.companions is None and one.missing is None


def test_nan_in_the_t5_weights_is_broken_and_the_transformer_and_vae_are_its_victims():
    """SD3.5 with a NaN in its T5: broken, naming the tensor; the transformer and the VAE were
    fed NaN by the third text encoder and are not blamed for it, the CLIPs are untouched."""
    pipeline = build_tiny_sd3_pipeline()
    with torch.no_grad():
        pipeline.text_encoder_3.get_submodule(T5_LAYER).weight[0, 0] = float("nan")
    report = check(loaded(pipeline, "sd3-nan-t5"))

    tensor = f"text_encoder_3.{T5_LAYER}.weight"
    assert report.verdict == "broken" and report.fix is None
    assert report.weights_non_finite == [tensor] and tensor in report.headline
    components = report.components
    assert components["text_encoder_3"].status == "broken_weights"
    for name in ("text_encoder", "text_encoder_2"):
        assert (components[name].status, components[name].fed_by) == ("ok", None)
    for name in ("transformer", "vae"):
        assert (components[name].status, components[name].fed_by) == ("ok", "text_encoder_3")
