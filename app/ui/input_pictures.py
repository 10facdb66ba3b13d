"""The Generate page's input pictures, mask, inpainting's layout and strength: what
image-to-image, inpainting, outpainting and editing start from. A file is taken from a file dialog or a drop, shown small with its name,
and read up front (its header only), so a file that is no picture is one sentence, not a failed
job. An editing model gets a slot for each picture it edits, each shown once the one before it
is filled; where a job draws from noise with every step (an edit, Flux.1 Fill's inpainting) the
strength is off, with the sentence why. A mask is never stretched onto a picture it was not
made for: a mask file of another shape than the picture is refused, and a mask made for one
picture is removed, with one sentence, when a picture of another size takes its place (an edited
copy of the same size keeps it)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtGui import QImage, QImageReader, QPixmap
from PySide6.QtWidgets import (
    QCheckBox,
    QDoubleSpinBox,
    QFileDialog,
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSizePolicy,
    QSpinBox,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.core.errors import HalfSafeError
from app.core.explain import is_image_path
from app.core.images.canvas import (
    EXTEND_RANGE,
    MASK_BLUR_DEFAULT,
    MASK_BLUR_RANGE,
    PADDING_DEFAULT,
    PADDING_RANGE,
    SIDES,
    Canvas,
)
from app.core.images.pictures import NO_STRENGTH_BECAUSE, STRENGTH_DEFAULT, Mode, picture_header
from app.core.models.summary import ModelSummary
from app.ui import folders, words
from app.ui.widgets import label

PICTURE_FILES = "Pictures (*.png *.jpg *.jpeg *.webp)"
SLOT_THUMBNAIL = 48
STRENGTH_RANGE = (0.01, 1.0)

# check(path) -> "" when the file can be taken, else one sentence naming it.
Check = Callable[[str], str]
Size = tuple[int, int]  # width, height in pixels


def readable_picture(path: str) -> str:
    """'' when `path` is a picture HalfSafe reads (its header, as the engine will), else the
    engine's own sentence naming the file (`BadFileError`)."""
    try:
        picture_header(path)
    except HalfSafeError as error:
        return str(error)
    return ""


def thumbnail(path: str, side: int) -> QPixmap:
    """The picture decoded small (Qt's reader scales while it decodes; a big photo is never
    held at full size), upright as its EXIF says; a null pixmap when Qt cannot read it."""
    reader = QImageReader(path)
    reader.setAutoTransform(True)
    size = reader.size()
    if size.isValid() and not size.isEmpty():
        reader.setScaledSize(size.scaled(side, side, Qt.AspectRatioMode.KeepAspectRatio))
    image = reader.read()
    return QPixmap.fromImage(image) if not image.isNull() else QPixmap()


def upright_image(path: str) -> QImage:
    """The picture at its own size, upright as its EXIF says (as the engine reads it and
    `picture_header` sizes it); a null image when Qt cannot read it."""
    reader = QImageReader(path)
    reader.setAutoTransform(True)
    return reader.read()


def picture_pixels(path: str) -> Size | None:
    """The picture's upright width and height, None when it cannot be read."""
    try:
        return picture_header(path)
    except HalfSafeError:
        return None


def mask_fits(mask: Size, picture: Size) -> bool:
    """Whether a mask lies over the picture without being stretched: the picture's proportions,
    at its size or another (the mask painter paints a large or small picture at another size,
    each side rounded to the pixel)."""
    scale = max(mask) / max(picture)
    return abs(picture[0] * scale - mask[0]) <= 1 and abs(picture[1] * scale - mask[1]) <= 1


def pixels_words(size: Size) -> str:
    return f"{size[0]}×{size[1]} px"


def dropped_picture(mime: Any) -> str | None:
    """The one local picture file a drag carries, else None (the window takes the rest)."""
    if not mime.hasUrls():
        return None
    paths = [url.toLocalFile() for url in mime.urls() if url.isLocalFile()]
    return paths[0] if len(paths) == 1 and is_image_path(paths[0]) else None


