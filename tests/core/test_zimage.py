"""What only Z-Image (a Qwen3 text encoder, a single-stream transformer that takes one latent
and one caption per image in lists, Flux's 16-channel VAE) does, on a tiny pipeline built in
code: the shipped Qwen tokenizer and its chat prompt, a VAE of other latents refused, all-NaN
conditioning from the Qwen3 encoder repaired, and the UNet flag governing its transformer. A
diffusers folder, the health check with planted overflows in the Qwen3 feed-forward, a joint
block and the VAE, and generation repairing a joint block with and without CFG are every
family's contract: test_families.py. Split files as ComfyUI keeps them: test_zimage_split.py.
"""

from __future__ import annotations

import pytest

from app.core import generation, models
from app.core.encoders.tokenizers import qwen2_tokenizer, qwen3_tokenizer
from tests.support.family_helpers import (
    FP16,
    in_memory,
    offline,  # noqa: F401 - an autouse fixture: no network
    plant_scaled,
)
from tests.support.model_files import _ldm_vae
from tests.support.tiny_models import build_tiny_zimage_pipeline

PLANTS = {"qwen3": ("text_encoder", "layers.0.mlp.down_proj", 1e6)}


def plant(pipeline, fault: str):
    return plant_scaled(pipeline, PLANTS, fault)


def loaded(pipeline, key: str):
    return in_memory(pipeline, key, "zimage")


def test_shipped_qwen_vocabulary_gives_the_checked_ids():
    for tokenizer in (qwen2_tokenizer(), qwen3_tokenizer()):
        assert tokenizer("a red cat on a blue mat").input_ids == [
            64,
            2518,
            8251,
            389,
            264,
            6303,
            5517,
        ]


def test_zimage_prompt_is_the_qwen3_chat_turn():
    tokenizer = qwen3_tokenizer()
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "a red cat"}],
        tokenize=False,
        add_generation_prompt=True,
        enable_thinking=True,
    )
    assert text == "<|im_start|>user\na red cat<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer(text).input_ids
    assert ids[0] == 151644 and ids.count(151645) == 1  # <|im_start|>, one <|im_end|>


def test_a_folder_given_a_vae_of_other_latents_is_refused_in_one_sentence(tmp_path):
    from app.core.checkpoint import write_safetensors
    from app.core.errors import UnsupportedModelError
    from tests.support.tiny_models import tiny_vae

    build_tiny_zimage_pipeline().save_pretrained(tmp_path / "z-image")
    vae = tiny_vae(0)  # SD's 4-channel latents, in the original layout
    sd_vae = tmp_path / "sd_vae.safetensors"
    levels = len(vae.config.block_out_channels)
    write_safetensors(
        sd_vae, {k: v.contiguous() for k, v in _ldm_vae(vae.state_dict(), levels).items()}
    )

    with pytest.raises(UnsupportedModelError) as caught:
        models.load_model(str(tmp_path / "z-image"), vae=str(sd_vae))

    assert str(sd_vae) in str(caught.value)
    message = str(caught.value)  # the wrong part: both files, both families
    assert "this is a 4-channel VAE" in message and "the Z-Image Turbo model z-image" in message
    assert "needs a 16-channel VAE" in message and "\n" not in message


def test_generation_repairs_all_nan_conditioning_from_the_qwen3_encoder(tmp_path):
    pipeline = plant(build_tiny_zimage_pipeline(), "qwen3")
    request = generation.GenerationRequest(
        prompt="a red cat", steps=2, cfg=1.0, seed=3, width=64, height=64, output_dir=str(tmp_path)
    )

    result = generation.generate(loaded(pipeline, "zimage-encoder"), request, precision=FP16)

    image = result.images[0]
    assert (image.status, image.component) == ("fixed", "text_encoder")
    assert image.first_bad_module == PLANTS["qwen3"][1]
    assert "NaN component: text_encoder" in image.parameters
    assert "Fixes applied: run the text encoder in " in image.parameters


def test_the_unet_flag_governs_the_transformer_and_the_settings_say_so(tmp_path):
    from app.core.settings import PrecisionSettings

    request = generation.GenerationRequest(
        prompt="a red cat", steps=2, cfg=1.0, seed=3, width=64, height=64, output_dir=str(tmp_path)
    )
    precision = PrecisionSettings(precision="fp16", unet_precision="bf16")

    result = generation.generate(
        loaded(build_tiny_zimage_pipeline(), "zimage-flags"), request, precision=precision
    )

    image = result.images[0]
    assert image.status == "ok"
    assert (image.settings["unet_precision"], image.settings["vae_precision"]) == ("bf16", "fp16")
    assert "UNet precision: bf16, VAE precision: fp16" in image.parameters
