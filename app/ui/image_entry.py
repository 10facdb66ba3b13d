"""A generated image as the window shows it: one typed record of what ran (`GalleryEntry`),
built from the engine's result or read back from an image file, and everything the window
renders from it (the gallery item and its tooltip, the caption, the banner's words, the
viewer's parameters panel), plus the widgets that show an image and its caption."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QGuiApplication, QIcon, QPainter, QPalette, QPixmap
from PySide6.QtWidgets import QScrollArea, QSizePolicy, QWidget

from app.core import hires, samplers
from app.core.errors import BadFileError, HalfSafeError
from app.core.explain import PNG_SIGNATURE, read_exif, read_png, read_record
from app.core.explain.records import Record
from app.core.generation.records import (
    IMAGE_STATUS_WORDS,
    STATUSES,
    GenerationResult,
    ImageResult,
)
from app.core.hires import Hires
from app.core.images.canvas import Canvas
from app.core.images.finished import read_head
from app.core.images.pictures import Mode
from app.core.words import infotext
from app.core.words.tools import TOOLS
from app.ui import words

THUMBNAIL = 112
# A prompt longer than this is cut when read from a file (real prompts are far shorter; a text
# chunk may hold megabytes, and the caption is a label).
PROMPT_LIMIT = 16_384
# The tools whose record is a `parameters` text in AUTOMATIC1111's format (`infotext`).
_INFOTEXT_TOOLS = ("halfsafe", "a1111", "forge", "sdnext", "unknown")


def _hires_of(parsed: infotext.Infotext) -> Hires | None:
    """The hires fix an infotext records, as HalfSafe runs it (None: none, or one beyond the
    bounds); an upscaler model file (ESRGAN) is taken as the closest HalfSafe runs, Lanczos,
    another upscaler it does not know as Latent."""
    scale = parsed.get(infotext.HIRES_UPSCALE)
    words = parsed.get(infotext.HIRES_UPSCALER)
    upscaler = hires.key_for(words) or (
        "lanczos" if words and hires.is_model_upscaler(words) else hires.DEFAULT
    )
    if scale is None:
        return None
    try:
        return Hires(
            scale=scale,
            steps=parsed.get(infotext.HIRES_STEPS) or 0,
            denoise=parsed.get(infotext.DENOISING_STRENGTH) or hires.DENOISE_DEFAULT,
            upscaler=upscaler,
        ).checked()
    except HalfSafeError:
        return None


@dataclass(frozen=True)
class GalleryEntry:
    """One image: what was asked, what ran and what the NaN watch said, as the file records it,
    plus what only the live run knows. Every field the file may lack is None (or empty)."""

    path: str = ""  # "" while the image is only in memory
    made_by: str = "unknown"  # which tool wrote its record (`tools.MADE_BY`)
    # What was asked, as recorded.
    prompt: str | None = None
    negative_prompt: str | None = None
    steps: int | None = None
    sampler: str | None = None  # in the tool's words ("DPM++ 2M Karras")
    scheduler: str | None = None  # HalfSafe's scheduler for that sampler, when it runs one
    # One sentence when `scheduler` is the closest HalfSafe runs to the recorded schedule.
    schedule_note: str | None = None
    cfg: float | None = None
    seed: int | None = None
    size: tuple[int, int] | None = None  # width, height
    model: str | None = None
    model_hash: str | None = None
    vae: str | None = None
    version: str | None = None  # of the tool that made it
    # Image-to-image and inpainting: the input picture's and the mask's file names, and the
    # denoising strength (A1111 also writes a strength for its hires fix, with no picture).
    input_picture: str | None = None
    mask: str | None = None
    strength: float | None = None
    # Inpainting's layout as recorded: "Only masked", and the canvas extended ("right 256").
    only_masked: bool = False
    extended: str | None = None
    recorded_mode: str | None = None  # HalfSafe's `Mode` word ("edit", "control"), if recorded
    clip_skip: int | None = None  # A1111's "Clip skip", where recorded
    hires: Hires | None = None  # A1111's hires fix, where recorded and one HalfSafe runs
    step_cache: float | None = None  # HalfSafe's step cache threshold, where recorded
    prompt_cache: bool | None = None  # HalfSafe's prompt cache, True where recorded on
    settings: Mapping[str, Any] = field(default_factory=dict)  # the precision it ran with
    # What the NaN watch said (HalfSafe's own images).
    status: str = "ok"
    component: str | None = None
    step: int | None = None
    fixes_applied: tuple[str, ...] = ()
    parameters: str = ""  # the `parameters` text exactly as written, "" when there is none
    problem: str = ""  # one sentence naming the file, when it could not be read
    # Only the live run knows these; a file does not record them.
    message: str = ""  # the NaN watch's sentence
    fix: Mapping[str, Any] | None = None  # the settings that would repair it
    cause: str | None = None  # why it went non-finite, where the run told (`causes.CAUSES`)
    warnings: tuple[str, ...] = ()  # the job's warnings
    applied_fix: Mapping[str, Any] | None = None  # the fix this image was made again with
    # The user's own settings that fix replaced for that job only, each as the user had it.
    fix_overrode: Mapping[str, Any] = field(default_factory=dict)
    png: bytes | None = field(default=None, repr=False)  # the image, where no folder took it
    # The input picture and mask as paths (a file records their names only).
    picture_paths: tuple[str, ...] = ()
    mask_path: str | None = None
    canvas: Canvas | None = None  # an inpainting job's layout, as it ran
    # The gallery's listing of the output folder.
    file: tuple[int, int] | None = None  # (mtime in ns, size): its thumbnail's key
    listed_only: bool = False  # listed, its record not read yet

    # Building ---------------------------------------------------------------------------------

    @classmethod
    def from_result(
        cls,
        image: ImageResult,
        result: GenerationResult,
        applied_fix: Mapping[str, Any] | None = None,
    ) -> GalleryEntry:
        """A fresh image. What it records is read from its `parameters` text, the very text
        its PNG holds, so a fresh image and the same image read back from its file say the
        same; an image the engine sent without that text is described from the typed request."""
        if image.parameters:
            recorded = cls.from_parameters(image.parameters, made_by="halfsafe")
        else:
            recorded = cls._described(image, result)
        return replace(
            recorded,
            path=image.path,
            message=image.message,
            fix=dict(image.fix) if image.fix else None,
            cause=image.cause,
            warnings=tuple(result.warnings),
            applied_fix=dict(applied_fix) if applied_fix else None,
            fix_overrode=dict(result.job_fix.overrode) if result.job_fix is not None else {},
            png=image.png,
            picture_paths=tuple(result.request.images),
            mask_path=result.request.mask if result.request.images else None,
            canvas=result.request.canvas if result.mode is Mode.INPAINT else None,
        )

    @classmethod
    def _described(cls, image: ImageResult, result: GenerationResult) -> GalleryEntry:
        request = result.request
        pictured = bool(request.images)
        inpainted = result.mode is Mode.INPAINT
        return cls(
            made_by="halfsafe",
            prompt=request.prompt,
            negative_prompt=request.negative_prompt,
            steps=request.steps,
            sampler=samplers.words(request.scheduler),
            scheduler=request.scheduler,
            cfg=request.cfg,
            seed=image.seed,
            size=(request.width, request.height),
            model=result.model.name or None,
            input_picture=Path(request.images[0]).name if pictured else None,
            mask=Path(request.mask).name if pictured and request.mask else None,
            strength=request.strength if result.mode in (Mode.IMAGE, Mode.INPAINT) else None,
            only_masked=inpainted and request.canvas.only_masked,
            extended=request.canvas.extended_words() if inpainted else None,
            recorded_mode=result.mode.value if pictured else None,
            clip_skip=request.clip_skip if request.clip_skip > 1 else None,
            hires=request.hires if request.hires.on else None,
            step_cache=image.step_cache or None,
            prompt_cache=image.prompt_cache or None,
            settings=dict(image.settings or result.settings),
            status=image.status,
            component=image.component,
            step=image.step,
            fixes_applied=tuple(image.fixes_applied),
        )

    @classmethod
    def from_parameters(cls, text: str, path: str = "", made_by: str = "unknown") -> GalleryEntry:
        """What a `parameters` text records (HalfSafe's, AUTOMATIC1111's, Forge's, SD.Next's),
        read through `infotext`'s one table of keys."""
        parsed = infotext.parse(text)
        status = parsed.get(infotext.NAN_WATCH, "ok")
        return cls(
            path=path,
            made_by=made_by,
            prompt=parsed.prompt[:PROMPT_LIMIT],
            negative_prompt=parsed.negative_prompt[:PROMPT_LIMIT],
            steps=parsed.get(infotext.STEPS),
            sampler=parsed.get(infotext.SAMPLER),
            scheduler=parsed.scheduler(),
            schedule_note=samplers.read(
                parsed.raw(infotext.SAMPLER), parsed.raw(infotext.SCHEDULE_TYPE)
            )[1],
            cfg=parsed.get(infotext.CFG_SCALE),
            seed=parsed.get(infotext.SEED),
            size=parsed.get(infotext.SIZE),
            model=parsed.get(infotext.MODEL),
            model_hash=parsed.get(infotext.MODEL_HASH),
            vae=parsed.get(infotext.VAE),
            version=parsed.get(infotext.HALFSAFE) or parsed.get(infotext.VERSION),
            input_picture=parsed.get(infotext.INPUT_PICTURE),
            mask=parsed.get(infotext.MASK),
            strength=parsed.get(infotext.DENOISING_STRENGTH),
            only_masked=parsed.get(infotext.INPAINT_AREA) == "Only masked",
            extended=infotext.read_text(parsed.get(infotext.CANVAS_EXTENDED), 100),
            recorded_mode=infotext.read_text(parsed.get(infotext.MODE), 20),
            clip_skip=parsed.get(infotext.CLIP_SKIP),
            hires=_hires_of(parsed),
            step_cache=parsed.get(infotext.STEP_CACHE),
            prompt_cache=parsed.get(infotext.PROMPT_CACHE) == "on" or None,
            settings=parsed.settings(infotext.SETTING_KEYS),
            status=status if status in STATUSES else "ok",
            component=infotext.read_text(parsed.get(infotext.NAN_COMPONENT), 100),
            step=parsed.get(infotext.NAN_STEP),
            fixes_applied=tuple(parsed.get(infotext.FIXES_APPLIED, [])),
            parameters=text,
        )

    @classmethod
    def from_record(cls, record: Record, path: str = "") -> GalleryEntry:
        """What another tool's record says (ComfyUI's graphs, InvokeAI's metadata, SwarmUI's
        parameters), as `halfsafe explain` reads it. These records hold no negative prompt."""
        size = (record.width, record.height) if record.width and record.height else None
        return cls(
            path=path,
            made_by=record.made_by,
            prompt=record.prompt or None,
            steps=record.steps,
            sampler=record.sampler,
            scheduler=record.scheduler,
            schedule_note=record.schedule_note,
            cfg=record.cfg,
            seed=record.seed,
            size=size,
            model=record.model or record.unet,
            model_hash=record.model_hash,
            vae=record.vae,
            version=record.version,
        )

    # Reading ----------------------------------------------------------------------------------

    @property
    def unsaved(self) -> bool:
        """The image exists only as PNG bytes in memory: every folder refused it."""
        return bool(self.png) and not self.path

    @property
    def from_folder(self) -> bool:
        """Listed from the output folder (rather than made in this session)."""
        return self.file is not None

    def generate_values(self) -> dict[str, Any]:
        """The Generate form's values this image records (what it does not record is left
        out, so the form keeps its own)."""
        width, height = self.size or (None, None)
        values = {
            "prompt": self.prompt,
            "negative_prompt": self.negative_prompt,
            "steps": self.steps,
            "cfg": self.cfg,
            "seed": self.seed,
            "width": width,
            "height": height,
            "scheduler": self.scheduler,
            "strength": self.strength if self.input_picture else None,
            "clip_skip": self.clip_skip,
            "hires": self.hires,
            "step_cache": self.step_cache,
            "prompt_cache": self.prompt_cache,
            # Not a form value: the sentence the Generate page shows when the sampler it takes
            # is the closest HalfSafe runs to the one recorded.
            "schedule_note": self.schedule_note,
        }
        return {key: value for key, value in values.items() if value is not None}

    @property
    def mode(self) -> Mode:
        """What the image was made from, as its record says: the mode HalfSafe recorded (an
        edit, a control picture), else a picture (with a mask) or the prompt alone."""
        if not self.input_picture:
            return Mode.TEXT
        recorded = next((m for m in Mode if m.value == self.recorded_mode), None)
        if recorded is not None and recorded is not Mode.TEXT:
            return recorded
        return Mode.INPAINT if self.mask or self.extended else Mode.IMAGE

    def picture_values(self) -> dict[str, Any]:
        """The input picture and mask this image was made from, as a request's fields, for
        making it again; empty when only its file is known (which records names, not paths)."""
        if not self.picture_paths:
            return {}
        values: dict[str, Any] = {"images": list(self.picture_paths), "mask": self.mask_path}
        if self.canvas is not None:
            values["canvas"] = self.canvas
        return values


