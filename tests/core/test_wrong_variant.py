"""A model whose weights are another variant than the config it is built with (more or fewer
blocks, another width): named as such, both counts first, in the check (which refuses to build
it) and in explain (`variant`), before anything is said about numbers. A loader that builds such
a model draws noise, which users take for a numeric failure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from app.cli import main
from app.core import explain
from app.core.errors import WrongVariant, WrongVariantError
from app.core.families import family
from app.core.families.base import FamilyId
from app.core.families.variants import older_loader
from app.core.models import load_model
from tests.support.explain_pictures import decoded_noise
from tests.support.image_files import a1111_parameters, comfy_prompt, pixels, png_text
from tests.support.model_files import save_split_files
from tests.support.tiny_models import build_tiny_anima_pipeline, build_tiny_sd_pipeline

ANIMA = FamilyId("anima")


@pytest.fixture(scope="module")
def sd_folder_of_another_variant(tmp_path_factory) -> Path:
    """A tiny SD folder whose UNet config builds two resnets a down block where its weights
    hold one: the config of another variant than the weights."""
    folder = tmp_path_factory.mktemp("models") / "sd-tiny"
    build_tiny_sd_pipeline().save_pretrained(folder)
    config_path = folder / "unet" / "config.json"
    config = json.loads(config_path.read_text())
    config["layers_per_block"] = config["layers_per_block"] + 1
    config_path.write_text(json.dumps(config))
    return folder


def test_the_check_refuses_it_naming_both_counts_first(sd_folder_of_another_variant, capsys):
    folder = sd_folder_of_another_variant

    with pytest.raises(WrongVariantError) as raised:
        load_model(str(folder))
    assert main(["check", str(folder), "--device", "cpu", "--size", "64"]) == 2

    line = capsys.readouterr().err.strip()
    assert line.startswith(f"halfsafe: {folder / 'unet' / 'config.json'}: 1 block in the weights, ")
    assert "another variant of the model than its weights" in line
    assert "\n" not in line and "Traceback" not in line
    variant = raised.value.variant
    assert (variant.component, variant.kind, variant.in_file, variant.in_config) == (
        "unet",
        "blocks",
        1,
        2,
    )
    assert variant.setting == "layers_per_block" and variant.proved


def test_explain_says_the_variant_before_any_numeric_verdict(
    sd_folder_of_another_variant, tmp_path, home, capsys
):
    folder = sd_folder_of_another_variant
    image = png_text(
        tmp_path / "00012-1234.png",
        {"parameters": a1111_parameters("sd-tiny", "0123456789")},
        pixels("zero"),
    )

    assert main(["explain", str(image), "--model", str(folder), "--json"]) == 1

    document = json.loads(capsys.readouterr().out)
    assert document["check"] is None  # no numbers: the model was not built
    assert document["variant"] == {
        "component": "unet",
        "kind": "blocks",
        "where": document["variant"]["where"],
        "in_file": 1,
        "in_config": 2,
        "setting": "layers_per_block",
        "config": str(folder / "unet" / "config.json"),
        "proved": True,
    }
    assert document["variant"]["where"].startswith(("down_blocks.", "up_blocks."))
    message = document["message"]
    assert message.startswith(
        f"Its model at {folder} is another variant than the config it is built with: 1 block"
    ), message
    assert message.index("variant") < message.index("NaN-black")


def test_a_later_published_variant_is_what_a_loader_of_the_first_builds_wrong():
    variants = family(ANIMA).variants
    mine, variant = older_loader(variants, "transformer", {"num_layers": 40})

    assert mine.title == "Anima 2.9B"
    assert variant == WrongVariant("transformer", "blocks", "blocks", 40, 28, "num_layers",
                                   "Anima 2B", proved=False)  # fmt: skip
    assert older_loader(variants, "transformer", {"num_layers": 28}) is None
    assert older_loader(variants, "transformer", {"num_layers": 2}) is None  # none published
    assert older_loader((), "transformer", {"num_layers": 40}) is None


def test_the_record_crosses_the_engine_pipe_as_plain_data():
    from app.engine.events import unreadable

    variant = WrongVariant("transformer", "shape", "x.weight", (4, 8), (4, 6), None, "c.json")
    assert unreadable(variant) is None  # an explanation carrying it reaches the window


@pytest.mark.slow
def test_explain_of_noise_from_an_anima_2_9b_file_names_the_28_block_loader(tmp_path, home):
    """A 40-block Anima file (2.9B's depth, at a tiny width) behind a ComfyUI image of noise:
    HalfSafe reads its 40 blocks from the file and checks it; explain says first what a loader
    that knows only Anima 2B's 28 blocks does with it."""
    written = save_split_files(build_tiny_anima_pipeline(layers=40), tmp_path / "models")
    image = png_text(
        tmp_path / "ComfyUI_00001_.png",
        {"prompt": comfy_prompt(written["transformer"].name)},
        Image.fromarray(decoded_noise()),
    )

    explanation = explain.explain_image(image, device="cpu", model=str(written["transformer"]))

    assert explanation.variant is not None and not explanation.variant.proved
    assert explanation.to_json()["variant"]["in_file"] == 40
    assert explanation.to_json()["variant"]["in_config"] == 28
    assert explanation.check is not None  # HalfSafe builds all 40 and checks them
    assert explanation.message.startswith(
        "Its model is Anima 2.9B (40 blocks in the file), and a loader that knows only Anima "
        "2B builds 28 (40 blocks in the file, 28 in the config)"
    ), explanation.message
    assert "blocks.28 and on" in explanation.message


def test_the_variant_field_is_documented():
    docs = (Path(__file__).resolve().parents[2] / "docs" / "json.md").read_text(encoding="utf-8")
    for word in ("| `variant` |", "`in_file`", "`in_config`", "`proved`"):
        assert word in docs


@pytest.mark.slow  # about 20 s here: writing a 151,669-token embedding
def test_an_anima_folder_of_40_blocks_under_a_28_block_config_is_a_sentence(tmp_path, capsys):
    """Anima 2.9B's weights (40 blocks) beside Anima 2B's config (28): the model a loader builds
    from that config leaves 12 blocks out and draws noise; HalfSafe says so and builds nothing."""
    folder = tmp_path / "anima-2.9b"
    build_tiny_anima_pipeline(layers=40).save_pretrained(folder)
    config_path = folder / "transformer" / "config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "num_layers": 28}))

    with pytest.raises(WrongVariantError) as raised:
        load_model(str(folder))

    assert str(raised.value).startswith(
        f"{config_path}: 40 blocks in the weights, 28 in the config: its num_layers (28) builds "
        "28 blocks in transformer_blocks where the weights beside it hold 40, so the config is "
        "another variant of the model than its weights"
    ), str(raised.value)
    assert raised.value.variant.in_file == 40 and raised.value.variant.in_config == 28
    assert main(["check", str(folder), "--device", "cpu", "--size", "64"]) == 2
    assert "40 blocks in the weights, 28 in the config" in capsys.readouterr().err
