"""The windows the main window opens on an image: an explanation for each image asked about
(File > "Why is this image black?", the viewer's button, an image opened as a model), and the
one image viewer, which sends an image's parameters or the picture itself to the Generate page.
Their modules are imported when the first one opens."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtWidgets import QFileDialog

from app.ui import folders

if TYPE_CHECKING:
    from app.ui.explain_view import ExplainDialog
    from app.ui.image_entry import GalleryEntry
    from app.ui.image_viewer import ImageViewer, Place, Step
    from app.ui.main_window import MainWindow


class ImageWindows:
    """The explanations open in `window` (each non-modal, running its own `explain` job, and
    forgotten when closed) and its image viewer (built on first use, then reused)."""

    def __init__(self, window: MainWindow) -> None:
        self.window = window
        self.explain_dialogs: list[ExplainDialog] = []
        self.image_viewer: ImageViewer | None = None

    def open_image(self) -> None:
        """Ask for an image, from the pictures folder, and explain it."""
        path, _ = QFileDialog.getOpenFileName(
            self.window,
            "Why is this image black?",
            folders.pictures(),
            "Images (*.png *.jpg *.jpeg *.webp);;All files (*)",
        )
        if path:
            self.explain_image(path)

    def explain_image(self, path: str) -> ExplainDialog:
        """Open the explanation of an image (a non-modal dialog that runs the `explain` job)."""
        from app.ui.explain_view import ExplainDialog

        window = self.window
        dialog = ExplainDialog(
            path,
            window.client,
            window.dialogs,
            window.state.device(),
            window,
            add_model_folder=self.add_model_folder,
            loaded=self._loaded_model(),
        )
        self.explain_dialogs.append(dialog)
        dialog.finished.connect(lambda _result, d=dialog: self._explain_closed(d))
        dialog.show()
        return dialog

    def _loaded_model(self) -> tuple[str, str] | None:
        """The model the engine holds, as (source, name in words), or None."""
        model, request = self.window.state.model, self.window.state.model_request
        if model is None or request is None:
            return None
        return request.source, model.name or Path(request.source).name

    def add_model_folder(self, folder: str) -> None:
        """Add `folder` to the model folders (kept after the ones already there); the Models
        page rescans, and an explanation looks there from its next job on."""
        state = self.window.state
        model_folders = list(state.settings["model_folders"])
        if folder not in model_folders:
            try:
                state.apply({"model_folders": [*model_folders, folder]})
            except ValueError as error:
                self.window.dialogs.error(f"{folder}: {error}")

    def _explain_closed(self, dialog: ExplainDialog) -> None:
        if dialog in self.explain_dialogs:
            self.explain_dialogs.remove(dialog)
        dialog.deleteLater()

    def view_image(
        self, source: GalleryEntry | str, step: Step | None = None, place: Place | None = None
    ) -> ImageViewer:
        """Show an image large with its parameters (one viewer, non-modal, reused)."""
        if self.image_viewer is None:
            from app.ui.image_viewer import ImageViewer

            self.image_viewer = ImageViewer(
                self.window.dialogs,
                self._send_to_generate,
                self.explain_image,
                self.window,
                use_as_input=self._use_as_input,
            )
        self.image_viewer.show_image(source, step, place)
        return self.image_viewer

    def _send_to_generate(self, values: dict[str, Any]) -> None:
        self.window.generate_view.use_parameters(values)
        self.window.show_page("Generate")

    def _use_as_input(self, path: str) -> bool:
        self.window.show_page("Generate")
        return self.window.generate_view.set_input_picture(path)
