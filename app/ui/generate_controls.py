"""The Generate page's left column: the form's parameters, which scroll, and what runs a job
below them: Generate and Cancel, the progress bar and the line under it (the step, the time
left, the jobs queued), and the model the next image is made with, or how to load one. It
sends the page's jobs to the engine (with the LoRAs, and the settings' precision and device),
follows them until they end, cancels them, and keeps those the engine's death took."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtGui import QPixmap
from PySide6.QtWidgets import QHBoxLayout, QProgressBar, QPushButton, QVBoxLayout, QWidget

from app.core.generation.records import GenerationRequest
from app.core.lora.request import LoraRequest
from app.core.requests.records import GenerateRequest
from app.engine.events import EngineEvent, EventState
from app.ui import words
from app.ui.engine_client import EngineClient
from app.ui.generate_form import GenerateForm
from app.ui.state import AppState
from app.ui.widgets import label, plain_scroll, primary_button, show_progress


class GenerateControls(QWidget):
    """The form in a scroll, and the buttons, progress and model hint under it. The page
    connects Generate; Cancel cancels every job sent (`jobs`, by id: the request it was sent
    with). `load_demo()` loads the demo model (None: no demo button is offered).

    Signals (GUI thread), for the image side of the page:
    `making(caption)`: a job started; the image shown spoke of the last image, and would read
    as this job's until its first preview, so what is being made is said instead (the last
    image stays in the gallery, and comes back if the job does not end).
    `previewed(pixmap, caption)`: the running job's live preview.
    `ended(event, fix)`: a job's last event, and the fix it was made again with (None: none),
    until its record says."""

    making = Signal(str)
    previewed = Signal(QPixmap, str)
    ended = Signal(object, object)

    def __init__(
        self,
        form: GenerateForm,
        state: AppState,
        client: EngineClient,
        load_demo: Callable[[], None] | None,
    ) -> None:
        super().__init__()
        self.form = form
        self.state = state
        self.client = client
        self._load_demo = load_demo
        self.jobs: dict[int, dict[str, Any]] = {}
        # The fix each job made again with one ran with, by job id, until its record says.
        self.fix_of_job: dict[int, dict[str, Any]] = {}
        # Requests (and the fix each ran with) lost when the engine died under them: offered
        # to run again once it is back.
        self.lost: list[tuple[dict[str, Any], dict[str, Any] | None]] = []
        self.running_job: int | None = None
        self.cancelled_with = 0  # how many queued jobs the last Cancel dropped with the running one
        # When the running job's first counted step came, and which step it was: the ETA.
        self._timing: tuple[float, int] | None = None

        # The parameters scroll up and down when the window is too short for them (an input
        # picture and its mask make them tall), never sideways; what runs the job stays below.
        scroll = plain_scroll(form)
        scroll.setObjectName("generate-form")
        self.setMinimumWidth(330)
        self.setMaximumWidth(480)
        column = QVBoxLayout(self)
        column.setContentsMargins(0, 0, 12, 0)
        column.addWidget(scroll, 1)
        buttons = QHBoxLayout()
        self.generate_button = primary_button("Generate")
        self.generate_button.setToolTip("Ctrl+Enter")
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

    def _demo_clicked(self) -> None:
        if self._load_demo is not None:
            self._load_demo()
        self.show_model_hint()  # the demo is loading

    # The model --------------------------------------------------------------------------------

    def loading_words(self) -> str:
        """'The demo model is loading: Generate works once it is loaded.' while a model
        loads; '' otherwise."""
        request = self.client.pending_request("load")
        if request is None or self.state.model is not None:
            return ""
        from app.core.demo import DEMO_MODELS

        source = str(getattr(request, "source", ""))
        name = "The demo model" if source in DEMO_MODELS else (Path(source).name or "A model")
        return f"{name} is loading: Generate works once it is loaded."

    def show_model_hint(self) -> None:
        """Under Generate: the model loaded, the one loading, or how to load one."""
        model = self.state.model
        loading = self.loading_words()
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

    # Jobs -------------------------------------------------------------------------------------

    def submit(self, request: dict[str, Any], with_fix: dict[str, Any] | None = None) -> int:
        """Queue a generation with the settings as they are now (and, for this job only, the
        fix `with_fix`, which the request carries over them: `GenerateRequest.fix`)."""
        job = GenerateRequest(
            generation=GenerationRequest(**request),
            precision=self.state.precision(),
            device=self.state.device(),
            loras=tuple(LoraRequest(e["path"], e["weight"]) for e in self.form.loras.entries()),
            fix=dict(with_fix or {}),
        )
        job_id = self.client.submit(job, self._on_event)
        self.jobs[job_id] = request
        self.show_cancel()
        self.show_queue()
        return job_id

    def show_cancel(self) -> None:
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

    def show_queue(self) -> None:
        waiting = len(self.jobs) - (1 if self.running_job is not None else 0)
        if self.running_job is None and waiting:
            self.progress.setRange(0, 0)
            self.progress_label.setText("Waiting for the engine…")
        elif waiting > 0:
            base = self.progress_label.text().split(" · ")[0]
            self.progress_label.setText(f"{base} · {waiting} more queued")

    def _on_event(self, event: EngineEvent) -> None:
        state = event.state
        request = self.jobs.get(event.job_id) or {}
        if state == EventState.PROGRESS:
            if self.running_job != event.job_id:
                self.running_job = event.job_id
                self._timing = None
                self.making.emit(f"Making: {request.get('prompt') or 'an image with no prompt'}")
            self._show_step(event)
        elif state == EventState.PREVIEW and event.preview_png:
            pixmap = QPixmap()
            if pixmap.loadFromData(event.preview_png, "PNG"):
                # The caption described the image the preview replaces.
                self.previewed.emit(
                    pixmap,
                    f"Preview at step {event.done}: "
                    f"{request.get('prompt') or 'the image being made'}",
                )
        elif state == EventState.WARNING:
            self.progress_label.setText(event.message)
        elif state.final:
            self._end_job(event)

    def _show_step(self, event: EngineEvent) -> None:
        """The running job's progress: the bar, the stage and step, and the time left once two
        steps have been timed."""
        now = time.monotonic()
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
        self.show_queue()

    def _end_job(self, event: EngineEvent) -> None:
        """A job ended (`event` is its last): it leaves the queue, one the engine's death took
        is kept, and with the last one the bar stops, full when it made its images."""
        request = self.jobs.pop(event.job_id, None)
        applied_fix = self.fix_of_job.pop(event.job_id, None)  # until the record says
        if event.error_type == "EngineDied" and request is not None:
            self.lost.append((request, applied_fix))
        if self.running_job == event.job_id:
            self.running_job = None
        self.show_cancel()
        if not self.jobs:
            self.progress.setRange(0, 1)
            self.progress.setValue(0 if event.state != EventState.RESULT else 1)
        self.ended.emit(event, applied_fix)

    def submit_lost(self) -> list[int]:
        """Submit again what the engine's death took, each with the fix it ran with. Returns
        the new jobs."""
        lost = list(self.lost)
        self.lost.clear()
        jobs = []
        for request, fix in lost:
            job_id = self.submit(request, fix)
            if fix:
                self.fix_of_job[job_id] = dict(fix)
            jobs.append(job_id)
        return jobs

    def lost_caption(self) -> str:
        """'Not finished: a red circle on a blue background' (the newest lost, and how many
        more)."""
        request = self.lost[-1][0] if self.lost else {}
        more = len(self.lost) - 1
        return f"Not finished: {request.get('prompt') or 'an image with no prompt'}" + (
            f" (and {more} more)" if more else ""
        )

    def say_cancelled(self) -> None:
        """The last of the jobs cancelled together ended: say how many went with it."""
        dropped, self.cancelled_with = self.cancelled_with, 0
        self.progress_label.setText(
            "Cancelled."
            if not dropped
            else f"Cancelled, and the {_generations(dropped)} queued after it."
        )


def _generations(count: int) -> str:
    """'generation', or '3 generations'."""
    return "generation" if count == 1 else f"{count} generations"
