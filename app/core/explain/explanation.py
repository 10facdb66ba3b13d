"""The explanation of one image: its record and pixels, its model, and for a NaN-black image
the health check at the image's settings with the fix in the terms of the tool that made it,
in words. torch is imported only when the check runs."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app import __version__
from app.core.errors import BadFileError, HalfSafeError
from app.core.explain.image_file import (
    PNG_SIGNATURE,
    pixel_status,
    read_exif,
    read_png,
)
from app.core.explain.matching import ModelMatch, find_model, find_vae
from app.core.explain.records import Record, read_record
from app.core.images import read_head
from app.core.jobs import CancelToken, ProgressCallback, no_progress
from app.core.tools import MADE_BY, TOOLS, ToolFix, in_tool_terms

# Image statuses (DESIGN.md): NaN-black, a genuinely dark picture, a safety-checker blank, fine.
STATUSES = ("nan", "black", "safety_checker", "ok")


@dataclass
class Explanation:
    path: str
    made_by: str
    status: str
    record: Record
    pixels: dict[str, Any]
    model: ModelMatch
    check: Any = None  # health.HealthReport
    halfsafe_flags: list[str] = field(default_factory=list)
    tool_fix: ToolFix | None = None
    message: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def problem(self) -> bool:
        """A NaN-black image: the command's exit status 1, with a fix or without one."""
        return self.status == "nan"

    def to_json(self) -> dict[str, Any]:
        fix = None
        if self.tool_fix is not None:
            fix = {"halfsafe": list(self.halfsafe_flags), "for_tool": self.tool_fix.to_json()}
        return {
            "halfsafe": __version__,
            "image": {"path": self.path, "made_by": self.made_by, "status": self.status},
            "model": self.model.to_json(),
            "check": self.check.to_json() if self.check is not None else None,
            "fix": fix,
            "record": self.record.to_json(),
            "pixels": dict(self.pixels),
            "message": self.message,
            "notes": list(self.notes),
        }


def read_image(path: str | Path) -> tuple[Record, str, dict[str, Any]]:
    """(record, status, pixel figures) of an image file, without the library or a model.
    PNG is read chunk by chunk (`read_png`); JPEG and WebP through their EXIF (`read_exif`).
    Raises BadFileError with one sentence for a file that cannot be read."""
    path = Path(path)
    head = read_head(path)
    if head.startswith(PNG_SIGNATURE):
        facts = read_png(path)
    elif head.startswith(b"\xff\xd8\xff") or (head[:4] == b"RIFF" and head[8:12] == b"WEBP"):
        facts = read_exif(path)
    else:
        raise BadFileError(
            path, "not a PNG, JPEG or WebP image (its first bytes are none of theirs)."
        )
    record = read_record(path, facts.text)
    status, figures = pixel_status(path, facts)
    if status in ("nan", "black") and record.halfsafe_status == "safety_checker":
        status = "safety_checker"
    return record, status, figures


def _reproduced_precision(record: Record):
    """The precision the image was made with: HalfSafe's record says; another tool ran the
    half precision it uses by default on a GPU (fp16)."""
    from app.core.settings import FIELDS, PrecisionSettings

    values: dict[str, Any] = {"precision": "fp16"}
    for key, value in record.precision.items():
        try:
            values[key] = FIELDS[key].validate(value)
        except (KeyError, ValueError):
            continue
    if values.get("precision") == "auto":
        values["precision"] = "fp16"
    return PrecisionSettings.from_mapping(values)


def _probe_size(record: Record, native: int) -> int:
    """The side the check runs at: the image's longer side, but never more than the model's
    native size (the model's own size when the image records none). An image records whatever
    size it claims (`Size: 999999x999999`), and even a real 2048 px image would make the
    check cost many generations, so the work is bounded by the model, not by the image; a note
    says when the check ran smaller than the image."""
    from app.core.settings import FIELDS

    side = max(record.width or 0, record.height or 0)
    size = FIELDS["width"]
    low, _ = size.bounds()
    side = int(min(max(side or native, low), native))
    return side - side % int(size.step or 1)


