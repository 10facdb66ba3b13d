"""What only Qwen-Image 2.1 does, on a tiny pipeline built in code: it is told apart from
Qwen-Image 1 (pipeline, folder and transformer file), a size off its 32-px grid is refused in
one sentence, and its split files as ComfyUI users keep them (the transformer with its fused
gate_up in diffusion_models/, Qwen3-VL in text_encoders/ and its VAE in vae/, both in their
libraries' own names) load offline with identical weights and outputs, a missing or wrong
companion named in one sentence. A diffusers folder, the health check with planted overflows
and generation repairing them are every family's contract: test_families.py.
"""

from __future__ import annotations

import pytest

from app.core import families, generation, models
from app.core.errors import HalfSafeError, UnsupportedModelError
from app.core.families import family_of
from app.core.families.qwenimage import QwenImageFamily
from app.core.families.qwenimage21 import QwenImage21Family
from app.core.formats.layouts import to_original
from app.core.models import split
from tests.support.family_helpers import (
    FP16,
    in_memory,
    offline,  # noqa: F401 - an autouse fixture: no network
)
from tests.support.model_files import save_split_files
from tests.support.tiny_models import (
    QWENIMAGE21_SCHEDULER_CONFIG,
    build_tiny_qwenimage21_pipeline,
    build_tiny_qwenimage_pipeline,
)

COMPONENTS = ("text_encoder", "transformer", "vae")


@pytest.fixture(scope="module")
def pipelines():
    return build_tiny_qwenimage21_pipeline(), build_tiny_qwenimage_pipeline()


def _file_shapes(pipeline) -> dict[str, tuple[int, ...]]:
    """The transformer as a file in its family's own layout, by shapes."""
    transformer = pipeline.transformer
    layout = family_of(pipeline).layout
    assert layout is not None
    config = {**transformer.config, "_class_name": type(transformer).__name__}
    return {
        k: tuple(v.shape)
        for k, v in to_original(layout.table(config), transformer.state_dict()).items()
    }


def test_qwenimage21_is_told_apart_from_qwenimage_1(pipelines):
    new, old = pipelines

    assert type(family_of(new)) is QwenImage21Family
    assert type(family_of(old)) is QwenImageFamily
    for pipeline, name in ((new, "qwenimage21"), (old, "qwenimage")):
        index = {"_class_name": type(pipeline).__name__, "transformer": ["diffusers", "x"]}
        detection = families.detect_from_configs(index, dict(pipeline.transformer.config), {})
        assert detection.architecture == name
        read = split.read_model(_file_shapes(pipeline))
        assert read is not None and read.architecture == name
    # 2.1's file fuses each block's gate and up projections; Qwen-Image 1's has per-block
    # modulation and a txt_norm instead.
    shapes = _file_shapes(new)
    assert "transformer_blocks.0.img_mlp.gate_up.weight" in shapes
    assert "transformer_blocks.0.img_mlp.gate_layer.weight" not in shapes
    assert not any(k.startswith("txt_norm") or ".img_mod." in k for k in shapes)


def test_a_size_off_its_32_px_grid_is_one_sentence(tmp_path, pipelines):
    request = generation.GenerationRequest(
        prompt="a red cat", steps=2, cfg=1.0, seed=3, width=80, height=64, output_dir=str(tmp_path)
    )

    with pytest.raises(HalfSafeError) as raised:
        generation.generate(
            in_memory(pipelines[0], "qwenimage21-size", "qwenimage21"), request, precision=FP16
        )

    assert str(raised.value) == (
        "qwenimage21-size: this model makes pictures whose sides are multiples of 32 px, not 80x64."
    )
    assert not list(tmp_path.iterdir())


