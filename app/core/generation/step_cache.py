"""The caches a generation may run with, and their words.

The step cache: diffusers' first-block cache, which runs a step's first transformer block and,
while its output differs from the last computed step's by less than the threshold (relative
mean absolute difference), replays the rest of the blocks' cached residual instead of computing
them. Faster, and slightly different images.

The prompt cache: a pipeline that keeps the keys and values of the prompt's tokens (and its
reference pictures') from the first step and reuses them in every later step (Qwen-Image 2.1's
`use_kv_cache`, valid where its transformer modulates them as at t = 0, `causal_condition`).
Faster by the text's share of a step, and the same image within rounding.

A cache replays what it holds: a NaN cached once repeats in every later step, and a cache left
stale carries one image's values into the next. So an image that goes non-finite with a cache
on is made again with every cache off before any precision repair is believed
(`repair.Repairs`): one that comes out right then names the cache as its cause (`cause`
"cache").
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


def prompt_problem(family) -> str | None:
    """Why a model of this family cannot run with the prompt cache (None: it can)."""
    from app.core.families.registry import FAMILIES

    if family.takes_prompt_cache:
        return None
    takers = [f.title for f in FAMILIES if f.takes_prompt_cache]
    return (
        f"{family.title}'s pipeline keeps no prompt cache (only {', '.join(takers)} does); "
        "turn Prompt cache off."
    )


def names(step: float, prompt: bool) -> str:
    """The caches a run had on, in words: "the step cache", "the prompt cache", or both."""
    on = [n for n, o in (("the step cache", step > 0), ("the prompt cache", prompt)) if o]
    return " and ".join(on)


def switches(step: float, prompt: bool) -> str:
    """The settings that turn those caches off, in the form's words."""
    on = [s for s, o in (("Step cache 0", step > 0), ("Prompt cache off", prompt)) if o]
    return " and ".join(on)


def advice(step: float, prompt: bool) -> str:
    """What to set for a model whose image a cache made non-finite."""
    on = [
        a
        for a, o in (
            ("set Step cache to 0, or lower it", step > 0),
            ("turn Prompt cache off", prompt),
        )
        if o
    ]
    return "; ".join(on)


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
