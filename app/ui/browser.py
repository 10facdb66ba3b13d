"""Browsing models and LoRAs as the other tools' users know it: what a file's metadata says
(base model, trigger words, training resolution) in words, the preview picture beside it made
small on a worker thread, search and a family filter, each model's last health verdict and
remembered fix, and the LoRA browser the Generate page's LoRA list opens.

Every file is read on a worker thread (headers, saved reports, pictures); this module imports
no reader at import time, so the window can show before any of them is needed.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QSize, Qt, Signal
from PySide6.QtGui import QIcon, QImage, QPixmap
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QHBoxLayout,
    QHeaderView,
    QLineEdit,
    QPushButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.ui import words
from app.ui.theme import current_scheme
from app.ui.widgets import label, primary_button

ALL_FAMILIES = "All families"
VAE_FAMILY = "VAEs"
OTHER_FAMILY = "Other"
THUMBNAIL_EDGE = 96  # pixels; shown smaller in lists, sharp on high-DPI screens
ENTRY = Qt.ItemDataRole.UserRole
FAMILY = Qt.ItemDataRole.UserRole + 1
SEARCHED = Qt.ItemDataRole.UserRole + 2


# Words ------------------------------------------------------------------------------------


def family_words(architecture: str | None) -> str | None:
    """The family a model or LoRA is filtered under, in the registry's titles: a family's own
    title ("Flux.1" for dev and schnell alike), or the architecture's where one family holds
    several bases whose LoRAs do not mix (Stable Diffusion 1.x and 2.x). None when unknown."""
    if not architecture:
        return None
    from app.core.families.registry import family_of_architecture

    family = family_of_architecture(architecture)
    if family is None:
        return None
    base = architecture.split("-")[0]
    bases = [name for name in family.architectures if "-" not in name]
    if len(bases) > 1 and base in family.architectures:
        return family.architectures[base]
    return family.title


def card_lines(card: Mapping[str, Any] | None) -> list[str]:
    """A file's card (`ModelCard` as a dict) as short lines: base model, trigger words,
    training resolution, a LoRA's rank and alpha; the problem reading it, if any."""
    card = card or {}
    lines: list[str] = []
    base = base_model_words(card)
    if base:
        trained_on = card.get("trained_on")
        lines.append(
            f"Base model: {base}" + (f" (trained from {trained_on})" if trained_on else "")
        )
    elif card.get("trained_on"):
        lines.append(f"Trained from {card['trained_on']}")
    if card.get("trigger_words"):
        lines.append("Trigger words: " + ", ".join(card["trigger_words"]))
    if card.get("resolution"):
        lines.append("Trained at " + resolution_words(card))
    if card.get("rank"):
        alpha = card.get("alpha")
        lines.append(
            f"Rank {card['rank']}" + (f", alpha {alpha:g}" if isinstance(alpha, float) else "")
        )
    if card.get("problem"):
        lines.append(str(card["problem"]))
    return lines


def base_model_words(card: Mapping[str, Any] | None) -> str:
    """The base model a card names, in HalfSafe's words where it maps, else as written."""
    card = card or {}
    if card.get("base_model"):
        return words.architecture_name(card["base_model"])
    return str(card.get("base_model_stated") or "")


def resolution_words(card: Mapping[str, Any] | None) -> str:
    resolution = (card or {}).get("resolution")
    if not resolution:
        return ""
    width, height = resolution
    return f"{width}×{height}"


def matches(query: str, *texts: str) -> bool:
    """Whether every word of `query` occurs in one of `texts` (case-insensitive)."""
    haystack = " ".join(texts).lower()
    return all(word in haystack for word in query.lower().split())


def search_text(name: str, card: Mapping[str, Any] | None) -> str:
    card = card or {}
    return " ".join(
        [
            name,
            card.get("title") or "",
            card.get("trained_on") or "",
            *card.get("trigger_words", ()),
        ]
    ).lower()


def card_dict(card: Any) -> dict[str, Any]:
    """A `ModelCard` as the plain dict the views keep (it crosses from a worker thread)."""
    return asdict(card)


