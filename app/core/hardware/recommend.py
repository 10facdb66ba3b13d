"""The recommendation for a classified device: every precision setting resolved (never "auto"),
each with a one-line reason, quirks' forced settings applied.
"""

from __future__ import annotations

import re
from typing import Any

from app.core.components import COMPONENT_SETTINGS
from app.core.hardware.records import DeviceInfo, Quirk
from app.core.hardware.selftest import SelfTestResult
from app.core.hardware.selftest_records import ACCUMULATION_OP
from app.core.settings import FIELDS, PRECISION_KEYS, PrecisionSettings


def _quirk_for(device: DeviceInfo, effect: str) -> Quirk | None:
    """The quirk that set the device's class for `effect` ("fp16" or "bf16"), if any."""
    value = getattr(device, effect)
    for quirk in device.quirks:
        if quirk.effects.get(effect) == value:
            return quirk
    return None


def _accumulation_reason(test: SelfTestResult | None) -> str:
    """Why full fp16 accumulation stays off: what the self-test measured here, where it ran."""
    said = "Full fp16 accumulation turns any sum past 65504 into inf; never on by default"
    for row in test.details if test is not None else []:
        if row.op == ACCUMULATION_OP and row.status == "fail":
            return f"{said}; the self-test measured it here: {row.note}"
    return said


def _recommend(
    device: DeviceInfo, test: SelfTestResult | None
) -> tuple[dict[str, Any], dict[str, str]]:
    rec: dict[str, Any] = {}
    why: dict[str, str] = {}
    bf16_ok = device.bf16 == "native"
    if device.kind == "cpu":
        base = "fp32"
        base_why = "On a CPU fp16 is emulated and several times slower than fp32, so fp32 is both safe and fastest"
        if bf16_ok:
            base_why += " (this CPU has native bf16, which can be faster at some loss of detail)"
    elif device.fp16 == "fast":
        base = "fp16"
        passed = " and passed the self-test" if test is not None and test.fp16 == "pass" else ""
        base_why = f"fp16 is fast on this device{passed}; it halves memory and time against fp32"
    elif bf16_ok:
        base = "bf16"
        base_why = f"{_fp16_problem(device, test)}; bf16 is native here and keeps fp32's range"
    else:
        base = "fp32"
        base_why = f"{_fp16_problem(device, test)}; bf16 is {device.bf16} here, so fp32 it is"

    rec["precision"], why["precision"] = base, base_why
    for setting in COMPONENT_SETTINGS:  # each follows the base; the VAE's is decided below
        rec[setting.key], why[setting.key] = base, setting.why
    if base == "fp16" and bf16_ok:
        rec["vae_precision"] = "bf16"
        why["vae_precision"] = (
            "bf16 has fp32's range, so the VAE overflow that blackens SDXL images cannot happen, "
            "at half of fp32's memory"
        )
    elif base == "fp16":
        rec["vae_precision"] = "fp32"
        why["vae_precision"] = (
            f"fp32, like --no-half-vae: SDXL's VAE overflows in fp16 and bf16 is {device.bf16} "
            "here; it costs a fraction of a second per image"
        )
    else:
        rec["vae_precision"] = base
        why["vae_precision"] = (
            "Follows precision: in fp32 the VAE cannot overflow"
            if base == "fp32"
            else "Follows precision: bf16 has fp32's range, so the VAE cannot overflow"
        )

    rec["upcast_attention"] = False
    why["upcast_attention"] = (
        "Attention already runs in fp32"
        if base == "fp32"
        else "No fault of this device needs it; the health check turns it on for models whose "
        "attention overflows (SD 2.x)"
    )
    rec["attention_backend"], why["attention_backend"] = _attention_choice(device, base, test)
    rec["attention_reduced_precision"] = False
    why["attention_reduced_precision"] = (
        "Reduced-precision sums in the math attention kernel can overflow for little speed"
    )
    rec["allow_tf32"] = device.tf32
    why["allow_tf32"] = (
        "TF32 runs fp32 matrix work on tensor cores, several times faster, with fp32's range"
        if device.tf32
        else "This device has no TF32 (NVIDIA Ampere or newer only), so the setting does nothing"
    )
    rec["fp16_reduced_precision_reduction"] = True
    why["fp16_reduced_precision_reduction"] = (
        "PyTorch's default; the health check turns it off only for a model that overflows "
        "because of it"
        if base == "fp16"
        else "PyTorch's default; it has no effect while nothing runs in fp16"
    )
    rec["fp16_accumulation"] = False
    why["fp16_accumulation"] = _accumulation_reason(test)
    rec["t5_fp32_feed_forward"] = False
    why["t5_fp32_feed_forward"] = (
        "A per-model fix: the health check turns it on for a T5 text encoder that overflows"
    )
    for key in ("fp32_modules", "bf16_modules", "clamp_modules"):
        rec[key] = []
        why[key] = "A per-model fix: the health check names the layers of a model that overflow"
    rec["nan_check"] = True
    why["nan_check"] = "Costs nothing per step and catches black images before they are saved"
    rec["auto_fix"] = "auto"
    why["auto_fix"] = "Repairs only the part that went non-finite and remembers the fix"

    components = tuple(setting.key for setting in COMPONENT_SETTINGS)
    forced: dict[str, str] = {}  # setting -> the quirk reason that forced it
    for quirk in device.quirks:
        for key, value in quirk.effects.items():
            if key in PRECISION_KEYS:
                rec[key] = value
                why[key] = forced[key] = f"{quirk.summary} [{quirk.id}]"
    # The all-fp32 switches and the per-component dtypes must tell the same story.
    if rec.get("no_half"):
        for key in ("precision", *components):
            rec[key], why[key] = "fp32", forced.get("no_half", why.get(key, ""))
    if rec.get("no_half_vae"):
        rec["vae_precision"] = "fp32"
        why["vae_precision"] = forced.get("no_half_vae", why["vae_precision"])
    rec["no_half_vae"] = rec["vae_precision"] == "fp32"
    why["no_half_vae"] = forced.get("no_half_vae") or (
        f"The VAE runs in fp32 (see {FIELDS['vae_precision'].label})"
        if rec["no_half_vae"]
        else f"The VAE runs in {rec['vae_precision']}, which has the range it needs"
    )
    rec["no_half"] = all(rec[k] == "fp32" for k in components) and rec["precision"] == "fp32"
    why["no_half"] = forced.get("no_half") or (
        "Everything runs in fp32 on this device, as with --no-half"
        if rec["no_half"]
        else "Half precision is usable here; a targeted fix from the health check beats --no-half"
    )
    rec["vae_tiling"] = "auto"
    why["vae_tiling"] = "Tiles only a decode that would not fit the GPU's memory"
    rec["max_vram_gb"] = 0.0
    why["max_vram_gb"] = (
        "No budget of your own: the device's free memory at the start of each job is used (the "
        "computer's for a CPU or an Apple GPU); set one to leave room for other programs"
    )
    ordered = {key: rec[key] for key in PRECISION_KEYS}
    PrecisionSettings(**ordered)  # every value valid for the schema
    return ordered, {key: why[key] for key in PRECISION_KEYS}


