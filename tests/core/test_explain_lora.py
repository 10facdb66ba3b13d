"""`halfsafe explain` on a black AUTOMATIC1111 image made with a LoRA: the prompt's
`<lora:name:weight>` is found in the install's models/Lora folder, the check runs with it, and
the damaged LoRA, not the model, is named as the cause."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from app.cli import main
from app.core.checkpoint import write_safetensors
from tests.support.image_files import png_text
from tests.support.lora_files import kohya_lora
from tests.support.model_files import save_single_file
from tests.support.tiny_models import build_tiny_sd_pipeline


@pytest.fixture
def install(home) -> tuple[Path, Path]:  # noqa: F811
    models = home / "stable-diffusion-webui" / "models"
    (models / "Stable-diffusion").mkdir(parents=True)
    (models / "Lora").mkdir()
    pipeline = build_tiny_sd_pipeline()
    model = save_single_file(pipeline, models / "Stable-diffusion" / "plain-v1.safetensors")
    damaged = kohya_lora(pipeline, scale=0.05)
    damaged[sorted(k for k in damaged if "lora_up" in k)[0]][0, 0] = float("nan")
    lora = write_safetensors(models / "Lora" / "melted.safetensors", damaged)
    return model, lora


@pytest.mark.slow
def test_a_black_image_made_with_a_nan_lora_blames_the_lora(tmp_path, install, capsys):
    model, lora = install
    model_hash = hashlib.sha256(model.read_bytes()).hexdigest()[:10]
    parameters = (
        "a lighthouse at night <lora:melted:0.8>\nNegative prompt: blurry\n"
        f"Steps: 12, Sampler: Euler a, CFG scale: 7, Seed: 1234, Size: 64x64, "
        f'Model hash: {model_hash}, Model: plain-v1, Lora hashes: "melted: 0123456789ab", '
        "Version: v1.10.1"
    )
    image = png_text(tmp_path / "00031-1234.png", {"parameters": parameters})

    assert main(["explain", str(image), "--json", "--device", "cpu"]) == 1
    document = json.loads(capsys.readouterr().out)
    check = document["check"]
    assert [entry["name"] for entry in check["loras"]] == ["melted"]
    assert check["loras"][0]["weight"] == 0.8 and check["loras"][0]["path"] == str(lora)
    assert check["cause"]["kind"] == "weights"
    assert check["cause"]["lora"]["name"] == "melted"
    assert check["cause"]["repair"]["action"] == "drop_lora"
    assert check["cause"]["repair"]["verified"] is True
    assert "melted" in check["headline"]
