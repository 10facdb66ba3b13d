"""Images made elsewhere with a second pass, a Clip skip and a named sampler, end to end on a
tiny model kept where those tools keep theirs: `halfsafe explain` checks at the size the failing
pass ran, with the image's Clip skip and sampler, and finds the planted VAE overflow there; an
image with "Clip skip: 2" and "DPM++ 2M SDE Karras" is made again with those settings."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from app.cli import main
from app.core import generation
from app.core.models import load_model
from app.core.settings import PrecisionSettings
from app.core.words import infotext
from app.ui.image_entry import GalleryEntry
from tests.support.image_files import a1111_parameters, comfy_prompt, png_text
from tests.support.model_files import save_single_file
from tests.support.planted_sd import plant
from tests.support.tiny_models import build_tiny_sd_pipeline

BLACK = Image.fromarray(np.zeros((128, 128, 3), np.uint8))


def _explained(image, capsys) -> dict:
    assert main(["explain", str(image), "--json", "--device", "cpu"]) == 1
    return json.loads(capsys.readouterr().out)


@pytest.mark.slow
def test_an_a1111_hires_image_is_checked_at_its_second_pass(home, tmp_path, capsys):
    folder = home / "stable-diffusion-webui" / "models" / "Stable-diffusion"
    folder.mkdir(parents=True)
    save_single_file(plant(build_tiny_sd_pipeline(), "vae"), folder / "anime.safetensors")
    text = a1111_parameters(
        "anime",
        "0123456789",
        **{
            "Sampler": "DPM++ 2M SDE",
            "Schedule type": "Karras",
            "Clip skip": 2,
            "Hires upscale": 2,
            "Hires upscaler": "Latent",
            "Denoising strength": 0.5,
            "Size": "64x64",
        },
    )
    document = _explained(
        png_text(tmp_path / "00001-1234.png", {"parameters": text}, BLACK), capsys
    )
    assert document["record"]["hires_size"] == [128, 128]
    assert document["record"]["clip_skip"] == 2
    check = document["check"]
    assert check["size"] == 128  # the second pass's, where its VAE decoded
    assert check["verdict"] == "fixable" and check["cause"]["kind"] == "precision"
    assert check["components"]["vae"]["status"] in ("overflow", "nan")
    assert any("128x128" in note for note in document["notes"])


@pytest.mark.slow
def test_a_comfyui_two_pass_workflow_is_checked_at_its_second_pass(home, tmp_path, capsys):
    folder = home / "ComfyUI" / "models" / "checkpoints"
    folder.mkdir(parents=True)
    save_single_file(plant(build_tiny_sd_pipeline(), "vae"), folder / "dreamy.safetensors")
    graph = json.loads(comfy_prompt("dreamy.safetensors"))
    graph["8"] = {
        "class_type": "LatentUpscaleBy",
        "inputs": {"upscale_method": "nearest-exact", "scale_by": 2.0},
    }
    graph["9"] = {"class_type": "CLIPSetLastLayer", "inputs": {"stop_at_clip_layer": -2}}
    image = png_text(tmp_path / "ComfyUI_00001_.png", {"prompt": json.dumps(graph)}, BLACK)
    document = _explained(image, capsys)
    assert document["record"]["clip_skip"] == 2
    width, height = document["record"]["hires_size"]
    assert document["check"]["size"] == max(width, height) > document["record"]["size"][0]
    assert document["check"]["verdict"] == "fixable"


def test_an_image_with_clip_skip_and_dpmpp_2m_sde_karras_is_made_again_with_them(tmp_path):
    text = infotext.write(
        "a castle",
        "blurry",
        infotext.keyed(
            [
                ("Steps", 3),
                ("Sampler", "DPM++ 2M SDE Karras"),  # A1111 before 1.9: the schedule in the name
                ("CFG scale", 7),
                ("Seed", 77),
                ("Size", (64, 64)),
                ("Clip skip", 2),
            ]
        ),
    )
    values = GalleryEntry.from_parameters(text).generate_values()
    assert (values["scheduler"], values["clip_skip"]) == ("dpmpp_2m_sde_karras", 2)
    request = generation.GenerationRequest(
        **{k: values[k] for k in ("prompt", "negative_prompt", "steps", "cfg", "seed")},
        width=64,
        height=64,
        scheduler=values["scheduler"],
        clip_skip=values["clip_skip"],
        output_dir=str(tmp_path),
    )
    (image,) = generation.generate(
        load_model("demo"), request, precision=PrecisionSettings(), device="cpu"
    ).images
    from app.core.images.finished import read_parameters

    _, _, written = infotext.split_text(read_parameters(image.path))
    assert (written["Sampler"], written["Schedule type"]) == ("DPM++ 2M SDE", "Karras")
    assert written["Clip skip"] == "2" and written["Seed"] == "77"


@pytest.mark.slow
def test_a_comfyui_pixel_upscale_is_checked_with_the_vae_encoder_at_its_second_pass(
    home, tmp_path, capsys
):
    """VAEDecode -> ImageScaleBy(lanczos) -> VAEEncode -> KSampler on a model whose VAE
    encoder overflows in fp16: the check at the second pass's size runs the encoder there and
    finds it (a check of the latent path would not run it)."""
    from tests.support.planted_sd import plant_encoder

    folder = home / "ComfyUI" / "models" / "checkpoints"
    folder.mkdir(parents=True)
    pipeline = build_tiny_sd_pipeline()
    layer = plant_encoder(pipeline)
    save_single_file(pipeline, folder / "dreamy.safetensors")
    graph = json.loads(comfy_prompt("dreamy.safetensors"))
    graph["8"] = {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}}
    graph["9"] = {
        "class_type": "ImageScaleBy",
        "inputs": {"upscale_method": "lanczos", "scale_by": 2.0, "image": ["8", 0]},
    }
    graph["10"] = {"class_type": "VAEEncode", "inputs": {"pixels": ["9", 0], "vae": ["4", 2]}}
    graph["11"] = {
        "class_type": "KSampler",
        "inputs": {**graph["3"]["inputs"], "denoise": 0.5, "latent_image": ["10", 0]},
    }
    image = png_text(tmp_path / "ComfyUI_00001_.png", {"prompt": json.dumps(graph)}, BLACK)
    document = _explained(image, capsys)
    assert document["record"]["hires_upscaler"] == "lanczos (pixels)"
    check = document["check"]
    assert check["size"] == 128 and check["verdict"] == "fixable"
    encoder = check["components"]["vae_encoder"]
    assert encoder["status"] in ("overflow", "nan") and encoder["first_bad_module"] == layer
