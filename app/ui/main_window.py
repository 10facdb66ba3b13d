"""The main window: navigation, the six pages, the engine banner, the status bar, drag and drop.

Each page is built on its first visit (app/ui/pages.py), and its module imported then: the
window shows with only the page on screen built. `models_view`, `health_view` and the other page
attributes build their page when first read, so whatever talks to a page before it was visited
(an engine event, a picture sent to Generate) finds it there.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from PySide6.QtCore import QByteArray, QSettings, QSize, Qt, QTimer
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (
    QApplication,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QMainWindow,
    QMessageBox,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from app import __version__
from app.core.precision.words import plan_words
from app.core.requests.records import LoadRequest, PicturePath
from app.engine.failures import Failure
from app.engine.process import log_path
from app.ui import folders, words
from app.ui.dialogs import Dialogs
from app.ui.engine_client import EngineClient
from app.ui.first_run import FirstStart
from app.ui.on_screen import fitting_size
from app.ui.pages import PageHost
from app.ui.state import AppState
from app.ui.wheel import WheelNeedsFocus
from app.ui.widgets import Banner, ElidedLabel

if TYPE_CHECKING:
    # The pages' modules are imported when a page is built, the dialogs' when one opens.
    from app.ui.explain_view import ExplainDialog
    from app.ui.fixes_view import FixesView
    from app.ui.generate_view import GenerateView
    from app.ui.gpu_view import GpuView
    from app.ui.health_view import HealthView
    from app.ui.image_entry import GalleryEntry
    from app.ui.image_viewer import ImageViewer, Place, Step
    from app.ui.models_view import ModelsView
    from app.ui.settings_view import SettingsView

PAGES = ("Models", "Health check", "Fixes", "Generate", "Devices", "Settings")
TITLE = "HalfSafe"
# The window's size at the first start, where the screen has room for it (less on a smaller
# screen: its buttons and status bar stay on it).
FIRST_SIZE = QSize(1180, 800)


class MainWindow(QMainWindow):
    """Owns the views; the engine client and the shared state are handed in (tests fake the
    engine by handing in a client with a fake transport)."""

    def __init__(
        self,
        state: AppState,
        client: EngineClient,
        ui_settings: QSettings,
        settings_warnings: list[str] | None = None,
        settings_summary: str = "",
    ) -> None:
        super().__init__()
        self.state = state
        self.client = client
        self.ui_settings = ui_settings
        application = QApplication.instance()
        if application is not None:  # fields take the wheel only when focused
            self._wheel = WheelNeedsFocus(self)
            application.installEventFilter(self._wheel)
        self.dialogs = Dialogs(self)
        self._reload_after_restart: LoadRequest | None = None
        self.explain_dialogs: list[ExplainDialog] = []
        self.image_viewer: ImageViewer | None = None
        # Qt adds nothing to the title (no application display name is set): "HalfSafe" once.
        self.setWindowTitle(f"{TITLE} — half precision without black images")
        self.setAcceptDrops(True)
        self.setMinimumSize(760, 520)

        central = QWidget()
        outer = QVBoxLayout(central)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.setSpacing(0)
        self.engine_banner = Banner()
        self.notice_banner = Banner()
        for banner in (self.engine_banner, self.notice_banner):
            wrapper = QVBoxLayout()
            wrapper.setContentsMargins(10, 8, 10, 0)
            wrapper.addWidget(banner)
            outer.addLayout(wrapper)
        row = QHBoxLayout()
        row.setSpacing(0)
        self.navigation = QListWidget()
        self.navigation.setObjectName("navigation")
        self.navigation.addItems(PAGES)
        self.navigation.setFixedWidth(170)
        self.navigation.setFocusPolicy(Qt.FocusPolicy.TabFocus)
        row.addWidget(self.navigation)
        self.pages = QStackedWidget()
        row.addWidget(self.pages, 1)
        outer.addLayout(row, 1)
        self.setCentralWidget(central)

        builders = {
            "Models": self._build_models_view,
            "Health check": self._build_health_view,
            "Fixes": self._build_fixes_view,
            "Generate": self._build_generate_view,
            "Devices": self._build_gpu_view,
            "Settings": self._build_settings_view,
        }
        self.page_hosts = {name: PageHost(name, builders[name]) for name in PAGES}
        for host in self.page_hosts.values():
            self.pages.addWidget(host)
        self.navigation.currentRowChanged.connect(self._show_row)
        # Whether the Generate page's gallery, were it built now, would have been filled from the
        # output folder already: at start-up's background work, or when the folder changed.
        self._gallery_due = False

        self._build_menus()
        self._build_status_bar()
        client.died.connect(self._engine_died)
        client.restarted.connect(self._engine_restarted)
        client.not_answering.connect(self._engine_not_answering)
        client.answering.connect(self._engine_answering)
        client.state_changed.connect(lambda _s: self._update_status())
        state.model_changed.connect(lambda _m: self._update_status())
        state.hardware_changed.connect(lambda _h: self._update_status())
        state.settings_changed.connect(self._settings_changed)
        state.effective_changed.connect(lambda _e: self._update_status())
        state.save_failed.connect(lambda message: self.dialogs.error(message))

        if settings_warnings:
            shown = "<br>".join(html.escape(w) for w in settings_warnings[:4])
            more = len(settings_warnings) - 4
            self.notice_banner.show_message(
                "warn",
                # The summary says what the damage really cost: a field, the latest change, or
                # everything; never claim more was kept than was.
                f"<b>{html.escape(settings_summary or 'Some saved settings could not be read.')}"
                "</b><br>" + shown + (f"<br>…and {more} more." if more > 0 else ""),
                [("Dismiss", self.notice_banner.dismiss)],
            )
        self._restore()
        self._update_status()

    # Layout pieces ----------------------------------------------------------------------------

    def _build_menus(self) -> None:
        file_menu = self.menuBar().addMenu("&File")
        open_file = QAction("&Open model file…", self)
        open_file.setShortcut(QKeySequence.StandardKey.Open)
        open_file.triggered.connect(
            lambda: (self.show_page("Models"), self.models_view.open_file())
        )
        open_folder = QAction("Open model &folder…", self)
        open_folder.triggered.connect(
            lambda: (self.show_page("Models"), self.models_view.open_folder())
        )
        explain = QAction("&Why is this image black?…", self)
        explain.setToolTip(
            "Open an image made by HalfSafe, AUTOMATIC1111, Forge, SD.Next, ComfyUI, SwarmUI or "
            "InvokeAI: HalfSafe finds its model, checks it, and gives the fix in that tool's terms."
        )
        explain.triggered.connect(self.open_image)
        quit_action = QAction("&Quit", self)
        quit_action.setShortcut(QKeySequence.StandardKey.Quit)
        quit_action.triggered.connect(self.close)
        file_menu.addActions([open_file, open_folder, explain])
        file_menu.addSeparator()
        file_menu.addAction(quit_action)

        engine_menu = self.menuBar().addMenu("&Engine")
        self.restart_action = QAction("&Restart engine", self)
        self.restart_action.setToolTip(
            "Stop the engine and start a fresh one; this also clears a GPU left in a bad state."
        )
        self.restart_action.triggered.connect(self.restart_engine)
        show_log = QAction("Show engine &log", self)
        show_log.triggered.connect(lambda: self.dialogs.open_location(log_path(), "the engine log"))
        engine_menu.addActions([self.restart_action, show_log])

        view_menu = self.menuBar().addMenu("&View")
        for number, name in enumerate(PAGES, start=1):
            action = QAction(name, self)
            action.setShortcut(QKeySequence(f"Ctrl+{number}"))
            action.triggered.connect(lambda _checked=False, n=name: self.show_page(n))
            view_menu.addAction(action)

        self.first_start = FirstStart(
            self.ui_settings,
            self.state,
            self.client,
            self.dialogs,
            hint=lambda: self.models_view.first_start_hint,
            try_demo=lambda: (self.load_demo(), self.show_page("Health check")),
            show_models=lambda: self.show_page("Models"),
            parent=self,
            show_health=lambda: self.show_page("Health check"),
        )
        help_menu = self.menuBar().addMenu("&Help")
        guide = QAction("&User guide", self)
        guide.setShortcut(QKeySequence(Qt.Key.Key_F1))
        guide.triggered.connect(self._show_guide)
        again = QAction("Show the &first-start steps again", self)
        again.setToolTip("The hint on the Models page and the choice of model folders.")
        again.triggered.connect(self.first_start.show_again)
        about = QAction("&About HalfSafe", self)
        about.triggered.connect(self._about)
        help_menu.addActions([guide, again])
        help_menu.addSeparator()
        help_menu.addAction(about)

    def _build_status_bar(self) -> None:
        bar = self.statusBar()
        self.engine_status = QLabel()
        self.device_status = QLabel()
        self.model_status = QLabel()
        self.precision_status = QLabel()
        for widget in (
            self.engine_status,
            self.device_status,
            self.model_status,
            self.precision_status,
        ):
            widget.setContentsMargins(6, 0, 6, 0)
            bar.addPermanentWidget(widget)
        # The last thing a page said (what the last image was made as, a file that could not
        # be read): it takes the room left and is cut, never widening the window.
        self.message_status = ElidedLabel()
        self.message_status.setContentsMargins(6, 0, 6, 0)
        bar.addPermanentWidget(self.message_status, 1)

    def say(self, sentence: str) -> None:
        """One sentence in the status bar, ending in "…" where it is cut (the whole of it in
        its tooltip)."""
        self.message_status.set_full_text(sentence)

    def _about(self) -> None:
        from app.core.families.registry import families_words

        QMessageBox.about(
            self,
            "About HalfSafe",
            f"<b>HalfSafe {__version__}</b><br>Finds where an image model overflows fp16's "
            "limit of 65,504, proves the cheapest fix, and never lets a black or NaN image pass "
            f"silently.<br><br>It runs {families_words()}.",
        )

    def _show_guide(self) -> None:
        from app.ui.help_view import show_guide

        show_guide(self)

    # Pages ------------------------------------------------------------------------------------

    def _show_row(self, row: int) -> None:
        if 0 <= row < len(PAGES):
            self.page_hosts[PAGES[row]].page  # noqa: B018 - built before it is made current
        self.pages.setCurrentIndex(row)

    def built_pages(self) -> list[str]:
        """The names of the pages built so far, in navigation order."""
        return [name for name, host in self.page_hosts.items() if host.built]

    @property
    def models_view(self) -> ModelsView:
        return cast("ModelsView", self.page_hosts["Models"].page)

    @property
    def health_view(self) -> HealthView:
        return cast("HealthView", self.page_hosts["Health check"].page)

    @property
    def fixes_view(self) -> FixesView:
        return cast("FixesView", self.page_hosts["Fixes"].page)

    @property
    def generate_view(self) -> GenerateView:
        return cast("GenerateView", self.page_hosts["Generate"].page)

    @property
    def gpu_view(self) -> GpuView:
        return cast("GpuView", self.page_hosts["Devices"].page)

    @property
    def settings_view(self) -> SettingsView:
        return cast("SettingsView", self.page_hosts["Settings"].page)

    # A page built late first shows what the state already holds, as it would had it been
    # built at start and followed every change since.

    def _build_models_view(self) -> ModelsView:
        from app.ui.models_view import ModelsView

        view = ModelsView(self.state, self.client, self.dialogs, self.ui_settings)
        view.explain_image = self.explain_image
        return view

    def _build_health_view(self) -> HealthView:
        from app.ui.health_view import HealthView

        view = HealthView(self.state, self.client, self.dialogs)
        # The check probes the path the next image takes: with the input picture, if any.
        view.input_pictures = self._input_pictures
        if self.state.model is not None:
            view.show_saved_report(self.state.model)
        return view

    def _input_pictures(self) -> PicturePath:
        # No picture can have been chosen on a Generate page never built.
        if not self.page_hosts["Generate"].built:
            return PicturePath()
        return self.generate_view.input_pictures()

    def _build_fixes_view(self) -> FixesView:
        from app.ui.fixes_view import FixesView

        return FixesView(self.state, self.client, self.dialogs)

    def _build_generate_view(self) -> GenerateView:
        from app.ui.generate_view import GenerateView

        view = GenerateView(
            self.state, self.client, self.dialogs, self.ui_settings, load_demo=self.load_demo
        )
        view.gallery_view.view_image = self.view_image
        view.status_message.connect(self.say)
        if self._gallery_due:
            view.gallery_view.refresh()
        return view

    def _build_gpu_view(self) -> GpuView:
        from app.ui.gpu_view import GpuView

        view = GpuView(self.state, self.client, self.dialogs)
        if self.state.hardware is not None:
            view.show_report(self.state.hardware)
        return view

    def _build_settings_view(self) -> SettingsView:
        from app.ui.settings_view import SettingsView

        return SettingsView(self.state, self.dialogs, request_hardware=self.request_hardware)

    def show_page(self, name: str) -> None:
        self.navigation.setCurrentRow(PAGES.index(name))

    def current_page(self) -> str:
        return PAGES[self.navigation.currentRow()]

    def load_demo(self) -> None:
        from app.ui.models_view import DEMO_SOURCE

        self.show_page("Models")
        self.models_view.load_path(DEMO_SOURCE)

    def open_image(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self,
            "Why is this image black?",
            folders.pictures(),
            "Images (*.png *.jpg *.jpeg *.webp);;All files (*)",
        )
        if path:
            self.explain_image(path)

    def explain_image(self, path: str) -> ExplainDialog:
        """Open the explanation of an image (a non-modal dialog that runs the `explain` job)."""
        from app.ui.explain_view import ExplainDialog

        dialog = ExplainDialog(
            path,
            self.client,
            self.dialogs,
            self.state.device(),
            self,
            add_model_folder=self.add_model_folder,
            loaded=self._loaded_model(),
        )
        self.explain_dialogs.append(dialog)
        dialog.finished.connect(lambda _result, d=dialog: self._explain_closed(d))
        dialog.show()
        return dialog

    def _loaded_model(self) -> tuple[str, str] | None:
        """The model the engine holds, as (source, name in words), or None."""
        model, request = self.state.model, self.state.model_request
        if model is None or request is None:
            return None
        return request.source, model.name or Path(request.source).name

    def add_model_folder(self, folder: str) -> None:
        """Add `folder` to the model folders (kept after the ones already there); the Models
        page rescans, and an explanation looks there from its next job on."""
        folders = list(self.state.settings["model_folders"])
        if folder not in folders:
            try:
                self.state.apply({"model_folders": [*folders, folder]})
            except ValueError as error:
                self.dialogs.error(f"{folder}: {error}")

    def view_image(
        self, source: GalleryEntry | str, step: Step | None = None, place: Place | None = None
    ) -> ImageViewer:
        """Show an image large with its parameters (one viewer, non-modal, reused)."""
        if self.image_viewer is None:
            from app.ui.image_viewer import ImageViewer

            self.image_viewer = ImageViewer(
                self.dialogs,
                self._send_to_generate,
                self.explain_image,
                self,
                use_as_input=self._use_as_input,
            )
        self.image_viewer.show_image(source, step, place)
        return self.image_viewer

    def _send_to_generate(self, values: dict[str, Any]) -> None:
        self.generate_view.use_parameters(values)
        self.show_page("Generate")

    def _use_as_input(self, path: str) -> bool:
        self.show_page("Generate")
        return self.generate_view.set_input_picture(path)

    def _explain_closed(self, dialog: ExplainDialog) -> None:
        if dialog in self.explain_dialogs:
            self.explain_dialogs.remove(dialog)
        dialog.deleteLater()

    def start_background(self, first_start: bool = False) -> None:
        """Work for after the window shows: describe the device (so the status bar and the
        Settings page's recommendations are there without visiting the Devices page), reload the
        last model, and fill the gallery from the output folder. All of it runs in the engine
        or on worker threads; the window stays responsive. With `first_start` (the app passes
        it; tests and tools opt in), the first-start hint and folder step show when due.

        The Devices page, which asks for the hardware report, and the Models page, which scans
        and reloads, are built here if they were not yet; the Generate page's gallery is filled
        now if the page is built, else when it is built."""
        self._gallery_due = True
        if self.state.hardware is None and self.gpu_view.job_id is None:
            self.gpu_view.request(retest=False)
        self.models_view.rescan()
        self.models_view.reload_last()
        if self.page_hosts["Generate"].built:
            self.generate_view.gallery_view.refresh()
        self._update_status()
        if first_start:
            self.first_start.start()

    def request_hardware(self, then: Any) -> None:
        if self.state.hardware is not None:
            then()
        else:
            self.gpu_view.request(retest=False, then=then)

    # Status bar -------------------------------------------------------------------------------

    def _settings_changed(self, keys: list[str]) -> None:
        if "output_folder" in keys:
            self._gallery_due = True
        # The last job's precision no longer describes the next one.
        if self.state.effective is not None:
            self.state.effective = None
        self._update_status()

    def _update_status(self) -> None:
        engine = self.client.state
        self.engine_status.setText(f"Engine: {engine}")
        device = self.state.device_report()
        if device is not None:
            self.device_status.setText(f"Device: {device.name}")
        else:
            chosen = self.state.device()
            checking = self.page_hosts["Devices"].built and self.gpu_view.job_id is not None
            self.device_status.setText(
                ("Device: checking…" if checking else "Device: auto (not checked yet)")
                if chosen == "auto"
                else f"Device: {chosen}"
            )
        model = self.state.model
        if model is None:
            self.model_status.setText("Model: none loaded")
        else:
            self.model_status.setText(f"Model: {model.name or model.source}")
        if self.state.effective:
            self.precision_status.setText(f"Precision: {self.state.effective}")
            self.precision_status.setToolTip("What the last job actually ran with.")
        else:
            plan = self.state.expected_plan()
            self.precision_status.setText(
                "Precision: "
                + (plan_words(plan) if plan is not None else self._settings_with_remembered())
            )
            self.precision_status.setToolTip(
                "What the next job will use: your settings with Auto resolved for this "
                "computer and the loaded model (its needs and its remembered fix)."
            )

    def _settings_with_remembered(self) -> str:
        """The next job's precision while the device is not known: the settings, with the
        loaded model's remembered fix where they leave its fields to it (Auto, off, empty),
        as a job lays it over them; the banner under a repaired image says the same fix."""
        values = self.state.settings.to_dict()
        model = self.state.model
        fix = model.remembered_fix if model is not None else None
        for key, value in (fix.settings if fix is not None else {}).items():
            if values.get(key) in ("auto", False, None, []):
                values[key] = value
        return words.precision_summary(values, parts=self.state.components())

    # Engine life ------------------------------------------------------------------------------

    def _engine_died(self, failure: Failure) -> None:
        if self.state.model_request is not None:
            self._reload_after_restart = self.state.model_request
        self.state.set_model(None)
        self.engine_banner.show_message(
            "bad",
            f"<b>The engine stopped.</b> {html.escape(failure.message)} The window keeps "
            "running, and every image already saved is kept."
            + (" Restarting loads your model again." if self._reload_after_restart else ""),
            [
                ("Restart engine", self.restart_engine),
                ("Details", lambda: self.dialogs.error(failure.message, failure.details)),
            ],
        )

    def _engine_not_answering(self, silence: float) -> None:
        self.engine_banner.show_message(
            "bad",
            f"<b>The engine stopped answering.</b> Nothing has been heard from it for "
            f"{silence:.0f} s: it may be frozen, or paused by another program. Restart it, or "
            "Cancel the job to end it; every image already saved is kept.",
            [("Restart engine", self.restart_engine)],
        )

    def _engine_answering(self) -> None:
        self.engine_banner.dismiss()

    def restart_engine(self) -> None:
        if self.state.model_request is not None and self._reload_after_restart is None:
            self._reload_after_restart = self.state.model_request
        self.engine_banner.show_message("info", "Restarting the engine…")
        self.client.restart()

    def _engine_restarted(self) -> None:
        self.engine_banner.dismiss()
        self.state.set_model(None)
        reload, self._reload_after_restart = self._reload_after_restart, None
        if reload is not None:
            self.models_view.vae_path = reload.vae
            self.models_view.load_path(reload.source, reload.allow_pickle)

    # Drag and drop ----------------------------------------------------------------------------

    @staticmethod
    def _dropped_paths(mime: Any) -> list[str]:
        if not mime.hasUrls():
            return []
        return [url.toLocalFile() for url in mime.urls() if url.isLocalFile()]

    def dragEnterEvent(self, event: Any) -> None:  # noqa: N802 - Qt's name
        if self._dropped_paths(event.mimeData()):
            event.acceptProposedAction()
        else:
            event.ignore()

    def dragMoveEvent(self, event: Any) -> None:  # noqa: N802 - Qt's name
        self.dragEnterEvent(event)

    def dropEvent(self, event: Any) -> None:  # noqa: N802 - Qt's name
        paths = self._dropped_paths(event.mimeData())
        if not paths:
            event.ignore()
            return
        event.acceptProposedAction()
        from app.core.explain import is_image_path  # the image reader: imported on a drop

        if is_image_path(paths[0]):
            # An image is read, never a model to load: the viewer shows what it records and
            # offers "Why is it black?".
            if len(paths) > 1:
                self.dialogs.error(f"Drop one image at a time; showing {Path(paths[0]).name}.")
            QTimer.singleShot(0, lambda: self.view_image(paths[0]))
            return
        self.show_page("Models")
        if len(paths) > 1:
            self.dialogs.error(f"Drop one model at a time; loading {Path(paths[0]).name}.")
        # Deferred so the drag source is released before the load starts.
        QTimer.singleShot(0, lambda: self.models_view.load_path(paths[0]))

    # Persistence ------------------------------------------------------------------------------

    def _restore(self) -> None:
        geometry = self.ui_settings.value("window/geometry")
        if isinstance(geometry, QByteArray) and not geometry.isEmpty():
            self.restoreGeometry(geometry)
        else:  # the first start: as large as the screen allows, up to FIRST_SIZE
            self.resize(fitting_size(self, FIRST_SIZE))
        page = self.ui_settings.value("window/page", "Models")
        self.show_page(page if page in PAGES else "Models")

    def save_state(self) -> None:
        self.ui_settings.setValue("window/geometry", self.saveGeometry())
        self.ui_settings.setValue("window/page", self.current_page())
        if self.page_hosts["Generate"].built:  # else the saved prompt is still the one shown
            self.ui_settings.setValue("generate/prompt", self.generate_view.prompt.toPlainText())
        self.ui_settings.sync()

    def closeEvent(self, event: Any) -> None:  # noqa: N802 - Qt's name
        self.save_state()
        self.dialogs.close_all()
        self.client.shutdown()
        super().closeEvent(event)
