"""How the main window builds each page on its first visit: the page's module is imported then,
the page is wired to the window, and it first shows what the state already holds, as it would
had it been built at start and followed every change since."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from PySide6.QtWidgets import QWidget

from app.core.requests.records import PicturePath

if TYPE_CHECKING:
    from app.ui.fixes_view import FixesView
    from app.ui.generate_view import GenerateView
    from app.ui.gpu_view import GpuView
    from app.ui.health_view import HealthView
    from app.ui.main_window import MainWindow
    from app.ui.models_view import ModelsView
    from app.ui.settings_view import SettingsView


def page_builders(window: MainWindow) -> dict[str, Callable[[], QWidget]]:
    """What builds each page of `window`, by the page's name in the navigation."""
    return {
        "Models": lambda: build_models_view(window),
        "Health check": lambda: build_health_view(window),
        "Fixes": lambda: build_fixes_view(window),
        "Generate": lambda: build_generate_view(window),
        "Devices": lambda: build_gpu_view(window),
        "Settings": lambda: build_settings_view(window),
    }


def build_models_view(window: MainWindow) -> ModelsView:
    from app.ui.models_view import ModelsView

    view = ModelsView(window.state, window.client, window.dialogs, window.ui_settings)
    view.explain_image = window.explain_image
    return view


def build_health_view(window: MainWindow) -> HealthView:
    from app.ui.health_view import HealthView

    view = HealthView(window.state, window.client, window.dialogs)
    # The check probes the path the next image takes: with the input picture, if any.
    view.input_pictures = lambda: input_pictures(window)
    if window.state.model is not None:
        view.show_saved_report(window.state.model)
    return view


def input_pictures(window: MainWindow) -> PicturePath:
    """The pictures the Generate page would start its next image from."""
    # No picture can have been chosen on a Generate page never built.
    if not window.page_hosts["Generate"].built:
        return PicturePath()
    return window.generate_view.input_pictures()


def build_fixes_view(window: MainWindow) -> FixesView:
    from app.ui.fixes_view import FixesView

    return FixesView(window.state, window.client, window.dialogs)


def build_generate_view(window: MainWindow) -> GenerateView:
    from app.ui.generate_view import GenerateView

    view = GenerateView(
        window.state, window.client, window.dialogs, window.ui_settings, load_demo=window.load_demo
    )
    view.gallery_view.view_image = window.view_image
    view.status_message.connect(window.say)
    if window.gallery_due:
        view.gallery_view.refresh()
    return view


def build_gpu_view(window: MainWindow) -> GpuView:
    from app.ui.gpu_view import GpuView

    view = GpuView(window.state, window.client, window.dialogs)
    if window.state.hardware is not None:
        view.show_report(window.state.hardware)
    return view


def build_settings_view(window: MainWindow) -> SettingsView:
    from app.ui.settings_view import SettingsView

    return SettingsView(window.state, window.dialogs, request_hardware=window.request_hardware)
