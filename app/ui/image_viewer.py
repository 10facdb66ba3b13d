"""The image viewer: one image large, beside the parameters it records (HalfSafe's, or another
tool's: AUTOMATIC1111/Forge infotext, ComfyUI's graphs, InvokeAI's metadata, read through the
readers `halfsafe explain` uses), with what to do next: send them to Generate, ask why the image
is black, start a new image from it, open its folder, copy them. Left and right walk the
gallery; Escape closes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication, QImageReader, QKeySequence, QPixmap, QShortcut
from PySide6.QtWidgets import (
    QDialog,
    QPushButton,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app.ui.image_entry import (
    GalleryEntry,
    ImageView,
    made_by_words,
    parameter_text,
    read_image_file,
    status_words,
)
from app.ui.widgets import label, plain_scroll

# step(+1 or -1): the gallery's next or previous image, made current there; None past its ends.
Step = Callable[[int], GalleryEntry | None]


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
    """The parameters panel: which tool made the image, what went wrong, its parameters; or
    the one sentence that says why the file could not be read."""
    if entry.problem:
        return entry.problem
    head = [made_by_words(entry)]
    diagnosis = status_words(entry)
    if diagnosis:
        head.append(f"{diagnosis}.")
    if entry.message:
        head.append(entry.message)
    return "\n".join(head) + "\n\n" + parameter_text(entry)


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
        self.setModal(False)
        self.resize(1100, 760)

        splitter = QSplitter(Qt.Orientation.Horizontal)
        splitter.setChildrenCollapsible(False)
        self.image = ImageView()
        splitter.addWidget(self.image)
        splitter.addWidget(self._build_panel())
        splitter.setStretchFactor(0, 1)
        splitter.setStretchFactor(1, 0)
        splitter.setSizes([760, 340])
        layout = QVBoxLayout(self)
        layout.addWidget(splitter, 1)

        for key, delta in ((Qt.Key.Key_Left, -1), (Qt.Key.Key_Right, 1)):
            shortcut = QShortcut(QKeySequence(key), self)
            shortcut.activated.connect(lambda d=delta: self.walk(d))
        # Escape closes: QDialog's own reject.

    def _build_panel(self) -> QWidget:
        panel = QWidget()
        panel.setMinimumWidth(300)
        column = QVBoxLayout(panel)
        column.setContentsMargins(12, 0, 0, 0)
        self.name = label("", "section", wrap=True)
        self.name.setTextFormat(Qt.TextFormat.PlainText)
        column.addWidget(self.name)
        self.parameters = label("", wrap=True, selectable=True)
        self.parameters.setTextFormat(Qt.TextFormat.PlainText)
        self.parameters.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        column.addWidget(plain_scroll(self.parameters), 1)
        self.buttons: dict[str, QPushButton] = {}
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
        self.position = label("", "muted", wrap=True)
        column.addWidget(self.position)
        return panel

    # Showing ----------------------------------------------------------------------------------

    def show_image(self, source: GalleryEntry | str, step: Step | None = None) -> None:
        """Show an image: a gallery entry (then `step` walks the gallery from it), or a file,
        read here within bounds. A file that cannot be read is one sentence, never an error."""
        entry = source if isinstance(source, GalleryEntry) else read_image_file(source)
        self._step = step
        self._show(entry)
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
        self.parameters.setText(panel_text(entry))
        readable = not entry.problem
        self.buttons["Send to Generate"].setEnabled(bool(entry.generate_values()))
        self.buttons["Use as input picture"].setVisible(self.use_as_input is not None)
        self.buttons["Use as input picture"].setEnabled(bool(entry.path) and readable)
        self.buttons["Why is it black?"].setEnabled(bool(entry.path) and readable)
        self.buttons["Open folder"].setEnabled(bool(entry.path))
        self.buttons["Copy parameters"].setEnabled(readable)
        self.position.setText("← and → show the gallery's other images." if self._step else "")

    def walk(self, delta: int) -> None:
        """Show the gallery's next (1) or previous (-1) image; nothing past its ends."""
        if self._step is None:
            return
        entry = self._step(delta)
        if entry is not None:
            self._show(entry)

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
