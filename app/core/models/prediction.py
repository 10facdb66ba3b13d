"""Whether a UNet predicts noise (epsilon) or velocity (v), tested with one forward pass.

A file that states its prediction type (marker keys, metadata, an A1111 .yaml) needs no test:
`architecture.read_prediction` reads it. Otherwise the weights are asked directly.

Why the test works. A known latent x0 is noised to x_t = a*x0 + s*e (a = sqrt(alpha_bar),
s = sqrt(1 - alpha_bar), e the known noise) at two timesteps, and the UNet's output o is
compared with both targets it could have been trained on: the noise e, and the velocity
v = a*e - s*x0. Each error is relative to its own target's energy, so an output that knows
nothing (zeros, or noise unrelated to the input) scores about 1 on both, and the test can only
decide when one interpretation explains the output far better than the other. The targets are
far apart where it matters: for a unit-variance latent |e - v|^2 / |e|^2 = (1 - a)^2 + s^2,
which is 1.0 at alpha_bar 0.25 and 0.59 at 0.5, so a model trained on one scores about 1 (or
worse) under the other, while scoring on its own target only what its denoising error costs.
The middle timestep (alpha_bar ~ 0.5) also rules out the shortcut "output = input": there
x_t is 0.7 correlated with e and not at all with v, and copying it scores 0.59 on e, above
the threshold below; the noisier timestep (alpha_bar ~ 0.25) separates real models the most.
A model that fails to be decisive at either timestep, whose output is not finite, or whose
errors are both large (an untrained or broken model), gives "undecided": the loader then keeps
the family's usual choice and says so, never a confident guess.

x0 is a smooth latent (a few low-frequency waves per channel, unit variance), which is what
natural images look like to the VAE's latent space at a coarse scale and is easy for a real
model to partly recover, so a v-model's error on v stays well below 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from app.core.precision.layerwise import each_layer_in_fp32

# alpha_bar of the two test timesteps, and the decision rule (see the module docstring).
TEST_ALPHA_BARS = (0.5, 0.25)
MAX_ERROR = 0.5  # the winning interpretation's relative error, at each timestep
MAX_RATIO = 0.5  # ... and at most this fraction of the other interpretation's error
LATENT_SIZE = 16  # latent pixels a side (128 px): cheap, and enough for a 3-level UNet


_SCHEDULE = ("num_train_timesteps", "beta_start", "beta_end", "beta_schedule", "trained_betas")


@dataclass(frozen=True)
class PredictionTest:
    """The outcome of the test forward pass."""

    kind: str | None  # "epsilon", "v_prediction", or None when undecided
    epsilon_error: tuple[float, ...]  # relative squared error of the output read as noise
    v_error: tuple[float, ...]  # ... read as velocity; one per test timestep
    because: str  # words completing "...; ", saying what the test found


def smooth_latent(channels: int, size: int, seed: int = 0):
    """A (1, channels, size, size) fp32 latent of a few low-frequency waves, unit variance per
    channel: a stand-in for an image's latent that a real denoiser can partly recover."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    grid = torch.linspace(0, 1, size)
    y, x = torch.meshgrid(grid, grid, indexing="ij")
    latent = torch.zeros(1, channels, size, size)
    for c in range(channels):
        for _ in range(3):
            fy, fx = torch.randint(0, 3, (2,), generator=generator).tolist()
            phase = float(torch.rand((), generator=generator)) * 2 * math.pi
            latent[0, c] += torch.cos(2 * math.pi * (fy * y + fx * x) / 2 + phase)
        latent[0, c] += float(torch.randn((), generator=generator)) * 0.5  # a channel mean
        latent[0, c] = (latent[0, c] - latent[0, c].mean()) / (latent[0, c].std() + 1e-6)
    return latent


def probe_timesteps(alphas_cumprod) -> list[int]:
    """The training timesteps whose alpha_bar is nearest to each of TEST_ALPHA_BARS."""
    return [int((alphas_cumprod - target).abs().argmin()) for target in TEST_ALPHA_BARS]


def decide(epsilon_error: list[float], v_error: list[float]) -> str | None:
    """The decision rule on per-timestep relative errors: a kind, or None when undecided."""
    pairs = list(zip(epsilon_error, v_error, strict=True))
    if not all(math.isfinite(e) and math.isfinite(v) for e, v in pairs):
        return None
    for kind, mine, other in (("epsilon", 0, 1), ("v_prediction", 1, 0)):
        if all(p[mine] < MAX_ERROR and p[mine] < MAX_RATIO * p[other] for p in pairs):
            return kind
    return None


