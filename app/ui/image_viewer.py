"""The image viewer: one image large, beside the parameters it records (HalfSafe's, or another
tool's: AUTOMATIC1111/Forge infotext, ComfyUI's graphs, InvokeAI's metadata, read through the
readers `halfsafe explain` uses), with what to do next: send them to Generate, ask why the image
is black, start a new image from it, open its folder, copy them. The picture sits in a thin frame
(a black image on a dark window keeps its edges) and zooms: Fit, 1:1 (actual pixels, dragged to
pan), Ctrl+wheel or + and - in steps, 0 back to Fit. Previous and Next (or left and right) walk
the gallery, which says where the image is in it ("3 of 12"); Escape closes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QEvent, QPoint, QPointF, QRect, QRectF, QSize, Qt, Signal
from PySide6.QtGui import (
    QColor,
    QGuiApplication,
    QImageReader,
    QKeySequence,
    QPainter,
    QPen,
    QPixmap,
    QShortcut,
)
from PySide6.QtWidgets import (
    QAbstractScrollArea,
    QDialog,
    QFrame,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSizePolicy,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app.ui.image_entry import (
    GalleryEntry,
    live_lines,
    made_by_words,
    parameter_text,
    read_image_file,
    recorded_lines,
    status_words,
)
from app.ui.on_screen import fitting_size
from app.ui.theme import scheme_for
from app.ui.widgets import label, plain_scroll

# step(+1 or -1): the gallery's next or previous image, made current there; None past its ends.
Step = Callable[[int], GalleryEntry | None]
# place(): where the gallery's current image is, (position counted from 1, number of images);
# None when none is current.
Place = Callable[[], tuple[int, int] | None]

# The zoom steps + and - and Ctrl+wheel go through, as screen pixels per image pixel.
ZOOM_STEPS = (0.1, 0.25, 1 / 3, 0.5, 2 / 3, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0)
# Window colour left around the picture (logical pixels), so its frame shows on every side.
MARGIN = 12
# A wheel's notch (Qt's angle delta, eighths of a degree); touchpads send fractions of it.
NOTCH = 120
# The diagnosis box's colours (the theme's banner levels) for each way an image can go wrong.
DIAGNOSIS_LEVEL = {"nan": "bad", "black": "warn", "safety_checker": "warn", "fixed": "info"}


def load_pixmap(entry: GalleryEntry) -> tuple[QPixmap, str]:
    """The image at full size, or a null pixmap and one sentence naming the file and why.
    Qt's reader refuses images past its allocation limit (256 MB) before decoding them."""
    if entry.unsaved:
        pixmap = QPixmap()
        pixmap.loadFromData(entry.png or b"", "PNG")
        return pixmap, "" if not pixmap.isNull() else "The image in memory cannot be shown."
    reader = QImageReader(entry.path)
    reader.setAutoTransform(True)
    image = reader.read()
    if image.isNull():
        reason = reader.errorString().rstrip(".") or "unreadable"
        return QPixmap(), f"{entry.path}: cannot be shown ({reason[:1].lower() + reason[1:]})."
    return QPixmap.fromImage(image), ""


def panel_text(entry: GalleryEntry) -> str:
    """The panel's words as one text (what Copy parameters copies when the file holds no
    parameters text): which tool made the image, what went wrong, its parameters; or the one
    sentence that says why the file could not be read."""
    if entry.problem:
        return entry.problem
    head = [made_by_words(entry)]
    diagnosis = status_words(entry)
    if diagnosis:
        head.append(f"{diagnosis}.")
    if entry.message:
        head.append(entry.message)
    return "\n".join(head) + "\n\n" + parameter_text(entry)


def zoom_words(scale: float, fit: bool) -> str:
    """'Fit · 37 %', '100 %': the zoom as the viewer's bar shows it."""
    percent = f"{scale * 100:.0f} %" if scale >= 0.1 else f"{scale * 100:.1f} %"
    return f"Fit · {percent}" if fit else percent


