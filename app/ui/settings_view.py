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
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from app.core.settings import GROUPS, SCHEMA, Field
from app.ui.dialogs import Dialogs
from app.ui.setting_fields import FieldEditor, explanation_tip, short_explanation, shown_words
from app.ui.setting_resolution import resolution_text
from app.ui.settings_reset import ResetBar
from app.ui.state import AppState
from app.ui.widgets import label, page_layout, scroll_column

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
        layout = page_layout(
            self,
            "Settings",
            "Changes are saved as soon as you make them and used by the next job; there is "
            "nothing to restart. Each setting says in a line what it does: hover over it for the "
            "whole explanation.",
        )
        layout.addLayout(self._build_finding())
        self.reset_bar = bar = ResetBar(state, dialogs, request_hardware)
        # The reset row's widgets, by the names the page is read with.
        self.reset_button, self.notice = bar.reset_button, bar.notice
        self.undo_button = bar.undo_button
        layout.addWidget(bar)
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
        """Put the recommended settings back, once the user confirms (`ResetBar`)."""
        self.reset_bar.reset_to_recommended()

    def undo_reset(self) -> None:
        """Put back what the last reset changed."""
        self.reset_bar.undo_reset()

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
        return resolution_text(self.state, key)

    def _refresh_resolved(self) -> None:
        for key, widget in self.resolved.items():
            text = self.resolution_text(key)
            widget.setText(text)
            widget.setVisible(bool(text))
