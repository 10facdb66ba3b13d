"""The Generate page: prompt and parameters (an input picture, mask and strength for
image-to-image and inpainting among them), progress with ETA, live preview, gallery, and a
banner on every image that went NaN or black, with the fix one click away."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from PySide6.QtCore import QSettings, Qt, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import QSplitter, QWidget

from app.core import paths
from app.core.errors import HalfSafeError
from app.core.generation.records import GenerationResult
from app.core.images.pictures import check_strength
from app.core.models.summary import ModelSummary
from app.core.requests.records import PicturePath
from app.engine.events import EngineEvent, EventState
from app.ui import words
from app.ui.dialogs import Dialogs
from app.ui.engine_client import EngineClient
from app.ui.gallery import ENTRY
from app.ui.generate_controls import GenerateControls
from app.ui.generate_fixes import FixOffers
from app.ui.generate_form import GENERATION_KEYS, GenerateForm
from app.ui.image_entry import GalleryEntry, mode_words
from app.ui.results_pane import ResultsPane
from app.ui.shown_image import ShownImage
from app.ui.state import AppState
from app.ui.widgets import page_layout

ENGINE_STOPPED = "The engine stopped."
NO_MODEL_YET = (
    "The engine has no model loaded yet: restart it (the banner at the top of the window), and "
    "your model loads again; then run it again."
)


class GenerateView(QWidget):
    """Submits `generate` jobs and shows their previews and results.

    `status_message(str)` (GUI thread): one sentence for the window's status bar: what the
    last image was made as, or why a job could not start or run (a picture file that cannot
    be read)."""

    status_message = Signal(str)

    def __init__(
        self,
        state: AppState,
        client: EngineClient,
        dialogs: Dialogs,
        ui_settings: QSettings,
        load_demo: Callable[[], None] | None = None,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.state = state
        self.client = client
        self.dialogs = dialogs
        self.ui_settings = ui_settings
        self._load_demo = load_demo

        layout = page_layout(self, "Generate")
        splitter = QSplitter(Qt.Orientation.Horizontal)
        splitter.setChildrenCollapsible(False)
        splitter.addWidget(self._build_form())
        splitter.addWidget(self._build_results())
        splitter.setStretchFactor(0, 0)
        splitter.setStretchFactor(1, 1)
        splitter.setSizes([360, 700])
        layout.addWidget(splitter, 1)

        for sequence in ("Ctrl+Return", "Ctrl+Enter"):
            shortcut = QShortcut(QKeySequence(sequence), self)
            shortcut.setContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
            shortcut.activated.connect(self.generate)
        escape = QShortcut(QKeySequence(Qt.Key.Key_Escape), self)
        escape.setContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
        escape.activated.connect(self.cancel)

        self.form.load_values()
        state.settings_changed.connect(self._settings_changed)
        state.model_changed.connect(self._model_changed)
        # What the banner says of a fix follows the settings and the model's remembered fix.
        state.settings_changed.connect(lambda _keys: self._refresh_banner())
        state.model_changed.connect(lambda _model: self._refresh_banner())
        client.job_event.connect(self._engine_event)
        self._model_changed(state.model)

    # Layout -----------------------------------------------------------------------------------

    def _build_form(self) -> QWidget:
        self.form = form = GenerateForm(self.state, self.ui_settings, self._say)
        # The form's widgets, by the names the page reads them with.
        self.prompt, self.negative = form.prompt, form.negative
        self.steps, self.cfg = form.steps, form.cfg
        self.seed, self.random_seed, self.reuse_seed = form.seed, form.random_seed, form.reuse_seed
        self.width_box, self.height_box = form.width_box, form.height_box
        self.batch, self.scheduler, self.clip_skip = form.batch, form.scheduler, form.clip_skip
        self.hires, self.size_hint = form.hires, form.size_hint
        self.step_cache, self.prompt_cache = form.step_cache, form.prompt_cache
        self.loras, self.pictures = form.loras, form.pictures
        self.reuse_seed.clicked.connect(self.reuse_last_seed)
        self.controls = controls = GenerateControls(form, self.state, self.client, self._load_demo)
        # What runs the jobs, and the jobs, by the names the page reads them with.
        self.generate_button, self.cancel_button = controls.generate_button, controls.cancel_button
        self.progress, self.progress_label = controls.progress, controls.progress_label
        self.model_hint, self.demo_button = controls.model_hint, controls.demo_button
        self.jobs, self.lost, self._fix_of_job = controls.jobs, controls.lost, controls.fix_of_job
        self.generate_button.clicked.connect(self.generate)
        return controls

    def _build_results(self) -> QWidget:
        self.results = results = ResultsPane(
            self.output_folder, self.show_entry, self.use_parameters, self.dialogs
        )
        # The pane's widgets, by the names the page reads them with.
        self.banner, self.image, self.parameters = results.banner, results.image, results.parameters
        self.caption = results.caption
        self.gallery, self.gallery_view = results.gallery, results.gallery_view
        self.open_folder_button = results.open_folder_button
        self.save_as_button = results.save_as_button
        self.fixes = FixOffers(
            self.state,
            self.client,
            self.dialogs,
            self.banner,
            self.request,
            lambda request, fix: self.submit(request, with_fix=fix),
            lambda: self.save_entry_as(),
            self._refresh_banner,
            self._fix_of_job,
        )
        self._remembering = self.fixes.remembering
        self.shown = ShownImage(self, results, self.dialogs, self.fixes.show)
        self.open_folder_button.clicked.connect(self.open_folder)
        self.save_as_button.clicked.connect(lambda: self.save_entry_as())
        self.gallery.currentItemChanged.connect(self.shown.gallery_selected)
        controls = self.controls
        controls.making.connect(results.show_making)
        controls.previewed.connect(results.show_preview)
        controls.ended.connect(self._job_done)
        return results

    # Values -----------------------------------------------------------------------------------

    def output_folder(self) -> Path:
        chosen = self.state.settings["output_folder"]
        return Path(chosen).expanduser() if chosen else paths.default_output_dir()

    def use_parameters(self, request: dict[str, Any]) -> None:
        """Put an image's parameters into the form (the gallery's "Send parameters to
        Generate"); values the form cannot take are left as they are."""
        self.form.use_parameters(request)
        note = request.get("schedule_note")
        self.progress_label.setText(
            "Parameters taken from the image; press Generate."
            + (f" {note}" if isinstance(note, str) and note else "")
        )

    def _settings_changed(self, keys: list[str]) -> None:
        if "output_folder" in keys:
            for row in reversed(range(self.gallery.count())):
                if self.gallery.item(row).data(ENTRY).from_folder:
                    self.gallery.takeItem(row)
            self.gallery_view.refresh()
        if any(key in GENERATION_KEYS for key in keys):
            prompt = self.prompt.toPlainText()
            self.form.load_values()
            self.prompt.setPlainText(prompt)

    def request(self) -> dict[str, Any]:
        """The request the Generate button would send, as GenerationRequest's fields."""
        return self.form.request()

    def input_pictures(self) -> PicturePath:
        """The input picture, mask and inpainting layout the next job would start from (no
        picture: text-to-image), for the health check to probe the same path."""
        return PicturePath(
            tuple(self.pictures.images()), self.pictures.mask_path(), self.pictures.canvas()
        )

    def set_input_picture(self, path: str) -> bool:
        """Start the next images from the picture at `path` (the image viewer's "Use as input
        picture"). Returns whether it was taken; if not, the status bar says why."""
        if not self.pictures.picture_slot.isEnabled():
            self._say(self.pictures.note.text())
            return False
        return self.pictures.picture_slot.take(path)

    def _say(self, sentence: str) -> None:
        """One sentence for the user: under the Generate button and in the status bar."""
        self.progress_label.setText(sentence)
        self.status_message.emit(sentence)

    # Jobs -------------------------------------------------------------------------------------

    def _model_changed(self, model: ModelSummary | None) -> None:
        has_model = model is not None
        self.fixes.model_changed(model)
        if has_model and self.progress_label.text() in (ENGINE_STOPPED, NO_MODEL_YET):
            self.progress_label.setText("")  # the engine is back, with a model
        self.generate_button.setEnabled(has_model)
        self.controls.show_model_hint()
        self.form.model_changed(model)

    def _engine_event(self, event: EngineEvent) -> None:
        """A load's events: the hint says it is loading, and when it ended without a model."""
        if event.kind == "load" and self.state.model is None:
            self.controls.show_model_hint()

    def generate(self) -> None:
        if self.state.model is None:
            self.model_hint.setText(
                self.controls.loading_words() or "Load a model first: generation needs one."
            )
            return
        request = self.request()
        problem = self._picture_problem(request)
        if problem:
            self._say(problem)
            return
        self.form.remember(request)
        self.submit(request)

    def _picture_problem(self, request: dict[str, Any]) -> str:
        """Why this request's picture cannot be made, before it is sent: the loaded model
        does not run the mode, the strength runs no step, or the final picture (the hires
        fix's included) is past HalfSafe's bound. '' when nothing is in the way."""
        mode = self.pictures.mode()
        refusal = self.pictures.refusal(mode)
        if refusal:
            return refusal
        try:
            request["hires"].checked().checked_size(request["width"], request["height"])
            if self.pictures.strength_applies():
                check_strength(request["steps"], request["strength"], mode)
        except HalfSafeError as error:
            return str(error)
        return ""

    def submit(self, request: dict[str, Any], with_fix: dict[str, Any] | None = None) -> int:
        """Queue a generation with the settings as they are now (and, for this job only, the
        fix `with_fix`, which the request carries over them: `GenerateRequest.fix`)."""
        return self.controls.submit(request, with_fix)

    def cancel(self) -> None:
        """Cancel the running generation and any queued after it."""
        self.controls.cancel()

    def _job_done(self, event: EngineEvent, applied_fix: dict[str, Any] | None) -> None:
        """A job ended (`GenerateControls.ended`): its images, or why there are none."""
        if event.state == EventState.RESULT:
            result = event.result_as(GenerationResult)
            if result.job_fix is not None:  # what ran, as the job's own record says
                applied_fix = dict(result.job_fix.settings)
            self.fixes.remember_proved(result, applied_fix)
            self.add_result(result, applied_fix)
            self.progress_label.setText(f"Done in {result.seconds:.1f} s.")
        elif event.state == EventState.CANCELLED:
            if not self.jobs:  # the last of those cancelled together
                self.controls.say_cancelled()
            self.banner.dismiss()  # it spoke of the image this job was making
            self.shown.show_last()
        elif event.error_type == "BadFileError":
            # A picture file that cannot be read: one sentence naming it, no dialog. The model
            # stays loaded; choose another file and generate again.
            self._say(event.message)
        else:
            self.progress_label.setText("The generation did not finish.")
            self.dialogs.job_failed(event)
        if event.error_type == "EngineDied" and self.lost:
            # The banner below speaks of the image the engine took with it: it sits over
            # words saying that image is lost, never over the last finished one.
            self.results.show_lost(self.controls.lost_caption())
        elif event.state != EventState.RESULT and event.state != EventState.CANCELLED:
            self.shown.show_last()
        if self.lost and not self.jobs:
            self._offer_lost()
        if self.jobs:
            self.controls.show_queue()

    def _offer_lost(self) -> None:
        """Say what the engine's death took, with the button that runs it again."""
        count = len(self.lost)
        what = "the image it was making" if count == 1 else f"the {count} generations it had"
        self.progress_label.setText(ENGINE_STOPPED)
        self.banner.show_message(
            "bad",
            f"<b>The engine stopped, and {what} with it.</b> Nothing of "
            f"{'it' if count == 1 else 'them'} was saved. Once the engine has restarted and your "
            "model is loaded again, run "
            f"{'it' if count == 1 else 'them'} again with the same settings.",
            [("Run again", self.run_lost_again)],
        )

    def run_lost_again(self) -> list[int]:
        """Submit again what the engine's death took (with the fix each ran with); while no
        model is loaded, say that the engine must be back first. Returns the new jobs."""
        if self.state.model is None:
            self._say(NO_MODEL_YET)
            return []
        self.banner.dismiss()
        return self.controls.submit_lost()

    # Results ----------------------------------------------------------------------------------

    def add_result(
        self, result: GenerationResult, applied_fix: Mapping[str, Any] | None = None
    ) -> None:
        """Put a finished generation's images into the gallery and show the first one.
        `applied_fix` is the fix this job was made with, after a NaN image. The status bar, the
        gallery and the caption all read each image's one record (`GalleryEntry`)."""
        entries = [GalleryEntry.from_result(image, result, applied_fix) for image in result.images]
        if result.settings:
            model = self.state.model
            parts = model.components if model is not None else ()
            # What the job ran with, and a repair after as a repair: never as if the fix were
            # in place for the next job.
            self.state.set_effective(words.job_ran_words(result, parts))
        if entries:
            self.status_message.emit(f"Last image: {mode_words(entries[0])}.")
        self.shown.add(entries)
        if result.save_error:
            self.dialogs.error(result.save_error)

    @property
    def current_entry(self) -> GalleryEntry | None:
        """The image shown (None: none yet)."""
        return self.shown.current_entry

    def show_entry(self, entry: GalleryEntry) -> None:
        self.shown.show(entry)

    def _refresh_banner(self) -> None:
        """Say the shown image's banner again, as the settings and the remembered fix stand
        now; not while a job (or one the engine's death took) has the banner."""
        if self.current_entry is not None and not self.jobs and not self.lost:
            self.fixes.show(self.current_entry)

    def apply_fix_and_regenerate(self, entry: GalleryEntry) -> int | None:
        """Make the image again with the fix its banner names, for this job only
        (`FixOffers.apply_fix_and_regenerate`)."""
        return self.fixes.apply_fix_and_regenerate(entry)

    def make_fix_the_setting(self, entry: GalleryEntry) -> list[str]:
        """Make the fix an image was made again with the user's setting
        (`FixOffers.make_fix_the_setting`); returns the setting keys that changed."""
        return self.fixes.make_fix_the_setting(entry)

    def make_again(self, entry: GalleryEntry) -> int:
        """Make the same image again with nothing changed (`FixOffers.make_again`)."""
        return self.fixes.make_again(entry)

    def save_entry_as(self, path: str | None = None) -> Path | None:
        """Write the shown in-memory image to `path`, or to a file the user picks
        (`ShownImage.save_as`). Returns where it went."""
        return self.shown.save_as(path)

    def reuse_last_seed(self) -> None:
        if self.shown.last_seed is not None:
            self.seed.setText(str(self.shown.last_seed))

    def open_folder(self) -> None:
        self.shown.open_folder()
