"""The Models page's list of models: one row per built-in demo and per model file found or
opened, with its type, stored dtype, size, last health verdict and remembered fix, its preview
as the row's icon, the loaded model in bold, and the rows the search and family filter leave."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QIcon, QImage
from PySide6.QtWidgets import QHeaderView, QTreeWidget, QTreeWidgetItem, QWidget

from app.core.demo import DEMO_MODELS
from app.core.models.summary import ModelSummary
from app.ui import words
from app.ui.browser import (
    ALL_FAMILIES,
    ENTRY,
    FAMILY,
    OTHER_FAMILY,
    SEARCHED,
    VAE_FAMILY,
    ModelHealth,
    apply_filter,
    card_lines,
    family_words,
    health_cells,
    health_key,
    search_text,
    square_icon,
)
from app.ui.library_scan import library_words
from app.ui.model_words import DEMO_TIPS, DEMO_TITLES
from app.ui.theme import current_scheme

# The library's columns; the name takes the spare width.
COLUMNS = ("Model", "Type", "Stored as", "Size", "Health", "Remembered fix")
TYPE, STORED, SIZE, HEALTH, FIX = range(1, len(COLUMNS))
ICON_EDGE = 32


class ModelList(QTreeWidget):
    """The rows of the model library; each row holds its library entry (a dict) as `ENTRY`."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setHeaderLabels(list(COLUMNS))
        self.setRootIsDecorated(False)
        self.setAlternatingRowColors(True)
        self.setUniformRowHeights(True)
        # A long (bold, when loaded) name keeps its start and its extension in view.
        self.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        header = self.header()
        header.setStretchLastSection(False)  # the name takes the spare width, not the size
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for column in (TYPE, HEALTH, STORED, SIZE):
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)
        # A fix in words can be long: its column keeps a width and the cell's tooltip says all.
        header.setSectionResizeMode(FIX, QHeaderView.ResizeMode.Interactive)
        header.resizeSection(FIX, 170)
        self.header().setMinimumSectionSize(40)
        self.setMinimumHeight(120)

    def rows(self) -> list[QTreeWidgetItem]:
        items = (self.topLevelItem(index) for index in range(self.topLevelItemCount()))
        return [item for item in items if item is not None]

    def fill(
        self, entries: list[dict[str, Any]], last: str, with_families: bool
    ) -> tuple[QTreeWidgetItem | None, list[str]]:
        """List the built-in demos, then `entries`; returns the row of the model used `last`
        (else the first demo) and each row's family. The demos get a family only
        `with_families` (the family registry is read once the folders are listed, not to show
        the window)."""
        self.clear()
        selected = None
        families: list[str] = []
        for source, described in DEMO_MODELS.items():
            title = DEMO_TITLES.get(source, described)
            demo = QTreeWidgetItem([title, "SD 1.x (tiny)", "fp32", "built in", "", ""])
            demo.setData(0, ENTRY, {"path": source, "error": None})
            if with_families:
                demo.setData(0, FAMILY, family_words("sd1") or OTHER_FAMILY)
                families.append(demo.data(0, FAMILY))
            demo.setData(0, SEARCHED, search_text(title, None))
            demo.setToolTip(0, DEMO_TIPS[source])
            self.addTopLevelItem(demo)
            if selected is None or source == last:
                selected = demo
        for entry in entries:
            path = Path(entry["path"])
            kind, tip, colour = library_words(entry)
            card = entry.get("card")
            lines = card_lines(card)
            if lines:
                tip += "\n" + "\n".join(lines)
            item = QTreeWidgetItem(
                [
                    path.name,
                    kind,
                    entry.get("stored_dtype") or "",
                    words.file_size(entry.get("size_bytes")),
                    "",
                    "",
                ]
            )
            item.setData(0, ENTRY, entry)
            family = _family_of(entry)
            families.append(family)
            item.setData(0, FAMILY, family)
            item.setData(0, SEARCHED, search_text(path.name, card))
            for column in range(len(COLUMNS)):
                item.setToolTip(column, tip)
                if colour:
                    item.setForeground(column, current_scheme().colour(colour))
            self.addTopLevelItem(item)
            if str(path) == last:
                selected = item
        return selected, families

    def show_matching(self, query: str, family: str) -> None:
        """Show the rows that match the search `query` and the `family` filter; a highlighted
        row that is hidden gives way to the first one shown (Load never loads a row out of
        sight)."""
        shown = apply_filter(self, query, family)
        total = self.topLevelItemCount()
        current = self.currentItem()
        if current is not None and current.isHidden():
            items = (self.topLevelItem(i) for i in range(total))
            first = next((item for item in items if item is not None and not item.isHidden()), None)
            if first is not None:
                self.setCurrentItem(first)
        self.setToolTip(
            f"{shown} of {total} shown: clear the search or choose {ALL_FAMILIES} to see all."
            if shown < total
            else ""
        )

    def show_health(self, health: Mapping[str, ModelHealth]) -> None:
        """Each model row's last verdict and remembered fix, as saved (`health`, by
        `health_key`)."""
        for item in self.rows():
            entry = item.data(0, ENTRY) or {}
            if entry.get("error") or entry.get("role") == "vae":
                continue
            verdict, fix, tip = health_cells(health.get(health_key(entry.get("path", ""))))
            item.setText(HEALTH, verdict)
            item.setText(FIX, fix)
            item.setToolTip(HEALTH, tip)
            item.setToolTip(FIX, tip)
            if verdict == "Broken":
                item.setForeground(HEALTH, current_scheme().colour("invalid"))

    def show_thumbnails(self, thumbnails: Mapping[str, QImage]) -> None:
        """Each row's preview (`thumbnails`, by path) as its icon; once any row has one, the
        others get an empty square so that the names line up."""
        if not thumbnails:
            return
        self.setIconSize(QSize(ICON_EDGE, ICON_EDGE))
        blank: QIcon | None = None
        for item in self.rows():
            entry = item.data(0, ENTRY) or {}
            image = thumbnails.get(str(entry.get("path", "")))
            if image is not None:
                item.setIcon(0, square_icon(image, ICON_EDGE))
            else:
                blank = blank or square_icon(QImage(), ICON_EDGE)
                item.setIcon(0, blank)

    def show_found(self, source: str, model: ModelSummary) -> None:
        """What the load of `model` found out fills the row of a model opened from a file."""
        item = self.item_for(source)
        if item is not None and (item.data(0, ENTRY) or {}).get("opened"):
            item.setText(TYPE, words.architecture_name(model.architecture))
            item.setText(STORED, model.stored_dtype)

    def mark_loaded(self, source: str | None) -> None:
        """Bold for the model the engine holds (`source`), highlighted and scrolled to."""
        for item in self.rows():
            entry = item.data(0, ENTRY) or {}
            loaded = source is not None and entry.get("path") == source
            font = item.font(0)
            font.setBold(loaded)
            for column in range(self.columnCount()):
                item.setFont(column, font)
            if loaded:
                self.setCurrentItem(item)
                self.scrollToItem(item)

    def item_for(self, source: str) -> QTreeWidgetItem | None:
        """The row of the model at `source`, if listed."""
        for item in self.rows():
            if (item.data(0, ENTRY) or {}).get("path") == source:
                return item
        return None


def _family_of(entry: dict[str, Any]) -> str:
    """The family filter's word for one library entry."""
    if entry.get("role") == "vae":
        return VAE_FAMILY
    if entry.get("error"):
        return OTHER_FAMILY
    return family_words(entry.get("architecture")) or OTHER_FAMILY
