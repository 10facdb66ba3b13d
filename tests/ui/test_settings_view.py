"""The settings panel is generated from the schema: every field has an editor, every editor
saves, and `auto` says what it resolves to."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from PySide6.QtWidgets import QCheckBox, QComboBox, QDoubleSpinBox, QLineEdit, QListWidget, QSpinBox

from app.core.profiles import RememberedFix
from app.core.settings import FIELDS, GROUPS, PRECISION_KEYS, SCHEMA, Field, load_settings
from app.engine.events import EventState
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
        return field.default + 1.0
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
    elif isinstance(widget, QComboBox) and not widget.isEditable():
        widget.setCurrentIndex(widget.findData(value))
    elif isinstance(widget, QComboBox):
        widget.setEditText(value)
        widget.lineEdit().editingFinished.emit()
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


def test_there_is_an_editor_for_every_schema_field_with_help_visible(window):
    view = window.settings_view
    assert set(view.editors) == {f.key for f in SCHEMA}
    for field in SCHEMA:
        assert view.editors[field.key].toolTip() == field.help
        assert view.editors[field.key].input.toolTip() == field.help
    labels = {w.text() for w in view.findChildren(type(view.notice)) if w.text()}
    for field in SCHEMA:
        assert field.help in labels, f"help for {field.key} is not visible"
    for group in {f.group for f in SCHEMA}:
        assert group in GROUPS and group in labels


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
