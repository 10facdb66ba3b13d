"""Samplers and schedules by the tools' names: each one HalfSafe lists builds the diffusers
scheduler that runs it and steps finitely; Karras sigmas match the formula computed here; the
names A1111 (before and since 1.9), ComfyUI and HalfSafe write read back to the same setting;
a sampler HalfSafe does not run is one sentence naming the closest; and a real generation with
an SDE sampler makes the same image from the same seed."""

from __future__ import annotations

import inspect
import json
import warnings

import numpy as np
import pytest
import torch
from diffusers import DDPMScheduler

from app.core import generation, samplers
from app.core.errors import HalfSafeError
from app.core.explain.records import _comfy_record, _infotext_record
from app.core.families import FamilyId
from app.core.settings import FIELDS, SCHEDULERS
from app.core.words import infotext
from tests.support.family_helpers import (
    FP16,
    offline,  # noqa: F401 - an autouse fixture: no network
)
from tests.support.family_rows import family_model
from tests.support.image_files import comfy_prompt

# An SD 1.x scheduler config, as its model folder has it.
SD_CONFIG = DDPMScheduler(
    beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", num_train_timesteps=1000
).config


def test_the_setting_lists_every_sampler_alone_and_with_each_schedule_it_runs():
    assert SCHEDULERS == samplers.KEYS
    assert FIELDS["scheduler"].default == "dpmpp_2m_karras"
    for key in ("euler", "euler_a", "dpmpp_2m_karras", "ddim"):  # the keys saved until now
        assert key in SCHEDULERS
    for key in ("heun", "heun_karras", "dpmpp_2m_sde_karras", "dpmpp_3m_sde_exponential"):
        assert key in SCHEDULERS
    for key in ("unipc_beta", "lcm", "euler_sgm_uniform", "ddim_sgm_uniform"):
        assert key in SCHEDULERS
    for key in ("dpm2", "dpm2_karras", "dpm2_a", "dpm2_a_karras", "dpm2_a_sgm_uniform"):
        assert key in SCHEDULERS
    # diffusers' DPMSolverSDEScheduler takes every sigma schedule and trailing spacing.
    for key in ("dpmpp_sde", "dpmpp_sde_karras", "dpmpp_sde_exponential", "dpmpp_sde_beta"):
        assert key in SCHEDULERS
    assert "dpmpp_sde_sgm_uniform" in SCHEDULERS
    assert "euler_a_karras" not in SCHEDULERS  # diffusers' Euler a takes no sigma schedule
    assert len(set(SCHEDULERS)) == len(SCHEDULERS)


@pytest.mark.parametrize("key", samplers.KEYS)
def test_every_sampler_builds_its_scheduler_and_steps_finitely(key):
    scheduler = samplers.make(key, SD_CONFIG, "epsilon")
    sampler, schedule = samplers.split(key)
    assert type(scheduler).__name__ == sampler.scheduler
    for option, value in {**sampler.options, **(schedule.options if schedule else {})}.items():
        assert scheduler.config[option] == value, option
    scheduler.set_timesteps(6)
    # As diffusers' pipelines do: a generator only for a sampler whose step takes one.
    step_arguments = inspect.signature(scheduler.step).parameters
    generator = torch.Generator().manual_seed(0)
    sample = torch.randn(1, 4, 8, 8, generator=generator) * scheduler.init_noise_sigma
    for timestep in scheduler.timesteps:
        model_input = scheduler.scale_model_input(sample, timestep)
        output = 0.1 * model_input  # a stand-in for the denoiser's prediction
        extra = {"generator": generator} if "generator" in step_arguments else {}
        sample = scheduler.step(output, timestep, sample, **extra).prev_sample
    assert torch.isfinite(sample).all()


def test_karras_sigmas_are_the_karras_formula():
    steps = 8
    plain = samplers.make("euler", SD_CONFIG)
    plain.set_timesteps(1000)
    low, high = float(plain.sigmas[-2]), float(plain.sigmas[0])  # the model's sigma range
    karras = samplers.make("euler_karras", SD_CONFIG)
    karras.set_timesteps(steps)
    ramp = np.linspace(0, 1, steps)
    rho = 7.0
    expected = (high ** (1 / rho) + ramp * (low ** (1 / rho) - high ** (1 / rho))) ** rho
    assert np.allclose(karras.sigmas[:-1].numpy(), expected, rtol=1e-3)