def read_image_file(path: str) -> GalleryEntry:
    """An image file's entry, read through the readers `halfsafe explain` uses: a PNG chunk by
    chunk, a JPEG's or WebP's EXIF, each tool's record within bounds. A file that cannot be read
    gives an entry whose `problem` is one sentence naming it; nothing here raises."""
    try:
        text = _text_chunks(Path(path))
        record = read_record(path, text)
    except BadFileError as error:
        return GalleryEntry(path=path, problem=str(error))
    except Exception as error:  # noqa: BLE001 - a hostile file must never take the window down
        return GalleryEntry(path=path, problem=f"{path}: cannot be read ({type(error).__name__}).")
    parameters = text.get("parameters")
    if parameters and record.made_by in _INFOTEXT_TOOLS:
        return GalleryEntry.from_parameters(parameters, path, record.made_by)
    return GalleryEntry.from_record(record, path)


def _text_chunks(path: Path) -> dict[str, str]:
    head = read_head(path)
    if head.startswith(PNG_SIGNATURE):
        return read_png(path).text
    if head.startswith(b"\xff\xd8\xff") or (head[:4] == b"RIFF" and head[8:12] == b"WEBP"):
        return read_exif(path).text
    raise BadFileError(path, "not a PNG, JPEG or WebP image (its first bytes are none of theirs).")


