"""The Generate page: prompt and parameters (an input picture, mask and strength for
image-to-image and inpainting among them), progress with ETA, live preview, gallery, and a
banner on every image that went NaN or black, with the fix one click away."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from PySide6.QtCore import QSettings, Qt, Signal
from PySide6.QtGui import (
    QKeySequence,
    QPixmap,
    QShortcut,
)
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QListWidgetItem,
    QProgressBar,
    QPushButton,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app.core import paths
from app.core.errors import HalfSafeError
from app.core.files import write_atomic
from app.core.fixing.remembered_fix import RememberedFix
from app.core.generation.records import GenerationRequest, GenerationResult
from app.core.images.pictures import check_strength
from app.core.lora.request import LoraRequest
from app.core.models.summary import ModelSummary
from app.core.requests.records import GenerateRequest, PicturePath
from app.core.settings import FIELDS
from app.core.settings.values import setting_entries
from app.engine.events import EngineEvent, EventState
from app.ui import folders, words
from app.ui.dialogs import Dialogs
from app.ui.engine_client import EngineClient
from app.ui.fixes import (
    apply_fix,
    fix_in_place,
    layers_ran,
    ran_with,
    remember_for_model,
    set_aside_by,
    split_fix,
)
from app.ui.gallery import ENTRY
from app.ui.generate_form import GENERATION_KEYS, GenerateForm
from app.ui.image_entry import GalleryEntry, mode_words
from app.ui.result_banner import Action, Remembered, banner_words, making_again_words
from app.ui.results_pane import ResultsPane, thumbnail
from app.ui.state import AppState
from app.ui.widgets import label, page_layout, plain_scroll, primary_button, show_progress

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
        self.jobs: dict[int, dict[str, Any]] = {}
        self._fix_of_job: dict[int, dict[str, Any]] = {}
        # Requests (and the fix each ran with) lost when the engine died under them: offered
        # to run again once it is back.
        self.lost: list[tuple[dict[str, Any], dict[str, Any] | None]] = []
        self.running_job: int | None = None
        self.cancelled_with = 0  # how many queued jobs the last Cancel dropped with the running one
        self._timing: tuple[float, int] | None = None
        self._job_started = 0.0
        self.last_seed: int | None = None
        self.current_entry: GalleryEntry | None = None
        # Layer lists a repair proved, sent to be remembered for the model, whose answer has
        # not come back yet: the banner says them remembered meanwhile.
        self._remembering: list[dict[str, Any]] = []

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

        # The parameters scroll up and down when the window is too short for them (an input
        # picture and its mask make them tall), never sideways; what runs the job stays below.
        scroll = plain_scroll(form)
        scroll.setObjectName("generate-form")
        outer = QWidget()
        outer.setMinimumWidth(330)
        outer.setMaximumWidth(480)
        column = QVBoxLayout(outer)
        column.setContentsMargins(0, 0, 12, 0)
        column.addWidget(scroll, 1)
        buttons = QHBoxLayout()
        self.generate_button = primary_button("Generate")
        self.generate_button.setToolTip("Ctrl+Enter")
        self.generate_button.clicked.connect(self.generate)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setToolTip("Esc")
        self.cancel_button.clicked.connect(self.cancel)
        self.cancel_button.setEnabled(False)
        buttons.addWidget(self.generate_button, 1)
        buttons.addWidget(self.cancel_button)
        column.addLayout(buttons)
        self.progress = QProgressBar()
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.progress.setTextVisible(False)
        column.addWidget(self.progress)
        self.progress_label = label("", "muted", wrap=True)
        column.addWidget(self.progress_label)
        self.model_hint = label("", "muted", wrap=True)
        column.addWidget(self.model_hint)
        self.demo_button = QPushButton("Load the demo model")
        self.demo_button.clicked.connect(self._demo_clicked)
        column.addWidget(self.demo_button)
        return outer

    def _demo_clicked(self) -> None:
        if self._load_demo is not None:
            self._load_demo()
        self._show_model_hint()  # the demo is loading

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
        self.open_folder_button.clicked.connect(self.open_folder)
        self.save_as_button.clicked.connect(lambda: self.save_entry_as())
        self.gallery.currentItemChanged.connect(self._gallery_selected)
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
        held = model.remembered_fix.settings if model and model.remembered_fix else {}
        self._remembering = [
            own
            for own in self._remembering
            if has_model
            and not all(set(v or ()) <= set(setting_entries(held, k)) for k, v in own.items())
        ]
        if has_model and self.progress_label.text() in (ENGINE_STOPPED, NO_MODEL_YET):
            self.progress_label.setText("")  # the engine is back, with a model
        self.generate_button.setEnabled(has_model)
        self._show_model_hint()
        self.form.model_changed(model)

    def _loading_words(self) -> str:
        """'The demo model is loading: Generate works once it is loaded.' while a model
        loads; '' otherwise."""
        request = self.client.pending_request("load")
        if request is None or self.state.model is not None:
            return ""
        from app.core.demo import DEMO_MODELS

        source = str(getattr(request, "source", ""))
        name = "The demo model" if source in DEMO_MODELS else (Path(source).name or "A model")
        return f"{name} is loading: Generate works once it is loaded."

    def _show_model_hint(self) -> None:
        """Under Generate: the model loaded, the one loading, or how to load one."""
        model = self.state.model
        loading = self._loading_words()
        self.demo_button.setVisible(model is None and not loading and self._load_demo is not None)
        if model is not None:
            self.model_hint.setText(f"Model: {model.name or model.source}")
        elif loading:
            self.model_hint.setText(loading)
        else:
            self.model_hint.setText(
                "No model is loaded. Load one on the Models page, or try the demo model, which "
                "runs anywhere and draws simple coloured shapes."
            )

    def _engine_event(self, event: EngineEvent) -> None:
        """A load's events: the hint says it is loading, and when it ended without a model."""
        if event.kind == "load" and self.state.model is None:
            self._show_model_hint()

    def generate(self) -> None:
        if self.state.model is None:
            self.model_hint.setText(
                self._loading_words() or "Load a model first: generation needs one."
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
        job = GenerateRequest(
            generation=GenerationRequest(**request),
            precision=self.state.precision(),
            device=self.state.device(),
            loras=tuple(LoraRequest(e["path"], e["weight"]) for e in self.loras.entries()),
            fix=dict(with_fix or {}),
        )
        job_id = self.client.submit(job, self._on_event)
        self.jobs[job_id] = request
        self._show_cancel()
        self._show_queue()
        return job_id

    def _show_cancel(self) -> None:
        """Cancel says what it stops: with jobs queued behind the running one, all of them."""
        count = len(self.jobs)
        self.cancel_button.setEnabled(count > 0)
        self.cancel_button.setText("Cancel" if count <= 1 else f"Cancel all {count}")
        self.cancel_button.setToolTip(
            "Stops the generation (Esc)."
            if count <= 1
            else f"Stops the generation and drops the {count - 1} queued after it (Esc)."
        )

    def cancel(self) -> None:
        """Cancel the running generation and any queued after it."""
        if not self.jobs:
            return
        queued = len(self.jobs) - 1
        self.cancelled_with = queued
        self.progress_label.setText(
            "Cancelling…" if queued == 0 else f"Cancelling, with the {_generations(queued)} queued…"
        )
        for job_id in list(self.jobs):
            self.client.cancel(job_id)

    def _show_queue(self) -> None:
        waiting = len(self.jobs) - (1 if self.running_job is not None else 0)
        if self.running_job is None and waiting:
            self.progress.setRange(0, 0)
            self.progress_label.setText("Waiting for the engine…")
        elif waiting > 0:
            base = self.progress_label.text().split(" · ")[0]
            self.progress_label.setText(f"{base} · {waiting} more queued")

    def _on_event(self, event: EngineEvent) -> None:
        state = event.state
        if state == EventState.PROGRESS:
            self._progress(event)
        elif state == EventState.PREVIEW and event.preview_png:
            pixmap = QPixmap()
            if pixmap.loadFromData(event.preview_png, "PNG"):
                # The caption described the image the preview replaces.
                request = self.jobs.get(event.job_id) or {}
                self.results.show_preview(
                    pixmap,
                    f"Preview at step {event.done}: "
                    f"{request.get('prompt') or 'the image being made'}",
                )
        elif state == EventState.WARNING:
            self.progress_label.setText(event.message)
        elif state.final:
            self._job_done(event)

    def _progress(self, event: EngineEvent) -> None:
        now = time.monotonic()
        if self.running_job != event.job_id:
            self.running_job = event.job_id
            self._timing = None
            self._job_started = now
            self._show_making(event.job_id)
        show_progress(self.progress, event.done, event.total)
        if event.total <= 1:
            self.progress_label.setText(f"{event.stage}…" if event.stage else "Working…")
            return
        text = f"{event.stage or 'Step'}: {event.done} of {event.total}"
        if self._timing is None or event.done < self._timing[1]:
            self._timing = (now, event.done)
        else:
            start, first_done = self._timing
            if event.done > first_done:
                per_step = (now - start) / (event.done - first_done)
                left = per_step * (event.total - event.done)
                text += f" · about {words.duration(left)} left"
        self.progress_label.setText(text)
        self._show_queue()

    def _show_making(self, job_id: int) -> None:
        """A job has started: the image, banner and caption shown spoke of the last image, and
        would read as this job's until its first preview; the image being made is said
        instead (the last one stays in the gallery, and comes back if the job does not end)."""
        request = self.jobs.get(job_id) or {}
        self.results.show_making(f"Making: {request.get('prompt') or 'an image with no prompt'}")

    def _job_done(self, event: EngineEvent) -> None:
        request = self.jobs.pop(event.job_id, None)
        applied_fix = self._fix_of_job.pop(event.job_id, None)  # until the record says
        if event.error_type == "EngineDied" and request is not None:
            self.lost.append((request, applied_fix))
        if self.running_job == event.job_id:
            self.running_job = None
        self._show_cancel()
        if not self.jobs:
            self.progress.setRange(0, 1)
            self.progress.setValue(0 if event.state != EventState.RESULT else 1)
        if event.state == EventState.RESULT:
            result = event.result_as(GenerationResult)
            if result.job_fix is not None:  # what ran, as the job's own record says
                applied_fix = dict(result.job_fix.settings)
            _shared, own = split_fix(applied_fix or {})
            images = result.images
            if (
                own
                and images
                and all(i.status == "ok" for i in images)
                and layers_ran(own, result.settings)
            ):
                # Proved: the same image came out finite with it, at the job's precision (a
                # part that ran wholly wider proves nothing of its layers: not remembered).
                from app.core.precision.plan import dtype_settings_of

                proved = dict(own)
                self._remembering.append(proved)

                def not_remembered(event: EngineEvent) -> None:
                    if proved in self._remembering:
                        self._remembering.remove(proved)
                    self._refresh_banner()
                    self.dialogs.job_failed(event)

                remember_for_model(
                    self.state,
                    self.client,
                    own,
                    words.fix_short(own, self.state.components()),
                    "generation",
                    on_failed=not_remembered,
                    made_at=dtype_settings_of(result.settings),
                )
            self.add_result(result, applied_fix)
            self.progress_label.setText(f"Done in {result.seconds:.1f} s.")
        elif event.state == EventState.CANCELLED:
            if not self.jobs:  # the last of those cancelled together
                dropped, self.cancelled_with = self.cancelled_with, 0
                self.progress_label.setText(
                    "Cancelled."
                    if not dropped
                    else f"Cancelled, and the {_generations(dropped)} queued after it."
                )
            self.banner.dismiss()  # it spoke of the image this job was making
            self._show_last()
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
            self.results.show_lost(self._lost_caption())
        elif event.state != EventState.RESULT and event.state != EventState.CANCELLED:
            self._show_last()
        if self.lost and not self.jobs:
            self._offer_lost()
        if self.jobs:
            self._show_queue()

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

    def _lost_caption(self) -> str:
        """'Not finished: a red circle on a blue background' (the newest lost, and how many
        more)."""
        request = self.lost[-1][0] if self.lost else {}
        more = len(self.lost) - 1
        return f"Not finished: {request.get('prompt') or 'an image with no prompt'}" + (
            f" (and {more} more)" if more else ""
        )

    def run_lost_again(self) -> list[int]:
        """Submit again what the engine's death took (with the fix each ran with); while no
        model is loaded, say that the engine must be back first. Returns the new jobs."""
        if self.state.model is None:
            self._say(NO_MODEL_YET)
            return []
        lost, self.lost = self.lost, []
        self.banner.dismiss()
        jobs = []
        for request, fix in lost:
            job_id = self.submit(request, fix)
            if fix:
                self._fix_of_job[job_id] = dict(fix)
            jobs.append(job_id)
        return jobs

    def _show_last(self) -> None:
        """The image shown before the job that did not finish, or the empty page's words."""
        if self.current_entry is not None:
            self.show_entry(self.current_entry)
        else:
            self.results.show_empty()

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
        first_item = None
        for entry in entries:
            item = self.gallery_view.add(entry, thumbnail(entry))
            first_item = first_item or item
        if first_item is not None:
            self.gallery.setCurrentItem(first_item)
        if result.save_error:
            self.dialogs.error(result.save_error)

    def _gallery_selected(self, current: QListWidgetItem | None, _previous: Any) -> None:
        if current is not None:
            self.show_entry(self.gallery_view.full_entry(current))

    def show_entry(self, entry: GalleryEntry) -> None:
        self.current_entry = entry
        self.results.show_image(entry)
        self.last_seed = entry.seed
        self._show_banner(entry)

    def _refresh_banner(self) -> None:
        """Say the shown image's banner again, as the settings and the remembered fix stand
        now; not while a job (or one the engine's death took) has the banner."""
        if self.current_entry is not None and not self.jobs and not self.lost:
            self._show_banner(self.current_entry)

    def _show_banner(self, entry: GalleryEntry) -> None:
        components = self.state.components()
        in_place = (
            fix_in_place(self.state, entry.applied_fix, self._remembering_lists())
            if entry.applied_fix
            else None
        )
        said = banner_words(entry, self._remembered_since(entry), in_place, components)
        if said is None:
            self.banner.dismiss()
            return
        does: dict[Action, Callable[[], object]] = {
            "save_as": lambda: self.save_entry_as(),
            "apply_fix": lambda: self.apply_fix_and_regenerate(entry),
            "make_again": lambda: self.make_again(entry),
            "make_setting": lambda: self.make_fix_the_setting(entry),
        }
        self.banner.show_message(
            said.level, said.text, [(text, does[action]) for text, action in said.actions]
        )

    def apply_fix_and_regenerate(self, entry: GalleryEntry) -> int | None:
        """Make the same image again with the fix the banner names, for this job only: the
        request carries it (`GenerateRequest.fix`), over the settings, the user's own choices
        included, which stay as they are (the result's banner offers to make it the setting).
        A fix remembered for the model since the image was made is that fix. Layer lists that
        come out finite are remembered for the model (`app.ui.fixes`)."""
        remembered = self._remembered_since(entry)
        fix = dict(remembered.settings if remembered is not None else entry.fix or {})
        try:
            for key, value in fix.items():
                FIELDS[key].validate(value)
        except (KeyError, ValueError) as error:
            self.dialogs.error(f"The fix could not be applied: {error}.")
            return None
        # The image's own values over the form's; its seed makes that one image again, from
        # the same input picture and mask when it had them.
        request = {**self.request(), **entry.generate_values(), **entry.picture_values()}
        if entry.seed is not None:
            request["batch"] = 1
        self.banner.show_message(
            "info", making_again_words(fix, remembered, self.state.components())
        )
        job_id = self.submit(request, with_fix=fix)
        self._fix_of_job[job_id] = fix
        return job_id

    def _remembered_since(self, entry: GalleryEntry) -> Remembered | None:
        """The fix remembered for the loaded model when this image did not run with it and it
        is not the image's own: a health check or an edit remembered it after the image was
        made, or the user's own settings set it aside (which of them, as they are now); it is
        the model's proved fix, so the fix button runs it (for that job, over those settings)
        rather than the image's quick suggestion, and the banner names it alone. None when the
        image ran with it (it did not keep this image finite, so the image's fix is what is
        left to try) or there is none."""
        model = self.state.model
        remembered: RememberedFix | None = model.remembered_fix if model is not None else None
        if remembered is None or dict(remembered.settings) == dict(entry.fix or {}):
            return None
        if ran_with(entry.settings, remembered.settings):
            return None
        return Remembered(dict(remembered.settings), set_aside_by(self.state, remembered.settings))

    def _remembering_lists(self) -> dict[str, list[str]]:
        """The layer lists sent to be remembered whose answer has not come back, by kind."""
        lists: dict[str, list[str]] = {}
        for own in self._remembering:
            for key, entries in own.items():
                lists.setdefault(key, []).extend(entries or ())
        return lists

    def make_fix_the_setting(self, entry: GalleryEntry) -> list[str]:
        """Make the fix an image was made again with the user's setting, from the next job on:
        its plain settings set, its layer lists remembered for the model (`fixes.apply_fix`).
        Returns the setting keys that changed."""
        fix = dict(entry.applied_fix or {})
        shared, _own = split_fix(fix)
        if fix_in_place(self.state, fix, self._remembering_lists()).layers_remembered:
            fix = shared  # its layers are remembered for the model already
        summary = words.fix_short(fix, self.state.components())
        try:
            changed = apply_fix(self.state, self.client, fix, summary, self.dialogs.job_failed)
        except ValueError as error:
            self.dialogs.error(f"The fix could not be applied: {error}.")
            return []
        self._refresh_banner()  # the image's banner, as the settings stand now
        return changed

    def make_again(self, entry: GalleryEntry) -> int:
        """Make the same image again with nothing changed: for a NaN that did not come back
        when the failing part ran again (an intermittent kernel or device fault), the cure is
        another run, not a setting."""
        request = {**self.request(), **entry.generate_values(), **entry.picture_values()}
        if entry.seed is not None:
            request["batch"] = 1
        self.banner.show_message("info", "<b>Making the same image again</b>, unchanged…")
        return self.submit(request)

    def save_entry_as(self, path: str | None = None) -> Path | None:
        """Write the shown in-memory image (one no folder could take) to `path`, or to a file
        the user picks. Returns where it went; on failure the error dialog says why."""
        entry = self.current_entry
        if entry is None or not entry.unsaved:
            return None
        if path is None:
            suggested = f"{entry.seed if entry.seed is not None else 'image'}.png"
            path, _filter = QFileDialog.getSaveFileName(
                self, "Save image", str(Path(folders.pictures()) / suggested), "PNG images (*.png)"
            )
            if not path:
                return None
        try:
            saved = write_atomic(Path(path), entry.png or b"", shared=True)
        except (OSError, ValueError) as error:
            reason = getattr(error, "strerror", None) or str(error)
            self.dialogs.error(f"The image could not be saved to {path} ({reason}).")
            return None
        entry = replace(entry, path=str(saved), png=None)
        item = self.gallery.currentItem()
        if item is not None:
            self.gallery_view.set_entry(item, entry)
        self.show_entry(entry)
        return saved

    def reuse_last_seed(self) -> None:
        if self.last_seed is not None:
            self.seed.setText(str(self.last_seed))

    def open_folder(self) -> None:
        if self.current_entry is not None and self.current_entry.path:
            folder = os.path.dirname(self.current_entry.path)
            self.dialogs.open_location(folder, "the folder")


def _generations(count: int) -> str:
    return "generation" if count == 1 else f"{count} generations"
