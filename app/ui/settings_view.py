"""The settings panel, generated from the settings schema: one editor per field, by group."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QEvent, QPoint, Qt
from PySide6.QtGui import QKeySequence, QShortcut, QStandardItemModel
from PySide6.QtWidgets import (
    QApplication,
    QComboBox,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from app.core.components import COMPONENTS
from app.core.precision import CUDA_ONLY_BACKENDS
from app.core.settings import FIELDS, GROUPS, SCHEMA, Field
from app.ui import words
from app.ui.dialogs import Dialogs
from app.ui.setting_fields import FieldEditor, explanation_tip, short_explanation, shown_words
from app.ui.state import AppState
from app.ui.widgets import label, page_layout, scroll_column

# Components whose `auto` follows the base precision rather than a recommendation of its own.
_FOLLOWS_PRECISION = ("unet_precision", "vae_precision", "text_encoder_precision")
# The settings that each give some parts their dtype.
_PART_SETTINGS = tuple(dict.fromkeys(c.setting for c in COMPONENTS.values()))
# What no-half overrides: with it on, these run in fp32 whatever they say.
_OVERRIDDEN_BY_NO_HALF = ("precision", *_PART_SETTINGS, "no_half_vae")
GROUP_INTROS = {
    "Device": "Which processor runs the model.",
    "Precision": "The number format of each part of the model: the main speed, memory and "
    "overflow trade-off.",
    "Attention": "How attention is computed; where SD 2.x and Apple GPUs overflow.",
    "Accumulation": "How sums inside matrix multiplies are kept; faster settings can overflow.",
    "NaN safety": "What HalfSafe does when an image goes non-finite (NaN or infinite).",
    "Generation": "The values the Generate page starts from; it also saves what you last used.",
    "Folders": "Where HalfSafe looks for models and saves images.",
}


class SettingsView(QWidget):
    """Every schema field, grouped as GROUPS lists them, each with a one-line explanation (the
    whole one is its tooltip); a filter finds settings, and "Go to" jumps to a group."""

    def __init__(
        self,
        state: AppState,
        dialogs: Dialogs,
        request_hardware: Callable[[Callable[[], None]], None] | None = None,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.state = state
        self.dialogs = dialogs
        self._request_hardware = request_hardware
        layout = page_layout(
            self,
            "Settings",
            "Changes are saved as soon as you make them and used by the next job; there is "
            "nothing to restart. Each setting says in a line what it does: hover over it for the "
            "whole explanation.",
        )
        layout.addLayout(self._build_finding())
        top = QHBoxLayout()
        self.reset_button = QPushButton("Reset to recommended")
        self.reset_button.setToolTip(
            "Put the device, precision, attention, accumulation and NaN settings back to what "
            "HalfSafe recommends for this computer. Generation values and folders stay."
        )
        self.reset_button.clicked.connect(self.reset_to_recommended)
        top.addWidget(self.reset_button)
        self.notice = label("", "muted", wrap=True)
        top.addWidget(self.notice, 1)
        self.undo_button = QPushButton("Undo")
        self.undo_button.setToolTip("Put back the settings as they were before the reset.")
        self.undo_button.clicked.connect(self.undo_reset)
        self.undo_button.hide()
        top.addWidget(self.undo_button)
        self._before_reset: dict[str, Any] = {}
        layout.addLayout(top)
        self._jumping = False  # a jump to a group is under way: the scroll is not the reader's

        self._form = scroll_column(layout)
        self._form.setSpacing(2)
        self._grids: list[QGridLayout] = []
        self.no_match = label("", "muted", wrap=True)
        self.no_match.hide()
        self._add(self.no_match)

        self.editors: dict[str, FieldEditor] = {}
        self.resolved: dict[str, Any] = {}
        self.problems: dict[str, Any] = {}
        self.explanations: dict[str, QLabel] = {}
        self.rows: dict[str, QWidget] = {}  # a setting's name, editor and words
        self.sections: dict[str, QWidget] = {}  # a group's title, introduction and rows
        self._group_keys: dict[str, list[str]] = {}
        self._searchable: dict[str, str] = {}
        for group in GROUPS:
            fields = [f for f in SCHEMA if f.group == group]
            if fields:
                self._add_group(group, fields)
        self._align_columns()
        self.section_choice.addItems(list(self.sections))
        area = self._scroll_area()
        if area is not None:
            area.verticalScrollBar().valueChanged.connect(self._follow_scroll)

        for key, editor in self.editors.items():
            editor.set_value(state.settings[key])
            editor.edited.connect(self._edited)
        state.settings_changed.connect(self._settings_changed)
        state.hardware_changed.connect(lambda _report: self._refresh_hardware())
        state.model_changed.connect(lambda _model: self._refresh_resolved())
        self._refresh_hardware()

    def _build_finding(self) -> QHBoxLayout:
        """The filter field ("Find a setting") and the group to go to, above the settings."""
        row = QHBoxLayout()
        self.filter_field = QLineEdit()
        self.filter_field.setPlaceholderText("Find a setting")
        self.filter_field.setClearButtonEnabled(True)
        self.filter_field.setToolTip(
            "Shows only the settings whose name, explanation or key holds these words (Ctrl+F). "
            "Escape shows every setting again."
        )
        self.filter_field.textChanged.connect(self.apply_filter)
        self.filter_field.setMaximumWidth(480)  # room for a few words, not a page-wide bar
        row.addWidget(self.filter_field, 1)
        go_to = label("Go to")
        self.section_choice = QComboBox()
        self.section_choice.setToolTip("Scroll to a group of settings; it follows the page.")
        self.section_choice.activated.connect(
            lambda index: self.go_to_section(self.section_choice.itemText(index))
        )
        go_to.setBuddy(self.section_choice)
        row.addSpacing(12)
        row.addWidget(go_to)
        row.addWidget(self.section_choice)
        row.addStretch(1)
        find = QShortcut(QKeySequence.StandardKey.Find, self)
        find.setContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
        find.activated.connect(self._focus_filter)
        escape = QShortcut(QKeySequence(Qt.Key.Key_Escape), self.filter_field)
        escape.setContext(Qt.ShortcutContext.WidgetShortcut)
        escape.activated.connect(self.filter_field.clear)
        return row

    def _add_group(self, group: str, fields: list[Field]) -> None:
        section = QWidget()
        column = QVBoxLayout(section)
        column.setContentsMargins(0, 0, 0, 10)
        column.setSpacing(2)
        column.addWidget(label(group, "section"))
        if group in GROUP_INTROS:
            column.addWidget(label(GROUP_INTROS[group], "muted", wrap=True))
        column.addSpacing(4)
        for f in fields:
            column.addWidget(self._setting_row(f))
        self.sections[group] = section
        self._group_keys[group] = [f.key for f in fields]
        self._add(section)

    def _setting_row(self, f: Field) -> QWidget:
        """One setting: its name, its editor, what Auto means, a problem, and one line saying
        what it does. The whole explanation is the tooltip anywhere on the row."""
        row = QWidget()
        row.setToolTip(explanation_tip(f.help))
        grid = QGridLayout(row)
        grid.setContentsMargins(8, 0, 0, 0)
        grid.setHorizontalSpacing(18)
        grid.setVerticalSpacing(2)
        grid.setColumnStretch(1, 1)
        self._grids.append(grid)
        name = label(f.label)
        name.setStyleSheet("font-weight: 600;")
        editor = FieldEditor(f)
        editor.setObjectName(f"setting-{f.key}")
        name.setBuddy(editor.input)
        grid.addWidget(name, 0, 0, Qt.AlignmentFlag.AlignTop)
        grid.addWidget(editor, 0, 1)
        resolved = label("", "resolved", wrap=True)
        resolved.hide()
        grid.addWidget(resolved, 1, 1)
        problem = label("", "invalid", wrap=True)
        problem.hide()
        grid.addWidget(problem, 2, 1)
        explanation = label(short_explanation(f.help), "help", wrap=True)
        explanation.setContentsMargins(0, 0, 0, 8)
        grid.addWidget(explanation, 3, 1)
        self.editors[f.key] = editor
        self.resolved[f.key] = resolved
        self.problems[f.key] = problem
        self.explanations[f.key] = explanation
        self.rows[f.key] = row
        words_of = (f.label, f.help, shown_words(f.help), f.key, f.key.replace("_", " "))
        self._searchable[f.key] = "\n".join(words_of).lower()
        return row

    def _align_columns(self) -> None:
        """Every setting's control starts at the same x: the name column is as wide as the
        widest name of any group."""
        widest = 0
        for grid in self._grids:
            for row in range(grid.rowCount()):
                item = grid.itemAtPosition(row, 0)
                widget = item.widget() if item is not None else None
                if widget is not None:
                    widest = max(widest, widget.sizeHint().width())
        for grid in self._grids:
            grid.setColumnMinimumWidth(0, max(200, widest))

    # Finding ----------------------------------------------------------------------------------

    def _focus_filter(self) -> None:
        self.filter_field.setFocus()
        self.filter_field.selectAll()

    def apply_filter(self, text: str) -> int:
        """Show only the settings whose name, explanation or key holds every word of `text`
        (in any case), and only the groups that keep one; returns how many settings show."""
        terms = text.lower().split()
        shown = 0
        for key, row in self.rows.items():
            match = all(term in self._searchable[key] for term in terms)
            row.setHidden(not match)
            shown += match
        model = self.section_choice.model()
        assert isinstance(model, QStandardItemModel)  # a combo box's own model
        for index, (group, section) in enumerate(self.sections.items()):
            keep = any(not self.rows[key].isHidden() for key in self._group_keys[group])
            section.setHidden(not keep)
            item = model.item(index)
            if item is not None:
                item.setEnabled(keep)
        self.no_match.setText(f"No setting matches “{text.strip()}”.")
        self.no_match.setVisible(shown == 0)
        area = self._scroll_area()
        if area is not None:
            self._lay_out_now()
            area.verticalScrollBar().setValue(0)
        self._follow_scroll()
        return shown

    def go_to_section(self, group: str) -> bool:
        """Scroll the group's title to the top of the page; False when it is not shown."""
        section = self.sections.get(group)
        area = self._scroll_area()
        if section is None or section.isHidden() or area is None:
            return False
        self._lay_out_now()
        self._jumping = True
        try:
            area.verticalScrollBar().setValue(section.y())
        finally:
            self._jumping = False
        self.section_choice.setCurrentIndex(self.section_choice.findText(group))
        return True

    def current_section(self) -> str:
        """The group being read: the last one whose title is at or above the top of the page
        (at the end of the page, above its middle, so the last short groups can be reached)."""
        shown = [group for group, section in self.sections.items() if not section.isHidden()]
        area = self._scroll_area()
        if not shown or area is None:
            return shown[0] if shown else ""
        bar = area.verticalScrollBar()
        line = bar.value() + 4
        if bar.maximum() > 0 and bar.value() >= bar.maximum():
            line = bar.value() + area.viewport().height() // 2
        return next((g for g in reversed(shown) if self.sections[g].y() <= line), shown[0])

    def _follow_scroll(self, _value: int = 0) -> None:
        if self._jumping:
            return
        index = self.section_choice.findText(self.current_section())
        if index >= 0:
            self.section_choice.setCurrentIndex(index)

    @staticmethod
    def _lay_out_now() -> None:
        """Lay the page out now: widgets shown or hidden re-lay out on posted events."""
        for _ in range(3):
            QApplication.sendPostedEvents(None, QEvent.Type.LayoutRequest)

    def _scroll_area(self) -> QScrollArea | None:
        body = self._form.parentWidget()
        viewport = body.parentWidget() if body is not None else None
        area = viewport.parentWidget() if viewport is not None else None
        return area if isinstance(area, QScrollArea) else None

    def _keep_in_place(self, key: str, change: Callable[[], None]) -> None:
        """Run `change` (which may show or hide explanations above the setting) and scroll so
        that the setting being edited stays where the user's pointer is: the page never jumps."""
        area = self._scroll_area()
        editor = self.editors.get(key)
        if area is None or editor is None or not editor.isVisible():
            change()
            return
        before = editor.mapTo(area.viewport(), QPoint(0, 0)).y()
        change()
        # Measure where the setting went once the page is laid out again.
        self._lay_out_now()
        after = editor.mapTo(area.viewport(), QPoint(0, 0)).y()
        bar = area.verticalScrollBar()
        bar.setValue(bar.value() + after - before)

    def _add(self, widget: QWidget) -> None:
        self._form.insertWidget(self._form.count() - 1, widget)

    # Edits ------------------------------------------------------------------------------------

    def _edited(self, key: str, value: Any) -> None:
        self._keep_in_place(key, lambda: self._save(key, value))

    def _save(self, key: str, value: Any) -> None:
        problem = self.problems[key]
        try:
            self.state.set_setting(key, value)
        except ValueError as error:
            problem.setText(f"Not saved: {error}.")
            problem.show()
            return
        problem.hide()

    def _settings_changed(self, keys: list[str]) -> None:
        for key in keys:
            if key in self.editors:
                self.editors[key].set_value(self.state.settings[key])
                self.problems[key].hide()
        self._refresh_resolved()

    def reset_to_recommended(self) -> None:
        if self.state.hardware is None and self._request_hardware is not None:
            self.reset_button.setEnabled(False)
            self.notice.setText("Checking this computer to find the recommended settings…")
            self._request_hardware(self._finish_reset)
            return
        self._finish_reset()

    def _finish_reset(self) -> None:
        self.reset_button.setEnabled(True)
        target = self.state.recommended_settings()
        differ = [key for key, value in target.items() if self.state.settings[key] != value]
        source = (
            "recommended for this computer"
            if self.state.recommended()
            else "the defaults (no recommendation is available yet)"
        )
        if not differ:
            self.notice.setText(f"Already at {source}.")
            return
        names = ", ".join(FIELDS[k].label for k in differ)
        if not self.dialogs.confirm(
            "Reset to recommended?",
            f"This changes {len(differ)} setting{'s' if len(differ) != 1 else ''}: {names}.",
            "Settings left on Auto stay on Auto, so a fix remembered for a model still applies. "
            "Undo puts everything back.",
            yes="Reset",
        ):
            self.notice.setText("Nothing was changed.")
            return
        before = {key: self.state.settings[key] for key in differ}
        changed = self.state.reset_to_recommended()
        self._before_reset = {key: before[key] for key in changed if key in before}
        self.notice.setText(f"Reset to {source}. Changed: {names}.")
        self.undo_button.setVisible(bool(self._before_reset))

    def undo_reset(self) -> None:
        """Put back what the last reset changed."""
        before, self._before_reset = self._before_reset, {}
        self.undo_button.hide()
        if before:
            self.state.apply(before)
            self.notice.setText("The reset was undone.")

    # Auto, resolved ---------------------------------------------------------------------------

    def _refresh_hardware(self) -> None:
        devices = []
        for device in self.state.hardware.devices if self.state.hardware else []:
            kind, index = device.kind, device.index
            if kind == "rocm":
                kind = "cuda"
            if kind and kind != "cpu":
                devices.append(kind if index is None else f"{kind}:{index}")
        self.editors["device"].set_devices(devices)
        self._refresh_resolved()

    def resolution_text(self, key: str) -> str:
        """What `auto` (or the recommendation) means for `key` on this computer, in words."""
        value = self.state.settings[key]
        recommended = self.state.recommended()
        reasons = self.state.reasons()
        reason = reasons.get(key, "")
        have_report = self.state.hardware is not None
        if self.state.settings["no_half"] and key in _OVERRIDDEN_BY_NO_HALF:
            return "No-half is on, so this runs in fp32 whatever is chosen here."
        lacking = self._device_lacks(key, value)
        if lacking:
            return lacking
        model = self.state.model
        fix = model.remembered_fix if model is not None else None
        remembered = fix.settings if fix is not None else {}
        if value in ("auto", False, []) and key in remembered and remembered[key] != value:
            # Jobs fill fields left on Auto (off, empty) from the loaded model's remembered fix.
            return (
                f"For {model.name if model else 'the loaded model'}, jobs use its remembered fix: "
                f"{words.setting_value(key, remembered[key])}."
            )
        planned = self._planned(key) if value == "auto" else None
        if planned is not None and planned[1]:
            # What the next job runs this part in, and why: the model's own need, the device's
            # recommendation, a remembered fix (as the status bar says it).
            return _sentence(f"Auto means {words.choice_name(planned[0])} here", planned[1])
        if key == "device" and value == "auto":
            device = self.state.device_report()
            if device is None:
                return (
                    "Auto picks the best GPU (else the CPU) when the engine first runs; the "
                    "Devices page shows which."
                )
            return f"Auto picks {device.name} here."
        if value == "auto" and key in (
            "text_encoder_2_precision",
            "text_encoder_3_precision",
            "prompt_upsampler_precision",
        ):
            first = self.state.settings["text_encoder_precision"]
            if first != "auto":
                return f"Auto follows the text encoder: {words.choice_name(first)}."
            key = "text_encoder_precision"  # which follows Precision, as below
        if value == "auto" and key in _FOLLOWS_PRECISION:
            base = self.state.settings["precision"]
            if base != "auto":
                return f"Auto follows Precision: {words.choice_name(base)}."
            resolved = recommended.get(key) or recommended.get("precision")
            if not resolved or resolved == "auto":
                return "Auto follows Precision."
            return _sentence(f"Auto means {words.choice_name(resolved)} here", reason)
        if value == "auto" and key == "vae_tiling":
            if self._on_cpu():
                return "Auto does not tile on a CPU: its memory is the computer's."
            return (
                "Auto tiles when a picture's decode would not fit the GPU memory free beside "
                "the VAE, decided at each job's size."
            )
        if value == "auto" and FIELDS[key].kind == "choice":
            if not have_report:
                return (
                    "Auto is decided from your device and the model when a job runs; the "
                    "Devices page shows what it picks."
                )
            resolved = recommended.get(key)
            if resolved is None or resolved == "auto":
                return "Auto is decided from the model when a job runs."
            if key == "attention_backend" and self._on_cpu():
                # PyTorch's fused CPU kernel carries the flash name; "Flash attention" reads as
                # the GPU library to most people.
                return _sentence("Auto lets PyTorch use its fused CPU attention kernel here", "")
            return _sentence(f"Auto means {words.choice_name(resolved)} here", reason)
        if (
            key == "attention_backend"
            and self._on_cpu()
            and recommended.get(key) in ("flash", "efficient", "cudnn")
        ):
            return ""  # GPU kernels are no recommendation for a CPU
        if key in recommended and recommended[key] != value and recommended[key] != "auto":
            return _sentence(
                f"Recommended for this computer: {words.setting_value(key, recommended[key])}",
                reason,
            )
        return ""

    def _planned(self, key: str) -> tuple[str, str] | None:
        """(dtype, why) the next job's plan gives the parts `key` governs (`why` empty when it
        follows the base); None when no plan is known yet or no such part is loaded."""
        if key not in _PART_SETTINGS:
            return None
        plan = self.state.expected_plan()
        if plan is None:
            return None
        parts = [part for part in plan.dtypes if COMPONENTS[part].setting == key]
        if not parts:
            return None
        return plan.dtypes[parts[0]], plan.reasons.get(key, "")

    def _on_cpu(self) -> bool:
        device = self.state.device_report()
        return device is not None and device.kind == "cpu"

    def _device_lacks(self, key: str, value: Any) -> str:
        """What the device in use cannot do of this choice (jobs run and record what it can:
        core's `precision.resolve._what_the_device_runs`); "" when it can, or is not known yet."""
        device = self.state.device_report()
        kind = device.kind if device is not None else None
        if kind is None or kind in ("cuda", "rocm"):
            return ""
        if key == "attention_backend" and value in CUDA_ONLY_BACKENDS and kind in ("cpu", "mps"):
            return (
                f"Not on this device: {CUDA_ONLY_BACKENDS[value]} needs a CUDA GPU, so jobs "
                "run the math kernel and record that."
            )
        if key == "fp16_accumulation" and value:
            return (
                "Not on this device: full fp16 accumulation is a CUDA setting, so it does "
                "nothing here and jobs record it off."
            )
        return ""

    def _refresh_resolved(self) -> None:
        for key, widget in self.resolved.items():
            text = self.resolution_text(key)
            widget.setText(text)
            widget.setVisible(bool(text))


def _sentence(head: str, reason: str) -> str:
    reason = reason.strip().rstrip(".")
    if reason:
        return f"{head}: {reason}."
    return f"{head}."
