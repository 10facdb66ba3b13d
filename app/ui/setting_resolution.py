"""What a setting's Auto, or the recommendation, comes to on this computer, in words: the line
under each setting on the Settings page ("Auto means fp16 here: ..."). It reads the settings,
the hardware report, the loaded model's remembered fix and the next job's precision plan from
the app state, and changes nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from app.core.components import COMPONENTS
from app.core.precision import CUDA_ONLY_BACKENDS
from app.core.precision.resolve import left_as_it_comes
from app.core.settings import FIELDS
from app.ui import words

if TYPE_CHECKING:
    from app.ui.state import AppState

# Components whose `auto` follows the base precision rather than a recommendation of its own.
_FOLLOWS_PRECISION = ("unet_precision", "vae_precision", "text_encoder_precision")
# The settings that each give some parts their dtype.
_PART_SETTINGS = tuple(dict.fromkeys(c.setting for c in COMPONENTS.values()))
# What no-half overrides: with it on, these run in fp32 whatever they say.
_OVERRIDDEN_BY_NO_HALF = ("precision", *_PART_SETTINGS, "no_half_vae")


def resolution_text(state: AppState, key: str) -> str:
    """What `auto` (or the recommendation) means for `key` on this computer, in words."""
    value = state.settings[key]
    recommended = state.recommended()
    reasons = state.reasons()
    reason = reasons.get(key, "")
    have_report = state.hardware is not None
    if state.settings["no_half"] and key in _OVERRIDDEN_BY_NO_HALF:
        return "No-half is on, so this runs in fp32 whatever is chosen here."
    lacking = _device_lacks(state, key, value)
    if lacking:
        return lacking
    model = state.model
    fix = model.remembered_fix if model is not None else None
    remembered = fix.settings if fix is not None else {}
    if left_as_it_comes(key, value) and key in remembered and remembered[key] != value:
        # Jobs fill fields left on Auto (off, empty) from the loaded model's remembered fix.
        return (
            f"For {model.name if model else 'the loaded model'}, jobs use its remembered fix: "
            f"{words.setting_value(key, remembered[key])}."
        )
    planned = _planned(state, key) if value == "auto" else None
    if planned is not None and planned[1]:
        # What the next job runs this part in, and why: the model's own need, the device's
        # recommendation, a remembered fix (as the status bar says it).
        return _sentence(f"Auto means {words.choice_name(planned[0])} here", planned[1])
    if key == "device" and value == "auto":
        device = state.device_report()
        if device is None:
            return (
                "Auto picks the best GPU (else the CPU) when the engine first runs; the "
                "Devices page shows which."
            )
        return f"Auto picks {device.name} here."
    if value == "auto" and key in (
        "text_encoder_2_precision",
        "text_encoder_3_precision",
        "prompt_upsampler_precision",
    ):
        first = state.settings["text_encoder_precision"]
        if first != "auto":
            return f"Auto follows the text encoder: {words.choice_name(first)}."
        key = "text_encoder_precision"  # which follows Precision, as below
    if value == "auto" and key in _FOLLOWS_PRECISION:
        base = state.settings["precision"]
        if base != "auto":
            return f"Auto follows Precision: {words.choice_name(base)}."
        resolved = recommended.get(key) or recommended.get("precision")
        if not resolved or resolved == "auto":
            return "Auto follows Precision."
        return _sentence(f"Auto means {words.choice_name(resolved)} here", reason)
    if value == "auto" and key == "vae_tiling":
        if _on_cpu(state):
            return "Auto does not tile on a CPU: its memory is the computer's."
        return (
            "Auto tiles when a picture's decode would not fit the GPU memory free beside "
            "the VAE, decided at each job's size."
        )
    if value == "auto" and FIELDS[key].kind == "choice":
        if not have_report:
            return (
                "Auto is decided from your device and the model when a job runs; the "
                "Devices page shows what it picks."
            )
        resolved = recommended.get(key)
        if resolved is None or resolved == "auto":
            return "Auto is decided from the model when a job runs."
        if key == "attention_backend" and _on_cpu(state):
            # PyTorch's fused CPU kernel carries the flash name; "Flash attention" reads as
            # the GPU library to most people.
            return _sentence("Auto lets PyTorch use its fused CPU attention kernel here", "")
        return _sentence(f"Auto means {words.choice_name(resolved)} here", reason)
    if (
        key == "attention_backend"
        and _on_cpu(state)
        and recommended.get(key) in ("flash", "efficient", "cudnn")
    ):
        return ""  # GPU kernels are no recommendation for a CPU
    if key in recommended and recommended[key] != value and recommended[key] != "auto":
        return _sentence(
            f"Recommended for this computer: {words.setting_value(key, recommended[key])}",
            reason,
        )
    return ""


def _planned(state: AppState, key: str) -> tuple[str, str] | None:
    """(dtype, why) the next job's plan gives the parts `key` governs (`why` empty when it
    follows the base); None when no plan is known yet or no such part is loaded."""
    if key not in _PART_SETTINGS:
        return None
    plan = state.expected_plan()
    if plan is None:
        return None
    parts = [part for part in plan.dtypes if COMPONENTS[part].setting == key]
    if not parts:
        return None
    return plan.dtypes[parts[0]], plan.reasons.get(key, "")


def _on_cpu(state: AppState) -> bool:
    device = state.device_report()
    return device is not None and device.kind == "cpu"


def _device_lacks(state: AppState, key: str, value: Any) -> str:
    """What the device in use cannot do of this choice (jobs run and record what it can:
    core's `precision.resolve._what_the_device_runs`); "" when it can, or is not known yet."""
    device = state.device_report()
    kind = device.kind if device is not None else None
    if kind is None or kind in ("cuda", "rocm"):
        return ""
    if key == "attention_backend" and value in CUDA_ONLY_BACKENDS and kind in ("cpu", "mps"):
        return (
            f"Not on this device: {CUDA_ONLY_BACKENDS[value]} needs a CUDA GPU, so jobs "
            "run the math kernel and record that."
        )
    if key == "fp16_accumulation" and value:
        return (
            "Not on this device: full fp16 accumulation is a CUDA setting, so it does "
            "nothing here and jobs record it off."
        )
    return ""


def _sentence(head: str, reason: str) -> str:
    reason = reason.strip().rstrip(".")
    if reason:
        return f"{head}: {reason}."
    return f"{head}."
