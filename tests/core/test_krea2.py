"""What only Krea 2 (a Qwen3-VL text encoder read at several layers, a single-stream transformer
that fuses them, Qwen-Image's 3D VAE; base and Turbo) does, on a tiny pipeline built in code: the
prompt read at the chosen layers, Krea's guidance convention (CFG scale minus one), the base and
Turbo schedules as Krea2Pipeline runs them, a size off its patch grid refused, a Turbo folder
told and kept. A diffusers folder, the health check with planted overflows in a block, the
Qwen3-VL encoder and the VAE, and generation repairing a block with and without CFG are every
family's contract: test_families.py.
"""

from __future__ import annotations

import pytest
import torch

from app.core import architecture, generation, models
from app.core.errors import HalfSafeError
from app.core.families import FamilyId, family
from app.core.settings import PrecisionSettings
from tests.support.family_helpers import (
    FP16,
    in_memory,
    offline,  # noqa: F401 - an autouse fixture: no network
)
from tests.support.tiny_models import KREA2_TINY_TAPS, build_tiny_krea2_pipeline

KREA2 = family(FamilyId.KREA2)
FP32 = PrecisionSettings(precision="fp32")
PREFIX_TOKENS = 34  # Qwen-Image's system instruction, which Krea2Pipeline drops
SUFFIX_TOKENS = 5  # <|im_end|>\n<|im_start|>assistant\n, after the padding


def loaded(pipeline, key: str):
    return in_memory(pipeline, key, "krea2")


def test_the_prompt_is_read_at_the_chosen_layers_after_the_system_instruction():
    pipeline = build_tiny_krea2_pipeline()
    prompt_ids = pipeline.tokenizer("a red cat").input_ids

    with torch.inference_mode():
        tensors = KREA2.encode(pipeline, "a red cat", "", "cpu", True)
        text = pipeline.prompt_template_encode_prefix + "a red cat"
        ids = pipeline.tokenizer(text, return_tensors="pt").input_ids
        hidden = pipeline.text_encoder(input_ids=ids, output_hidden_states=True).hidden_states

    embeds, mask = tensors["prompt_embeds"], tensors["prompt_embeds_mask"]
    assert embeds.shape == (1, KREA2.max_sequence_length, len(KREA2_TINY_TAPS), 32)
    assert mask.dtype == torch.bool and mask.shape == (1, KREA2.max_sequence_length)
    # The prompt's tokens, then padding the transformer does not attend to, then the closing.
    assert int(mask.sum()) == len(prompt_ids) + SUFFIX_TOKENS
    assert mask[0, : len(prompt_ids)].all() and mask[0, -SUFFIX_TOKENS:].all()
    # Each slot of the stack is one tapped layer's state of the prompt's tokens (causal: the
    # padding after them does not change them).
    for slot, layer in enumerate(KREA2_TINY_TAPS):
        torch.testing.assert_close(
            embeds[0, : len(prompt_ids), slot],
            hidden[layer][0, PREFIX_TOKENS:],
            rtol=1e-5,
            atol=1e-5,
        )
    # The negative prompt is read the same way, for CFG.
    assert tensors["negative_prompt_embeds"].shape == embeds.shape
    assert int(tensors["negative_prompt_embeds_mask"].sum()) == SUFFIX_TOKENS


@pytest.mark.parametrize("turbo", [False, True], ids=["base", "turbo"])
def test_the_probed_timesteps_are_the_schedule_the_pipeline_runs(turbo):
    pipeline = build_tiny_krea2_pipeline(distilled=turbo)
    ran = []

    def record(_pipe, _index, timestep, tensors):
        ran.append(round(float(timestep), 2))
        return {}

    with torch.inference_mode():
        pipeline(
            "a red cat",
            height=64,
            width=64,
            num_inference_steps=5,
            guidance_scale=0.0,
            output_type="latent",
            callback_on_step_end=record,
        )

    probed = KREA2.probe_timesteps(loaded(pipeline, "krea2-schedule"), 5, "euler", 64)
    assert probed == [ran[0], ran[2], ran[-1]]
    assert probed[0] == 1000.0
    # Turbo's fixed shift of 1.15 leaves more noise mid-way than the base model's shift for a
    # 4x4-patch image (0.47, from 0.5 at 256 patches).
    other = build_tiny_krea2_pipeline(distilled=not turbo)
    theirs = KREA2.probe_timesteps(loaded(other, "krea2-other"), 5, "euler", 64)
    assert (probed[1] > theirs[1]) is turbo


