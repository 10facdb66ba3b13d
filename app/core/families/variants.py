"""The published variants of a family's model that differ in size alone (Anima 2B's 28 blocks,
Anima 2.9B's 40): a loader that knows only the first builds it whatever the file holds, drops
or invents weights and draws noise, which users take for a numeric failure. Each family module
lists its own (`Family.variants`), oldest first. No torch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.core.errors import WrongVariant


@dataclass(frozen=True)
class PublishedVariant:
    """One published size of a family's denoiser: its name, and the denoiser config value
    (`setting`, counting the numbered `where`) that tells it from the others."""

    title: str  # "Anima 2.9B"
    setting: str  # the denoiser's config key: "num_layers"
    value: int  # 40
    where: str  # the numbered blocks it counts, in the file's own names: "blocks"


def older_loader(
    variants: Sequence[PublishedVariant], denoiser: str, config: Mapping[str, Any]
) -> tuple[PublishedVariant, WrongVariant] | None:
    """The variant a model's denoiser `config` is (its file's, read from its shapes), and what a
    loader that knows only the family's first variant builds in its place; None where the model
    is the first variant or none listed."""
    if not variants:
        return None
    first = variants[0]
    mine = next(
        (
            v
            for v in variants[1:]
            if v.setting == first.setting and config.get(v.setting) == v.value
        ),
        None,
    )
    if mine is None or mine.value == first.value:
        return None
    return mine, WrongVariant(
        component=denoiser,
        kind="blocks",
        where=mine.where,
        in_file=mine.value,
        in_config=first.value,
        setting=first.setting,
        config=first.title,
        proved=False,
    )
