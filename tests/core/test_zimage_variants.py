"""Z-Image Turbo and Z-Image Base told apart: a folder by its scheduler's shift (the one thing
that differs: 3 and 6), a transformer file by its name (nothing in it differs), the old `zimage`
name read back wherever it was saved, and each model's own steps and CFG scale used where the
user gives none (`halfsafe generate`, the check's probe, the records of what ran). Base's
health check, planted overflows, fix and repaired generation are its row in test_families.py;
the Generate page's defaults: tests/ui/test_generate_defaults.py.
"""

from __future__ import annotations

import hashlib

import pytest
import torch

from app.cli.arguments import build_parser, effective_settings
from app.core import families, health, models
from app.core.families import (
    architecture_title,
    family_of_architecture,
    generation_defaults,
    profile_architecture,
)
from app.core.families.zimage import (
    BASE,
    BASE_DEFAULTS,
    LEGACY,
    TURBO,
    TURBO_DEFAULTS,
    ZImageFamily,
    variant,
)
from app.core.health.request import CheckRun
from app.core.models import split
from app.core.requests import requested
from app.core.requests.records import CheckRequest
from app.core.settings import PrecisionSettings
from app.core.words import infotext
from tests.support.family_helpers import (
    FP16,
    in_memory,
    offline,  # noqa: F401 - an autouse fixture: no network
)
from tests.support.model_files import save_split_files
from tests.support.tiny_models import (
    ZIMAGE_BASE_SCHEDULER_CONFIG,
    ZIMAGE_SCHEDULER_CONFIG,
    build_tiny_zimage_pipeline,
)

INDEX = {
    "_class_name": "ZImagePipeline",
    "transformer": ["diffusers", "ZImageTransformer2DModel"],
    "text_encoder": ["transformers", "Qwen3Model"],
}
TRANSFORMER = {"n_layers": 30, "n_refiner_layers": 2, "dim": 3840, "cap_feat_dim": 2560}


# --- a folder: its scheduler -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("scheduler", "expected", "words"),
    [
        (ZIMAGE_SCHEDULER_CONFIG, TURBO, "shifts the schedule by 3, as Z-Image Turbo's does"),
        (ZIMAGE_BASE_SCHEDULER_CONFIG, BASE, "shifts the schedule by 6, as Z-Image Base's does"),
        ({**ZIMAGE_SCHEDULER_CONFIG, "shift": 5.0}, BASE, "by 5, nearer Z-Image Base's"),
        ({**ZIMAGE_SCHEDULER_CONFIG, "shift": 4.0}, TURBO, "by 4, nearer Z-Image Turbo's"),
        ({}, TURBO, "its scheduler config, the one thing that tells Turbo from Base, is missing"),
        ({"shift": "six"}, TURBO, "states no shift it can be read by, so it is read as Turbo"),
    ],
)
def test_a_folder_is_told_turbo_or_base_by_its_schedulers_shift(scheduler, expected, words):
    detection = families.detect_from_configs(INDEX, TRANSFORMER, scheduler)

    assert detection.supported and detection.architecture == expected
    assert detection.because.startswith(architecture_title(expected) + ": its ZImagePipeline")
    assert words in detection.because
    assert detection.looks_like == f"a {architecture_title(expected)} pipeline"


def test_a_saved_base_folder_loads_as_base_with_base_s_schedule(tmp_path):
    pipeline = build_tiny_zimage_pipeline(base=True)
    pipeline.save_pretrained(tmp_path / "z-image")

    model = models.load_model(str(tmp_path / "z-image"))

    assert model.architecture == BASE and variant(model.pipeline) == BASE
    assert model.pipeline.scheduler.config["shift"] == 6.0
    # The probe runs Base's schedule: shifted by 6, its sigmas sit higher than Turbo's.
    turbo = in_memory(build_tiny_zimage_pipeline(), "turbo", TURBO)
    family = ZImageFamily()
    assert (
        family.probe_timesteps(model, 28, "euler", 64)[1]
        > family.probe_timesteps(turbo, 28, "euler", 64)[1]
    )


# --- a transformer file: its name --------------------------------------------------------------


def _shapes() -> dict[str, tuple[int, ...]]:
    from app.core.formats.layouts import to_original

    transformer = build_tiny_zimage_pipeline().transformer
    config = {**transformer.config, "_class_name": type(transformer).__name__}
    rows = ZImageFamily.layout.table(config)  # type: ignore[union-attr]
    return {k: tuple(v.shape) for k, v in to_original(rows, transformer.state_dict()).items()}