# Health -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelHealth:
    """A model's last saved health verdict (None when never checked) and its remembered fix
    (empty settings when none), each on the device it was for."""

    verdict: str | None = None  # "healthy" | "fixable" | "broken"
    headline: str = ""
    checked_on: str = ""
    checked_at: str = ""
    fix: str = ""  # the fix in a table cell's words (`words.fix_short`)
    fix_summary: str = ""
    fix_on: str = ""
    fix_settings: dict[str, Any] = field(default_factory=dict)  # the remembered fix's own


def health_key(source: str) -> str:
    """What two spellings of a model's path have in common; a built-in demo's name as it is."""
    if not source or (os.sep not in source and "/" not in source):
        return source
    return os.path.normcase(os.path.abspath(source))


def health_by_model(
    reports: Iterable[Any],
    fixes: Iterable[Any],
    device: str | None = None,
    loaded: tuple[str, str] | None = None,
) -> dict[str, ModelHealth]:
    """Each model's health by `health_key` of its path: the newest saved report of it (`reports`
    are `SavedReport`s, newest first), one on `device` preferred, and the newest remembered
    fix (`fixes` are `StoredFix`es, newest first) for the same model, one for `device`
    preferred. `loaded` is (profile key, source) of the model the engine holds, whose fix is
    known by its key even when it was never checked."""
    from app.core.health.saved import when_words

    chosen: dict[str, Any] = {}
    for report in reports:
        key = health_key(report.source)
        held = chosen.get(key)
        if held is None or (device and held.device != device and report.device == device):
            chosen[key] = report
    keys = {report.profile_key: key for key, report in chosen.items()}
    if loaded is not None and loaded[0]:
        keys.setdefault(loaded[0], health_key(loaded[1]))
    fix_for: dict[str, Any] = {}
    for stored in fixes:
        key = keys.get(stored.profile_key)
        if key is None:
            continue
        held = fix_for.get(key)
        if held is None or (device and held.device != device and stored.device == device):
            fix_for[key] = stored
    result: dict[str, ModelHealth] = {}
    for key in chosen.keys() | fix_for.keys():
        report, stored = chosen.get(key), fix_for.get(key)
        result[key] = ModelHealth(
            verdict=report.verdict.value if report is not None else None,
            headline=report.headline if report is not None else "",
            checked_on=report.device if report is not None else "",
            checked_at=when_words(report.saved_at) if report is not None else "",
            fix=words.fix_short(stored.fix.settings, stored.fix.parts) if stored else "",
            fix_summary=stored.fix.summary if stored is not None else "",
            fix_on=stored.device if stored is not None else "",
            fix_settings=dict(stored.fix.settings) if stored is not None else {},
        )
    return result


def health_cells(health: ModelHealth | None) -> tuple[str, str, str]:
    """(Health column, Fix column, tooltip) for one model."""
    if health is None:
        return "not checked", "", "Not checked yet: load it and run a health check."
    verdict = words.first_upper(health.verdict) if health.verdict else "not checked"
    tip = []
    if health.verdict:
        tip.append(f"Last check: {health.checked_at} on {health.checked_on}. {health.headline}")
    if health.fix:
        tip.append(f"Remembered fix on {health.fix_on}: {health.fix_summary or health.fix}")
    return verdict, health.fix, "\n".join(t.strip() for t in tip)


class HealthReader(QObject):
    """Reads the saved reports and remembered fixes (plain files, no torch) on a worker thread.

    `read(object)` is emitted from the worker thread with the `health_by_model` dict, then
    `reports_read(object)` with the saved reports (a list of `SavedReport`); Qt queues both to
    the receiver's (GUI) thread."""

    read = Signal(object)
    reports_read = Signal(object)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._lock = threading.Lock()
        self._running = False
        self._again: tuple[Any, ...] | None = None

    def start(self, device: str | None, loaded: tuple[str, str] | None) -> None:
        with self._lock:
            if self._running:
                self._again = (device, loaded)
                return
            self._running = True
        threading.Thread(
            target=self._run, args=(device, loaded), name="model-health", daemon=True
        ).start()

    def _run(self, device: str | None, loaded: tuple[str, str] | None) -> None:
        while True:
            try:
                from app.core.fixing.profiles import stored_fixes
                from app.core.health.saved import saved_reports

                reports = saved_reports().reports
                found = health_by_model(reports, stored_fixes().fixes, device, loaded)
            except Exception:  # noqa: BLE001 - no verdicts shown beats a window taken down
                reports, found = [], {}
            # The window may have been closed and deleted meanwhile: then nobody is told.
            with contextlib.suppress(RuntimeError):
                self.read.emit(found)
                self.reports_read.emit(reports)
            with self._lock:
                if self._again is None:
                    self._running = False
                    return
                (device, loaded), self._again = self._again, None


