"""The Models page: the library of checkpoints found on this computer (searchable, filtered by
family, with what each file's metadata says, its preview picture, and its last health verdict and
remembered fix), opening a file or folder, a separate VAE, loading with progress and cancel, and
what HalfSafe detected about the model. The list's rows are `model_list`'s; the page's words,
`model_words`'; the buttons and dialogs that choose a model besides the list, `model_choice`'s;
the part below the list (the VAE, Load and Cancel, the loaded model's card), `load_panel`'s."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QSettings
from PySide6.QtGui import QImage, QShowEvent
from PySide6.QtWidgets import QTreeWidgetItem, QWidget

from app.core.demo import DEMO_MODELS
from app.core.models.summary import ModelSummary
from app.core.requests.records import LoadRequest
from app.engine.events import EngineEvent, EventState, StillLoaded
from app.ui.browser import (
    ENTRY,
    HealthReader,
    ModelHealth,
    PreviewWorker,
    fill_families,
    filter_row,
)
from app.ui.dialogs import Dialogs
from app.ui.engine_client import EngineClient
from app.ui.library_scan import LibraryScanner, library_count_words
from app.ui.load_panel import DEMO_SOURCE, LoadPanel
from app.ui.model_choice import (
    ask_checkpoint,
    ask_model_folder,
    choice_row,
    remember_opened,
    with_opened,
)
from app.ui.model_list import ModelList
from app.ui.model_words import unloadable
from app.ui.state import AppState
from app.ui.widgets import Banner, page_layout


class ModelsView(QWidget):
    """Submits `load` jobs; the loaded model's summary goes into the shared state."""

    def __init__(
        self,
        state: AppState,
        client: EngineClient,
        dialogs: Dialogs,
        ui_settings: QSettings,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        # Set by the main window: how an image handed to `load_path` is explained.
        self.explain_image: Callable[[str], Any] | None = None
        self.state = state
        self.client = client
        self.dialogs = dialogs
        self.ui_settings = ui_settings
        self.job_id: int | None = None
        self.loading: LoadRequest | None = None
        self.vae_path: str | None = None
        self.scanner = LibraryScanner(self)
        self.scanner.finished.connect(self._library_scanned)
        self._scanned: list[dict[str, Any]] = []
        self._scan_again = False  # the folders changed while a scan ran
        self.health_reader = HealthReader(self)
        self.health_reader.read.connect(self._health_read)
        self.health: dict[str, ModelHealth] = {}
        self._listed_once = False  # a scan has listed the folders: the readers are wanted now
        self.previews = PreviewWorker(parent=self)
        self.previews.ready.connect(self._preview_ready)
        self.thumbnails: dict[str, QImage] = {}

        layout = page_layout(
            self,
            "Models",
            "Choose a model to load: a .safetensors checkpoint, a diffusers folder, or the "
            "built-in demo. You can also drop a file or folder anywhere on this window.",
        )
        self.first_start_hint = Banner()  # filled by app.ui.first_run on a first start
        layout.addWidget(self.first_start_hint)
        buttons, self.rescan_button, self.library_status = choice_row(
            self.open_file, self.open_folder, self.rescan
        )
        layout.addLayout(buttons)

        filters, self.search, self.family = filter_row(
            "Show only the models of one family.", self._filter
        )
        layout.addLayout(filters)

        self.library = ModelList()
        self.library.itemDoubleClicked.connect(lambda item, _col: self.load_item(item))
        self.library.currentItemChanged.connect(lambda _c, _p: self._selection_changed())
        layout.addWidget(self.library, 1)

        self.load_panel = lower = LoadPanel(state, dialogs)
        lower.choose_vae_button.clicked.connect(self.choose_vae)
        lower.clear_vae_button.clicked.connect(lambda: self.set_vae(None))
        lower.load_button.clicked.connect(lambda: self.load_item(self.library.currentItem()))
        lower.cancel_button.clicked.connect(self.cancel)
        self.health_reader.reports_read.connect(lower.advice.set_saved)
        layout.addWidget(lower)
        # The panel's widgets, named on the page as well: the page's methods set them.
        self.card_text, self.vae_label = lower.card_text, lower.vae_label
        self.clear_vae_button = lower.clear_vae_button
        self.load_button, self.cancel_button = lower.load_button, lower.cancel_button
        self.progress, self.load_status = lower.progress, lower.load_status
        self.remembered, self.details = lower.remembered, lower.details
        self.details_text, self.advice = lower.details_text, lower.advice
        self.lower_tabs = lower.lower_tabs

        self._fill_library([])
        state.settings_changed.connect(self._settings_changed)
        state.model_changed.connect(self._show_model)
        state.model_changed.connect(lambda _model: self._read_health())

    # Library ----------------------------------------------------------------------------------

    def rescan(self) -> None:
        if self.scanner.scan(list(self.state.settings["model_folders"])):
            self.library_status.setText("Looking for models…")
            self.rescan_button.setEnabled(False)
        else:
            self._scan_again = True

    def _settings_changed(self, keys: list[str]) -> None:
        if "model_folders" in keys:
            self.rescan()

    def _library_scanned(self, entries: list[dict[str, Any]], problem: str) -> None:
        self.rescan_button.setEnabled(True)
        self._scanned = list(entries)
        self._listed_once = True
        self._fill_library(entries)
        self._read_health()
        self.previews.forget()
        self.previews.make(e["path"] for e in entries if not e.get("error"))
        if problem:
            self.library_status.setText(problem)
        else:
            broken = sum(1 for e in entries if e.get("error"))
            vaes = sum(1 for e in entries if e.get("role") == "vae")
            models = len(entries) - vaes
            self.library_status.setText(library_count_words(models, vaes, broken))
        if self._scan_again:
            self._scan_again = False
            self.rescan()

    def _fill_library(self, entries: list[dict[str, Any]]) -> None:
        last = str(self.ui_settings.value("models/last", DEMO_SOURCE))
        # Models opened from a file or folder stay in the list, after the scanned ones.
        entries = with_opened(entries, self.ui_settings)
        selected, families = self.library.fill(entries, last, self._listed_once)
        fill_families(self.family, families)
        self.library.show_health(self.health)
        self.library.show_thumbnails(self.thumbnails)
        if selected is not None:
            self.library.setCurrentItem(selected)
        self._filter()
        self._update_load_button()
        if self.state.model is not None:
            self.library.mark_loaded(self.loaded_source())
            self._update_load_button()

    def _filter(self) -> None:
        """Show the rows that match the search box and the family filter."""
        self.library.show_matching(self.search.text(), self.family.currentText())

    def _read_health(self) -> None:
        """Read the saved verdicts and remembered fixes again (worker thread), once the library
        has been listed: never to show the window."""
        if not self._listed_once:
            return
        device = self.state.device_report()
        model, request = self.state.model, self.state.model_request
        loaded = (
            (model.profile_key, request.source)
            if model is not None and request is not None and model.profile_key
            else None
        )
        self.health_reader.start(device.name if device is not None else None, loaded)

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        self._read_health()  # a check on another page may have saved a verdict since

    def _health_read(self, health: dict[str, ModelHealth]) -> None:
        self.health = dict(health)
        self.library.show_health(self.health)
        self.remembered.refresh(self.health, self.loaded_source(), self.loading is not None)

    def _preview_ready(self, model: str, image: QImage, problem: str) -> None:
        if problem:
            item = self.library.item_for(model)
            if item is not None:
                item.setToolTip(0, item.toolTip(0) + "\n" + problem)
            return
        self.thumbnails[model] = image
        self.library.show_thumbnails(self.thumbnails)

    def _selection_changed(self) -> None:
        item = self.library.currentItem()
        self.load_panel.show_entry(item.data(0, ENTRY) if item else None, self.job_id is not None)
        self._update_load_button()

    def _update_load_button(self) -> None:
        """The button names what it does: load the highlighted model, or reload the one held."""
        item = self.library.currentItem()
        entry = (item.data(0, ENTRY) if item else None) or {}
        loaded = self.loaded_source()
        self.load_button.setText(
            "Reload" if loaded is not None and entry.get("path") == loaded else "Load"
        )

    def loaded_source(self) -> str | None:
        if self.state.model is None or self.state.model_request is None:
            return None
        return self.state.model_request.source

    # Remembered models -------------------------------------------------------------------------

    def _remember_opened(self, source: str) -> None:
        if remember_opened(self.ui_settings, source) and self.library.item_for(source) is None:
            self._fill_library(self._scanned)

    def reload_last(self) -> int | None:
        """Load the model used last (at start, after the window shows). Says so when it is
        gone; loads nothing then."""
        last = str(self.ui_settings.value("models/last", "") or "")
        if not last or self.state.model is not None or self.job_id is not None:
            return None
        if last not in DEMO_MODELS and not Path(last).exists():
            self.load_status.setText(f"The model you used last is no longer there: {last}")
            return None
        return self.load_path(last)

    # Choosing ---------------------------------------------------------------------------------

    def open_file(self) -> None:
        if path := ask_checkpoint(self, "Open a checkpoint"):
            self.load_path(path)

    def open_folder(self) -> None:
        if path := ask_model_folder(self):
            self.load_path(path)

    def choose_vae(self) -> None:
        if path := ask_checkpoint(self, "Choose a VAE"):
            self.set_vae(path)

    def set_vae(self, path: str | None) -> None:
        self.vae_path = path
        self.load_panel.show_vae(path)
        if self.state.model is not None and self.job_id is None:
            self.load_status.setText("Load the model again to use this VAE.")

    def load_item(self, item: QTreeWidgetItem | None) -> None:
        if item is None:
            return
        entry = item.data(0, ENTRY) or {}
        if entry.get("role") == "vae" and not entry.get("error"):
            self.set_vae(entry["path"])  # a VAE is chosen for the next model, not loaded alone
            return
        problem = unloadable(entry)
        if problem:
            self.dialogs.error(problem)
            return
        # A1111's `name.vae.safetensors` beside the model, unless the user chose a VAE.
        self.load_path(entry["path"], vae=self.vae_path or entry.get("vae"))

    # Loading ----------------------------------------------------------------------------------

    def load_path(
        self, source: str, allow_pickle: bool = False, vae: str | None = None
    ) -> int | None:
        """Load a model (a path or "demo") in the engine with `vae` (default: the chosen VAE,
        if any); the previous one is released. An image (opened here by mistake) is explained
        instead, never read as a checkpoint."""
        from app.core.explain import is_image_path  # the image reader: not needed at launch

        if self.explain_image is not None and is_image_path(source):
            self.explain_image(source)
            return None
        if source not in DEMO_MODELS and not Path(source).exists():
            self.dialogs.error(f"{source}: this file or folder does not exist.")
            return None
        if self.job_id is not None:
            self.client.cancel(self.job_id)
        request = LoadRequest(
            source=source,
            vae=vae or self.vae_path,
            allow_pickle=allow_pickle,
            device=self.state.device(),
        )
        self.loading = request
        self.state.set_model(None)
        self.load_panel.show_loading(DEMO_MODELS.get(source) or Path(source).name)
        self.job_id = self.client.submit(request, self._on_event)
        return self.job_id

    def cancel(self) -> None:
        if self.job_id is not None:
            self.load_status.setText("Cancelling…")
            self.client.cancel(self.job_id)

    def _finish(self, text: str) -> None:
        self.job_id = None
        self.load_panel.show_stopped()
        self._selection_changed()
        self.load_status.setText(text)

    def _on_event(self, event: EngineEvent) -> None:
        if self.job_id is not None and event.job_id != self.job_id:
            return  # a load that was replaced by a newer one
        if event.state == EventState.PROGRESS:
            self.load_panel.show_stage(event.done, event.total, event.stage)
        elif event.state == EventState.WARNING:
            self.load_status.setText(event.message)
        elif event.state == EventState.RESULT:
            request, self.loading = self.loading, None
            self._finish("Loaded.")
            if request is not None:
                self.ui_settings.setValue("models/last", request.source)
                self._remember_opened(request.source)
            self.state.set_model(event.result_as(ModelSummary), request)
        elif event.state == EventState.CANCELLED:
            self.loading = None
            kept = self._keep_what_the_engine_holds(event)
            self._finish(f"Loading cancelled; {kept}.")
        elif event.state == EventState.ERROR:
            request, self.loading = self.loading, None
            kept = self._keep_what_the_engine_holds(event)
            if event.error_type == "PickleRefusedError" and request is not None:
                self._finish("")
                self._ask_pickle(request, event.message)
                return
            self._finish(f"The model was not loaded; {kept}.")
            self.dialogs.job_failed(event)

    def _keep_what_the_engine_holds(self, event: EngineEvent) -> str:
        """After a failed or cancelled load, show the model the engine still holds (the one
        loaded before, kept or loaded again); returns it in words."""
        held = event.result_or_none(StillLoaded)
        if held is None or held.model is None or held.request is None:
            self.state.set_model(None)
            return "no model is loaded"
        self.state.set_model(held.model, held.request)
        return f"{held.model.name or Path(held.request.source).name} is still loaded"

    def _ask_pickle(self, request: LoadRequest, message: str) -> None:
        if self.load_panel.allows_pickle(Path(request.source).name):
            self.load_path(request.source, allow_pickle=True, vae=request.vae)

    # Showing ----------------------------------------------------------------------------------

    def _show_model(self, model: ModelSummary | None) -> None:
        source = self.loaded_source() if model else None
        if model and source:
            self.library.show_found(source, model)
        self.library.mark_loaded(source)  # bold, so the list and the card agree
        self._update_load_button()
        if model is None and self.loading is None:
            self.load_status.setText("")  # "... is still loaded" of an earlier load holds no more
        request = self.state.model_request
        self.load_panel.show_model(model, request.vae if request and self.loading is None else None)

    def _show_remembered(
        self, settings: dict[str, Any], summary: str, on: str | None, damage: str = ""
    ) -> None:
        """The remembered fix `settings` (`summary`, found on the device `on`) in the banner."""
        self.remembered.show_fix(settings, summary, on, damage)
