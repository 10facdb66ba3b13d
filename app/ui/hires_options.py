"""The Generate page's hires fix (`hires.Hires`) behind a toggle, as A1111's "Hires. fix"
panel: on or off, the upscale, the second pass's steps and denoising strength, the upscaler.
Closed, the toggle says what is set ("Hires fix: 2x Latent, 0.7 → 1024×1024")."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QSpinBox,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.core import hires
from app.core.settings import FIELDS


class HiresOptions(QWidget):
    """Signal (GUI thread): changed(), on any change. `set_first_size` tells it the first
    pass's size, for the final size it names."""

    changed = Signal()

    def __init__(self) -> None:
        super().__init__()
        self._first = (512, 512)
        column = QVBoxLayout(self)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(4)
        self.toggle = QToolButton()
        self.toggle.setCheckable(True)
        self.toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.toggle.setArrowType(Qt.ArrowType.RightArrow)
        self.toggle.setAutoRaise(True)
        self.toggle.setToolTip(
            "Draw the picture, enlarge it and draw it again at the larger size (text-to-image)."
        )
        self.toggle.toggled.connect(self._open)
        column.addWidget(self.toggle)
        self.body = QWidget()
        form = QFormLayout(self.body)
        form.setContentsMargins(16, 0, 0, 0)
        self.enabled = QCheckBox("Hires fix")
        self.enabled.setToolTip(FIELDS["hires_scale"].help)
        self.scale = QDoubleSpinBox()
        self.scale.setRange(1.05, hires.SCALE_MAX)
        self.scale.setSingleStep(0.25)
        self.scale.setDecimals(2)
        self.scale.setSuffix("×")
        self.scale.setValue(2.0)
        self.scale.setToolTip(FIELDS["hires_scale"].help)
        self.steps = QSpinBox()
        self.steps.setRange(0, hires.STEPS_MAX)
        self.steps.setSpecialValueText("same as the first pass")
        self.steps.setToolTip(FIELDS["hires_steps"].help)
        self.denoise = QDoubleSpinBox()
        self.denoise.setRange(*FIELDS["hires_denoise"].bounds())
        self.denoise.setSingleStep(0.05)
        self.denoise.setDecimals(2)
        self.denoise.setValue(hires.DENOISE_DEFAULT)
        self.denoise.setToolTip(FIELDS["hires_denoise"].help)
        self.upscaler = QComboBox()
        for upscaler in hires.UPSCALERS:
            self.upscaler.addItem(upscaler.words, upscaler.key)
        self.upscaler.setToolTip(FIELDS["hires_upscaler"].help)
        form.addRow(self.enabled)
        form.addRow("Upscale by", self.scale)
        form.addRow("Hires steps", self.steps)
        form.addRow("Denoising", self.denoise)
        form.addRow("Upscaler", self.upscaler)
        column.addWidget(self.body)
        self.enabled.toggled.connect(self._changed)
        for box in (self.scale, self.steps, self.denoise):
            box.valueChanged.connect(self._changed)
        self.upscaler.currentIndexChanged.connect(self._changed)
        self._open(False)

    def value(self) -> hires.Hires:
        """The second pass the next job runs (scale 1: none)."""
        return hires.Hires(
            scale=round(self.scale.value(), 2) if self.enabled.isChecked() else 1.0,
            steps=self.steps.value(),
            denoise=round(self.denoise.value(), 2),
            upscaler=str(self.upscaler.currentData()),
        )

    def set_value(self, value: hires.Hires) -> None:
        """Show `value`; a scale of 1 turns the fix off and keeps the upscale shown."""
        self.enabled.setChecked(value.on)
        if value.on:
            self.scale.setValue(value.scale)
        self.steps.setValue(value.steps)
        self.denoise.setValue(value.denoise)
        index = self.upscaler.findData(value.upscaler)
        self.upscaler.setCurrentIndex(max(0, index))

    def set_first_size(self, width: int, height: int) -> None:
        self._first = (width, height)
        self._changed()

    def summary(self) -> str:
        """What is set in a few words, for the closed toggle."""
        value = self.value()
        if not value.on:
            return "off"
        width, height = value.final_size(*self._first)
        return (
            f"{value.scale:g}× {hires.BY_KEY[value.upscaler].words}, {value.denoise:g} "
            f"→ {width}×{height}"
        )

    def _open(self, opened: bool) -> None:
        self.body.setVisible(opened)
        self.toggle.setArrowType(Qt.ArrowType.DownArrow if opened else Qt.ArrowType.RightArrow)
        self._changed()

    def _changed(self) -> None:
        on = self.enabled.isChecked()
        for widget in (self.scale, self.steps, self.denoise, self.upscaler):
            widget.setEnabled(on)
        opened = self.toggle.isChecked()
        self.toggle.setText("Hires fix" if opened else f"Hires fix: {self.summary()}")
        self.changed.emit()
