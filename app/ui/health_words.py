"""The Health check page's own words for a report: what a fix costs beside fp32, which pictures the
check read, and the headline with its agreement figures in plain words."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from app.core.fixing.quality import plain_figures, qualities_in
from app.core.health import (
    FixCost,
    HealthReport,
    cost_comparison,
)
from app.ui import words


def cost_comparison_words(cost: FixCost, fix_settings: Mapping[str, Any] | None = None) -> str:
    """Core's sentences on step time (it knows the spread of each measurement, and whether
    the fix's settings leave the denoiser as the settings run it), then what the memory
    figures add."""
    fix, no_half = cost.fix, cost.no_half
    parts = []
    small, large = fix.peak_memory_mb, no_half.peak_memory_mb
    if small is not None and large is not None and large > small:
        parts.append(f"{words.megabytes(large - small)} less memory at peak")
    small_w, large_w = fix.weights_mb, no_half.weights_mb
    if large_w > small_w:
        parts.append(f"{words.megabytes(large_w - small_w)} less memory for weights")
    memory = (
        "Compared with running everything in fp32, the fix uses " + ", ".join(parts) + "."
        if parts
        else ""
    )
    return " ".join(s for s in (cost_comparison(cost, fix_settings), memory) if s)


def pictures_words(
    pictures: tuple[tuple[str, ...], str | None] | None, report: HealthReport
) -> str:
    """' Checked with the input picture photo.png (and the mask mask.png): the VAE encoder
    included.' for a check of the image-to-image or inpainting path; '' otherwise."""
    if not pictures or not pictures[0]:
        return ""
    images, mask = pictures
    text = f" Checked with the input picture {Path(images[0]).name}"
    if mask:
        text += f" and the mask {Path(mask).name}"
    if "vae_encoder" in report.components:
        text += f": the {words.component_name('vae_encoder')} included"
    return text + "."


def plain_headline(headline: str) -> tuple[str, str]:
    """Core's headline with each agreement figure in plain words, and what those words stand
    for, for a tooltip ('' when it had none); both from `diagnosis`, which writes the figures."""
    figures = [
        f"{words.first_upper(q.plain_words())}: {q.figure_words()}." for q in qualities_in(headline)
    ]
    return plain_figures(headline), "\n".join(figures)
