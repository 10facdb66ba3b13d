"""A generated image as the window shows it: the viewer that scales it, the caption box under
it, its thumbnail's stand-in, and what a gallery entry says (where it went NaN, its parameters
as AUTOMATIC1111 writes them). An entry is a generated image's record as the gallery keeps it
(the engine's `ImageResult` fields, its request, the model's name), or as read back from a PNG."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QGuiApplication, QIcon, QPainter, QPalette, QPixmap
from PySide6.QtWidgets import QScrollArea, QSizePolicy, QWidget

from app.core import infotext
from app.ui import words

THUMBNAIL = 112


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
        self.setMinimumSize(260, 260)
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


def unsaved(entry: dict[str, Any]) -> bool:
    """The image exists only as PNG bytes in memory: every folder refused it."""
    return bool(entry.get("png")) and not entry.get("path")


def entry_pixmap(entry: dict[str, Any]) -> QPixmap:
    """The image from its file, or from memory when it could not be saved."""
    if unsaved(entry):
        pixmap = QPixmap()
        pixmap.loadFromData(entry["png"], "PNG")
        return pixmap
    return QPixmap(entry.get("path") or "")


def where_words(entry: dict[str, Any]) -> str:
    parts = []
    if entry.get("component"):
        parts.append(f"in {words.component_phrase(entry['component'])}")
    if entry.get("step") is not None:
        parts.append(f"at step {entry['step']}")
    return (" " + " ".join(parts)) if parts else ""


def parameter_text(entry: dict[str, Any]) -> str:
    """The parameters as AUTOMATIC1111 writes them, so they read familiar."""
    request = entry.get("request") or {}
    lines = []
    if request.get("prompt"):
        lines.append(request["prompt"])
    if request.get("negative_prompt"):
        lines.append(f"Negative prompt: {request['negative_prompt']}")
    details = [
        (infotext.STEPS, request.get("steps")),
        (infotext.SAMPLER, words.choice_name(str(request.get("scheduler")))),
        (infotext.CFG_SCALE, request.get("cfg")),
        (infotext.SEED, entry.get("seed")),
        (infotext.SIZE, (request.get("width"), request.get("height"))),
    ]
    if entry.get("model"):
        details.append((infotext.MODEL, entry["model"]))
    lines.append(", ".join(f"{key.name}: {key.write(value)}" for key, value in details))
    if entry.get("settings"):
        lines.append("Precision: " + words.precision_summary(entry["settings"]))
    if entry.get("path"):
        lines.append(f"Saved to {Path(entry['path'])}")
    lines.extend(f"Note: {warning}" for warning in entry.get("warnings") or [])
    return "\n".join(lines)