def test_a_zero_terminal_snr_model_gets_rescaled_betas_or_one_sentence():
    scheduler = samplers.make("dpmpp_2m_sde", SD_CONFIG, "v_prediction", zero_terminal_snr=True)
    assert scheduler.config.rescale_betas_zero_snr and scheduler.config.timestep_spacing == (
        "trailing"
    )
    with pytest.raises(HalfSafeError, match="The sampler Heun cannot run this model's zero"):
        samplers.make("heun_karras", SD_CONFIG, "v_prediction", zero_terminal_snr=True)
    with pytest.raises(HalfSafeError, match="The sampler DPM2 a cannot run this model's zero"):
        samplers.make("dpm2_a", SD_CONFIG, "v_prediction", zero_terminal_snr=True)
    with pytest.raises(
        HalfSafeError, match=r"The sampler DPM\+\+ SDE cannot run this model's zero"
    ):
        samplers.make("dpmpp_sde_karras", SD_CONFIG, "v_prediction", zero_terminal_snr=True)
    with pytest.raises(HalfSafeError, match="Unknown sampler 'dpmpp_2s_a'"):
        samplers.make("dpmpp_2s_a", SD_CONFIG)


@pytest.mark.parametrize(
    ("sampler", "schedule", "key"),
    [
        ("DPM++ 2M SDE", "Karras", "dpmpp_2m_sde_karras"),  # A1111 1.9 and later
        ("DPM++ 2M SDE Karras", None, "dpmpp_2m_sde_karras"),  # A1111 before 1.9
        ("DPM++ 2M Karras", None, "dpmpp_2m_karras"),
        ("DPM++ 3M SDE Exponential", None, "dpmpp_3m_sde_exponential"),
        ("Heun", "Automatic", "heun"),
        ("DPM2 a Karras", None, "dpm2_a_karras"),
        ("DPM2", "Karras", "dpm2_karras"),
        ("DPM2 a", "Exponential", "dpm2_a_exponential"),
        ("dpm_2", "normal", "dpm2"),  # ComfyUI
        ("dpm_2_ancestral", "karras", "dpm2_a_karras"),
        ("Euler a", None, "euler_a"),
        ("Euler a", "Karras", "euler_a"),  # a schedule it cannot take: its own
        ("UniPC", "Beta", "unipc_beta"),
        ("dpmpp_2m_sde_gpu", "karras", "dpmpp_2m_sde_karras"),  # ComfyUI
        ("euler_ancestral", "normal", "euler_a"),
        ("uni_pc_bh2", "sgm_uniform", "unipc_sgm_uniform"),
        ("lcm", "simple", "lcm_sgm_uniform"),  # ComfyUI's simple: the closest, trailing
        ("Euler", "Simple", "euler_sgm_uniform"),
        ("DPM++ 2M", "KL Optimal", "dpmpp_2m_karras"),
        ("euler", "ddim_uniform", "euler"),
        ("DPM++ 2M SDE", "Align Your Steps", "dpmpp_2m_sde_karras"),
        ("Euler Simple", None, "euler_sgm_uniform"),
        ("dpmpp_2m_kl_optimal", None, "dpmpp_2m_karras"),
        ("heun_karras", None, "heun_karras"),  # HalfSafe's own key
        ("DPM++ SDE Karras", None, "dpmpp_sde_karras"),  # A1111 before 1.9
        ("DPM++ SDE", "Karras", "dpmpp_sde_karras"),  # A1111 1.9 and later
        ("DPM++ SDE", "Automatic", "dpmpp_sde"),
        ("dpmpp_sde", "karras", "dpmpp_sde_karras"),  # ComfyUI
        ("dpmpp_sde_gpu", "exponential", "dpmpp_sde_exponential"),
        ("dpmpp_sde_gpu", "normal", "dpmpp_sde"),
        ("DPM++ 2S a Karras", None, None),
        ("Restart", None, None),
        (None, None, None),
    ],
)
def test_the_tools_names_read_back_to_the_setting(sampler, schedule, key):
    assert samplers.key_for(sampler, schedule) == key


