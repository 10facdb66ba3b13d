"""Transformer files in another project's key layout, the part every layout shares: what a file
is and what it runs with (`Need`, `SplitModel`), a layout's description (`Layout`), reading a
config from tensor shapes within real models' sizes, and the one key table per layout that maps
its names to diffusers' in both directions (`to_diffusers`, `to_original`).

Each family's own layout (its markers, its config reader, its key table) lives in its module
under `app/core/families/`; `split.py` finds which one a file is in and its companions. Shapes
only: no torch here except in the key mapping's tensor moves.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from app.core import config_limits, limits

Shapes = Mapping[str, tuple[int, ...]]
Row = tuple[str, tuple[str, ...], str]  # (original key, diffusers keys, how), see `to_diffusers`

# A full save's prefix before a transformer's keys (a plain transformer file has none; a
# family's own saves may add theirs: `Layout.own_prefixes`).
FULL_SAVE_PREFIX = "model.diffusion_model."


# What a transformer file is and what it runs with ------------------------------------------


class PartKind(Protocol):
    """A kind of part file a transformer runs with (a T5, a CLIP, a Qwen3-VL, a VAE layout):
    what it is called, how a file of it is told and read, what it offers a `Need` and how it
    is built. One module per kind under `app/core/encoders/` (a family's own VAE kind in its
    family module); nothing outside them branches on which kind a part is."""

    key: str  # "t5", "clip_projected", "wan_vae": as records and sentences name it
    name: str  # the model a file of it holds: "T5", "Qwen3-VL" ("VAE" for the VAE kinds)
    text_encoder: bool

    @property
    def words(self) -> str:
        """ "T5 text encoder", "VAE" """
        ...

    def holds(self, shapes: Shapes) -> bool:
        """Whether a file with these shapes is of this kind (headers only)."""
        ...

    def width(self, shapes: Shapes) -> int | None:
        """What a file offers a need of this kind: a text encoder's width (a projected CLIP's
        projection width), a VAE's latent channels; None when it is not of this kind. Its
        config is read as the loader reads it, within real models' sizes: one that cannot be
        built raises ValueError naming what does not fit."""
        ...

    def load(self, checkpoint: Any, prefix: str, need: Need, configs: str) -> tuple[Any, list]:
        """The part built from `checkpoint`'s tensors under `prefix` (`configs`: the shipped
        config folder of the transformer's family), with the stored dtypes it read."""
        ...

    def prompt_reader(self, need: Need) -> tuple[str, Any] | None:
        """The pipeline component that reads its prompts and its value (("tokenizer_2", a
        CLIP tokenizer), ("processor", ...)); None for a VAE."""
        ...


@dataclass(frozen=True)
class Need:
    """One component a transformer runs with besides itself."""

    component: str  # the pipeline component it becomes: "text_encoder", "vae", ...
    kind: PartKind  # what file it takes, and what `fits` is asked about (`PartKind.width`)
    words: str  # "its T5 text encoder (t5xxl)"
    fits: Callable[[int], bool]  # on the file's width (latent channels for a VAE)
    hints: tuple[str, ...] = ()  # name fragments preferred when several files fit
    inside: str | None = None  # its key prefix when the transformer's own file holds it
    pad_token: str = "<|endoftext|>"  # a CLIP tokenizer's padding (CLIP-G pads with "!")
    # A CLIP's shipped config (what shapes do not say), "" for CLIP-L's (`encoders.clip`).
    clip_config: str = ""
    # A Qwen3-VL's released model and the class its pipeline takes, a key of
    # `encoders.qwen3_vl.READS`: "4b" (Krea 2's Qwen3VLModel), "8b" (Qwen-Image 2.1's
    # Qwen3VLForConditionalGeneration).
    reads: str = ""

    @property
    def is_text_encoder(self) -> bool:
        return self.kind.text_encoder


@dataclass(frozen=True)
class InnerPart:
    """A pipeline part the transformer's own file holds beside it under `prefix`, in the
    diffusers class's own names (Anima's LLM adapter, `llm_adapter.*`, is its text
    conditioner): built from `config` (its shapes read by the layout's reader)."""

    component: str  # "text_conditioner"
    prefix: str  # its keys' prefix in the file, the transformer's own prefix included
    class_name: str  # the diffusers class it is built as
    config: dict[str, Any]


