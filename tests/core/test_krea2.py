"""What only Krea 2 (a Qwen3-VL text encoder read at several layers, a single-stream transformer
that fuses them, Qwen-Image's 3D VAE; base and Turbo) does, on a tiny pipeline built in code: the
prompt read at the chosen layers, Krea's guidance convention (CFG scale minus one), the base and
Turbo schedules as Krea2Pipeline runs them, a size off its patch grid refused, a Turbo folder
told and kept. A diffusers folder, the health check with planted overflows in a block, the
Qwen3-VL encoder and the VAE, and generation repairing a block with and without CFG are every
family's contract: test_families.py.
"""

from __future__ import annotations

from typing import cast

import pytest
import torch
from torch.utils.hooks import RemovableHandle

from app.core import families, generation, models
from app.core.checkpoint import write_safetensors
from app.core.encoders import kinds
from app.core.encoders import qwen3_vl as encoders
from app.core.encoders.qwen3 import QWEN3
from app.core.encoders.qwen3_vl import QWEN3_VL
from app.core.encoders.qwen25_vl import QWEN25_VL, qwen25_vl_to_file
from app.core.errors import HalfSafeError, UnsupportedModelError
from app.core.families import FamilyId, family
from app.core.families.krea2 import LAYOUT, Krea2Family
from app.core.formats.layouts import to_original
from app.core.models import parts, split
from app.core.settings import PrecisionSettings
from tests.support.family_helpers import (
    FP16,
    in_memory,
    offline,  # noqa: F401 - an autouse fixture: no network
)
from tests.support.model_files import save_split_files
from tests.support.tiny_models import (
    KREA2_SCHEDULER_CONFIG,
    KREA2_TINY_TAPS,
    build_tiny_krea2_pipeline,
    tiny_qwen3_vl_4b,
)

KREA2 = cast(Krea2Family, family(FamilyId("krea2")))
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
            callback_on_step_end=record,  # pyright: ignore[reportArgumentType]
        )

    probed = KREA2.probe_timesteps(loaded(pipeline, "krea2-schedule"), 5, "euler", 64)
    assert probed == [ran[0], ran[2], ran[-1]]
    assert probed[0] == 1000.0
    # Turbo's fixed shift of 1.15 leaves more noise mid-way than the base model's shift for a
    # 4x4-patch image (0.47, from 0.5 at 256 patches).
    other = build_tiny_krea2_pipeline(distilled=not turbo)
    theirs = KREA2.probe_timesteps(loaded(other, "krea2-other"), 5, "euler", 64)
    assert (probed[1] > theirs[1]) is turbo


def _inputs(pipeline) -> tuple[list[torch.Tensor], RemovableHandle]:
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

    base = families.detect_from_configs(_index(False), transformer, {})
    turbo = families.detect_from_configs(_index(True), transformer, {})

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


def test_a_prompt_read_past_the_encoders_last_layer_is_refused_in_one_sentence(tmp_path):
    from diffusers import Krea2Pipeline

    # The tiny encoder has 4 layers.
    parts = build_tiny_krea2_pipeline().components
    pipeline = Krea2Pipeline(**parts, text_encoder_select_layers=(1, 2, 5))
    request = generation.GenerationRequest(
        prompt="a red cat", steps=2, cfg=4.0, seed=3, width=64, height=64, output_dir=str(tmp_path)
    )

    with pytest.raises(HalfSafeError) as raised:
        generation.generate(loaded(pipeline, "krea2-layers"), request, precision=FP16)

    assert str(raised.value) == (
        "krea2-layers: it reads the text encoder's layer 5, but its Qwen3-VL text encoder has "
        "4 layers."
    )


# --- split files, as ComfyUI users keep them ------------------------------------------------


def _shapes(state) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in state.items()}


def _original(transformer) -> dict[str, torch.Tensor]:
    config = {**transformer.config, "_class_name": type(transformer).__name__}
    return to_original(LAYOUT.table(config), transformer.state_dict())


def test_the_key_table_is_the_one_diffusers_reads_krea_files_with():
    from diffusers.loaders.single_file_utils import (
        convert_krea2_transformer_checkpoint_to_diffusers,
    )

    transformer = build_tiny_krea2_pipeline(released_taps=True).transformer
    original = _original(transformer)

    assert original["blocks.1.mod.lin"].shape == (6 * 64,)  # six vectors, flattened
    assert original["txtfusion.projector.weight"].shape == (1, 12)
    assert original["last.modulation.lin"].shape == (2, 64)
    # diffusers' own converter reads the file back into the same weights (the checkpoint's
    # model.diffusion_model. prefix included).
    saved = {"model.diffusion_model." + k: v.clone() for k, v in original.items()}
    theirs = convert_krea2_transformer_checkpoint_to_diffusers(saved)
    state = transformer.state_dict()
    assert set(theirs) == set(state)
    assert all(torch.equal(theirs[k], v) for k, v in state.items())


