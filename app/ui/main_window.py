"""The main window: navigation, the six pages, the engine banner, the status bar, drag and drop.

Each page is built on its first visit (app/ui/pages.py), and its module imported then: the
window shows with only the page on screen built. `models_view`, `health_view` and the other page
attributes build their page when first read, so whatever talks to a page before it was visited
(an engine event, a picture sent to Generate) finds it there.

Its parts live beside it: the menus (`window_menus`), the pages' builders (`page_builders`), the
status bar (`status_bar`), the engine banner and restarts (`engine_life`), and the explanations
and the image viewer it opens (`image_windows`).
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from PySide6.QtCore import QByteArray, QSettings, QSize, Qt, QTimer
from PySide6.QtWidgets import (
    QApplication,
    QHBoxLayout,
    QListWidget,
    QMainWindow,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from app.ui.dialogs import Dialogs
from app.ui.engine_client import EngineClient
from app.ui.engine_life import EngineLife
from app.ui.first_run import FirstStart
from app.ui.image_windows import ImageWindows
from app.ui.on_screen import fitting_size
from app.ui.page_builders import page_builders
from app.ui.pages import PageHost
from app.ui.state import AppState
from app.ui.status_bar import StatusLine
from app.ui.wheel import WheelNeedsFocus
from app.ui.widgets import Banner
from app.ui.window_menus import build_menus, show_about

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
        self.images = ImageWindows(self)
        self.explain_dialogs = self.images.explain_dialogs  # the explanations open now
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

        builders = page_builders(self)
        self.page_hosts = {name: PageHost(name, builders[name]) for name in PAGES}
        for host in self.page_hosts.values():
            self.pages.addWidget(host)
        self.navigation.currentRowChanged.connect(self._show_row)
        # Whether the Generate page's gallery, were it built now, would have been filled from the
        # output folder already: at start-up's background work, or when the folder changed.
        self.gallery_due = False

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
        self.restart_action = build_menus(self, PAGES)
        self.status_line = status = StatusLine(
            self.statusBar(),
            state,
            client,
            # Read without building the Devices page: its job runs only once it is built.
            lambda: self.page_hosts["Devices"].built and self.gpu_view.job_id is not None,
        )
        self.engine_status, self.device_status = status.engine_status, status.device_status
        self.model_status, self.precision_status = status.model_status, status.precision_status
        self.message_status = status.message_status
        self.engine_life = life = EngineLife(
            state, client, self.dialogs, self.engine_banner, lambda: self.models_view, self
        )
        client.died.connect(life.died)
        client.restarted.connect(life.restarted)
        client.not_answering.connect(life.not_answering)
        client.answering.connect(life.answering)
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

    def say(self, sentence: str) -> None:
        """One sentence in the status bar, ending in "…" where it is cut (the whole of it in
        its tooltip)."""
        self.status_line.say(sentence)

    def _about(self) -> None:
        show_about(self)

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

    def show_page(self, name: str) -> None:
        self.navigation.setCurrentRow(PAGES.index(name))

    def current_page(self) -> str:
        return PAGES[self.navigation.currentRow()]

    def load_demo(self) -> None:
        from app.ui.models_view import DEMO_SOURCE

        self.show_page("Models")
        self.models_view.load_path(DEMO_SOURCE)

    def open_image(self) -> None:
        self.images.open_image()

    def explain_image(self, path: str) -> ExplainDialog:
        """Open the explanation of an image (a non-modal dialog that runs the `explain` job)."""
        return self.images.explain_image(path)

    def view_image(
        self, source: GalleryEntry | str, step: Step | None = None, place: Place | None = None
    ) -> ImageViewer:
        """Show an image large with its parameters (one viewer, non-modal, reused)."""
        return self.images.view_image(source, step, place)

    @property
    def image_viewer(self) -> ImageViewer | None:
        """The image viewer, once an image was shown large."""
        return self.images.image_viewer

    def start_background(self, first_start: bool = False) -> None:
        """Work for after the window shows: describe the device (so the status bar and the
        Settings page's recommendations are there without visiting the Devices page), reload the
        last model, and fill the gallery from the output folder. All of it runs in the engine
        or on worker threads; the window stays responsive. With `first_start` (the app passes
        it; tests and tools opt in), the first-start hint and folder step show when due.

        The Devices page, which asks for the hardware report, and the Models page, which scans
        and reloads, are built here if they were not yet; the Generate page's gallery is filled
        now if the page is built, else when it is built."""
        self.gallery_due = True
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

    # Status bar and engine ------------------------------------------------------------------

    def _settings_changed(self, keys: list[str]) -> None:
        if "output_folder" in keys:
            self.gallery_due = True
        # The last job's precision no longer describes the next one.
        if self.state.effective is not None:
            self.state.effective = None
        self._update_status()

    def _update_status(self) -> None:
        self.status_line.update()

    def restart_engine(self) -> None:
        """Stop the engine and start a fresh one; the model it holds is loaded again."""
        self.engine_life.restart()

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
