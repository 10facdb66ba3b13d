"""A host of the stages built from plain torch modules (`app.core.run.host.Host`), no diffusers
pipeline and no family: a tiny text encoder reading characters, a tiny denoiser of residual
feed-forward blocks stepped by Euler through its timesteps with classifier-free guidance, and a
tiny decoder. `plant` puts an fp16 overflow in one of the denoiser's layers: its output passes
65504 in fp16 while staying finite in fp32, and the layer after it brings the values back.

The host places plans with HalfSafe's module placement (`precision.placement.PlacedPipeline`
over a plain holder of the three modules: each in its dtype, islands and clamps as the check
proves them); everything it calls is its own code, and the stage runner calls none of it but
that placement (a stage's twin, which it makes only for a call that asks for one, is the
holder's shallow copy)."""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import nn

from app.core.components import module_of
from app.core.precision import PlacedPipeline, PrecisionPlan
from app.core.precision.plan import dtype_name
from app.core.run.host import Prompt

WIDTH = 16  # the text encoder's and the denoiser's width
TOKENS = 8  # tokens a prompt is read as
CHANNELS = 4  # latent channels
SCALE = 8  # pixels per latent cell
GUIDANCE = 5.0
PLANTED = "blocks.1.ff.up"  # the layer `plant` makes overflow in fp16
BACK = "blocks.1.ff.down"  # the layer that brings its values back in range
PLANT_FACTOR = 1e5


class TextEncoder(nn.Module):
    """Characters -> (B, TOKENS, WIDTH) states: an embedding, a norm and a feed-forward."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(128, WIDTH)
        self.norm = nn.LayerNorm(WIDTH)
        self.fc1 = nn.Linear(WIDTH, 2 * WIDTH)
        self.fc2 = nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, ids):
        hidden = self.embed(ids)
        return hidden + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(hidden))))


class FeedForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(WIDTH, 2 * WIDTH)
        self.act = nn.GELU()
        self.down = nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x):
        return self.down(self.act(self.up(x)))


class Block(nn.Module):
    """A residual block: the text's mean state added, a norm and a feed-forward."""

    def __init__(self) -> None:
        super().__init__()
        self.text = nn.Linear(WIDTH, WIDTH)
        self.norm = nn.LayerNorm(WIDTH)
        self.ff = FeedForward()

    def forward(self, hidden, text):
        hidden = hidden + self.text(text.mean(dim=1))[:, None, :]
        return hidden + self.ff(self.norm(hidden))


class Denoiser(nn.Module):
    """(latents (B, C, h, w), timestep, text states) -> the noise predicted, (B, C, h, w)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv_in = nn.Conv2d(CHANNELS, WIDTH, 3, padding=1)
        self.time = nn.Linear(1, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.conv_out = nn.Conv2d(WIDTH, CHANNELS, 3, padding=1)

    def forward(self, latents, timestep, text):
        b, _, h, w = latents.shape
        hidden = self.conv_in(latents).flatten(2).transpose(1, 2)
        step = timestep.reshape(1, 1).to(hidden.dtype) / 1000
        hidden = hidden + self.time(step)[:, None, :]
        for block in self.blocks:
            hidden = block(hidden, text)
        return self.conv_out(hidden.transpose(1, 2).reshape(b, WIDTH, h, w))


class Decoder(nn.Module):
    """Latents (B, C, h, w) -> pixels (B, 3, SCALE h, SCALE w) in [-1, 1]."""

    def __init__(self) -> None:
        super().__init__()
        self.conv_in = nn.Conv2d(CHANNELS, WIDTH, 3, padding=1)
        self.up = nn.Upsample(scale_factor=SCALE)
        self.conv_out = nn.Conv2d(WIDTH, 3, 3, padding=1)

    def forward(self, latents):
        return torch.tanh(self.conv_out(self.up(torch.nn.functional.silu(self.conv_in(latents)))))


def build(seed: int = 0) -> types.SimpleNamespace:
    """The three modules, seeded, in fp32, as the host's parts (named as HalfSafe's plans
    name components)."""
    torch.manual_seed(seed)
    parts = types.SimpleNamespace(text_encoder=TextEncoder(), unet=Denoiser(), vae=Decoder())
    for module in vars(parts).values():
        module.eval().requires_grad_(False)
    return parts


def plant(parts: types.SimpleNamespace) -> types.SimpleNamespace:
    """The planted layer's weights scaled past fp16's range and the next one's scaled back:
    finite in fp32, inf in fp16 from `PLANTED`'s output on."""
    with torch.no_grad():
        parts.unet.get_submodule(PLANTED).weight.mul_(PLANT_FACTOR)
        parts.unet.get_submodule(BACK).weight.div_(PLANT_FACTOR)
    return parts