@dataclass(frozen=True)
class SplitModel:
    """A transformer file read from its header: its diffusers config and what it needs."""

    layout: str  # the family whose layout it is (a FamilyId value)
    title: str  # "Flux.1", "Chroma", "SD3.5 Large", "Z-Image" (for sentences)
    prefix: str  # the transformer's key prefix in the file
    config: dict[str, Any]  # the diffusers transformer's config, `_class_name` included
    architecture: str  # HalfSafe's name: "flux-dev", "chroma", "sd3", "zimage-turbo", "qwenimage"
    because: str  # one sentence: why it is this model
    needs: tuple[Need, ...]
    pipeline_class: str  # the diffusers pipeline class
    configs: str  # app/resources/configs folder with its scheduler and VAE configs
    scheduler: dict[str, Any]  # overrides of the shipped scheduler config
    latent_channels: int  # what its VAE must make
    table: Callable[[Mapping[str, Any]], Iterator[Row]]  # its layout's key table, for `config`
    native_size: int = 1024  # the pictures' side it was trained for
    # Projected CLIPs whose pooled vectors, side by side, make the transformer's pooled input.
    pooled_from: tuple[str, ...] = ()
    # Why such a file cannot be run at all (words completing "<file>: "), None when it can.
    unsupported: str | None = None
    # Parts the file holds beside the transformer, in their diffusers class's names.
    inner: tuple[InnerPart, ...] = ()

    def rows(self) -> Iterator[Row]:
        return self.table(self.config)

    @property
    def companions(self) -> tuple[Need, ...]:
        """The needs the transformer's own file does not hold."""
        return tuple(n for n in self.needs if n.inside is None)


@dataclass(frozen=True)
class Layout:
    """One transformer key layout: the keys that mark it (after the prefix), the keys that
    mark another layout instead, how a file in it is read, and its key table."""

    words: str  # "Flux-style transformer"
    markers: tuple[str, ...]
    excluded: tuple[str, ...]
    read: Callable[[Shapes, str], SplitModel]  # raises ValueError naming what does not fit
    table: Callable[[Mapping[str, Any]], Iterator[Row]]
    # What only the file's name tells of a model read from its shapes (a variant whose weights
    # are shaped as another's): (model, file name) -> model. None: the shapes tell all.
    named: Callable[[SplitModel, str], SplitModel] | None = None
    # Key prefixes the family's own saves put before its keys, besides a full save's and none
    # (a training save's: Cosmos's "net.").
    own_prefixes: tuple[str, ...] = ()

    def prefixes(self) -> tuple[str, ...]:
        """The key prefixes a transformer file in this layout is read under, in order."""
        return (FULL_SAVE_PREFIX, *self.own_prefixes, "")


def weight_shape(shapes: Shapes, name: str, ndim: int, prefix: str = "") -> tuple[int, ...]:
    """The shape of a weight a config is read from: present, `ndim`-D and with no empty
    dimension (a scalar, a 1-D or a 0-wide tensor where a matrix belongs is a damaged file, not
    an IndexError or a ZeroDivisionError later). Raises ValueError naming it."""
    shape = shapes.get(prefix + name)
    if shape is None:
        raise ValueError(f"it has no {name}")
    if len(shape) != ndim:
        raise ValueError(f"its {name} has shape {list(shape)} where a {ndim}-D tensor belongs")
    if 0 in shape:
        raise ValueError(f"its {name} has shape {list(shape)}, with an empty dimension")
    return tuple(shape)


def reader(shapes: Shapes, prefix: str):
    def w(name: str, ndim: int) -> tuple[int, ...]:
        return weight_shape(shapes, name, ndim, prefix)

    return w


class AbsurdSizes(ValueError):
    """A transformer file whose shapes describe a model beyond any real one's sizes."""


def within_limits(config: dict[str, Any]) -> dict[str, Any]:
    """A config within real models' sizes (app.core.config_limits), before anything is built."""
    try:
        config_limits.check_transformer_config(config)
    except ValueError as error:
        raise AbsurdSizes(str(error)) from None
    return config


