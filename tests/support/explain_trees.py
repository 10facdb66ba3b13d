"""A single-file SD1.x checkpoint whose VAE overflows fp16, in a fake AUTOMATIC1111 tree and a
fake ComfyUI tree under a fake home folder, and black images whose records name it, for
`halfsafe explain`."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from tests.support.image_files import a1111_parameters, comfy_prompt, comfy_workflow, png_text
from tests.support.model_files import save_single_file
from tests.support.planted_sd import plant
from tests.support.tiny_models import build_tiny_sd_pipeline


@pytest.fixture(scope="module")
def overflowing_file(tmp_path_factory) -> Path:
    """A single-file SD1.x checkpoint whose VAE overflows in fp16 (built once per module)."""
    path = tmp_path_factory.mktemp("model") / "dreamy-v2.safetensors"
    return save_single_file(plant(build_tiny_sd_pipeline(), "vae"), path)


@pytest.fixture
def a1111_tree(home, overflowing_file) -> Path:
    folder = home / "stable-diffusion-webui" / "models" / "Stable-diffusion" / "realistic"
    folder.mkdir(parents=True)
    (home / "stable-diffusion-webui" / "models" / "VAE").mkdir()
    return Path(shutil.copy(overflowing_file, folder / overflowing_file.name))


@pytest.fixture
def comfy_tree(home, overflowing_file) -> Path:
    folder = home / "ComfyUI" / "models" / "checkpoints" / "SD1.5"
    folder.mkdir(parents=True)
    return Path(shutil.copy(overflowing_file, folder / overflowing_file.name))


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def a1111_black_png(tmp_path: Path, model: Path, **extra) -> Path:
    text = a1111_parameters(model.stem, sha256(model)[:10], **extra)
    return png_text(tmp_path / "00012-1234.png", {"parameters": text})


def comfy_black_png(tmp_path: Path, ckpt_name: str) -> Path:
    return png_text(
        tmp_path / "ComfyUI_00001_.png",
        {"prompt": comfy_prompt(ckpt_name), "workflow": comfy_workflow(ckpt_name)},
    )