def test_a_sampler_halfsafe_does_not_run_names_the_closest():
    assert samplers.refusal("DPM++ 2S a Karras") == (
        "HalfSafe does not run the sampler DPM++ 2S a Karras; the closest it runs is Euler a."
    )
    assert samplers.refusal("dpmpp_2m_sde_heun_gpu (karras)") == (
        "HalfSafe does not run the sampler dpmpp_2m_sde_heun_gpu (karras); the closest it runs "
        "is DPM++ 2M SDE."
    )
    assert samplers.refusal("DPM++ SDE Karras") is None  # diffusers' DPMSolverSDE runs it
    assert samplers.refusal("dpmpp_sde_gpu") is None
    assert samplers.refusal("DPM2 a Karras") is None  # diffusers' KDPM2 runs it
    assert samplers.refusal("dpm_2_ancestral") is None
    assert samplers.refusal("Made Up") == "HalfSafe does not run the sampler Made Up."
    assert samplers.refusal("DPM++ 2M") is None


def test_an_image_records_the_sampler_and_schedule_as_a1111_does_and_reads_them_back(tmp_path):
    model = family_model(FamilyId("sd"))
    request = generation.GenerationRequest(
        prompt="a red cube",
        steps=3,
        seed=11,
        width=64,
        height=64,
        scheduler="dpmpp_2m_sde_karras",
        output_dir=str(tmp_path),
    )
    first = generation.generate(model, request, precision=FP16, device="cpu").images[0]
    parsed = infotext.parse(first.parameters)
    assert (parsed.raw(infotext.SAMPLER), parsed.raw(infotext.SCHEDULE_TYPE)) == (
        "DPM++ 2M SDE",
        "Karras",
    )
    assert parsed.scheduler() == "dpmpp_2m_sde_karras"
    # The SDE sampler's fresh noise comes from the image's seed: the same image again.
    again = generation.generate(model, request, precision=FP16, device="cpu").images[0]
    assert np.array_equal(np.asarray(first.image), np.asarray(again.image))
    plain = generation.generate(
        model, generation.GenerationRequest(**{**request.__dict__, "scheduler": "dpmpp_2m"}),
        precision=FP16, device="cpu",
    ).images[0]  # fmt: skip
    assert infotext.parse(plain.parameters).raw(infotext.SCHEDULE_TYPE) is None
    assert not np.array_equal(np.asarray(first.image), np.asarray(plain.image))


def test_explain_reads_the_sampler_of_an_a1111_and_a_comfyui_image(tmp_path):
    record = _infotext_record(
        "a cat\nSteps: 20, Sampler: DPM++ 2M SDE, Schedule type: Karras, CFG scale: 7, Seed: 1"
    )
    assert record.scheduler == "dpmpp_2m_sde_karras"
    old = _infotext_record("a cat\nSteps: 20, Sampler: Heun Karras, CFG scale: 7, Seed: 1")
    assert old.scheduler == "heun_karras"
    nodes = json.loads(comfy_prompt("model.safetensors"))
    nodes["3"]["inputs"].update(sampler_name="dpmpp_3m_sde_gpu", scheduler="exponential")
    comfy = _comfy_record(tmp_path / "x.png", json.dumps(nodes), None)
    assert comfy.scheduler == "dpmpp_3m_sde_exponential" and comfy.schedule_note is None
    # A schedule HalfSafe does not run: the closest, and the sentence that says so.
    nodes["3"]["inputs"].update(sampler_name="dpmpp_2m", scheduler="kl_optimal")
    comfy = _comfy_record(tmp_path / "x.png", json.dumps(nodes), None)
    assert (comfy.scheduler, comfy.schedule_note) == (
        "dpmpp_2m_karras",
        "HalfSafe does not run the schedule kl_optimal; the closest it runs is DPM++ 2M Karras.",
    )
    ays = _infotext_record(
        "a cat\nSteps: 20, Sampler: Euler, Schedule type: Align Your Steps, CFG scale: 7, Seed: 1"
    )
    assert ays.scheduler == "euler_karras"
    assert ays.schedule_note is not None and "Align Your Steps" in ays.schedule_note


