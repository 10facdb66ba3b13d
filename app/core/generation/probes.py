"""The probes of a failing part: only the part that went non-finite (the VAE's decode, the one
denoiser call kept by the watch, the input or enlarged picture's encoding or the prompt's)
re-run under a plan, to name its first bad layer, draw its layers' peaks in fp32, or check a
fix against an fp32 reference."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from app.core.fixing import job_plans
from app.core.fixing.quality import Quality, compare
from app.core.generation.stages import JobStages, Outcome, _first_bad
from app.core.generation.watch import read_flags
from app.core.precision import PrecisionPlan


class Probes:
    """The probes that re-run one failing part of a job's image, on that job's stages (`job`),
    and what they found: per failed outcome, the first bad layer of its identical re-run and
    whether that re-run went non-finite again, the fp32 reference outputs, and the last figure
    of each part's fix against fp32."""

    def __init__(self, job: JobStages) -> None:
        self.job = job
        # Per (component, id(outcome)): the first bad layer of the probe re-run, and whether
        # that identical re-run went non-finite again (`first_bad_module`).
        self._probed: dict[tuple[str, int], tuple[Any, str | None]] = {}
        self.recurred: dict[tuple[str, int], bool] = {}
        self._references: dict[tuple[str, int], Any] = {}  # fp32 outputs of failing parts
        self.qualities: dict[str, Quality] = {}  # component -> its fix against fp32

    def unet_forward(self, plan: PrecisionPlan, inputs: dict[str, Any], record: bool = False):
        """One denoiser call on a kept failing input: (its output, first bad module)."""
        import torch

        def call(stage):
            out = self.job.placed[self.job.family.denoiser](**dict(inputs), return_dict=False)[0]
            if isinstance(out, list):  # a denoiser that returns one tensor per image (Z-Image)
                out = torch.stack(out)
            return out

        out, recorder = self.job.stage_call(plan, [self.job.family.denoiser], call, record)
        first_bad = self.job.read_recorder(recorder, out)
        return out, first_bad

    def encoder_probe(self, plan: PrecisionPlan, component: str, record: bool = False):
        """Encode the prompt under `plan`: (this encoder finite?, first bad module)."""
        watching, self.job.watch = self.job.watch, True
        try:
            conditioning = self.job.encode(plan, record=component if record else None)
        finally:
            self.job.watch = watching
        bad = read_flags([conditioning.bad[component]])[0]
        first_bad = _first_bad(self.job.last_probe) if record else None
        return not bad, first_bad

    def wide_probe(self, component: str, outcome: Outcome):
        """Every layer's peaks of the failing part re-run in fp32 on the inputs it failed with
        (a `probe.ProbeResult`, from which `diagnosis` draws the layers to keep wider), or None
        when no input was kept to re-run."""
        plan = job_plans.fp32_reference(outcome.plan)
        self.job.last_probe = None
        if component == "vae":
            self.job.decoded(plan, _decoded(outcome), record=True)
        elif component == "vae_encoder":
            self.job.picture(plan, record=True, pixels=outcome.enlarged)
        elif component == outcome.denoiser:
            if outcome.unet_input is None:
                return None
            self.unet_forward(plan, outcome.unet_input, record=True)
        else:
            self.encoder_probe(plan, component, record=True)
        return self.job.last_probe

    def first_bad_module(self, component: str, outcome: Outcome) -> str | None:
        """Re-run only the part that failed under the plan it failed with, recording every
        layer, to name the innermost layer that went non-finite first (kept per component).
        Run once per failed outcome; whether that re-run went non-finite again is kept in
        `recurred` (True when no input was kept to re-run: it cannot tell)."""
        import numpy as np
        import torch

        key = (component, id(outcome))
        if key in self._probed:
            return self._probed[key][1]
        recurred = True
        if component == "vae":
            pixels, name = self.job.decoded(outcome.plan, _decoded(outcome), record=True)
            recurred = not np.isfinite(pixels).all()
        elif component == "vae_encoder":
            picture = self.job.picture(outcome.plan, record=True, pixels=outcome.enlarged)
            name = _first_bad(self.job.last_probe)
            recurred = bool(read_flags([picture.bad])[0])
        elif component == outcome.denoiser:
            if outcome.unet_input is None:
                return self.job.first_bad.get(component)
            out, name = self.unet_forward(outcome.plan, outcome.unet_input, record=True)
            recurred = not bool(torch.isfinite(out).all())
        else:
            finite, name = self.encoder_probe(outcome.plan, component, record=True)
            recurred = not finite
        if name:
            self.job.first_bad[component] = name
        self._probed[key] = (outcome, name)  # the outcome kept alive: its id stays its own
        self.recurred[key] = recurred
        return name

    def part_output(self, component: str, plan: PrecisionPlan, outcome: Outcome) -> Any:
        """The failing part's output under `plan`, on the inputs it failed with: the decoded
        pixels, one UNet call on the kept input, the picture's latents, or the prompt's
        embeddings (None when no input was kept to re-run). A search's run: the part computes
        from its stored weights (`PrecisionPlan.compute_in_place`)."""
        import torch

        plan = replace(plan, compute_in_place=True)

        if component == "vae":
            return torch.from_numpy(self.job.decoded(plan, _decoded(outcome))[0])
        if component == "vae_encoder":
            picture = self.job.picture(plan, pixels=outcome.enlarged)
            if isinstance(picture.latents, list):  # an edit's references
                return picture.latents
            return (
                [picture.latents] if picture.masked is None else [picture.latents, picture.masked]
            )
        if component == outcome.denoiser:
            if outcome.unet_input is None:
                return None
            return self.unet_forward(plan, outcome.unet_input)[0]
        return self.job.encode(plan).embeds

    def verify(self, component: str, plan: PrecisionPlan, outcome: Outcome):
        """Whether `plan` repairs the failing part, from one forward pass: finite, and in
        agreement with an fp32 reference of the same inputs (`quality.compare`); returns
        (passed, the part's output). The reference is run once per failing part;
        `self.qualities[component]` keeps the last figure. Passed when no input was kept to
        re-run (the full re-run then decides)."""
        output = self.part_output(component, plan, outcome)
        if output is None:
            return True, None
        key = (component, id(outcome))
        if key not in self._references:
            reference_plan = job_plans.fp32_reference(outcome.plan)
            self._references[key] = self.part_output(component, reference_plan, outcome)
        quality = compare(output, self._references[key])
        self.qualities[component] = quality
        return quality.passed, output

    def quick_check(self, component: str, plan: PrecisionPlan, outcome: Outcome) -> bool:
        return self.verify(component, plan, outcome)[0]


def _decoded(outcome: Outcome) -> Any:
    """The latents whose decode went non-finite: a hires fix's first pass (decoded to be
    enlarged by a pixel upscaler) where that one did, else the image's own."""
    return outcome.vae_latents if outcome.vae_latents is not None else outcome.latents
