"""A remembered fix and a saved report for an SDXL model on an RTX 3060, as a check leaves
them, for the GUI tests."""

from __future__ import annotations

from app.core.fixing import profiles
from app.core.health import saved
from tests.support import reports

DEVICE = reports.RTX_3060.name
TORCH = "2.test"
SDXL_KEY = "c" * 64
LAYERS = ["vae:decoder.up_blocks.2.resnets.1.conv2"]


def remember(key: str = SDXL_KEY, layers=None) -> profiles.RememberedFix:
    return profiles.remember_fix(
        key,
        DEVICE,
        {"fp32_modules": layers or LAYERS},
        "The VAE overflowed; 1 VAE layer in fp32.",
        "health check",
        torch_version=TORCH,
    )


def save(key: str = SDXL_KEY, health=None) -> saved.SavedReport:
    kept = saved.save_report(key, reports.result(health or reports.fixable()))
    assert kept is not None
    return kept
