"""Qwen-Image as ComfyUI users keep it: the transformer in diffusion_models/ (diffusers' own
names), the Qwen2.5-VL text encoder as text_encoders/qwen_2.5_vl_7b.safetensors (model.*,
visual.*, lm_head) and the VAE in the Wan 2.1 layout as vae/qwen_image_vae.safetensors. Loaded
offline with identical weights and outputs, companions given by flag or found beside it, a
missing one named in one sentence.
"""

from __future__ import annotations

import pytest
import torch

from app.core import models
from app.core.checkpoint import write_safetensors
from app.core.encoders import vaes as encoders
from app.core.errors import UnsupportedModelError
from tests.support.family_helpers import offline  # noqa: F401 - an autouse fixture: no network
from tests.support.model_files import save_split_files
from tests.support.tiny_models import (
    QWENIMAGE_SCHEDULER_CONFIG,
    build_tiny_qwenimage_pipeline,
    tiny_qwenimage_vae,
)

COMPONENTS = ("text_encoder", "transformer", "vae")


def tiny():
    # Qwen2.5-VL's heads are 128 wide (the file does not record them): a one-head encoder.
    return build_tiny_qwenimage_pipeline(text_width=128)


def same_weights(mine, theirs) -> None:
    for component in COMPONENTS:
        a = getattr(mine, component).state_dict()
        b = getattr(theirs, component).state_dict()
        assert set(a) == set(b), component
        assert all(torch.equal(v, b[k]) for k, v in a.items()), component


@pytest.mark.parametrize("blocks", [1, 2])
def test_wan_layout_vae_maps_both_ways_with_identical_weights(blocks):
    from diffusers import AutoencoderKLQwenImage

    vae = AutoencoderKLQwenImage(
        base_dim=16, z_dim=16, dim_mult=[1, 2, 2, 2], num_res_blocks=blocks
    ).eval()
    state = vae.state_dict()

    original = encoders.wan_vae_to_original(state, blocks)

    # The layout diffusers' Wan converter reads (2 blocks: decoder stages 0-2, 3 upsamples).
    assert "decoder.middle.0.residual.0.gamma" in original and "conv2.weight" in original
    assert "encoder.head.2.weight" in original and "decoder.head.0.gamma" in original
    if blocks == 2:
        assert "decoder.upsamples.3.resample.1.weight" in original
        assert "decoder.upsamples.4.shortcut.weight" in original
        assert "decoder.upsamples.14.residual.6.weight" in original
    shapes = {k: tuple(v.shape) for k, v in original.items()}
    config = encoders.wan_vae_config(shapes)
    assert (config["num_res_blocks"], config["dim_mult"]) == (blocks, [1, 2, 2, 2])
    assert config["temperal_downsample"] == [False, True, True]
    expected = {k: tuple(v.shape) for k, v in state.items()}
    back = encoders.wan_vae_to_diffusers(original, expected, blocks)
    assert set(back) == set(state)
    assert all(torch.equal(v, state[k]) for k, v in back.items())


def test_its_files_keep_the_older_qwen25_vl_names_and_its_schedule(tmp_path):
    pipeline = tiny()
    written = save_split_files(pipeline, tmp_path / "models", "qwen_image")
    header = models.read_safetensors_header(written["text_encoder"]).shapes()
    assert "model.layers.0.self_attn.q_proj.weight" in header
    assert "visual.blocks.0.attn.qkv.weight" in header

    model = models.load_model(str(written["transformer"]))  # companions found beside it

    assert (model.format, model.architecture) == ("split_files", "qwenimage")
    assert model.detected_because.startswith("Qwen-Image: an MMDiT transformer file")
    assert "2 blocks, 64 wide, on 16-channel latents" in model.detected_because
    assert model.native_size == 1328
    scheduler = model.pipeline.scheduler.config
    assert all(scheduler[k] == v for k, v in QWENIMAGE_SCHEDULER_CONFIG.items())