# Thumbnails -------------------------------------------------------------------------------


class PreviewWorker(QObject):
    """Finds the preview picture beside each model file and makes it small, one worker thread,
    in the order asked; `forget()` drops what is still queued (a new listing replaced it).

    `ready(str model, QImage thumbnail, str problem)` is emitted from the worker thread for each
    model that has a preview file (a null image and one sentence when it is not a picture); Qt
    queues it to the receiver's thread."""

    ready = Signal(str, QImage, str)

    def __init__(self, edge: int = THUMBNAIL_EDGE, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.edge = edge
        self._jobs: queue.Queue[tuple[int, str]] = queue.Queue()
        self._generation = 0
        self._thread: threading.Thread | None = None
        self._idle = threading.Event()
        self._idle.set()

    def make(self, models: Iterable[str]) -> None:
        for model in models:
            self._idle.clear()
            self._jobs.put((self._generation, model))
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="model-previews", daemon=True)
            self._thread.start()

    def forget(self) -> None:
        self._generation += 1

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """For tests: wait until every queued model is done."""
        return self._idle.wait(timeout)

    def _run(self) -> None:
        from app.core.errors import BadFileError
        from app.core.library.metadata import preview_file, read_preview

        while True:
            try:
                generation, model = self._jobs.get(timeout=2.0)
            except queue.Empty:
                return
            try:
                if generation != self._generation:
                    continue
                picture = preview_file(model)
                if picture is None:
                    continue
                try:
                    small = read_preview(picture, self.edge)
                except BadFileError as error:
                    self.ready.emit(model, QImage(), str(error))
                    continue
                data = small.tobytes("raw", "RGBA")
                image = QImage(
                    data, small.width, small.height, 4 * small.width, QImage.Format.Format_RGBA8888
                ).copy()
                self.ready.emit(model, image, "")
            except Exception:  # noqa: BLE001 - one bad picture must not stop the others
                continue
            finally:
                if self._jobs.empty():
                    self._idle.set()


