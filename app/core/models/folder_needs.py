"""What a diffusers folder's transformer reads from its text encoders, told as its own file
would tell it: the transformer's shapes (diffusers' names, from the headers) are put back in its
family's original layout by the layout's key table, read by the layout's reader, and each text
encoder the folder holds is held to the need that reader gives (a Krea 2 Qwen3-VL 4B where
Qwen-Image 2.1 reads the 8B's 4096-wide states), with the sentence a split file gets.
Shapes only: nothing is built here.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from app.core.encoders.kind import TextEncoderKind
from app.core.families import Family
from app.core.formats.layouts import Need, Row, Shapes
from app.core.models import parts
from app.core.models.configs import read_json
from app.core.models.folder_shapes import text_encoder_width


def original_shapes(rows: Iterator[Row], held: Shapes) -> dict[str, tuple[int, ...]]:
    """A diffusers transformer's shapes under its original layout's names, by the layout's
    rows (as `layouts.to_original` moves the tensors): fused parts stacked along their first
    dimension, a flat table as one vector; a row whose tensors the shapes lack is left out."""
    shapes: dict[str, tuple[int, ...]] = {}
    for original, names, how in rows:
        if not all(name in held for name in names):
            continue
        found = [tuple(held[name]) for name in names]
        if how == "cat":
            shapes[original] = (sum(s[0] for s in found if s), *found[0][1:])
        elif how == "flat":
            shapes[original] = (math.prod(found[0]),)
        elif how.startswith("pad:"):
            shapes[original] = (found[0][0], found[0][1] + int(how[4:]))
        else:
            shapes[original] = found[0]
    return shapes


def check_text_widths(
    path: Path,
    components: Mapping[str, Any],
    transformer_config: Mapping[str, Any],
    family: Family,
    held: Mapping[str, Shapes | None],
    model: str,
) -> None:
    """Refuse a text encoder of the folder whose width is not what its transformer reads (its
    family's `Need`), naming what the encoder is and what the model (`model`, in words) needs.
    `held` is each component's shapes from its headers (None: a pickle, not read). A
    transformer the layout's reader cannot read (a small test model's own sizes) is not held
    to it: the folder's configs and weights were matched already."""
    layout = family.layout
    transformer = held.get("transformer")
    if layout is None or transformer is None:
        return
    try:
        rows = layout.table(dict(transformer_config))
        split = layout.read(original_shapes(rows, transformer), "")
    except (KeyError, ValueError, TypeError, IndexError):
        return
    for need in split.needs:
        shapes = held.get(need.component)
        if not need.is_text_encoder or need.component not in components or shapes is None:
            continue
        kind = need.kind
        projected = isinstance(kind, TextEncoderKind) and kind.projected
        width = text_encoder_width(shapes, projected=projected)
        if width is None or need.fits(width):
            continue
        _refuse(path, components, need, width, model)


def _refuse(path: Path, components: Mapping[str, Any], need: Need, width: int, model: str) -> None:
    folder = path / need.component
    declared = str(components[need.component][1])
    config = read_json(folder / "config.json", owner=folder)
    found = parts.text_encoder_class_part(declared, config) or parts.PartOf(
        f"a {width}-wide text encoder ({declared})"
    )
    wanted = need.words
    if isinstance(need.kind, TextEncoderKind) and need.kind.of_class(declared):
        wanted += f", not one {width} wide"
    parts.refuse(folder, found, model, wanted, path)