class PictureSlot(QFrame):
    """One picture file, or none: a drop target with a thumbnail, the file's name, "Choose…"
    and "Remove". Signals (GUI thread): changed(str), the path taken ("" when removed);
    refused(str), the sentence why a file was not taken."""

    changed = Signal(str)
    refused = Signal(str)

    def __init__(self, title: str, empty: str, check: Check = readable_picture) -> None:
        super().__init__()
        self.path = ""
        self.title = title
        self.empty = empty
        self.check = check
        self.setAcceptDrops(True)
        self.setFrameShape(QFrame.Shape.StyledPanel)
        row = QHBoxLayout(self)
        row.setContentsMargins(6, 6, 6, 6)
        self.preview = QLabel()
        self.preview.setFixedSize(QSize(SLOT_THUMBNAIL, SLOT_THUMBNAIL))
        self.preview.setAlignment(Qt.AlignmentFlag.AlignCenter)
        row.addWidget(self.preview)
        column = QVBoxLayout()
        column.setSpacing(4)
        self.name = label(empty, "muted", wrap=True)
        self.name.setTextFormat(Qt.TextFormat.PlainText)
        # A long file name wraps inside the slot; it never widens the form.
        self.name.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        column.addWidget(self.name)
        buttons = QHBoxLayout()
        self.choose_button = QPushButton("Choose…")
        self.choose_button.clicked.connect(lambda: self.choose())
        self.remove_button = QPushButton("Remove")
        self.remove_button.clicked.connect(self.remove)
        buttons.addWidget(self.choose_button)
        buttons.addWidget(self.remove_button)
        buttons.addStretch(1)
        self._buttons = buttons
        column.addLayout(buttons)
        row.addLayout(column, 1)
        self._show()

    def add_button(self, text: str, tip: str, action: Callable[[], object]) -> QPushButton:
        """A further button beside "Choose…" and "Remove"."""
        button = QPushButton(text)
        button.setToolTip(tip)
        button.clicked.connect(lambda: action())
        self._buttons.insertWidget(self._buttons.count() - 1, button)
        return button

    def choose(self, path: str | None = None) -> bool:
        """Take `path`, or a file the user picks. Returns whether a file was taken."""
        if path is None:
            path, _filter = QFileDialog.getOpenFileName(
                self,
                self.title,
                str(Path(self.path).parent) if self.path else folders.pictures(),
                f"{PICTURE_FILES};;All files (*)",
            )
            if not path:
                return False
        return self.take(path)

    def take(self, path: str) -> bool:
        problem = self.check(path)
        if problem:
            self.refused.emit(problem)
            return False
        self.path = path
        self._show()
        self.changed.emit(path)
        return True

    def remove(self) -> None:
        if self.path:
            self.path = ""
            self._show()
            self.changed.emit("")

    def _show(self) -> None:
        if not self.path:
            self.preview.setPixmap(QPixmap())
            self.preview.setText("")
            self.name.setText(self.empty)
            self.name.setToolTip("")
        else:
            pixmap = thumbnail(self.path, SLOT_THUMBNAIL)
            self.preview.setPixmap(pixmap)
            if pixmap.isNull():
                self.preview.setText("no preview")
            self.name.setText(f"{self.title}: {words.breakable(Path(self.path).name)}")
            self.name.setToolTip(self.path)
        self.remove_button.setEnabled(bool(self.path))

    # Drag and drop: this slot takes one picture; anything else goes on to the window.

    def dragEnterEvent(self, event: Any) -> None:  # noqa: N802 - Qt's name
        if dropped_picture(event.mimeData()) is not None:
            event.acceptProposedAction()
        else:
            event.ignore()

    def dragMoveEvent(self, event: Any) -> None:  # noqa: N802 - Qt's name
        self.dragEnterEvent(event)

    def dropEvent(self, event: Any) -> None:  # noqa: N802 - Qt's name
        path = dropped_picture(event.mimeData())
        if path is None:
            event.ignore()
            return
        event.acceptProposedAction()
        self.take(path)


PICTURE_EMPTY = (
    "None: drawn from the prompt alone. Drop or choose a picture to start from it (image-to-image)."
)
STRENGTH_CAPTION = (
    "How much of the picture is drawn again: low stays close to it, 1.00 redraws it all."
)
# Why the strength is off where a job draws from noise with every step, by mode.
NO_STRENGTH = {mode: f"{why}: no strength." for mode, why in NO_STRENGTH_BECAUSE.items()}


