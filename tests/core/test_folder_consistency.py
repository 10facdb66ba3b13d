"""Diffusers folders that do not hold together are refused before diffusers builds anything: a
component's config.json against the tensor shapes in its weight files, each component's
declared class against what the family's pipeline takes, the transformer against what its
pipeline reads beside the noise, and every size in a config against real models' bounds. Each
case is one plain sentence naming the folder or file and the problem, in seconds, never a
traceback, a silent load that drops weights, or a healthy verdict for a model that cannot run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from app.core import config_limits
from app.core.errors import (
    BadFileError,
    UnsupportedModelError,
    WrongPartError,
    WrongVariantError,
)
from app.core.models import load_model
from app.core.models.folder_shapes import mismatch_words, text_encoder_problem
from tests.support.cli_output import without_progress
from tests.support.family_helpers import offline  # noqa: F401 - an autouse fixture: no network
from tests.support.tiny_models import (
    build_tiny_flux2_klein_pipeline,
    build_tiny_flux_fill_pipeline,
    build_tiny_flux_pipeline,
    build_tiny_krea2_pipeline,
    build_tiny_qwenimage21_pipeline,
    build_tiny_sd_pipeline,
    tiny_t5,
)

ROOT = Path(__file__).resolve().parents[2]

BUILDERS: dict[str, Callable] = {
    "flux": build_tiny_flux_pipeline,
    "fill": build_tiny_flux_fill_pipeline,
    "klein": build_tiny_flux2_klein_pipeline,
    "qwenimage21": build_tiny_qwenimage21_pipeline,
    "krea2": build_tiny_krea2_pipeline,
    "sd": build_tiny_sd_pipeline,
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path]:
    """Each tiny pipeline saved once as a diffusers folder."""
    root = tmp_path_factory.mktemp("folders")
    folders = {}
    for name, build in BUILDERS.items():
        build().save_pretrained(root / name)
        folders[name] = root / name
    return folders


def copied(saved: dict[str, Path], name: str, target: Path) -> Path:
    """A copy of a saved folder to change: configs copied, weight files linked (never edited
    in place, so the saved folder stays as it was)."""

    def link_weights(source: str, destination: str) -> None:
        if source.endswith(".safetensors"):
            os.link(source, destination)
        else:
            shutil.copy2(source, destination)

    shutil.copytree(saved[name], target, copy_function=link_weights)
    return target


def edit_json(path: Path, change: Callable[[dict], object]) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    change(data)
    path.write_text(json.dumps(data), encoding="utf-8")


def swap_component(folder: Path, component: str, source: Path) -> None:
    """Put another folder's component where this one's was (its files only)."""
    shutil.rmtree(folder / component)
    shutil.copytree(source / component, folder / component)


def declare(folder: Path, component: str, class_name: str) -> None:
    """Declare a component of another class, in model_index.json and its config.json."""
    edit_json(
        folder / "model_index.json",
        lambda index: index.__setitem__(component, [index[component][0], class_name]),
    )
    edit_json(
        folder / component / "config.json", lambda c: c.__setitem__("_class_name", class_name)
    )


@pytest.fixture
def nothing_built(monkeypatch):
    """Fail the test if diffusers is asked to build the pipeline: a refusal comes first."""
    import diffusers

    def build(*_args, **_kwargs):
        raise AssertionError("diffusers was asked to build a folder that should be refused")

    monkeypatch.setattr(diffusers.DiffusionPipeline, "from_pretrained", build)


def one_sentence(error: BaseException, path: Path, *words: str) -> str:
    """One plain sentence, naming `path` and saying each of `words`."""
    assert isinstance(error, BadFileError), repr(error)
    text = str(error)
    assert text.startswith(f"{path}: "), text
    assert "\n" not in text and text.endswith(".") and ". " not in text, text
    assert "Traceback" not in text
    for word in words:
        assert word in text, text
    return text


def refused(folder: Path, kind: type[BaseException] = BadFileError) -> BaseException:
    with pytest.raises(kind) as caught:
        load_model(str(folder))
    return caught.value


# A Flux.1 Fill folder holding Flux.1 dev's transformer ---------------------------------------


def test_a_fill_folder_holding_a_dev_transformer_is_refused_naming_both(
    saved, tmp_path, nothing_built
):
    folder = copied(saved, "fill", tmp_path / "flux-fill-tiny")
    swap_component(folder, "transformer", saved["flux"])

    error = refused(folder, UnsupportedModelError)

    assert str(error) == (
        f"{folder}: this looks like a Flux.1 Fill (inpainting) pipeline: its FluxFillPipeline "
        "needs a Fill transformer, which reads the masked picture's latents and the mask beside "
        "the noise (384 input channels for 64 output channels), but its transformer takes 64 "
        "input channels, as Flux.1 dev's and schnell's do."
    )


def test_a_flux_folder_holding_a_fill_transformer_is_refused(saved, tmp_path, nothing_built):
    folder = copied(saved, "flux", tmp_path / "flux-tiny")
    swap_component(folder, "transformer", saved["fill"])

    text = one_sentence(refused(folder, UnsupportedModelError), folder)

    assert "its FluxPipeline needs a transformer that takes as many input channels" in text
    assert "takes 384 input channels, as Flux.1 Fill's does" in text


def test_check_of_a_fill_folder_holding_a_dev_transformer_exits_2_not_healthy(saved, tmp_path):
    folder = copied(saved, "fill", tmp_path / "flux-fill-tiny")
    swap_component(folder, "transformer", saved["flux"])

    done = halfsafe("check", str(folder), "--size", "64", "--device", "cpu")

    line = cannot_run(done, folder)
    assert "needs a Fill transformer" in line and "healthy" not in line.lower()


# A config naming fewer or more blocks than its weights hold ----------------------------------


def test_a_klein_config_naming_fewer_blocks_than_its_weights_is_refused(
    saved, tmp_path, nothing_built
):
    folder = copied(saved, "klein", tmp_path / "klein-tiny")
    edit_json(
        folder / "transformer" / "config.json", lambda c: c.__setitem__("num_single_layers", 1)
    )

    error = refused(folder)

    assert str(error) == (
        f"{folder / 'transformer' / 'config.json'}: 2 blocks in the weights, 1 in the config: "
        "it builds 1 block in single_transformer_blocks where the weights beside it hold 2, so "
        "the config is another variant of the model than its weights (a model built from it "
        "drops or invents weights and draws noise: no numeric failure)."
    )
    assert isinstance(error, WrongVariantError)
    assert error.variant.to_json() == {
        "component": "transformer",
        "kind": "blocks",
        "where": "single_transformer_blocks",
        "in_file": 2,
        "in_config": 1,
        "setting": None,  # more than one of its sizes is 1
        "config": str(folder / "transformer" / "config.json"),
        "proved": True,
    }


def test_a_config_building_far_more_than_its_weights_is_stopped_early(
    saved, tmp_path, nothing_built
):
    folder = copied(saved, "sd", tmp_path / "sd-tiny")
    edit_json(
        folder / "unet" / "config.json",
        lambda c: c.update(layers_per_block=16, transformer_layers_per_block=128),
    )

    text = one_sentence(refused(folder), folder / "unet" / "config.json")

    assert "it builds a UNet2DConditionModel of more than" in text
    assert "tensors where the weights beside it hold 324" in text


def test_a_vae_config_of_other_latent_channels_than_its_weights_names_the_size(
    saved, tmp_path, nothing_built
):
    folder = copied(saved, "flux", tmp_path / "flux-tiny")
    edit_json(folder / "vae" / "config.json", lambda c: c.__setitem__("latent_channels", 4))

    text = one_sentence(refused(folder), folder / "vae" / "config.json")

    assert "decoder.conv_in.weight is 32x16x3x3 in the weights, 32x4x3x3 in the config: " in text
    assert "its latent_channels (4) builds it as 32x4x3x3 where the weights beside it hold" in text


def test_a_text_encoder_config_naming_fewer_layers_than_its_weights_is_refused(
    saved, tmp_path, nothing_built
):
    folder = copied(saved, "klein", tmp_path / "klein-tiny")
    edit_json(
        folder / "text_encoder" / "config.json", lambda c: c.__setitem__("num_hidden_layers", 20)
    )

    text = one_sentence(refused(folder), folder / "text_encoder" / "config.json")

    assert text.startswith(
        f"{folder / 'text_encoder' / 'config.json'}: 28 layers in the weights, 20 in the config: "
        "its num_hidden_layers (20) builds 20 layers in model.layers where the weights "
        "beside it hold 28"
    ), text


def test_a_multimodal_text_encoder_is_held_to_its_text_config(saved, tmp_path, nothing_built):
    folder = copied(saved, "qwenimage21", tmp_path / "qwen-image-2.1-tiny")
    edit_json(
        folder / "text_encoder" / "config.json",
        lambda c: c["text_config"].__setitem__("hidden_size", 128),
    )

    text = one_sentence(refused(folder), folder / "text_encoder" / "config.json")

    assert "its text_config's hidden_size is 128 where the weights beside it are 64 wide" in text


# A component declared as another family's class -----------------------------------------------


def test_a_klein_transformer_declared_as_flux1_is_refused(saved, tmp_path, nothing_built):
    folder = copied(saved, "klein", tmp_path / "klein-tiny")
    declare(folder, "transformer", "FluxTransformer2DModel")

    error = refused(folder, WrongPartError)

    assert str(error) == (
        f"{folder / 'transformer'}: model_index.json declares this a FluxTransformer2DModel "
        "(Flux.1's), but the Flux.2 Klein model klein-tiny needs a Flux2Transformer2DModel."
    )


def test_a_klein_vae_declared_autoencoderkl_is_refused(saved, tmp_path, nothing_built):
    folder = copied(saved, "klein", tmp_path / "klein-tiny")
    declare(folder, "vae", "AutoencoderKL")

    error = refused(folder, WrongPartError)

    assert str(error) == (
        f"{folder / 'vae'}: model_index.json declares this an AutoencoderKL, but the Flux.2 "
        "Klein model klein-tiny needs an AutoencoderKLFlux2."
    )


def test_a_qwenimage21_folder_with_krea2s_text_encoder_is_refused(saved, tmp_path, nothing_built):
    folder = copied(saved, "qwenimage21", tmp_path / "qwen-image-2.1-tiny")
    swap_component(folder, "text_encoder", saved["krea2"])
    edit_json(
        folder / "model_index.json",
        lambda index: index.__setitem__("text_encoder", ["transformers", "Qwen3VLModel"]),
    )

    error = refused(folder, WrongPartError)

    assert str(error) == (
        f"{folder / 'text_encoder'}: model_index.json declares this a Qwen3VLModel (Krea 2's), "
        "but the Qwen-Image 2.1 model qwen-image-2.1-tiny needs a "
        "Qwen3VLForConditionalGeneration."
    )


def test_krea2s_text_encoder_declared_as_qwenimage21_takes_it_is_refused_by_its_width(
    saved, tmp_path, nothing_built
):
    folder = copied(saved, "qwenimage21", tmp_path / "qwen-image-2.1-tiny")
    swap_component(folder, "text_encoder", saved["krea2"])  # the class model_index.json keeps

    error = refused(folder, WrongPartError)

    assert str(error) == (
        f"{folder / 'text_encoder'}: this is a 32-wide Qwen3-VL text encoder (FLUX.3's, "
        "Qwen-Image 2.1's or Krea 2's), but the Qwen-Image 2.1 model qwen-image-2.1-tiny needs its Qwen3-VL "
        "text encoder (qwen_3_vl_8b), not one 32 wide."
    )


def test_a_flux_folder_whose_t5_is_another_width_is_refused(saved, tmp_path, nothing_built):
    folder = copied(saved, "flux", tmp_path / "flux-tiny")
    shutil.rmtree(folder / "text_encoder_2")
    tiny_t5(5, hidden=64).save_pretrained(folder / "text_encoder_2")

    text = one_sentence(refused(folder, WrongPartError), folder / "text_encoder_2")

    assert text.endswith(
        "but the Flux.1 dev model flux-tiny needs its T5 text encoder (t5xxl), not one 64 wide."
    )
    assert "this is a 64-wide T5 text encoder" in text


def test_a_class_neither_library_has_is_named(saved, tmp_path, nothing_built):
    folder = copied(saved, "flux", tmp_path / "flux-tiny")
    edit_json(
        folder / "model_index.json",
        lambda index: index.__setitem__("transformer", ["diffusers", "FluxTransformer9DModel"]),
    )

    text = one_sentence(refused(folder), folder / "model_index.json")

    assert "declares the transformer a FluxTransformer9DModel, a class diffusers" in text


# Sizes no real model has ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("family", "axes", "words"),
    [
        ("flux", [4, 14, 1000], "its axes_dims_rope (4, 14, 1000) add up to 1018 where its "),
        ("klein", [8, 8, 8, 10], "its axes_dims_rope (8, 8, 8, 10) add up to 34 where its "),
        ("flux", [5, 13, 14], "has an odd axis"),
    ],
)
def test_rope_axes_that_do_not_share_the_heads_are_refused(
    saved, tmp_path, nothing_built, family, axes, words
):
    folder = copied(saved, family, tmp_path / f"{family}-tiny")
    edit_json(
        folder / "transformer" / "config.json", lambda c: c.__setitem__("axes_dims_rope", axes)
    )

    one_sentence(refused(folder), folder / "transformer" / "config.json", words)


def test_an_mlp_ratio_of_1e6_is_refused_before_anything_is_built(saved, tmp_path, nothing_built):
    folder = copied(saved, "klein", tmp_path / "klein-tiny")
    edit_json(folder / "transformer" / "config.json", lambda c: c.__setitem__("mlp_ratio", 1e6))

    text = one_sentence(refused(folder), folder / "transformer" / "config.json")

    assert "its mlp_ratio is 1000000.0, outside 1 to 16" in text


def test_a_transformer_config_of_1e5_layers_is_refused_within_memory_and_time(saved, tmp_path):
    folder = copied(saved, "flux", tmp_path / "flux-tiny")
    edit_json(
        folder / "transformer" / "config.json", lambda c: c.__setitem__("num_layers", 100_000)
    )

    done = halfsafe("check", str(folder), "--size", "64", "--device", "cpu", memory_gib=3)

    line = cannot_run(done, folder / "transformer" / "config.json")
    assert "its num_layers is 100000, outside 1 to 128" in line


@pytest.mark.parametrize(
    ("component", "key", "value", "words"),
    [
        ("text_encoder", ("text_config", "num_hidden_layers"), 100_000, "num_hidden_layers"),
        ("text_encoder", ("vision_config", "depth"), 100_000, "vision_config's depth"),
        ("vae", ("num_res_blocks",), 100_000, "num_res_blocks"),
        ("vae", ("dim_mult",), [1, 2, 4, 10_000], "dim_mult"),
        ("transformer", ("context_in_dim",), 10**9, "context_in_dim"),
        ("transformer", ("eps",), float("nan"), "eps"),
    ],
)
def test_every_size_of_a_2026_folder_is_bounded(
    saved, tmp_path, nothing_built, component, key, value, words
):
    folder = copied(saved, "qwenimage21", tmp_path / "qwen-image-2.1-tiny")

    def change(config: dict) -> None:
        target = config
        for step in key[:-1]:
            target = target[step]
        target[key[-1]] = value

    edit_json(folder / component / "config.json", change)

    one_sentence(refused(folder), folder / component / "config.json", words)


def test_the_configs_real_models_ship_pass_the_bounds():
    for file in sorted((ROOT / "app" / "resources" / "configs").glob("*/*/config.json")):
        config_limits.check_component_config(file.parent.name, json.loads(file.read_text()))
    # The released sizes of the 2026 transformers (their config.json).
    config_limits.check_transformer_config(
        {"num_layers": 8, "num_single_layers": 48, "attention_head_dim": 128,
         "num_attention_heads": 48, "joint_attention_dim": 15360, "mlp_ratio": 3.0,
         "axes_dims_rope": [32, 32, 32, 32], "timestep_guidance_channels": 256}
    )  # fmt: skip
    config_limits.check_transformer_config(
        {"num_layers": 28, "attention_head_dim": 128, "num_attention_heads": 48,
         "num_key_value_heads": 12, "intermediate_size": 16384, "text_hidden_dim": 2560,
         "num_text_layers": 12, "text_intermediate_size": 6912, "axes_dims_rope": [32, 48, 48]}
    )  # fmt: skip
    config_limits.check_transformer_config(
        {"dim": 3840, "n_layers": 30, "n_refiner_layers": 2, "n_heads": 30, "n_kv_heads": 30,
         "cap_feat_dim": 2560, "axes_dims": [32, 48, 48], "axes_lens": [1536, 512, 512]}
    )  # fmt: skip


# What still loads ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_folders_that_hold_together_still_load(saved, name):
    model = load_model(str(saved[name]))
    assert model.format == "diffusers"


def test_the_words_name_the_outermost_differing_blocks_and_a_config_value_alone():
    built = {"layers.0.w": (4, 8), "layers.1.w": (4, 8), "layers.0.inner.0.w": (2,)}
    held = {"layers.0.w": (4, 8), "layers.0.inner.0.w": (2,), "layers.0.inner.1.w": (2,)}
    words = mismatch_words(built, held, [], ["layers.1.w"], {"depth": 2, "width": 4})
    assert words == (
        "1 block in the weights, 2 in the config: its depth (2) builds 2 blocks in layers "
        "where the weights beside it hold 1"
    )
    shaped = mismatch_words({"w": (4, 8)}, {"w": (4, 6)}, [], [], {"inputs": 8, "other": 4})
    assert shaped == (
        "w is 4x6 in the weights, 4x8 in the config: its inputs (8) builds it as 4x8 where the "
        "weights beside it hold 4x6"
    )
    assert mismatch_words({"w": (1,)}, {"w": (1,)}, [], [], {}) is None


def test_a_t5_is_read_by_its_shared_embedding_not_its_tied_copy():
    held = {
        "shared.weight": (32128, 32),
        "encoder.embed_tokens.weight": (32128, 32),
        "encoder.block.0.layer.0.SelfAttention.q.weight": (32, 32),
        "encoder.block.1.layer.0.SelfAttention.q.weight": (32, 32),
    }
    config = {"d_model": 32, "num_layers": 2, "vocab_size": 32128}
    assert text_encoder_problem(config, held) is None
    assert "its num_layers (3) builds 3 layers" in str(
        text_encoder_problem({**config, "num_layers": 3}, held)
    )


# The command ---------------------------------------------------------------------------------

_CLI = """
import resource, sys
limit = int(sys.argv[1]) << 30
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
from app.cli import main
sys.exit(main(sys.argv[2:]))
"""


def halfsafe(*argv: str, memory_gib: int = 4) -> subprocess.CompletedProcess:
    """`halfsafe ARGV` in a subprocess with at most `memory_gib` of address space."""
    return subprocess.run(
        [sys.executable, "-c", _CLI, str(memory_gib), *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )


def cannot_run(done: subprocess.CompletedProcess, path: Path) -> str:
    """Exit 2, one line on stderr naming `path`, no traceback (the CLI contract)."""
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    err = without_progress(done.stderr)
    assert err.count("\n") == 1 and err.startswith("halfsafe: "), err
    assert str(path) in err and "Traceback" not in err, err
    return err.strip()