def test_dpm2_a_karras_is_diffusers_dpm2_ancestral_recorded_and_read_back_as_a1111_writes_it(
    tmp_path,
):
    """DPM2 a with Karras sigmas: the same picture as diffusers' own pipeline with its KDPM2
    ancestral scheduler from the same seed, written `Sampler: DPM2 a, Schedule type: Karras`
    and read back to the same setting; progress counts the model's calls (two a step but the
    last)."""
    from diffusers import KDPM2AncestralDiscreteScheduler
    from PIL import Image

    from app.core.settings import PrecisionSettings

    model = family_model(FamilyId("sd"))
    request = generation.GenerationRequest(
        prompt="a red cube", steps=3, cfg=5.0, seed=11, width=64, height=64,
        scheduler="dpm2_a_karras", output_dir=str(tmp_path),
    )  # fmt: skip
    progress = []
    made = generation.generate(
        model, request, precision=PrecisionSettings(precision="fp32"), device="cpu",
        on_progress=lambda stage, step, total: progress.append((stage, step, total)),
    ).images[0]  # fmt: skip

    pipeline = model.pipeline
    own = pipeline.scheduler
    # diffusers' own class takes NumPy 2's deprecated path (see samplers.make).
    warnings.filterwarnings("ignore", "__array_wrap__", DeprecationWarning)
    try:
        pipeline.scheduler = KDPM2AncestralDiscreteScheduler.from_config(
            own.config, use_karras_sigmas=True
        )
        theirs = pipeline(
            "a red cube", num_inference_steps=3, guidance_scale=5.0, height=64, width=64,
            generator=torch.Generator().manual_seed(11), output_type="np",
        ).images[0]  # fmt: skip
    finally:
        pipeline.scheduler = own
    with Image.open(made.path) as image:
        saved = np.asarray(image.convert("RGB"))
    assert made.status == "ok"
    assert np.abs(saved.astype(int) - (theirs * 255).round().astype(int)).max() <= 1
    parsed = infotext.parse(made.parameters)
    assert (parsed.raw(infotext.SAMPLER), parsed.raw(infotext.SCHEDULE_TYPE)) == (
        "DPM2 a",
        "Karras",
    )
    assert parsed.scheduler() == "dpm2_a_karras"
    assert [p for p in progress if p[0] == "Generating"] == [
        ("Generating", i, 5) for i in range(1, 6)
    ]


@pytest.mark.parametrize("key", ["dpm2", "dpm2_a_karras", "heun"])
def test_a_second_order_sampler_is_checked_and_its_nan_step_is_the_samplers(key):
    """The check probes the sampler's own schedule; the NaN watch counts a step per two model
    calls, so the step it names is never past the steps asked for."""
    from app.core.generation.watch import NanWatch
    from app.core.health.stages import probe_timesteps
    from tests.support.generation_models import Poisoned

    model = family_model(FamilyId("sd"))
    scheduler = samplers.make(key, model.pipeline.scheduler.config, "epsilon")
    scheduler.set_timesteps(20)
    timesteps = probe_timesteps(model, 20, key, 64)
    assert timesteps[0] == int(scheduler.timesteps[0]) and len(timesteps) == 3
    assert timesteps[-1] == int(scheduler.timesteps[-1])

    unet = Poisoned()  # the third call onward is NaN for image 1: the second step's first
    watch = NanWatch(unet, batch=2, order=scheduler.order)
    latents = torch.zeros(2, 4, 8, 8)
    for call in range(5):  # 3 steps: 5 calls
        unet(torch.cat([latents] * 2), torch.tensor(900.0 - call))
        watch.after_step(call, latents)
    watch.remove()
    first = generation.read_flags(watch.flags())[2:]
    assert scheduler.order == 2 and first == [-1, 1]  # 0-based: the second step