class ZoomView(QAbstractScrollArea):
    """One image in a thin frame, on the window's colour: scaled to fit the view (`zoom` None,
    the default) or at a fixed zoom (1.0: one image pixel to one screen pixel), scrolled with
    the scroll bars, the wheel or by dragging when larger than the view. Ctrl+wheel zooms in
    steps about the pointer, a double-click switches between Fit and 1:1 there. Empty, it says
    its placeholder. `zoom_changed` follows every change of the scale, the view's resizing in
    Fit included."""

    zoom_changed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.pixmap = QPixmap()
        self.placeholder = ""
        self.zoom: float | None = None
        self._smooth = QPixmap()  # the image smoothly scaled for the size it was last drawn at
        self._drag_from: QPoint | None = None
        self._wheel = 0  # the angle the wheel turned with Ctrl held, short of a notch
        self._shown_scale = 0.0
        self._frame = QColor()  # frame_colour's, for the palette now
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setFocusPolicy(Qt.FocusPolicy.ClickFocus)  # Enter keeps pressing the panel's button
        # Small enough that the panel beside it keeps its lines in a 700 px tall window.
        self.setMinimumSize(260, 150)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)
        for bar in (self.horizontalScrollBar(), self.verticalScrollBar()):
            bar.setSingleStep(40)

    # The picture and its scale -----------------------------------------------------------------

    def set_pixmap(self, pixmap: QPixmap | None, placeholder: str = "") -> None:
        """Show `pixmap` (None: the placeholder) at the zoom already chosen, scrolled where the
        last one was as far as it reaches: walking the gallery at 1:1 compares the same spot."""
        self.pixmap = pixmap if pixmap is not None else QPixmap()
        self.placeholder = placeholder
        self._smooth = QPixmap()
        self._relayout()
        self.viewport().update()

    def scale(self) -> float:
        """Device pixels per image pixel now: the chosen zoom, or the one that fits the view."""
        if self.zoom is not None:
            return self.zoom
        return self.fit_scale()

    def fit_scale(self) -> float:
        if self.pixmap.isNull():
            return 1.0
        ratio = self.devicePixelRatioF()
        width = max(1.0, (self.viewport().width() - 2 * MARGIN) * ratio)
        height = max(1.0, (self.viewport().height() - 2 * MARGIN) * ratio)
        return min(width / self.pixmap.width(), height / self.pixmap.height())

    def scrollable(self) -> bool:
        return self.horizontalScrollBar().maximum() > 0 or self.verticalScrollBar().maximum() > 0

    def image_rect(self) -> QRect:
        """Where the picture is drawn, in the viewport's (logical) pixels: centred where it is
        smaller than the view, else scrolled."""
        factor = self.scale() / self.devicePixelRatioF()
        width = round(self.pixmap.width() * factor)
        height = round(self.pixmap.height() * factor)
        view = self.viewport().size()
        if width + 2 * MARGIN <= view.width():
            x = (view.width() - width) // 2
        else:
            x = MARGIN - self.horizontalScrollBar().value()
        if height + 2 * MARGIN <= view.height():
            y = (view.height() - height) // 2
        else:
            y = MARGIN - self.verticalScrollBar().value()
        return QRect(x, y, width, height)

    def frame_colour(self) -> QColor:
        """The frame's colour: the palette's muted text colour, which keeps a contrast of at
        least 4.5 with the window colour behind it in either scheme (worked out once per
        palette: the frame is painted at every step of a drag)."""
        if not self._frame.isValid():
            self._frame = QColor(scheme_for(self.palette()).muted)
        return self._frame

    def set_zoom(self, zoom: float | None, anchor: QPointF | None = None) -> None:
        """Zoom to `zoom` (None: Fit), keeping the image point under `anchor` (viewport
        pixels; the view's centre when None) where it is."""
        if self.pixmap.isNull():
            self.zoom = zoom
            self.zoom_changed.emit()
            return
        if anchor is None:
            anchor = QPointF(self.viewport().rect().center())
        before = self.image_rect()
        spot = QPointF(
            (anchor.x() - before.x()) / max(1, before.width()),
            (anchor.y() - before.y()) / max(1, before.height()),
        )
        self.zoom = None if zoom is None else min(ZOOM_STEPS[-1], max(ZOOM_STEPS[0], zoom))
        self._relayout()
        after = self.image_rect()
        # Scrolled so that the spot's share of the picture lies under the anchor again.
        self.horizontalScrollBar().setValue(round(MARGIN + spot.x() * after.width() - anchor.x()))
        self.verticalScrollBar().setValue(round(MARGIN + spot.y() * after.height() - anchor.y()))
        self.viewport().update()
        self.zoom_changed.emit()  # Fit at 100 % and 1:1 are one scale but not one choice

    def zoom_in(self, anchor: QPointF | None = None) -> None:
        """The next zoom step larger than the scale shown."""
        scale = self.scale()
        larger = [step for step in ZOOM_STEPS if step > scale * 1.001]
        if larger:
            self.set_zoom(larger[0], anchor)

    def zoom_out(self, anchor: QPointF | None = None) -> None:
        """The next zoom step smaller than the scale shown."""
        scale = self.scale()
        smaller = [step for step in ZOOM_STEPS if step < scale / 1.001]
        if smaller:
            self.set_zoom(smaller[-1], anchor)

    def _relayout(self) -> None:
        """The scroll bars' ranges for the picture at its scale; says when the scale moved."""
        view = self.viewport().size()
        if self.pixmap.isNull():
            width = height = 0
        else:
            factor = self.scale() / self.devicePixelRatioF()
            width = round(self.pixmap.width() * factor) + 2 * MARGIN
            height = round(self.pixmap.height() * factor) + 2 * MARGIN
        for bar, extent, page in (
            (self.horizontalScrollBar(), width, view.width()),
            (self.verticalScrollBar(), height, view.height()),
        ):
            bar.setPageStep(page)
            bar.setRange(0, max(0, extent - page))
        self.viewport().setCursor(
            Qt.CursorShape.OpenHandCursor if self.scrollable() else Qt.CursorShape.ArrowCursor
        )
        scale = self.scale()
        if scale != self._shown_scale:
            self._shown_scale = scale
            self.zoom_changed.emit()

    # Painting ----------------------------------------------------------------------------------

    def paintEvent(self, _event: Any) -> None:  # noqa: N802 - Qt's name
        painter = QPainter(self.viewport())
        painter.fillRect(self.viewport().rect(), self.palette().window())
        if self.pixmap.isNull():
            painter.setPen(self.palette().placeholderText().color())
            painter.drawText(
                self.viewport().rect().adjusted(20, 20, -20, -20),
                Qt.AlignmentFlag.AlignCenter | Qt.TextFlag.TextWordWrap,
                self.placeholder,
            )
            painter.end()
            return
        target = self.image_rect()
        scale = self.scale()
        if self.zoom is None or scale < 1:
            painter.drawPixmap(target.topLeft(), self._smoothly_scaled(target.size()))
        else:
            # Each image pixel a sharp square: only the part in view is drawn, so a large
            # image at a large zoom costs what the view shows.
            shown = QRectF(target.intersected(self.viewport().rect()))
            factor = target.width() / self.pixmap.width()
            source = QRectF(
                (shown.x() - target.x()) / factor,
                (shown.y() - target.y()) / factor,
                shown.width() / factor,
                shown.height() / factor,
            )
            painter.drawPixmap(shown, self.pixmap, source)
        painter.setPen(QPen(self.frame_colour(), 1))
        painter.setBrush(Qt.BrushStyle.NoBrush)
        # A 1 px line just outside the picture on all four sides.
        painter.drawRect(target.adjusted(-1, -1, 0, 0))
        painter.end()

    def _smoothly_scaled(self, size: QSize) -> QPixmap:
        """The image scaled to `size` (logical pixels) with Qt's area-averaging scaler, kept
        for the next paint at the same size (scrolling, the frame's repaint)."""
        ratio = self.devicePixelRatioF()
        device = QSize(round(size.width() * ratio), round(size.height() * ratio))
        if self._smooth.isNull() or self._smooth.size() != device:
            if device == self.pixmap.size():
                self._smooth = QPixmap(self.pixmap)
            else:
                self._smooth = self.pixmap.scaled(
                    device,
                    Qt.AspectRatioMode.IgnoreAspectRatio,
                    Qt.TransformationMode.SmoothTransformation,
                )
            self._smooth.setDevicePixelRatio(ratio)
        return self._smooth

    # Qt's events -------------------------------------------------------------------------------

    def resizeEvent(self, event: Any) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        self._relayout()

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802 - Qt's name
        if event.type() == QEvent.Type.PaletteChange:
            self._frame = QColor()  # the desktop went light or dark
        super().changeEvent(event)

    def scrollContentsBy(self, _dx: int, _dy: int) -> None:  # noqa: N802 - Qt's name
        self.viewport().update()

    def wheelEvent(self, event: Any) -> None:  # noqa: N802 - Qt's name
        if not event.modifiers() & Qt.KeyboardModifier.ControlModifier:
            super().wheelEvent(event)
            return
        event.accept()
        if self.pixmap.isNull():
            return
        self._wheel += event.angleDelta().y()
        while abs(self._wheel) >= NOTCH:
            if self._wheel > 0:
                self._wheel -= NOTCH
                self.zoom_in(event.position())
            else:
                self._wheel += NOTCH
                self.zoom_out(event.position())

    def mousePressEvent(self, event: Any) -> None:  # noqa: N802 - Qt's name
        if event.button() == Qt.MouseButton.LeftButton and self.scrollable():
            self._drag_from = event.position().toPoint()
            self.viewport().setCursor(Qt.CursorShape.ClosedHandCursor)
            event.accept()
            return
        super().mousePressEvent(event)

    def mouseMoveEvent(self, event: Any) -> None:  # noqa: N802 - Qt's name
        if self._drag_from is None:
            super().mouseMoveEvent(event)
            return
        at = event.position().toPoint()
        moved = at - self._drag_from
        self._drag_from = at
        self.horizontalScrollBar().setValue(self.horizontalScrollBar().value() - moved.x())
        self.verticalScrollBar().setValue(self.verticalScrollBar().value() - moved.y())
        event.accept()

    def mouseReleaseEvent(self, event: Any) -> None:  # noqa: N802 - Qt's name
        if self._drag_from is not None and event.button() == Qt.MouseButton.LeftButton:
            self._drag_from = None
            self._relayout()  # the open hand again, or the arrow
            event.accept()
            return
        super().mouseReleaseEvent(event)

    def mouseDoubleClickEvent(self, event: Any) -> None:  # noqa: N802 - Qt's name
        if event.button() != Qt.MouseButton.LeftButton or self.pixmap.isNull():
            super().mouseDoubleClickEvent(event)
            return
        self._drag_from = None
        self.set_zoom(1.0 if self.zoom is None else None, event.position())
        event.accept()


