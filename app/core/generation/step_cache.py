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

from app.core.components import words as component_words


def problem(denoiser) -> str | None:
    """Why this denoiser cannot run with the step cache (None: it can): a UNet, or a
    transformer whose blocks diffusers' cache does not know. Registers the cache and takes it
    off again: no forward runs."""
    from diffusers.hooks import FirstBlockCacheConfig

    name = type(denoiser).__name__
    if not hasattr(denoiser, "enable_cache"):
        return (
            f"the step cache skips a transformer's blocks, and this model's "
            f"{component_words('unet')} ({name}) has none diffusers' cache can skip; set "
            "Step cache to 0."
        )
    try:
        denoiser.enable_cache(FirstBlockCacheConfig(threshold=0.05))
    except (ValueError, TypeError, AttributeError, KeyError) as error:
        return (
            f"diffusers' step cache does not run on this model's transformer ({name}: "
            f"{str(error).strip()[:160]}); set Step cache to 0."
        )
    denoiser.disable_cache()
    return None


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