# --- the words of an entry ----------------------------------------------------------------------


def where_words(entry: GalleryEntry) -> str:
    """' in the VAE at step 8': where the image went non-finite, '' when not known."""
    parts = []
    if entry.component:
        parts.append(f"in {words.component_phrase(entry.component)}")
    if entry.step is not None:
        parts.append(f"at step {entry.step}")
    return (" " + " ".join(parts)) if parts else ""


def status_words(entry: GalleryEntry) -> str:
    """'NaN-black in the VAE at step 8'; '' for a fine image."""
    if entry.status == "ok":
        return ""
    return words.first_upper(IMAGE_STATUS_WORDS.get(entry.status, entry.status)) + where_words(
        entry
    )


def made_by_words(entry: GalleryEntry) -> str:
    """'Made by AUTOMATIC1111 web UI v1.10.1'."""
    if entry.made_by not in TOOLS:
        return "Made by a tool that left no record HalfSafe reads."
    version = f" {entry.version}" if entry.version else ""
    return f"Made by {TOOLS[entry.made_by].name}{version}"


def mode_words(entry: GalleryEntry) -> str:
    """'image-to-image from photo.png, strength 0.6'; 'inpainting photo.png where mask.png is
    white, strength 0.75'; 'outpainting photo.png extended right 256, strength 1';
    'editing a.png, b.png'; 'drawn after the control picture
    depth.png'; 'text-to-image'."""
    mode = entry.mode
    strength = f", strength {entry.strength:g}" if entry.strength is not None else ""
    if mode is Mode.IMAGE:
        return f"{mode.words} from {entry.input_picture}{strength}"
    if mode is Mode.INPAINT:
        what = [f"where {entry.mask} is white"] if entry.mask else []
        if entry.extended:
            what.append(f"extended {entry.extended}")
        if entry.only_masked:
            what.append("only the masked area")
        verb = "outpainting" if entry.extended and not entry.mask else mode.words
        details = f" {', '.join(what)}" if what else ""
        return f"{verb} {entry.input_picture}{details}{strength}"
    if mode is Mode.EDIT:
        return f"{mode.words} {entry.input_picture}"
    if mode is Mode.CONTROL:
        return f"drawn after the control picture {entry.input_picture}"
    return mode.words


