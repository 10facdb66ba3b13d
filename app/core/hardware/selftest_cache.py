"""A device and the self-test (`app.core.hardware.selftest`): its cache key, its cached verdict, and the
half dtypes not worth testing on it.

Imports torch only inside the function that needs it.
"""

from __future__ import annotations

from app.core.hardware.recommend import _quirk_for
from app.core.hardware.records import DeviceInfo
from app.core.hardware.selftest import SelfTestResult


def _cached_self_test(device: DeviceInfo) -> SelfTestResult | None:
    from app.core.hardware import selftest

    return selftest.cached_result(self_test_key(device))


def self_test_key(device: DeviceInfo) -> str:
    """The self-test cache key for `device`: its name, driver and this PyTorch version."""
    import torch

    from app.core.hardware import selftest

    return selftest.cache_key(device.name, device.driver, torch.__version__, device.kind)


def self_test_skips(device: DeviceInfo) -> dict[str, str]:
    """The half dtypes not worth testing on `device` (classified unsupported), with the reason."""
    skips = {}
    for dtype in ("fp16", "bf16"):
        if getattr(device, dtype) == "unsupported":
            quirk = _quirk_for(device, dtype)
            reason = f"{dtype} is not supported on this device"
            skips[dtype] = f"{reason} [{quirk.id}]" if quirk else reason
    return skips


def dtype_speed(device: DeviceInfo, torch_device):
    """The device's matmul and convolution throughput per dtype (`dtype_speed.DtypeSpeed`),
    cached beside its self-test under the same key; measured now (a fraction of a second) and
    cached where there is none. The half dtypes the device does not support are not measured."""
    from app.core.hardware import dtype_speed as speed

    key = self_test_key(device)
    found = speed.cached(key)
    if found is not None:
        return found
    dtypes = [d for d in speed.DTYPES if d not in self_test_skips(device)]
    measured = speed.measure(torch_device, key, dtypes)
    speed.store(measured)
    return measured
