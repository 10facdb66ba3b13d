"""The Generate page: prompt and parameters (an input picture, mask and strength for
image-to-image and inpainting among them), progress with ETA, live preview, gallery, and a
banner on every image that went NaN or black, with the fix one click away."""

from __future__ import annotations

import contextlib
import html
import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from PySide6.QtCore import QSettings, QSize, Qt, Signal
from PySide6.QtGui import (
    QIcon,
    QKeySequence,
    QPixmap,
    QShortcut,
)
from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QFrame,
    QHBoxLayout,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QSizePolicy,
    QSpinBox,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app.core import paths
from app.core.errors import HalfSafeError
from app.core.files import write_atomic
from app.core.generation.records import GenerationRequest, GenerationResult
from app.core.hires import Hires
from app.core.images.pictures import check_strength, picture_size
from app.core.lora.request import LoraRequest
from app.core.models.summary import ModelSummary
from app.core.requests.records import GenerateRequest, PicturePath
from app.core.settings import FIELDS, PrecisionSettings
from app.engine.events import EngineEvent, EventState
from app.ui import browser, folders, words
from app.ui.dialogs import Dialogs
from app.ui.engine_client import EngineClient
from app.ui.fixes import layers_ran, remember_for_model, split_fix
from app.ui.gallery import ENTRY, Gallery
from app.ui.hires_options import HiresOptions
from app.ui.image_entry import (
    THUMBNAIL,
    CaptionBox,
    GalleryEntry,
    ImageView,
    entry_pixmap,
    mode_words,
    parameter_text,
    placeholder_icon,
    where_words,
)
from app.ui.input_pictures import InputPictures
from app.ui.lora_list import LoraList
from app.ui.state import AppState
from app.ui.widgets import Banner, label, page_layout, plain_scroll, primary_button, show_progress

GENERATION_KEYS = (
    "negative_prompt",
    "steps",
    "cfg",
    "seed",
    "width",
    "height",
    "batch",
    "scheduler",
    "clip_skip",
    "hires_scale",
    "hires_steps",
    "hires_denoise",
    "hires_upscaler",
)