@pytest.mark.parametrize(
    ("name", "expected", "start"),
    [
        ("z_image_turbo_bf16.safetensors", TURBO, "Z-Image Turbo, as the file's name says"),
        ("z_image_base_bf16.safetensors", BASE, "Z-Image Base, as the file's name says"),
        ("ZImageBase-fp8.safetensors", BASE, "Z-Image Base, as the file's name says"),
        ("Z-Image-Base.Q8_0.gguf", BASE, "Z-Image Base, as the file's name says"),
        ("z_image_bf16.safetensors", TURBO, "Z-Image Turbo: a single-stream transformer"),
        ("database_zimage.safetensors", TURBO, "Z-Image Turbo: a single-stream transformer"),
    ],
)
def test_a_transformer_file_is_told_by_its_name_and_says_so(name, expected, start):
    model = split.read_model(_shapes(), name)

    assert model is not None and model.architecture == expected
    assert model.because.startswith(start), model.because
    assert model.scheduler["shift"] == (6.0 if expected == BASE else 3.0)
    assert model.because.count(". ") == 0 and model.because.endswith(".")  # one sentence
    if "name says" in start:  # said why the name decides
        assert "nothing in the file tells Turbo from Base" in model.because
    else:  # nothing told it: said so, and what would
        assert "nothing in such a file tells Turbo from Base" in model.because
        assert "its name says neither, so it is read as Turbo, as InvokeAI" in model.because


def test_a_base_file_loads_as_base_and_samples_with_base_s_schedule(tmp_path):
    pipeline = build_tiny_zimage_pipeline()
    written = save_split_files(pipeline, tmp_path / "models", "z_image_base")

    model = models.load_model(str(written["transformer"]))

    assert (model.format, model.architecture) == ("split_files", BASE)
    assert model.pipeline.scheduler.config["shift"] == 6.0 and variant(model.pipeline) == BASE
    assert requested.model_defaults(model) == BASE_DEFAULTS


# --- the old name, read back ---------------------------------------------------------------


def test_the_old_zimage_name_reads_back_as_z_image_of_either_kind():
    for name in (LEGACY, TURBO, BASE):
        assert isinstance(family_of_architecture(name), ZImageFamily)
        assert profile_architecture(name) == LEGACY
    assert architecture_title(LEGACY) == "Z-Image"
    assert (architecture_title(TURBO), architecture_title(BASE)) == (
        "Z-Image Turbo",
        "Z-Image Base",
    )
    # It says neither model: the saved settings apply, not one model's defaults.
    assert generation_defaults(LEGACY) is None
    assert profile_architecture("flux-dev") == "flux-dev"  # other families keep their names


@pytest.mark.parametrize("base", [False, True], ids=["turbo", "base"])
def test_a_fix_remembered_before_turbo_and_base_were_told_apart_is_found(tmp_path, base):
    """Fixes were keyed by sha256("zimage", prediction, content): a model loaded now under its
    new name gets the same key, so what was saved is found, not lost."""
    from app.core.fixing import profiles

    build_tiny_zimage_pipeline(base=base).save_pretrained(tmp_path / "z")
    model = models.load_model(str(tmp_path / "z"))
    content = model.weights.content
    assert content is not None
    old_key = hashlib.sha256(f"zimage\0flow\0{content}".encode()).hexdigest()
    profiles.remember_fix(old_key, "cpu", {"vae_precision": "fp32"}, "VAE in fp32", "health check")

    assert model.architecture == (BASE if base else TURBO)
    assert model.profile_key == old_key
    fix = profiles.remembered_fix(model.profile_key, "cpu")
    assert fix is not None and fix.settings == {"vae_precision": "fp32"}


def test_a_png_record_names_the_model_that_ran_and_the_old_name_reads_back():
    text = infotext.write("a red cat", "", [(infotext.ARCHITECTURE, LEGACY)])
    assert "Architecture: zimage" in text
    assert infotext.BY_NAME["Architecture"].read("zimage") == LEGACY


# --- each model's own steps and CFG ----------------------------------------------------------


def test_each_model_states_its_own_steps_and_cfg():
    assert (TURBO_DEFAULTS.steps, TURBO_DEFAULTS.cfg) == (9, 1.0)  # 8 NFEs, no CFG
    assert (BASE_DEFAULTS.steps, BASE_DEFAULTS.cfg) == (28, 4.0)
    assert generation_defaults(TURBO) == TURBO_DEFAULTS
    assert generation_defaults(BASE) == BASE_DEFAULTS
    assert TURBO_DEFAULTS.words() == "9 steps at CFG scale 1, Z-Image Turbo's defaults"
    for other in ("sd1", "sdxl", "flux-dev", "krea2", "unknown", None):
        assert generation_defaults(other) is None


@pytest.mark.parametrize(
    ("flags", "defaults", "expected"),
    [
        ([], TURBO_DEFAULTS, (9, 1.0)),
        ([], BASE_DEFAULTS, (28, 4.0)),
        (["--steps", "12"], TURBO_DEFAULTS, (12, 1.0)),
        (["--cfg", "2.5"], BASE_DEFAULTS, (28, 2.5)),
        (["--steps", "5", "--cfg", "3"], BASE_DEFAULTS, (5, 3.0)),
        ([], None, (25, 7.0)),  # a model that states none: the saved settings
    ],
)
def test_halfsafe_generate_runs_the_models_own_steps_and_cfg_where_no_flag_gives_them(
    flags, defaults, expected
):
    from app.cli.commands import generate_request

    args = build_parser().parse_args(["generate", "model", "--prompt", "a red cat", *flags])
    generation = generate_request(args, effective_settings(args), 1024, defaults).generation

    assert (generation.steps, generation.cfg) == expected