def parameter_text(entry: GalleryEntry) -> str:
    """The caption: first the lines only a live run knows, the job's warnings ('Note: ...'),
    which no file records (`live_lines`) and which a box of a few lines must not hide below
    its fold; then the parameters as AUTOMATIC1111 writes them (so they read familiar), the
    precision the image ran with, and where it is saved."""
    return "\n".join(live_lines(entry) + recorded_lines(entry))


def recorded_lines(entry: GalleryEntry) -> list[str]:
    """The caption's lines that an image's file records: the same for a fresh image and for
    that image read back from its PNG."""
    lines = []
    if entry.problem:
        lines.append(entry.problem)
    if entry.prompt:
        lines.append(entry.prompt)
    if entry.negative_prompt:
        lines.append(f"Negative prompt: {entry.negative_prompt}")
    details = [
        (infotext.STEPS, entry.steps),
        (infotext.SAMPLER, entry.sampler),
        (infotext.CFG_SCALE, entry.cfg),
        (infotext.SEED, entry.seed),
        (infotext.SIZE, picture_size(entry)),
        (infotext.MODEL_HASH, entry.model_hash),
        (infotext.MODEL, entry.model),
        (infotext.VAE, entry.vae),
        (infotext.CLIP_SKIP, entry.clip_skip),
    ]
    if not entry.input_picture and entry.hires is None:  # another tool's strength, no picture
        details.append((infotext.DENOISING_STRENGTH, entry.strength))
    shown = [f"{key.name}: {key.write(value)}" for key, value in details if value is not None]
    if shown:
        lines.append(", ".join(shown))
    elif not entry.prompt and not entry.problem:
        lines.append("The image records no generation parameters.")
    if entry.hires is not None:
        lines.append(hires_line(entry.hires, entry.size))
    if entry.mode is not Mode.TEXT:
        lines.append(words.first_upper(mode_words(entry)))
    if entry.settings:
        lines.append("Precision: " + words.precision_summary(entry.settings))
    if entry.path:
        lines.append(f"Saved to {Path(entry.path)}")
    return lines