@pytest.mark.parametrize(
    ("sampler", "schedule", "key", "sentence"),
    [
        ("Euler", "Simple", "euler_sgm_uniform",
         "HalfSafe does not run the schedule Simple; the closest it runs is Euler SGM Uniform."),
        ("dpmpp_2m", "kl_optimal", "dpmpp_2m_karras",
         "HalfSafe does not run the schedule kl_optimal; the closest it runs is DPM++ 2M Karras."),
        ("Euler a", "KL Optimal", "euler_a",
         "HalfSafe does not run the schedule KL Optimal; the closest it runs is Euler a with "
         "its own schedule."),
        ("euler", "ddim_uniform", "euler",
         "HalfSafe does not run the schedule ddim_uniform; the closest it runs is Euler with its "
         "own schedule."),
        ("DPM++ 2M", "Align Your Steps", "dpmpp_2m_karras",
         "HalfSafe does not run the schedule Align Your Steps; the closest it runs is DPM++ 2M "
         "Karras."),
        ("Euler a", "Karras", "euler_a",
         "HalfSafe does not run Euler a with the schedule Karras (diffusers' Euler a takes no "
         "such option); the closest it runs is Euler a with its own schedule."),
        ("Euler", "Made Up", "euler",
         "HalfSafe does not run the schedule Made Up; the closest it runs is Euler with its own "
         "schedule."),
        ("DPM++ 2M", "Karras", "dpmpp_2m_karras", None),
        ("Euler", "Automatic", "euler", None),
        ("euler", "normal", "euler", None),
    ],
)  # fmt: skip
def test_a_schedule_halfsafe_does_not_run_is_one_sentence_naming_the_closest(
    sampler, schedule, key, sentence
):
    assert samplers.read(sampler, schedule) == (key, sentence)


def _comfy_simple(sigmas: np.ndarray, steps: int) -> np.ndarray:
    """ComfyUI's simple schedule, computed here from its definition: the model's sigmas at
    evenly spaced indices from the top, 999 - floor(i * 1000 / steps), then 0."""
    picked = [sigmas[-(1 + int(i * len(sigmas) / steps))] for i in range(steps)]
    return np.array([*picked, 0.0], dtype=np.float32)


def test_simple_is_not_run_as_such_because_trailing_spacing_rounds_where_it_floors():
    """Why Simple is the closest, not the same: HalfSafe's SGM Uniform (diffusers' trailing
    spacing) takes the same sigmas as ComfyUI's simple where the step count divides 1000, and
    one index lower where i * 1000 / steps has a fraction of a half or more."""
    model_sigmas = ((1 - DDPMScheduler.from_config(SD_CONFIG).alphas_cumprod) /
                    DDPMScheduler.from_config(SD_CONFIG).alphas_cumprod).sqrt().numpy()  # fmt: skip
    for steps, same in ((20, True), (25, True), (30, False), (6, False)):
        trailing = samplers.make("euler_sgm_uniform", SD_CONFIG)
        trailing.set_timesteps(steps)
        simple = _comfy_simple(model_sigmas, steps)
        assert np.allclose(trailing.sigmas.numpy(), simple, rtol=1e-5) is same, steps
        assert np.allclose(trailing.sigmas.numpy(), simple, rtol=0.05)  # the closest


@pytest.mark.parametrize("words", ["Euler Simple", "euler_kl_optimal", "Euler a Karras"])
def test_generate_refuses_a_schedule_it_does_not_run_with_exit_2(words, capsys, tmp_path):
    from app.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["generate", "demo", "--scheduler", words, "--out", str(tmp_path)])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert samplers.read(words)[1] in err and "closest it runs is" in err
    assert not list(tmp_path.iterdir())