def _inputs(pipeline) -> tuple[list[torch.Tensor], object]:
    """The latents each transformer call is given, as they are given (and the hook's handle)."""
    seen: list[torch.Tensor] = []

    def keep(_module, _args, kwargs):
        seen.append(kwargs["hidden_states"].detach().clone())

    return seen, pipeline.transformer.register_forward_pre_hook(keep, with_kwargs=True)


def test_cfg_scale_is_krea_guidance_plus_one_and_one_turns_the_negative_pass_off(tmp_path):
    pipeline = build_tiny_krea2_pipeline()

    def made(cfg: float) -> list[torch.Tensor]:
        request = generation.GenerationRequest(
            prompt="a red cat",
            negative_prompt="fog",
            steps=3,
            cfg=cfg,
            seed=11,
            width=64,
            height=64,
            output_dir=str(tmp_path),
        )
        seen, hook = _inputs(pipeline)
        try:
            result = generation.generate(
                loaded(pipeline, "krea2-cfg"), request, precision=FP32, device="cpu"
            )
        finally:
            hook.remove()
        assert [image.status for image in result.images] == ["ok"]
        return seen

    def reference(guidance: float) -> list[torch.Tensor]:
        latents, generators = KREA2.noise(pipeline, [11], 64, 64)
        seen, hook = _inputs(pipeline)
        try:
            with torch.inference_mode():
                pipeline(
                    "a red cat",
                    negative_prompt="fog",
                    height=64,
                    width=64,
                    num_inference_steps=3,
                    guidance_scale=guidance,
                    latents=latents,
                    generator=generators,
                    output_type="latent",
                )
        finally:
            hook.remove()
        return seen

    guided, plain = made(5.5), made(1.0)

    assert (len(guided), len(plain)) == (6, 3)  # two passes a step with CFG, one without
    # CFG 5.5 samples as Krea2Pipeline does at its own guidance 4.5, not at 5.5.
    for mine, theirs in zip(guided, reference(4.5), strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(guided[-1], reference(5.5)[-1], rtol=1e-5, atol=1e-6)
    for mine, theirs in zip(plain, reference(0.0), strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)


def test_a_size_off_the_patch_grid_is_one_sentence(tmp_path):
    request = generation.GenerationRequest(
        prompt="a red cat", steps=2, cfg=4.0, seed=3, width=64, height=72, output_dir=str(tmp_path)
    )

    with pytest.raises(HalfSafeError) as raised:
        generation.generate(
            loaded(build_tiny_krea2_pipeline(), "krea2-size"), request, precision=FP16
        )

    assert str(raised.value) == (
        "krea2-size: this model makes pictures whose sides are multiples of 16 px, not 64x72."
    )
    assert not list(tmp_path.iterdir())


def _index(turbo: bool) -> dict:
    return {
        "_class_name": "Krea2Pipeline",
        "transformer": ["diffusers", "Krea2Transformer2DModel"],
        "text_encoder": ["transformers", "Qwen3VLModel"],
        "vae": ["diffusers", "AutoencoderKLQwenImage"],
        "is_distilled": turbo,
        "patch_size": 2,
        "text_encoder_select_layers": [2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35],
    }


def test_a_turbo_folder_is_told_from_the_base_model():
    transformer = dict(build_tiny_krea2_pipeline().transformer.config)

    base = architecture.detect_from_configs(_index(False), transformer, {})
    turbo = architecture.detect_from_configs(_index(True), transformer, {})

    assert base.architecture == turbo.architecture == "krea2"
    assert base.because.startswith("Krea 2: its Krea2Pipeline") and "with CFG" in base.because
    assert turbo.because.startswith("Krea 2 Turbo: its Krea2Pipeline")
    assert "distilled to sample without CFG" in turbo.because
    assert "2 blocks, 64 wide, on 16-channel latents in 2x2 patches" in turbo.because
    assert "reading 3 layers of a Qwen3-VL text encoder (Qwen3VLModel)" in turbo.because


@pytest.mark.slow  # about 10 s here: saving and loading a 151,669-token embedding
def test_a_turbo_folder_loads_back_as_turbo_with_its_layers(tmp_path):
    build_tiny_krea2_pipeline(distilled=True).save_pretrained(tmp_path / "krea2-turbo")

    model = models.load_model(str(tmp_path / "krea2-turbo"))

    assert model.detected_because.startswith("Krea 2 Turbo:")
    assert model.pipeline.config.is_distilled is True
    assert tuple(model.pipeline.text_encoder_select_layers) == KREA2_TINY_TAPS
    schedule = KREA2.probe_timesteps(model, 5, "euler", 64)
    assert schedule == KREA2.probe_timesteps(
        loaded(build_tiny_krea2_pipeline(distilled=True), "krea2-turbo"), 5, "euler", 64
    )