def explain_image(
    path: str | Path,
    *,
    device: str = "auto",
    folders: list[str] | None = None,
    loaded: Any = None,
    measure_cost: bool = False,
    on_progress: ProgressCallback | None = None,
    cancel: CancelToken | None = None,
) -> Explanation:
    """Explain one image: its record and pixels, its model, and for a NaN-black image the
    health check at the image's settings (steps, sampler, size, and the precision the tool ran)
    with the fix in that tool's terms.

    `loaded` is a model already in memory (the engine's): used when it is the file found.
    Runs on the calling thread; the check takes seconds on a GPU. Raises BadFileError for an
    unreadable or hostile image, and passes on the model loader's errors. Writes nothing but
    the hash cache and the library index; a verified fix is not remembered as a profile.
    """
    progress = on_progress or no_progress
    cancel = cancel or CancelToken()
    path = Path(path).expanduser()
    progress("Reading the image", 0, 1)
    record, status, figures = read_image(path)
    made_by = record.made_by if record.made_by in MADE_BY else "unknown"
    cancel.raise_if_cancelled()
    if record.model or record.unet or record.model_hash:
        model = find_model(record, folders, on_progress=progress, cancel=cancel)
    else:
        from app.core import library

        model = ModelMatch(False, None, [str(f) for f in library.library_folders(folders)])
    explanation = Explanation(str(path), made_by, status, record, figures, model)
    if model.note:
        explanation.notes.append(model.note)
    explanation.notes.extend(model.unread)
    if status != "nan":
        explanation.message = _status_words(explanation)
        return explanation
    if not model.found:
        explanation.message = f"{_status_words(explanation)} {_not_found_words(record, model)}"
        return explanation
    _run_check(explanation, device, loaded, measure_cost, progress, cancel)
    return explanation


def _fix_the_tool_can_apply(fix, tool: str) -> dict[str, Any]:
    """The check's fix as settings, or, when the tool that made the image has no switch for it
    (a layer-level fix: no other tool keeps single layers wider), per failing component the
    best verified candidate that tool can apply (the checks's ranking decides which)."""
    chosen = dict(fix.settings)
    if tool == "halfsafe" or in_tool_terms(tool, chosen, []).covered:
        return chosen
    settings: dict[str, Any] = {}
    for component in dict.fromkeys(c.component for c in fix.candidates):
        usable = [
            c
            for c in fix.candidates
            if c.component == component
            and c.verified
            and in_tool_terms(tool, c.settings, []).covered
        ]
        if not usable:
            return chosen
        settings.update(usable[0].settings)
    return settings


def _apply_image_loras(explanation, model) -> None:
    """The LoRAs the image's prompt names (`<lora:name:weight>`), looked up beside its model
    and in the Lora folders; one that is missing or does not load is a note, and the check runs
    without it."""
    from app.core.lora import (
        LoraRequest,
        OutsideModelFoldersError,
        find_lora,
        load_requested,
        prompt_loras_quiet,
    )

    requests = []
    for tag in prompt_loras_quiet(explanation.record.prompt or ""):
        try:
            requests.append(
                LoraRequest(
                    str(
                        find_lora(tag.path, explanation.model.path, explanation.model.roots or None)
                    ),
                    tag.weight,
                )
            )
        except OutsideModelFoldersError as refused:
            explanation.notes.append(f"{refused} The check ran without it.")
        except HalfSafeError:
            explanation.notes.append(
                f"The image used the LoRA {tag.path}, which was not found beside its model or "
                "in the Lora folders; the check ran without it."
            )
    try:
        load_requested(model, requests)
    except HalfSafeError as error:
        explanation.notes.append(f"{error} The check ran without the image's LoRAs.")
        load_requested(model, [])