def picture_size(entry: GalleryEntry) -> tuple[int, int] | None:
    """The picture's size: the recorded size, which for a hires fix is its first pass's (as
    AUTOMATIC1111 records it), times the fix's upscale."""
    if entry.size is None or entry.hires is None:
        return entry.size
    return entry.hires.final_size(*entry.size)


def hires_line(chosen: Hires, first: tuple[int, int] | None) -> str:
    """A hires fix in AUTOMATIC1111's keys, with the size its first pass was drawn at:
    "Hires upscale: 2 (from 128x128), Hires steps: 10, Hires upscaler: Latent, Denoising
    strength: 0.7"."""
    scale = f"{infotext.HIRES_UPSCALE.name}: {chosen.scale:g}"
    if first is not None:
        scale += f" (from {infotext.SIZE.write(first)})"
    parts = [scale]
    if chosen.steps:
        parts.append(f"{infotext.HIRES_STEPS.name}: {chosen.steps}")
    parts.append(f"{infotext.HIRES_UPSCALER.name}: {hires.BY_KEY[chosen.upscaler].words}")
    parts.append(f"{infotext.DENOISING_STRENGTH.name}: {chosen.denoise:g}")
    return ", ".join(parts)


def live_lines(entry: GalleryEntry) -> list[str]:
    """The caption's lines only the live run knows: the job's warnings."""
    return [f"Note: {warning}" for warning in entry.warnings]


# A gallery label's line at most, in characters: what fits under a thumbnail.
LABEL_LINE = 20
# What went wrong, in the few words a label has room for (`IMAGE_STATUS_WORDS` in full).
LABEL_STATUS = {"fixed": "fixed", "nan": "NaN-black", "black": "dark", "safety_checker": "blanked"}


