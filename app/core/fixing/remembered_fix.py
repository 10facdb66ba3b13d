"""A fix remembered for a model on one device (`RememberedFix`), as plain data.

It lives apart from the store that reads and writes `profiles.json` (`profiles`, which
re-exports it): a `ModelSummary` carries it to the window, whose process need not import the
store to show it. Imports no other HalfSafe module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.core.settings.values import SettingValue

# What a fix saved without the precision it was proved at is taken to be for: every precision
# fix HalfSafe proves is one for a part failing in fp16 (or bf16, which rarely overflows).
ASSUMED_PROVED_AT: dict[str, Any] = {
    "precision": "fp16",
    "unet_precision": "auto",
    "vae_precision": "auto",
    "text_encoder_precision": "auto",
    "text_encoder_2_precision": "auto",
    "text_encoder_3_precision": "auto",
    "prompt_upsampler_precision": "auto",
    "no_half": False,
    "no_half_vae": False,
}


@dataclass(frozen=True)
class RememberedFix:
    settings: dict[
        str, SettingValue
    ]  # settings values that make the model run finite on this device
    summary: str  # one sentence, as the health check wrote it
    verified_by: str  # "health check" or "generation repair"
    saved_at: float
    edited_at: float | None = None  # when the user last changed its layer lists by hand
    # The precision it was proved at, as the settings that give it (`PrecisionPlan.
    # dtype_settings`): what it is a fix for, and what Re-verify runs it under. Empty in a fix
    # saved before it was kept.
    made_at: dict[str, SettingValue] = field(default_factory=dict)
    # The model's components it was proved on ("transformer", "vae", ...): a setting several
    # kinds of component share ('unet_precision') is said of the part the model has (a Flux
    # model's transformer, not a UNet). Empty in a fix saved before they were kept.
    parts: tuple[str, ...] = ()
    # A part's share of a model's fix kept under its own file's key (`file_fixes`): the key of
    # the model whose fix it is a share of, so that forgetting or editing that fix reaches it.
    # None for a fix of its own (a check of the file alone, a host's).
    share_of: str | None = None

    def proved_at(self) -> dict[str, Any]:
        """The settings the fix is for: `made_at`, or fp16 where it was not kept."""
        return dict(self.made_at or ASSUMED_PROVED_AT)
