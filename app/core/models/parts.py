"""Which model family a part file belongs to (a text encoder, a VAE or a LoRA handed over with a
model or found beside it), read from its header or config alone, and the one sentence that
refuses a part of another family before anything is built or run (`WrongPartError`).

What a part is comes from what already reads it: a text encoder's kind from
`encoders.kinds` (or its config's class), a VAE's latent channels from its decoder's
input, a LoRA's layers against the transformer layouts of the families. Which families take it
is asked of the registry: a text encoder of a kind belongs to the families whose companion files
are named for that kind (`Family.companion_names`: "qwen_3_4b" is a Qwen3, "t5xxl" a T5); a VAE
to the families whose latents have its channels (`Family.latent`) and, where its config states a
latent scale, whose shipped VAE config (`app/resources/configs/<architecture>/vae`) has that scale;
a LoRA to the families whose transformer layout has its layers, or whose pipeline has the text
encoders and denoiser it adapts, or, for a LoRA in diffusers' names, whose diffusers transformer
class has every layer it adapts (`transformer_lora_of`: the class's module names, built once on
PyTorch's meta device, which holds no weights). Shapes and names only: no weights are read or
made here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from app.core import limits, paths
from app.core.encoders import kinds, vaes
from app.core.encoders.kind import TextEncoderKind
from app.core.errors import WrongPartError
from app.core.families import FAMILIES, Family
from app.core.formats.layouts import Shapes

# Two latent scales are the same family's when they differ by less than this (configs round).
_SCALE_TOLERANCE = 1e-3


@dataclass(frozen=True)
class PartOf:
    """What a part file is (`words`: "a Qwen2.5-VL text encoder", "a 4-channel VAE") and the
    titles of the families it belongs to (empty: none HalfSafe runs, or its file does not
    tell)."""

    words: str
    families: tuple[str, ...] = ()

    def described(self) -> str:
        """ "a 4-channel VAE (Stable Diffusion 1.x/2.x's or SDXL's)" """
        if not self.families:
            return self.words
        return f"{self.words} ({self.owners()})"

    def noted(self) -> str:
        """ "a 4-channel VAE, Stable Diffusion 1.x/2.x's or SDXL's" (inside parentheses)"""
        return f"{self.words}, {self.owners()}" if self.families else self.words

    def owners(self) -> str:
        owners = [f"{title}'s" for title in self.families]
        return owners[0] if len(owners) == 1 else ", ".join(owners[:-1]) + " or " + owners[-1]


def model_words(title: str, what: str, model: str | Path) -> str:
    """ "the Flux.1 transformer flux1-dev.safetensors" """
    return f"the {title} {what} {Path(model).name}"


def refuse(
    part: str | Path, found: PartOf, model: str, wanted: str, model_file: str | Path
) -> None:
    """Raise the one sentence: `part` is `found`, but `model` ("the Flux.1 transformer
    flux1-dev.safetensors") needs `wanted` ("its 16-channel VAE (ae)")."""
    raise WrongPartError(
        part, model_file, f"this is {found.described()}, but {model} needs {wanted}."
    )


# The classes a pipeline takes -------------------------------------------------------------------


def class_named(library: str, name: str) -> type | None:
    """The class `name` of `library` ("diffusers" or "transformers"), None where it has none."""
    import importlib

    try:
        found = getattr(importlib.import_module(library), name, None)
    except (ImportError, RuntimeError):  # a lazy module whose import fails names nothing
        return None
    return found if isinstance(found, type) else None


def pipeline_takes(pipeline_class: str) -> dict[str, tuple[type, ...]]:
    """Component -> the classes a diffusers pipeline class takes there (its constructor's
    annotation: one class, or the members of a union; for a modular pipeline, which annotates
    none, the class its default blocks expect there); empty for a class diffusers lacks."""
    import inspect

    found = class_named("diffusers", pipeline_class)
    if found is None:
        return {}
    modular = _modular_takes(found)
    if modular is not None:
        return modular
    takes: dict[str, tuple[type, ...]] = {}
    for name, parameter in inspect.signature(found.__init__).parameters.items():
        classes = _annotated_classes(parameter.annotation)
        if classes:
            takes[name] = classes
    return takes


def _modular_takes(pipeline: type) -> dict[str, tuple[type, ...]] | None:
    """Component -> the class a modular pipeline's default blocks expect there (their
    components' type hints: Flux3ModularPipeline's transformer is a Flux3Transformer2DModel);
    None for a pipeline that is not modular."""
    from diffusers.modular_pipelines import ModularPipeline

    from app.core.families.modular import quiet_assembly

    if not issubclass(pipeline, ModularPipeline):
        return None
    blocks = class_named("diffusers", str(getattr(pipeline, "default_blocks_name", None)))
    if blocks is None:
        return {}
    with quiet_assembly():
        expected = blocks().expected_components
    return {s.name: (s.type_hint,) for s in expected if isinstance(s.type_hint, type)}


def _annotated_classes(annotation: Any) -> tuple[type, ...]:
    """The classes an annotation names: a class, a union of them, or the text of either
    ("AutoencoderKL | AsymmetricAutoencoderKL", where a module postpones its annotations)."""
    import typing

    if isinstance(annotation, type):
        return (annotation,)
    if isinstance(annotation, str):
        names = re.findall(r"[A-Za-z_][A-Za-z0-9_]*(?=\s*(?:\||$|\]|,))", annotation)
        found = (class_named("diffusers", n) or class_named("transformers", n) for n in names)
        return tuple(c for c in found if c is not None)
    return tuple(c for arg in typing.get_args(annotation) for c in _annotated_classes(arg))


def a(name: str) -> str:
    """ "an AutoencoderKL", "a Flux2Transformer2DModel" """
    return f"{'an' if name[:1].upper() in 'AEIOU' else 'a'} {name}"


def class_families(component: str, class_name: str) -> tuple[str, ...]:
    """The titles of the families whose pipeline takes a `class_name` as its `component`."""
    titles = []
    for family in reversed(FAMILIES):
        if family.pipeline_class is None:
            continue
        if component == "transformer" and family.transformer_class == class_name:
            titles.append(family.title)
            continue
        takes = pipeline_takes(family.pipeline_class).get(component, ())
        if any(c.__name__ == class_name for c in takes):
            titles.append(family.title)
    return tuple(titles)


def refuse_class(
    part: Path,
    component: str,
    declared: str,
    title: str,
    model: Path,
    wanted: list[str],
    index: str = "model_index.json",
) -> None:
    """Raise the one sentence: the folder's `index` declares `part` a `declared`, which the
    `title` model's pipeline does not take there (it takes one of `wanted`)."""
    owners = class_families(component, declared)
    owned = f" ({owners[0]}'s)" if len(owners) == 1 else ""
    needs = " or ".join(a(name) for name in wanted)
    raise WrongPartError(
        part,
        model,
        f"{index} declares this {a(declared)}{owned}, but the {title} model "
        f"{model.name} needs {needs}.",
    )


# Text encoders ---------------------------------------------------------------------------------


def _compact(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def _stem_kind(stem: str) -> TextEncoderKind | None:
    """The kind of text encoder a companion file's usual name says ("qwen_3_4b": Qwen3); the
    longest kind that starts the name wins ("qwen_3_vl" would be a Qwen3-VL before a
    Qwen3)."""
    compact = _compact(stem)
    ranked = sorted(kinds.TEXT_ENCODERS, key=lambda k: -len(_compact(k.key)))
    return next((k for k in ranked if compact.startswith(_compact(k.key))), None)


def encoder_families(kind: TextEncoderKind) -> tuple[str, ...]:
    """The titles of the families whose transformer files run with a text encoder of `kind`;
    variants that share a layout and that encoder's file (FLUX.3 base and Klein) are named
    once, by the first in the registry."""

    def stems(family) -> set[str]:
        return {
            stem
            for component, stem in family.companion_names.items()
            if component.startswith("text_encoder") and _stem_kind(stem) is kind
        }

    def named_before(family) -> bool:
        earlier = FAMILIES[: FAMILIES.index(family)]
        return family.layout is not None and any(
            g.layout is family.layout and stems(g) & stems(family) for g in earlier
        )

    return tuple(
        f.title
        for f in reversed(FAMILIES)  # oldest first, as `registry.families_words`
        if stems(f) and not named_before(f)
    )


def text_encoder_part(kind: TextEncoderKind, width: int | None = None) -> PartOf:
    """A text encoder of `kind`, `width` wide where known."""
    size = f"{width}-wide " if width else ""
    return PartOf(f"a {size}{kind.name} text encoder", encoder_families(kind))


def text_encoder_of(shapes: Shapes) -> PartOf | None:
    """What a text-encoder file is, from its header (None: no text encoder read here)."""
    kind = kinds.text_encoder_kind(shapes)
    return None if kind is None else text_encoder_part(kind, kind.embedding_width(shapes))


def text_encoder_class_part(class_name: str, config: Mapping[str, Any]) -> PartOf | None:
    """What a diffusers folder's text encoder is, from its config's class (None: not one of
    the kinds read here)."""
    kind = kinds.class_kind(class_name)
    if kind is None:
        return None
    width = config.get("d_model") or config.get("hidden_size")
    if width is None and isinstance(config.get("text_config"), Mapping):
        width = config["text_config"].get("hidden_size")
    return text_encoder_part(kind, int(width) if isinstance(width, int) else None)


# VAEs ------------------------------------------------------------------------------------------


@cache
def _shipped_scales() -> dict[str, tuple[float, ...]]:
    """Family title -> the latent scales of its shipped VAE configs (families with none are
    left out: their scale is not known here)."""
    scales: dict[str, tuple[float, ...]] = {}
    for candidate in FAMILIES:
        found = []
        for name in candidate.architectures:
            config = paths.resource("configs", name, "vae", "config.json")
            if limits.is_regular_file(config):
                value = limits.read_json_object(config).get("scaling_factor")
                if isinstance(value, (int, float)):
                    found.append(float(value))
        if found:
            scales[candidate.title] = tuple(found)
    return scales


def vae_part(channels: int, scale: float | None = None, layout: str = "") -> PartOf:
    """A VAE making `channels`-channel latents, with the latent `scale` its config states
    (None: its file does not say), in `layout` ("": the original one)."""
    if layout:
        return PartOf(f"a {channels}-channel VAE in {layout}")
    families = [f.title for f in reversed(FAMILIES) if f.latent.channels == channels]
    if scale is not None:
        scales = _shipped_scales()
        families = [t for t in families if any(same_scale(scale, s) for s in scales.get(t, ()))]
        return PartOf(f"a {channels}-channel VAE with a latent scale of {scale:g}", tuple(families))
    return PartOf(f"a {channels}-channel VAE", tuple(families))


def same_scale(a: float, b: float) -> bool:
    return abs(a - b) <= _SCALE_TOLERANCE * max(abs(a), abs(b))


def vae_file_of(shapes: Shapes) -> PartOf | None:
    """What a VAE file is, from its header (None: it holds no VAE)."""
    channels = vaes.channels_of_file(shapes)
    if channels is None:
        return None
    return vae_part(channels, layout=vaes.layout_of_file(shapes))


def vae_folder_of(config: Mapping[str, Any]) -> PartOf | None:
    """What a diffusers VAE folder is, from its config.json (None: no latent channels)."""
    channels = config.get("latent_channels") or config.get("z_dim")
    if not isinstance(channels, int):
        return None
    scale = config.get("scaling_factor")
    layout = vaes.layout_of_class(str(config.get("_class_name")))
    return vae_part(channels, float(scale) if isinstance(scale, (int, float)) else None, layout)


@dataclass(frozen=True)
class VaeAt:
    """A separate VAE file or folder as its header or config.json tells it: its latent
    channels, the latent scale its config states (None: a file, which does not say) and its
    layout ("": the original one)."""

    part: PartOf
    channels: int
    scale: float | None
    layout: str


def vae_at(path: Path) -> VaeAt | None:
    """What the VAE at `path` is, from a file's header or a folder's config.json; None where
    neither tells (no such path, a pickle, a file that holds no VAE: the loader's to refuse).
    Raises what reading a header raises for a damaged file."""
    from app.core.checkpoint import is_pickle_file
    from app.core.checkpoint.header import read_header

    if path.is_dir():
        config_file = path / "config.json"
        if not limits.is_regular_file(config_file):
            return None
        try:
            config = limits.read_json_object(config_file)
        except (OSError, ValueError):
            return None  # the loader names what is wrong with it
        part = vae_folder_of(config)
        channels = config.get("latent_channels") or config.get("z_dim")
        if part is None or not isinstance(channels, int):
            return None
        scale = config.get("scaling_factor")
        return VaeAt(
            part,
            channels,
            float(scale) if isinstance(scale, (int, float)) else None,
            vaes.layout_of_class(str(config.get("_class_name"))),
        )
    if not path.is_file() or is_pickle_file(path):
        return None
    shapes = read_header(path).shapes()
    channels = vaes.channels_of_file(shapes)
    if channels is None:
        return None
    layout = vaes.layout_of_file(shapes)
    return VaeAt(vae_part(channels, layout=layout), channels, None, layout)


def check_vae(
    path: Path,
    *,
    channels: int,
    scales: tuple[float, ...] = (),
    layout: str | None = None,
    model: str,
    model_file: Path,
    wanted: str | None = None,
) -> None:
    """Refuse the VAE at `path` (header or config only) when its latents are not the model's:
    other channels; another layout (`layout`: the model's VAE's, "" the original one, None:
    any); or a latent scale its config states that is another family's and none of
    `scales` (the model's), which is another latent space with the same channels. `wanted` is
    what the model needs in words ("its 16-channel VAE (ae)"), `model` the model in words
    (`model_words`). A scale no family ships is a fine-tune's own: not refused."""
    found = vae_at(path)
    if found is None:
        return
    want = wanted or f"a {channels}-channel VAE"
    if found.channels != channels or (layout is not None and found.layout != layout):
        refuse(path, found.part, model, want, model_file)
    if (
        found.scale is not None
        and scales
        and found.part.families
        and not any(same_scale(found.scale, s) for s in scales)
    ):
        shown = " or ".join(f"{s:g}" for s in dict.fromkeys(scales))
        refuse(path, found.part, model, f"{want} with a latent scale of {shown}", model_file)


def family_scales(title: str) -> tuple[float, ...]:
    """The latent scales of a family's shipped VAE configs (empty: none shipped)."""
    return _shipped_scales().get(title, ())


# LoRAs -----------------------------------------------------------------------------------------

_LORA_ENDINGS = (
    ".lora_down.weight",
    ".lora_up.weight",
    ".lora_A.weight",
    ".lora_B.weight",
    ".lora.down.weight",
    ".lora.up.weight",
    ".alpha",
)
_TRANSFORMER_PREFIXES = ("lora_unet_", "diffusion_model.", "transformer.", "lora_transformer_")


def _lora_layers(keys: Iterable[str]) -> set[str]:
    layers = set()
    for key in keys:
        for ending in _LORA_ENDINGS:
            if key.endswith(ending):
                layers.add(key[: -len(ending)])
                break
    return layers


def _in_layout(layers: set[str], family: Family) -> bool:
    """Whether a LoRA's layers (kohya's underscores or dotted names) adapt one of the layers
    that mark `family`'s transformer layout."""
    layout = family.layout
    if layout is None:
        return False
    marks = {_compact(m.removesuffix(".weight")) for m in layout.markers}
    for layer in layers:
        name = layer
        for prefix in _TRANSFORMER_PREFIXES:
            name = name.removeprefix(prefix)
        if _compact(name) in marks:
            return True
    return False


def _text_encoders(layers: set[str]) -> int:
    """How many text encoders a LoRA adapts (kohya's lora_te_, lora_te1_, lora_te2_; diffusers'
    text_encoder., text_encoder_2.)."""
    if any(layer.startswith(("lora_te2_", "text_encoder_2.")) for layer in layers):
        return 2
    if any(layer.startswith(("lora_te_", "lora_te1_", "text_encoder.")) for layer in layers):
        return 1
    return 0


def _adapts_unet(layers: set[str]) -> bool:
    return any(
        layer.startswith(("unet.", "lora_unet_down_blocks", "lora_unet_up_blocks"))
        or layer.startswith(("lora_unet_input_blocks", "lora_unet_output_blocks"))
        or layer.startswith(("lora_unet_mid_block", "lora_unet_middle_block"))
        for layer in layers
    )


def cross_attention_width(tensors: Mapping[str, Any]) -> int | None:
    """The text width a UNet LoRA's cross-attention keys read (its attn2.to_k down factor's
    input), None where it adapts none."""
    for key, tensor in tensors.items():
        if re.search(r"attn2[._]to_k", key) and key.endswith(
            (".lora_down.weight", ".lora_A.weight", ".lora.down.weight")
        ):
            shape = tuple(getattr(tensor, "shape", ()))
            if len(shape) == 2:
                return int(shape[1])
    return None


def lora_of(keys: Iterable[str]) -> PartOf:
    """What a LoRA is made for, from its key names: the families whose transformer layout it
    adapts; else, for a UNet LoRA with text-encoder layers, the UNet families whose pipeline
    has as many text encoders (empty: its names do not tell)."""
    layers = _lora_layers(keys)
    transformer = tuple(f.title for f in reversed(FAMILIES) if _in_layout(layers, f))
    if transformer:
        return PartOf("a LoRA", transformer)
    encoders = _text_encoders(layers)
    if _adapts_unet(layers) and encoders:
        stand_in = SimpleNamespace(unet=True, text_encoder=True, text_encoder_2=None)
        if encoders == 2:
            stand_in.text_encoder_2 = True
        owner = next(
            (f for f in FAMILIES if f.transformer_class is None and f.owns(stand_in)), None
        )
        if owner is not None:
            return PartOf("a LoRA", (owner.title,))
    return PartOf("a LoRA")


def transformer_lora_of(keys: Iterable[str]) -> PartOf:
    """What a LoRA in diffusers' names (`transformer.<module>.lora_A.weight`) is made for: the
    families whose diffusers transformer class has every module it adapts (empty: a key outside
    that layout, or no family has them all)."""
    modules: set[str] = set()
    for layer in _lora_layers(keys):
        if not layer.startswith("transformer."):
            return PartOf("a LoRA")
        modules.add(_numbered(layer.removeprefix("transformer.")))
    if not modules:
        return PartOf("a LoRA")
    owners = [
        f.title
        for f in reversed(FAMILIES)
        if f.transformer_class and modules <= _class_modules(f.transformer_class)
    ]
    return PartOf("a LoRA", tuple(owners))


def _numbered(name: str) -> str:
    """A module's name with each block number as `#` (blocks.12.attn -> blocks.#.attn)."""
    return re.sub(r"(?<=\.)\d+(?=\.|$)", "#", name)


@cache
def _class_modules(class_name: str) -> frozenset[str]:
    """The module names (numbered as `_numbered`) of diffusers' `class_name` built with its
    default config on the meta device: no weights, a fraction of a second; empty where it
    cannot be built so."""
    import warnings

    import torch

    found = class_named("diffusers", class_name)
    if found is None:
        return frozenset()
    try:
        with warnings.catch_warnings(), torch.device("meta"):
            warnings.simplefilter("ignore")
            module = found()
    except Exception:  # noqa: BLE001 - a class that needs arguments tells nothing
        return frozenset()
    return frozenset(_numbered(name) for name, _ in module.named_modules() if name)