def square_icon(image: QImage, edge: int) -> QIcon:
    """A thumbnail centred on a transparent square, so that rows line up whatever its shape."""
    canvas = QPixmap(edge, edge)
    canvas.fill(Qt.GlobalColor.transparent)
    if not image.isNull():
        from PySide6.QtGui import QPainter

        scaled = image.scaled(
            edge,
            edge,
            Qt.AspectRatioMode.KeepAspectRatio,
            Qt.TransformationMode.SmoothTransformation,
        )
        painter = QPainter(canvas)
        painter.drawImage((edge - scaled.width()) // 2, (edge - scaled.height()) // 2, scaled)
        painter.end()
    return QIcon(canvas)


def fill_families(combo: QComboBox, families: Iterable[str]) -> None:
    """The family filter's choices: all, each family listed (sorted), VAEs and others last;
    the current choice kept when it is still there."""
    current = combo.currentText() or ALL_FAMILIES
    found = set(families)
    tail = [name for name in (VAE_FAMILY, OTHER_FAMILY) if name in found]
    choices = [ALL_FAMILIES, *sorted(found - {VAE_FAMILY, OTHER_FAMILY}), *tail]
    combo.blockSignals(True)
    combo.clear()
    combo.addItems(choices)
    combo.setCurrentIndex(max(0, combo.findText(current)))
    combo.blockSignals(False)


def filter_row(
    family_tip: str, changed: Callable[[], Any]
) -> tuple[QHBoxLayout, QLineEdit, QComboBox]:
    """The search box and the family filter above a list, each calling `changed` when it
    changes: (their row, the box, the filter)."""
    row = QHBoxLayout()
    search = QLineEdit()
    search.setPlaceholderText("Search names and trigger words")
    search.setClearButtonEnabled(True)
    search.textChanged.connect(lambda _text: changed())
    family = QComboBox()
    family.setToolTip(family_tip)
    family.addItem(ALL_FAMILIES)
    family.currentTextChanged.connect(lambda _text: changed())
    row.addWidget(search, 1)
    row.addWidget(family)
    return row, search, family


def apply_filter(tree: QTreeWidget, query: str, family: str) -> int:
    """Hide the rows that do not match the search and family; returns how many stay shown."""
    shown = 0
    for index in range(tree.topLevelItemCount()):
        item = tree.topLevelItem(index)
        if item is None:
            continue
        keep = (family in ("", ALL_FAMILIES) or item.data(0, FAMILY) == family) and matches(
            query, str(item.data(0, SEARCHED) or "")
        )
        item.setHidden(not keep)
        shown += keep
    return shown


# The LoRA browser -------------------------------------------------------------------------


class LoraScanner(QObject):
    """Lists the LoRAs in the Lora folders on a worker thread (headers only).

    `finished(list[dict], str)` is emitted from the worker thread with one dict per LoRA
    (path, size_bytes, card) and a sentence when the listing failed; Qt queues it."""

    finished = Signal(list, str)

    def scan(self, model_folders: list[str] | None) -> None:
        threading.Thread(
            target=self._run, args=(model_folders,), name="lora-scan", daemon=True
        ).start()

    def _run(self, model_folders: list[str] | None) -> None:
        found: list[dict[str, Any]] = []
        problem = ""
        try:
            from app.core.lora.library import list_loras

            for lora in list_loras(model_folders):
                found.append(
                    {"path": lora.path, "size_bytes": lora.size_bytes, "card": card_dict(lora.card)}
                )
        except Exception as error:  # noqa: BLE001 - a failed listing is one sentence
            problem = f"The Lora folders could not be listed ({type(error).__name__}: {error})."
        with contextlib.suppress(RuntimeError):  # its page closed and deleted meanwhile
            self.finished.emit(found, problem)


LORA_COLUMNS = ("LoRA", "Base model", "Trigger words", "Trained at", "Size")


class LoraBrowser(QDialog):
    """The LoRAs in the Lora folders beside the model folders, with previews, base model,
    trigger words and training resolution, searchable and filtered by family. `chosen(str path,
    list trigger_words)` is emitted when the user adds one; the dialog then closes."""

    chosen = Signal(str, list)

    def __init__(
        self,
        model_folders: list[str] | None = None,
        family: str | None = None,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("Browse LoRAs")
        self.resize(900, 560)
        self.model_folders = model_folders
        self.wanted_family = family
        self.loras: list[dict[str, Any]] = []
        self.scanner = LoraScanner(self)
        self.scanner.finished.connect(self._listed)
        self.previews = PreviewWorker(parent=self)
        self.previews.ready.connect(self._preview_ready)

        column = QVBoxLayout(self)
        column.addWidget(
            label(
                "LoRAs found in the Lora folders beside your model folders (models/Lora, "
                "models/loras, models/LyCORIS and the like). Trigger words come from the file's "
                "training metadata.",
                "muted",
                wrap=True,
            )
        )
        filters, self.search, self.family = filter_row(
            "Show only LoRAs trained for one base model family.", self._filter
        )
        column.addLayout(filters)

        self.tree = QTreeWidget()
        self.tree.setHeaderLabels(list(LORA_COLUMNS))
        self.tree.setRootIsDecorated(False)
        self.tree.setAlternatingRowColors(True)
        self.tree.setUniformRowHeights(True)
        self.tree.setIconSize(QSize(40, 40))
        self.tree.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        header = self.tree.header()
        header.setStretchLastSection(False)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(2, QHeaderView.ResizeMode.Interactive)
        header.resizeSection(2, 220)
        for index in (3, 4):
            header.setSectionResizeMode(index, QHeaderView.ResizeMode.ResizeToContents)
        self.tree.currentItemChanged.connect(lambda _c, _p: self._selection_changed())
        self.tree.itemDoubleClicked.connect(lambda _item, _col: self.add_current())
        column.addWidget(self.tree, 1)
        self.details = label("", wrap=True, selectable=True)
        column.addWidget(self.details)

        buttons = QHBoxLayout()
        self.status = label("Looking for LoRAs…", "muted", wrap=True)
        self.add_button = primary_button("Add to the list")
        self.add_button.setEnabled(False)
        self.add_button.clicked.connect(self.add_current)
        close = QPushButton("Close")
        close.clicked.connect(self.reject)
        buttons.addWidget(self.status, 1)
        buttons.addWidget(self.add_button)
        buttons.addWidget(close)
        column.addLayout(buttons)
        self.scanner.scan(model_folders)

    def _listed(self, loras: list[dict[str, Any]], problem: str) -> None:
        self.loras = loras
        self.tree.clear()
        self.previews.forget()
        families = []
        for lora in loras:
            card = lora.get("card") or {}
            path = Path(lora["path"])
            item = QTreeWidgetItem(
                [
                    card.get("title") or path.stem,
                    "damaged" if card.get("problem") else base_model_words(card) or "unknown",
                    ", ".join(card.get("trigger_words") or ()),
                    resolution_words(card),
                    words.file_size(lora.get("size_bytes")),
                ]
            )
            family = family_words(card.get("base_model")) or OTHER_FAMILY
            families.append(family)
            item.setData(0, ENTRY, lora)
            item.setData(0, FAMILY, family)
            item.setData(0, SEARCHED, search_text(path.name, card))
            tip = "\n".join([str(path), *card_lines(card)])
            for index in range(len(LORA_COLUMNS)):
                item.setToolTip(index, tip)
                if card.get("problem"):
                    item.setForeground(index, current_scheme().colour("invalid"))
            item.setIcon(0, square_icon(QImage(), 40))
            self.tree.addTopLevelItem(item)
        fill_families(self.family, families)
        if self.wanted_family and self.family.findText(self.wanted_family) >= 0:
            self.family.setCurrentText(self.wanted_family)
        self.wanted_family = None
        shown = self._filter()
        if problem:
            self.status.setText(problem)
        elif not loras:
            self.status.setText(
                "No LoRAs found in the Lora folders beside your model folders; add your "
                "models folder in Settings, or use Add LoRA… to pick a file."
            )
        else:
            self.status.setText(
                f"{len(loras)} LoRA{'s' if len(loras) != 1 else ''} found"
                + (f", {shown} shown." if shown != len(loras) else ".")
            )
        self.previews.make(lora["path"] for lora in loras)

    def _filter(self) -> int:
        shown = apply_filter(self.tree, self.search.text(), self.family.currentText())
        current = self.tree.currentItem()
        if current is None or current.isHidden():
            items = (self.tree.topLevelItem(i) for i in range(self.tree.topLevelItemCount()))
            first = next((item for item in items if item is not None and not item.isHidden()), None)
            if first is not None:
                self.tree.setCurrentItem(first)
            elif current is not None:
                self.tree.clearSelection()
        self._selection_changed()
        return shown

    def _item_for(self, path: str) -> QTreeWidgetItem | None:
        for index in range(self.tree.topLevelItemCount()):
            item = self.tree.topLevelItem(index)
            if item is not None and (item.data(0, ENTRY) or {}).get("path") == path:
                return item
        return None

    def _preview_ready(self, model: str, image: QImage, problem: str) -> None:
        item = self._item_for(model)
        if item is None:
            return
        if problem:
            item.setToolTip(0, item.toolTip(0) + "\n" + problem)
        else:
            item.setIcon(0, square_icon(image, 40))

    def current_lora(self) -> dict[str, Any] | None:
        item = self.tree.currentItem()
        if item is None or item.isHidden():
            return None
        return item.data(0, ENTRY)

    def _selection_changed(self) -> None:
        lora = self.current_lora()
        card = (lora or {}).get("card") or {}
        self.add_button.setEnabled(lora is not None and not card.get("problem"))
        if lora is None:
            self.details.setText("")
        elif card.get("problem"):
            self.details.setText(str(card["problem"]))  # it names the file
        else:
            lines = card_lines(card) or ["its file says nothing about how it was trained"]
            self.details.setText(Path(lora["path"]).name + ": " + "; ".join(lines) + ".")

    def add_current(self) -> None:
        """Add the highlighted LoRA to the list and close; a damaged file is not added (its
        sentence is shown instead)."""
        lora = self.current_lora()
        if lora is None or (lora.get("card") or {}).get("problem"):
            return
        self.chosen.emit(lora["path"], list((lora.get("card") or {}).get("trigger_words") or ()))
        self.accept()
