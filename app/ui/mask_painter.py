"""Painting an inpainting mask over the input picture: the picture scaled to fit, the mask over
it in translucent colour, the left mouse button painting what is drawn again and the right one
erasing, the brush's outline under the pointer. The brush has a size and a hardness: a hard
brush paints a sharp edge, a softer one an edge that fades through greys. The mouse wheel zooms
about the pointer (up to `MAX_ZOOM` times the fitted size), the middle button (or the left one
with Space held) drags the picture, and Fit (or 0) shows it whole again. The mask is painted at
the picture's proportions, its long side between `MIN_SIDE` and `MAX_SIDE` pixels (every job
resizes its mask to its own size), and saved as an 8-bit greyscale PNG: white where the picture
is painted again, as every tool's masks are, black where it is kept, and grey where the new
picture is blended with the kept one (the engine paints again where the mask is at least half
grey and blends the result into the kept picture by the mask's grey values).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QPointF, QRectF, Qt, Signal
from PySide6.QtGui import (
    QColor,
    QImage,
    QImageWriter,
    QMouseEvent,
    QPainter,
    QPaintEvent,
    QPen,
    QRadialGradient,
)
from PySide6.QtWidgets import (
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
BRUSH_RANGE = (2, 400)  # brush diameters, in the mask's pixels; a twelfth of it by default
DAB_SPACING = 0.25  # a soft stroke's dabs, apart by this share of the brush's radius
MAX_ZOOM = 16.0  # times the fitted size
ZOOM_STEP = 1.25  # per wheel click (120 eighths of a degree)
OVERLAY = QColor(230, 60, 60)  # the mask's colour over the picture
OVERLAY_OPACITY = 0.55
WHITE, BLACK = QColor(255, 255, 255), QColor(0, 0, 0)


def masks_folder() -> Path:
    """Where painted masks are kept: beside HalfSafe's other data, never in the picture's own
    folder (which may be another program's, or read-only)."""
    return paths.data_dir() / "masks"


class MaskCanvas(QWidget):
    """The picture with the mask over it. The left button paints (white in the mask), the
    right one erases (black); a stroke is a line of round dabs `brush` mask pixels wide. With
    `hardness` (0 to 1) below 1, each dab is full only within `hardness` times its radius and
    fades to nothing at the radius; painting only ever lightens the mask and erasing only
    darkens it, so a soft dab never greys a white area, and dabs over each other do not add up.
    Signal (GUI thread): changed(), after each dab."""

    changed = Signal()

    def __init__(self, picture: QImage, mask: QImage | None = None) -> None:
        super().__init__()
        # A small picture is painted larger, so that strokes have smooth edges.
        long_side = max(picture.width(), picture.height())
        scale = min(MAX_SIDE, max(MIN_SIDE, long_side)) / long_side
        size = picture.size() * scale
        self.picture = picture.scaled(
            size, Qt.AspectRatioMode.IgnoreAspectRatio, Qt.TransformationMode.SmoothTransformation
        )
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
        self.brush = max(BRUSH_RANGE[0], round(max(size.width(), size.height()) / 12))
        self.hardness = 1.0
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

    # What the mask holds ------------------------------------------------------------------

    def is_empty(self) -> bool:
        """Whether nothing would be painted again: no pixel as light as half grey (the engine
        refuses such a mask)."""
        data = self._bytes()
        return not data or max(data) < 128

    def painted_share(self) -> float:
        """The share of the picture that is painted again, 0 to 1."""
        data = self._bytes()
        return sum(1 for value in data if value >= 128) / max(1, len(data))

    def _bytes(self) -> bytes:
        # Rows may be padded to 4 bytes: read each row's own pixels.
        width, rows = self.mask_image.width(), self.mask_image.height()
        line = self.mask_image.bytesPerLine()
        data = bytes(self.mask_image.constBits())
        return b"".join(data[row * line : row * line + width] for row in range(rows))

    def clear(self) -> None:
        self.mask_image.fill(BLACK)
        self._changed()

    def invert(self) -> None:
        self.mask_image.invertPixels()
        self._changed()

    # Painting -----------------------------------------------------------------------------

    def target(self) -> QRectF:
        """Where the picture is drawn in the widget: scaled to fit, times `zoom`, centred and
        moved by `offset`."""
        size = self.picture.size().toSizeF()
        size.scale(self.size().toSizeF(), Qt.AspectRatioMode.KeepAspectRatio)
        size *= self.zoom
        x = (self.width() - size.width()) / 2 + self.offset.x()
        y = (self.height() - size.height()) / 2 + self.offset.y()
        return QRectF(QPointF(x, y), size)

    # The view -----------------------------------------------------------------------------

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

    def to_mask(self, position: QPointF) -> QPointF:
        """A point of the widget in the mask's pixels."""
        target = self.target()
        factor = self.mask_image.width() / target.width() if target.width() else 1.0
        return (position - target.topLeft()) * factor

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
            radius = self.brush / 2 * target.width() / max(1, self.mask_image.width())
            painter.setOpacity(1.0)
            painter.setRenderHint(QPainter.RenderHint.Antialiasing)
            painter.setBrush(Qt.BrushStyle.NoBrush)
            for colour, width in ((BLACK, 3.0), (WHITE, 1.0)):
                painter.setPen(QPen(colour, width))
                painter.drawEllipse(self._pointer, radius, radius)
            if self.hardness < 1.0:  # where a soft brush starts to fade
                inner = radius * self.hardness
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
        self._colour = WHITE if button == Qt.MouseButton.LeftButton else BLACK
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
        self._last = None

    def _dab(self, start: QPointF, end: QPointF) -> None:
        painter = QPainter(self.mask_image)
        if self.hardness >= 1.0:
            pen = QPen(self._colour, self.brush, Qt.PenStyle.SolidLine, Qt.PenCapStyle.RoundCap)
            painter.setPen(pen)
            if start == end:  # a click: Qt draws nothing for a line with no length
                painter.drawPoint(start)
            else:
                painter.drawLine(start, end)
        else:
            self._soft_dabs(painter, start, end)
        painter.end()
        self._changed()

    def _soft_dabs(self, painter: QPainter, start: QPointF, end: QPointF) -> None:
        # Each dab is opaque grey, fading from the brush's colour to the other one, and is
        # laid with Lighten (painting) or Darken (erasing): the mask keeps the lighter (or
        # darker) of its value and the dab's, so overlapping dabs never add up. A dab fading to
        # transparent would add up as ordinary painting does, hardening the stroke's edge.
        radius = self.brush / 2
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
        column = QVBoxLayout(self)
        column.addWidget(
            label(
                "Paint with the left mouse button over what is drawn again (shown in colour); "
                "the right button erases. The rest of the picture is kept. A hardness below "
                "100 % softens the brush's edge, so the new picture blends into the kept one. "
                "The wheel zooms; drag with the middle button, or with Space held, to move "
                "around.",
                "muted",
                wrap=True,
            )
        )
        self.canvas = MaskCanvas(picture, mask)
        column.addWidget(self.canvas, 1)
        tools = QHBoxLayout()
        tools.addWidget(label("Brush"))
        self.brush = QSpinBox()
        self.brush.setRange(*BRUSH_RANGE)
        self.brush.setSuffix(" px")
        self.brush.setValue(self.canvas.brush)
        self.brush.setToolTip("The brush's width in the mask's pixels.")
        self.brush.valueChanged.connect(self._set_brush)
        tools.addWidget(self.brush)
        tools.addWidget(label("Hardness"))
        self.hardness = QSpinBox()
        self.hardness.setRange(0, 100)
        self.hardness.setSuffix(" %")
        self.hardness.setValue(round(self.canvas.hardness * 100))
        self.hardness.setToolTip(
            "100 % paints a hard edge. Lower values fade the brush's edge, so the new picture "
            "blends into the kept one; the dashed circle shows where the fading starts."
        )
        self.hardness.valueChanged.connect(self._set_hardness)
        tools.addWidget(self.hardness)
        self.clear_button = QPushButton("Clear")
        self.clear_button.clicked.connect(self.canvas.clear)
        self.invert_button = QPushButton("Invert")
        self.invert_button.setToolTip("Paint again what is kept, and keep what is painted.")
        self.invert_button.clicked.connect(self.canvas.invert)
        tools.addWidget(self.clear_button)
        tools.addWidget(self.invert_button)
        self.fit_button = QPushButton("Fit")
        self.fit_button.setToolTip("Show the whole picture again (0).")
        self.fit_button.clicked.connect(self.canvas.fit)
        tools.addWidget(self.fit_button)
        tools.addStretch(1)
        self.share = label("", "muted")
        tools.addWidget(self.share)
        column.addLayout(tools)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel)
        self.use_button = self.buttons.addButton(
            "Use this mask", QDialogButtonBox.ButtonRole.AcceptRole
        )
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        column.addWidget(self.buttons)
        self.canvas.changed.connect(self._update)
        self._update()
        self.resize(720, 600)

    def _set_brush(self, value: int) -> None:
        self.canvas.brush = value

    def _set_hardness(self, value: int) -> None:
        self.canvas.hardness = value / 100
        self.canvas.update()  # the outline shows the new hardness

    def _update(self) -> None:
        empty = self.canvas.is_empty()
        self.use_button.setEnabled(not empty)
        self.share.setText(
            "Nothing painted yet" if empty else f"{self.canvas.painted_share():.0%} painted again"
        )

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
