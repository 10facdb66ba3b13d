"""Painting an inpainting mask over the input picture: the picture scaled to fit, the mask over
it in translucent colour, the brush's outline under the pointer. The left mouse button paints
what is drawn again or erases, as the Paint / Erase toggle says (B and E choose, X swaps), and
the right button does the opposite. The brush has a width, in the picture's own pixels whatever
the zoom, and a hardness: a hard brush paints a sharp edge, a softer one an edge that fades
through greys. Undo and Redo (Ctrl+Z; Ctrl+Shift+Z or Ctrl+Y) step back and forth by whole
strokes, Clear and Invert included, up to `HISTORY_STEPS` steps. The mouse wheel zooms about the
pointer (up to `MAX_ZOOM` times the fitted size), the middle button (or the left one with Space
held) drags the picture, and Fit (or 0) shows it whole again. The dialog opens as large as the
picture allows within `SCREEN_SHARE` of the screen. The mask is painted at the picture's
proportions, its long side between `MIN_SIDE` and `MAX_SIDE` pixels (every job resizes its mask
to its own size), and saved as an 8-bit greyscale PNG: white where the picture is painted again,
as every tool's masks are, black where it is kept, and grey where the new picture is blended
with the kept one (the engine paints again where the mask is at least half grey and blends the
result into the kept picture by the mask's grey values).
"""

from __future__ import annotations

