"""HalfSafe Check inside ComfyUI: one denoiser call recorded at the precision ComfyUI runs it,
the first bad layer named, an attention kernel fault told apart from an overflow (the same call
right on PyTorch's own attention at the same precision), and otherwise the cheapest fix proved
against an fp32 reference of the same call (layer islands before the whole component), with the
quality metric the desktop uses."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from . import attention, host


@dataclass
class Outcome:
    verdict: str  # "healthy" | "fixable" | "broken"
    lines: list[str] = field(default_factory=list)
    first_bad_layer: str | None = None  # ComfyUI's name
    first_bad_halfsafe: str | None = None  # HalfSafe's name, where the model has one
    # {"islands": {path: dtype}, "component": dtype|None, "attention": backend|None, ...}
    fix: dict | None = None
    notes: list[str] = field(default_factory=list)
    work: Any = None  # app.core.work.Work: what the check ran, counted

    @property
    def text(self) -> str:
        return "\n".join(self.lines + self.notes)


def _island_dtype(model) -> str:
    import torch

    device = torch.device(model.load_device)
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return "bf16"
    return "fp32"


def check(model, width: int, height: int, steps: int, seed: int, clip=None) -> Outcome:
    """Check `model` (never changed: every run is on a clone) as ComfyUI runs it, its work
    counted (`Outcome.work`: the diffusion model's calls by dtype, the layers copied) and
    told in the report's last line."""
    from app.core import work

    with work.counting() as done, host.counting_calls(host.diffusion_model(model)):
        outcome = _check(model, width, height, steps, seed, clip)
    outcome.work = done
    outcome.notes.append(work_words(done))
    return outcome


def work_words(done) -> str:
    by_dtype = done.calls.get(host.COMPONENT, {})
    calls = sum(by_dtype.values())
    each = ", ".join(f"{n} in {dtype}" for dtype, n in sorted(by_dtype.items()))
    said = f"The check ran the diffusion model {calls} time{'s' * (calls != 1)}"
    said += f" ({each})" if each else ""
    if done.placements:
        said += f" and copied {done.placements} layer{'s' * (done.placements != 1)}"
    return said + "."


def _check(model, width: int, height: int, steps: int, seed: int, clip=None) -> Outcome:
    from app.core.components import FP16_MAX
    from app.core.fixing.module_check import recorded_call, reference_call
    from app.core.fixing.quality import compare

    module = host.diffusion_model(model)
    runs = model.clone()
    dtypes = host.precision(runs)
    host.load(runs)
    call = host.one_call(runs, width, height, steps, seed, clip)
    seen = recorded_call(module, lambda: module(*call.args, **call.kwargs))
    said = (
        f"HalfSafe Check: the diffusion model stored in {dtypes['stored']}"
        + (f" ({dtypes['low_bit']})" if dtypes.get("low_bit") else "")
        + f", computing in {dtypes['compute']}, one call at sigma {call.sigma:.3g}, "
        f"{width}x{height}."
    )
    if call.text == "zeros":
        said += " No CLIP connected: the text was zeros of the model's own text width."
    peak = seen.probe.half_max_abs or seen.probe.max_abs
    reference = None
    if seen.finite and peak >= FP16_MAX:
        # Finite, but at fp16's largest value: the model's own code may have turned an
        # overflow into +-65504 (ComfyUI's Flux blocks do, after a residual add no layer
        # returns). Healthy only where the same call in fp32 agrees.
        reference = reference_call(module, call.args, call.kwargs)
        held = compare(seen.output, reference.output)
        if held.passed:
            return Outcome(
                "healthy",
                [
                    said,
                    "Healthy: every layer stayed finite; some reached fp16's largest value, "
                    f"and the output agrees with fp32 ({held.words()}).",
                ],
            )
    elif seen.finite:
        headroom = FP16_MAX / peak if peak else math.inf
        return Outcome(
            "healthy",
            [said, f"Healthy: every layer stayed finite (headroom {headroom:.3g}x fp16's range)."],
        )
    names = host.halfsafe_names(runs)
    first = seen.first_bad_layer or (_first_at_the_limit(seen.probe) if seen.finite else None)
    outcome = Outcome("broken", [said])
    if seen.finite:
        outcome.lines.append(
            "Its output stayed finite but reached fp16's largest value (65504): the model's own "
            "code held an overflow at fp16's range, so the picture comes out wrong rather "
            "than black."
        )
    if first:
        outcome.first_bad_layer = f"{host.PREFIX}.{first}"
        outcome.first_bad_halfsafe = host.halfsafe_name(names, module, first)
        also = (
            f" (HalfSafe: unet.{outcome.first_bad_halfsafe})" if outcome.first_bad_halfsafe else ""
        )
        outcome.lines.append(f"First bad layer: {outcome.first_bad_layer}{also}.")
    else:
        outcome.lines.append("The output went non-finite with no layer to name (its input was).")
    # A kernel fault first: a precision change can "fix" it by taking another kernel path.
    fault = attention.kernel_fault(module, call)
    if fault is not None:
        stats = seen.probe.modules.get(first) if first else None
        outcome.lines += attention.fault_lines(
            fault, dtypes["compute"], outcome.first_bad_layer, stats
        )
        return _switched(outcome, fault, dtypes)
    unswitchable = attention.dispatched_unswitchable()
    if unswitchable:
        outcome.notes.append(
            f"ComfyUI's attention runs {unswitchable}, which does not take ComfyUI's attention "
            "override: an attention kernel fault is not told apart from an overflow here."
        )
    reference = reference or reference_call(module, call.args, call.kwargs)
    if not reference.finite:
        outcome.lines.append("Broken: even fp32 gives non-finite output; no precision fix.")
        return outcome
    if _all_finite(seen.output) and not seen.finite:
        masked = compare(seen.output, reference.output)
        outcome.lines.append(
            f"Its output stayed finite ({masked.words()}): the model's own code replaced the "
            "non-finite values, so the picture comes out wrong rather than black."
        )
    proof = prove(model, module, call, reference)
    if proof.islands:
        return _fixed(outcome, proof.fix, proof.quality, proof.islands, proof.dtype, dtypes)
    outcome.verdict, outcome.fix = "fixable", proof.fix
    outcome.lines += [f"Tried: {t}." for t in proof.tried] + [proof.fix["summary"]]
    return outcome


def _first_at_the_limit(probe) -> str | None:
    """The first layer, in the order the call finished them, whose fp16 output reached fp16's
    largest value."""
    from app.core.components import FP16_MAX

    at = [m for m in probe.modules.values() if m.name and m.half_max_abs >= FP16_MAX]
    return min(at, key=lambda m: m.order).name if at else None


@dataclass
class Proof:
    fix: dict  # the nodes' fix: islands, or the whole diffusion model in fp32
    islands: list[str] = field(default_factory=list)  # empty: the whole model in fp32
    dtype: str = "fp32"
    quality: object = None  # against the fp32 reference; None for the reference itself
    tried: list[str] = field(default_factory=list)


def prove(model, module, call, reference) -> Proof:
    """The cheapest fix of one failing denoiser `call` of `model` proved against `reference`,
    the same call in fp32 (finite): the overflowing layers kept wider (bf16 where the device
    computes it, then fp32), each tried on a clone; else the whole diffusion model in fp32,
    which is the reference itself."""
    from app.core.fixing.layer_islands import overflow_islands
    from app.core.fixing.module_check import closed_islands
    from app.core.fixing.quality import compare

    islands = closed_islands(reference.probe, overflow_islands(reference.probe, module) or [""])
    tried: list[str] = []
    if islands != [""]:
        for dtype in dict.fromkeys([_island_dtype(model), "fp32"]):
            fix = {"islands": dict.fromkeys(islands, dtype), "component": None}
            trial = model.clone()
            host.apply_islands(trial, fix["islands"])
            quality = compare(host.run_call(trial, call), reference.output)
            tried.append(f"{len(islands)} layer(s) in {dtype}: {quality.words()}")
            if quality.passed:
                return Proof(fix, islands, dtype, quality, tried)
    fix = {
        "islands": {},
        "component": "fp32",
        "summary": "Run the whole diffusion model in fp32 (verified: it is the fp32 reference).",
        "quality": None,
    }
    return Proof(fix, tried=tried)


def _all_finite(output) -> bool:
    import torch

    tensor = output if isinstance(output, torch.Tensor) else output[0]
    return bool(torch.isfinite(tensor).all())


def _fixed(outcome: Outcome, fix: dict, quality, islands: list[str], dtype: str, dtypes) -> Outcome:
    paths = ", ".join(f"{host.PREFIX}.{p}" for p in islands)
    fix["summary"] = (
        f"Keep {len(islands)} layer(s) in {dtype}: {paths} (verified fix, {quality.words()})."
    )
    fix["quality"] = quality.to_json()
    fix["made_at"] = {"unet_precision": dtypes["compute"]}
    outcome.verdict, outcome.fix = "fixable", fix
    outcome.lines.append(f"Fixable: {fix['summary']}")
    outcome.lines.append("Add HalfSafe Fix between the loader and the sampler to apply it.")
    return outcome


def _switched(outcome: Outcome, fault, dtypes) -> Outcome:
    summary, how = attention.fix_words(fault)
    fix = {
        "islands": {},
        "component": None,
        "attention": attention.BACKEND,
        "summary": summary,
        "quality": fault.quality.to_json(),
        "made_at": {"unet_precision": dtypes["compute"]},
    }
    outcome.verdict, outcome.fix = "fixable", fix
    outcome.lines += [f"Fixable: {summary}", how]
    return outcome