def _fp16_problem(device: DeviceInfo, test: SelfTestResult | None) -> str:
    failed = test.failed_ops("fp16") if test is not None else []
    quirk = _quirk_for(device, "fp16")
    if quirk is not None:
        text = f"{quirk.summary.rstrip('.')} [{quirk.id}]"
        if failed:
            text += f"; the self-test confirms it ({', '.join(failed)})"
        elif test is not None and test.fp16 == "pass":
            text += " (the self-test passed, but this fault depends on the shapes a model uses)"
        return text
    if failed:
        return f"fp16 failed the self-test in {', '.join(failed)}"
    return f"fp16 is {device.fp16} on this device"


def _attention_choice(
    device: DeviceInfo, dtype: str, test: SelfTestResult | None
) -> tuple[str, str]:
    """The fastest attention backend known to work here in `dtype`, and why."""
    candidates = ("flash", "efficient", "cudnn", "math")
    if test is not None:
        passed = test.attention_backends(dtype)
        for backend in candidates:
            if backend in passed:
                return backend, (
                    f"The fastest attention backend that passed the self-test in {dtype} "
                    f"(passed: {', '.join(passed)})"
                )
    cap = device.capability or (0, 0)
    if device.backend == "cuda":
        if dtype in ("fp16", "bf16") and cap >= (8, 0):
            return (
                "flash",
                "Flash attention runs on Ampere and newer in fp16/bf16 and is the fastest",
            )
        if cap >= (5, 0):
            return (
                "efficient",
                "Memory-efficient attention runs on this GPU in this dtype; flash needs Ampere and fp16/bf16",
            )
        return "math", "The plain math kernel is the only attention backend for this GPU"
    if device.backend == "rocm" and device.arch and re.match(r"gfx9(0a|4\d|5\d)$", device.arch):
        return (
            "efficient",
            "Memory-efficient attention is built for AMD Instinct (CDNA2/CDNA3) GPUs",
        )
    if device.backend == "cpu":
        return "flash", "PyTorch's CPU flash-attention kernel is the fastest on a CPU"
    return (
        "math",
        "The math kernel is the attention backend that runs everywhere; no faster one is known to work here",
    )
