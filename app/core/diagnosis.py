"""The one diagnosis engine under the health check and generation's repair: the plan a model
runs under, the fixes to try for a failing component (cheapest first), and what "verified" means.

A fix is verified when the part it repairs, re-run with it, gives finite output **and** that
output agrees with an fp32 reference of the same inputs (`Quality`). Finite is not enough: a
clamp that saturates or a precision loss can give finite nonsense.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from app.core.components import COMPONENTS, FP16_MAX, Role, Status
from app.core.precision import PrecisionPlan, pipeline_components, resolve_plan
from app.core.settings import PrecisionSettings

AT_RISK_HEADROOM = 2.0  # within 2x of 65504: a bigger image or another prompt can tip it over

# Agreement with the fp32 reference, as a signal-to-noise ratio in dB:
#   SNR = 10 * log10(sum(reference^2) / sum((output - reference)^2)).
# bf16 keeps 8 mantissa bits (about 0.4% error per value): the bf16 fixes of the test suite's
# planted faults measure 32-45 dB against fp32 (text encoder, UNet over the probe's three steps,
# decoded image). 20 dB allows an error of 10% of the signal's power, which no precision change
# of a working component comes near, while a saturating clamp lands far below it (the tests'
# clamp of a VAE layer: under 5 dB).
QUALITY_METRIC = "snr_db"
QUALITY_THRESHOLD_DB = 20.0
QUALITY_CEILING_DB = 200.0  # identical outputs: reported as this instead of infinity


@dataclass(frozen=True)
class Quality:
    """How closely an output matches the fp32 reference of the same inputs."""

    value: float
    metric: str = QUALITY_METRIC
    threshold: float = QUALITY_THRESHOLD_DB

    @property
    def passed(self) -> bool:
        return math.isfinite(self.value) and self.value >= self.threshold

    def to_json(self) -> dict[str, Any]:
        return {"metric": self.metric, "value": round(self.value, 2), "threshold": self.threshold}

    def words(self) -> str:
        shown = "identical" if self.value >= QUALITY_CEILING_DB else f"{self.value:.1f} dB"
        return f"{shown} against fp32, threshold {self.threshold:g} dB"


def snr_db(output: Any, reference: Any) -> float:
    """Signal-to-noise ratio of `output` against `reference` in dB, over every floating tensor
    of both (matched in order). -inf when the output is non-finite or shaped differently; the
    ceiling when they are identical."""
    from app.core.probe import float_tensors

    outputs, references = list(float_tensors(output)), list(float_tensors(reference))
    if len(outputs) != len(references) or not references:
        return -math.inf
    signal = noise = 0.0
    for out, ref in zip(outputs, references, strict=True):
        if out.shape != ref.shape:
            return -math.inf
        ref32 = ref.detach().float()
        diff = out.detach().to(ref32.device).float() - ref32
        signal += float(ref32.square().sum())
        noise += float(diff.square().sum())
    if not (math.isfinite(noise) and math.isfinite(signal)):
        return -math.inf
    if noise == 0.0:
        return QUALITY_CEILING_DB
    if signal == 0.0:
        return -math.inf
    return min(QUALITY_CEILING_DB, 10.0 * math.log10(signal / noise))


def compare(output: Any, reference: Any) -> Quality:
    return Quality(snr_db(output, reference))


# --- plans --------------------------------------------------------------------------------


def plan_for_model(
    model,
    precision: PrecisionSettings,
    *,
    device,
    device_info: Any,
    remembered: Mapping[str, Any] | None,
) -> PrecisionPlan:
    """The plan a job on `model` runs under: the user's settings resolved against the device,
    the model's own needs (SDXL's original VAE asks for fp32 through `force_upcast`) and a fix
    remembered for this model on this device. The check and generation both start here."""
    pipeline = model.pipeline
    vae_config = getattr(getattr(pipeline, "vae", None), "config", None)
    return resolve_plan(
        precision,
        feed_forward_islands=feed_forward_islands(pipeline),
        device=device,
        components=pipeline_components(pipeline),
        device_info=device_info,
        vae_needs_fp32=bool(getattr(vae_config, "force_upcast", False))
        and str(model.architecture).startswith("sdxl"),
        remembered=remembered,
    )


def no_half(plan: PrecisionPlan) -> PrecisionPlan:
    """`plan` with every component in fp32: what --no-half does, and the quality reference."""
    return plan.with_dtypes(**dict.fromkeys(plan.dtypes, "fp32"))


def fp32_reference(plan: PrecisionPlan) -> PrecisionPlan:
    """The reference a fix is judged against: everything fp32, full-precision sums, attention
    upcast, TF32 off (TF32 keeps 10 mantissa bits: not a reference), no autocast."""
    return replace(
        no_half(plan),
        upcast_attention=True,
        autocast=False,
        allow_tf32=False,
        fp16_accumulation=False,
        fp16_reduced_precision_reduction=False,
        attention_reduced_precision=False,
    )


def is_t5(module) -> bool:
    return type(module).__name__.startswith("T5")


def feed_forward_islands(pipeline) -> dict[str, dict[str, str]]:
    """Per T5 text encoder of the pipeline, its feed-forward output projections (`wo`, the
    modules transformers keeps in fp32 for T5) as fp32 islands."""
    islands = {}
    for name in pipeline_components(pipeline):
        module = getattr(pipeline, name)
        if COMPONENTS[name].role is Role.TEXT_ENCODER and is_t5(module):
            islands[name] = {
                path: "fp32"
                for path, _ in module.named_modules()
                if path.endswith("DenseReluDense.wo")
            }
    return islands


# --- fixes --------------------------------------------------------------------------------


@dataclass(frozen=True)
class FixCandidate:
    """One fix to try: the plan to re-run under, the settings it means, and its words."""

    plan: PrecisionPlan
    settings: Mapping[str, Any]
    words: str


def _is_attention(module_name: str | None, component_module) -> bool:
    if not module_name:
        return False
    from diffusers.models.attention_processor import Attention

    try:
        return isinstance(component_module.get_submodule(module_name), Attention)
    except AttributeError:
        return False


def is_attention_overflow(module_name: str | None, component_module) -> bool:
    """Softmax turns inf scores into NaN, so NaN out of an attention layer whose inputs were
    finite is an overflow of its scores, not a NaN from nowhere."""
    return _is_attention(module_name, component_module)


def candidate_fixes(
    component: str, plan: PrecisionPlan, first_bad: str | None, module, bf16_native: bool
) -> Iterator[FixCandidate]:
    """Fixes for one failing component, cheapest first: reduced-precision accumulation off
    (CUDA), upcast attention (when the first bad layer is an attention layer), the T5
    feed-forward output projections in fp32 (when the first bad layer is in a T5 feed-forward:
    a few matrices instead of the whole encoder), bf16 (where native), fp32 for that component
    alone. Whole-model fp32 is the caller's last resort."""
    spec = COMPONENTS[component]
    dtype = plan.dtypes[component]
    reduced = (
        plan.fp16_accumulation
        or plan.attention_reduced_precision
        or plan.fp16_reduced_precision_reduction
    )
    if plan.device.startswith("cuda") and dtype != "fp32" and reduced:
        off = {
            "fp16_accumulation": False,
            "attention_reduced_precision": False,
            "fp16_reduced_precision_reduction": False,
        }
        yield FixCandidate(replace(plan, **off), off, "turn off reduced-precision accumulation")
    if spec.has_attention and not plan.upcast_attention and _is_attention(first_bad, module):
        yield FixCandidate(
            replace(plan, upcast_attention=True),
            {"upcast_attention": True},
            "upcast attention to fp32",
        )
    if (
        dtype != "fp32"
        and is_t5(module)
        and first_bad is not None
        and "DenseReluDense" in first_bad
        and not plan.islands(component)
    ):
        islands = {
            path: "fp32" for path, _ in module.named_modules() if path.endswith("DenseReluDense.wo")
        }
        yield FixCandidate(
            plan.with_modules(component, islands),
            {"t5_fp32_feed_forward": True},
            f"keep the {spec.words}'s T5 feed-forward output projections (wo) in fp32",
        )
    if dtype == "fp16" and bf16_native:
        yield FixCandidate(
            plan.with_dtypes(**{component: "bf16"}),
            {spec.setting: "bf16"},
            f"run the {spec.words} in bf16",
        )
    if dtype != "fp32":
        yield FixCandidate(
            plan.with_dtypes(**{component: "fp32"}),
            {spec.setting: "fp32"},
            f"run the {spec.words} in fp32",
        )


def everything_fp32(plan: PrecisionPlan) -> FixCandidate:
    return FixCandidate(no_half(plan), {"no_half": True}, "run everything in fp32")


# --- predictions --------------------------------------------------------------------------


def status_from_peak(peak: float | None) -> Status:
    """What a finite run's largest activation says about fp16: past 65504 it overflows, within
    2x of it a bigger image or another prompt can tip it over."""
    if peak is None or not math.isfinite(peak):
        return Status.OVERFLOW
    if peak > FP16_MAX:
        return Status.OVERFLOW
    if peak > FP16_MAX / AT_RISK_HEADROOM:
        return Status.AT_RISK
    return Status.OK