import math
import time
import zlib
from pathlib import Path

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QPointF, QRectF, QSize, Qt, Signal
from PySide6.QtGui import (
    QColor,
    QIcon,
    QImage,
    QImageWriter,
    QKeySequence,
    QMouseEvent,
    QPainter,
    QPaintEvent,
    QPen,
    QRadialGradient,
    QShortcut,
)
from PySide6.QtWidgets import (
    QButtonGroup,
    QDialog,
    QDialogButtonBox,
    QHBoxLayout,
    QPushButton,
    QSizePolicy,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.core import paths
from app.core.files import write_atomic
from app.ui.widgets import label

MAX_SIDE = 1024  # the painted mask's long side at most, in pixels
MIN_SIDE = 512  # and at least (a smaller picture is shown larger to paint on)
# The brush's diameters, in the mask's pixels (the brush box shows them in the picture's); a
# twelfth of the picture's long side by default.
BRUSH_RANGE = (2, 400)
DAB_SPACING = 0.25  # a soft stroke's dabs, apart by this share of the brush's radius
MAX_ZOOM = 16.0  # times the fitted size
ZOOM_STEP = 1.25  # per wheel click (120 eighths of a degree)
OVERLAY = QColor(230, 60, 60)  # the mask's colour over the picture
OVERLAY_OPACITY = 0.55
WHITE, BLACK = QColor(255, 255, 255), QColor(0, 0, 0)
HISTORY_STEPS = 30  # strokes (and Clears, Inverts) that Undo can take back
# What the kept steps may take together. A step is the whole mask zlib-compressed: a painted
# mask (flat black and white, grey ramps at soft edges) is some 50 KiB at 1024x683 and 150 KiB
# at 2048x2048 (4 MiB of pixels), but a photograph-like mask a job brought compresses little,
# so this bounds the worst case (16 steps of a 2048x2048 mask; every step of a 1024 px one).
HISTORY_BYTES = 64 * 2**20
SCREEN_SHARE = 0.8  # the dialog opens at most this share of the screen's available size
# Paint and Erase as one control, the one that is on in the selection's colours: a style's
# checked button can be a shade from an unchecked one (Fusion's, on a dark palette).
MODE_STYLE = """
#mode QPushButton { border: 1px solid palette(mid); background: palette(button);
    color: palette(button-text); padding: 3px 8px; }
#mode QPushButton:checked { background: palette(highlight); color: palette(highlighted-text);
    border-color: palette(highlight); }
#mode QPushButton:hover:!checked { border-color: palette(highlight); }
#mode #paint { border-top-left-radius: 4px; border-bottom-left-radius: 4px; }
#mode #erase { border-top-right-radius: 4px; border-bottom-right-radius: 4px; }
"""
UNDO_KEYS = ("Ctrl+Z",)
REDO_KEYS = ("Ctrl+Shift+Z", "Ctrl+Y")
PAINT_KEY, ERASE_KEY, SWAP_KEY = "B", "E", "X"
# Mask values at least half grey (painted again) to 1, the others to 0, for bytes.translate.
_PAINTED_AGAIN = bytes(int(value >= 128) for value in range(256))


def masks_folder() -> Path:
    """Where painted masks are kept: beside HalfSafe's other data, never in the picture's own
    folder (which may be another program's, or read-only)."""
    return paths.data_dir() / "masks"


def _keys(keys: tuple[str, ...]) -> str:
    """Shortcuts as this platform writes them (Cmd on a Mac), for tooltips."""
    return " or ".join(
        QKeySequence(key).toString(QKeySequence.SequenceFormat.NativeText) for key in keys
    )


class MaskHistory:
    """The mask's states before each step (a stroke from press to release, Clear, Invert), for
    Undo, and the states undone, for Redo; a new step forgets what was undone. States are the
    mask's bytes as the caller gives them, kept zlib-compressed; at most `steps` steps are kept,
    within `budget` bytes together, the oldest forgotten first."""

    def __init__(self, steps: int = HISTORY_STEPS, budget: int = HISTORY_BYTES) -> None:
        self.steps = steps
        self.budget = budget
        self._undo: list[bytes] = []
        self._redo: list[bytes] = []

    def can_undo(self) -> bool:
        return bool(self._undo)

    def can_redo(self) -> bool:
        return bool(self._redo)

    def size(self) -> int:
        """The bytes the kept states take."""
        return sum(len(state) for state in self._undo + self._redo)

    def record(self, before: bytes) -> None:
        """A step was taken from the state `before`."""
        self._undo.append(zlib.compress(before, 1))
        self._redo.clear()
        while len(self._undo) > self.steps or (len(self._undo) > 1 and self.size() > self.budget):
            del self._undo[0]

    def undo(self, current: bytes) -> bytes | None:
        """The state before the last step (`current` is kept for Redo); None if there is none."""
        if not self._undo:
            return None
        self._redo.append(zlib.compress(current, 1))
        return zlib.decompress(self._undo.pop())

    def redo(self, current: bytes) -> bytes | None:
        """The state the last Undo left (`current` is kept for Undo); None if there is none."""
        if not self._redo:
            return None
        self._undo.append(zlib.compress(current, 1))
        return zlib.decompress(self._redo.pop())


class MaskCanvas(QWidget):
    """The picture with the mask over it. The left button paints (white in the mask), or erases
    (black) while `erasing`; the right one does the opposite. A stroke is a line of round dabs
    `brush` of the picture's pixels wide (`scale` mask pixels each). With `hardness` (0 to 1)
    below 1, each dab is full only within `hardness` times its radius and fades to nothing at
    the radius; painting only ever lightens the mask and erasing only darkens it, so a soft dab
    never greys a white area, and dabs over each other do not add up. Each stroke, Clear and
    Invert is one step of `history`. Signal (GUI thread): changed(), after each dab and each
    change of the history."""

    changed = Signal()

    def __init__(self, picture: QImage, mask: QImage | None = None) -> None:
        super().__init__()
        self.picture_size = picture.size()
        # A small picture is painted larger, so that strokes have smooth edges.
        long_side = max(picture.width(), picture.height())
        size = picture.size() * (min(MAX_SIDE, max(MIN_SIDE, long_side)) / long_side)
        self.picture = picture.scaled(
            size, Qt.AspectRatioMode.IgnoreAspectRatio, Qt.TransformationMode.SmoothTransformation
        )
        self.scale = size.width() / picture.width()  # mask pixels per picture pixel
        self.mask_image = QImage(self.picture.size(), QImage.Format.Format_Grayscale8)
        self.mask_image.fill(BLACK)
        if mask is not None and not mask.isNull():  # start from the mask the job has
            grey = mask.convertToFormat(QImage.Format.Format_Grayscale8).scaled(
                self.mask_image.size(),
                Qt.AspectRatioMode.IgnoreAspectRatio,
                Qt.TransformationMode.SmoothTransformation,
            )
            painter = QPainter(self.mask_image)
            painter.drawImage(0, 0, grey)
            painter.end()
        low, high = self.brush_range()
        self.brush = min(high, max(low, round(long_side / 12)))
        self.hardness = 1.0
        self.erasing = False
        self.history = MaskHistory()
        self._before: QImage | None = None  # the mask as the stroke under way found it
        self._last: QPointF | None = None
        self._colour = WHITE
        # The view: `zoom` times the fitted size, moved by `offset` widget pixels from centred.
        self.zoom = 1.0
        self.offset = QPointF(0.0, 0.0)
        self._drag: QPointF | None = None  # where a pan started, while one runs
        self._space = False  # Space held: the left button pans
        self._pointer: QPointF | None = None  # where the brush's outline is drawn
        self.setMinimumSize(240, 180)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)
        self.setCursor(Qt.CursorShape.CrossCursor)
        self.setMouseTracking(True)
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        return self.picture.size()  # the mask's pixels one to one

    def brush_range(self) -> tuple[int, int]:
        """The brush's narrowest and widest diameters, in the picture's pixels."""
        return (
            max(1, math.ceil(BRUSH_RANGE[0] / self.scale)),
            max(2, round(BRUSH_RANGE[1] / self.scale)),
        )

    # What the mask holds ------------------------------------------------------------------

    def is_empty(self) -> bool:
        """Whether nothing would be painted again: no pixel as light as half grey (the engine
        refuses such a mask)."""
        return self._painted_again() == 0

    def painted_share(self) -> float:
        """The share of the picture that is painted again, 0 to 1."""
        return self._painted_again() / max(1, self.mask_image.width() * self.mask_image.height())

    def _painted_again(self) -> int:
        # Counted in C: the Generate page asks after every dab of a stroke.
        return self._bytes().translate(_PAINTED_AGAIN).count(1)

    def _bytes(self) -> bytes:
        # Rows may be padded to 4 bytes: read each row's own pixels.
        width, rows = self.mask_image.width(), self.mask_image.height()
        line = self.mask_image.bytesPerLine()
        data = bytes(self.mask_image.constBits())
        return b"".join(data[row * line : row * line + width] for row in range(rows))

    def clear(self) -> None:
        """Keep the whole picture (one step of the history)."""
        self._end_stroke()
        before = QImage(self.mask_image)  # shares the pixels until fill() writes its own
        self.mask_image.fill(BLACK)
        self._record(before)
        self._changed()

    def invert(self) -> None:
        """Paint again what is kept, and keep what is painted (one step of the history)."""
        self._end_stroke()
        before = QImage(self.mask_image)
        self.mask_image.invertPixels()
        self._record(before)
        self._changed()

    # The history --------------------------------------------------------------------------

    def undo(self) -> None:
        """Take back the last stroke, Clear or Invert."""
        self._end_stroke()
        self._restore(self.history.undo(bytes(self.mask_image.constBits())))

    def redo(self) -> None:
        """Take again what Undo took back."""
        self._end_stroke()
        self._restore(self.history.redo(bytes(self.mask_image.constBits())))

    def _restore(self, state: bytes | None) -> None:
        if state is not None:
            memoryview(self.mask_image.bits())[:] = state
            self._changed()

    def _record(self, before: QImage) -> None:
        # A step that changed nothing (erasing where nothing is painted) is not one to undo.
        state = bytes(before.constBits())
        if state != bytes(self.mask_image.constBits()):
            self.history.record(state)
            self.changed.emit()

    def _end_stroke(self) -> None:
        self._last = None
        if self._before is not None:
            before, self._before = self._before, None
            self._record(before)

    # The view -----------------------------------------------------------------------------

    def target(self) -> QRectF:
        """Where the picture is drawn in the widget: scaled to fit, times `zoom`, centred and
        moved by `offset`."""
        size = self.picture.size().toSizeF()
        size.scale(self.size().toSizeF(), Qt.AspectRatioMode.KeepAspectRatio)
        size *= self.zoom
        x = (self.width() - size.width()) / 2 + self.offset.x()
        y = (self.height() - size.height()) / 2 + self.offset.y()
        return QRectF(QPointF(x, y), size)

    def zoom_at(self, factor: float, position: QPointF) -> None:
        """Zoom by `factor` (within 1 and MAX_ZOOM times the fitted size), keeping the
        picture's point under `position` (widget pixels) where it is."""
        zoom = min(MAX_ZOOM, max(1.0, self.zoom * factor))
        if zoom == self.zoom:
            return
        before = self.to_mask(position)
        self.zoom = zoom
        if zoom == 1.0:
            self.offset = QPointF(0.0, 0.0)  # whole again: centred
        else:
            moved = self.from_mask(before) - position
            self.offset -= moved
        self.update()

    def fit(self) -> None:
        """Show the whole picture, centred."""
        self.zoom, self.offset = 1.0, QPointF(0.0, 0.0)
        self.update()

    def from_mask(self, point: QPointF) -> QPointF:
        """A point of the mask in the widget's pixels."""
        target = self.target()
        factor = target.width() / self.mask_image.width() if self.mask_image.width() else 1.0
        return target.topLeft() + point * factor

    def to_mask(self, position: QPointF) -> QPointF:
        """A point of the widget in the mask's pixels."""
        target = self.target()
        factor = self.mask_image.width() / target.width() if target.width() else 1.0
        return (position - target.topLeft()) * factor

    def wheelEvent(self, event) -> None:  # noqa: N802 - Qt's name
        clicks = event.angleDelta().y() / 120
        if clicks:
            self.zoom_at(ZOOM_STEP**clicks, event.position())
        event.accept()

    def keyPressEvent(self, event) -> None:  # noqa: N802 - Qt's name
        key = event.key()
        centre = QPointF(self.width() / 2, self.height() / 2)
        if key == Qt.Key.Key_Space and not event.isAutoRepeat():
            self._space = True
            self.setCursor(Qt.CursorShape.OpenHandCursor)
        elif key in (Qt.Key.Key_Plus, Qt.Key.Key_Equal):
            self.zoom_at(ZOOM_STEP, centre)
        elif key == Qt.Key.Key_Minus:
            self.zoom_at(1 / ZOOM_STEP, centre)
        elif key == Qt.Key.Key_0:
            self.fit()
        else:
            super().keyPressEvent(event)

    def keyReleaseEvent(self, event) -> None:  # noqa: N802 - Qt's name
        if event.key() == Qt.Key.Key_Space and not event.isAutoRepeat():
            self._space = False
            self.setCursor(Qt.CursorShape.CrossCursor)
        else:
            super().keyReleaseEvent(event)

    def leaveEvent(self, event) -> None:  # noqa: N802 - Qt's name
        self._pointer = None
        self.update()
        super().leaveEvent(event)

    # Painting -----------------------------------------------------------------------------

    def paintEvent(self, event: QPaintEvent) -> None:  # noqa: N802 - Qt's name
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.SmoothPixmapTransform)
        target = self.target()
        painter.drawImage(target, self.picture)
        overlay = QImage(self.mask_image.size(), QImage.Format.Format_ARGB32_Premultiplied)
        overlay.fill(OVERLAY)
        overlay.setAlphaChannel(self.mask_image)
        painter.setOpacity(OVERLAY_OPACITY)
        painter.drawImage(target, overlay)
        if self._pointer is not None and self._drag is None:
            # The brush's outline, at its size on screen, in both colours so it shows anywhere.
            radius = self.brush / 2 * target.width() / max(1, self.picture_size.width())
            painter.setOpacity(1.0)
            painter.setRenderHint(QPainter.RenderHint.Antialiasing)
            painter.setBrush(Qt.BrushStyle.NoBrush)
            for colour, width in ((BLACK, 3.0), (WHITE, 1.0)):
                painter.setPen(QPen(colour, width))
                painter.drawEllipse(self._pointer, radius, radius)
            inner = radius * self.hardness
            if self.hardness < 1.0 and inner >= 2.0:  # where a soft brush starts to fade
                for colour, width in ((BLACK, 3.0), (WHITE, 1.0)):
                    painter.setPen(QPen(colour, width, Qt.PenStyle.DashLine))
                    painter.drawEllipse(self._pointer, inner, inner)
        painter.end()

    def mousePressEvent(self, event: QMouseEvent) -> None:  # noqa: N802 - Qt's name
        button = event.button()
        if button == Qt.MouseButton.MiddleButton or (
            button == Qt.MouseButton.LeftButton and self._space
        ):
            self._drag = event.position()
            self.setCursor(Qt.CursorShape.ClosedHandCursor)
            return
        if button not in (Qt.MouseButton.LeftButton, Qt.MouseButton.RightButton):
            return
        self._end_stroke()  # the other button may still hold one
        paints = (button == Qt.MouseButton.LeftButton) != self.erasing
        self._colour = WHITE if paints else BLACK
        self._before = QImage(self.mask_image)  # shares the pixels until the first dab
        self._last = self.to_mask(event.position())
        self._dab(self._last, self._last)

    def mouseMoveEvent(self, event: QMouseEvent) -> None:  # noqa: N802 - Qt's name
        self._pointer = event.position()
        if self._drag is not None:
            self.offset += event.position() - self._drag
            self._drag = event.position()
            self.update()
            return
        if self._last is None:
            self.update()  # the brush's outline follows the pointer
            return
        point = self.to_mask(event.position())
        self._dab(self._last, point)
        self._last = point

    def mouseReleaseEvent(self, event: QMouseEvent) -> None:  # noqa: N802 - Qt's name
        if self._drag is not None:
            self._drag = None
            self.setCursor(
                Qt.CursorShape.OpenHandCursor if self._space else Qt.CursorShape.CrossCursor
            )
        self._end_stroke()

    def _dab(self, start: QPointF, end: QPointF) -> None:
        painter = QPainter(self.mask_image)
        width = max(1.0, self.brush * self.scale)  # in the mask's pixels
        if self.hardness >= 1.0:
            pen = QPen(self._colour, width, Qt.PenStyle.SolidLine, Qt.PenCapStyle.RoundCap)
            painter.setPen(pen)
            if start == end:  # a click: Qt draws nothing for a line with no length
                painter.drawPoint(start)
            else:
                painter.drawLine(start, end)
        else:
            self._soft_dabs(painter, start, end, width / 2)
        painter.end()
        self._changed()

    def _soft_dabs(self, painter: QPainter, start: QPointF, end: QPointF, radius: float) -> None:
        # Each dab is opaque grey, fading from the brush's colour to the other one, and is
        # laid with Lighten (painting) or Darken (erasing): the mask keeps the lighter (or
        # darker) of its value and the dab's, so overlapping dabs never add up. A dab fading to
        # transparent would add up as ordinary painting does, hardening the stroke's edge.
        painting = self._colour == WHITE
        fade_to = BLACK if painting else WHITE
        painter.setCompositionMode(
            QPainter.CompositionMode.CompositionMode_Lighten
            if painting
            else QPainter.CompositionMode.CompositionMode_Darken
        )
        # No antialiasing: the gradient has nearly faded out at the rim, and a rim pixel's
        # partial cover would let repeated dabs creep there.
        painter.setPen(Qt.PenStyle.NoPen)
        length = math.hypot(end.x() - start.x(), end.y() - start.y())
        steps = max(1, math.ceil(length / max(1.0, radius * DAB_SPACING)))
        for step in range(steps + 1):
            centre = start + (end - start) * (step / steps)
            gradient = QRadialGradient(centre, radius)
            gradient.setColorAt(0.0, self._colour)
            gradient.setColorAt(self.hardness, self._colour)
            gradient.setColorAt(1.0, fade_to)
            painter.setBrush(gradient)
            painter.drawEllipse(centre, radius, radius)

    def _changed(self) -> None:
        self.update()
        self.changed.emit()

    def png(self) -> bytes:
        """The mask as an 8-bit greyscale PNG file's bytes, as painted: white where the picture
        is painted again, black where it is kept, grey where the new picture is blended with
        the kept one (the engine paints again where the mask is at least half grey and blends
        the result into the kept picture by the mask's grey values)."""
        data = QByteArray()
        buffer = QBuffer(data)
        buffer.open(QIODevice.OpenModeFlag.WriteOnly)
        QImageWriter(buffer, QByteArray(b"PNG")).write(self.mask_image)
        buffer.close()
        return bytes(data.data())


