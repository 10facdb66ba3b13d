"""What this computer's devices can do in fp16, bf16 and TF32, and the precision to use on each.

A device is first described from what PyTorch, NVML and the OS report, then classified from
its capability and the data-driven quirks table (`app/resources/quirks.json`), then given a
recommendation: every precision setting resolved (never "auto"), each with a one-line reason.

One responsibility per module, each importing only those before it:
  records    the classes, Quirk and its match rule, DeviceInfo, HardwareReport, their JSON
  quirks     the quirks table, read and checked
  probe      one device described from what PyTorch, NVML and the OS report
  recommend  every precision setting resolved for a classified device, with its reason
  classify   assess: a device's classes from capability, quirks and self-test
  selftest_cache  a device's self-test cache key, cached verdict, and dtypes not worth testing
  devices    the devices PyTorch can use: listed, described, picked for a device setting
  report     hardware_report: every device assessed, with notes for the user

Importing this package does not import torch; the functions that need it import it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.core.lazy import lazy_exports

if TYPE_CHECKING:
    from app.core.hardware.classify import assess
    from app.core.hardware.devices import describe_device, list_devices, pick_device
    from app.core.hardware.probe import CPU_BF16_ENV, nvidia_driver, nvidia_gpu_names
    from app.core.hardware.quirks import QUIRKS_FILE, load_quirks
    from app.core.hardware.records import (
        BACKENDS,
        BF16_CLASSES,
        FP16_CLASSES,
        KINDS,
        DeviceInfo,
        HardwareReport,
        Quirk,
        device_entry,
    )
    from app.core.hardware.report import hardware_report
    from app.core.hardware.selftest_cache import self_test_key, self_test_skips

__all__ = [
    "BACKENDS",
    "BF16_CLASSES",
    "CPU_BF16_ENV",
    "FP16_CLASSES",
    "KINDS",
    "QUIRKS_FILE",
    "DeviceInfo",
    "HardwareReport",
    "Quirk",
    "assess",
    "describe_device",
    "device_entry",
    "hardware_report",
    "list_devices",
    "load_quirks",
    "nvidia_driver",
    "nvidia_gpu_names",
    "pick_device",
    "self_test_key",
    "self_test_skips",
]

if not TYPE_CHECKING:  # pyright would take any name from a module with __getattr__
    __getattr__, __dir__ = lazy_exports(
        globals(),
        {
            ".classify": ["assess"],
            ".devices": ["describe_device", "list_devices", "pick_device"],
            ".probe": ["CPU_BF16_ENV", "nvidia_driver", "nvidia_gpu_names"],
            ".quirks": ["QUIRKS_FILE", "load_quirks"],
            ".records": [
                "BACKENDS",
                "BF16_CLASSES",
                "FP16_CLASSES",
                "KINDS",
                "DeviceInfo",
                "HardwareReport",
                "Quirk",
                "device_entry",
            ],
            ".report": ["hardware_report"],
            ".selftest_cache": ["self_test_key", "self_test_skips"],
        },
    )
