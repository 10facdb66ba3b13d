"""A described device classified (its fp16, bf16 and TF32 classes from its kind and capability,
the quirks it matches and its self-test) and given its recommendation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from app.core.hardware.probe import _BF16_FLAGS
from app.core.hardware.quirks import load_quirks
from app.core.hardware.recommend import _recommend
from app.core.hardware.records import BF16_CLASSES, FP16_CLASSES, DeviceInfo, Quirk
from app.core.hardware.selftest import SelfTestResult
from app.core.settings.values import setting_word


def assess(
    device: DeviceInfo,
    self_test: SelfTestResult | None = None,
    quirks: Sequence[Quirk] | None = None,
) -> DeviceInfo:
    """Classify `device` (capability, quirks, self-test) and attach the recommendation.

    Pure: returns a new DeviceInfo. A dtype that failed the self-test is lowered to
    "unreliable" (fp16) or "unsupported" (bf16), whatever its capability suggests.
    """
    quirks = load_quirks() if quirks is None else quirks
    matched = tuple(q for q in quirks if q.matches(device))
    fp16, bf16, tf32 = _base_classes(device)
    for quirk in matched:
        fp16 = _worse(FP16_CLASSES, fp16, setting_word(quirk.effects, "fp16") or None)
        bf16 = _worse(BF16_CLASSES, bf16, setting_word(quirk.effects, "bf16") or None)
        if quirk.effects.get("tf32") is False:
            tf32 = False
    test = self_test if self_test is not None and self_test.ran else None
    if test is not None and test.fp16 == "fail":
        fp16 = _worse(FP16_CLASSES, fp16, "unreliable")
    if test is not None and test.bf16 == "fail":
        bf16 = "unsupported"
    classified = replace(
        device, fp16=fp16, bf16=bf16, tf32=tf32, quirks=matched, self_test=self_test
    )
    recommended, reasons = _recommend(classified, test)
    return replace(classified, recommended=recommended, reasons=reasons)


def _base_classes(device: DeviceInfo) -> tuple[str, str, bool]:
    """What the device kind and capability alone say; quirks can only make these worse."""
    if device.backend == "cuda":
        ampere = (device.capability or (0, 0)) >= (8, 0)
        return "fast", "native" if ampere else "emulated", ampere
    if device.backend == "rocm":
        return "fast", "native", False
    if device.backend == "mps":
        # bf16 works on Apple's GPU from macOS 14, computed through fp32 on M1/M2.
        return "fast", "emulated", False
    if device.backend == "xpu":
        return "fast", "native" if "xmx" in device.features else "emulated", False
    if device.backend == "directml":
        return "fast", "native", False
    native = bool(device.features & _BF16_FLAGS)
    return "slow", "native" if native else "emulated", False


def _worse(order: tuple[str, ...], current: str, other: str | None) -> str:
    if other is None:
        return current
    return max(current, other, key=order.index)
