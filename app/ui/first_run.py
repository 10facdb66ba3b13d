"""The first start: a hint on the Models page (load the demo, then run the health check) and a
step that shows the model folders HalfSafe found and saves the user's choice. Both are shown
once, and again from the Help menu.

The flags live in the window state (`window.ini`): `first_start/hint_done` once the hint is
dismissed or a health check has run, `first_start/folders_done` once the folder step was shown.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from PySide6.QtCore import QObject, QSettings, Qt, Signal
from PySide6.QtWidgets import (
    QDialog,
    QFileDialog,
    QHBoxLayout,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.core import paths
from app.core.library.entries import MODEL
from app.core.library.folders import APP_MODELS, default_folders
from app.core.requests.records import CheckRequest
from app.engine.events import EngineEvent
from app.ui import folders
from app.ui.dialogs import Dialogs
from app.ui.engine_client import EngineClient
from app.ui.state import AppState
from app.ui.widgets import Banner, label, primary_button

HINT_DONE = "first_start/hint_done"
FOLDERS_DONE = "first_start/folders_done"
# Saved on every close since the first version: a window state that has it, and no first-start
# flag, belongs to someone who used HalfSafe before these steps existed.
USED_BEFORE = "window/geometry"
TOOLS = "AUTOMATIC1111, Forge, ComfyUI, Stability Matrix and InvokeAI"


def found_model_folders() -> tuple[list[str], list[str]]:
    """The model folders of the tools installed here (`default_folders`: their VAE folders and
    HalfSafe's own folder left out), and a sentence for each of their configuration files that
    could not be read. Stats a few dozen paths and may read YAML: call it off the GUI thread."""
    folders, problems = default_folders()
    own = paths.data_dir() / APP_MODELS
    found = [str(f.path) for f in folders if f.role == MODEL and f.path != own]
    return found, [p.error or p.path for p in problems]


def same_folder(a: str, b: str) -> bool:
    return Path(a).expanduser() == Path(b).expanduser()


def merged_folders(kept: list[str], ticked: Iterable[str]) -> list[str]:
    """The user's folders, every one kept in its place, then each ticked folder not among them."""
    merged = list(kept)
    for folder in ticked:
        if not any(same_folder(folder, other) for other in merged):
            merged.append(folder)
    return merged


class FolderFinder(QObject):
    """Runs `found_model_folders` on a worker thread. `found(list[str], list[str])` (the
    folders, the problems) is emitted from that thread; Qt queues it to the GUI thread."""

    found = Signal(list, list)

    def __init__(
        self,
        find: Callable[[], tuple[list[str], list[str]]] = found_model_folders,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self._find = find
        self.running = False

    def start(self) -> None:
        self.running = True
        threading.Thread(target=self._run, name="model-folders", daemon=True).start()

    def _run(self) -> None:
        try:
            folders, problems = self._find()
        except Exception as error:  # noqa: BLE001 - a failed search must not take the window down
            folders, problems = [], [f"The usual model folders could not be searched ({error})."]
        self.running = False
        # The dialog may have been closed and deleted meanwhile: then nobody is told.
        with contextlib.suppress(RuntimeError):
            self.found.emit(folders, problems)


class ModelFolderDialog(QDialog):
    """The model folders found on this computer, each with a check box, and the user's own;
    Save adds the ticked ones to the `model_folders` setting. The folders already there are
    always kept (they are removed in Settings), so nothing the user set is lost."""

    def __init__(
        self,
        state: AppState,
        dialogs: Dialogs,
        parent: QWidget | None = None,
        finder: FolderFinder | None = None,
    ) -> None:
        super().__init__(parent)
        self.state = state
        self.dialogs = dialogs
        self.setWindowTitle("Your model folders")
        self.setMinimumWidth(620)
        layout = QVBoxLayout(self)
        layout.addWidget(label("Where are your models?", "section"))
        layout.addWidget(
            label(
                "The Models page lists the models in these folders, reading only their file "
                "headers. Tick the folders to keep in your model folders and add any other "
                f"folder where you keep models. HalfSafe also looks in the {TOOLS} folders it "
                "finds at every start, and in its own folder, "
                f"{paths.data_dir() / APP_MODELS}.",
                "muted",
                wrap=True,
                selectable=True,
            )
        )
        self.status = label(f"Looking for {TOOLS} folders…", "muted", wrap=True)
        layout.addWidget(self.status)
        self.folders = QListWidget()
        self.folders.setMinimumHeight(160)
        layout.addWidget(self.folders, 1)
        for folder in self.state.settings["model_folders"]:
            self._add_item(
                folder, "Already one of your model folders (remove it in Settings).", kept=True
            )
        buttons = QHBoxLayout()
        add = QPushButton("Add folder…")
        add.clicked.connect(self.add_chosen_folder)
        skip = QPushButton("Skip")
        skip.setToolTip("Leave your model folders as they are.")
        skip.clicked.connect(self.reject)
        self.save_button = primary_button("Save")
        self.save_button.clicked.connect(self.save)
        for button in (add, skip):
            button.setAutoDefault(False)
        self.save_button.setDefault(True)
        buttons.addWidget(add)
        buttons.addStretch(1)
        buttons.addWidget(skip)
        buttons.addWidget(self.save_button)
        layout.addLayout(buttons)

        self.finder = finder or FolderFinder(parent=self)
        self.finder.found.connect(self._found)
        self.finder.start()

    # The list ---------------------------------------------------------------------------------

    def _item_for(self, folder: str) -> QListWidgetItem | None:
        for row in range(self.folders.count()):
            item = self.folders.item(row)
            if same_folder(item.data(Qt.ItemDataRole.UserRole), folder):
                return item
        return None

    def _add_item(self, folder: str, tip: str, kept: bool = False) -> None:
        item = QListWidgetItem(folder)
        item.setData(Qt.ItemDataRole.UserRole, folder)
        item.setToolTip(tip)
        item.setCheckState(Qt.CheckState.Checked)
        if kept:  # shown ticked, and not to be unticked here
            item.setFlags(item.flags() & ~Qt.ItemFlag.ItemIsUserCheckable)
        self.folders.addItem(item)

    def _found(self, folders: list[str], problems: list[str]) -> None:
        new = [f for f in folders if self._item_for(f) is None]
        for folder in new:
            self._add_item(folder, "Found on this computer.")
        if folders:
            count = len(folders)
            self.status.setText(
                f"Found {count} model folder{'s' if count != 1 else ''} of {TOOLS}."
            )
        else:
            self.status.setText(f"No {TOOLS} model folders were found on this computer.")
        if problems:
            self.status.setText(self.status.text() + "\n" + "\n".join(problems))

    def ticked(self) -> list[str]:
        """The folders whose check box is ticked, in the list's order."""
        items = [self.folders.item(row) for row in range(self.folders.count())]
        return [
            item.data(Qt.ItemDataRole.UserRole)
            for item in items
            if item.checkState() == Qt.CheckState.Checked
        ]

    def choose_folder(self) -> str:
        """Ask for a folder (the desktop's folder chooser); "" when cancelled."""
        return QFileDialog.getExistingDirectory(self, "Add a model folder", folders.home())

    def add_chosen_folder(self) -> None:
        folder = self.choose_folder()
        if folder:
            self.add_folder(folder)

    def add_folder(self, folder: str) -> None:
        """Add a folder to the list, ticked (or tick it, if it is there already)."""
        if not Path(folder).expanduser().is_dir():
            self.dialogs.error(f"{folder}: this folder does not exist.")
            return
        item = self._item_for(folder)
        if item is None:
            self._add_item(folder, "Added by you.")
            item = self.folders.item(self.folders.count() - 1)
        item.setCheckState(Qt.CheckState.Checked)
        self.folders.setCurrentItem(item)

    # Saving -----------------------------------------------------------------------------------

    def save(self) -> None:
        """Add the ticked folders to the setting, after the ones it holds; closes the dialog."""
        kept = list(self.state.settings["model_folders"])
        try:
            self.state.apply({"model_folders": merged_folders(kept, self.ticked())})
        except ValueError as error:
            self.dialogs.error(f"The model folders could not be saved: {error}.")
            return
        self.accept()


class FirstStart(QObject):
    """Shows the first-start hint and the folder step when they are due, and again on request.

    `hint` gives the Models page's banner (read when the hint shows or goes, so the page is
    built only then); `try_demo` loads the demo and opens the Health check
    page; `show_models` opens the Models page, `show_health` the Health check page. Once a
    model is loaded the hint says the next step; a health check run from anywhere ends it.
    """

    def __init__(
        self,
        ui_settings: QSettings,
        state: AppState,
        client: EngineClient,
        dialogs: Dialogs,
        hint: Callable[[], Banner],
        try_demo: Callable[[], object],
        show_models: Callable[[], object],
        parent: QWidget,
        show_health: Callable[[], object] = lambda: None,
    ) -> None:
        super().__init__(parent)
        self.ui_settings = ui_settings
        self.state = state
        self.dialogs = dialogs
        self._hint = hint
        self._try_demo = try_demo
        self._show_models = show_models
        self._show_health = show_health
        self._window = parent
        self.folder_dialog: ModelFolderDialog | None = None
        client.job_event.connect(self._job_event)
        state.model_changed.connect(self._model_changed)

    @property
    def hint(self) -> Banner:
        return self._hint()

    def _done(self, key: str) -> bool:
        return str(self.ui_settings.value(key, "false")).lower() == "true"

    def _mark(self, key: str, done: bool = True) -> None:
        self.ui_settings.setValue(key, done)
        self.ui_settings.sync()

    def start(self) -> None:
        """At start-up, after the window shows: the hint until it is dismissed or a check has
        run, the folder step on the very first start only. Someone who used HalfSafe before
        these steps existed sees neither (the Help menu still shows them)."""
        if self.ui_settings.contains(USED_BEFORE) and not self.ui_settings.contains(FOLDERS_DONE):
            self._mark(HINT_DONE)
            self._mark(FOLDERS_DONE)
        if not self._done(HINT_DONE):
            self.show_hint()
        if not self._done(FOLDERS_DONE):
            self.open_folder_step()

    def show_again(self) -> None:
        """The Help menu's "Show the first-start steps again"."""
        self._mark(HINT_DONE, False)
        self._show_models()
        self.show_hint()
        self.open_folder_step()

    # The hint ---------------------------------------------------------------------------------

    def show_hint(self) -> None:
        self.hint.show_message(
            "info",
            "<b>New here?</b> Load the demo model, then press Health check.",
            [("Load the demo", self._try_demo), ("Dismiss", self.dismiss_hint)],
        )

    def _model_changed(self, model: object) -> None:
        """A model loaded while the hint is up: its first step is done, so it says the next."""
        # The hint shows on the Models page, which may be out of sight (its own button opens
        # the Health check page): it is up unless it was dismissed.
        if model is None or self._done(HINT_DONE) or self.hint.isHidden():
            return
        self.hint.show_message(
            "info",
            "<b>Next:</b> press Health check to see which part of the model overflows in fp16 "
            "and the fix HalfSafe proves for it.",
            [("Open Health check", self._show_health), ("Dismiss", self.dismiss_hint)],
        )

    def dismiss_hint(self) -> None:
        self.hint.dismiss()
        self._mark(HINT_DONE)

    def _job_event(self, event: EngineEvent) -> None:
        if event.kind == CheckRequest.kind and not self._done(HINT_DONE):
            self.dismiss_hint()

    # The folder step --------------------------------------------------------------------------

    def open_folder_step(self) -> ModelFolderDialog:
        """Show the model-folder step (non-blocking); marks it as shown."""
        self._mark(FOLDERS_DONE)
        dialog = self.folder_dialog
        if dialog is None or not dialog.isVisible():
            dialog = ModelFolderDialog(self.state, self.dialogs, self._window)
            self.folder_dialog = dialog
        dialog.open()
        dialog.activateWindow()
        return dialog
