"""Coloured noise in one box of an otherwise fine picture: what a second pass over one region
leaves when it goes wrong (a face fix: AUTOMATIC1111's and Forge's ADetailer, the ComfyUI
Impact Pack's FaceDetailer), and that pass as the image's record names it. numpy only.

The box is found with the whole-picture noise figures (`signatures`), cell by cell, then proved
on the box as a whole:
- each 32 px cell's colour figure (the colour part of neighbouring pixels' differences against
  their brightness part: pictures 0.3 at most, decoded latents about 2) and its strength (the
  spread of its colours, per channel: decoded latents fill the range, 0.15 and up; a fine
  grain, or 8-bit rounding over a flat sky, a few hundredths). A cell is noisy when both are
  high: colour grain over a smooth area is colourful but faint, a texture (foliage, gravel,
  a knit) strong but mostly brightness.
- the largest 4-connected group of noisy cells, its bounding box filled by them for the most
  part (a pass works on a rectangle), at least 128 px a side (what the structure figure needs)
  and at most 60% of the picture (beyond, it is the whole picture's noise, `signatures.noise`);
- the box as a whole: structure at most 0.1 and colour at least 1.0 (`signatures.noise` on it),
  strength at least `STRENGTH`, and grains wider than a pixel (`GRAIN`: the mean squared step
  between neighbours against twice the variance, 1 for noise that changes every pixel, as a
  camera's colour noise over a flat sky does, and a fraction for decoded latents, whose
  grains are a latent cell wide); the rest of the picture a picture (few noisy cells).

What a second pass records (checked against their source):
- ADetailer (Bing-su/adetailer, adetailer/args.py): infotext keys `ADetailer model` (the
  detector: face_yolov8n.pt, mediapipe_face_full, ...), `ADetailer denoising strength`, and,
  only when set apart from the main pass, `ADetailer checkpoint`, `ADetailer VAE`,
  `ADetailer sampler`, `ADetailer steps`; a second or later tab adds its ordinal (`ADetailer
  model 2nd`).
- ComfyUI Impact Pack (ltdrdata/ComfyUI-Impact-Pack): the `FaceDetailer` node (and
  `FaceDetailerPipe`, `DetailerForEach`) with its `denoise`, `steps`, `sampler_name` inputs,
  its `model`, `vae` and `bbox_detector` links; the detector's `model_name` is on the linked
  node (`UltralyticsDetectorProvider`: `bbox/face_yolov8m.pt`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from app.core.explain.signatures import NOISE_COLOUR, NOISE_STRUCTURE, noise
from app.core.images.channels import channel_mean, channel_sum

CELL = 32
MIN_SIDE = 128  # px, each side of the box (the structure figure averages 64 px blocks)
MAX_SHARE = 0.6  # of the picture's cells: a larger box is the whole picture's noise
FILL = 0.7  # of the box's cells noisy: a pass works on a rectangle
STRENGTH = 0.07  # mean per-channel spread, 0..1, of the box (and 0.05 of a cell)
_CELL_STRENGTH = 0.05
GRAIN = 0.5
_OUTSIDE = 0.03  # the most noisy cells outside the box, as a share of the cells there


@dataclass(frozen=True)
class NoisyRegion:
    """A box of coloured noise: `box` [x0, y0, x1, y1] in px (ends exclusive), with the noise
    figures measured on it, and its share of the picture."""

    box: tuple[int, int, int, int]
    structure: float
    colour: float
    strength: float
    share: float

    def to_json(self) -> dict[str, Any]:
        return {
            "box": list(self.box),
            "structure": round(self.structure, 4),
            "colour": round(self.colour, 4),
            "strength": round(self.strength, 4),
            "share": round(self.share, 4),
        }


def _cells(rgb):
    """Per 32 px cell: (colour figure, strength), as (rows, columns) arrays; computed a strip
    of cells at a time so that a large picture costs a strip of floats."""
    import numpy as np

    rows, columns = rgb.shape[0] // CELL, rgb.shape[1] // CELL
    colour = np.zeros((rows, columns), dtype=np.float32)
    strength = np.zeros((rows, columns), dtype=np.float32)
    width = columns * CELL
    for row in range(rows):
        strip = rgb[row * CELL : (row + 1) * CELL, :width].astype(np.float32) / 255.0
        steps = np.diff(strip, axis=1)
        step_brightness = channel_mean(steps)
        colour_part = channel_sum((steps - step_brightness[..., None]) ** 2)
        brightness_part = 3 * step_brightness**2
        # Each cell's own steps: the step across a cell's right edge is left out.
        colour_part = np.pad(colour_part, ((0, 0), (0, 1)))
        brightness_part = np.pad(brightness_part, ((0, 0), (0, 1)))
        per_cell = colour_part.reshape(CELL, columns, CELL).sum(axis=(0, 2))
        bright_cell = brightness_part.reshape(CELL, columns, CELL).sum(axis=(0, 2))
        colour[row] = np.where(bright_cell > 0, per_cell / np.maximum(bright_cell, 1e-12), 0.0)
        blocks = strip.reshape(CELL, columns, CELL, 3)
        strength[row] = blocks.std(axis=(0, 2)).mean(axis=-1)
    return colour, strength


def largest_group(marked) -> list[tuple[int, int]]:
    """The largest 4-connected group of True cells."""
    rows, columns = marked.shape
    seen = set()
    best: list[tuple[int, int]] = []
    for start in zip(*marked.nonzero(), strict=True):
        start = (int(start[0]), int(start[1]))
        if start in seen:
            continue
        group, stack = [], [start]
        seen.add(start)
        while stack:
            r, c = stack.pop()
            group.append((r, c))
            for n in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
                if 0 <= n[0] < rows and 0 <= n[1] < columns and n not in seen and marked[n]:
                    seen.add(n)
                    stack.append(n)
        if len(group) > len(best):
            best = group
    return best


def noisy_region(rgb) -> NoisyRegion | None:
    """The box of coloured noise in an (H, W, 3) uint8 picture that is otherwise a picture,
    or None."""
    import numpy as np

    rgb = np.asarray(rgb)
    if rgb.ndim != 3 or rgb.shape[-1] != 3 or min(rgb.shape[:2]) < 2 * MIN_SIDE:
        return None
    colour, strength = _cells(rgb)
    marked = (colour >= NOISE_COLOUR) & (strength >= _CELL_STRENGTH)
    group = largest_group(marked)
    if not group:
        return None
    rows = [r for r, _ in group]
    columns = [c for _, c in group]
    top, bottom, left, right = min(rows), max(rows) + 1, min(columns), max(columns) + 1
    cells = (bottom - top) * (right - left)
    if (
        min(bottom - top, right - left) * CELL < MIN_SIDE
        or len(group) < FILL * cells
        or cells > MAX_SHARE * marked.size
    ):
        return None
    outside = int(marked.sum()) - int(marked[top:bottom, left:right].sum())
    if outside > _OUTSIDE * (marked.size - cells):
        return None
    box = (left * CELL, top * CELL, right * CELL, bottom * CELL)
    crop = rgb[box[1] : box[3], box[0] : box[2]]
    figures = noise(crop)
    unit = crop.astype(np.float32) / 255.0
    spread = float(unit.std(axis=(0, 1)).mean())
    steps = float((np.diff(unit, axis=1) ** 2).mean())
    grain = steps / (2 * float(unit.var(axis=(0, 1)).mean()) or 1.0)
    if (
        figures is None
        or figures.structure > NOISE_STRUCTURE
        or figures.colour < NOISE_COLOUR
        or spread < STRENGTH
        or grain > GRAIN
    ):
        return None
    share = (box[2] - box[0]) * (box[3] - box[1]) / float(rgb.shape[0] * rgb.shape[1])
    return NoisyRegion(box, figures.structure, figures.colour, spread, share)


# --- the second pass as the record names it ---------------------------------------------------


@dataclass(frozen=True)
class SecondPass:
    """A pass over one region that the image's record shows ran."""

    name: str  # "ADetailer", or the ComfyUI node ("FaceDetailer")
    model: str | None = None  # its detector (face_yolov8n.pt)
    denoise: float | None = None
    checkpoint: str | None = None  # only when set apart from the main pass
    vae: str | None = None

    def words(self) -> str:
        parts = [f"detector {self.model}" if self.model else None]
        parts.append(f"denoise {self.denoise:g}" if self.denoise is not None else None)
        parts.append(f"checkpoint {self.checkpoint}" if self.checkpoint else None)
        parts.append(f"VAE {self.vae}" if self.vae else None)
        said = ", ".join(p for p in parts if p)
        return f"{self.name} ({said})" if said else self.name

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "model": self.model,
            "denoise": self.denoise,
            "checkpoint": self.checkpoint,
            "vae": self.vae,
        }


