"""The repair of one image: the failing part only, the health check's fixes for it cheapest
first, each checked by a probe and proved by the image made again; and the fix to offer when
repairs are not allowed."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from app.core.components import COMPONENTS, RUN_ORDER, module_of
from app.core.errors import CancelledError
from app.core.fixing import fix_candidates
from app.core.fixing.fix_candidates import FixCandidate, candidate_fixes
from app.core.fixing.quality import Quality
from app.core.generation import step_cache
from app.core.generation.probes import Probes
from app.core.generation.stages import JobStages, Outcome, failure
from app.core.images.finished import to_image
from app.core.memory import is_out_of_memory
from app.core.precision import PrecisionPlan

# Run order of the components: a failure is blamed on the first one that went non-finite.
STAGES = RUN_ORDER
MAX_REPAIRS_PER_IMAGE = 3


@dataclass
class Repair:
    outcome: Outcome
    fixes: list[str] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    first_bad_module: str | None = None
    quality: Quality | None = None  # the worst of its repairs against fp32
    # "kernel" when the repairs only switched the attention backend (the same precision, as
    # `causes` classifies a check's fix), "intermittent" when the image made again unchanged
    # came out finite (no fix at all), "cache" when made again without its caches (the step
    # cache, the prompt cache) it did, else "precision".
    cause: str = "precision"
    # With cause "cache": the caches the failed run had on (step cache threshold, prompt cache).
    caches: tuple[float, bool] = (0.0, False)


class Repairs:
    """The repairs of a job's images, on its stages (`job`) and probes (`probes`), and what
    they found: every fix accepted so far on top of the job's plan (`repair_plan`), its
    settings and words, the parts it fixed, and the candidates that could not run."""

    def __init__(self, job: JobStages, probes: Probes) -> None:
        self.job = job
        self.probes = probes
        self.repair_plan = job.plan  # every fix found so far, on top of the plan
        self.fix_settings: dict[str, Any] = {}
        self.fix_words: list[str] = []
        self.fixed_components: list[str] = []
        self.dropped: list[str] = []  # candidates that failed to run, as sentences

    def candidates(self, component: str, outcome: Outcome):
        """Fixes to try for `component`, cheapest first, on top of the fixes already found.

        A generator: the layer probe that decides whether upcasting attention is worth a try
        runs only when the fixes found for earlier images do not already work.
        """
        base = self.repair_plan
        if _relevant_change(component, outcome.plan, base):
            yield FixCandidate(base, dict(self.fix_settings))
        first_bad = self.probes.first_bad_module(component, outcome)
        part = module_of(component)  # the VAE's encoder is fixed by the VAE's fixes
        yield from candidate_fixes(
            part,
            base,
            first_bad,
            # The loaded part, for its layers' names and kinds: the placed copy, held by this
            # generator for the whole search, would still be in memory when the fix's copy is
            # made (a bf16 transformer generated in fp16: both fp16 copies at once, 2.4 GiB).
            getattr(self.job.model.pipeline, part),
            self.job.bf16_native,
            lambda: self.probes.wide_probe(component, outcome),
        )
        if module_of(component) != "vae" and any(d != "fp32" for d in base.dtypes.values()):
            yield fix_candidates.everything_fp32(base)

    def repair(self, index: int, seed: int, outcome: Outcome, total: int) -> Repair:
        """Repair one image: the failing part only, cheapest fix first, until it is finite.

        First the failing part is re-run unchanged (the probe that names its first bad layer):
        when the NaN does not come back, the image is made again with the same seed and plan,
        and if that comes out finite the fault was intermittent (`causes`): that image is kept
        and no precision fix is tried or remembered."""
        component = failure(outcome)
        if component and component == outcome.denoiser and outcome.cached:
            outcome, uncached = self._without_cache(index, seed, outcome, total)
            if uncached is not None:
                return uncached
            component = failure(outcome)
        if component:
            again = self._same_again(index, seed, component, outcome, total)
            if again is not None:
                return again
        result = Repair(outcome)
        for _ in range(MAX_REPAIRS_PER_IMAGE):
            component = failure(result.outcome)
            if not component:
                break
            repaired = None
            for candidate in self.candidates(component, result.outcome):
                self.job.cancel.raise_if_cancelled()
                self.job.progress(f"Image {index + 1} of {total}: {candidate.words}", 0, 1)
                try:
                    repaired = self._try(component, candidate, result.outcome, seed)
                except CancelledError:
                    raise
                except Exception as error:  # noqa: BLE001 - a candidate that cannot run is dropped
                    if is_out_of_memory(error):  # the job stops, said once (`memory`)
                        raise
                    self.dropped.append(
                        f"Trying to {candidate.words} failed ({type(error).__name__}: "
                        f"{str(error).strip()[:200]}); it was not used."
                    )
                    continue
                if repaired is not None:
                    self._accept(component, candidate)
                    quality = self.probes.qualities.get(component)
                    if quality is not None and (
                        result.quality is None or quality.value < result.quality.value
                    ):
                        result.quality = quality
                    result.fixes.append(candidate.words)
                    result.settings.update(candidate.settings)
                    result.outcome = repaired
                    break
            if result.first_bad_module is None:
                result.first_bad_module = self.job.first_bad.get(component)
            if repaired is None:
                break
        if fix_candidates.switched_backend(result.settings, self.job.plan) is not None:
            result.cause = "kernel"
        return result

    def _without_cache(
        self, index: int, seed: int, outcome: Outcome, total: int
    ) -> tuple[Outcome, Repair | None]:
        """The image made again with its caches off (the step cache, the prompt cache), before
        any other repair is believed (a NaN a cache holds repeats in every later step); they
        stay off for the rest of the job. Right then, a cache was the cause; still non-finite,
        that run is the one repaired."""
        caches = step_cache.names(outcome.step_cache, outcome.prompt_cache)
        self.job.step_cache = 0.0
        self.job.prompt_cache = False
        self.job.progress(f"Image {index + 1} of {total}: making it again without {caches}", 0, 1)
        self.job.stage = "Making the image again"
        try:
            again = self.job.run(outcome.plan, [seed])[0]
        finally:
            self.job.stage = "Generating"
        if failure(again) is not None:
            return again, None
        return again, Repair(
            again,
            fixes=[f"made again without {caches}"],
            cause="cache",
            caches=(outcome.step_cache, outcome.prompt_cache),
        )

    def _same_again(
        self, index: int, seed: int, component: str, outcome: Outcome, total: int
    ) -> Repair | None:
        """The image made again exactly as before, when the failing part's identical re-run
        came out finite and so does the whole image (a VAE: the same latents decoded again)."""
        first_bad = self.probes.first_bad_module(component, outcome)
        if self.probes.recurred.get((component, id(outcome)), True):
            return None
        self.job.progress(f"Image {index + 1} of {total}: making it again, unchanged", 0, 1)
        if component == "vae" and outcome.vae_latents is None:
            image, stats = to_image(self.job.decoded(outcome.plan, outcome.latents)[0])
            again = replace(outcome, image=image, stats=stats)
        else:
            self.job.stage = "Making the image again"
            try:
                again = self.job.run(outcome.plan, [seed])[0]
            finally:
                self.job.stage = "Generating"
        if failure(again) is not None:
            return None
        return Repair(
            again,
            fixes=["made again unchanged (same seed, same settings)"],
            first_bad_module=first_bad or self.job.first_bad.get(component),
            cause="intermittent",
        )

    def _try(self, component: str, candidate: FixCandidate, outcome: Outcome, seed: int):
        passed, output = self.probes.verify(component, candidate.plan, outcome)
        if not passed:
            return None
        # The verified decode is the image, unless it was a hires fix's first picture.
        if component == "vae" and output is not None and outcome.vae_latents is None:
            image, stats = to_image(output.numpy())
            return replace(outcome, plan=candidate.plan, image=image, stats=stats)
        self.job.stage = "Making the image again"
        try:
            again = self.job.run(candidate.plan, [seed])[0]
        finally:
            self.job.stage = "Generating"
        still = failure(again)
        if still and STAGES.index(still) <= STAGES.index(component):
            return None
        return again

    def _accept(self, component: str, candidate: FixCandidate) -> None:
        self.repair_plan = candidate.plan
        self.fix_settings.update(candidate.settings)
        if candidate.words not in self.fix_words and candidate.settings:
            self.fix_words.append(candidate.words)
        if component not in self.fixed_components:
            self.fixed_components.append(component)

    def recurs(self, component: str, outcome: Outcome) -> bool:
        """Whether the failing part's NaN comes back when that part alone runs again unchanged
        (the probe that names its first bad layer); True where no input was kept to tell, so
        that an unproven fault is never called intermittent."""
        self.probes.first_bad_module(component, outcome)
        return self.probes.recurred.get((component, id(outcome)), True)

    def suggest(self, component: str, outcome: Outcome, verify: bool) -> FixCandidate | None:
        """The fix to offer without applying it: with `verify`, the cheapest that one forward
        pass shows finite; without, the component's wider dtype (bf16 where native, else fp32)."""
        if not component:
            return None
        if verify:
            for candidate in self.candidates(component, outcome):
                self.job.cancel.raise_if_cancelled()
                if self.probes.quick_check(component, candidate.plan, outcome):
                    return candidate
            return None
        dtype = outcome.plan.dtypes.get(module_of(component))
        key = COMPONENTS[component].setting
        if dtype == "fp16" and self.job.bf16_native:
            return FixCandidate(outcome.plan, {key: "bf16"})
        if dtype != "fp32":
            return FixCandidate(outcome.plan, {key: "fp32"})
        return None


def _relevant_change(component: str, tried: PrecisionPlan, base: PrecisionPlan) -> bool:
    """Whether the fixes found so far change anything `component` runs with."""
    part = module_of(component)
    if tried.dtypes.get(part) != base.dtypes.get(part):
        return True
    flags = (
        "fp16_accumulation",
        "attention_reduced_precision",
        "fp16_reduced_precision_reduction",
    )
    if any(getattr(tried, f) != getattr(base, f) for f in flags):
        return True
    return COMPONENTS[component].has_attention and tried.upcast_attention != base.upcast_attention
