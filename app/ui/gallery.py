"""The gallery that lasts: the output folder's images, newest first, with thumbnails made on a
worker thread only for what scrolls into view and cached on disk; each item holds its
`GalleryEntry`, whose record labels it (read on the worker with the thumbnail). Each image file
is one item, whether a job's result or the folder's listing comes first. Double-click or Enter
views an image large; a context menu views, opens or reveals it, copies or reuses its
parameters, shows its diagnosis, and moves it to the trash."""

from __future__ import annotations

import contextlib
import hashlib
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from PySide6.QtCore import QEvent, QFile, QObject, QPoint, QRect, QStandardPaths, Qt, Signal
from PySide6.QtGui import QAction, QGuiApplication, QIcon, QImage, QImageReader, QPixmap
from PySide6.QtWidgets import QListWidget, QListWidgetItem, QMenu

from app.core import paths
from app.ui.image_entry import GalleryEntry, item_text, parameter_text, read_image_file, tooltip

LISTED_AT_MOST = 2000  # the newest; an output folder of years stays quick to open
ENTRY = Qt.ItemDataRole.UserRole  # the item's GalleryEntry
REQUESTED = Qt.ItemDataRole.UserRole + 1

# view_image(entry, step, place): shows an image large; step(+1/-1) walks the gallery from
# it; place() says where it is ("3 of 12").
ViewImage = Callable[
    [GalleryEntry, Callable[[int], GalleryEntry | None], Callable[[], tuple[int, int] | None]],
    Any,
]


def list_images(folder: Path, limit: int = LISTED_AT_MOST) -> list[tuple[str, int, int]]:
    """(path, mtime in ns, size) of the PNG files in `folder`, newest first; [] when the folder
    is missing or unreadable. Reads the folder only, never the files."""
    found = []
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                if not entry.name.lower().endswith(".png") or entry.name.startswith("."):
                    continue
                try:
                    if not entry.is_file():
                        continue
                    info = entry.stat()
                except OSError:
                    continue
                found.append((entry.path, info.st_mtime_ns, info.st_size))
    except OSError:
        return []
    found.sort(key=lambda item: (item[1], item[0]), reverse=True)
    return found[:limit]


def thumbnail_cache_path(path: str, mtime_ns: int, size: int) -> Path:
    """Where the thumbnail of this version of the file is kept: a changed file gets a new one.
    Inode and change time count too (as in `checkpoint.file_stamp`): an image copied over
    another with the same size and its mtime restored is not shown with the old one's face."""
    try:
        info = os.stat(path)
        version = f"{info.st_dev}|{info.st_ino}|{info.st_ctime_ns}"
    except OSError:
        version = ""  # unreadable: the thumbnail cannot be made either
    key = hashlib.sha1(f"{path}|{mtime_ns}|{size}|{version}".encode()).hexdigest()
    return paths.cache_dir() / "thumbnails" / f"{key}.png"


def make_thumbnail(path: str, mtime_ns: int, size: int, edge: int) -> QImage:
    """The thumbnail from the cache, or made from the file and cached. A null QImage when the
    file cannot be read. Safe on a worker thread (QImage, no QPixmap)."""
    cached = thumbnail_cache_path(path, mtime_ns, size)
    if cached.is_file():
        image = QImage(str(cached))
        if not image.isNull():
            return image
    reader = QImageReader(path)
    reader.setAutoTransform(True)
    original = reader.size()
    if original.isValid() and (original.width() > edge or original.height() > edge):
        reader.setScaledSize(original.scaled(edge, edge, Qt.AspectRatioMode.KeepAspectRatio))
    image = reader.read()
    if image.isNull():
        return image
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        image.save(str(cached))  # PNG, from the .png name
    except OSError:
        pass  # no cache is only slower
    return image


def same_file(path: str) -> str:
    """What two spellings of one image file's path have in common (the gallery's key): made
    absolute and normalised, with the platform's case rule. "" for an image only in memory."""
    return os.path.normcase(os.path.abspath(path)) if path else ""


