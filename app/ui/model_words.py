"""The Models page's own words: the built-in demos as the list names them, why a library entry
cannot be loaded, what a load found out about the model (its facts and the scan of its weights),
and its remembered fix. No Qt."""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from app.core.demo import DEMO_MODELS
from app.core.formats.weight_findings import WeightScan
from app.core.models.summary import ModelSummary
from app.ui import words

# The built-in models' names in the list: short enough for the name column at 1024 px (their
# whole description is the row's tooltip); a sentence cut in its middle reads as nonsense.
DEMO_TITLES = {
    "demo": "HalfSafe demo (draws coloured shapes)",
    "demo-overflow": "HalfSafe demo that overflows in fp16",
}
DEMO_TIPS = {
    "demo": "A tiny model built into HalfSafe: it runs on any computer in "
    "seconds, exercises every check, and draws a coloured shape on a "
    "coloured background (trained on prompts such as “a red circle on "
    "a blue background”: it draws the prompted colours, the shape only roughly).",
    "demo-overflow": "The demo with one VAE layer that overflows in fp16 on purpose: "
    "in fp16 its pictures go black, and the NaN watch repairs them.",
}
NOT_LOADED = "Loading reads the weights once to check that none of them is NaN or infinite."
# How a model's files are laid out, as the details card says it.
_FORMATS = {"diffusers": "diffusers folder", "single_file": "single file", "demo": "built in"}


def architecture_of(entry: dict[str, Any]) -> str | None:
    """The architecture of a library entry, the built-in demos' (SD 1.x-shaped) included."""
    if entry.get("path") in DEMO_MODELS:
        return "sd1"
    return entry.get("architecture") or None


def unloadable(entry: dict[str, Any]) -> str:
    """Why this entry cannot be loaded, as one sentence; empty when it can."""
    if entry.get("error"):
        return str(entry["error"])
    if entry.get("missing"):
        return f"{Path(entry.get('path', '')).name}: {entry['missing']}"
    if entry.get("supported") is False and entry.get("format") != "pickle":
        name = Path(entry.get("path", "")).name
        return f"{name}: HalfSafe cannot run this kind of model yet" + (
            f" ({entry['detected_because'].rstrip('.')})." if entry.get("detected_because") else "."
        )
    return ""


def model_details(model: ModelSummary, replaced_vae: str | None) -> str:
    """The loaded model's card as HTML lines: its architecture and why HalfSafe thinks so, its
    facts (format, stored dtype, quantisation, native size, prediction, hash), the scan of its
    weights, and the VAE that replaced its own (`replaced_vae`, a path), if any."""
    lines = [f"<b>{html.escape(words.architecture_name(model.architecture))}</b>"]
    because = " ".join(model.detected_because)
    if because:
        lines.append("Why HalfSafe thinks so: " + html.escape(because))
    facts = []
    if model.format:
        facts.append(_FORMATS.get(model.format, model.format))
    if model.stored_dtype:
        facts.append(f"stored as {model.stored_dtype}")
    quantization = model.quantization
    if quantization:
        facts.append(f"quantized ({quantization.format}), {quantization.held_words()}")
    if model.native_size:
        facts.append(f"made for {model.native_size}×{model.native_size} px")
    if model.prediction_type:
        facts.append(words.prediction_words(model.prediction_type))
    if model.model_hash:
        facts.append(f"hash {model.model_hash}")
    lines.append(html.escape(words.first_upper(", ".join(facts))) + ".")
    lines.append(html.escape(weights_words(model.weights)))
    if replaced_vae:
        lines.append("VAE replaced by " + html.escape(Path(replaced_vae).name) + ".")
    return "<br>".join(lines)


def weights_words(weights: WeightScan | None) -> str:
    """What the load's scan of the weights found: how much it read and how fast, and the
    tensors that hold NaN or Inf or decode wrongly, if any."""
    if weights is None:
        return "Weights not checked."
    bad = weights.non_finite
    checked = f"Checked {weights.tensors:,} tensors"
    size = words.file_size(weights.bytes)
    if size:
        checked += f" ({size})"
    checked += f" in {weights.seconds:.1f} s" if weights.seconds >= 0.05 else " in under 0.1 s"
    if weights.mb_per_s > 0:
        checked += f" at {weights.mb_per_s:,.0f} MB/s"
    if bad:
        shown = ", ".join(bad[:3]) + (" …" if len(bad) > 3 else "")
        return (
            f"{checked}: {len(bad)} hold NaN or infinite values ({shown}). This file is "
            "damaged; download it again."
        )
    wrong = weights.bad_quantized
    if wrong:
        return (
            f"{checked}: {len(wrong)} quantized weights decode wrongly (the first, "
            f"{wrong[0].tensor}, {wrong[0].problem}). The file's quantisation "
            "is broken; get another copy or another quantisation."
        )
    return f"{checked}: all finite."


def remembered_words(
    settings: dict[str, Any], summary: str, on: str | None, parts: Sequence[str]
) -> str:
    """The banner (HTML) for a fix remembered for the loaded model on the device `on`: its
    summary, else its settings in words for the model's `parts`."""
    said = (summary or words.fix_short(settings, parts)).rstrip()
    said += "" if said.endswith(".") else "."
    return (
        f"<b>HalfSafe remembers a fix for this model on {html.escape(on or 'this device')}."
        f"</b> {html.escape(said)} Settings left on Auto follow it already."
    )


def applied_words(settings: dict[str, Any], parts: Sequence[str]) -> str:
    """The banner (HTML) once the remembered fix is in the user's settings."""
    return (
        "Applied the remembered fix: "
        + html.escape(words.first_lower(words.fix_short(settings, parts)))
        + "."
    )
