"""The Generate page's form: the prompts, the numbers every job needs (steps, CFG scale, seed,
size, batch, sampler, clip skip), the hires fix, the LoRAs and the input picture. It fills
itself from the settings or from an image's parameters, reads back the request they make, and
keeps the last-used values. The size follows what the loaded model was made for and the input
picture's proportions, until the user sets it; steps and CFG scale start at the loaded model's
own where its family states them (Z-Image Turbo's 9 steps without CFG)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QPlainTextEdit, QVBoxLayout, QWidget

from app.core.errors import HalfSafeError
from app.core.hires import Hires
from app.core.images.pictures import picture_size
from app.core.models.summary import ModelSummary
from app.core.settings import FIELDS
from app.ui import browser
from app.ui.generate_numbers import GenerateNumbers
from app.ui.hires_options import HiresOptions
from app.ui.input_pictures import InputPictures
from app.ui.lora_list import LoraList
from app.ui.state import AppState
from app.ui.widgets import label

if TYPE_CHECKING:
    from app.core.families.base import GenerationDefaults

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
    "step_cache",
    "prompt_cache",
)


class GenerateForm(QWidget):
    """The form's widgets, read and set by the page. `say(sentence)` tells the user why a
    picture could not be taken or sized. "Reuse last" is the page's to connect: the page knows
    the image shown."""

    def __init__(self, state: AppState, ui_settings: QSettings, say: Callable[[str], None]) -> None:
        super().__init__()
        self.state = state
        self.ui_settings = ui_settings
        self._say = say
        # The user set the size: an input picture leaves it alone. Both this and the model the
        # size was chosen for outlive a restart, with the size itself (`remember`): the same
        # model loaded again keeps the user's size instead of starting at its own.
        self._size_by_user = ui_settings.value("generate/size_by_user", False) in (True, "true")
        self._sizing = False  # the page itself is setting the size
        # The model whose native size the form was set to (and the user's size is for).
        self._sized_for: str | None = str(ui_settings.value("generate/sized_for", "")) or None
        # The loaded model's own steps and CFG scale (None: it states none, the settings' apply)
        # and the model the form last took them for.
        self.model_defaults: GenerationDefaults | None = None
        self._defaults_for: str | None = None

        column = QVBoxLayout(self)
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
        self.numbers = numbers = GenerateNumbers()
        # The numbers' fields, by the names the form (and the page) reads them with.
        self.steps, self.cfg, self.seed = numbers.steps, numbers.cfg, numbers.seed
        self.random_seed, self.reuse_seed = numbers.random_seed, numbers.reuse_seed
        self.width_box, self.height_box = numbers.width_box, numbers.height_box
        self.batch, self.scheduler = numbers.batch, numbers.scheduler
        self.clip_skip, self.step_cache = numbers.clip_skip, numbers.step_cache
        self.prompt_cache = numbers.prompt_cache
        for box in (self.width_box, self.height_box):
            box.valueChanged.connect(self._size_edited)
        self.scheduler.note.connect(say)
        column.addWidget(numbers)
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
        self.pictures.refused.connect(say)
        column.addWidget(self.pictures)

        column.addStretch(1)

    # Values -----------------------------------------------------------------------------------

    def load_values(self) -> None:
        """Fill the form from the settings, the prompt and the LoRAs from the window state."""
        settings = self.state.settings
        self.prompt.setPlainText(str(self.ui_settings.value("generate/prompt", "")))
        with contextlib.suppress(TypeError, ValueError):
            self.loras.set_entries(json.loads(str(self.ui_settings.value("generate/loras", "[]"))))
        self.negative.setPlainText(settings["negative_prompt"])
        if self.model_defaults is None:  # else the model's own, or what the user made of them
            self.steps.setValue(settings["steps"])
            self.cfg.setValue(settings["cfg"])
        self.seed.setText(str(settings["seed"]))
        self._set_size(settings["width"], settings["height"])
        self.batch.setValue(settings["batch"])
        self.scheduler.set_value(settings["scheduler"])
        self.clip_skip.setValue(settings["clip_skip"])
        self.step_cache.setValue(settings["step_cache"])
        self.prompt_cache.setChecked(settings["prompt_cache"])
        self.hires.set_value(
            Hires(
                settings["hires_scale"],
                settings["hires_steps"],
                settings["hires_denoise"],
                settings["hires_upscaler"],
            )
        )

    def use_parameters(self, request: dict[str, Any]) -> None:
        """Put an image's parameters into the form; values the form cannot take are left as
        they are."""
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
        self.scheduler.set_value(request.get("scheduler"))
        # An image without a clip skip or a hires fix recorded was made without one.
        clip_skip = request.get("clip_skip")
        self.clip_skip.setValue(clip_skip if isinstance(clip_skip, int) else 1)
        recorded = request.get("hires")
        self.hires.set_value(recorded if isinstance(recorded, Hires) else Hires())
        cache = request.get("step_cache")
        self.step_cache.setValue(float(cache) if isinstance(cache, (int, float)) else 0.0)
        self.prompt_cache.setChecked(request.get("prompt_cache") is True)

    def request(self) -> dict[str, Any]:
        """The request the form makes, as GenerationRequest's fields."""
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
            "scheduler": self.scheduler.value(),
            "clip_skip": self.clip_skip.value() if self.clip_skip.isEnabled() else 1,
            "step_cache": self.step_cache.value() if self.step_cache.isEnabled() else 0.0,
            "prompt_cache": self.prompt_cache.isChecked() and self.prompt_cache.isEnabled(),
            # The Settings page's: whether a model's prompt upsampler writes the prompt out.
            "upsample_prompt": bool(self.state.settings["upsample_prompt"]),
            "hires": self.hires.value(),
            "output_dir": output,
            "images": self.pictures.images(),
            "mask": self.pictures.mask_path(),
            "strength": self.pictures.strength_value(),
            "canvas": self.pictures.canvas(),
        }

    def remember(self, request: dict[str, Any]) -> None:
        """Last-used values persist: the prompt in the window state, the rest as settings."""
        self.ui_settings.setValue("generate/prompt", request["prompt"])
        self.ui_settings.setValue("generate/loras", json.dumps(self.loras.entries()))
        self.ui_settings.setValue("generate/sized_for", self._sized_for or "")
        self.ui_settings.setValue("generate/size_by_user", self._size_by_user)
        chosen = request["hires"]
        values = {
            **{key: request[key] for key in GENERATION_KEYS if key in request},
            "clip_skip": self.clip_skip.value(),
            "step_cache": self.step_cache.value(),
            "prompt_cache": self.prompt_cache.isChecked(),
            "hires_scale": chosen.scale,
            "hires_steps": chosen.steps,
            "hires_denoise": chosen.denoise,
            "hires_upscaler": chosen.upscaler,
        }
        if self.model_defaults is not None:
            # This model's steps and CFG scale are its own: the settings keep everyone else's.
            values.pop("steps", None)
            values.pop("cfg", None)
        try:
            FIELDS["seed"].validate(values["seed"])
        except ValueError:
            values.pop("seed")
        # A value out of the schema's range is still used for this run, just not saved.
        with contextlib.suppress(ValueError):
            self.state.apply(values)

    def _add_to_prompt(self, words_: str) -> None:
        """Append a LoRA's trigger words to the prompt, after a comma."""
        prompt = self.prompt.toPlainText().strip()
        self.prompt.setPlainText(", ".join(part for part in (prompt, words_) if part))

    # Model and size ---------------------------------------------------------------------------

    def model_changed(self, model: ModelSummary | None) -> None:
        """A model loaded (or none is): the input picture offers what it runs, clip skip is on
        where it reads CLIP, and a newly loaded model starts at the size it was made for."""
        if model is None:
            self.size_hint.setText("")
            self.pictures.set_model(None)
            return
        self.pictures.set_model(model)
        self.numbers.follow_family(model.architecture)
        native = model.native_size
        source = self.state.model_request.source if self.state.model_request else model.source
        defaults = self._defaults_for_model(model, source)
        if native > 0 and source != self._sized_for:
            # A newly loaded model starts at the size it was made for (a 128 px model asked
            # for 512 px draws badly, slowly); the user's own change afterwards stands.
            self._sized_for = source
            self._size_by_user = False
            self._set_size(native, native)
            self.size_hint.setText(
                f"Size set to {native}×{native} px, what this model was made for." + defaults
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
            self.size_hint.setText(defaults.strip())

    def _defaults_for_model(self, model: ModelSummary, source: str) -> str:
        """A newly loaded model whose family states its own steps and CFG scale starts at them
        (the user's changes afterwards stand); the next one that states none starts at the
        saved settings again. Returns the sentence that says so ("" when nothing changed)."""
        from app.core.families.registry import generation_defaults

        if source == self._defaults_for:
            return ""
        self._defaults_for = source
        had = self.model_defaults
        self.model_defaults = generation_defaults(model.architecture)
        if self.model_defaults is not None:
            self.steps.setValue(self.model_defaults.steps)
            self.cfg.setValue(self.model_defaults.cfg)
            return f" Steps and CFG scale set to {self.model_defaults.words()}."
        if had is not None:
            self.steps.setValue(self.state.settings["steps"])
            self.cfg.setValue(self.state.settings["cfg"])
            return " Steps and CFG scale are your settings' again."
        return ""

    def _use_native_size(self, link: str) -> None:
        self.width_box.setValue(int(link))
        self.height_box.setValue(int(link))
        self.size_hint.setText("")

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
            self._say_native_size()

    def _say_native_size(self) -> None:
        """The user changed the size: the hint offers the model's own size while the size is
        another, and says nothing of it once the size is the model's (a "Use 128×128" link
        beside a size of 128×128 offers nothing)."""
        model = self.state.model
        native = model.native_size if model is not None else 0
        if not isinstance(native, int) or native <= 0:
            return
        if (self.width_box.value(), self.height_box.value()) == (native, native):
            self.size_hint.setText("")
        else:
            self.size_hint.setText(
                f"This model was made for {native}×{native} px. "
                f"<a href='{native}'>Use {native}×{native}</a>"
            )

    def _picture_changed(self, path: str) -> None:
        """A new input picture: the size follows its proportions, at the model's size, unless
        the user set the size."""
        if not path:
            # The picture it followed is gone: its words about the size go with it.
            if self.size_hint.text().startswith("Size set to") and "input picture" in (
                self.size_hint.text()
            ):
                self.size_hint.setText("")
            return
        if self._size_by_user:
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


def _multiple_of_8(value: int) -> int:
    return max(64, int(round(value / 8) * 8))
