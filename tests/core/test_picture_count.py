"""More input pictures than a model's family takes are refused before the model loads, from its
headers and configs: a 20-40 GB model is never loaded to be told so."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from app.cli import main
from app.core import models
from app.core.checkpoint import write_safetensors
from app.core.families import FamilyId, family
from app.core.families.flux3 import LAYOUT
from app.core.formats.layouts import to_original
from app.core.models.references import family_before_loading, most_pictures
from tests.support.cli_output import without_progress
from tests.support.family_helpers import offline  # noqa: F401 - an autouse fixture: no network
from tests.support.tiny_models import build_tiny_flux2_pipeline, tiny_flux3_transformer


class Loaded(Exception):
    """The command went on to load the model."""


@pytest.fixture
def no_load(monkeypatch):
    def load(*args, **kwargs):
        raise Loaded()

    monkeypatch.setattr(models, "load_model", load)


@pytest.fixture
def pictures(tmp_path):
    rng = np.random.RandomState(0)
    paths = []
    for index in range(11):
        path = tmp_path / f"picture{index}.png"
        Image.fromarray((rng.rand(32, 32, 3) * 255).astype(np.uint8)).save(path)
        paths.append(str(path))
    return paths


def _flux3_file(path):
    transformer = tiny_flux3_transformer(1, distilled=True)
    config = {**transformer.config, "_class_name": type(transformer).__name__}
    write_safetensors(path, to_original(LAYOUT.table(config), transformer.state_dict()))
    return str(path)


def _command(command: str, source: str, pictures: list[str]) -> list[str]:
    argv = [command, source, "--device", "cpu"]
    for picture in pictures:
        argv += ["--image", picture]
    return argv


@pytest.mark.parametrize("command", ["generate", "check"])
def test_eleven_pictures_for_a_family_of_ten_are_refused_before_loading(
    tmp_path, pictures, no_load, capsys, command
):
    source = _flux3_file(tmp_path / "flux-3-klein.safetensors")
    assert most_pictures(family_before_loading(source)) == 10

    assert main(_command(command, source, pictures)) == 2
    err = without_progress(capsys.readouterr().err)
    assert err.splitlines() == [
        "halfsafe: 11 pictures were given; flux-3-klein.safetensors is a FLUX.3 Klein model, "
        "which takes at most 10."
    ]
    with pytest.raises(Loaded):  # ten are for the loaded model to take
        main(_command(command, source, pictures[:10]))


def test_a_folder_is_told_from_its_configs(tmp_path, pictures, no_load, capsys):
    folder = tmp_path / "flux2-dev"
    build_tiny_flux2_pipeline().save_pretrained(folder)
    capsys.readouterr()
    assert main(_command("generate", str(folder), pictures[:7])) == 2
    err = without_progress(capsys.readouterr().err)
    assert (
        err.count("\n") == 1
        and "7 pictures were given; flux2-dev is a Flux.2 model, which takes at most 6." in err
    )


def test_a_family_that_edits_nothing_takes_one_picture(tmp_path, pictures, no_load, capsys):
    from tests.support.model_files import save_single_file
    from tests.support.tiny_models import build_tiny_sd_pipeline

    source = tmp_path / "sd1.safetensors"
    save_single_file(build_tiny_sd_pipeline(), source)
    capsys.readouterr()
    assert main(_command("generate", str(source), pictures[:2])) == 2
    err = without_progress(capsys.readouterr().err)
    assert (
        err.count("\n") == 1
        and "sd1.safetensors is a Stable Diffusion" in err
        and "takes one picture" in err
    )


def test_a_modular_folder_is_told_from_its_index(tmp_path):
    """FLUX.3 as diffusers writes it: modular_model_index.json, no model_index.json."""
    folder = tmp_path / "flux3"
    for part in ("transformer", "vae", "text_encoder"):
        (folder / part).mkdir(parents=True)
    transformer = tiny_flux3_transformer(1, distilled=False)
    config = {**transformer.config, "_class_name": type(transformer).__name__}
    (folder / "transformer" / "config.json").write_text(json.dumps(config))
    index = {
        "_class_name": "Flux3ModularPipeline",
        "transformer": ["diffusers", "Flux3Transformer2DModel", {"subfolder": "transformer"}],
        "vae": ["diffusers", "AutoencoderKLFlux2", {"subfolder": "vae"}],
        "text_encoder": [
            "transformers",
            "Qwen3VLForConditionalGeneration",
            {"subfolder": "text_encoder"},
        ],
    }
    (folder / "modular_model_index.json").write_text(json.dumps(index))
    found = family_before_loading(str(folder))
    assert found is not None and found.id == family(FamilyId("flux3")).id
    assert most_pictures(found) == 10
