"""The image the Generate page shows, and what is done with it: which image it is (a finished
job's first, the one picked in the gallery, the last one back after a job that did not end),
its banner, Save as for an image only in memory, and Open folder."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from PySide6.QtWidgets import QFileDialog, QListWidgetItem, QWidget

from app.core.files import write_atomic
from app.ui import folders
from app.ui.dialogs import Dialogs
from app.ui.image_entry import GalleryEntry
from app.ui.results_pane import ResultsPane, thumbnail


class ShownImage:
    """The results pane's image and its gallery, as the page drives them. `show_banner(entry)`
    says an image's banner (`FixOffers.show`); `page` is the parent of the Save as dialog.
    `current_entry` is the image shown (None: none yet), `last_seed` its seed ("Reuse last").
    GUI thread only."""

    def __init__(
        self,
        page: QWidget,
        results: ResultsPane,
        dialogs: Dialogs,
        show_banner: Callable[[GalleryEntry], None],
    ) -> None:
        self.page = page
        self.results = results
        self.dialogs = dialogs
        self._show_banner = show_banner
        self.current_entry: GalleryEntry | None = None
        self.last_seed: int | None = None

    def show(self, entry: GalleryEntry) -> None:
        self.current_entry = entry
        self.results.show_image(entry)
        self.last_seed = entry.seed
        self._show_banner(entry)

    def show_last(self) -> None:
        """The image shown before the job that did not finish, or the empty page's words."""
        if self.current_entry is not None:
            self.show(self.current_entry)
        else:
            self.results.show_empty()

    def add(self, entries: list[GalleryEntry]) -> None:
        """Put a finished job's images into the gallery, and show the first one."""
        first_item = None
        for entry in entries:
            item = self.results.gallery_view.add(entry, thumbnail(entry))
            first_item = first_item or item
        if first_item is not None:
            self.results.gallery.setCurrentItem(first_item)

    def gallery_selected(self, current: QListWidgetItem | None, _previous: Any) -> None:
        if current is not None:
            self.show(self.results.gallery_view.full_entry(current))

    def save_as(self, path: str | None = None) -> Path | None:
        """Write the shown in-memory image (one no folder could take) to `path`, or to a file
        the user picks. Returns where it went; on failure the error dialog says why."""
        entry = self.current_entry
        if entry is None or not entry.unsaved:
            return None
        if path is None:
            suggested = f"{entry.seed if entry.seed is not None else 'image'}.png"
            path, _filter = QFileDialog.getSaveFileName(
                self.page,
                "Save image",
                str(Path(folders.pictures()) / suggested),
                "PNG images (*.png)",
            )
            if not path:
                return None
        try:
            saved = write_atomic(Path(path), entry.png or b"", shared=True)
        except (OSError, ValueError) as error:
            reason = getattr(error, "strerror", None) or str(error)
            self.dialogs.error(f"The image could not be saved to {path} ({reason}).")
            return None
        entry = replace(entry, path=str(saved), png=None)
        item = self.results.gallery.currentItem()
        if item is not None:
            self.results.gallery_view.set_entry(item, entry)
        self.show(entry)
        return saved

    def open_folder(self) -> None:
        if self.current_entry is not None and self.current_entry.path:
            folder = os.path.dirname(self.current_entry.path)
            self.dialogs.open_location(folder, "the folder")
