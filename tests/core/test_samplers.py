"""Samplers and schedules by the tools' names: each one HalfSafe lists builds the diffusers
scheduler that runs it and steps finitely; Karras sigmas match the formula computed here; the
names A1111 (before and since 1.9), ComfyUI and HalfSafe write read back to the same setting;
a sampler HalfSafe does not run is one sentence naming the closest; and a real generation with
an SDE sampler makes the same image from the same seed."""

from __future__ import annotations

import inspect
import json

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
from tests.core.test_pictures import _model
from tests.support.family_helpers import (
    FP16,
    offline,  # noqa: F401 - an autouse fixture: no network
)
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
    with pytest.raises(HalfSafeError, match="Unknown sampler 'dpmpp_sde'"):
        samplers.make("dpmpp_sde", SD_CONFIG)


@pytest.mark.parametrize(
    ("sampler", "schedule", "key"),
    [
        ("DPM++ 2M SDE", "Karras", "dpmpp_2m_sde_karras"),  # A1111 1.9 and later
        ("DPM++ 2M SDE Karras", None, "dpmpp_2m_sde_karras"),  # A1111 before 1.9
        ("DPM++ 2M Karras", None, "dpmpp_2m_karras"),
        ("DPM++ 3M SDE Exponential", None, "dpmpp_3m_sde_exponential"),
        ("Heun", "Automatic", "heun"),
        ("DPM2 a Karras", None, None),  # diffusers 0.42.1's DPM2 fails: not listed
        ("Euler a", None, "euler_a"),
        ("Euler a", "Karras", "euler_a"),  # a schedule it cannot take: its own
        ("UniPC", "Beta", "unipc_beta"),
        ("dpmpp_2m_sde_gpu", "karras", "dpmpp_2m_sde_karras"),  # ComfyUI
        ("euler_ancestral", "normal", "euler_a"),
        ("uni_pc_bh2", "sgm_uniform", "unipc_sgm_uniform"),
        ("lcm", "simple", "lcm"),
        ("heun_karras", None, "heun_karras"),  # HalfSafe's own key
        ("DPM++ SDE Karras", None, None),
        ("Restart", None, None),
        (None, None, None),
    ],
)
def test_the_tools_names_read_back_to_the_setting(sampler, schedule, key):
    assert samplers.key_for(sampler, schedule) == key


def test_a_sampler_halfsafe_does_not_run_names_the_closest():
    assert samplers.refusal("DPM++ SDE Karras") == (
        "HalfSafe does not run the sampler DPM++ SDE Karras; the closest it runs is DPM++ 2M SDE."
    )
    assert samplers.refusal("dpmpp_sde_gpu (karras)").endswith("closest it runs is DPM++ 2M SDE.")
    assert samplers.refusal("DPM2 a Karras").endswith("the closest it runs is Euler a.")
    assert samplers.refusal("Made Up") == "HalfSafe does not run the sampler Made Up."
    assert samplers.refusal("DPM++ 2M") is None


def test_an_image_records_the_sampler_and_schedule_as_a1111_does_and_reads_them_back(tmp_path):
    model = _model(FamilyId.SD)
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
    assert comfy.scheduler == "dpmpp_3m_sde_exponential"
