"""Companion files of a split transformer (ComfyUI's text_encoders/, clip/ and vae/ beside
diffusion_models/): a damaged file there costs only itself, junk cannot hide the real files,
and the file used for each component is named, so that its damage is blamed on it."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from app.cli.text import health_text
from app.core import models
from app.core.checkpoint import write_safetensors
from app.core.errors import UnsupportedModelError
from app.core.library import scan_library
from app.core.models import split
from tests.support.family_helpers import (
    check,
    offline,  # noqa: F401 - an autouse fixture: no network
)
from tests.support.model_files import save_split_files
from tests.support.tiny_models import build_tiny_flux_pipeline, build_tiny_sd3_pipeline

T5_BIAS = "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"


@pytest.fixture(scope="module")
def flux_tree(tmp_path_factory):
    """A tiny Flux.1 as ComfyUI keeps it, written once: (models folder, paths by component)."""
    root = tmp_path_factory.mktemp("flux") / "models"
    return root, save_split_files(build_tiny_flux_pipeline(), root, "flux1-tiny")


@pytest.fixture
def flux(flux_tree, tmp_path):
    """A fresh copy of the tree for one test to change: paths by component, and "root"."""
    root, written = flux_tree
    shutil.copytree(root, tmp_path / "models")
    copied = {c: tmp_path / "models" / p.relative_to(root) for c, p in written.items()}
    return {**copied, "root": tmp_path / "models"}


def t5_with(flux, **changes) -> dict[str, torch.Tensor]:
    """The tiny T5's tensors with some replaced."""
    return {**load_file(flux["text_encoder_2"]), **changes}


def one_sentence(message: str) -> bool:
    return message.endswith(".") and message.count(". ") == 0 and "\n" not in message


# --- a damaged file beside the real ones costs only itself -----------------------------------


def test_a_tiny_t5_with_a_1d_embedding_is_passed_over_and_the_real_one_loads(flux):
    # 220-odd bytes, keyed like a T5 encoder, its token embedding one-dimensional.
    damaged = flux["root"] / "text_encoders" / "a_t5.safetensors"
    write_safetensors(
        damaged,
        {
            "shared.weight": torch.zeros(8),
            "encoder.block.0.layer.0.SelfAttention.q.weight": torch.zeros(2, 2),
        },
    )
    assert damaged.stat().st_size < 300

    model = models.load_model(str(flux["transformer"]))

    assert model.companions["text_encoder_2"] == str(flux["text_encoder_2"])
    (note,) = [n for n in model.notes if "Passed over" in n]
    assert str(damaged) in note
    assert "this T5 text encoder cannot be built: its shared.weight has shape [8]" in note


def test_the_library_still_lists_the_model_beside_a_damaged_t5(flux):
    write_safetensors(
        flux["root"] / "text_encoders" / "a_t5.safetensors",
        {
            "shared.weight": torch.zeros(8),
            "encoder.block.0.layer.0.SelfAttention.q.weight": torch.zeros(2, 2),
        },
    )

    entries = scan_library([str(flux["root"])], include_defaults=False, use_cache=False)

    by_name = {e.path.rsplit("/", 1)[-1]: e for e in entries}
    entry = by_name["flux1-tiny.safetensors"]
    assert (entry.architecture, entry.supported, entry.missing) == ("flux-dev", True, None)
    assert entry.companions and entry.companions["text_encoder_2"] == str(flux["text_encoder_2"])
    assert by_name["a_t5.safetensors"].supported is False  # its own row, nothing more


def test_a_t5_with_no_heads_that_sorts_first_is_passed_over_with_why(flux):
    # Named like a T5 and first by name, as wide as the transformer takes, but 0 heads.
    damaged = flux["root"] / "text_encoders" / "t5_a.safetensors"
    bias = t5_with(flux)[T5_BIAS]
    write_safetensors(damaged, t5_with(flux, **{T5_BIAS: torch.zeros(bias.shape[0], 0)}))

    model = models.load_model(str(flux["transformer"]))

    assert model.companions["text_encoder_2"] == str(flux["text_encoder_2"])
    assert any(str(damaged) in n and "with an empty dimension" in n for n in model.notes)

    # Alone, it is named in the sentence saying the T5 is missing.
    flux["text_encoder_2"].unlink()
    with pytest.raises(UnsupportedModelError) as caught:
        models.load_model(str(flux["transformer"]))
    message = str(caught.value)
    assert "needs its T5 text encoder (t5xxl)" in message
    assert f"passed over: {damaged} (this T5 text encoder cannot be built: its {T5_BIAS}" in message
    assert one_sentence(message)