def test_a_krea2_file_is_told_apart_from_qwenimage_qwenimage21_and_zimage_files():
    from tests.support.tiny_models import (
        build_tiny_qwenimage21_pipeline,
        build_tiny_qwenimage_pipeline,
        build_tiny_zimage_pipeline,
    )

    files = {"krea2": _shapes(_original(build_tiny_krea2_pipeline(released_taps=True).transformer))}
    for name, pipeline in (
        ("qwenimage", build_tiny_qwenimage_pipeline()),
        ("qwenimage21", build_tiny_qwenimage21_pipeline()),
        ("zimage", build_tiny_zimage_pipeline()),
    ):
        layout = family(FamilyId(name)).layout
        assert layout is not None
        config = {**pipeline.transformer.config, "_class_name": type(pipeline.transformer).__name__}
        files[name] = _shapes(to_original(layout.table(config), pipeline.transformer.state_dict()))

    for name, shapes in files.items():
        found = split.read_model(shapes)
        assert found is not None and found.layout == name, name
    krea2 = split.read_model(files["krea2"])
    assert krea2 is not None
    assert krea2.because.startswith("Krea 2: a single-stream transformer in Krea's layout")
    assert "2 blocks, 64 wide, on 16-channel latents in 2x2 patches" in krea2.because
    assert "fusing 12 layers of 32-wide Qwen3-VL hidden states" in krea2.because


def test_the_encoders_of_the_qwen_families_are_told_apart():
    from tests.support.tiny_models import tiny_qwen3, tiny_qwen25_vl

    qwen3_vl = {"model." + k: tuple(v.shape) for k, v in tiny_qwen3_vl_4b(0).state_dict().items()}
    qwen3 = {"model." + k: tuple(v.shape) for k, v in tiny_qwen3(0).state_dict().items()}
    qwen25_vl = {
        qwen25_vl_to_file(k): tuple(v.shape)
        for k, v in tiny_qwen25_vl(0, hidden=32).state_dict().items()
    }

    assert [kinds.text_encoder_kind(s) for s in (qwen3_vl, qwen3, qwen25_vl)] == [
        QWEN3_VL,
        QWEN3,
        QWEN25_VL,
    ]
    # Each as wide as the Krea 2 transformer reads, only the Qwen3-VL is taken for it.
    assert [QWEN3_VL.width(s) for s in (qwen3_vl, qwen3, qwen25_vl)] == [32, None, None]
    config = encoders.qwen3_vl_config(qwen3_vl, "model.", encoders.READS["4b"])
    built = tiny_qwen3_vl_4b(0).config
    text, vision = built.to_dict()["text_config"], built.to_dict()["vision_config"]
    assert config["text_config"]["rope_parameters"] == text["rope_parameters"]
    assert config["text_config"]["head_dim"] == text["head_dim"] == 32
    assert config["vision_config"]["num_heads"] == vision["num_heads"]


def test_one_qwen3_vl_reader_serves_krea2_and_qwenimage21():
    """Krea 2 reads Qwen3-VL-4B as a Qwen3VLModel through its tokenizer, Qwen-Image 2.1
    Qwen3-VL-8B as a Qwen3VLForConditionalGeneration through its processor: one kind of file,
    one config reader, each family's need naming how it reads it."""
    from tests.support.tiny_models import build_tiny_qwenimage21_pipeline, tiny_qwen3_vl

    for name, pipeline in (
        ("krea2", build_tiny_krea2_pipeline(released_taps=True)),
        ("qwenimage21", build_tiny_qwenimage21_pipeline()),
    ):
        layout = family(FamilyId(name)).layout
        assert layout is not None
        config = {**pipeline.transformer.config, "_class_name": type(pipeline.transformer).__name__}
        found = split.read_model(
            _shapes(to_original(layout.table(config), pipeline.transformer.state_dict()))
        )
        assert found is not None and found.layout == name
        need = next(n for n in found.needs if n.kind is QWEN3_VL)
        assert need.reads == {"krea2": "4b", "qwenimage21": "8b"}[name]
        read = encoders.READS[need.reads]
        assert read.model_class == type(pipeline.text_encoder).__name__
    reads = {name: encoders.READS[name] for name in ("4b", "8b")}
    assert (reads["4b"].model_class, reads["4b"].processor) == ("Qwen3VLModel", False)
    assert (reads["8b"].model_class, reads["8b"].processor) == (
        "Qwen3VLForConditionalGeneration",
        True,
    )
    generation = tiny_qwen3_vl(0)  # Qwen-Image 2.1's, saved with model.* and its LM head
    shapes = {k: tuple(v.shape) for k, v in generation.state_dict().items()}
    assert kinds.text_encoder_kind(shapes) is QWEN3_VL
    assert encoders.qwen3_vl_prefix(shapes) == "model."
    # A wrong part's sentence says what it is and whose (not a Qwen3's).
    found = parts.text_encoder_of(shapes)
    assert found is not None
    assert found.described() == (
        "a 64-wide Qwen3-VL text encoder (FLUX.3's, Qwen-Image 2.1's or Krea 2's)"
    )
    assert kinds.class_kind("Qwen3VLModel") is QWEN3_VL
    assert kinds.class_kind("Qwen3VLForConditionalGeneration") is QWEN3_VL
    config = encoders.qwen3_vl_config(shapes, "model.", reads["8b"])
    built = generation.config.to_dict()
    assert config["vision_config"]["num_heads"] == built["vision_config"]["num_heads"] == 2
    assert config["text_config"]["rope_parameters"] == built["text_config"]["rope_parameters"]
    assert config["tie_word_embeddings"] is False
    # Its keys as each class names them: the LM head kept only by the generation model.
    assert encoders.qwen3_vl_to_transformers("lm_head.weight", "model.", reads["8b"]) == (
        "lm_head.weight"
    )
    assert encoders.qwen3_vl_to_transformers("lm_head.weight", "model.", reads["4b"]) is None
    key = "model.language_model.norm.weight"
    assert encoders.qwen3_vl_to_transformers(key, "model.", reads["8b"]) == key
    assert (
        encoders.qwen3_vl_to_transformers(key, "model.", reads["4b"])
        == "language_model.norm.weight"
    )