def test_dpmpp_sde_karras_draws_its_brownian_noise_from_the_images_seed(tmp_path):
    """DPM++ SDE with Karras sigmas: the same seed makes the same picture twice and another
    seed another; the picture is diffusers' own pipeline with its DPMSolverSDEScheduler whose
    Brownian tree is seeded by the image's seed (and not another tree's), written `Sampler: DPM++
    SDE, Schedule type: Karras` and read back to the same setting; progress counts the model's
    calls (two a step but the last)."""
    from diffusers import DPMSolverSDEScheduler

    from app.core.settings import PrecisionSettings

    model = family_model(FamilyId("sd"))
    request = generation.GenerationRequest(
        prompt="a red cube", steps=3, cfg=5.0, seed=11, width=64, height=64,
        scheduler="dpmpp_sde_karras", output_dir=str(tmp_path),
    )  # fmt: skip
    fp32 = PrecisionSettings(precision="fp32")
    progress = []
    first = generation.generate(
        model, request, precision=fp32, device="cpu",
        on_progress=lambda stage, step, total: progress.append((stage, step, total)),
    ).images[0]  # fmt: skip
    again = generation.generate(model, request, precision=fp32, device="cpu").images[0]
    other = generation.generate(
        model, generation.GenerationRequest(**{**request.__dict__, "seed": 12}),
        precision=fp32, device="cpu",
    ).images[0]  # fmt: skip
    pixels = [np.asarray(made.image).astype(int) for made in (first, again, other)]
    assert first.status == "ok" and np.array_equal(pixels[0], pixels[1])
    assert np.abs(pixels[0] - pixels[2]).max() > 8

    pipeline = model.pipeline
    own = pipeline.scheduler

    def theirs(tree_seed: int) -> np.ndarray:
        pipeline.scheduler = DPMSolverSDEScheduler.from_config(
            own.config, use_karras_sigmas=True, noise_sampler_seed=[tree_seed]
        )
        try:
            out = pipeline(
                "a red cube", num_inference_steps=3, guidance_scale=5.0, height=64, width=64,
                generator=torch.Generator().manual_seed(11), output_type="np",
            ).images[0]  # fmt: skip
        finally:
            pipeline.scheduler = own
        return (out * 255).round().astype(int)

    assert np.abs(pixels[0] - theirs(11)).max() <= 1
    assert np.abs(pixels[0] - theirs(99)).max() > 8  # the tree's seed shows in the picture
    parsed = infotext.parse(first.parameters)
    assert (parsed.raw(infotext.SAMPLER), parsed.raw(infotext.SCHEDULE_TYPE)) == (
        "DPM++ SDE",
        "Karras",
    )
    assert parsed.scheduler() == "dpmpp_sde_karras"
    assert [p for p in progress if p[0] == "Generating"] == [
        ("Generating", i, 5) for i in range(1, 6)
    ]


def test_dpmpp_sde_from_a1111_and_comfyui_is_read_as_itself_and_made_again_with_it(tmp_path):
    """A1111's "Sampler: DPM++ SDE, Schedule type: Karras" and ComfyUI's `dpmpp_sde` with
    `karras` read as DPM++ SDE Karras, with no note of a closest sampler, and the image made
    again from A1111's words runs and records that sampler."""
    from app.core.settings import PrecisionSettings
    from app.ui.image_entry import GalleryEntry

    text = "a cat\nSteps: 3, Sampler: DPM++ SDE, Schedule type: Karras, CFG scale: 5, Seed: 4"
    record = _infotext_record(text)
    assert (record.scheduler, record.schedule_note) == ("dpmpp_sde_karras", None)
    nodes = json.loads(comfy_prompt("model.safetensors"))
    for name in ("dpmpp_sde", "dpmpp_sde_gpu"):
        nodes["3"]["inputs"].update(sampler_name=name, scheduler="karras")
        comfy = _comfy_record(tmp_path / "x.png", json.dumps(nodes), None)
        assert (comfy.scheduler, comfy.schedule_note) == ("dpmpp_sde_karras", None)
    values = GalleryEntry.from_parameters(text).generate_values()
    assert values["scheduler"] == "dpmpp_sde_karras"
    request = generation.GenerationRequest(
        prompt=values["prompt"], steps=values["steps"], seed=values["seed"], width=64,
        height=64, scheduler=values["scheduler"], output_dir=str(tmp_path),
    )  # fmt: skip
    made = generation.generate(
        family_model(FamilyId("sd")), request, precision=PrecisionSettings(), device="cpu"
    ).images[0]
    parsed = infotext.parse(made.parameters)
    assert made.status == "ok"
    assert (parsed.raw(infotext.SAMPLER), parsed.raw(infotext.SCHEDULE_TYPE)) == (
        "DPM++ SDE",
        "Karras",
    )


def test_join_is_split_read_back_and_refuses_a_schedule_the_sampler_does_not_run():
    for key in samplers.KEYS:
        sampler, schedule = samplers.split(key)
        assert samplers.join(sampler.key, schedule.key if schedule else None) == key
    with pytest.raises(KeyError):
        samplers.join("euler_a", "karras")
