"""comfy-kitchen as the suspect of a black image from a tool that runs it, when HalfSafe's check
of the model at the image's settings ran clean.

ComfyUI (and SwarmUI, whose backend is a ComfyUI it starts) applies the rotary embeddings of
its Flux-style models through comfy-kitchen's `apply_rope` and `apply_rope1`
(comfy/ldm/flux/math.py, outside training), on whichever of its backends takes the call first
(`precision.fused`); HalfSafe's check runs PyTorch's own ops. The family says whether ComfyUI
runs it so (`Family.comfyui_fused_rope`); a UNet never does. The image records neither the
library nor ComfyUI's launch flags, so the tool and the model alone name it. Where comfy-kitchen
is installed beside HalfSafe, each backend's ops are run on the same fp16 inputs as PyTorch's
own on the check's device; a RoPE op that gives NaN or disagrees is the `kernel` cause, the op
named, with the tool's switch for that backend (`kernels.backend_switch_words`); another of its
ops at fault is a note (ComfyUI's path for the model is not known to run it). Where it is not
installed, a note says how to compare them. Used by `explanation` only after a healthy check:
an overflow the check reproduces is the model's, whatever the kernels do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.core.causes.records import Cause, KernelBlame
from app.core.explain.kernels import backend_switch_words
from app.core.precision import fused
from app.core.precision.kernels import KernelComparison

# The tools whose runs go through comfy-kitchen (ComfyUI's comfy/ldm/flux/math.py), and the
# ops that file calls.
TOOLS = ("comfyui", "swarmui")
RUNS = ("apply_rope", "apply_rope1")


@dataclass
class KitchenFinding:
    """comfy-kitchen here: its version (None: not installed beside HalfSafe), what each of its
    backends' ops gave against PyTorch's own on the check's device, and the one at fault."""

    version: str | None
    compared: list[KernelComparison] = field(default_factory=list)
    blamed: KernelComparison | None = None  # a RoPE op (`RUNS`) at fault
    also: list[KernelComparison] = field(default_factory=list)  # its other ops at fault

    def to_json(self, tool: str) -> dict[str, Any]:
        return {
            "installed": self.version is not None,
            "version": self.version or None,
            "compared": [{**c.kernel.to_json(), "comparison": c.to_json()} for c in self.compared],
            "at_fault": (
                {
                    **self.blamed.kernel.to_json(),
                    "words": self.blamed.kernel.words(),
                    "finding": self.blamed.finding,
                    "comparison": self.blamed.to_json(),
                    "turn_off": switch(tool, self.blamed),
                }
                if self.blamed is not None
                else None
            ),
        }


def switch(tool: str, comparison: KernelComparison) -> str:
    return backend_switch_words(tool, fused.DISTRIBUTION, comparison.kernel.backend or "?")


def examine(
    tool: str, architecture: str | None, device: str, threshold_db: float
) -> KitchenFinding | None:
    """comfy-kitchen's backends compared on `device` for an image `tool` made of a model of
    `architecture`; None where the tool does not run comfy-kitchen for that model. Imports
    comfy_kitchen and torch when installed."""
    from app.core.families import family_of_architecture

    family = family_of_architecture(architecture) if architecture else None
    if tool not in TOOLS or family is None or not family.comfyui_fused_rope:
        return None
    version = fused.installed()
    if version is None:
        return KitchenFinding(None)
    compared = fused.compare(threshold_db, device)
    blamed = fused.at_fault([c for c in compared if c.kernel.op in RUNS])
    also = [c for c in compared if c.finding is not None and c.kernel.op not in RUNS]
    return KitchenFinding(version, compared, blamed, also)


def _finding_words(comparison: KernelComparison) -> str:
    if comparison.finding == "non_finite":
        return "gives NaN or Inf where PyTorch's own is finite"
    return f"agrees with PyTorch's own only to {comparison.worst_snr_db:.1f} dB"


def cause(finding: KitchenFinding, tool: str, tool_name: str, device: str) -> Cause | None:
    """The `kernel` cause of a blamed backend op, in `tool`'s switch; None when none is."""
    blamed = finding.blamed
    if blamed is None:
        return None
    kernel = blamed.kernel
    turn_off = switch(tool, blamed)
    summary = (
        f"{kernel.words()}'s {kernel.op} {_finding_words(blamed)} on the same fp16 inputs "
        f"on this device ({device}). {tool_name} applies this model's rotary embeddings "
        f"through it, where HalfSafe's check, which ran clean, runs PyTorch's own: that "
        f"kernel is the likely cause, not the model or fp16. To rule it out, {turn_off}, and "
        "generate the image again."
    )
    return Cause(
        "kernel",
        None,
        summary,
        f"turn off comfy-kitchen's {kernel.backend} backend: {turn_off}",
        "none",  # a switch in the other tool; nothing HalfSafe sets
        verified=False,  # the op was compared; the image was not made again
        kernel=KernelBlame(kernel, blamed, None),
    )


def notes(finding: KitchenFinding, tool_name: str) -> list[str]:
    """The words for comfy-kitchen beside its cause: not installed here (how to compare it),
    its RoPE agreeing, and its other ops at fault (not known to run for this model)."""
    if finding.version is None:
        return [
            f"{tool_name} applies this model's rotary embeddings through comfy-kitchen's fused "
            "kernels, which this check does not run; install comfy-kitchen beside HalfSafe "
            "(pip install comfy-kitchen) and explain the image again to compare them with "
            "PyTorch's own on this device."
        ]
    words = []
    if finding.blamed is None:
        backends = sorted({c.kernel.backend or "?" for c in finding.compared})
        words.append(
            f"comfy-kitchen {finding.version}'s RoPE kernels, which {tool_name} runs for this "
            f"model, agree with PyTorch's own on this device (on the {', '.join(backends)} "
            f"backend{'s' if len(backends) > 1 else ''}): not the cause here."
        )
    for other in finding.also:
        words.append(
            f"{other.kernel.words()}'s {other.kernel.op} {_finding_words(other)} on the same "
            f"fp16 inputs here; {tool_name}'s path for this model is not known to run it."
        )
    return words