@pytest.mark.parametrize(
    "damage",
    [
        {"shared.weight": torch.zeros(8)},
        {T5_BIAS: torch.zeros(32, 0)},
    ],
    ids=["1d-embedding", "0-heads"],
)
def test_a_damaged_t5_given_by_flag_is_one_sentence_naming_it(flux, damage):
    given = flux["root"].parent / "my_t5.safetensors"
    write_safetensors(given, t5_with(flux, **damage))

    with pytest.raises(UnsupportedModelError) as caught:
        models.load_model(str(flux["transformer"]), text_encoders=[str(given)])

    message = str(caught.value)
    assert message.startswith(f"{given}: this T5 text encoder cannot be built: its ")
    assert one_sentence(message)


def test_an_sd3_file_with_a_0x0_patch_embedding_is_one_sentence_and_one_row(tmp_path):
    written = save_split_files(build_tiny_sd3_pipeline(), tmp_path / "models", "sd3")
    tensors = load_file(written["transformer"])
    width, channels = tensors["x_embedder.proj.weight"].shape[:2]
    tensors["x_embedder.proj.weight"] = torch.zeros(width, channels, 0, 0)
    write_safetensors(written["transformer"], tensors)

    with pytest.raises(UnsupportedModelError) as caught:
        models.load_model(str(written["transformer"]))

    message = str(caught.value)
    assert "this SD3-style transformer is not one HalfSafe can build" in message
    assert "x_embedder.proj.weight has shape [" in message and "empty dimension" in message
    assert one_sentence(message)
    (entry,) = scan_library(
        [str(written["transformer"].parent)], include_defaults=False, use_cache=False
    )
    assert entry.supported is False and "empty dimension" in (entry.detected_because or "")


# --- junk cannot hide the real files ------------------------------------------------------


def test_hundreds_of_junk_files_that_sort_first_do_not_hide_the_companions(flux):
    # More junk than candidates are read, every file sorting before the real ones, which are
    # renamed so that no name says what they are: they are found by size and content.
    junk = 300
    for folder in ("text_encoders", "vae"):
        for i in range(junk):
            (flux["root"] / folder / f"0000_{i:03}.safetensors").write_bytes(b"\0" * 16)
    renamed = {}
    for component in ("text_encoder", "text_encoder_2", "vae"):
        renamed[component] = flux[component].with_name(f"zz_{component}.safetensors")
        flux[component].rename(renamed[component])

    model = models.load_model(str(flux["transformer"]))

    assert model.companions == {c: str(p) for c, p in renamed.items()}
    assert junk > split.MAX_CANDIDATES  # found by rank, not by reading every header


# --- the file used is named, and its damage blamed on it -----------------------------------


def test_of_two_fitting_t5s_the_one_used_is_named_and_its_nan_is_blamed_on_it(flux):
    other = flux["text_encoder_2"].with_name("t5xxl_fp8.safetensors")
    shutil.copy(flux["text_encoder_2"], other)
    embedding = t5_with(flux)["shared.weight"].clone()
    embedding[0, 0] = float("nan")
    write_safetensors(flux["text_encoder_2"], t5_with(flux, **{"shared.weight": embedding}))

    model = models.load_model(str(flux["transformer"]))
    report = check(model)

    chosen = str(flux["text_encoder_2"])
    document = json.loads(json.dumps(report.to_json()))
    assert document["model"]["companions"] == {
        "text_encoder": str(flux["text_encoder"]),
        "text_encoder_2": chosen,
        "vae": str(flux["vae"]),
    }
    assert document["verdict"] == "broken"
    assert document["components"]["text_encoder_2"]["status"] == "broken_weights"
    assert chosen in report.headline and str(flux["transformer"]) not in report.headline
    assert any(f"used {chosen} as text_encoder_2, not {other}" in n for n in report.notes)
    text = health_text(report)
    assert f"text_encoder_2  {chosen}" in text