def test_the_probe_follows_the_models_own_sample_sigmas():
    """A folder that sets `sample_sigmas` (a few-step checkpoint) is sampled on that grid,
    whatever the step count: the check probes the first, middle and last of it."""
    pipeline = build_tiny_qwenimage21_pipeline()
    qwen = QwenImage21Family()
    model = in_memory(pipeline, "qwenimage21-sigmas", "qwenimage21")
    default = qwen.probe_timesteps(model, 20, "euler", 64)
    pipeline.register_to_config(sample_sigmas=[1.0, 0.75, 0.5, 0.25])

    own = qwen.probe_timesteps(model, 20, "euler", 64)

    assert own != default and len(own) == 3 and own[0] == 1000.0
    shifted = qwen._sigmas(pipeline, 20, 64)
    assert len(shifted) == 4  # the grid's four steps, not the twenty asked for


@pytest.mark.slow  # about 15 s here: writing and reading a 151,669-token embedding twice
def test_its_files_keep_transformers_names_and_its_schedule(tmp_path):
    pipeline = build_tiny_qwenimage21_pipeline()
    written = save_split_files(pipeline, tmp_path / "models", "qwen_image_2.1")
    header = models.read_safetensors_header(written["text_encoder"]).shapes()
    assert "model.language_model.layers.0.self_attn.q_norm.weight" in header
    assert "model.visual.blocks.0.attn.qkv.weight" in header

    model = models.load_model(str(written["transformer"]))  # companions found beside it

    assert (model.format, model.architecture) == ("split_files", "qwenimage21")
    assert model.detected_because.startswith("Qwen-Image 2.1: a single-stream block-causal")
    assert "2 blocks, 64 wide, on 64-channel latent cells" in model.detected_because
    assert model.native_size == 1024
    scheduler = model.pipeline.scheduler.config
    assert all(scheduler[k] == v for k, v in QWENIMAGE21_SCHEDULER_CONFIG.items())


@pytest.mark.slow  # about 15 s here, as above
def test_a_missing_vae_and_a_wrong_text_encoder_are_each_one_sentence(tmp_path):
    written = save_split_files(
        build_tiny_qwenimage21_pipeline(), tmp_path / "models", "qwen_image_2.1"
    )
    qwen25 = save_split_files(
        build_tiny_qwenimage_pipeline(text_width=128), tmp_path / "other", "qwen_image"
    )
    written["vae"].unlink()

    with pytest.raises(UnsupportedModelError) as caught:
        models.load_model(str(written["transformer"]))

    message = str(caught.value)
    assert "this Qwen-Image 2.1 transformer file needs its VAE (qwen_image_2.1_vae)" in message
    assert "--vae PATH" in message and "--text-encoder" not in message
    assert message.count(". ") == 0 and message.endswith(".")

    # Qwen-Image 1's Qwen2.5-VL is not the Qwen3-VL that 2.1 reads.
    with pytest.raises(UnsupportedModelError) as caught:
        models.load_model(str(written["transformer"]), text_encoders=[str(qwen25["text_encoder"])])

    message = str(caught.value)
    assert str(qwen25["text_encoder"]) in message
    assert "Qwen2.5-VL text encoder" in message and "but the Qwen-Image 2.1 transformer" in message
    assert "its Qwen3-VL text encoder (qwen_3_vl_8b)" in message
    assert message.count(". ") == 0 and message.endswith(".")


# --- Qwen-Image 2.1 Turbo: the same weights, told by a file's name ------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("qwen_image_2.1_turbo_int8_convrot.safetensors", "qwenimage21-turbo"),
        ("Qwen-Image-2.1-Turbo-bf16.safetensors", "qwenimage21-turbo"),
        ("qwen_image_2.1_bf16.safetensors", "qwenimage21"),
        ("turbocharged_qwen.safetensors", "qwenimage21"),  # a word, not a part of one
    ],
)
def test_a_turbo_file_is_told_by_its_name_and_says_so(pipelines, name, expected):
    model = split.read_model(_file_shapes(pipelines[0]), name)

    assert model is not None and model.architecture == expected
    if expected == "qwenimage21-turbo":
        assert model.because.startswith(
            "Qwen-Image 2.1 Turbo, as the file's name says (its weights have the base model's "
            "names and shapes; 8 steps at CFG scale 1, Qwen-Image 2.1 Turbo's defaults): a "
            "single-stream block-causal transformer file"
        ), model.because
    else:
        assert model.because.startswith("Qwen-Image 2.1: ")