def count_indices(shapes: Shapes, prefix: str) -> int:
    """How many numbered blocks (`prefix`0., `prefix`1., ...) the shapes hold: the highest
    index plus one."""
    found = set()
    for key in shapes:
        if key.startswith(prefix):
            index = limits.index_in_name(key[len(prefix) :].split(".", 1)[0])
            if index is not None:
                found.add(index)
    return max(found) + 1 if found else 0


def bounded(*sizes: tuple[str, int, int]) -> None:
    """Each (what, size, limit) at least 1 and within real models' bounds (`limits.py`)."""
    for what, size, limit in sizes:
        if not 1 <= size <= limit:
            raise AbsurdSizes(f"its {what} ({size}) is outside 1 to {limit}")


def count_words(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def listed(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


# Key tables: rows and the mapping in both directions ----------------------------------------


def linear(original: str, diffusers: str) -> Iterator[Row]:
    for part in ("weight", "bias"):
        yield f"{original}.{part}", (f"{diffusers}.{part}",), "same"


def fused(original: str, parts: tuple[str, ...]) -> Iterator[Row]:
    for part in ("weight", "bias"):
        yield f"{original}.{part}", tuple(f"{p}.{part}" for p in parts), "cat"


def swapped(original: str, diffusers: str) -> Iterator[Row]:
    for part in ("weight", "bias"):
        yield f"{original}.{part}", (f"{diffusers}.{part}",), "swap"


def _swap_halves(tensor):
    import torch

    first, second = tensor.chunk(2, dim=0)
    return torch.cat([second, first], dim=0)


def to_diffusers(
    rows: Iterator[Row], tensors: Mapping[str, Any], expected: Shapes, prefix: str = ""
) -> dict[str, Any]:
    """Original-layout tensors -> diffusers names, by a layout's rows: "same" (renamed), "cat"
    (fused along dim 0; `expected` gives the parts' sizes), "swap" (a modulation's shift and
    scale halves swapped), "flat" (a table kept as one vector, shaped as `expected` says) or
    "pad:N" (N input columns the original has last that diffusers' has not: an input that is
    always zero, Cosmos's padding mask, whose columns are dropped; put back as zeros).
    Raises KeyError for a missing key, ValueError for a misfit."""
    import torch

    state: dict[str, Any] = {}
    for original, names, how in rows:
        tensor = tensors[prefix + original]
        if how == "cat":
            sizes = [expected[n][0] for n in names]
            if sum(sizes) != tensor.shape[0]:
                raise ValueError(
                    f"{prefix + original} has {tensor.shape[0]} rows, not {sum(sizes)}"
                )
            state.update(zip(names, torch.split(tensor, sizes, dim=0), strict=True))
        elif how == "swap":
            state[names[0]] = _swap_halves(tensor)
        elif how.startswith("pad:"):
            kept = expected[names[0]][1]
            if tensor.shape[1] != kept + int(how[4:]):
                raise ValueError(
                    f"{prefix + original} has {tensor.shape[1]} columns, not {kept + int(how[4:])}"
                )
            state[names[0]] = tensor[:, :kept]
        elif how == "flat":
            shape = expected[names[0]]
            if tensor.numel() != math.prod(shape):
                raise ValueError(
                    f"{prefix + original} has {tensor.numel()} values, not {math.prod(shape)}"
                )
            state[names[0]] = tensor.reshape(shape)
        else:
            state[names[0]] = tensor
    return state


def to_original(rows: Iterator[Row], state: Mapping[str, Any]) -> dict[str, Any]:
    """A diffusers transformer's state dict under the original layout's names (what a
    transformer file in ComfyUI's `diffusion_models/` holds), by the same rows."""
    import torch

    out: dict[str, Any] = {}
    for original, names, how in rows:
        if how == "cat":
            out[original] = torch.cat([state[n] for n in names], dim=0)
        elif how == "swap":
            out[original] = _swap_halves(state[names[0]])
        elif how.startswith("pad:"):
            weight = state[names[0]]
            padding = weight.new_zeros((weight.shape[0], int(how[4:])))
            out[original] = torch.cat([weight, padding], dim=1)
        elif how == "flat":
            out[original] = state[names[0]].reshape(-1)
        else:
            out[original] = state[names[0]]
    return out