class ThumbnailWorker(QObject):
    """One worker thread that lists folders, makes thumbnails and reads images' records, in the
    order asked.

    Signals are emitted from the worker thread; Qt queues them to the GUI thread:
    listed(str folder, list[(path, mtime_ns, size)]), thumbnail(str path, QImage) and
    recorded(str path, GalleryEntry).
    """

    listed = Signal(str, list)
    thumbnail = Signal(str, QImage)
    recorded = Signal(str, object)

    def __init__(self, edge: int, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.edge = edge
        self._jobs: queue.Queue[tuple[str, tuple[Any, ...]]] = queue.Queue()
        self._thread: threading.Thread | None = None

    def list_folder(self, folder: str) -> None:
        self._put("list", (folder,))

    def make(self, path: str, mtime_ns: int, size: int, read_record: bool = False) -> None:
        """Make the file's thumbnail, and with `read_record` read its record after it."""
        self._put("thumbnail", (path, mtime_ns, size, read_record))

    def _put(self, kind: str, args: tuple[Any, ...]) -> None:
        self._jobs.put((kind, args))
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="gallery", daemon=True)
            self._thread.start()

    def wait_idle(self, timeout: float = 10.0) -> None:
        """For tests: wait until every queued job is done."""
        done = threading.Event()
        self._put("mark", (done,))
        done.wait(timeout)

    def _run(self) -> None:
        while True:
            try:
                kind, args = self._jobs.get(timeout=2.0)
            except queue.Empty:
                return
            try:
                if kind == "list":
                    self.listed.emit(args[0], list_images(Path(args[0])))
                elif kind == "thumbnail":
                    path, mtime_ns, size, read_record = args
                    self.thumbnail.emit(path, make_thumbnail(path, mtime_ns, size, self.edge))
                    if read_record:
                        self.recorded.emit(path, read_image_file(path))
                elif kind == "mark":
                    args[0].set()
            except Exception:  # noqa: BLE001 - one bad file must not stop the gallery
                continue


