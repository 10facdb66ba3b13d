"""The words of an outcome: each image's status and the sentence that says what went
non-finite, where, and what was done about it (or what would fix it)."""

from __future__ import annotations

from app.core.components import words as component_words
from app.core.fixing.fix_candidates import FixCandidate
from app.core.generation import step_cache
from app.core.generation.records import GenerationRequest, ImageResult, settings_of
from app.core.generation.repair import Repair
from app.core.generation.stages import Outcome, failure
from app.core.settings import PrecisionSettings
from app.core.words.causes import cause_words


def describe(
    seed: int,
    outcome: Outcome,
    repair: Repair | None,
    component: str | None,
    step: int | None,
    safety_hit: bool,
    suggestion: FixCandidate | None,
    auto_fix: str,
    watched: bool,
    request: GenerationRequest,
    precision: PrecisionSettings,
    *,
    intermittent: bool = False,
    cached: bool = False,
) -> ImageResult:
    """The entry for one image. `intermittent`: the image is still non-finite, and the part
    that failed came out finite when it ran again unchanged (checked when repairs are asked);
    `cached`: still non-finite from a denoiser run with a cache on (the step cache, the prompt
    cache), never ruled out."""
    stats = outcome.stats
    fixes = list(repair.fixes) if repair else []
    still = failure(outcome)
    entry = ImageResult(
        seed=seed,
        status="ok",
        component=component or None,
        step=step,
        fixes_applied=fixes,
        first_bad_module=repair.first_bad_module if repair else None,
        non_finite=stats.non_finite,
        non_finite_box=stats.non_finite_box,
        settings=settings_of(outcome.plan, precision),
        image=outcome.image,
        step_cache=outcome.step_cache,
        prompt_cache=outcome.prompt_cache,
    )
    where = _where(component, step, request.steps)
    if still is not None:
        entry.status = "nan"
        entry.component = still or None
        if still != component:
            entry.step = outcome.bad_step if still == outcome.denoiser else None
            where = _where(still, entry.step, request.steps)
        share = (
            "the image came out black"
            if stats.all_non_finite
            else f"{percent(stats.non_finite)} of its pixels came out black"
            f"{_box_words(stats.non_finite_box)}"
        )
        if not watched:
            entry.message = (
                f"This image holds NaN values ({percent(stats.non_finite)} of its pixels"
                f"{_box_words(stats.non_finite_box)}); "
                "the NaN watch was off, so which part failed is not known: turn it on to find "
                "and repair it."
            )
        elif cached:
            caches = step_cache.names(outcome.step_cache, outcome.prompt_cache)
            switches = step_cache.switches(outcome.step_cache, outcome.prompt_cache)
            entry.message = (
                f"{where} with {caches} on, so {share}. A NaN a cache holds repeats in "
                f"every later step: make the image again with {switches} before any precision "
                "fix (with Auto fix on, HalfSafe does that itself)."
            )
        elif intermittent:
            entry.cause = "intermittent"
            entry.message = (
                f"{where}, so {share}; run again unchanged, that part came out finite: "
                f"{cause_words('intermittent')}. No precision fix is offered for it: make the "
                "image again with the same seed; `halfsafe gpu --retest` measures how often "
                "this device's kernels fail."
            )
        elif suggestion is not None:
            entry.fix = dict(suggestion.settings)
            tested = "passed a quick test" if auto_fix == "ask" else "should fix it"
            entry.message = f"{where}, so {share}; the fix '{suggestion.words}' {tested}."
        elif auto_fix == "auto":
            entry.message = (
                f"{where}, so {share}, and no precision setting made it finite: run the "
                "health check on this model."
            )
        elif auto_fix == "ask":
            entry.message = (
                f"{where}, so {share}, and no precision setting passed a quick test: run the "
                "health check on this model."
            )
        else:
            entry.message = (
                f"{where}, so {share}, though it already runs in fp32: run the health check "
                "on this model."
            )
        return entry
    if fixes and repair is not None:
        entry.fix = dict(repair.settings)
        entry.cause = repair.cause  # a precision change (or only another backend) made it finite
        entry.quality = repair.quality
    if safety_hit:
        entry.status = "safety_checker"
        entry.message = (
            "The model's safety checker flagged this image and replaced it with a black one; "
            "nothing overflowed."
        )
    elif stats.near_black:
        entry.status = "black"
        entry.message = (
            "This image is almost completely black but holds no NaN, so nothing overflowed; "
            "that may be what the prompt asks for, so try another seed or a brighter prompt."
        )
    elif repair is not None and repair.cause == "cache":
        entry.status = "fixed"
        entry.message = (
            f"{where} with {step_cache.names(*repair.caches)} on; made again without "
            f"{'them' if all(repair.caches) else 'it'} (same seed, same settings), it came out "
            f"finite: {cause_words('cache')}. No precision fix is kept for it; "
            f"{step_cache.advice(*repair.caches)} for this model."
        )
    elif repair is not None and repair.cause == "intermittent":
        entry.status = "fixed"
        entry.message = (
            f"{where}; made again unchanged (same seed, same settings), it came out finite: "
            f"{cause_words('intermittent')}. No precision fix is kept for it; "
            "`halfsafe gpu --retest` measures how often this device's kernels fail."
        )
    elif fixes:
        entry.status = "fixed"
        how = (
            "the same latents were decoded again"
            if component == "vae"
            else "the image was made again"
        )
        entry.message = f"{where}; {how} with the fix '{'; '.join(fixes)}', and it came out finite."
    else:
        entry.message = (
            "No problem found: every value stayed finite."
            if watched
            else "The image looks fine; the NaN watch was off, so only its pixels were checked."
        )
    return entry


def _where(component: str | None, step: int | None, steps: int) -> str:
    """ "the UNet went non-finite (NaN) at step 3 of 20", "the VAE went non-finite (NaN)"."""
    words = component_words(component) if component else "model"
    at = f" at step {step} of {steps}" if step is not None else ""
    when = " while decoding" if component == "vae" else ""
    return f"The {words} went non-finite (NaN){at}{when}"


def box_text(box: tuple[int, int, int, int] | None) -> str | None:
    """'x 64-127, y 0-63' (inclusive pixel ranges) for a box, None without one."""
    if box is None:
        return None
    x0, y0, x1, y1 = box
    return f"x {x0}-{x1 - 1}, y {y0}-{y1 - 1}"


def _box_words(box: tuple[int, int, int, int] | None) -> str:
    text = box_text(box)
    return f", all within {text}" if text else ""


def percent(fraction: float) -> str:
    value = fraction * 100
    if value >= 99.95:
        return "100%"
    return f"{value:.1f}%" if value >= 0.1 else "under 0.1%"