def test_turbo_reads_back_to_the_family_with_its_8_steps_without_cfg():
    from app.core.families import (
        architecture_title,
        family,
        family_of_architecture,
        generation_defaults,
    )
    from app.core.families.base import FamilyId

    assert family_of_architecture("qwenimage21-turbo") is family(FamilyId("qwenimage21"))
    assert architecture_title("qwenimage21-turbo") == "Qwen-Image 2.1 Turbo"
    defaults = generation_defaults("qwenimage21-turbo")
    assert defaults is not None and (defaults.steps, defaults.cfg) == (8, 1.0)
    assert generation_defaults("qwenimage21") is None  # the base model: the saved settings


def test_a_turbo_job_samples_the_timesteps_diffusers_turbo_blocks_set(pipelines, tmp_path):
    """Turbo's defaults run through the base pipeline sample the grid diffusers' Turbo set
    (its own blocks: the base model's shifted sigmas at 8 steps), once a step, no CFG."""
    import torch
    from diffusers.modular_pipelines import PipelineState
    from diffusers.modular_pipelines.qwenimage21 import QwenImage21TurboAutoBlocks
    from diffusers.modular_pipelines.qwenimage21.before_denoise import (
        QwenImage21TurboSetTimestepsStep,
    )

    from app.core.requests import requested

    model = in_memory(pipelines[0], "qwenimage21-turbo-schedule", "qwenimage21-turbo")
    defaults = requested.model_defaults(model)
    assert defaults is not None
    request = generation.GenerationRequest(
        prompt="a red cat",
        steps=defaults.steps,
        cfg=defaults.cfg,
        seed=5,
        width=64,
        height=64,
        output_dir=str(tmp_path),
    )
    seen = []  # the latents each transformer call predicts
    handed = []  # the timestep each call is handed

    def record(_module, _args, kwargs, _output):
        seen.append(tuple(kwargs["hidden_states"].shape))
        handed.append(kwargs["timestep"][0])

    hook = model.pipeline.transformer.register_forward_hook(record, with_kwargs=True)
    try:
        generation.generate(model, request, precision=FP16, device="cpu")
    finally:
        hook.remove()

    turbo = QwenImage21TurboAutoBlocks().init_pipeline()
    scheduler = type(model.pipeline.scheduler).from_config(model.pipeline.scheduler.config)
    turbo.update_components(scheduler=scheduler)  # a scheduler of its own, as the model's
    state = PipelineState()
    state.set("latents", torch.zeros(seen[0]))  # its shift follows the image's tokens
    state.set("num_inference_steps", None)  # its own default
    _, state = QwenImage21TurboSetTimestepsStep()(turbo, state)
    expected = state.get("timesteps").tolist()

    assert len(expected) == defaults.steps == 8
    assert len(seen) == defaults.steps and all(shape[0] == 1 for shape in seen)  # no CFG
    # The grid the job sampled, handed over as the pipeline does: in the latents' dtype, / 1000.
    dtype = handed[0].dtype
    assert torch.equal(torch.stack(handed), torch.tensor(expected).to(dtype) / 1000)


@pytest.mark.slow  # about 15 s here: writing and reading a 151,669-token embedding
def test_a_turbo_file_loads_as_turbo_and_its_job_runs_8_steps(tmp_path):
    from app.core.requests import requested

    pipeline = build_tiny_qwenimage21_pipeline()
    written = save_split_files(pipeline, tmp_path / "models", "qwen_image_2.1_turbo")

    model = models.load_model(str(written["transformer"]))

    assert (model.format, model.architecture) == ("split_files", "qwenimage21-turbo")
    defaults = requested.model_defaults(model)
    assert defaults is not None and (defaults.steps, defaults.cfg) == (8, 1.0)
    # Its edit is the same pipeline's: up to ten pictures, as the base model's.
    from app.core.families.capabilities import references

    assert references(family_of(model.pipeline), model.pipeline) == 10
