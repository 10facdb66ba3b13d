"""What the main window shows of the engine's life: a banner when the engine stops or stops
answering (with Restart, and the failure's details), and after a restart the model it held
loaded again. The engine client's signals arrive here on the GUI thread."""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject

from app.core.requests.records import LoadRequest
from app.engine.failures import Failure
from app.ui.dialogs import Dialogs
from app.ui.engine_client import EngineClient
from app.ui.state import AppState
from app.ui.widgets import Banner

if TYPE_CHECKING:
    from app.ui.models_view import ModelsView  # the Models page: built when first read


class EngineLife(QObject):
    """Says in `banner` what became of the engine and restarts it. `models_view` gives the
    Models page, which loads the model again once a restarted engine is ready."""

    def __init__(
        self,
        state: AppState,
        client: EngineClient,
        dialogs: Dialogs,
        banner: Banner,
        models_view: Callable[[], ModelsView],
        parent: QObject,
    ) -> None:
        super().__init__(parent)
        self.state = state
        self.client = client
        self.dialogs = dialogs
        self.banner = banner
        self._models_view = models_view
        # The model to load again once the engine is back (the one it held when it stopped).
        self.reload_after_restart: LoadRequest | None = None

    def died(self, failure: Failure) -> None:
        if self.state.model_request is not None:
            self.reload_after_restart = self.state.model_request
        self.state.set_model(None)
        self.banner.show_message(
            "bad",
            f"<b>The engine stopped.</b> {html.escape(failure.message)} The window keeps "
            "running, and every image already saved is kept."
            + (" Restarting loads your model again." if self.reload_after_restart else ""),
            [
                ("Restart engine", self.restart),
                ("Details", lambda: self.dialogs.error(failure.message, failure.details)),
            ],
        )

    def not_answering(self, silence: float) -> None:
        self.banner.show_message(
            "bad",
            f"<b>The engine stopped answering.</b> Nothing has been heard from it for "
            f"{silence:.0f} s: it may be frozen, or paused by another program. Restart it, or "
            "Cancel the job to end it; every image already saved is kept.",
            [("Restart engine", self.restart)],
        )

    def answering(self) -> None:
        self.banner.dismiss()

    def restart(self) -> None:
        """Stop the engine and start a fresh one; the model it holds is loaded again."""
        if self.state.model_request is not None and self.reload_after_restart is None:
            self.reload_after_restart = self.state.model_request
        self.banner.show_message("info", "Restarting the engine…")
        self.client.restart()

    def restarted(self) -> None:
        self.banner.dismiss()
        self.state.set_model(None)
        reload, self.reload_after_restart = self.reload_after_restart, None
        if reload is not None:
            models_view = self._models_view()
            models_view.vae_path = reload.vae
            models_view.load_path(reload.source, reload.allow_pickle)
