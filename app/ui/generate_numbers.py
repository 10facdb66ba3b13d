"""The numbers every Generate job needs, in one form below the prompts: steps, CFG scale, seed
(with Random and Reuse last), size, batch, sampler, clip skip, step cache and prompt cache.
Each has its setting's explanation as tooltip; those the loaded model's family does not take
are turned off, with a tooltip saying why (`follow_family`)."""

from __future__ import annotations

from PySide6.QtWidgets import (
    QCheckBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QWidget,
)

from app.core.settings import FIELDS
from app.ui.sampler_choice import SamplerChoice
from app.ui.widgets import label


class GenerateNumbers(QWidget):
    """The form's number fields, read and set by the Generate form. "Reuse last" is the page's
    to connect (the page knows the image shown); Random sets the seed to -1."""

    def __init__(self) -> None:
        super().__init__()
        form = QFormLayout(self)
        form.setContentsMargins(0, 0, 0, 0)
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
        size_row.addWidget(self.width_box, 1)
        size_row.addWidget(label("×"))
        size_row.addWidget(self.height_box, 1)
        self.batch = QSpinBox()
        self.batch.setRange(*(int(b) for b in FIELDS["batch"].bounds()))
        # The sampler setting as a sampler and its schedule, as AUTOMATIC1111 and ComfyUI
        # offer it: two short lists instead of one of every pair.
        self.scheduler = SamplerChoice()
        form.addRow("Steps", self.steps)
        form.addRow("CFG scale", self.cfg)
        form.addRow("Seed", seed_row)
        form.addRow("Size", size_row)
        form.addRow("Batch", self.batch)
        form.addRow("Sampler", self.scheduler)
        self.clip_skip = QSpinBox()
        self.clip_skip.setRange(*(int(b) for b in FIELDS["clip_skip"].bounds()))
        form.addRow("Clip skip", self.clip_skip)
        self.step_cache = QDoubleSpinBox()
        self.step_cache.setRange(*FIELDS["step_cache"].bounds())
        self.step_cache.setSingleStep(0.05)
        self.step_cache.setDecimals(2)
        self.step_cache.setSpecialValueText("off")  # 0: every step computed in full
        form.addRow("Step cache", self.step_cache)
        # Only for a family whose pipeline keeps one (`follow_family`): disabled until then.
        self.prompt_cache = QCheckBox("Keep the prompt's keys and values")
        self.prompt_cache.setEnabled(False)
        form.addRow("Prompt cache", self.prompt_cache)
        for key, widget in (
            ("steps", self.steps),
            ("cfg", self.cfg),
            ("seed", self.seed),
            ("batch", self.batch),
            ("scheduler", self.scheduler),
            ("width", self.width_box),
            ("height", self.height_box),
            ("clip_skip", self.clip_skip),
            ("step_cache", self.step_cache),
            ("prompt_cache", self.prompt_cache),
        ):
            widget.setToolTip(FIELDS[key].help)

    def follow_family(self, architecture: str | None) -> None:
        """Clip skip only where the model reads CLIP's hidden states (SD 1.x/2.x, SDXL); the
        step cache and the prompt cache only where its family's pipeline takes them."""
        from app.core.families.registry import family_of_architecture

        family = family_of_architecture(architecture or "")
        takes = family is None or family.takes_clip_skip
        self.clip_skip.setEnabled(takes)
        caches = family is None or family.takes_step_cache
        self.step_cache.setEnabled(caches)
        self.step_cache.setToolTip(
            FIELDS["step_cache"].help
            if caches
            else f"{family.title if family else 'This model'}'s denoiser is not one diffusers' "
            "step cache can skip blocks of: every step is computed in full."
        )
        prompt = family is not None and family.takes_prompt_cache
        self.prompt_cache.setEnabled(prompt)
        self.prompt_cache.setToolTip(
            FIELDS["prompt_cache"].help
            if prompt
            else f"{family.title if family else 'This model'}'s pipeline keeps no prompt cache: "
            "every step computes the prompt's keys and values."
        )
        self.clip_skip.setToolTip(
            FIELDS["clip_skip"].help
            if takes
            else f"{family.title if family else 'This model'} reads its prompt without CLIP's "
            "layers: Clip skip does not apply."
        )