def token_ids(text: str) -> torch.Tensor:
    """A prompt as TOKENS character codes (cut, padded with zeros)."""
    codes = [ord(c) % 128 for c in text[:TOKENS]]
    return torch.tensor(codes + [0] * (TOKENS - len(codes)))


class TorchHost:
    """The plain modules of `parts` (`build`) as a host of the check's stages on the CPU."""

    denoiser = "unet"

    def __init__(self, parts: types.SimpleNamespace) -> None:
        self._parts = parts
        self.device = torch.device("cpu")
        # What places a plan on the modules; its first plan places nothing.
        first = PrecisionPlan(device="cpu", dtypes=dict.fromkeys(self.components(), "fp32"))
        self.placed = PlacedPipeline(parts, first, components=())

    @property
    def parts(self) -> Any:
        return self._parts

    def components(self) -> list[str]:
        return ["text_encoder", "unet", "vae"]

    def text_encoders(self, plan) -> list[str]:
        return ["text_encoder"] if "text_encoder" in plan.dtypes else []

    def loaded(self, name: str) -> Any:
        return getattr(self._parts, module_of(name))

    def counted(self, name: str) -> Any:
        return self.placed[name]

    def stored_dtype(self, name: str) -> str:
        return dtype_name(next(self.loaded(name).parameters()).dtype)

    def compute_dtype(self, name: str, plan) -> str | None:
        return plan.dtypes.get(module_of(name))

    def probe_timesteps(self, steps: int, scheduler: str, size: int) -> list[float]:
        schedule = torch.linspace(999, 0, steps).tolist()
        return [schedule[0], schedule[steps // 2], schedule[-1]]

    def encode(self, stage, prompt: Prompt, references: Any = None) -> Any:
        ids = torch.stack([token_ids(prompt.text), token_ids(prompt.negative)])
        return self.placed["text_encoder"](ids)

    def denoise(
        self, stage, conditioning: Any, size: int, timesteps: list[float], references: Any = None
    ) -> Any:
        return stepped(self.placed["unet"], conditioning, size, timesteps)

    def decode(self, stage, latents: Any) -> Any:
        return self.placed["vae"](latents)


def stepped(denoiser, conditioning, size: int, timesteps: list[float]):
    """Seeded noise at `size` px stepped by Euler through `timesteps` (sigma = t / 1000), one
    call of `denoiser` a timestep on the prompt's and the negative prompt's batch, guided."""
    cells = size // SCALE
    generator = torch.Generator().manual_seed(1)
    latents = torch.randn(1, CHANNELS, cells, cells, generator=generator)
    sigmas = [t / 1000 for t in timesteps] + [0.0]
    for index, timestep in enumerate(timesteps):
        both = denoiser(latents.repeat(2, 1, 1, 1), torch.tensor(float(timestep)), conditioning)
        text, empty = both.float().chunk(2)
        noise = empty + GUIDANCE * (text - empty)
        latents = latents + (sigmas[index + 1] - sigmas[index]) * noise
    return latents
