"""The step cache a generation may run with: diffusers' first-block cache, which runs a step's
first transformer block and, while its output differs from the last computed step's by less
than the threshold (relative mean absolute difference), replays the rest of the blocks' cached
residual instead of computing them. Faster, and slightly different images.

A cache replays what it holds: a NaN cached once repeats in every later step, and a cache left
stale carries one image's values into the next. So an image that goes non-finite with the cache
on is made again with it off before any precision repair is believed (`repair.Repairs`): one
that comes out right then names the cache as its cause (`cause` "cache").
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


def problem(family) -> str | None:
    """Why a model of this family cannot run with the step cache (None: it can)."""
    from app.core.families.registry import FAMILIES

    if family.takes_step_cache:
        return None
    takers = [f.title for f in FAMILIES if f.takes_step_cache]
    return (
        f"diffusers' step cache does not run on {family.title}'s denoiser (it skips the blocks "
        f"of the transformers it knows: {', '.join(takers)}); set Step cache to 0."
    )


@contextlib.contextmanager
def cached(denoiser, threshold: float) -> Iterator[None]:
    """The denoiser with diffusers' first-block cache at `threshold` for the block's run, and
    without it after (0: nothing changes); a fresh cache every time, so no state is carried
    from one run into the next."""
    if threshold <= 0:
        yield
        return
    from diffusers.hooks import FirstBlockCacheConfig

    denoiser.enable_cache(FirstBlockCacheConfig(threshold=threshold))
    try:
        yield
    finally:
        denoiser.disable_cache()
