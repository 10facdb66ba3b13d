"""The Generate page's results: the banner, the image (or the live preview, or what is being
made), its caption in a box of its own, the Open folder and Save as buttons, and the gallery
below, a strip of thumbnails newest first."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QIcon, QPixmap
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QListWidget,
    QPushButton,
    QSizePolicy,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app.ui.gallery import Gallery
from app.ui.image_entry import (
    THUMBNAIL,
    CaptionBox,
    GalleryEntry,
    ImageView,
    entry_pixmap,
    parameter_text,
    placeholder_icon,
)
from app.ui.widgets import Banner, label, plain_scroll

# What the image area says while there is no image to show.
EMPTY_WORDS = "Your images appear here, with a live preview while they are made."
# What the image area says when the engine stopped before the image was finished.
LOST_WORDS = (
    "The engine stopped before this image was finished, so there is no image to show. Your "
    "earlier images are in the gallery below."
)


class ResultsPane(QSplitter):
    """The image above, the gallery below. The gallery's `Gallery` takes the page's
    `output_folder()`, `show_entry(entry)`, `use_parameters(values)` and dialogs; the page
    connects the buttons and the gallery's current item to what they do."""

    def __init__(
        self,
        output_folder: Callable[[], Path],
        show_entry: Callable[[GalleryEntry], None],
        use_parameters: Callable[[dict[str, Any]], None],
        dialogs: Any,
    ) -> None:
        super().__init__(Qt.Orientation.Vertical)
        self.setChildrenCollapsible(False)
        viewer = QWidget()
        column = QVBoxLayout(viewer)
        column.setContentsMargins(12, 0, 0, 0)
        self.banner = Banner()
        column.addWidget(self.banner)
        self.image = ImageView()
        self.image.set_pixmap(None, EMPTY_WORDS)
        column.addWidget(self.image, 1)
        self.parameters = label("", "muted", wrap=True, selectable=True)
        self.parameters.setTextFormat(Qt.TextFormat.PlainText)
        self.parameters.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        # The caption scrolls inside a box of its own: long parameters never run into the image.
        caption = CaptionBox()
        plain_scroll(self.parameters, caption)
        caption.setMinimumHeight(48)
        caption.setMaximumHeight(self.parameters.fontMetrics().lineSpacing() * 7 + 8)
        caption.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.caption = caption
        column.addWidget(caption)
        actions = QHBoxLayout()
        self.open_folder_button = QPushButton("Open folder")
        self.open_folder_button.setEnabled(False)
        actions.addWidget(self.open_folder_button)
        self.save_as_button = QPushButton("Save as…")
        self.save_as_button.setToolTip("Save this image, which is only in memory, to a file.")
        self.save_as_button.setVisible(False)
        actions.addWidget(self.save_as_button)
        actions.addStretch(1)
        column.addLayout(actions)
        self.addWidget(viewer)

        gallery_box = QFrame()
        gallery_layout = QVBoxLayout(gallery_box)
        gallery_layout.setContentsMargins(12, 4, 0, 0)
        gallery_layout.addWidget(label("Gallery", "muted"))
        self.gallery = QListWidget()
        self.gallery.setViewMode(QListWidget.ViewMode.IconMode)
        self.gallery.setFlow(QListWidget.Flow.LeftToRight)
        self.gallery.setWrapping(False)
        self.gallery.setMovement(QListWidget.Movement.Static)
        self.gallery.setIconSize(QSize(THUMBNAIL, THUMBNAIL))
        self.gallery.setGridSize(QSize(THUMBNAIL + 24, THUMBNAIL + 36))
        self.gallery.setMinimumHeight(THUMBNAIL + 48)
        self.gallery.setMaximumHeight(THUMBNAIL + 64)
        gallery_layout.addWidget(self.gallery)
        self.gallery_view = Gallery(
            self.gallery,
            THUMBNAIL,
            output_folder=output_folder,
            show_entry=show_entry,
            use_parameters=use_parameters,
            dialogs=dialogs,
            placeholder=placeholder_icon,
        )
        self.addWidget(gallery_box)
        self.setStretchFactor(0, 1)
        self.setStretchFactor(1, 0)

    def show_image(self, entry: GalleryEntry) -> None:
        """Show `entry`'s image (or why it cannot be shown) with its caption; Open folder is
        for a saved image, Save as for one only in memory. The banner is the page's to set."""
        pixmap = entry_pixmap(entry)
        self.image.set_pixmap(
            pixmap if not pixmap.isNull() else None,
            entry.problem or f"The image file is missing: {entry.path}",
        )
        self.parameters.setText(parameter_text(entry))
        self.caption.text_changed()
        self.open_folder_button.setEnabled(bool(entry.path))
        self.save_as_button.setVisible(entry.unsaved)

    def show_preview(self, pixmap: QPixmap, caption: str) -> None:
        """A live preview of the image being made, with `caption`; the banner spoke of the image
        the preview replaces."""
        self.image.set_pixmap(pixmap)
        self.banner.dismiss()
        self.parameters.setText(caption)
        self.caption.text_changed()

    def show_making(self, caption: str) -> None:
        """An image is being made and has no preview yet: the image shown gives way to words
        saying so, with `caption`, and its banner goes."""
        self.banner.dismiss()
        self.image.set_pixmap(None, "Making the image: a preview appears after a few steps.")
        self.parameters.setText(caption)
        self.caption.text_changed()

    def show_lost(self, caption: str) -> None:
        """The image being made was lost with the engine: words saying so where it would have
        been, with `caption` (the last finished image stays in the gallery, never under words
        about another one)."""
        self.image.set_pixmap(None, LOST_WORDS)
        self.parameters.setText(caption)
        self.caption.text_changed()

    def show_empty(self) -> None:
        """No image to show: the empty page's words and no caption."""
        self.image.set_pixmap(None, EMPTY_WORDS)
        self.parameters.setText("")
        self.caption.text_changed()


def thumbnail(entry: GalleryEntry) -> QIcon:
    """The gallery's icon for `entry`: its image scaled down, or a grey square without one."""
    pixmap = entry_pixmap(entry)
    if pixmap.isNull():
        pixmap = QPixmap(THUMBNAIL, THUMBNAIL)
        pixmap.fill(Qt.GlobalColor.darkGray)
    else:
        pixmap = pixmap.scaled(
            THUMBNAIL,
            THUMBNAIL,
            Qt.AspectRatioMode.KeepAspectRatio,
            Qt.TransformationMode.SmoothTransformation,
        )
    return QIcon(pixmap)
