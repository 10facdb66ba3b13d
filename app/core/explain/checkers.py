"""Other tools' safety checkers as the image's record shows them. Plain data; no torch.

A safety checker that blanks an image writes exactly the pixels of NaN-black (every value 0),
so only a record tells the two apart. What each tool records (checked against its source):
- HalfSafe: `NaN watch: safety_checker` when its checker blanked the image (`records`).
- ComfyUI: the "Safety Checker" node (42lux/ComfyUI-safety-checker, class_type
  `Safety Checker`, inputs `images` and `sensitivity` 0..1; it replaces each image the CompVis
  checker flags with a black one) is in the graph the PNG carries, so the record says the
  checker ran; its `nsfw` output, whether it fired, is written nowhere.
- Fooocus: "Black Out NSFW" (`black_out_nsfw`) runs its checker before saving, but its log and
  metadata entries (modules/async_worker.py `save_and_log`) do not include it: nothing is read.
- SD.Next's NudeNet extension writes `NudeNet` and `NSFW` into the infotext, but censors the
  detected areas (pixelate, blur, an overlay), never the whole image black: not this case.
- AUTOMATIC1111 and Forge have no checker built in. AUTOMATIC1111's own NSFW censor
  extension (AUTOMATIC1111/stable-diffusion-webui-nsfw-censor: Settings > NSFW > "Filter
  NSFW", on once installed) replaces flagged images with black ones and writes nothing into the
  infotext. diffusers' pipelines return `nsfw_content_detected` to the caller and write nothing
  into the file.
No tool's record says that its checker blanked the image; where the record says the checker
was on, the black may be the checker's and the health check decides: a check that runs clean
points to the checker, not to precision (`explanation`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# ComfyUI node classes of safety checkers that blank what they flag.
_NODES = ("Safety Checker",)
_SKIPPED_MODES = (2, 4)  # a UI workflow node muted (2) or bypassed (4) did not run


@dataclass(frozen=True)
class RecordedChecker:
    """A safety checker the record shows was on; whether it fired is not recorded."""

    node: str
    sensitivity: float | None = None

    def words(self) -> str:
        if self.sensitivity is None:
            return f"the {self.node} node"
        return f"the {self.node} node, sensitivity {self.sensitivity:g}"

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "sensitivity": self.sensitivity, "fired": None}


def _sensitivity(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if 0.0 <= value <= 1.0 else None


def from_comfy_prompt(nodes: Iterable[tuple[str, dict[str, Any]]]) -> RecordedChecker | None:
    """The first safety-checker node of a ComfyUI API prompt ((class_type, inputs) pairs)."""
    for kind, inputs in nodes:
        if kind in _NODES:
            return RecordedChecker(kind, _sensitivity(inputs.get("sensitivity")))
    return None


def from_comfy_workflow(nodes: Iterable[Any]) -> RecordedChecker | None:
    """The first safety-checker node of a ComfyUI UI workflow that was neither muted nor
    bypassed; its one widget is the sensitivity."""
    for node in nodes:
        if not isinstance(node, dict) or node.get("mode") in _SKIPPED_MODES:
            continue
        if node.get("type") in _NODES:
            values = node.get("widgets_values")
            first = values[0] if isinstance(values, list) and values else None
            return RecordedChecker(str(node["type"]), _sensitivity(first))
    return None


# Each tool's switch for its checker, in its own terms (sources in the docstring).
_TURN_OFF = {
    "comfyui": (
        "bypass the Safety Checker node (select it, Ctrl+B) or lower its sensitivity (0 is the "
        "least strict), and generate the image again"
    ),
}


def turn_off_words(tool: str) -> str:
    return _TURN_OFF.get(tool, "turn its safety checker off, and generate the image again")
