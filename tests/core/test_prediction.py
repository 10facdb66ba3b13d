"""Epsilon vs v-prediction and zero terminal SNR: markers, metadata, and the test forward pass.

The test pass is proven on UNets made to predict one target: a forward hook replaces the tiny
UNet's output with what a good denoiser trained on epsilon (or v) would give for the probe's
latent, from an imperfect estimate of that latent. Random-weight UNets, zeros and a UNet that
copies its input must come out undecided.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from diffusers import DDPMScheduler, UNet2DConditionModel
from diffusers.models.unets.unet_2d_condition import UNet2DConditionOutput

from app.core.checkpoint import write_safetensors
from app.core.generation import GenerationRequest, generate
from app.core.models import load_model, prediction
from app.core.settings import PrecisionSettings
from tests.support.checkpoint_files import tiny_sd2
from tests.support.model_files import ldm_state_dict
from tests.support.tiny_models import build_tiny_sdxl_pipeline


def alphas(pipe, zero_snr: bool = False) -> torch.Tensor:
    config = pipe.scheduler.config
    return DDPMScheduler(
        num_train_timesteps=config.num_train_timesteps,
        beta_start=config.beta_start,
        beta_end=config.beta_end,
        beta_schedule=config.beta_schedule,
        rescale_betas_zero_snr=zero_snr,
    ).alphas_cumprod.float()


def trained_on(kind: str, schedule: torch.Tensor, *, error: float = 0.3):
    """A forward hook making a UNet answer as a denoiser trained on `kind` would: it estimates
    the probe's clean latent with relative error about `error`, and returns noise or velocity
    computed from that estimate and its input."""
    generator = torch.Generator().manual_seed(11)

    def hook(module, args, kwargs, output):
        sample = args[0] if args else kwargs["sample"]
        timestep = args[1] if len(args) > 1 else kwargs["timestep"]
        x_t = sample.float()
        _, channels, size, _ = x_t.shape
        x0 = prediction.smooth_latent(channels, size)
        guess = x0 + error * torch.randn(x_t.shape, generator=generator)
        ab = schedule[timestep.long().cpu()].view(-1, 1, 1, 1)
        a, s = ab.sqrt(), (1 - ab).sqrt().clamp_min(1e-4)
        target = (x_t - a * guess) / s if kind == "epsilon" else (a * x_t - guess) / s
        return (target.to(sample.dtype),)

    return hook


def hooked(pipe, hook):
    pipe.unet.register_forward_hook(hook, with_kwargs=True)
    return pipe


@pytest.fixture(scope="module")
def sd2():
    return tiny_sd2(seed=2)


@pytest.fixture(scope="module")
def sdxl():
    return build_tiny_sdxl_pipeline(seed=2)


@pytest.mark.parametrize("build", [tiny_sd2, build_tiny_sdxl_pipeline], ids=["sd2", "sdxl"])
@pytest.mark.parametrize("kind", ["epsilon", "v_prediction"])
def test_a_unet_trained_on_one_target_is_recognised(build, kind):
    pipe = build(seed=4)
    hooked(pipe, trained_on(kind, alphas(pipe)))
    result = prediction.probe_prediction_type(pipe)
    assert result.kind == kind, result.because
    mine, other = (
        (result.epsilon_error, result.v_error)
        if kind == "epsilon"
        else (result.v_error, result.epsilon_error)
    )
    assert max(mine) < 0.3 and min(other) > 0.5
    assert "test pass" in result.because


def test_zero_terminal_snr_v_model_is_recognised_on_its_own_schedule(sdxl):
    pipe = build_tiny_sdxl_pipeline(seed=5)
    hooked(pipe, trained_on("v_prediction", alphas(pipe, zero_snr=True)))
    result = prediction.probe_prediction_type(pipe, zero_terminal_snr=True)
    assert result.kind == "v_prediction", result.because


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("build", [tiny_sd2, build_tiny_sdxl_pipeline], ids=["sd2", "sdxl"])
def test_random_weights_are_undecided(build, seed):
    result = prediction.probe_prediction_type(build(seed=seed))
    assert result.kind is None
    assert result.because.startswith("a test pass could not tell (error as noise")


@pytest.mark.parametrize(
    ("answer", "words"),
    [
        (lambda x: torch.zeros_like(x), "could not tell"),
        (lambda x: x, "could not tell"),  # copying the input is not predicting noise
        (lambda x: x * 0.5, "could not tell"),
        (lambda x: torch.full_like(x, float("nan")), "non-finite"),
    ],
    ids=["zeros", "identity", "half-identity", "nan"],
)
def test_degenerate_outputs_are_undecided(sd2, answer, words):
    pipe = tiny_sd2(seed=2)
    hooked(pipe, lambda m, args, kwargs, out: (answer(args[0] if args else kwargs["sample"]),))
    result = prediction.probe_prediction_type(pipe)
    assert result.kind is None and words in result.because


def test_decision_rule():
    assert prediction.decide([0.1, 0.05], [1.0, 1.1]) == "epsilon"
    assert prediction.decide([0.9, 1.2], [0.2, 0.15]) == "v_prediction"
    assert prediction.decide([0.1, 0.6], [1.0, 1.1]) is None  # one timestep not convincing
    assert prediction.decide([0.4, 0.4], [0.7, 0.7]) is None  # not far enough apart
    assert prediction.decide([float("nan"), 0.1], [1.0, 1.0]) is None


# Loading: markers, metadata, the test pass, the scheduler -------------------------------------


def sdxl_file(tmp_path: Path, name: str, *, markers=(), metadata=None, seed: int = 2) -> Path:
    tensors = dict(ldm_state_dict(build_tiny_sdxl_pipeline(seed=seed)))
    for marker in markers:
        tensors[marker] = torch.tensor([])  # empty, as NoobAI/kohya write them
    return write_safetensors(tmp_path / name, tensors, metadata)


@pytest.fixture
def no_test_pass(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a file that states its prediction type needs no test pass")

    monkeypatch.setattr(prediction, "probe_prediction_type", refuse)


@pytest.fixture
def every_unet_trained_on(monkeypatch):
    """Make every UNet answer as one trained on the given target (files load new UNets)."""

    def install(kind: str, zero_snr: bool = False):
        hook = trained_on(kind, alphas_from_defaults(zero_snr))
        original = UNet2DConditionModel.forward

        def forward(self, sample, timestep, *args, **kwargs):
            output = original(self, sample, timestep, *args, **kwargs)
            (answer,) = hook(self, (sample, timestep), {}, output)
            if kwargs.get("return_dict", True):
                return UNet2DConditionOutput(sample=answer)
            return (answer,)

        monkeypatch.setattr(UNet2DConditionModel, "forward", forward)

    return install


def alphas_from_defaults(zero_snr: bool) -> torch.Tensor:
    """The SD/SDXL training schedule every shipped scheduler config uses."""
    return DDPMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        rescale_betas_zero_snr=zero_snr,
    ).alphas_cumprod.float()


def test_sdxl_v_pred_and_ztsnr_markers(tmp_path, no_test_pass):
    path = sdxl_file(tmp_path, "noob-style.safetensors", markers=("v_pred", "ztsnr"))
    model = load_model(str(path))
    assert (model.prediction_type, model.zero_terminal_snr) == ("v_prediction", True)
    config = model.pipeline.scheduler.config
    assert config.prediction_type == "v_prediction"
    assert config.rescale_betas_zero_snr is True and config.timestep_spacing == "trailing"
    assert "v_pred marker" in model.prediction_because
    assert "ztsnr marker" in model.prediction_because
    assert model.detected_because.endswith(model.prediction_because + ".")


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        ({"modelspec.prediction_type": "v"}, ("v_prediction", False, "ModelSpec")),
        (
            {"ss_v_parameterization": "True", "ss_zero_terminal_snr": "True"},
            ("v_prediction", True, "ss_v_parameterization"),
        ),
        ({"ss_v_parameterization": "False"}, ("epsilon", False, "ss_v_parameterization")),
    ],
)
def test_sdxl_prediction_from_metadata(tmp_path, no_test_pass, metadata, expected):
    model = load_model(str(sdxl_file(tmp_path, "illustrious.safetensors", metadata=metadata)))
    kind, zsnr, words = expected
    assert (model.prediction_type, model.zero_terminal_snr) == (kind, zsnr)
    assert model.pipeline.scheduler.config.prediction_type == kind
    assert words in model.prediction_because


def test_sdxl_v_model_without_markers_is_found_by_the_test_pass(tmp_path, every_unet_trained_on):
    path = sdxl_file(tmp_path, "unmarked.safetensors")
    every_unet_trained_on("v_prediction")
    model = load_model(str(path))
    assert model.prediction_type == "v_prediction"
    assert model.pipeline.scheduler.config.prediction_type == "v_prediction"
    assert "a test pass of its UNet" in model.prediction_because
    assert "v-prediction" in model.detected_because


def test_the_test_pass_runs_once_per_file(tmp_path, every_unet_trained_on, monkeypatch):
    """Its answer is cached under the file's size and modification time: a later load of the
    same file pays nothing, and a changed file is tested again."""
    path = sdxl_file(tmp_path, "unmarked-twice.safetensors")
    every_unet_trained_on("v_prediction")
    assert load_model(str(path)).prediction_type == "v_prediction"

    def refuse(*args, **kwargs):
        raise AssertionError("the cached answer should have been used")

    monkeypatch.setattr(prediction, "probe_prediction_type", refuse)
    again = load_model(str(path))
    assert again.prediction_type == "v_prediction"
    assert again.pipeline.scheduler.config.prediction_type == "v_prediction"
    assert "a test pass of its UNet" in again.prediction_because

    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    with pytest.raises(AssertionError, match="cached answer"):
        load_model(str(path))


@pytest.mark.parametrize(
    ("kind", "name", "native"),
    [
        ("epsilon", "sd2-finetune.safetensors", 512),  # the guess was v: the test corrects it
        ("v_prediction", "sd2-512-finetune.safetensors", 768),  # the name misled
    ],
)
def test_sd2_prediction_from_the_test_pass(tmp_path, every_unet_trained_on, kind, name, native):
    path = write_safetensors(tmp_path / name, ldm_state_dict(tiny_sd2(seed=2), architecture="sd2"))
    every_unet_trained_on(kind)
    model = load_model(str(path))
    assert (model.prediction_type, model.native_size) == (kind, native)
    assert model.pipeline.scheduler.config.prediction_type == kind


def test_sd2_untrained_file_keeps_the_guess_and_says_why(tmp_path):
    path = write_safetensors(
        tmp_path / "sd2-finetune.safetensors", ldm_state_dict(tiny_sd2(seed=2), architecture="sd2")
    )
    model = load_model(str(path))
    assert model.prediction_type == "v_prediction"  # SD2's usual: 768-v
    because = model.prediction_because
    assert because.startswith("v-prediction assumed")
    assert "a test pass could not tell" in because and because.endswith("so the guess stands")


# Wrong prediction type: grey noise, never NaN ------------------------------------------------


def test_wrong_prediction_type_gives_a_finite_image_not_nan(tmp_path, every_unet_trained_on):
    """A v-model sampled as epsilon makes a washed-out, noisy image: finite, so it is `ok`
    to the NaN watch (the prediction field in the report is where the cause shows)."""
    path = sdxl_file(tmp_path, "v-model.safetensors", metadata={"ss_v_parameterization": "False"})
    every_unet_trained_on("v_prediction")
    model = load_model(str(path))
    assert model.prediction_type == "epsilon"  # wrong on purpose: the metadata lies
    result = generate(
        model,
        GenerationRequest(
            "a lighthouse", steps=3, seed=1, width=64, height=64, output_dir=str(tmp_path)
        ),
        precision=PrecisionSettings(precision="fp32"),
        device="cpu",
    )
    (image,) = result.images
    assert image.status == "ok" and image.non_finite == 0.0


@pytest.mark.parametrize("sampler", ["euler", "euler_a", "dpmpp_2m_karras", "ddim"])
def test_every_sampler_reaches_zero_terminal_snr_for_a_zsnr_model(sampler):
    from app.core.generation import make_scheduler
    from app.core.models import config_folder, scheduler_for

    config = json.loads((config_folder("sdxl") / "scheduler" / "scheduler_config.json").read_text())
    base = scheduler_for(config, "v_prediction", True)
    scheduler = make_scheduler(sampler, base.config, "v_prediction", zero_terminal_snr=True)
    assert scheduler.config.prediction_type == "v_prediction"
    assert scheduler.config.rescale_betas_zero_snr is True
    assert scheduler.config.timestep_spacing == "trailing"
    assert float(scheduler.alphas_cumprod[-1]) < 1e-4  # the last step is pure noise
    scheduler.set_timesteps(10)
    assert int(scheduler.timesteps[0]) == 999  # trailing: sampling starts there
    plain = make_scheduler(sampler, config, "epsilon")
    assert float(plain.alphas_cumprod[-1]) > 1e-3
