"""The settings panel is generated from the schema: every field has an editor and a one-line
explanation (the whole one on hover), every editor saves, `auto` says what it resolves to, and a
setting is found by the filter or "Go to"."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from PySide6 import QtGui
from PySide6.QtCore import QPoint, Qt
from PySide6.QtGui import QTextDocumentFragment
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QLabel,
    QLineEdit,
    QListWidget,
    QSpinBox,
)

from app.core import samplers
from app.core.fixing.profiles import RememberedFix
from app.core.settings import FIELDS, GROUPS, PRECISION_KEYS, SCHEMA, Field, load_settings
from app.engine.events import EventState
from app.ui.sampler_choice import SamplerChoice
from app.ui.setting_fields import (
    SHORT_EXPLANATION,
    explanation_tip,
    short_explanation,
    shown_words,
)
from tests.support.reports import gtx_1660_super, on_a_cpu


def _new_value(field: Field) -> Any:
    """A valid value different from the default, for every kind of field."""
    if field.kind == "bool":
        return not field.default
    if field.kind == "choice":
        return next(c for c in field.choices if c != field.default)
    if field.kind == "device":
        return "cpu"
    if field.kind == "int":
        step = field.step or 1
        value = field.default + step
        if field.maximum is not None and value > field.maximum:
            value = field.default - step
        return int(value)
    if field.kind == "float":
        value = field.default + 1.0
        if field.maximum is not None and value > field.maximum:
            value = round(field.default - 0.1, 1)
        return value
    if field.kind == "text":
        return "blurry, watermark"
    if field.kind == "path":
        return "/tmp/halfsafe-out"
    if field.kind == "paths":
        return ["/tmp/models-a"]
    if field.kind == "modules":
        return ["vae:decoder.conv_in", "vae:decoder.mid_block.resnets.0.conv1"]
    raise AssertionError(field.kind)


def _edit_like_a_user(editor, value: Any) -> None:
    widget = editor.input
    if isinstance(widget, QCheckBox):
        widget.click()
    elif isinstance(widget, SamplerChoice):  # the sampler, then its schedule
        sampler, schedule = samplers.split(value)
        widget.sampler.setCurrentIndex(widget.sampler.findData(sampler.key))
        widget.schedule.setCurrentIndex(widget.schedule.findData(schedule.key if schedule else ""))
    elif isinstance(widget, QComboBox) and not widget.isEditable():
        widget.setCurrentIndex(widget.findData(value))
    elif isinstance(widget, QComboBox):
        widget.setEditText(value)
        line = widget.lineEdit()
        assert line is not None  # an editable combo box always has its line edit
        line.editingFinished.emit()
    elif isinstance(widget, (QSpinBox, QDoubleSpinBox)):
        widget.setValue(value)
    elif isinstance(widget, QLineEdit):
        widget.setText(" ".join(value) if isinstance(value, list) else str(value))
        widget.editingFinished.emit()
    elif isinstance(widget, QListWidget):
        for folder in value:
            editor.add_folder(folder)
    else:
        raise AssertionError(f"no way to edit {type(widget).__name__}")


def _tip_text(tip: str) -> str:
    return QTextDocumentFragment.fromHtml(tip).toPlainText()


def test_every_field_has_an_editor_a_one_line_explanation_and_the_whole_in_its_tooltip(window):
    view = window.settings_view
    assert set(view.editors) == {f.key for f in SCHEMA}
    labels = {w.text() for w in view.findChildren(QLabel) if w.text()}
    for field in SCHEMA:
        whole = shown_words(field.help)
        for holder in (
            view.editors[field.key],
            view.editors[field.key].input,
            view.rows[field.key],
        ):
            assert _tip_text(holder.toolTip()) == whole, field.key
        line = view.explanations[field.key].text()
        assert line in labels
        assert whole.startswith(line.removesuffix("…")), field.key
        assert len(line) <= SHORT_EXPLANATION + 1, field.key
    for group in {f.group for f in SCHEMA}:
        assert group in GROUPS and group in labels
    # The memory budget's seven lines are one in the page and whole in the tooltip.
    line = view.explanations["max_vram_gb"].text()
    assert line == (
        "The most GPU memory HalfSafe's copy of a model part may take, to leave room for other "
        "programs…"
    )
    assert "0: no budget of your own" in _tip_text(view.rows["max_vram_gb"].toolTip())
    assert view.explanations["no_half"].text() == "Run every part in fp32, like --no-half."
    # The page says what it does: a line each, the whole explanation on hover.
    assert any("hover over it for the whole explanation" in text for text in labels)


def test_a_tooltip_wraps_however_long_the_explanation():
    # Qt shows a plain-text tooltip on one line, as wide as the text.
    long = "A long explanation & more. " * 20
    tip = explanation_tip(long)
    assert QtGui.Qt.mightBeRichText(tip)
    assert _tip_text(tip) == long


def test_short_explanations_are_the_first_sentence_or_clause():
    assert short_explanation("Steps per image: more is slower. Fewer is faster.") == (
        "Steps per image: more is slower."
    )
    assert short_explanation("Named layers (e.g. vae:decoder) in fp32. More.") == (
        "Named layers (e.g. vae:decoder) in fp32."
    )
    assert short_explanation("Tiles at the seams. auto tiles on a GPU.") == "Tiles at the seams."
    assert short_explanation("Which attention kernel runs: " + "flash is fast; " * 20) == (
        "Which attention kernel runs…"
    )
    assert short_explanation("off: keep it; " + "x" * 200 + "; more") == (
        "Off: keep it; " + "x" * 200 + "…"
    )


def _shown_rows(view) -> set[str]:
    return {key for key, row in view.rows.items() if row.isVisibleTo(view)}


def _shown_sections(view) -> set[str]:
    return {group for group, section in view.sections.items() if section.isVisibleTo(view)}


def test_find_a_setting_by_its_name_explanation_or_key_in_any_case(window, qtbot):
    window.show_page("Settings")
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow)  # for Escape, a shortcut
    view = window.settings_view
    qtbot.mouseClick(view.filter_field, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(view.filter_field.hasFocus)
    assert view.filter_field.placeholderText() == "Find a setting"
    qtbot.keyClicks(view.filter_field, "TILING")  # a name
    assert _shown_rows(view) == {"vae_tiling"}
    assert _shown_sections(view) == {"Device"}
    assert not view.no_match.isVisibleTo(view)

    view.filter_field.clear()
    qtbot.keyClicks(view.filter_field, "no_half_vae")  # a key
    assert _shown_rows(view) == {"no_half_vae"}

    view.filter_field.clear()
    qtbot.keyClicks(view.filter_field, "openclip")  # only in the explanation
    assert _shown_rows(view) == {"text_encoder_2_precision"}
    assert _shown_sections(view) == {"Precision"}

    view.filter_field.clear()
    qtbot.keyClicks(view.filter_field, "seams tiles")  # every word, anywhere in the setting
    assert _shown_rows(view) == {"vae_tiling"}

    view.filter_field.clear()
    qtbot.keyClicks(view.filter_field, "bfloat32")
    assert _shown_rows(view) == set() and _shown_sections(view) == set()
    assert view.no_match.isVisibleTo(view)
    assert view.no_match.text() == "No setting matches “bfloat32”."

    qtbot.keyClick(view.filter_field, Qt.Key.Key_Escape)  # Escape shows everything again
    assert view.filter_field.text() == ""
    assert _shown_rows(view) == set(view.editors)
    assert _shown_sections(view) == {f.group for f in SCHEMA}
    assert not view.no_match.isVisibleTo(view)


def test_ctrl_f_on_the_settings_page_goes_to_the_find_field(window, qtbot):
    window.show_page("Settings")
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow)
    view = window.settings_view
    view.editors["steps"].input.setFocus()
    qtbot.keyClick(view.editors["steps"].input, Qt.Key.Key_F, Qt.KeyboardModifier.ControlModifier)
    assert view.filter_field.hasFocus()


def _top_of(view, widget) -> int:
    area = view._scroll_area()
    return widget.mapTo(area.viewport(), QPoint(0, 0)).y()


def test_go_to_jumps_to_a_group_and_follows_the_scrolling(window, qtbot):
    window.show_page("Settings")
    window.resize(1024, 700)
    qtbot.wait(20)
    view = window.settings_view
    choice = view.section_choice
    assert [choice.itemText(i) for i in range(choice.count())] == [
        g for g in GROUPS if any(f.group == g for f in SCHEMA)
    ]
    assert choice.currentText() == "Device"
    index = choice.findText("Accumulation")
    choice.setCurrentIndex(index)
    choice.activated.emit(index)  # what choosing it from the list sends
    assert _top_of(view, view.sections["Accumulation"]) == 0
    assert choice.currentText() == "Accumulation"

    # Scrolling by hand: "Go to" names the group under the top of the page.
    bar = view._scroll_area().verticalScrollBar()
    bar.setValue(view.sections["Attention"].y() + 10)
    assert choice.currentText() == "Attention"
    bar.setValue(0)
    assert choice.currentText() == "Device"
    bar.setValue(bar.maximum())
    assert choice.currentText() == "Folders"

    # A group the filter hides cannot be gone to.
    qtbot.keyClicks(view.filter_field, "cfg scale")
    assert not view.go_to_section("Device")
    item = choice.model().item(choice.findText("Device"))
    assert not item.isEnabled()
    assert choice.currentText() == "Generation"


def test_the_device_says_auto_as_every_other_setting_does_and_saves_auto(window):
    window.show_page("Settings")
    view = window.settings_view
    device = view.editors["device"].input
    assert window.state.settings["device"] == "auto"
    assert device.currentText() == "Auto"
    for key, editor in view.editors.items():
        if window.state.settings[key] == "auto":
            assert editor.input.currentText() == "Auto", key
    # No explanation on the page names the value in lower case.
    for widget in view.findChildren(QLabel):
        assert not re.search(r"\bauto\b", widget.text()), widget.text()
    assert "Auto picks the best GPU" in _tip_text(view.editors["device"].toolTip())
    # A choice reads as its own combo box shows it, in every explanation.
    tiling = view.editors["vae_tiling"].input
    assert [tiling.itemText(i) for i in range(tiling.count())] == ["Auto", "On", "Off"]
    assert (
        view.explanations["auto_fix"]
        .text()
        .startswith("Off: keep the broken image and say why; Ask: offer the fix; Auto: repair")
    )

    # Picking and typing it save the value as it always was.
    _edit_like_a_user(view.editors["device"], "cpu")
    assert load_settings().settings["device"] == "cpu"
    device.setCurrentIndex(device.findText("Auto"))
    device.activated.emit(device.currentIndex())
    assert load_settings().settings["device"] == "auto"
    _edit_like_a_user(view.editors["device"], "cpu")
    _edit_like_a_user(view.editors["device"], "auto")
    assert load_settings().settings["device"] == "auto"
    assert device.currentText() == "Auto"
    assert device.count() == len({device.itemData(i) for i in range(device.count())})


def test_every_field_can_be_changed_and_is_saved_to_the_file(window):
    view = window.settings_view
    window.show_page("Settings")
    expected = {}
    for field in SCHEMA:
        value = _new_value(field)
        _edit_like_a_user(view.editors[field.key], value)
        expected[field.key] = value
        assert not view.problems[field.key].isVisible(), view.problems[field.key].text()

    saved = load_settings()
    assert saved.warnings == []
    for key, value in expected.items():
        assert saved.settings[key] == value, key
    # And the window's live settings (used by the next job) agree.
    for key, value in expected.items():
        assert window.state.settings[key] == value, key


def test_an_invalid_value_is_explained_and_not_saved(window):
    view = window.settings_view
    editor = view.editors["device"]
    editor.input.setEditText("gpu7")
    editor.input.lineEdit().editingFinished.emit()
    assert "Not saved" in view.problems["device"].text()
    assert load_settings().settings["device"] == "auto"


def test_size_is_kept_to_a_multiple_of_eight(window):
    editor = window.settings_view.editors["width"]
    editor.input.setValue(515)
    assert load_settings().settings["width"] % 8 == 0
    assert editor.input.value() % 8 == 0


def test_auto_says_what_it_resolves_to_and_why(window):
    view = window.settings_view
    assert "Devices page" in view.resolved["precision"].text()
    window.state.set_hardware(gtx_1660_super())
    assert view.resolved["precision"].text() == (
        "Auto means fp32 (full) here: This card returns NaN from fp16 convolutions."
    )
    assert "Memory-efficient" in view.resolved["attention_backend"].text()
    assert "GTX 1660" in view.resolved["device"].text()
    assert view.editors["device"].input.findData("cuda:0") >= 0
    assert view.resolved["vae_precision"].text().startswith("Auto means fp32 (full) here")
    assert view.resolved["vae_tiling"].text().startswith("Auto tiles when a picture's decode")
    window.state.set_hardware(on_a_cpu(gtx_1660_super()))
    assert view.resolved["vae_tiling"].text() == (
        "Auto does not tile on a CPU: its memory is the computer's."
    )
    window.state.set_hardware(gtx_1660_super())
    # An explicit base precision is what `auto` components follow, whatever is recommended.
    window.state.set_setting("precision", "fp16")
    assert view.resolved["vae_precision"].text() == "Auto follows Precision: fp16 (half)."
    assert view.resolved["precision"].text().startswith("Recommended for this computer: fp32")


def test_changes_elsewhere_show_up_in_the_panel(window):
    window.state.apply({"no_half_vae": True, "steps": 40})
    view = window.settings_view
    assert view.editors["no_half_vae"].input.isChecked()
    assert view.editors["steps"].input.value() == 40


def test_reset_to_recommended_uses_this_computers_recommendation(window, engines):
    window.state.apply({"fp16_accumulation": True, "steps": 33, "vae_precision": "fp16"})
    asked = []
    window.dialogs.confirm = lambda *args, **kwargs: asked.append(args) or True
    view = window.settings_view
    view.reset_button.click()
    # No report yet: the Devices page asks the engine, and the reset finishes when it answers.
    job = engines.current.last_job("hardware")
    engines.current.emit(job, EventState.RESULT, result=gtx_1660_super())
    assert asked and FIELDS["fp16_accumulation"].label in asked[0][1]
    saved = load_settings().settings
    recommended = gtx_1660_super().devices[0].recommended
    for key in PRECISION_KEYS:
        if FIELDS[key].default == "auto":
            # Auto already means the recommendation, and lets a remembered fix apply.
            assert saved[key] == "auto", key
        else:
            assert saved[key] == recommended[key], key
    assert saved["steps"] == 33  # generation values are left alone
    assert view.notice.text().startswith("Reset to recommended for this computer.")
    assert FIELDS["fp16_accumulation"].label in view.notice.text()

    # Undo puts back exactly what the reset changed.
    assert view.undo_button.isVisibleTo(view)
    view.undo_button.click()
    saved = load_settings().settings
    assert saved["fp16_accumulation"] is True and saved["vae_precision"] == "fp16"
    assert not view.undo_button.isVisibleTo(view)


def test_reset_changes_nothing_unless_the_user_confirms(window, engines):
    window.state.set_hardware(gtx_1660_super())
    window.state.apply({"fp16_accumulation": True, "vae_precision": "fp16"})
    window.dialogs.confirm = lambda *args, **kwargs: False
    view = window.settings_view
    view.reset_button.click()
    saved = load_settings().settings
    assert saved["fp16_accumulation"] is True and saved["vae_precision"] == "fp16"
    assert view.notice.text() == "Nothing was changed."
    assert not view.undo_button.isVisibleTo(view)


def test_choices_the_device_cannot_run_are_marked(window):
    view = window.settings_view
    window.state.apply({"attention_backend": "cudnn", "fp16_accumulation": True})
    window.state.set_hardware(gtx_1660_super())  # a CUDA GPU runs both
    assert "Not on this device" not in view.resolved["attention_backend"].text()
    window.state.set_hardware(on_a_cpu(gtx_1660_super()))
    assert (
        view.resolved["attention_backend"]
        .text()
        .startswith("Not on this device: cuDNN attention needs a CUDA GPU")
    )
    assert view.resolved["fp16_accumulation"].text().startswith("Not on this device")


def test_auto_names_the_fix_remembered_for_the_loaded_model(window, engines):
    from tests.ui.conftest import DEMO_SUMMARY, load_fake_model

    view = window.settings_view
    window.state.set_hardware(gtx_1660_super())
    fix = RememberedFix(
        {"vae_precision": "fp32", "fp32_modules": ["vae:decoder.a"]}, "", "health check", 0.0
    )
    load_fake_model(window, engines, replace(DEMO_SUMMARY, remembered_fix=fix))
    assert view.resolved["vae_precision"].text() == (
        "For demo, jobs use its remembered fix: fp32 (full)."
    )
    assert "remembered fix: 1 layer (vae:decoder.a)" in view.resolved["fp32_modules"].text()
    window.state.set_model(None)
    assert "remembered" not in view.resolved["vae_precision"].text()


def test_auto_hints_say_what_the_next_job_runs_as_the_status_bar_does(window, engines):
    """A part's Auto says the dtype the next job gives it and why, from the same plan as the
    status bar: an SDXL whose VAE asks for fp32 at Precision fp16 is not "follows fp16"."""
    from tests.ui.conftest import DEMO_SUMMARY, load_fake_model

    view = window.settings_view
    window.state.set_hardware(gtx_1660_super())
    window.state.set_setting("precision", "fp16")
    sdxl = replace(
        DEMO_SUMMARY,
        architecture="sdxl",
        components=("text_encoder", "text_encoder_2", "unet", "vae"),
        vae_needs_fp32=True,
    )
    load_fake_model(window, engines, sdxl)
    assert (
        view.resolved["vae_precision"]
        .text()
        .startswith("Auto means fp32 (full) here: This model's VAE is known to overflow in fp16")
    )
    assert window.precision_status.text() == "Precision: fp16, VAE in fp32"
    # A fix remembered as no-half-VAE is named as the remembered fix, not as the user's switch.
    fix = RememberedFix({"no_half_vae": True}, "", "health check", 0.0)
    load_fake_model(window, engines, replace(DEMO_SUMMARY, remembered_fix=fix))
    assert view.resolved["vae_precision"].text() == (
        "Auto means fp32 (full) here: A fix verified for this model on this device is remembered."
    )
    assert window.precision_status.text() == "Precision: fp16, VAE in fp32"


def test_no_half_overrides_every_text_encoders_hint(window):
    view = window.settings_view
    window.state.set_setting("no_half", True)
    for key in ("text_encoder_precision", "text_encoder_2_precision", "text_encoder_3_precision"):
        assert view.resolved[key].text() == (
            "No-half is on, so this runs in fp32 whatever is chosen here."
        ), key


def test_a_narrow_decimal_setting_is_edited_in_fine_steps(window):
    """A strength of 0.01 to 1 in hundredths (0.45 is kept, not rounded to 0.5); an upscale
    of 1 to 4 in quarters; CFG scale in halves, to one decimal."""
    from app.core.settings import load_settings

    view = window.settings_view
    denoise = view.editors["hires_denoise"].input
    assert (denoise.decimals(), denoise.singleStep()) == (2, 0.05)
    assert view.editors["hires_scale"].input.singleStep() == 0.25
    assert (view.editors["cfg"].input.decimals(), view.editors["cfg"].input.singleStep()) == (
        1,
        0.5,
    )
    denoise.setValue(0.45)
    assert load_settings().settings["hires_denoise"] == 0.45