def probe_prediction_type(pipeline, *, zero_terminal_snr: bool = False) -> PredictionTest:
    """Run the pipeline's UNet once (a batch of two timesteps, empty prompt) and decide whether
    it predicts epsilon or v. Runs on the UNet's device and dtype, on the calling thread, with
    no gradients; changes nothing in the pipeline. An SD-size UNet at 16x16 latents costs
    about one sampling step at 128 px.
    """
    import torch
    from diffusers import DDPMScheduler

    from app.core.families import family_of

    unet = pipeline.unet
    from app.core.precision.streaming import device_of

    device, dtype = device_of(unet), unet.dtype
    config = pipeline.scheduler.config
    schedule = DDPMScheduler(  # only for the model's noise schedule
        **{k: config[k] for k in _SCHEDULE if k in config},
        rescale_betas_zero_snr=zero_terminal_snr,
        clip_sample=False,
    )
    alphas = schedule.alphas_cumprod.float()
    steps = probe_timesteps(alphas)
    levels = len(unet.config.block_out_channels)
    size = max(LATENT_SIZE, 2 ** (levels - 1))
    channels = unet.config.in_channels
    if channels != unet.config.out_channels:
        return _undecided([], [], "the test pass does not apply to an inpainting UNet")
    x0 = smooth_latent(channels, size).expand(len(steps), -1, -1, -1)
    noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(1))
    a = alphas[steps].sqrt().view(-1, 1, 1, 1)
    s = (1 - alphas[steps]).sqrt().view(-1, 1, 1, 1)
    noisy = a * x0 + s * noise
    velocity = a * noise - s * x0

    family = family_of(pipeline)
    wide = device.type == "cpu" and dtype != torch.float32
    if wide:  # CPUs run fp16/bf16 many times slower than fp32 (and fp16 may overflow)
        dtype = torch.float32
    modules = [getattr(pipeline, name, None) for name in family.components(pipeline)]
    with torch.no_grad(), each_layer_in_fp32(modules if wide else []):
        conditioning = family.encode(pipeline, "", "", device, False)  # one empty prompt
        for key in list(conditioning):
            conditioning[f"negative_{key}"] = conditioning[key]  # the batch's two rows alike
        extra = family.denoiser_inputs(conditioning, size * 8, device)
        output = (
            unet(
                noisy.to(device, dtype),
                torch.tensor(steps, device=device),
                **_cast(extra, dtype),
                return_dict=False,
            )[0]
            .float()
            .cpu()
        )

    def error(target) -> list[float]:
        return [
            float(((output[i] - target[i]) ** 2).mean() / (target[i] ** 2).mean())
            for i in range(len(steps))
        ]

    eps_error, v_error = error(noise), error(velocity)
    kind = decide(eps_error, v_error)
    numbers = f"error as noise {_list(eps_error)}, as velocity {_list(v_error)}"
    if not all(map(math.isfinite, eps_error + v_error)):
        return _undecided(eps_error, v_error, "the test pass gave non-finite values")
    if kind is None:
        return _undecided(eps_error, v_error, f"a test pass could not tell ({numbers})")
    words = "v-prediction" if kind == "v_prediction" else "epsilon prediction"
    return PredictionTest(
        kind,
        tuple(eps_error),
        tuple(v_error),
        f"{words} because a test pass of its UNet on a noised latent matched it ({numbers})",
    )


def _undecided(eps_error: list[float], v_error: list[float], because: str) -> PredictionTest:
    return PredictionTest(None, tuple(eps_error), tuple(v_error), because)


def _list(values: list[float]) -> str:
    return "/".join(f"{v:.2f}" for v in values)


def _cast(value: Any, dtype) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, dict):
        return {k: _cast(v, dtype) for k, v in value.items()}
    return value


def prediction_summary(model) -> dict[str, Any]:
    """The check report's `model.prediction`: what the model predicts, whether its schedule
    reaches zero terminal SNR, and one clause saying how HalfSafe knows (plain data)."""
    return {
        "type": getattr(model, "prediction_type", "epsilon"),
        "zero_terminal_snr": bool(getattr(model, "zero_terminal_snr", False)),
        "because": getattr(model, "prediction_because", "") or "",
    }