# What the image area says while there is no image to show.
EMPTY_WORDS = "Your images appear here, with a live preview while they are made."


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
        self._size_by_user = False  # the user set the size: an input picture leaves it alone
        self._sizing = False  # the page itself is setting the size

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

        self._load_values()
        state.settings_changed.connect(self._settings_changed)
        self._sized_for: str | None = None  # the model whose native size the form was set to
        state.model_changed.connect(self._model_changed)
        self._model_changed(state.model)

    # Layout -----------------------------------------------------------------------------------

    def _build_form(self) -> QWidget:
        form_widget = QWidget()
        column = QVBoxLayout(form_widget)
        column.setContentsMargins(0, 0, 8, 0)
        column.addWidget(label("Prompt"))
        self.prompt = QPlainTextEdit()
        self.prompt.setPlaceholderText("What to draw, e.g. a lighthouse on a cliff at dusk")
        self.prompt.setTabChangesFocus(True)
        self.prompt.setMinimumHeight(70)
        self.prompt.setMaximumHeight(150)
        column.addWidget(self.prompt, 2)
        column.addWidget(label("Negative prompt"))
        self.negative = QPlainTextEdit()
        self.negative.setPlaceholderText("What to leave out, e.g. blurry, text")
        self.negative.setTabChangesFocus(True)
        self.negative.setMinimumHeight(46)
        self.negative.setMaximumHeight(90)
        column.addWidget(self.negative, 1)
        form = QFormLayout()
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        self.steps = QSpinBox()
        self.steps.setRange(*(int(b) for b in FIELDS["steps"].bounds()))
        self.cfg = QDoubleSpinBox()
        self.cfg.setRange(*FIELDS["cfg"].bounds())
        self.cfg.setDecimals(1)
        self.cfg.setSingleStep(0.5)
        self.seed = QLineEdit()
        self.seed.setToolTip("-1 picks a new random seed for every image.")
        seed_row = QHBoxLayout()
        seed_row.addWidget(self.seed, 1)
        self.random_seed = QPushButton("Random")
        self.random_seed.setToolTip("Use a new random seed for every run (-1).")
        self.random_seed.clicked.connect(lambda: self.seed.setText("-1"))
        self.reuse_seed = QPushButton("Reuse last")
        self.reuse_seed.setToolTip("Use the seed of the image shown.")
        self.reuse_seed.clicked.connect(self.reuse_last_seed)
        seed_row.addWidget(self.random_seed)
        seed_row.addWidget(self.reuse_seed)
        size_row = QHBoxLayout()
        self.width_box = QSpinBox()
        self.height_box = QSpinBox()
        for box, key in ((self.width_box, "width"), (self.height_box, "height")):
            box.setRange(*(int(b) for b in FIELDS[key].bounds()))
            box.setSingleStep(64)
            box.setSuffix(" px")
            box.setKeyboardTracking(False)
            box.valueChanged.connect(self._size_edited)
        size_row.addWidget(self.width_box, 1)
        size_row.addWidget(label("×"))
        size_row.addWidget(self.height_box, 1)
        self.batch = QSpinBox()
        self.batch.setRange(*(int(b) for b in FIELDS["batch"].bounds()))
        self.scheduler = QComboBox()
        for choice in FIELDS["scheduler"].choices:
            self.scheduler.addItem(words.choice_name(choice), choice)
        form.addRow("Steps", self.steps)
        form.addRow("CFG scale", self.cfg)
        form.addRow("Seed", seed_row)
        form.addRow("Size", size_row)
        form.addRow("Batch", self.batch)
        form.addRow("Sampler", self.scheduler)
        self.clip_skip = QSpinBox()
        self.clip_skip.setRange(*(int(b) for b in FIELDS["clip_skip"].bounds()))
        form.addRow("Clip skip", self.clip_skip)
        for key, widget in (
            ("steps", self.steps),
            ("cfg", self.cfg),
            ("seed", self.seed),
            ("batch", self.batch),
            ("scheduler", self.scheduler),
            ("width", self.width_box),
            ("height", self.height_box),
            ("clip_skip", self.clip_skip),
        ):
            widget.setToolTip(FIELDS[key].help)
        column.addLayout(form)
        self.hires = HiresOptions()
        column.addWidget(self.hires)
        self.size_hint = label("", "muted", wrap=True)
        self.size_hint.setOpenExternalLinks(False)
        self.size_hint.linkActivated.connect(self._use_native_size)
        column.addWidget(self.size_hint)
        # The numbers every job needs sit right below the prompts, where a 700 px window still
        # shows them; the LoRAs and the input picture, which grow, come after.
        column.addWidget(label("LoRAs"))
        self.loras = LoraList()
        # The browser looks in the model folders, opens on the loaded model's family, and puts
        # a LoRA's trigger words into the prompt when asked to.
        self.loras.add_to_prompt.connect(self._add_to_prompt)
        self.loras.model_folders = lambda: list(self.state.settings["model_folders"])
        self.loras.model_family = lambda: (
            browser.family_words(self.state.model.architecture) if self.state.model else None
        )
        column.addWidget(self.loras)
        self.pictures = InputPictures()
        self.pictures.picture_changed.connect(self._picture_changed)
        self.pictures.canvas_changed.connect(self._canvas_changed)
        self.pictures.refused.connect(self._say)
        column.addWidget(self.pictures)

        column.addStretch(1)

        # The parameters scroll up and down when the window is too short for them (an input
        # picture and its mask make them tall), never sideways; what runs the job stays below.
        scroll = plain_scroll(form_widget)
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
        self.demo_button.clicked.connect(lambda: self._load_demo and self._load_demo())
        column.addWidget(self.demo_button)
        return outer

    def _build_results(self) -> QWidget:
        results = QSplitter(Qt.Orientation.Vertical)
        results.setChildrenCollapsible(False)
        viewer = QWidget()
        column = QVBoxLayout(viewer)
        column.setContentsMargins(12, 0, 0, 0)
        self.banner = Banner()
        column.addWidget(self.banner)
        self.image = ImageView()
        self.image.set_pixmap(None, EMPTY_WORDS)
        column.addWidget(self.image, 1)
        self.parameters = label("", "muted", wrap=True, selectable=True)
        self.parameters.setTextFormat(Qt.TextFormat.PlainText)
        self.parameters.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        # The caption scrolls inside a box of its own: long parameters never run into the image.
        caption = CaptionBox()
        plain_scroll(self.parameters, caption)
        caption.setMinimumHeight(48)
        caption.setMaximumHeight(self.parameters.fontMetrics().lineSpacing() * 7 + 8)
        caption.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.caption = caption
        column.addWidget(caption)
        actions = QHBoxLayout()
        self.open_folder_button = QPushButton("Open folder")
        self.open_folder_button.clicked.connect(self.open_folder)
        self.open_folder_button.setEnabled(False)
        actions.addWidget(self.open_folder_button)
        self.save_as_button = QPushButton("Save as…")
        self.save_as_button.setToolTip("Save this image, which is only in memory, to a file.")
        self.save_as_button.clicked.connect(lambda: self.save_entry_as())
        self.save_as_button.setVisible(False)
        actions.addWidget(self.save_as_button)
        actions.addStretch(1)
        column.addLayout(actions)
        results.addWidget(viewer)

        gallery_box = QFrame()
        gallery_layout = QVBoxLayout(gallery_box)
        gallery_layout.setContentsMargins(12, 4, 0, 0)
        gallery_layout.addWidget(label("Gallery", "muted"))
        self.gallery = QListWidget()
        self.gallery.setViewMode(QListWidget.ViewMode.IconMode)
        self.gallery.setFlow(QListWidget.Flow.LeftToRight)
        self.gallery.setWrapping(False)
        self.gallery.setMovement(QListWidget.Movement.Static)
        self.gallery.setIconSize(QSize(THUMBNAIL, THUMBNAIL))
        self.gallery.setGridSize(QSize(THUMBNAIL + 24, THUMBNAIL + 36))
        self.gallery.setMinimumHeight(THUMBNAIL + 48)
        self.gallery.setMaximumHeight(THUMBNAIL + 64)
        self.gallery.currentItemChanged.connect(self._gallery_selected)
        gallery_layout.addWidget(self.gallery)
        self.gallery_view = Gallery(
            self.gallery,
            THUMBNAIL,
            output_folder=self.output_folder,
            show_entry=self.show_entry,
            use_parameters=self.use_parameters,
            dialogs=self.dialogs,
            placeholder=placeholder_icon,
        )
        results.addWidget(gallery_box)
        results.setStretchFactor(0, 1)
        results.setStretchFactor(1, 0)
        return results

    # Values -----------------------------------------------------------------------------------

    def _load_values(self) -> None:
        settings = self.state.settings
        self.prompt.setPlainText(str(self.ui_settings.value("generate/prompt", "")))
        with contextlib.suppress(TypeError, ValueError):
            self.loras.set_entries(json.loads(str(self.ui_settings.value("generate/loras", "[]"))))
        self.negative.setPlainText(settings["negative_prompt"])
        self.steps.setValue(settings["steps"])
        self.cfg.setValue(settings["cfg"])
        self.seed.setText(str(settings["seed"]))
        self._set_size(settings["width"], settings["height"])
        self.batch.setValue(settings["batch"])
        self.scheduler.setCurrentIndex(max(0, self.scheduler.findData(settings["scheduler"])))
        self.clip_skip.setValue(settings["clip_skip"])
        self.hires.set_value(
            Hires(
                settings["hires_scale"],
                settings["hires_steps"],
                settings["hires_denoise"],
                settings["hires_upscaler"],
            )
        )

    def output_folder(self) -> Path:
        chosen = self.state.settings["output_folder"]
        return Path(chosen).expanduser() if chosen else paths.default_output_dir()

    def use_parameters(self, request: dict[str, Any]) -> None:
        """Put an image's parameters into the form (the gallery's "Send parameters to
        Generate"); values the form cannot take are left as they are."""
        if "prompt" in request:
            self.prompt.setPlainText(str(request["prompt"]))
        if "negative_prompt" in request:
            self.negative.setPlainText(str(request["negative_prompt"]))
        for key, box in (
            ("steps", self.steps),
            ("width", self.width_box),
            ("height", self.height_box),
        ):
            if isinstance(request.get(key), int):
                box.setValue(request[key])  # the image's size: the user's choice, kept
        for key, spin in (("cfg", self.cfg), ("strength", self.pictures.strength)):
            if isinstance(request.get(key), (int, float)):
                spin.setValue(float(request[key]))
        if request.get("seed") is not None:
            self.seed.setText(str(request["seed"]))
        index = self.scheduler.findData(request.get("scheduler"))
        if index >= 0:
            self.scheduler.setCurrentIndex(index)
        # An image without a clip skip or a hires fix recorded was made without one.
        clip_skip = request.get("clip_skip")
        self.clip_skip.setValue(clip_skip if isinstance(clip_skip, int) else 1)
        recorded = request.get("hires")
        self.hires.set_value(recorded if isinstance(recorded, Hires) else Hires())
        self.progress_label.setText("Parameters taken from the image; press Generate.")

    def _settings_changed(self, keys: list[str]) -> None:
        if "output_folder" in keys:
            for row in reversed(range(self.gallery.count())):
                if self.gallery.item(row).data(ENTRY).from_folder:
                    self.gallery.takeItem(row)
            self.gallery_view.refresh()
        if any(key in GENERATION_KEYS for key in keys):
            prompt = self.prompt.toPlainText()
            self._load_values()
            self.prompt.setPlainText(prompt)

    def request(self) -> dict[str, Any]:
        """The request the Generate button would send, as GenerationRequest's fields."""
        seed_text = self.seed.text().strip()
        try:
            seed = int(seed_text)
        except ValueError:
            seed = -1
        output = self.state.settings["output_folder"] or None
        return {
            "prompt": self.prompt.toPlainText().strip(),
            "negative_prompt": self.negative.toPlainText().strip(),
            "steps": self.steps.value(),
            "cfg": round(self.cfg.value(), 1),
            "seed": seed,
            "width": _multiple_of_8(self.width_box.value()),
            "height": _multiple_of_8(self.height_box.value()),
            "batch": self.batch.value(),
            "scheduler": self.scheduler.currentData(),
            "clip_skip": self.clip_skip.value() if self.clip_skip.isEnabled() else 1,
            "hires": self.hires.value(),
            "output_dir": output,
            "images": self.pictures.images(),
            "mask": self.pictures.mask_path(),
            "strength": self.pictures.strength_value(),
            "canvas": self.pictures.canvas(),
        }

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

    def _add_to_prompt(self, words_: str) -> None:
        """Append a LoRA's trigger words to the prompt, after a comma."""
        prompt = self.prompt.toPlainText().strip()
        self.prompt.setPlainText(", ".join(part for part in (prompt, words_) if part))

    def _clip_skip_for(self, architecture: str | None) -> None:
        """Clip skip only where the model reads CLIP's hidden states (SD 1.x/2.x, SDXL)."""
        from app.core.families.registry import family_of_architecture

        family = family_of_architecture(architecture or "")
        takes = family is None or family.takes_clip_skip
        self.clip_skip.setEnabled(takes)
        self.clip_skip.setToolTip(
            FIELDS["clip_skip"].help
            if takes
            else f"{family.title if family else 'This model'} reads its prompt without CLIP's "
            "layers: Clip skip does not apply."
        )

    def _say(self, sentence: str) -> None:
        """One sentence for the user: under the Generate button and in the status bar."""
        self.progress_label.setText(sentence)
        self.status_message.emit(sentence)

    # Size -------------------------------------------------------------------------------------

    def _set_size(self, width: int, height: int) -> None:
        """Set the size as the page's own choice (not the user's)."""
        self._sizing = True
        try:
            self.width_box.setValue(width)
            self.height_box.setValue(height)
        finally:
            self._sizing = False

    def _size_edited(self, _value: int) -> None:
        self.hires.set_first_size(self.width_box.value(), self.height_box.value())
        if not self._sizing:
            self._size_by_user = True

    def _picture_changed(self, path: str) -> None:
        """A new input picture: the size follows its proportions, at the model's size, unless
        the user set the size."""
        if not path or self._size_by_user:
            return
        self._follow_picture(path)

    def _canvas_changed(self) -> None:
        """The canvas extended or not: the size follows the picture as extended."""
        images = self.pictures.images()
        if images and not self._size_by_user:
            self._follow_picture(images[0])

    def _follow_picture(self, path: str) -> None:
        model = self.state.model
        native = model.native_size if model is not None and model.native_size > 0 else 0
        native = native or max(self.width_box.value(), self.height_box.value())
        try:
            width, height = picture_size(path, native, extend=self.pictures.canvas().extend)
        except HalfSafeError as error:
            self._say(str(error))
            return
        self._set_size(width, height)
        self.size_hint.setText(
            f"Size set to {width}×{height} px: the input picture's proportions at "
            + (f"this model's {native} px." if model is not None else f"{native} px.")
        )

    def _remember(self, request: dict[str, Any]) -> None:
        """Last-used values persist: the prompt in the window state, the rest as settings."""
        self.ui_settings.setValue("generate/prompt", request["prompt"])
        self.ui_settings.setValue("generate/loras", json.dumps(self.loras.entries()))
        chosen = request["hires"]
        values = {
            **{key: request[key] for key in GENERATION_KEYS if key in request},
            "clip_skip": self.clip_skip.value(),
            "hires_scale": chosen.scale,
            "hires_steps": chosen.steps,
            "hires_denoise": chosen.denoise,
            "hires_upscaler": chosen.upscaler,
        }
        try:
            FIELDS["seed"].validate(values["seed"])
        except ValueError:
            values.pop("seed")
        # A value out of the schema's range is still used for this run, just not saved.
        with contextlib.suppress(ValueError):
            self.state.apply(values)

    # Jobs -------------------------------------------------------------------------------------

    def _model_changed(self, model: ModelSummary | None) -> None:
        has_model = model is not None
        self.generate_button.setEnabled(has_model)
        self.demo_button.setVisible(not has_model and self._load_demo is not None)
        if not has_model:
            self.model_hint.setText(
                "No model is loaded. Load one on the Models page, or try "
                "the demo model, which runs anywhere and draws simple coloured "
                "shapes."
            )
            self.size_hint.setText("")
            self.pictures.set_model(None)
            return
        self.model_hint.setText(f"Model: {model.name or model.source}")
        self.pictures.set_model(model)
        self._clip_skip_for(model.architecture)
        native = model.native_size
        source = self.state.model_request.source if self.state.model_request else model.source
        if native > 0 and source != self._sized_for:
            # A newly loaded model starts at the size it was made for (a 128 px model asked
            # for 512 px draws badly, slowly); the user's own change afterwards stands.
            self._sized_for = source
            self._size_by_user = False
            self._set_size(native, native)
            self.size_hint.setText(
                f"Size set to {native}×{native} px, what this model was made for."
            )
            if self.pictures.images():
                self._follow_picture(self.pictures.images()[0])
        elif self.pictures.images() and not self._size_by_user:
            return  # the size follows the input picture, and its hint says so
        elif (
            isinstance(native, int)
            and native > 0
            and (self.width_box.value(), self.height_box.value()) != (native, native)
        ):
            self.size_hint.setText(
                f"This model was made for {native}×{native} px. "
                f"<a href='{native}'>Use {native}×{native}</a>"
            )
        else:
            self.size_hint.setText("")

    def _use_native_size(self, link: str) -> None:
        self.width_box.setValue(int(link))
        self.height_box.setValue(int(link))
        self.size_hint.setText("")

    def generate(self) -> None:
        if self.state.model is None:
            self.model_hint.setText("Load a model first: generation needs one.")
            return
        request = self.request()
        problem = self._picture_problem(request)
        if problem:
            self._say(problem)
            return
        self._remember(request)
        self.submit(request)

    def _picture_problem(self, request: dict[str, Any]) -> str:
        """Why this request's picture mode cannot run, before it is sent: the loaded model
        does not run the mode, or the strength runs no step. '' when nothing is in the way."""
        mode = self.pictures.mode()
        refusal = self.pictures.refusal(mode)
        if refusal:
            return refusal
        try:
            if self.pictures.strength_applies():
                check_strength(request["steps"], request["strength"], mode)
        except HalfSafeError as error:
            return str(error)
        return ""

    def submit(self, request: dict[str, Any], with_fix: dict[str, Any] | None = None) -> int:
        """Queue a generation with the settings as they are now (and, for this job only, the
        fix settings `with_fix`)."""
        precision = self.state.precision()
        if with_fix:
            precision = PrecisionSettings.from_mapping({**precision.to_dict(), **with_fix})
        job = GenerateRequest(
            generation=GenerationRequest(**request),
            precision=precision,
            device=self.state.device(),
            loras=tuple(LoraRequest(e["path"], e["weight"]) for e in self.loras.entries()),
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
                self.image.set_pixmap(pixmap)
                self.banner.dismiss()
                # The caption described the image the preview replaces.
                request = self.jobs.get(event.job_id) or {}
                self.parameters.setText(
                    f"Preview at step {event.done}: "
                    f"{request.get('prompt') or 'the image being made'}"
                )
                self.caption.text_changed()
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
        self.banner.dismiss()
        self.image.set_pixmap(None, "Making the image: a preview appears after a few steps.")
        request = self.jobs.get(job_id) or {}
        self.parameters.setText(f"Making: {request.get('prompt') or 'an image with no prompt'}")
        self.caption.text_changed()

    def _job_done(self, event: EngineEvent) -> None:
        request = self.jobs.pop(event.job_id, None)
        applied_fix = self._fix_of_job.pop(event.job_id, None)
        if event.error_type == "EngineDied" and request is not None:
            self.lost.append((request, applied_fix))
        if self.running_job == event.job_id:
            self.running_job = None
        self._show_cancel()
        if not self.jobs:
            self.progress.setRange(0, 1)
            self.progress.setValue(0 if event.state != EventState.RESULT else 1)
        if event.state == EventState.RESULT:
            result: GenerationResult = event.result
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

                remember_for_model(
                    self.state,
                    self.client,
                    own,
                    words.fix_short(own),
                    "generation",
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
        if event.state != EventState.RESULT and event.state != EventState.CANCELLED:
            self._show_last()
        if self.lost and not self.jobs:
            self._offer_lost()
        if self.jobs:
            self._show_queue()

    def _offer_lost(self) -> None:
        """Say what the engine's death took, with the button that runs it again."""
        count = len(self.lost)
        what = "the image it was making" if count == 1 else f"the {count} generations it had"
        self.progress_label.setText("The engine stopped.")
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
            self._say(
                "The engine has no model loaded yet: restart it (the banner at the top of the "
                "window), and your model loads again; then run it again."
            )
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
            self.image.set_pixmap(None, EMPTY_WORDS)
            self.parameters.setText("")
            self.caption.text_changed()

    # Results ----------------------------------------------------------------------------------

    def add_result(
        self, result: GenerationResult, applied_fix: Mapping[str, Any] | None = None
    ) -> None:
        """Put a finished generation's images into the gallery and show the first one.
        `applied_fix` is the fix this job was made with, after a NaN image. The status bar, the
        gallery and the caption all read each image's one record (`GalleryEntry`)."""
        entries = [GalleryEntry.from_result(image, result, applied_fix) for image in result.images]
        # Each image carries what it was made with: a repaired one differs from the job's plan.
        shown = (entries[0].settings if entries else None) or result.settings
        if shown:
            model = self.state.model
            parts = model.components if model is not None else ()
            self.state.set_effective(words.precision_summary(shown, parts=parts))
        if entries:
            self.status_message.emit(f"Last image: {mode_words(entries[0])}.")
        first_item = None
        for entry in entries:
            item = self.gallery_view.add(entry, self._thumbnail(entry))
            first_item = first_item or item
        if first_item is not None:
            self.gallery.setCurrentItem(first_item)
        if result.save_error:
            self.dialogs.error(result.save_error)

    def _thumbnail(self, entry: GalleryEntry) -> QIcon:
        pixmap = entry_pixmap(entry)
        if pixmap.isNull():
            pixmap = QPixmap(THUMBNAIL, THUMBNAIL)
            pixmap.fill(Qt.GlobalColor.darkGray)
        else:
            pixmap = pixmap.scaled(
                THUMBNAIL,
                THUMBNAIL,
                Qt.AspectRatioMode.KeepAspectRatio,
                Qt.TransformationMode.SmoothTransformation,
            )
        return QIcon(pixmap)

    def _gallery_selected(self, current: QListWidgetItem | None, _previous: Any) -> None:
        if current is not None:
            self.show_entry(self.gallery_view.full_entry(current))

    def show_entry(self, entry: GalleryEntry) -> None:
        self.current_entry = entry
        pixmap = entry_pixmap(entry)
        self.image.set_pixmap(
            pixmap if not pixmap.isNull() else None,
            entry.problem or f"The image file is missing: {entry.path}",
        )
        self.parameters.setText(parameter_text(entry))
        self.caption.text_changed()
        self.open_folder_button.setEnabled(bool(entry.path))
        self.save_as_button.setVisible(entry.unsaved)
        self.last_seed = entry.seed
        self._show_banner(entry)

    def _show_banner(self, entry: GalleryEntry) -> None:
        if entry.unsaved:
            # Above any diagnosis: this image is lost when the window closes unless saved.
            self.banner.show_message(
                "bad",
                "<b>Not saved: this image is only in memory.</b> Save it before closing "
                "HalfSafe; the error said why it could not be written.",
                [("Save as…", lambda: self.save_entry_as())],
            )
            return
        status = entry.status
        message = html.escape(entry.message)
        fix = entry.fix
        actions = []
        intermittent = status == "nan" and entry.cause == "intermittent"
        if fix and status in ("nan", "black"):
            actions.append(
                ("Apply fix and regenerate", lambda e=entry: self.apply_fix_and_regenerate(e))
            )
        elif intermittent:
            actions.append(("Make it again", lambda e=entry: self.make_again(e)))
        where = where_words(entry)
        if status == "nan":
            head = f"NaN{where}." if where else "This image went NaN (black)."
            hint = (
                ""
                if fix or intermittent
                else " Run the health check to find which setting fixes it."
            )
            self.banner.show_message("bad", f"<b>{head}</b> {message}{html.escape(hint)}", actions)
        elif status == "black":
            head = f"Completely black{where}." if where else "This image is completely black."
            self.banner.show_message("warn", f"<b>{head}</b> {message}", actions)
        elif status == "safety_checker":
            self.banner.show_message(
                "warn", "<b>The safety checker blanked this image.</b> " + message, actions
            )
        elif status == "fixed":
            applied = ", ".join(entry.fixes_applied)
            self.banner.show_message(
                "info",
                "<b>Fixed automatically.</b> "
                + message
                + (f" Fix applied: {html.escape(applied)}." if applied else ""),
            )
        elif entry.applied_fix:
            self.banner.show_message(
                "good",
                "<b>Fixed.</b> Made again with the fix ("
                + html.escape(words.first_lower(words.fix_short(dict(entry.applied_fix))))
                # What ran, fixes remembered for the model included, from the image's record.
                + f"), running as {html.escape(words.precision_summary(entry.settings))}"
                + "; this time every value stayed finite. "
                + _remembered_words(split_fix(dict(entry.applied_fix))[1], entry.settings),
            )
        else:
            self.banner.dismiss()

    def apply_fix_and_regenerate(self, entry: GalleryEntry) -> int | None:
        """Make the same image again with the image's fix. Its plain settings are written into
        the settings; its layer lists (that model's alone: `app.ui.fixes`) run with this job
        only, and are remembered for the model once the image comes out finite with them."""
        fix = dict(entry.fix or {})
        shared, own = split_fix(fix)
        try:
            for key, value in own.items():
                FIELDS[key].validate(value)
            self.state.apply(shared)
        except ValueError as error:
            self.dialogs.error(f"The fix could not be applied: {error}.")
            return None
        # The image's own values over the form's; its seed makes that one image again, from
        # the same input picture and mask when it had them.
        request = {**self.request(), **entry.generate_values(), **entry.picture_values()}
        if entry.seed is not None:
            request["batch"] = 1
        self.banner.show_message(
            "info",
            "<b>Fix applied:</b> "
            + html.escape(words.fix_short(fix))
            + ". Making the same image again…",
        )
        job_id = self.submit(request, with_fix=own)
        self._fix_of_job[job_id] = dict(fix)
        return job_id

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


def _remembered_words(own: dict[str, Any], settings: Mapping[str, Any]) -> str:
    """What became of a fix the image was made again with: its layer lists remembered for the
    model when the job ran them (`fixes.layers_ran`), else why not."""
    if not own:
        return "The fix stays in your settings."
    if layers_ran(own, settings):
        return "The fix is remembered for this model on this device."
    return (
        "Its layers were not tested, though: the part they belong to ran wholly wider in this "
        "job, so the fix is not remembered."
    )


def _generations(count: int) -> str:
    return "generation" if count == 1 else f"{count} generations"


def _multiple_of_8(value: int) -> int:
    return max(64, int(round(value / 8) * 8))