def _run_check(explanation, device, loaded, measure_cost, progress, cancel) -> None:
    from app.core import health
    from app.core.causes import check_and_attribute
    from app.core.lora import strip_tags
    from app.core.models import load_model
    from app.core.settings import FIELDS

    record = explanation.record
    model_path = explanation.model.path
    vae = None
    if record.vae:
        vae = find_vae(
            record.vae, model_path, explanation.model.vaes, explanation.model.roots or None
        )
    if record.vae and vae is None and record.vae.lower() not in ("none", "automatic", "baked vae"):
        explanation.notes.append(
            f"The image used the VAE {record.vae}, which was not found next to the model; "
            "the check ran with the model's own VAE."
        )
    same = (
        loaded is not None
        and vae is None
        and str(getattr(loaded, "source", "")) not in ("", "demo")
        and Path(loaded.source).resolve() == Path(model_path).resolve()
    )
    if same and loaded is not None:
        model = loaded
    else:
        try:
            model = load_model(model_path, vae=vae, on_progress=progress, cancel=cancel)
        except BadFileError as error:
            # The image was read and is NaN-black; it is the model file that failed.
            explanation.notes.append(str(error))
            explanation.message = (
                f"{_status_words(explanation)} Its model was found at {model_path}, but the "
                f"health check could not load it: {error.problem}"
            )
            return
    steps = record.steps
    try:
        steps = FIELDS["steps"].validate(steps) if steps is not None else None
    except ValueError:
        steps = None
    if record.sampler and record.scheduler is None:
        explanation.notes.append(
            f"HalfSafe does not run the image's sampler ({record.sampler}); the check probed "
            f"the schedule of {FIELDS['scheduler'].default} at the same step count."
        )
    _apply_image_loras(explanation, model)
    size = _probe_size(record, model.native_size)
    if max(record.width or 0, record.height or 0) > size:
        explanation.notes.append(
            f"The image records a size of {record.width}x{record.height}; the check ran at "
            f"{size} px, the model's native size, so overflow that appears only at larger "
            "sizes is not tested."
        )
    report = check_and_attribute(
        model,
        precision=_reproduced_precision(record),
        device=device,
        size=size,
        steps=steps or health.DEFAULT_STEPS,
        scheduler=record.scheduler or health.DEFAULT_SCHEDULER,
        prompt=strip_tags(record.prompt or "").strip() or health.DEFAULT_PROMPT,
        on_progress=progress,
        cancel=cancel,
        remember=False,
        measure_cost=measure_cost,
    )
    explanation.check = report
    if report.fix is not None and report.verdict == "fixable":
        settings = _fix_the_tool_can_apply(report.fix, explanation.made_by)
        explanation.halfsafe_flags = [
            f for f in (health.flag(k, v) for k, v in settings.items()) if f
        ]
        explanation.tool_fix = in_tool_terms(
            explanation.made_by, settings, explanation.halfsafe_flags
        )
        explanation.notes.extend(explanation.tool_fix.notes)
    explanation.message = f"{_status_words(explanation)} {_check_words(explanation)}"


def _status_words(explanation: Explanation) -> str:
    tool = TOOLS.get(explanation.made_by)
    by = f"made by {tool.name}" if tool else "whose maker is unknown"
    if explanation.status == "nan":
        return (
            f"This image ({by}) is NaN-black: every pixel is exactly 0, which is what a NaN "
            "becomes when the image is saved; a value overflowed somewhere in the model."
        )
    if explanation.status == "safety_checker":
        return (
            f"This image ({by}) was blanked by the model's safety checker; nothing overflowed, "
            "so no precision setting changes it."
        )
    if explanation.status == "black":
        return (
            f"This image ({by}) is very dark but not NaN-black: its pixels are finite and not "
            "all zero, so nothing overflowed; it is a dark picture (try another seed or prompt)."
        )
    return f"This image ({by}) is not black: nothing to fix."


def _not_found_words(record: Record, model: ModelMatch) -> str:
    wanted = record.model or record.unet
    if wanted is None and record.model_hash is None:
        return "The image does not say which model made it, so the check could not run."
    named = wanted or f"with hash {record.model_hash}"
    where = "; ".join(model.looked_in) or "no model folders"
    return (
        f"Its model ({named}) was not found in {where}; add the folder that holds it in "
        "Settings > Model folders, then explain the image again."
    )


def _headline(report) -> str:
    # The check ran at the image's settings, not the user's own.
    return report.headline.replace("at your settings", "at the image's settings")


def _check_words(explanation: Explanation) -> str:
    report = explanation.check
    if report.verdict == "fixable" and explanation.tool_fix is not None:
        fix = explanation.tool_fix
        tool = TOOLS[fix.tool].name
        parts = []
        if fix.flags:
            parts.append("start it with " + " ".join(fix.flags))
        if fix.settings:
            parts.append(
                "set " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in fix.settings.items())
            )
        return (
            f"The health check reproduced it: {_headline(report)} In {tool}, "
            + " and ".join(parts)
            + f". In HalfSafe: {' '.join(explanation.halfsafe_flags)}."
        )
    if report.verdict == "broken":
        return f"The health check says: {_headline(report)} No precision setting fixes it."
    return (
        "The health check at the image's settings did not overflow on this device "
        f"({report.device.name}); the image's GPU may differ. {_headline(report)}"
    )