def test_split_files_given_by_flag_load_from_anywhere(tmp_path):
    pipeline = tiny()
    written = save_split_files(pipeline, tmp_path / "models", "qwen_image")
    lone = tmp_path / "elsewhere" / "qwen_image.safetensors"
    lone.parent.mkdir()
    written["transformer"].rename(lone)

    model = models.load_model(
        str(lone), text_encoders=[str(written["text_encoder"])], vae=str(written["vae"])
    )

    same_weights(pipeline, model.pipeline)


def test_a_missing_vae_is_named_in_one_sentence(tmp_path):
    written = save_split_files(tiny(), tmp_path / "models", "qwen_image")
    written["vae"].unlink()
    # A VAE of another latent width beside it is not taken for it.
    write_safetensors(
        tmp_path / "models" / "vae" / "other.safetensors",
        encoders.wan_vae_to_original(
            {k: v.contiguous() for k, v in tiny_qwenimage_vae(0).state_dict().items()}, 1
        )
        | {"conv2.weight": torch.zeros(8, 8, 1, 1, 1)},
    )

    with pytest.raises(UnsupportedModelError) as caught:
        models.load_model(str(written["transformer"]))

    message = str(caught.value)
    assert "needs its VAE (qwen_image_vae)" in message
    assert "--vae PATH" in message and "--text-encoder" not in message
    assert message.count(". ") == 0 and message.endswith(".")


def test_library_lists_qwenimage_and_zimage_files_each_with_its_own_companions(tmp_path):
    from app.core.library import scan_library
    from tests.support.tiny_models import build_tiny_zimage_pipeline

    root = tmp_path / "models"
    qwen = save_split_files(tiny(), root, "qwen_image")
    zimage = save_split_files(build_tiny_zimage_pipeline(), root, "z_image_turbo")
    folder = str(root / "diffusion_models")

    entries = scan_library([folder], include_defaults=False, use_cache=False)

    by_name = {e.path.rsplit("/", 1)[-1]: e for e in entries}
    entry = by_name["qwen_image.safetensors"]
    assert (entry.architecture, entry.format, entry.supported) == (
        "qwenimage",
        "split_files",
        True,
    )
    assert entry.detected_because and entry.detected_because.startswith("Qwen-Image:")
    # Both VAEs make 16-channel latents: each transformer takes the one in its own layout.
    assert entry.companions == {
        "text_encoder": str(qwen["text_encoder"]),
        "vae": str(qwen["vae"]),
    }
    assert by_name["z_image_turbo.safetensors"].companions == {
        "text_encoder": str(zimage["text_encoder"]),
        "vae": str(zimage["vae"]),
    }

    qwen["vae"].unlink()
    by_name = {
        e.path.rsplit("/", 1)[-1]: e
        for e in scan_library([folder], include_defaults=False, use_cache=False)
    }

    entry = by_name["qwen_image.safetensors"]
    assert entry.supported is False and entry.companions == {
        "text_encoder": str(qwen["text_encoder"]),
        "vae": None,
    }
    assert entry.missing and "this Qwen-Image transformer file needs its VAE (qwen_image_vae)" in (
        entry.missing
    )
    assert by_name["z_image_turbo.safetensors"].supported is True


def test_a_malformed_file_beside_it_is_passed_over_and_the_missing_encoder_named(tmp_path):
    from app.core.library import scan_library

    written = save_split_files(tiny(), tmp_path / "models", "qwen_image")
    written["text_encoder"].unlink()
    # Named like Qwen2.5-VL's file and keyed like it, but its embedding is one-dimensional.
    write_safetensors(
        written["text_encoder"],
        {
            "model.embed_tokens.weight": torch.zeros(8),
            "visual.merger.mlp.2.weight": torch.zeros(2, 2),
        },
    )

    with pytest.raises(UnsupportedModelError) as caught:
        models.load_model(str(written["transformer"]))

    assert "needs its Qwen2.5-VL text encoder (qwen_2.5_vl_7b)" in str(caught.value)
    (entry,) = scan_library(
        [str(written["transformer"].parent)], include_defaults=False, use_cache=False
    )
    assert entry.supported is False and entry.companions == {
        "text_encoder": None,
        "vae": str(written["vae"]),
    }
