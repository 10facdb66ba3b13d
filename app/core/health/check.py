"""`check_loaded`, the health check of a loaded model: the text encoders, the denoiser and
the VAE each run once, every component that went non-finite given its fix (`fix.choose_fix`),
everything in fp32 as the last resort, then the verdict, the fix's cost and the report."""

from __future__ import annotations

import time
from collections.abc import Callable

from app import __version__
from app.core import diagnosis
from app.core.components import Verdict, join_words
from app.core.components import words as component_words
from app.core.diagnosis import no_half
from app.core.errors import HalfSafeError
from app.core.families import family_of
from app.core.health.fix import Search, choose_fix, fix_summary, last_resort
from app.core.health.observations import (
    Observations,
    at_fault,
    component_report,
    fp16_advice,
    mark_fed_by,
    predicted_islands,
)
from app.core.health.report import ComponentReport, Fix, HealthReport, component_of_tensor
from app.core.health.stages import (
    DEFAULT_PROMPT,
    DEFAULT_SCHEDULER,
    DEFAULT_STEPS,
    Runner,
    Stage,
    all_finite,
    finite_stand_in,
    first_bad_name,
)
from app.core.jobs import CancelToken, ProgressCallback, no_progress
from app.core.precision import PrecisionPlan
from app.core.prediction import prediction_summary
from app.core.probe import ProbeResult
from app.core.settings import PrecisionSettings


