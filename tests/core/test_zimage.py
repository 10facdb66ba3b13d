"""Z-Image (a Qwen3 text encoder, a single-stream transformer that takes one latent and one
caption per image in lists, Flux's 16-channel VAE) on a tiny pipeline built in code: a diffusers
folder loaded offline, the shipped Qwen tokenizer, the health check with planted fp16 overflows
in the Qwen3 feed-forward, a joint block and the VAE, and generation with the NaN watch and a
repair. Split files as ComfyUI keeps them: test_zimage_split.py.
"""

from __future__ import annotations

import pytest

from app.core import generation, models
from app.core.families import ZImageFamily, family_of
from app.core.tokenizers import qwen2_tokenizer, qwen3_tokenizer
from tests.support.family_helpers import (
    FP16,
    check,
    in_memory,
    offline,  # noqa: F401 - an autouse fixture: no network
    plant_scaled,
    same_weights,
)
from tests.support.model_files import _ldm_vae
from tests.support.tiny_models import build_tiny_zimage_pipeline

COMPONENTS = ("text_encoder", "transformer", "vae")
BLOCK_LAYER = "layers.0.feed_forward.w2"
PLANTS = {
    "qwen3": ("text_encoder", "layers.0.mlp.down_proj", 1e6),
    "joint_block": ("transformer", BLOCK_LAYER, 1e6),
    "vae": ("vae", "decoder.up_blocks.0.resnets.0.conv1", 1e6),
}


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


def test_diffusers_folder_round_trip_offline(tmp_path):
    pipeline = build_tiny_zimage_pipeline()
    pipeline.save_pretrained(tmp_path / "z-image")

    model = models.load_model(str(tmp_path / "z-image"))

    assert (model.architecture, model.format, model.prediction_type) == (
        "zimage",
        "diffusers",
        "flow",
    )
    assert model.detected_because.startswith("Z-Image: its ZImagePipeline")
    assert "a Qwen3 text encoder" in model.detected_because
    assert isinstance(family_of(model.pipeline), ZImageFamily)
    same_weights(pipeline, model.pipeline, COMPONENTS)
    assert model.pipeline.tokenizer("a red cat").input_ids == [64, 2518, 8251]


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
    assert "the VAE makes 4-channel latents but the transformer works on 16" in str(caught.value)


def test_healthy_zimage_checks_its_three_components():
    report = check(loaded(build_tiny_zimage_pipeline(), "zimage-healthy"))

    assert report.verdict == "healthy"
    assert list(report.components) == list(COMPONENTS)
    assert len(report.timesteps) == 3 and report.timesteps[0] == 1000.0
    tested = report.to_json()["tested"]
    assert {c: tested[c] for c in COMPONENTS} == dict.fromkeys(COMPONENTS, "fp16")


@pytest.mark.parametrize("fault", list(PLANTS))
def test_planted_overflow_is_found_and_only_what_failed_is_fixed(fault):
    component, layer, _ = PLANTS[fault]
    report = check(loaded(plant(build_tiny_zimage_pipeline(), fault), f"zimage-{fault}"))

    assert report.verdict == "fixable"
    failed = {n for n, c in report.components.items() if c.status in ("overflow", "nan")}
    assert failed == {component}
    assert report.components[component].first_bad_module == layer
    fix = report.fix
    assert fix.verified is True
    tested, fixed = report.plan, fix.plan
    changed = {
        c
        for c in tested.dtypes
        if tested.dtypes[c] != fixed.dtypes[c] or tested.islands(c) != fixed.islands(c)
    }
    assert changed == {component}


@pytest.mark.parametrize("cfg", [1.0, 4.0])  # Turbo without CFG; base with it
def test_generation_repairs_an_overflowing_joint_block(tmp_path, cfg):
    pipeline = plant(build_tiny_zimage_pipeline(), "joint_block")
    request = generation.GenerationRequest(
        prompt="a red cat", steps=3, cfg=cfg, seed=3, width=64, height=64, output_dir=str(tmp_path)
    )

    result = generation.generate(loaded(pipeline, "zimage-generate"), request, precision=FP16)

    image = result.images[0]
    assert (image.status, image.component, image.step) == ("fixed", "transformer", 1)
    assert image.first_bad_module == BLOCK_LAYER
    assert f"Sampler: Euler, CFG scale: {cfg:g}" in image.parameters


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