def _probe_batches(pipeline, model) -> list[int]:
    """How many conditionings each transformer call of a check's probe took."""
    batches: list[int] = []
    handle = pipeline.transformer.register_forward_pre_hook(
        lambda _module, args: batches.append(len(args[0]))
    )
    try:
        report = health.check_loaded(
            model,
            CheckRequest(precision=FP16, device="cpu", size=64),
            run=CheckRun(remember=False, measure_cost=False),
        )
    finally:
        handle.remove()
    assert report.verdict == "healthy"
    return batches


def test_the_check_probes_base_with_cfg_and_its_negative_prompt_and_turbo_without():
    turbo_pipeline = build_tiny_zimage_pipeline()
    base_pipeline = build_tiny_zimage_pipeline(base=True)

    turbo = _probe_batches(turbo_pipeline, in_memory(turbo_pipeline, "turbo", TURBO))
    base = _probe_batches(base_pipeline, in_memory(base_pipeline, "base", BASE))

    assert turbo and set(turbo) == {1}  # the prompt alone, as Turbo samples
    assert base and set(base) == {2}  # the prompt and the negative prompt, for CFG


def test_base_s_probe_steps_with_cfg_4_and_turbo_s_with_the_prompt_alone():
    """One probe step from pure noise: Base's follows the prompt's prediction guided away from
    the negative prompt's at CFG 4 (guidance 3), Turbo's the prompt's alone."""
    family = ZImageFamily()
    pipeline = build_tiny_zimage_pipeline(base=True)
    side = 64 // family.latent_factor(pipeline)
    with torch.inference_mode():
        conditioning = family.encode(pipeline, "a red cat", "", "cpu", True)
        base = family.probe_denoise(pipeline, conditioning, 64, "cpu", [1000.0])
        pipeline.scheduler.register_to_config(shift=3.0)  # the same weights, read as Turbo
        turbo = family.probe_denoise(pipeline, conditioning, 64, "cpu", [1000.0])
        noise = torch.randn((1, 16, side, side), generator=torch.Generator().manual_seed(0))
        frame = noise[0].unsqueeze(1)
        captions = [conditioning["prompt_embeds"][0], conditioning["negative_prompt_embeds"][0]]
        out = pipeline.transformer([frame, frame], torch.zeros(2), captions, return_dict=False)[0]
    cond, uncond = (o.float().squeeze(1)[None] for o in out)
    # Euler from sigma 1 to 0 along the velocity, the negative of the prediction.
    torch.testing.assert_close(base, noise + cond + 3.0 * (cond - uncond), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(turbo, noise + cond, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(base, turbo)


@pytest.mark.parametrize("base", [False, True], ids=["turbo", "base"])
def test_the_engine_s_check_probes_at_the_models_own_steps(base):
    """The check a CheckRequest asks for (the window's, `halfsafe check`'s) probes the schedule
    the model's images run: its own steps, whatever the saved Steps setting says."""
    pipeline = build_tiny_zimage_pipeline(base=base)
    name = BASE if base else TURBO
    model = in_memory(pipeline, name, name)
    request = CheckRequest(
        precision=PrecisionSettings(precision="fp16"), device="cpu", size=64, steps=25
    )

    report = requested.check(model, request)

    own = (BASE_DEFAULTS if base else TURBO_DEFAULTS).steps
    assert report.timesteps == ZImageFamily().probe_timesteps(model, own, "euler", 64)
    assert report.timesteps != ZImageFamily().probe_timesteps(model, 25, "euler", 64)


def test_halfsafe_generate_on_a_base_folder_records_base_s_steps_cfg_and_name(tmp_path, capsys):
    from app.cli.commands import generate_from_cli

    build_tiny_zimage_pipeline(base=True).save_pretrained(tmp_path / "z-image-base")
    argv = ["generate", str(tmp_path / "z-image-base"), "--prompt", "a red cat", "--width", "64"]
    args = build_parser().parse_args(
        [*argv, "--height", "64", "--device", "cpu", "--out", str(tmp_path / "out")]
    )

    result = generate_from_cli(args.model, args, effective_settings(args))

    (image,) = result.images
    assert image.status == "ok"
    for said in ("Steps: 28", "CFG scale: 4", "Architecture: zimage-base"):
        assert said in image.parameters, said
    assert result.to_json()["model"]["architecture"] == BASE
    assert "28 steps at CFG scale 4, as Z-Image Base's defaults apply" in capsys.readouterr().err


def test_an_absurd_shift_is_refused_naming_the_file_and_the_key(tmp_path):
    """`shift: 1e308` made every timestep NaN, and a good model's check said broken."""
    import json

    from app.core.errors import BadFileError

    folder = tmp_path / "z-image"
    build_tiny_zimage_pipeline().save_pretrained(folder)
    config_file = folder / "scheduler" / "scheduler_config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "shift": 1e308}))

    with pytest.raises(BadFileError) as caught:
        models.load_model(str(folder))

    said = str(caught.value)
    assert said.startswith(f"{config_file}: its shift is 1e+308, outside 0 to 100")
    assert "\n" not in said