class MaskPainter(QDialog):
    """Paint a mask over `picture` (the input picture's image; `name` its file's name), starting
    from `mask` when the job has one. "Use this mask" is offered once something is painted;
    `save()` writes the PNG and returns its path."""

    def __init__(self, picture: QImage, mask: QImage | None, name: str, parent=None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Paint the mask")
        self.name = name
        self.column = column = QVBoxLayout(self)
        column.addWidget(
            label(
                "Paint over what is drawn again (shown in colour); the rest of the picture is "
                "kept. The left mouse button paints or erases as Paint / Erase says, the right "
                "button does the opposite. A hardness below 100 % softens the brush's edge, so "
                "the new picture blends into the kept one. The wheel zooms; drag with the "
                "middle button, or with Space held, to move around.",
                "muted",
                wrap=True,
            )
        )
        self.canvas = MaskCanvas(picture, mask)
        column.addWidget(self.canvas, 1)
        column.addLayout(self._tools())
        self.share = label("", "muted")
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel)
        # Some styles give Cancel an icon and no other button one: none has one here.
        self.cancel_button = self.buttons.button(QDialogButtonBox.StandardButton.Cancel)
        self.cancel_button.setIcon(QIcon())
        self.use_button = self.buttons.addButton(
            "Use this mask", QDialogButtonBox.ButtonRole.AcceptRole
        )
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        bottom = QHBoxLayout()
        bottom.addWidget(self.share)
        bottom.addStretch(1)
        bottom.addWidget(self.buttons)
        column.addLayout(bottom)
        self._shortcuts()
        self.canvas.changed.connect(self._update)
        self._update()
        self.resize(self.opening_size())
        self.canvas.setFocus()

    def _tools(self) -> QHBoxLayout:
        tools = QHBoxLayout()
        self.paint_button = self._tool(
            "Paint",
            f"The left button paints what is drawn again ({PAINT_KEY}; {SWAP_KEY} swaps Paint "
            "and Erase). The right button erases.",
        )
        self.erase_button = self._tool(
            "Erase",
            f"The left button erases, keeping the picture there ({ERASE_KEY}; {SWAP_KEY} swaps "
            "Paint and Erase). The right button paints.",
        )
        self.mode = QButtonGroup(self)  # exclusive: one of the two is always on
        pair = QWidget()
        pair.setObjectName("mode")
        pair.setStyleSheet(MODE_STYLE)
        row = QHBoxLayout(pair)
        row.setContentsMargins(0, 0, 0, 0)
        row.setSpacing(0)
        for button, name in ((self.paint_button, "paint"), (self.erase_button, "erase")):
            button.setObjectName(name)
            button.setCheckable(True)
            self.mode.addButton(button)
            row.addWidget(button)
        self.paint_button.setChecked(True)
        self.erase_button.toggled.connect(self._set_erasing)
        tools.addWidget(pair)
        tools.addSpacing(8)
        picture = self.canvas.picture_size
        self.brush_label = label("Brush (picture px)")
        tools.addWidget(self.brush_label)
        self.brush = QSpinBox()
        self.brush.setRange(*self.canvas.brush_range())
        self.brush.setSuffix(" px")
        self.brush.setValue(self.canvas.brush)
        self.brush.setToolTip(
            f"The brush's width in the picture's own pixels (it is {picture.width()} × "
            f"{picture.height()}), whatever the zoom: zoomed in, the brush's outline is larger "
            "on screen and it paints the same width on the picture."
        )
        self.brush.valueChanged.connect(self._set_brush)
        tools.addWidget(self.brush)
        tools.addWidget(label("Hardness"))
        self.hardness = QSpinBox()
        self.hardness.setRange(0, 100)
        self.hardness.setSuffix(" %")
        self.hardness.setValue(round(self.canvas.hardness * 100))
        self.hardness.setToolTip(
            "100 % paints a hard edge. Lower values fade the brush's edge, so the new picture "
            "blends into the kept one; the dashed circle shows where the fading starts, the "
            "outer one where it ends."
        )
        self.hardness.valueChanged.connect(self._set_hardness)
        tools.addWidget(self.hardness)
        tools.addSpacing(8)
        self.undo_button = self._tool(
            "Undo",
            f"Take back the last stroke, Clear or Invert ({_keys(UNDO_KEYS)}); up to "
            f"{HISTORY_STEPS} steps.",
        )
        self.undo_button.clicked.connect(self.canvas.undo)
        self.redo_button = self._tool(
            "Redo", f"Take again what Undo took back ({_keys(REDO_KEYS)})."
        )
        self.redo_button.clicked.connect(self.canvas.redo)
        self.clear_button = self._tool("Clear", "Keep the whole picture (Undo brings it back).")
        self.clear_button.clicked.connect(self.canvas.clear)
        self.invert_button = self._tool(
            "Invert", "Paint again what is kept, and keep what is painted."
        )
        self.invert_button.clicked.connect(self.canvas.invert)
        self.fit_button = self._tool("Fit", "Show the whole picture again (0).")
        self.fit_button.clicked.connect(self.canvas.fit)
        for button in (
            self.undo_button,
            self.redo_button,
            self.clear_button,
            self.invert_button,
            self.fit_button,
        ):
            tools.addWidget(button)
        tools.addStretch(1)
        return tools

    @staticmethod
    def _tool(text: str, tip: str) -> QPushButton:
        button = QPushButton(text)
        button.setToolTip(tip)
        # Clicked, it leaves the keyboard with the canvas (Space, +, -, 0); Tab still reaches it.
        button.setFocusPolicy(Qt.FocusPolicy.TabFocus)
        button.setAutoDefault(False)  # Enter stays with "Use this mask"
        # As wide as its word: the style's least width for a dialog's buttons would make the
        # row wider than a 1024 px screen's dialog.
        words = button.fontMetrics().horizontalAdvance(text)
        button.setFixedWidth(max(words + 24, button.sizeHint().height() + 6))
        return button

    def _shortcuts(self) -> None:
        actions = [(key, self.canvas.undo) for key in UNDO_KEYS]
        actions += [(key, self.canvas.redo) for key in REDO_KEYS]
        actions += [
            (PAINT_KEY, lambda: self.paint_button.setChecked(True)),
            (ERASE_KEY, lambda: self.erase_button.setChecked(True)),
            (SWAP_KEY, self._swap),
        ]
        for key, action in actions:
            QShortcut(QKeySequence(key), self).activated.connect(action)

    def opening_size(self) -> QSize:
        """The picture as large as it fits, at its proportions, within SCREEN_SHARE of the
        available size of the screen the dialog opens on (its parent's), with the tools and
        buttons around it; never narrower than the tools need."""
        parent = self.parentWidget()
        screen = (parent.screen() if parent is not None else None) or self.screen()
        available = screen.availableGeometry().size()
        most = QSize(
            round(available.width() * SCREEN_SHARE), round(available.height() * SCREEN_SHARE)
        )
        self.column.activate()
        margins = self.column.contentsMargins()
        across = margins.left() + margins.right()
        around = self.sizeHint().height() - self.canvas.sizeHint().height()
        room = QSize(max(1, most.width() - across), max(1, most.height() - around))
        shown = self.canvas.picture.size().scaled(room, Qt.AspectRatioMode.KeepAspectRatio)
        least = self.minimumSizeHint()
        return QSize(
            max(least.width(), shown.width() + across), max(least.height(), shown.height() + around)
        )

    def _swap(self) -> None:
        # The pair is exclusive: unchecking the one that is on does nothing, so check the other.
        other = self.paint_button if self.erase_button.isChecked() else self.erase_button
        other.setChecked(True)

    def _set_erasing(self, erasing: bool) -> None:
        self.canvas.erasing = erasing

    def _set_brush(self, value: int) -> None:
        self.canvas.brush = value
        self.canvas.update()  # the outline shows the new width

    def _set_hardness(self, value: int) -> None:
        self.canvas.hardness = value / 100
        self.canvas.update()  # the outline shows the new hardness

    def _update(self) -> None:
        share = self.canvas.painted_share()  # 0 exactly when the mask is empty
        self.use_button.setEnabled(share > 0)
        self.undo_button.setEnabled(self.canvas.history.can_undo())
        self.redo_button.setEnabled(self.canvas.history.can_redo())
        self.share.setText(f"{share:.0%} painted again" if share else "Nothing painted yet")

    def save(self, folder: Path | None = None) -> Path:
        """Write the mask as `<picture>-mask-<time>.png` in `folder` (by default the masks
        folder beside HalfSafe's data); a new file each time, never one already there. Raises
        OSError when it cannot be written."""
        folder = folder or masks_folder()
        stamp = time.strftime("%Y%m%d-%H%M%S")
        data = self.canvas.png()
        for attempt in range(100):
            suffix = f"-{attempt}" if attempt else ""
            path = folder / f"{Path(self.name).stem}-mask-{stamp}{suffix}.png"
            try:
                return write_atomic(path, data, overwrite=False, shared=True)
            except FileExistsError:
                continue
        raise OSError(f"no free name for the mask in {folder}")