CONTROL_EMPTY = (
    "None. This model draws after a control picture: drop or choose the depth map (Flux.1 "
    "Depth) or the edge picture (Flux.1 Canny) it is to follow."
)


def editing_empty(references: int) -> str:
    """What the first slot says, empty, for a model that edits up to `references` pictures."""
    takes = "a picture" if references == 1 else f"up to {references} pictures"
    return (
        f"None: drawn from the prompt alone. This model edits {takes}: drop or choose one, "
        "and say in the prompt what to change."
    )


class CanvasOptions(QWidget):
    """Inpainting's layout (`canvas.Canvas`) behind a toggle: the mask's blur, "only masked"
    with its padding, and the pixels the canvas is extended by on each side (outpainting).
    Closed, the toggle says what is set. Signal (GUI thread): changed(), on any change."""

    changed = Signal()

    def __init__(self) -> None:
        super().__init__()
        column = QVBoxLayout(self)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(4)
        self.toggle = QToolButton()
        self.toggle.setCheckable(True)
        self.toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.toggle.setArrowType(Qt.ArrowType.RightArrow)
        self.toggle.setAutoRaise(True)
        self.toggle.setToolTip("How inpainting lays out the picture, and outpainting.")
        self.toggle.toggled.connect(self._open)
        column.addWidget(self.toggle)
        self.body = QWidget()
        rows = QVBoxLayout(self.body)
        rows.setContentsMargins(16, 0, 0, 0)
        rows.setSpacing(4)
        self.blur = _pixels_box(MASK_BLUR_RANGE, MASK_BLUR_DEFAULT, 1)
        self.blur.setToolTip(
            "How many pixels the mask's edge is blurred when the new picture is blended into "
            "the kept one (0: a hard edge)."
        )
        rows.addLayout(_row(label("Mask blur"), self.blur))
        self.only_masked = QCheckBox("Only masked, padding")
        self.only_masked.setToolTip(
            "Draw only the area around the mask, at the size set below, and paste it back "
            "into the picture at the picture's own size: a small area of a large photo is "
            "drawn at the model's full resolution."
        )
        self.padding = _pixels_box(PADDING_RANGE, PADDING_DEFAULT, 8)
        self.padding.setToolTip("Pixels of the picture drawn around the mask's box.")
        rows.addLayout(_row(self.only_masked, self.padding))
        rows.addWidget(label("Extend the canvas (outpainting)", "muted"))
        grid = QGridLayout()
        grid.setHorizontalSpacing(6)
        self.extend: dict[str, QSpinBox] = {}
        for index, side in enumerate(SIDES):
            box = _pixels_box(EXTEND_RANGE, 0, 64)
            box.setToolTip(
                f"Pixels added to the picture's {side} and drawn anew; the mask is optional."
            )
            self.extend[side] = box
            row, col = index // 2, (index % 2) * 2
            grid.addWidget(label(side.capitalize()), row, col)
            grid.addWidget(box, row, col + 1)
        grid.setColumnStretch(1, 1)
        grid.setColumnStretch(3, 1)
        rows.addLayout(grid)
        column.addWidget(self.body)
        for box in (self.blur, self.padding, *self.extend.values()):
            box.valueChanged.connect(self._changed)
        self.only_masked.toggled.connect(self._changed)
        self._open(False)
        self._changed()

    def value(self) -> Canvas:
        return Canvas(
            mask_blur=self.blur.value(),
            only_masked=self.only_masked.isChecked(),
            padding=self.padding.value(),
            extend=tuple(self.extend[side].value() for side in SIDES),  # type: ignore[arg-type]
        )

    def set_value(self, canvas: Canvas) -> None:
        self.blur.setValue(canvas.mask_blur)
        self.only_masked.setChecked(canvas.only_masked)
        self.padding.setValue(canvas.padding)
        for side, pixels in zip(SIDES, canvas.extend, strict=True):
            self.extend[side].setValue(pixels)

    def summary(self) -> str:
        """The layout in a few words, for the closed toggle."""
        canvas = self.value()
        parts = [f"blur {canvas.mask_blur} px"]
        parts.append(
            f"only masked (+{canvas.padding} px)" if canvas.only_masked else "whole picture"
        )
        if canvas.extends:
            parts.append(f"extended {canvas.extended_words()}")
        return " · ".join(parts)

    def _open(self, opened: bool) -> None:
        self.body.setVisible(opened)
        self.toggle.setArrowType(Qt.ArrowType.DownArrow if opened else Qt.ArrowType.RightArrow)
        self._changed()

    def _changed(self) -> None:
        self.padding.setEnabled(self.only_masked.isChecked())
        opened = self.toggle.isChecked()
        self.toggle.setText("Inpainting" if opened else f"Inpainting: {self.summary()}")
        self.changed.emit()