def item_text(entry: GalleryEntry) -> str:
    """The gallery item's label, from the image's own record: the prompt's start, then what
    went wrong (or the mode, for a picture job) and the seed where the line has room for both.
    Empty while only its file is listed: the record is read with the thumbnail, and a file's
    name tells a user nothing."""
    if entry.listed_only:
        return ""
    if entry.problem:
        return "unreadable"
    head = prompt_start(entry.prompt or "") or "no prompt recorded"
    if entry.status != "ok":
        kind = LABEL_STATUS.get(entry.status, entry.status)
    else:
        kind = entry.mode.value if entry.mode is not Mode.TEXT else ""
    seed = f"seed {entry.seed}" if entry.seed is not None else ""
    detail = " · ".join(part for part in (kind, seed) if part)
    if len(detail) > LABEL_LINE and kind:
        detail = kind
    return f"{head}\n{detail}" if detail else head


def prompt_start(prompt: str, limit: int = LABEL_LINE) -> str:
    """The prompt's first words, at most `limit` characters with the ellipsis; its LoRA tags
    (`<lora:name:0.8>`) and line breaks left out."""
    text = " ".join(re.sub(r"<[^<>]*>", " ", prompt).split())
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    if " " in cut:
        cut = cut[: cut.rindex(" ")]
    return cut.rstrip(" ,;:") + "…"


def tooltip(entry: GalleryEntry) -> str:
    """The gallery item's tooltip: what went wrong, the NaN watch's sentence, what it was
    made from (a picture), where it is."""
    where = entry.path or "Not saved: only in memory."
    made = words.first_upper(mode_words(entry)) if entry.mode is not Mode.TEXT else ""
    return "\n".join(part for part in (status_words(entry), entry.message, made, where) if part)


# --- showing it -----------------------------------------------------------------------------------


class CaptionBox(QScrollArea):
    """A box as tall as the text it holds, up to its maximum height; past that it scrolls.
    (QScrollArea's own size hint is its content's at the moment it was set, an empty label.)"""

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        hint = super().sizeHint()
        content = self.widget()
        if content is None:
            return hint
        return QSize(
            hint.width(),
            content.heightForWidth(self.viewport().width()) + 2 * self.frameWidth(),
        )

    def text_changed(self) -> None:
        self.updateGeometry()

    def resizeEvent(self, event: Any) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        if event.size().width() != event.oldSize().width():
            self.updateGeometry()  # a new width wraps the text onto more or fewer lines


class ImageView(QWidget):
    """Paints one image scaled to fit, keeping its aspect; a placeholder text when empty."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.pixmap = QPixmap()
        self.placeholder = ""
        # Small enough that the caption under it keeps its lines in a 700 px tall window.
        self.setMinimumSize(260, 150)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)

    def set_pixmap(self, pixmap: QPixmap | None, placeholder: str = "") -> None:
        self.pixmap = pixmap if pixmap is not None else QPixmap()
        self.placeholder = placeholder
        self.update()

    def paintEvent(self, _event: Any) -> None:  # noqa: N802 - Qt's name
        painter = QPainter(self)
        painter.fillRect(self.rect(), self.palette().window())
        if self.pixmap.isNull():
            painter.setPen(self.palette().placeholderText().color())
            painter.drawText(
                self.rect().adjusted(20, 20, -20, -20),
                Qt.AlignmentFlag.AlignCenter | Qt.TextFlag.TextWordWrap,
                self.placeholder,
            )
        else:
            scaled = self.pixmap.scaled(
                self.size(),
                Qt.AspectRatioMode.KeepAspectRatio,
                Qt.TransformationMode.SmoothTransformation,
            )
            x = (self.width() - scaled.width()) // 2
            y = (self.height() - scaled.height()) // 2
            painter.drawPixmap(x, y, scaled)
        painter.end()


def placeholder_icon() -> QIcon:
    """A thumbnail's stand-in until the worker has made it: the window's own colour."""
    pixmap = QPixmap(THUMBNAIL, THUMBNAIL)
    pixmap.fill(QGuiApplication.palette().color(QPalette.ColorRole.AlternateBase))
    return QIcon(pixmap)


def entry_pixmap(entry: GalleryEntry) -> QPixmap:
    """The image from its file, or from memory when it could not be saved."""
    if entry.unsaved:
        pixmap = QPixmap()
        pixmap.loadFromData(entry.png or b"", "PNG")
        return pixmap
    return QPixmap(entry.path)
