"""The key of a single file, as a host that loaded it with its own code (ComfyUI) computes it:
the same key the desktop's loader gives the file, from the same detection, tensors and cache,
so a fix proved in either place is found in the other."""

from __future__ import annotations

import pytest
import torch

from app.core import checkpoint
from app.core.checkpoint import Checkpoint, write_safetensors
from app.core.errors import UnsupportedModelError
from app.core.models import load_model
from app.core.models.single_file import file_profile_key
from tests.support.model_files import save_single_file
from tests.support.tiny_models import build_tiny_sd_pipeline


@pytest.fixture
def hashed(monkeypatch) -> list[str]:
    """The tensors hashed into a content digest, by name."""
    names: list[str] = []
    real = checkpoint.TensorDigest.add

    def counting(self, name, tensor):
        names.append(name)
        real(self, name, tensor)

    monkeypatch.setattr(checkpoint.TensorDigest, "add", counting)
    return names


@pytest.fixture
def single_file(tmp_path):
    return save_single_file(build_tiny_sd_pipeline(), tmp_path / "tiny.safetensors", dtype="fp16")


def test_a_files_key_is_the_one_its_load_gives_and_shares_the_cached_digest(single_file, hashed):
    key = file_profile_key(single_file)
    digested = sorted(hashed)
    assert digested and not any(n.startswith("model_ema.") for n in digested)
    hashed.clear()
    model = load_model(str(single_file))
    assert model.profile_key == key
    assert hashed == []  # the load found the digest the first call cached
    assert file_profile_key(single_file) == key and hashed == []


def test_the_load_first_gives_the_same_key_over_the_same_tensors(single_file, hashed):
    model = load_model(str(single_file))
    loaded = sorted(hashed)
    assert file_profile_key(single_file) == model.profile_key
    assert sorted(hashed) == loaded  # nothing hashed twice: the cache serves the second


def test_other_weights_in_the_same_layout_get_another_key(tmp_path):
    pipeline = build_tiny_sd_pipeline()
    first = save_single_file(pipeline, tmp_path / "first.safetensors", dtype="fp16")
    with torch.no_grad():
        pipeline.unet.conv_in.weight.mul_(2)
    second = save_single_file(pipeline, tmp_path / "second.safetensors", dtype="fp16")
    assert file_profile_key(first) != file_profile_key(second)


def test_a_file_the_loader_does_not_load_alone_has_no_key(tmp_path):
    pipeline = build_tiny_sd_pipeline()
    whole = save_single_file(pipeline, tmp_path / "whole.safetensors")
    with Checkpoint(whole) as read:
        names = read.keys()
        unet = {k: read.get(k) for k in names if k.startswith("model.diffusion_model.")}
    alone = write_safetensors(tmp_path / "unet.safetensors", unet)
    with pytest.raises(UnsupportedModelError, match="no text encoder|no VAE"):
        file_profile_key(alone)