def check_loaded(
    model,
    *,
    precision: PrecisionSettings,
    device: str = "auto",
    size: int | None = None,
    steps: int = DEFAULT_STEPS,
    scheduler: str = DEFAULT_SCHEDULER,
    prompt: str = DEFAULT_PROMPT,
    on_progress: ProgressCallback | None = None,
    cancel: CancelToken | None = None,
    remember: bool = True,
    measure_cost: bool = True,
) -> HealthReport:
    """Check a loaded model on `device` under the user's precision settings.

    `steps` and `scheduler` are the user's sampler settings: the denoiser is probed at the first,
    middle and last timesteps of that schedule. Runs on the calling thread and takes seconds on a
    GPU. Side effects: components are copied to the device for the duration (released at the
    end), and a verified fix is stored in the model's remembered profile (unless `remember` is
    False). With `measure_cost`, a verified fix is also timed against no-half, alternating.
    """
    import torch

    from app.core import hardware, profiles

    started = time.perf_counter()
    progress = on_progress or no_progress
    cancel = cancel or CancelToken()
    size = size or model.native_size
    if size < 64 or size % 8:
        raise HalfSafeError(f"The check size must be a multiple of 8 and at least 64, not {size}.")
    problem = family_of(model.pipeline).size_problem(model.pipeline, size, size)
    if problem is not None:
        raise HalfSafeError(f"{model.name}: {problem}")

    torch_device = hardware.pick_device(device)
    info = hardware.describe_device(torch_device)
    found = profiles.lookup(model.profile_key, info.name)
    remembered = found.fix
    plan = diagnosis.plan_for_model(
        model,
        precision,
        device=torch_device,
        device_info=info,
        remembered=remembered.settings if remembered else None,
    )
    notes = list(plan.warnings) + found.notes + list(getattr(model, "notes", []))
    notes.extend(profiles.remembered_words(remembered, plan))
    bad_weights = sorted(model.weights.non_finite)
    bad_quantized = list(getattr(model.weights, "bad_quantized", []))
    broken = {component_of_tensor(name) for name in bad_weights} | {
        f.component or component_of_tensor(f.tensor) for f in bad_quantized
    }
    quantization = getattr(model, "quantization", None)
    if quantization and not bad_quantized:
        notes.append(
            f"The model is stored quantized ({quantization['format']}: "
            f"{', '.join(quantization['types'])}); the check ran on its weights dequantised to "
            f"{quantization['dequantized_to']}, whose scales and decoded values are plausible."
        )
    runner = Runner(model, plan, size, prompt, steps, scheduler)
    seen = Observations()
    search = Search(plan)
    bf16_native = getattr(info, "bf16", None) == "native"
    reports: dict[str, ComponentReport] = {}
    first_probes: dict[str, ProbeResult] = {}
    predicted_layers: dict[str, list[str]] = {}
    try:

        def settle(
            stage_fn: Callable[[PrecisionPlan, bool], Stage], names: list[str], first: Stage
        ) -> Stage:
            """Report each component of a stage and, for one that failed, find its fix: the
            cheapest candidate whose re-run is finite and agrees with the fp32 reference."""
            seen.add(first, search.plan)
            good = first
            reference: Stage | None = None
            for name in names:
                probe = first_probes[name] = first.probes[name]
                verify: ProbeResult | None = None
                if name in broken:
                    pass
                elif probe.non_finite and good is not first and not good.probes[name].non_finite:
                    verify = good.probes[name]  # the fix found for a sibling fixed this one too
                elif probe.non_finite:
                    if reference is None:
                        progress("Running the fp32 reference", 0, 1)
                        reference = stage_fn(diagnosis.fp32_reference(search.plan), True)
                    chosen = choose_fix(
                        name,
                        stage_fn,
                        search,
                        reference,
                        runner,
                        seen,
                        first_bad_name(probe),
                        bf16_native,
                        measure_cost,
                        progress,
                        cancel,
                    )
                    if chosen is not None:
                        # The fp32 reference shows the true magnitude (a clamp's run would not).
                        verify, good = reference.probes[name], chosen
                    if verify is None:
                        search.unfixed.append(name)
                reports[name] = component_report(
                    name,
                    plan.dtypes[name],
                    probe,
                    verify,
                    first.seconds.get(name, 0.0),
                    runner.placed[name],
                    name in broken,
                )
            return good

        total = 3
        progress("Checking the text encoder", 0, total)
        cancel.raise_if_cancelled()
        te_names = [n for n in runner.family.text_encoders(model.pipeline) if n in plan.dtypes]
        encoded = settle(runner.encode, te_names, runner.encode(plan))

        # A stage fed non-finite values by an earlier one is checked on a finite stand-in, and
        # its components are reported as fed by the first component at fault upstream.
        fed_by: str | None = None
        progress(f"Checking the {component_words(runner.family.denoiser)}", 1, total)
        cancel.raise_if_cancelled()
        conditioning = encoded.output
        if not all_finite(conditioning):  # nothing fixed an encoder: zero what is non-finite
            fed_by = at_fault(te_names, reports)
            conditioning = finite_stand_in(conditioning)
        denoised = settle(
            lambda p, record: runner.denoise(p, conditioning, record),
            [runner.family.denoiser],
            runner.denoise(search.plan, conditioning),
        )
        mark_fed_by(reports, [runner.family.denoiser], fed_by, notes, "zeroed embeddings")

        progress("Checking the VAE", 2, total)
        cancel.raise_if_cancelled()
        latents = denoised.output
        stand_in = f"what the {component_words(runner.family.denoiser)} made of its stand-in"
        if not all_finite(latents):  # nothing fixed the denoiser: decode a plausible latent
            fed_by = fed_by or at_fault([runner.family.denoiser], reports)
            stand_in = "a seeded noise latent"
            latents = torch.randn(latents.shape, generator=torch.Generator().manual_seed(1)).to(
                latents.device
            )
        settle(
            lambda p, record: runner.decode(p, latents, record),
            ["vae"],
            runner.decode(search.plan, latents),
        )
        mark_fed_by(reports, ["vae"], fed_by, notes, stand_in)

        last_resort(runner, search, seen, reports, first_probes, plan, broken, progress, cancel)

        for name, probe in first_probes.items():
            root = probe.modules.get("")
            if probe.first_bad_module() is None and root is not None and root.non_finite:
                notes.append(
                    f"The {component_words(name)} received values already beyond fp16's "
                    "range from the part before it, so no layer inside it is to blame."
                )
        for name, report in reports.items():
            report.precisions = seen.precisions(name, name in broken)
            note = seen.score_note(name)
            if note:
                notes.append(note)
        failed = [n for n, r in reports.items() if r.status.failed]
        notes.extend(search.rejected)
        fix = None
        if broken or search.unfixed:
            verdict = Verdict.BROKEN
            if bad_weights:
                notes.append(
                    "The weights themselves hold NaN or Inf values: this file is damaged, "
                    "and no precision setting can repair it."
                )
            if bad_quantized:
                more = f" (and {len(bad_quantized) - 1} more)" if len(bad_quantized) > 1 else ""
                notes.append(
                    f"Quantized weights decode wrongly: {bad_quantized[0].sentence}{more}. "
                    "This is the file's quantisation (or the tool that converted it), not fp16 "
                    "overflow, and no precision setting can repair it."
                )
            if not broken:
                notes.append(
                    f"The {join_words(search.unfixed)} gives no finite output that agrees with "
                    "fp32 under any precision setting, so the cause is not precision (the "
                    "weights, a LoRA or a kernel: see the cause, where one was found)."
                )
        elif failed:
            verdict = Verdict.FIXABLE
            quality = min(search.qualities.values(), key=lambda q: q.value, default=None)
            fix = Fix(
                search.plan,
                search.settings,
                fix_summary(failed, search.words, plan, search.plan, quality),
                verified=quality is not None and quality.passed,
                quality=quality,
                steps=list(search.words),
                candidates=list(search.candidates),
                baselines=dict(search.baselines),
            )
            if measure_cost:
                progress("Measuring the cost of the fix", 3, total)
                fix.cost = runner.unet_step_costs(
                    {"fix": search.plan, "no_half": no_half(plan)}, conditioning
                )
            if remember and fix.verified:
                profiles.remember_fix(
                    model.profile_key, info.name, search.settings, fix.summary, "health check"
                )
        else:
            verdict = Verdict.HEALTHY
            predicted_layers = predicted_islands(reports, first_probes, runner.placed)
    finally:
        # Also on cancel or error: drop the device copies and hand cached memory back.
        runner.placed.release()
    progress("Done", total, total)

    return HealthReport(
        model={
            "source": model.source,
            "format": model.format,
            "architecture": model.architecture,
            "name": model.name,
            "prediction": prediction_summary(model),
            "quantization": getattr(model, "quantization", None),
            "companions": dict(getattr(model, "companions", {})),
        },
        device={"kind": info.kind, "name": info.name},
        plan=plan,
        size=size,
        weights_non_finite=bad_weights,
        components=reports,
        verdict=verdict,
        fix=fix,
        seconds=time.perf_counter() - started,
        notes=notes,
        versions=_versions(),
        remembered=remembered.summary if remembered and plan.remembered_used else None,
        timesteps=runner.timesteps,
        advice=(
            fp16_advice(reports, plan, bf16_native, predicted_layers)
            if verdict is Verdict.HEALTHY
            else None
        ),
        loras=list(getattr(model, "loras", [])),
        tried=list(search.candidates),
        weights_bad_quantized=[f.to_json() for f in bad_quantized],
    )


def _versions() -> dict[str, str]:
    import diffusers
    import torch

    return {
        "halfsafe": __version__,
        "torch": torch.__version__,
        "diffusers": diffusers.__version__,
        "cuda": torch.version.cuda or "",
        "hip": getattr(torch.version, "hip", None) or "",
    }