def test_a_file_fusing_other_than_twelve_layers_is_refused_in_one_sentence(tmp_path):
    file = tmp_path / "diffusion_models" / "krea2_small.safetensors"
    file.parent.mkdir()
    transformer = build_tiny_krea2_pipeline().transformer  # reads 3 layers
    write_safetensors(file, {k: v.contiguous() for k, v in _original(transformer).items()})

    with pytest.raises(UnsupportedModelError) as caught:
        models.load_model(str(file))

    assert str(caught.value) == (
        f"{file}: this Krea 2-style transformer is not one HalfSafe can build: its text fusion "
        "reads 3 text-encoder layers where Krea 2 reads 12, and no tensor says which."
    )


def tiny_split():
    # A split file runs with the layers the released model reads: a 36-layer encoder.
    return build_tiny_krea2_pipeline(released_taps=True)


@pytest.mark.slow  # about 15 s here: writing and reading a 151,669-token embedding
def test_its_files_hold_the_released_taps_and_the_wan_layout_vae(tmp_path):
    pipeline = tiny_split()
    written = save_split_files(pipeline, tmp_path / "models", "krea2_raw")
    header = models.read_safetensors_header(written["text_encoder"]).shapes()
    assert "model.language_model.layers.35.mlp.down_proj.weight" in header
    assert "model.visual.deepstack_merger_list.0.linear_fc2.weight" in header
    assert (
        "decoder.middle.0.residual.0.gamma"
        in models.read_safetensors_header(written["vae"]).shapes()
    )

    model = models.load_model(str(written["transformer"]))  # companions found beside it

    assert (model.format, model.architecture, model.prediction_type) == (
        "split_files",
        "krea2",
        "flow",
    )
    assert model.detected_because.startswith("Krea 2: a single-stream transformer")
    assert model.companions == {
        "text_encoder": str(written["text_encoder"]),
        "vae": str(written["vae"]),
    }
    scheduler = model.pipeline.scheduler.config
    assert all(scheduler[k] == v for k, v in KREA2_SCHEDULER_CONFIG.items())


@pytest.mark.slow  # about 10 s here: writing a 151,669-token embedding twice
def test_a_missing_qwen3_vl_is_named_in_one_sentence_and_another_qwen_is_not_taken(tmp_path):
    from tests.support.tiny_models import tiny_qwen3

    written = save_split_files(tiny_split(), tmp_path / "models", "krea2_raw")
    written["text_encoder"].unlink()
    # Z-Image's Qwen3, as wide as the transformer reads and named like Qwen, is not a Qwen3-VL.
    qwen3 = written["text_encoder"].with_name("qwen_3_4b.safetensors")
    write_safetensors(
        qwen3, {"model." + k: v.contiguous() for k, v in tiny_qwen3(0).state_dict().items()}
    )

    with pytest.raises(UnsupportedModelError) as caught:
        models.load_model(str(written["transformer"]))

    message = str(caught.value)
    assert "this Krea 2 transformer file needs its Qwen3-VL text encoder (qwen3_vl_4b)" in message
    assert "--text-encoder PATH" in message and "--vae PATH" not in message
    assert message.count(". ") == 0 and message.endswith(".")

    with pytest.raises(UnsupportedModelError) as caught:
        models.load_model(str(written["transformer"]), text_encoders=[str(qwen3)])

    # Refused as the wrong part: whose a Qwen3 is, and what Krea 2 needs instead.
    # Whose a Qwen3 is comes from the registry: every family that reads one.
    owners = parts.text_encoder_part(QWEN3, 32).described()
    assert "Flux.2 Klein's" in owners and "Z-Image's" in owners
    assert str(caught.value) == (
        f"{qwen3}: this is {owners}, but the Krea 2 transformer {written['transformer'].name} "
        "needs its Qwen3-VL text encoder (qwen3_vl_4b)."
    )
