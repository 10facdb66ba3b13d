"""Model components as data: what each part of a pipeline is, which setting governs its dtype,
and the words the user sees for it.

The health check, generation, the precision plan and the reports loop over these descriptions
instead of naming components in code, so a model family with other parts (a DiT `transformer`
instead of a `unet`, a third text encoder) is described here once. The module is plain data and
stays cheap to import (no torch).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

FP16_MAX = 65504.0  # the largest finite fp16 value; everything past it becomes inf


class Role(str, Enum):
    """What a component does in a pipeline run, in run order."""

    # An LLM that writes the detailed prompt from the user's short one, before it is encoded.
    PROMPT_UPSAMPLER = "prompt_upsampler"
    TEXT_ENCODER = "text_encoder"
    VAE_ENCODER = "vae_encoder"  # an input picture into latents (image-to-image, inpainting)
    DENOISER = "denoiser"
    VAE = "vae"


@dataclass(frozen=True)
class Component:
    """One pipeline part, named as the diffusers pipeline names it."""

    name: str
    role: Role
    setting: str  # the per-component precision setting that governs its dtype
    words: str  # what the user reads ("second text encoder")
    does: str  # what it does, for someone who has never looked inside a pipeline
    has_attention: bool  # whether "upcast attention" can be a fix for it
    # The pipeline component it is a part of, where it is not one of its own: the VAE's
    # encoder runs in the VAE's module, at the VAE's dtype, and is fixed by the VAE's fixes.
    part_of: str | None = None
    # Whether its setting is another part's first (Anima's text conditioner runs at the
    # denoiser's): a setting is named after that part where the model is not known.
    borrows_setting: bool = False

    @property
    def module(self) -> str:
        """The pipeline component whose module and dtype it runs in."""
        return self.part_of or self.name

    @property
    def title(self) -> str:
        """The words with a capital first letter, for the start of a sentence or a table."""
        return self.words[0].upper() + self.words[1:]


_DENOISES = "removes noise step by step; the slow, large part"
_ALL = (
    # FLUX.3's prompt upsampler (a Qwen3.5 LLM): it generates the prompt, token by token, that
    # the text encoder then reads; it runs first, once per prompt.
    Component(
        "prompt_upsampler",
        Role.PROMPT_UPSAMPLER,
        "prompt_upsampler_precision",
        "prompt upsampler",
        "an LLM that writes your short prompt out as the detailed caption the model was "
        "trained on, before the text encoder reads it",
        False,
    ),
    Component(
        "text_encoder",
        Role.TEXT_ENCODER,
        "text_encoder_precision",
        "text encoder",
        "turns the prompt into numbers the model understands",
        False,
    ),
    Component(
        "text_encoder_2",
        Role.TEXT_ENCODER,
        "text_encoder_2_precision",
        "second text encoder",
        "a second prompt encoder: SDXL's and SD3's larger CLIP, Flux's T5",
        False,
    ),
    Component(
        "text_encoder_3",
        Role.TEXT_ENCODER,
        "text_encoder_3_precision",
        "third text encoder",
        "SD3's T5 prompt encoder, the one known to overflow in fp16",
        False,
    ),
    # Anima's LLM adapter: it reads the text encoder's states once per prompt and gives the
    # transformer what it attends to. ComfyUI and Forge keep it inside the diffusion model's
    # file (`llm_adapter.*`), so the denoiser's setting governs it.
    Component(
        "text_conditioner",
        Role.TEXT_ENCODER,
        "unet_precision",
        "text conditioner",
        "turns the text encoder's output into what the transformer reads (Anima's LLM adapter)",
        False,
        borrows_setting=True,
    ),
    Component(
        "vae_encoder",
        Role.VAE_ENCODER,
        "vae_precision",
        "VAE encoder",
        "turns the input picture into latents (image-to-image and inpainting)",
        True,
        part_of="vae",
    ),
    Component("unet", Role.DENOISER, "unet_precision", "UNet", _DENOISES, True),
    # A DiT's denoiser; the one denoiser setting governs it (DESIGN.md).
    Component("transformer", Role.DENOISER, "unet_precision", "transformer", _DENOISES, True),
    Component(
        "vae", Role.VAE, "vae_precision", "VAE", "turns the finished latents into pixels", True
    ),
)
COMPONENTS: dict[str, Component] = {c.name: c for c in _ALL}
RUN_ORDER: tuple[str, ...] = tuple(COMPONENTS)
# The components a pipeline has as attributes of its own, in run order (not the parts of one).
PIPELINE_PARTS: tuple[str, ...] = tuple(c.name for c in _ALL if c.part_of is None)


@dataclass(frozen=True)
class ComponentSetting:
    """A per-component precision setting (the components it governs name it: `setting`), and
    everything said of it: its label and help in the settings (`settings.schema`), its PNG key
    (`words.infotext`), what `auto` follows, and why a recommendation that follows its base
    gives it that dtype (`hardware.recommend`). A part with a setting of its own (a fourth text
    encoder) is one `Component` and one of these."""

    key: str  # "text_encoder_2_precision"
    label: str  # "Second text encoder precision"
    help: str
    png: str  # "Text encoder 2 precision"
    png_meaning: str  # "second text encoder dtype"
    follows: str | None  # the setting `auto` falls back to (None: the base precision)
    why: str  # a recommendation's reason where it follows its base


# In the order the settings page, the PNG and a recommendation show them. The second and third
# text encoders follow the first, so one switch still covers them all (as it did before they
# split); every other setting follows the base precision.
COMPONENT_SETTINGS: tuple[ComponentSetting, ...] = (
    ComponentSetting(
        "unet_precision",
        "UNet precision",
        "Override for the denoising UNet (or transformer), the largest and slowest part; it "
        "also sets a text conditioner kept in the same file. 'auto' follows "
        "Precision. Running it in fp32 roughly doubles the time of every step.",
        "UNet precision",
        "denoiser dtype",
        None,
        "Follows precision: the UNet runs every step, so its dtype sets the speed",
    ),
    ComponentSetting(
        "vae_precision",
        "VAE precision",
        "Override for the VAE that turns latents into pixels. SDXL's original VAE overflows "
        "in fp16; fp32 here costs little time (it runs once per image) and some memory.",
        "VAE precision",
        "VAE dtype",
        None,
        "Follows precision",
    ),
    ComponentSetting(
        "text_encoder_precision",
        "Text encoder precision",
        "Override for the text encoder (the first one on SDXL). Text encoders run once per "
        "prompt, so fp32 here is cheap in time but holds more memory.",
        "Text encoder precision",
        "text encoder dtype",
        None,
        "Follows precision: text encoders run once per prompt; the health check moves one to "
        "fp32 only if a model's encoder overflows",
    ),
    ComponentSetting(
        "text_encoder_2_precision",
        "Second text encoder precision",
        "Override for SDXL's second, larger text encoder (OpenCLIP bigG). 'auto' follows the "
        "text encoder precision. A fix for one encoder leaves the other alone.",
        "Text encoder 2 precision",
        "second text encoder dtype",
        "text_encoder_precision",
        "Follows the text encoder: SDXL's second encoder moves on its own only if it overflows",
    ),
    ComponentSetting(
        "text_encoder_3_precision",
        "Third text encoder precision",
        "Override for SD3's third text encoder (T5-XXL), the one known to overflow in fp16. "
        "'auto' follows the text encoder precision.",
        "Text encoder 3 precision",
        "third text encoder dtype",
        "text_encoder_precision",
        "Follows the text encoder: SD3's T5 encoder moves on its own only if it overflows",
    ),
    ComponentSetting(
        "prompt_upsampler_precision",
        "Prompt upsampler precision",
        "Override for the prompt upsampler, the LLM (FLUX.3's Qwen3.5) that writes a short "
        "prompt out before it is encoded. 'auto' follows the text encoder precision. It "
        "runs once per prompt, generating one token at a time.",
        "Prompt upsampler precision",
        "prompt upsampler dtype",
        "text_encoder_precision",
        "Follows the text encoder: the prompt upsampler moves on its own only if it overflows",
    ),
)
COMPONENT_SETTING: dict[str, ComponentSetting] = {s.key: s for s in COMPONENT_SETTINGS}
# Which setting a per-component setting falls back to when left on `auto`, where it is not the
# base precision.
SETTING_FOLLOWS = {s.key: s.follows for s in COMPONENT_SETTINGS if s.follows is not None}


def component(name: str) -> Component:
    return COMPONENTS[name]


def module_of(name: str) -> str:
    """The pipeline component `name` runs in: "vae_encoder" -> "vae", "unet" -> "unet"."""
    found = COMPONENTS.get(name)
    return found.module if found else name


# The layers of the VAE each of its checked parts runs (paths in the VAE module): its encoder
# for a job that starts from a picture, its decoder for every picture made.
VAE_LAYERS = {"vae_encoder": ("encoder", "quant_conv"), "vae": ("decoder", "post_quant_conv")}


def runs_layer(name: str, path: str) -> bool:
    """Whether the checked part `name` runs the layer `path` of its module (`module_of`): the
    VAE's encoder none of its decoder's layers, and the other way round; every other part
    every layer of its module."""
    if name not in VAE_LAYERS:
        return True
    others = (p for part, prefixes in VAE_LAYERS.items() if part != name for p in prefixes)
    return not any(path == p or path.startswith(p + ".") for p in others)


def words(name: str) -> str:
    """'vae' -> 'VAE'; an unknown name is shown as it is."""
    found = COMPONENTS.get(name)
    return found.words if found else name


def join_words(names: list[str] | tuple[str, ...]) -> str:
    """['unet', 'vae'] -> 'UNet and VAE'."""
    parts = [words(n) for n in names]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def in_run_order(names) -> list[str]:
    return sorted(names, key=lambda n: RUN_ORDER.index(n) if n in RUN_ORDER else len(RUN_ORDER))


def of_role(names, role: Role) -> list[str]:
    return [n for n in in_run_order(names) if n in COMPONENTS and COMPONENTS[n].role is role]


class Status(str, Enum):
    """A component's health at one precision."""

    OK = "ok"
    AT_RISK = "at_risk"
    OVERFLOW = "overflow"
    NAN = "nan"
    BROKEN_WEIGHTS = "broken_weights"

    @property
    def failed(self) -> bool:
        return self in (Status.OVERFLOW, Status.NAN, Status.BROKEN_WEIGHTS)


class Verdict(str, Enum):
    HEALTHY = "healthy"
    FIXABLE = "fixable"
    BROKEN = "broken"