def _text(value: Any, limit: int = 200) -> str | None:
    return value.strip()[:limit] or None if isinstance(value, str) else None


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if 0.0 <= number <= 1.0 else None


_ADETAILER = "ADetailer model"


def from_infotext(pairs: dict[str, str]) -> list[SecondPass]:
    """ADetailer's passes in A1111-style infotext: one per `ADetailer model` key (its first
    tab's, then `ADetailer model 2nd`, ...), each with the keys of the same suffix."""
    found = []
    for key in pairs:
        if not key.startswith(_ADETAILER):
            continue
        suffix = key[len(_ADETAILER) :]
        if suffix and not suffix.startswith(" "):
            continue  # "ADetailer model classes"
        if suffix.strip() == "classes":
            continue
        found.append(
            SecondPass(
                "ADetailer",
                model=_text(pairs[key]),
                denoise=_number(pairs.get(f"ADetailer denoising strength{suffix}")),
                checkpoint=_text(pairs.get(f"ADetailer checkpoint{suffix}")),
                vae=_text(pairs.get(f"ADetailer VAE{suffix}")),
            )
        )
    return found[:8]


_DETAILERS = ("FaceDetailer", "FaceDetailerPipe", "DetailerForEach", "DetailerForEachDebug")


def from_comfy_prompt(prompt: Any) -> list[SecondPass]:
    """The Impact Pack's detailer nodes of a ComfyUI API prompt, each with its `denoise` and
    the `model_name` of the detector node its `bbox_detector` links to."""
    if not isinstance(prompt, dict):
        return []
    found = []
    for node in list(prompt.values())[:2000]:
        if not isinstance(node, dict) or node.get("class_type") not in _DETAILERS:
            continue
        inputs = node.get("inputs")
        inputs = inputs if isinstance(inputs, dict) else {}
        detector = None
        link = inputs.get("bbox_detector")
        if isinstance(link, list) and link and isinstance(prompt.get(str(link[0])), dict):
            linked = prompt[str(link[0])].get("inputs")
            detector = _text(linked.get("model_name")) if isinstance(linked, dict) else None
        found.append(SecondPass(str(node["class_type"]), detector, _number(inputs.get("denoise"))))
    return found[:8]


def from_comfy_workflow(nodes: Iterable[dict[str, Any]]) -> list[SecondPass]:
    """The detailer nodes of a ComfyUI UI workflow that were neither muted nor bypassed; their
    widgets are positional, so only the node is named."""
    found = []
    for node in nodes:
        ran = isinstance(node, dict) and node.get("mode") not in (2, 4)
        if ran and node.get("type") in _DETAILERS:
            found.append(SecondPass(str(node["type"])))
    return found[:8]