class ImageViewer(QDialog):
    """A non-modal window that shows one image at a time (`show_image`). `send_to_generate(
    values)` fills the Generate form; `explain(path)` opens the explanation of an image;
    `use_as_input(path)` makes the image the Generate page's input picture (whether it was
    taken: the page says why not)."""

    def __init__(
        self,
        dialogs: Any,
        send_to_generate: Callable[[dict[str, Any]], None],
        explain: Callable[[str], Any],
        parent: QWidget | None = None,
        use_as_input: Callable[[str], bool] | None = None,
    ) -> None:
        super().__init__(parent)
        self.dialogs = dialogs
        self.send_to_generate = send_to_generate
        self.explain = explain
        self.use_as_input = use_as_input
        self.entry = GalleryEntry()
        self._step: Step | None = None
        self._place: Place | None = None
        self.setModal(False)
        self.resize(fitting_size(self, QSize(1100, 760)))

        self.buttons: dict[str, QPushButton] = {}
        # The panel first: its buttons lead the focus chain, so Send to Generate has the focus
        # (and Enter) when the window opens, not Previous.
        panel = self._build_panel()
        splitter = QSplitter(Qt.Orientation.Horizontal)
        splitter.setChildrenCollapsible(False)
        splitter.addWidget(self._build_picture())
        splitter.addWidget(panel)
        splitter.setStretchFactor(0, 1)
        splitter.setStretchFactor(1, 0)
        splitter.setSizes([760, 340])
        layout = QVBoxLayout(self)
        layout.addWidget(splitter, 1)

        keys: list[tuple[str, Callable[[], Any]]] = [
            ("Left", lambda: self.walk(-1)),
            ("Right", lambda: self.walk(1)),
            ("+", self.image.zoom_in),
            ("=", self.image.zoom_in),  # the + key without Shift on most keyboards
            ("Ctrl++", self.image.zoom_in),
            ("Ctrl+=", self.image.zoom_in),
            ("-", self.image.zoom_out),
            ("Ctrl+-", self.image.zoom_out),
            ("0", self.fit),
            ("Ctrl+0", self.fit),
            ("1", self.actual_pixels),
        ]
        for key, action in keys:
            shortcut = QShortcut(QKeySequence(key), self)
            shortcut.activated.connect(lambda act=action: act())
        # Escape closes: QDialog's own reject.

    def _build_picture(self) -> QWidget:
        """The picture, and under it the gallery's Previous / "3 of 12" / Next and the zoom."""
        picture = QWidget()
        column = QVBoxLayout(picture)
        column.setContentsMargins(0, 0, 0, 0)
        self.image = ZoomView()
        self.image.zoom_changed.connect(self._show_zoom)
        column.addWidget(self.image, 1)
        bar = QHBoxLayout()
        column.addLayout(bar)
        self._bar_button(
            "Previous",
            "← Previous",
            lambda: self.walk(-1),
            "The gallery's previous image (←).",
            bar,
        )
        self.position = label("", "muted")
        self.position.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.position.setMinimumWidth(self.position.fontMetrics().horizontalAdvance("8888 of 8888"))
        bar.addWidget(self.position)
        self._bar_button(
            "Next", "Next →", lambda: self.walk(1), "The gallery's next image (→).", bar
        )
        bar.addStretch(1)
        self._bar_button(
            "Zoom out", "\N{MINUS SIGN}", self.image.zoom_out, "Zoom out (-, Ctrl+wheel).", bar
        )
        self.zoom = QLabel("")
        self.zoom.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.zoom.setMinimumWidth(self.zoom.fontMetrics().horizontalAdvance("Fit · 888 %") + 12)
        self.zoom.setToolTip(
            "How large the image is shown; 100 % is one image pixel to one screen pixel."
        )
        bar.addWidget(self.zoom)
        self._bar_button("Zoom in", "+", self.image.zoom_in, "Zoom in (+, Ctrl+wheel).", bar)
        self._bar_button("Fit", "Fit", self.fit, "The whole image in the window (0).", bar)
        self._bar_button(
            "1:1",
            "1:1",
            self.actual_pixels,
            "Actual pixels, one image pixel to one screen pixel (1); drag to move around.",
            bar,
        )
        for key in ("Zoom out", "Zoom in"):
            self.buttons[key].setAccessibleName(key)
        for key in ("Zoom out", "Zoom in", "Fit", "1:1"):
            # As wide as their words: the style's least width for a dialog's buttons would
            # crowd the bar beside the panel on a 1024 px screen.
            button = self.buttons[key]
            words = button.fontMetrics().horizontalAdvance(button.text())
            button.setFixedWidth(max(words + 24, button.sizeHint().height() + 6))
        for key in ("Fit", "1:1"):
            self.buttons[key].setCheckable(True)
        return picture

    def _bar_button(
        self, key: str, text: str, action: Callable[[], Any], tip: str, bar: QHBoxLayout
    ) -> QPushButton:
        button = QPushButton(text)
        button.setToolTip(tip)
        button.setAutoDefault(False)  # Enter stays with the panel's buttons
        button.clicked.connect(lambda _checked=False, act=action: act())
        bar.addWidget(button)
        self.buttons[key] = button
        return button

    def _build_panel(self) -> QWidget:
        panel = QWidget()
        panel.setMinimumWidth(300)
        column = QVBoxLayout(panel)
        column.setContentsMargins(12, 0, 0, 0)
        self.name = label("", "section", wrap=True)
        self.name.setTextFormat(Qt.TextFormat.PlainText)
        column.addWidget(self.name)
        # What went wrong, in the theme's banner colours, above the parameters and apart
        # from them: its verdict in bold, then the NaN watch's sentence and the run's notes.
        self.diagnosis = QFrame()
        box = QVBoxLayout(self.diagnosis)
        box.setContentsMargins(10, 8, 10, 8)
        box.setSpacing(4)
        self.verdict = label("", wrap=True, selectable=True)
        self.verdict.setTextFormat(Qt.TextFormat.PlainText)
        bold = self.verdict.font()
        bold.setBold(True)
        self.verdict.setFont(bold)
        box.addWidget(self.verdict)
        self.diagnosis_text = label("", wrap=True, selectable=True)
        self.diagnosis_text.setTextFormat(Qt.TextFormat.PlainText)
        box.addWidget(self.diagnosis_text)
        column.addWidget(self.diagnosis)
        self.parameters_heading = label("Parameters", "section")
        column.addWidget(self.parameters_heading)
        self.parameters = label("", wrap=True, selectable=True)
        self.parameters.setTextFormat(Qt.TextFormat.PlainText)
        self.parameters.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        column.addWidget(plain_scroll(self.parameters), 1)
        for text, action, tip in (
            ("Send to Generate", self.send, "Put these parameters into the Generate form."),
            (
                "Use as input picture",
                self.use_as_input_picture,
                "Start the next images from this one (image-to-image) on the Generate page.",
            ),
            (
                "Why is it black?",
                self.why_black,
                "Find the image's model, check it at the image's settings, and give the fix in "
                "the terms of the tool that made it.",
            ),
            ("Open folder", self.open_folder, "Show the image in its folder."),
            ("Copy parameters", self.copy_parameters, "Copy the parameters the image holds."),
        ):
            button = QPushButton(text)
            button.setToolTip(tip)
            button.clicked.connect(lambda _checked=False, act=action: act())
            column.addWidget(button)
            self.buttons[text] = button
        return panel

    # Showing ----------------------------------------------------------------------------------

    def show_image(
        self, source: GalleryEntry | str, step: Step | None = None, place: Place | None = None
    ) -> None:
        """Show an image, fitted to the window: a gallery entry (then `step` walks the gallery
        from it, and `place` says where in it the image is), or a file, read here within
        bounds. A file that cannot be read is one sentence, never an error."""
        entry = source if isinstance(source, GalleryEntry) else read_image_file(source)
        self._step = step
        self._place = place
        self.image.set_zoom(None)
        self._show(entry)
        self._show_place()
        if self.isVisible():
            self.raise_()  # it may be behind the main window; a new window comes up anyway
        self.show()
        self.activateWindow()

    def _show(self, entry: GalleryEntry) -> None:
        self.entry = entry
        name = Path(entry.path).name if entry.path else "An image not saved"
        self.setWindowTitle(name)
        self.name.setText(name)
        pixmap, problem = load_pixmap(entry)
        self.image.set_pixmap(pixmap if not pixmap.isNull() else None, entry.problem or problem)
        self._show_diagnosis(entry)
        if entry.problem:
            self.parameters.setText(entry.problem)
        else:
            self.parameters.setText("\n".join([made_by_words(entry), *recorded_lines(entry)]))
        self.parameters_heading.setVisible(not entry.problem)
        readable = not entry.problem
        self.buttons["Send to Generate"].setEnabled(bool(entry.generate_values()))
        self.buttons["Use as input picture"].setVisible(self.use_as_input is not None)
        self.buttons["Use as input picture"].setEnabled(bool(entry.path) and readable)
        self.buttons["Why is it black?"].setEnabled(bool(entry.path) and readable)
        self.buttons["Open folder"].setEnabled(bool(entry.path))
        self.buttons["Copy parameters"].setEnabled(readable)
        self._show_zoom()

    def _show_diagnosis(self, entry: GalleryEntry) -> None:
        """The box above the parameters: what went wrong and what the run noted; hidden for
        an image with neither, and for a file that could not be read (its sentence is all)."""
        verdict = status_words(entry)
        details = [entry.message, *live_lines(entry)] if not entry.problem else []
        details = [line for line in details if line]
        shown = bool(verdict or details) and not entry.problem
        self.diagnosis.setVisible(shown)
        if not shown:
            return
        self.verdict.setText(f"{verdict}." if verdict else "")
        self.verdict.setVisible(bool(verdict))
        self.diagnosis_text.setText("\n".join(details))
        self.diagnosis_text.setVisible(bool(details))
        self.diagnosis.setProperty("level", DIAGNOSIS_LEVEL.get(entry.status, "muted"))
        style = self.diagnosis.style()
        style.unpolish(self.diagnosis)
        style.polish(self.diagnosis)

    def _show_place(self, stopped: int = 0) -> None:
        """Previous and Next, and "3 of 12", for an image of the gallery: each button off at
        its end. Without `place`, an end is known once a step past it found nothing
        (`stopped`: the way that failed)."""
        walking = self._step is not None
        for key in ("Previous", "Next"):
            self.buttons[key].setVisible(walking)
        self.position.setVisible(walking)
        place = self._place() if walking and self._place is not None else None
        if place is None:
            self.position.setText("")
            self.buttons["Previous"].setEnabled(walking and stopped != -1)
            self.buttons["Next"].setEnabled(walking and stopped != 1)
            return
        position, count = place
        self.position.setText(f"{position} of {count}")
        self.buttons["Previous"].setEnabled(position > 1)
        self.buttons["Next"].setEnabled(position < count)

    def _show_zoom(self) -> None:
        shown = not self.image.pixmap.isNull()
        fit = self.image.zoom is None
        self.zoom.setText(zoom_words(self.image.scale(), fit) if shown else "")
        for key in ("Zoom out", "Zoom in", "Fit", "1:1"):
            self.buttons[key].setEnabled(shown)
        self.buttons["Fit"].setChecked(shown and fit)
        self.buttons["1:1"].setChecked(shown and self.image.zoom == 1.0)

    def walk(self, delta: int) -> None:
        """Show the gallery's next (1) or previous (-1) image, at the zoom chosen; nothing past
        its ends."""
        if self._step is None:
            return
        entry = self._step(delta)
        if entry is not None:
            self._show(entry)
        self._show_place(stopped=0 if entry is not None else delta)

    def fit(self) -> None:
        """The whole image in the window."""
        self.image.set_zoom(None)

    def actual_pixels(self) -> None:
        """One image pixel to one screen pixel, about the view's centre."""
        self.image.set_zoom(1.0)

    # Actions ----------------------------------------------------------------------------------

    def send(self) -> None:
        self.send_to_generate(self.entry.generate_values())
        self.close()

    def use_as_input_picture(self) -> None:
        if self.use_as_input is not None and self.entry.path and self.use_as_input(self.entry.path):
            self.close()

    def why_black(self) -> None:
        if self.entry.path:
            self.explain(self.entry.path)

    def open_folder(self) -> None:
        if self.entry.path:
            self.dialogs.open_location(Path(self.entry.path).parent, "the folder")

    def copy_parameters(self) -> str:
        """The text the image holds (AUTOMATIC1111's format), else the panel's words."""
        text = self.entry.parameters or panel_text(self.entry)
        QGuiApplication.clipboard().setText(text)
        return text