class Gallery(QObject):
    """Fills `widget` (a QListWidget in icon mode) from the output folder and handles its
    context menu. `show_entry(entry)` shows an image with its diagnosis; `use_parameters(
    values)` puts an image's values into the Generate form; `output_folder()` says where images
    go; `view_image`, when the window sets it, shows an image large (else the desktop's program
    opens it)."""

    def __init__(
        self,
        widget: QListWidget,
        edge: int,
        output_folder: Callable[[], Path],
        show_entry: Callable[[GalleryEntry], None],
        use_parameters: Callable[[dict[str, Any]], None],
        dialogs: Any,
        placeholder: Callable[[], QIcon],
    ) -> None:
        super().__init__(widget)
        self.widget = widget
        self.edge = edge
        self.output_folder = output_folder
        self.show_entry = show_entry
        self.use_parameters = use_parameters
        self.dialogs = dialogs
        self.placeholder = placeholder
        self.view_image: ViewImage | None = None
        self.folder: str | None = None
        self.worker = ThumbnailWorker(edge, self)
        self.worker.listed.connect(self._listed)
        self.worker.thumbnail.connect(self._thumbnail_ready)
        self.worker.recorded.connect(self._recorded)
        widget.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        widget.customContextMenuRequested.connect(self._context_menu)
        # Double-click, or Enter (and a single click where the desktop opens items with one).
        widget.itemActivated.connect(lambda item: self.view(item))
        widget.horizontalScrollBar().valueChanged.connect(lambda _v: self.request_visible())
        widget.verticalScrollBar().valueChanged.connect(lambda _v: self.request_visible())
        widget.viewport().installEventFilter(self)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt's name
        if event.type() in (QEvent.Type.Resize, QEvent.Type.Show):
            self.request_visible()
        return False

    # Filling ----------------------------------------------------------------------------------

    def refresh(self) -> None:
        """List the output folder again (on the worker thread)."""
        self.folder = str(self.output_folder())
        self.worker.list_folder(self.folder)

    def add(self, entry: GalleryEntry, icon: QIcon) -> QListWidgetItem:
        """Put a fresh image first in the gallery. An image the folder's listing already
        brought (the listing came before the job's result) is that item, moved first."""
        item = self.item_of(entry.path)
        if item is None:
            item = QListWidgetItem()
        else:
            self.widget.takeItem(self.widget.row(item))
        item.setIcon(icon)
        self.set_entry(item, entry)
        self.widget.insertItem(0, item)
        return item

    def item_of(self, path: str) -> QListWidgetItem | None:
        """The item that shows the image file at `path`, if any (none for "")."""
        if not path:
            return None
        items = [self.widget.item(index) for index in range(self.widget.count())]
        exact = next((item for item in items if self._path(item) == path), None)
        if exact is not None:
            return exact
        key = same_file(path)
        return next((item for item in items if same_file(self._path(item)) == key), None)

    @staticmethod
    def set_entry(item: QListWidgetItem, entry: GalleryEntry) -> None:
        """Give an item its entry; its text and tooltip are read from it."""
        item.setData(ENTRY, entry)
        item.setText(item_text(entry))
        item.setToolTip(tooltip(entry))

    def _listed(self, folder: str, files: list[tuple[str, int, int]]) -> None:
        if folder != self.folder:
            return  # the output folder changed meanwhile
        shown = {same_file(self._path(self.widget.item(i))) for i in range(self.widget.count())}
        for path, mtime_ns, size in files:
            if same_file(path) in shown:
                continue
            item = QListWidgetItem(self.placeholder(), "")
            self.set_entry(item, GalleryEntry(path=path, file=(mtime_ns, size), listed_only=True))
            self.widget.addItem(item)
        self.request_visible()

    def request_visible(self) -> None:
        """Ask for thumbnails of the items in view (and a screen's worth beyond), once each."""
        viewport: QRect = self.widget.viewport().rect()
        ahead = viewport.adjusted(0, 0, viewport.width(), viewport.height())
        for index in range(self.widget.count()):
            item = self.widget.item(index)
            entry = item.data(ENTRY)
            if entry is None or entry.file is None or item.data(REQUESTED):
                continue
            if self.widget.visualItemRect(item).intersects(ahead):
                item.setData(REQUESTED, True)
                self.worker.make(entry.path, *entry.file, read_record=entry.listed_only)

    def _thumbnail_ready(self, path: str, image: QImage) -> None:
        item = self.item_of(path)
        if item is not None and not image.isNull():
            item.setIcon(QIcon(QPixmap.fromImage(image)))

    def _recorded(self, path: str, record: GalleryEntry) -> None:
        item = self.item_of(path)
        entry: GalleryEntry | None = item.data(ENTRY) if item is not None else None
        if item is not None and entry is not None and entry.listed_only:
            self.set_entry(item, replace(record, file=entry.file))

    @staticmethod
    def _path(item: QListWidgetItem | None) -> str:
        entry = item.data(ENTRY) if item is not None else None
        return entry.path if entry is not None else ""

    def full_entry(self, item: QListWidgetItem) -> GalleryEntry:
        """The item's entry, its record read from its file the first time it is shown."""
        entry: GalleryEntry = item.data(ENTRY)
        if entry.listed_only:
            entry = replace(read_image_file(entry.path), file=entry.file)
            self.set_entry(item, entry)
        return entry

    # Actions ----------------------------------------------------------------------------------

    def _context_menu(self, position: QPoint) -> None:
        item = self.widget.itemAt(position)
        if item is None:
            return
        menu = self.menu_for(item)
        menu.exec(self.widget.viewport().mapToGlobal(position))

    def menu_for(self, item: QListWidgetItem) -> QMenu:
        """The context menu of one image (built per click; tests trigger its actions)."""
        menu = QMenu(self.widget)
        entry = self.full_entry(item)
        has_file = bool(entry.path)
        actions: list[tuple[str, Callable[[], Any], bool]] = [
            ("View", lambda: self.view(item), True),
            ("Open", lambda: self.open_image(item), has_file),
            ("Open folder", lambda: self.open_folder(item), has_file),
            ("Copy parameters", lambda: self.copy_parameters(item), True),
            ("Send parameters to Generate", lambda: self.send_to_generate(item), True),
            ("Show the diagnosis", lambda: self.show_entry(self.full_entry(item)), True),
            ("Move to trash", lambda: self.move_to_trash(item), has_file),
        ]
        for text, callback, enabled in actions:
            action = QAction(text, menu)
            action.setEnabled(enabled)
            action.triggered.connect(lambda _checked=False, act=callback: act())
            menu.addAction(action)
            if text in ("Open folder", "Show the diagnosis"):
                menu.addSeparator()
        menu.setDefaultAction(menu.actions()[0])
        return menu

    def view(self, item: QListWidgetItem) -> None:
        """Show the image large, with its parameters; left and right walk the gallery."""
        if self.view_image is None:
            self.open_image(item)
            return
        self.widget.setCurrentItem(item)
        self.view_image(self.full_entry(item), self.step, self.place)

    def place(self) -> tuple[int, int] | None:
        """Where the current image is: (its position counted from 1, the number of images);
        None when none is current."""
        row = self.widget.currentRow()
        return (row + 1, self.widget.count()) if row >= 0 else None

    def step(self, delta: int) -> GalleryEntry | None:
        """Make the image `delta` places from the current one current, and give its entry;
        None past either end (or when none is current)."""
        current = self.widget.currentRow()
        row = current + delta
        if current < 0 or not 0 <= row < self.widget.count():
            return None
        item = self.widget.item(row)
        self.widget.setCurrentItem(item)
        self.widget.scrollToItem(item)
        return self.full_entry(item)

    def open_image(self, item: QListWidgetItem | None) -> None:
        path = self._path(item)
        if path:
            self.dialogs.open_location(path, "the image")

    def open_folder(self, item: QListWidgetItem | None) -> None:
        path = self._path(item)
        if path:
            self.dialogs.open_location(Path(path).parent, "the folder")

    def copy_parameters(self, item: QListWidgetItem) -> str:
        """The image's parameters as AUTOMATIC1111 writes them, to the clipboard: the text the
        file holds, else the caption's."""
        entry = self.full_entry(item)
        text = entry.parameters or parameter_text(entry)
        QGuiApplication.clipboard().setText(text)
        return text

    def send_to_generate(self, item: QListWidgetItem) -> None:
        self.use_parameters(self.full_entry(item).generate_values())

    def move_to_trash(self, item: QListWidgetItem) -> bool:
        """Move the image to the desktop's trash (Qt's QFile.moveToTrash: the freedesktop.org
        trash on Linux, the Recycle Bin, the macOS Trash); it can be restored from there."""
        path = self._path(item)
        if not path:
            return False
        ok = _move_to_trash(path)
        if not ok:
            # Qt gives up when the desktop's data folder (which holds the trash) does not
            # exist yet, as on a fresh account; make it and try once more.
            with contextlib.suppress(OSError):
                data = QStandardPaths.writableLocation(
                    QStandardPaths.StandardLocation.GenericDataLocation
                )
                if data:
                    Path(data).mkdir(parents=True, exist_ok=True)
                    ok = _move_to_trash(path)
        if not ok:
            self.dialogs.error(
                f"{path} could not be moved to the trash (no trash on that drive, or no "
                "permission); it was left where it is."
            )
            return False
        row = self.widget.row(item)
        self.widget.takeItem(row)
        return True


def _move_to_trash(path: str) -> bool:
    moved = QFile.moveToTrash(path)
    return bool(moved[0] if isinstance(moved, tuple) else moved)
