"""Reductions over a picture's colour channels, the short last axis of an (H, W, C) array.

numpy reduces along a 3-long last axis with a strided loop per pixel: on a 1024x1024 picture
`rgb.mean(axis=-1)` takes several times as long as adding the three planes. Explaining one
picture runs dozens of such reductions, so these take the planes instead. numpy only.
"""

from __future__ import annotations

from typing import Any


def channel_sum(pixels: Any) -> Any:
    """`pixels.sum(axis=-1)` for a floating (H, W, C) array, the same numbers: the planes
    added in channel order, as numpy adds a short axis."""
    total = pixels[..., 0].copy()
    for index in range(1, pixels.shape[-1]):
        total += pixels[..., index]
    return total


def channel_all(marks: Any) -> Any:
    """`marks.all(axis=-1)` for a boolean (H, W, C) array: the planes and-ed."""
    every = marks[..., 0].copy()
    for index in range(1, marks.shape[-1]):
        every &= marks[..., index]
    return every


def channel_mean(pixels: Any) -> Any:
    """`pixels.mean(axis=-1)`, the same numbers: floating pictures in their own dtype,
    integer ones (uint8) in float64, as numpy takes their mean."""
    import numpy as np

    floating = np.issubdtype(pixels.dtype, np.floating)
    planes = pixels if floating else pixels.astype(np.float64)
    return channel_sum(planes) / planes.dtype.type(pixels.shape[-1])


def pixel_dot(a: Any, b: Any) -> float:
    """The mean over the pixels of two floating (H, W, C) arrays of their channels' dot
    product, `(a * b).sum(axis=-1).mean()`, as one reduction over every element (pairwise,
    as numpy sums; the same to float rounding)."""
    import numpy as np

    return float(np.multiply(a, b).mean()) * a.shape[-1]
