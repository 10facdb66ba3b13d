"""The records of why a check failed (`Cause`, with a LoRA or an attention kernel blamed), and
the causes' names."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from app.core.fixing.quality import Quality
from app.core.health.report import Fix
from app.core.precision import kernels
from app.core.settings.values import SettingValue

CAUSES = ("precision", "kernel", "weights", "state", "intermittent")
WEIGHT_SEARCH_STEPS = 6  # halvings of the LoRA weight range: the answer within 1/64 of it
# Attention backends to try in place of a failing one, in order, per device type.
_BACKENDS = {
    "cuda": ("math", "efficient", "flash", "cudnn", "classic"),
    "other": ("classic", "math"),
}
# peft wraps a layer in `base_layer`, `lora_A.<adapter>`, `lora_B.<adapter>`: the layer a user
# knows is the wrapper.
_PEFT_PARTS = (".base_layer", ".lora_A", ".lora_B", ".lora_dropout", ".lora_magnitude_vector")


@dataclass
class LoraBlame:
    """A LoRA found to cause the failure, and the weight that works."""

    name: str
    weight: float
    layer: str | None  # first layer that went non-finite with it applied
    component: str | None
    non_finite: list[str]  # its NaN/Inf tensors (a weights cause)
    safe_weight: float | None = None  # largest weight found finite and agreeing with fp32
    quality: Quality | None = None  # at safe_weight, against fp32 at safe_weight

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "weight": self.weight,
            "layer": self.layer,
            "component": self.component,
            "non_finite": list(self.non_finite),
            "safe_weight": self.safe_weight,
            "quality": self.quality.to_json() if self.quality else None,
            # A lower weight is another picture; its quality is measured against fp32 at it.
            "picture_changes": self.safe_weight is not None,
        }


@dataclass
class KernelBlame:
    """An attention kernel HalfSafe does not ship, compared with PyTorch's math kernel on the
    same inputs during one run and found at fault."""

    kernel: kernels.AttentionKernel
    comparison: kernels.KernelComparison
    layer: str | None  # the first layer that went non-finite in the check's run

    def to_json(self) -> dict[str, Any]:
        return {
            **self.kernel.to_json(),
            "words": self.kernel.words(),
            "layer": self.layer,
            "finding": self.comparison.finding,
            "comparison": self.comparison.to_json(),
        }


@dataclass
class Cause:
    """Why the check failed and the repair that follows from it. `verified` when the repair was
    re-run and came out finite and agreeing with the fp32 reference (`quality`)."""

    kind: str  # one of CAUSES
    component: str | None
    summary: str
    repair: str  # the repair in words
    action: str  # "change_precision" | "switch_backend" | "reload" | "drop_lora" | "lower_lora_weight" | "rerun" | "none"
    verified: bool
    settings: dict[str, SettingValue] = dataclasses.field(default_factory=dict)
    quality: Quality | None = None
    lora: LoraBlame | None = None
    headline: str | None = None  # replaces the report's headline when the cause changes it
    kernel: KernelBlame | None = None  # a kernel cause's foreign attention kernel, when one is
    # The parts a state cause reloaded, in run order (`component` is the first). Not reported.
    reloaded: tuple[str, ...] = ()
    # Beside a kernel repair: the precision fix the check found for the same failure, which
    # also runs right but pays for what only the kernel needed (priced beside the repair).
    alternative: Fix | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel.to_json() if self.kernel else None,
            "kind": self.kind,
            "component": self.component,
            "summary": self.summary,
            "repair": {
                "action": self.action,
                "words": self.repair,
                "settings": dict(self.settings),
                "verified": self.verified,
                "quality": self.quality.to_json() if self.quality else None,
            },
            "lora": self.lora.to_json() if self.lora else None,
            "alternative": _alternative_json(self.alternative),
        }


def _alternative_json(fix: Fix | None) -> dict[str, Any] | None:
    """The precision fix beside a kernel repair: its settings, words, proof and cost."""
    if fix is None:
        return None
    from app.core.health.words import cost_comparison

    return {
        "settings": dict(fix.settings),
        "summary": fix.summary,
        "verified": fix.verified,
        "quality": fix.quality.to_json() if fix.quality else None,
        "cost": (
            {**fix.cost.to_json(), "summary": cost_comparison(fix.cost, fix.settings)}
            if fix.cost
            else {}
        ),
    }


def layer_name(module_path: str | None) -> str | None:
    """The layer as the model names it, without peft's wrapper parts."""
    if not module_path:
        return module_path
    for part in _PEFT_PARTS:
        index = module_path.find(part)
        if index >= 0:
            return module_path[:index]
    return module_path