def _row(*widgets: QWidget) -> QHBoxLayout:
    """Widgets side by side, at their own widths, from the left."""
    row = QHBoxLayout()
    for widget in widgets:
        row.addWidget(widget)
    row.addStretch(1)
    return row


def _pixels_box(bounds: tuple[int, int], value: int, step: int) -> QSpinBox:
    box = QSpinBox()
    box.setRange(*bounds)
    box.setSingleStep(step)
    box.setSuffix(" px")
    box.setValue(value)
    return box


class InputPictures(QWidget):
    """The input pictures, the mask and the strength, with what the loaded model allows
    (`set_model`): a model that runs no picture mode has the area disabled, with the sentence
    why; an editing model gets a slot per picture it edits. Signals (GUI thread):
    picture_changed(str), the first picture's path ("" when removed); refused(str), one
    sentence (a file not taken, or a mask removed as not made for the picture);
    canvas_changed(), when inpainting's layout changes."""

    picture_changed = Signal(str)
    refused = Signal(str)
    canvas_changed = Signal()

    def __init__(self) -> None:
        super().__init__()
        self._modes: Mapping[Mode, str] = {}
        self._references = 0  # pictures the loaded model edits (0: not an editing model)
        self._control = False  # the loaded model draws after a control picture
        self._from_noise: tuple[Mode, ...] = ()
        self.picture_size: Size | None = None  # the first picture's, upright
        # The size of the picture the mask was made for (painted over, or chosen beside).
        self.mask_made_for: Size | None = None
        column = QVBoxLayout(self)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(4)
        column.addWidget(label("Input picture"))
        self.note = label("", "muted", wrap=True)
        self.note.hide()
        column.addWidget(self.note)
        self.picture_slot = PictureSlot("Picture", PICTURE_EMPTY)
        self.picture_slot.setToolTip("A PNG, JPEG or WebP picture; the new image starts from it.")
        column.addWidget(self.picture_slot)
        # An editing model's further pictures; kept (hidden) when a model takes fewer, so that
        # loading the editing model again finds them.
        self.more_slots: list[PictureSlot] = []
        self._more = QVBoxLayout()
        self._more.setSpacing(4)
        column.addLayout(self._more)
        self.mask_slot = PictureSlot(
            "Mask",
            "No mask. Add one to paint only part of the picture again (inpainting): white is "
            "painted again, black is kept.",
            check=self._mask_problem,
        )
        self._mask_tip = (
            "A black and white picture the input picture's shape: white is painted again."
        )
        self.paint_button = self.mask_slot.add_button(
            "Paint…",
            "Paint the mask over the picture: what you paint is drawn again.",
            self.paint_mask,
        )
        self.painter: Any = None  # the mask painter while it is open
        column.addWidget(self.mask_slot)
        self.canvas_options = CanvasOptions()
        self.canvas_options.changed.connect(self._canvas_changed)
        column.addWidget(self.canvas_options)
        strength_row = QHBoxLayout()
        strength_row.addWidget(label("Strength"))
        self.strength = QDoubleSpinBox()
        self.strength.setRange(*STRENGTH_RANGE)
        self.strength.setDecimals(2)
        self.strength.setSingleStep(0.05)
        self.strength.setValue(STRENGTH_DEFAULT)
        self.strength.setToolTip(
            "Denoising strength: the share of the steps run, from the end of the schedule."
        )
        strength_row.addWidget(self.strength, 1)
        column.addLayout(strength_row)
        self.strength_caption = label(STRENGTH_CAPTION, "muted", wrap=True)
        column.addWidget(self.strength_caption)
        self.picture_slot.changed.connect(self._picture_changed)
        self.mask_slot.changed.connect(self._mask_changed)
        self.picture_slot.refused.connect(self.refused)
        self.mask_slot.refused.connect(self.refused)
        self._update()

    def set_model(self, model: ModelSummary | None) -> None:
        """What the loaded model runs decides what is enabled (nothing is known without a
        model: the area stays open, and the job decides)."""
        self._modes = model.picture_modes if model is not None else {}
        self._references = model.references if model is not None else 0
        self._control = model.control if model is not None else False
        self._from_noise = model.draws_from_noise if model is not None else ()
        while len(self.more_slots) < self._references - 1:
            slot = PictureSlot(
                f"Picture {len(self.more_slots) + 2}",
                "None. Drop or choose another picture for the model to edit beside those above.",
            )
            slot.setToolTip("A PNG, JPEG or WebP picture the model reads beside the others.")
            slot.changed.connect(lambda _path: self._update())
            slot.refused.connect(self.refused)
            self._more.addWidget(slot)
            self.more_slots.append(slot)
        self.picture_slot.empty = (
            editing_empty(self._references)
            if self._references
            else CONTROL_EMPTY
            if self._control
            else PICTURE_EMPTY
        )
        self.picture_slot._show()
        self._update()

    def paint_mask(self) -> None:
        """Open the mask painter over the input picture (starting from the mask the job has);
        the mask painted is saved and taken when the user keeps it."""
        from app.ui.mask_painter import MaskPainter  # imported when first opened

        picture = self.picture_slot.path
        if not picture or self.painter is not None:
            return
        image = upright_image(picture)
        if image.isNull():
            self.refused.emit(f"{picture}: the picture cannot be shown to paint a mask on.")
            return
        mask = upright_image(self.mask_slot.path) if self.mask_slot.path else None
        self.painter = dialog = MaskPainter(image, mask, Path(picture).name, self)
        dialog.accepted.connect(lambda: self._take_painted(dialog, picture))
        dialog.finished.connect(self._painter_closed)
        dialog.open()

    def _take_painted(self, dialog: Any, picture: str) -> None:
        if picture != self.picture_slot.path:  # another window sent a picture meanwhile
            self.refused.emit(
                f"The mask painted over {Path(picture).name} was not used: the input picture "
                "changed while it was painted."
            )
            return
        try:
            path = dialog.save()
        except OSError as error:
            self.refused.emit(f"The painted mask could not be saved ({error}).")
            return
        self.mask_slot.take(str(path))

    def _painter_closed(self) -> None:
        if self.painter is not None:
            self.painter.deleteLater()
        self.painter = None

    def refusal(self, mode: Mode) -> str:
        """Why the loaded model cannot run `mode`, '' when it can (or it is not known)."""
        return self._modes.get(mode, "") if mode is not Mode.TEXT else ""

    def _picture_changed(self, path: str) -> None:
        self.picture_size = picture_pixels(path) if path else None
        if not path:
            self.mask_slot.remove()
        elif self.mask_slot.path and self.mask_made_for != self.picture_size:
            made_for = self.mask_made_for
            self.mask_slot.remove()
            self.refused.emit(
                "The mask was removed rather than stretched: it was made for "
                + (f"a {pixels_words(made_for)} picture" if made_for else "another picture")
                + (
                    f", not this {pixels_words(self.picture_size)} one."
                    if self.picture_size
                    else "."
                )
            )
        self._update()
        self.picture_changed.emit(path)

    def _canvas_changed(self) -> None:
        self._update()
        self.canvas_changed.emit()

    def _mask_changed(self, path: str) -> None:
        self.mask_made_for = self.picture_size if path else None
        self._update()

    def _mask_problem(self, path: str) -> str:
        """'' when the mask file can be taken for the picture, else one sentence naming it: it
        must be a picture, of the picture's proportions (another shape would be stretched)."""
        problem = readable_picture(path)
        if problem or self.picture_size is None:
            return problem
        size = picture_pixels(path)
        if size is None or mask_fits(size, self.picture_size):
            return ""
        return (
            f"{path}: a {pixels_words(size)} mask would be stretched over this "
            f"{pixels_words(self.picture_size)} picture of another shape, so it was not taken."
        )

    def _update(self) -> None:
        image, inpaint = self.refusal(Mode.IMAGE), self.refusal(Mode.INPAINT)
        runs_none = bool(image and inpaint)
        has_picture = bool(self.picture_slot.path)
        self.picture_slot.setEnabled(not runs_none)
        # Each further slot of an editing model shows once the one before it holds a picture.
        shown = has_picture and not runs_none
        for index, slot in enumerate(self.more_slots):
            wanted = index < self._references - 1 and shown
            slot.setVisible(wanted)
            slot.setEnabled(wanted)
            shown = wanted and bool(slot.path)
        several = len(self.images()) > 1
        self.mask_slot.setEnabled(has_picture and not inpaint and not several)
        self.mask_slot.setVisible(has_picture)  # a mask is of a picture: no room before one
        self.mask_slot.setToolTip(
            inpaint
            or (
                "Inpainting starts from one picture: remove the others to paint with a mask."
                if several
                else self._mask_tip
            )
        )
        # Outpainting needs no mask, so the layout shows with any picture the model inpaints.
        self.canvas_options.setEnabled(has_picture and not inpaint and not several)
        self.canvas_options.setVisible(has_picture and not inpaint and not several)
        mode = self.mode()
        from_noise = mode in self._from_noise
        self.strength.setEnabled(has_picture and not runs_none and not from_noise)
        self.strength_caption.setText(NO_STRENGTH.get(mode, "") if from_noise else STRENGTH_CAPTION)
        self.strength_caption.setEnabled(self.strength.isEnabled() or from_noise)
        if runs_none:
            note = _both(image, inpaint)
        elif inpaint and has_picture:
            note = inpaint
        else:
            note = self.refusal(self.mode()) if has_picture else ""
        self.note.setText(note)
        self.note.setVisible(bool(note))

    # What a job takes -------------------------------------------------------------------------

    def images(self) -> list[str]:
        """The input pictures a job starts from ([] when none, or the model runs no picture
        mode): the first, and an editing model's further ones."""
        if not self.picture_slot.path or not self.picture_slot.isEnabled():
            return []
        further = self.more_slots[: max(0, self._references - 1)]
        return [self.picture_slot.path] + [slot.path for slot in further if slot.path]

    def mask_path(self) -> str | None:
        return (
            self.mask_slot.path
            if self.images() and self.mask_slot.path and self.mask_slot.isEnabled()
            else None
        )

    def canvas(self) -> Canvas:
        """Inpainting's layout as the next job takes it (the defaults where it does not
        inpaint, or inpaints from several pictures)."""
        if not self.canvas_options.isEnabled() or not self.images():
            return Canvas()
        return self.canvas_options.value()

    def mode(self) -> Mode:
        if not self.images():
            return Mode.TEXT
        if self.mask_path() or self.canvas().extends:
            return Mode.INPAINT
        if self._control:
            return Mode.CONTROL
        return Mode.EDIT if self._references else Mode.IMAGE

    def strength_applies(self) -> bool:
        """Whether the next job runs the last `strength` of its steps (image-to-image and
        inpainting, unless the model draws from noise with every step)."""
        mode = self.mode()
        return mode in (Mode.IMAGE, Mode.INPAINT) and mode not in self._from_noise

    def strength_value(self) -> float:
        """The strength the job carries: the one set here, or where none applies the default,
        which a job carries unasked."""
        return round(self.strength.value(), 2) if self.strength_applies() else STRENGTH_DEFAULT


def _both(image: str, inpaint: str) -> str:
    """The loaded model runs neither picture mode: one sentence where the family says the same
    of both ("HalfSafe does not run image-to-image or inpainting for Flux.2 models.")."""
    if image.replace(Mode.IMAGE.words, Mode.INPAINT.words) == inpaint:
        return image.replace(Mode.IMAGE.words, f"{Mode.IMAGE.words} or {Mode.INPAINT.words}")
    return f"{image} {inpaint}"
