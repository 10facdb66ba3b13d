"""The Fixes page: every remembered fix and saved report per model and device, View,
Re-verify, Edit, Forget, "Check all my models" with its summary, and the Health check page
showing a model's last saved report when it is loaded again."""

from __future__ import annotations

import html
from dataclasses import replace

import pytest
from PySide6.QtWidgets import QStyle, QTextBrowser

from app.core.components import Verdict
from app.core.fixing import profiles
from app.core.fixing.quality import Quality
from app.core.health import saved
from app.core.health.fix import fix_summary
from app.core.health.saved import when_words
from app.core.requests.library_check import ModelCheckRow, ModelChecks
from app.core.requests.records import LoadRequest
from app.engine.events import EventState
from app.ui import browser, words
from app.ui.fixes_rows import day_words, quality_words, short_device, verified_words
from tests.support import reports
from tests.support.remembered_fixes import DEVICE, LAYERS, SDXL_KEY, TORCH, remember, save
from tests.support.reports import gtx_1660_super, on_a_cpu
from tests.ui.conftest import DEMO_SUMMARY, load_fake_model


def _page(window):
    window.show_page("Fixes")
    view = window.fixes_view
    view.refresh()
    return view


def _cells(view) -> list[list[str]]:
    return [
        [view.table.topLevelItem(i).text(c) for c in range(view.table.columnCount())]
        for i in range(view.table.topLevelItemCount())
    ]


def _loaded_with_fix(window, engines, fix: profiles.RememberedFix) -> None:
    """The demo loaded, with `fix` remembered for it on the test device."""
    summary = replace(DEMO_SUMMARY, remembered_fix=fix, remembered_on=DEVICE)
    load_fake_model(window, engines, summary)


# The page and its list ------------------------------------------------------------------------


def test_the_page_is_in_the_navigation_and_the_view_menu(window):
    assert "Fixes" in [window.navigation.item(i).text() for i in range(window.navigation.count())]
    view_menu = next(a.menu() for a in window.menuBar().actions() if a.text() == "&View")
    fixes = next(a for a in view_menu.actions() if a.text() == "Fixes")
    fixes.trigger()
    assert window.current_page() == "Fixes"
    shown = window.pages.currentWidget()
    assert shown is window.page_hosts["Fixes"] and shown.page is window.fixes_view


def test_every_fix_and_report_is_listed_per_model_and_device(window):
    fix = remember()
    save()
    save("d" * 64, reports.report())  # a model checked healthy, with no fix
    view = _page(window)
    rows = _cells(view)
    assert len(rows) == 2
    name, device, what, verified, last = rows[0]
    # The device by its short name; the whole name, and torch's version, in its tooltip.
    assert name == "sdxl" and device == "RTX 3060"
    assert view.table.topLevelItem(0).toolTip(1) == f"{DEVICE}, torch {TORCH}"
    # The cell says what the fix does; the check's sentence is in its tooltip.
    assert what == "Keep 1 VAE layer in fp32"
    assert view.table.topLevelItem(0).toolTip(2) == f"{what}\n{fix.summary}"
    assert verified == f"Health check, {day_words(fix.saved_at)}"
    assert view.table.topLevelItem(0).toolTip(3) == verified_words(fix)
    assert last.startswith("Fixable, ")
    assert rows[1][2:4] == ["None needed", "—"] and rows[1][4].startswith("Healthy, ")
    assert not view.empty.isVisible()


def test_an_empty_page_says_how_to_fill_it(window):
    view = _page(window)
    assert _cells(view) == [] and view.empty.isVisible()
    assert not view.view_button.isEnabled() and not view.forget_button.isEnabled()


def test_a_damaged_report_is_named_in_one_sentence_and_the_rest_is_listed(window):
    save()
    save("d" * 64)
    damaged = saved._file("d" * 64, DEVICE)
    damaged.write_text("{cut short")
    view = _page(window)
    assert len(_cells(view)) == 1
    assert view.notice.isVisible() and html.escape(str(damaged)) in view.notice.text.text()


def test_a_fix_whose_model_was_never_checked_is_named_by_the_loaded_model(window, engines):
    fix = remember(DEMO_SUMMARY.profile_key)
    _loaded_with_fix(window, engines, fix)
    view = _page(window)
    assert _cells(view)[0][0] == "demo"
    assert view.verify_button.isEnabled()  # its file is known: the loaded one


def test_a_fix_of_an_unknown_file_cannot_be_re_verified_and_says_why(window):
    remember("e" * 64)
    view = _page(window)
    assert _cells(view)[0][0].startswith("A model not checked since")
    assert not view.verify_button.isEnabled()
    assert "load it on the Models page" in view.verify_button.toolTip()


# Column widths --------------------------------------------------------------------------------

XEON = "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz"
CPU_TORCH = "2.5.1+cpu"
LONG_NAME = "realisticVisionV60B1_v51HyperVAE_merged_with_dreamshaperXL"


def _long_names() -> None:
    """SDXL under a long file name, fixed on a CPU with a long name, and a second model checked
    healthy there."""
    cpu = replace(reports.RTX_3060, kind="cpu", name=XEON)
    sdxl = replace(reports.SDXL, name=LONG_NAME)
    saved.save_report(SDXL_KEY, reports.result(replace(reports.fixable(), model=sdxl, device=cpu)))
    profiles.remember_fix(
        SDXL_KEY,
        XEON,
        {"fp32_modules": LAYERS},
        "The VAE overflowed; 1 VAE layer in fp32.",
        "health check",
        torch_version=CPU_TORCH,
    )
    saved.save_report("d" * 64, reports.result(reports.report(device=cpu)))


def _sized(qtbot, window, width: int, height: int):
    window.resize(width, height)
    view = _page(window)
    qtbot.wait(50)  # let the layouts take the size
    return view.table


def _shown_whole(table, row: int, column: int) -> bool:
    """Whether the cell's text fits its column unelided (Qt's item delegate keeps the focus
    frame's margin and a pixel clear on each side of it)."""
    margin = table.style().pixelMetric(QStyle.PixelMetric.PM_FocusFrameHMargin, None, table) + 1
    text = table.topLevelItem(row).text(column)
    return table.fontMetrics().horizontalAdvance(text) + 2 * margin <= table.columnWidth(column)


def _column(table, name: str) -> int:
    return [table.headerItem().text(c) for c in range(table.columnCount())].index(name)


def test_at_1024_the_device_is_short_and_whole_and_only_the_models_name_gives_way(qtbot, window):
    _long_names()
    table = _sized(qtbot, window, 1024, 700)
    assert [row[1] for row in _cells(window.fixes_view)] == ["Xeon Platinum 8375C"] * 2
    assert table.topLevelItem(0).toolTip(1) == f"{XEON}, torch {CPU_TORCH}"
    for name in ("Device", "Fix", "Verified by", "Last check"):
        for row in range(table.topLevelItemCount()):
            assert _shown_whole(table, row, _column(table, name)), (name, row)
    # The long name is elided, and whole in its tooltip.
    assert not _shown_whole(table, 0, 0)
    assert table.topLevelItem(0).toolTip(0).startswith(LONG_NAME)
    assert table.horizontalScrollBar().maximum() == 0


def test_at_1920_the_fix_column_has_the_most_of_the_spare_width(qtbot, window):
    _long_names()
    table = _sized(qtbot, window, 1920, 1080)
    for row in range(table.topLevelItemCount()):
        for column in range(table.columnCount()):
            assert _shown_whole(table, row, column), (row, column)
    widths = [table.columnWidth(c) for c in range(table.columnCount())]
    device, fix = widths[_column(table, "Device")], widths[_column(table, "Fix")]
    assert max(widths) == fix and device < table.viewport().width() / 8
    assert sum(widths) == table.viewport().width()  # no gap at the right, no scrolling


def test_the_same_model_on_one_device_under_two_torch_versions_says_which_is_which(window):
    remember()
    profiles.remember_fix(
        SDXL_KEY, DEVICE, {"fp32_modules": LAYERS}, "Again.", "health check", torch_version="2.9"
    )
    view = _page(window)
    assert sorted(row[1] for row in _cells(view)) == [
        "RTX 3060 · torch 2.9",
        f"RTX 3060 · torch {TORCH}",
    ]


@pytest.mark.parametrize(
    ("name", "short"),
    [
        ("NVIDIA GeForce RTX 3060", "RTX 3060"),
        ("NVIDIA H100 80GB HBM3", "H100 80GB HBM3"),
        ("Intel(R) Core(TM) i7-10700K CPU @ 3.80GHz", "Core i7-10700K"),
        ("Intel(R) Xeon(R) Processor", "Xeon"),
        ("AMD Ryzen 9 5950X 16-Core Processor", "Ryzen 9 5950X"),
        ("AMD Radeon RX 7900 XTX", "Radeon RX 7900 XTX"),
        ("Apple M2 Pro", "Apple M2 Pro"),
        ("CPU", "CPU"),
    ],
)
def test_a_devices_short_name_is_its_products(name, short):
    assert short_device(name) == short


# The selected row in full ---------------------------------------------------------------------

ISLANDS = ["vae:decoder.up_blocks.2.resnets.1.conv2", "vae:decoder.up_blocks.2.resnets.1.norm2"]


def _checked_fix(quality: Quality) -> profiles.RememberedFix:
    """Two VAE layers in fp32, remembered with the sentence the health check writes."""
    tested = reports.plan()
    fixed = reports.plan(modules={"vae": {e.partition(":")[2]: "fp32" for e in ISLANDS}})
    summary = fix_summary(["vae"], ["keep 2 layers of the VAE in fp32"], tested, fixed, quality)
    return profiles.remember_fix(
        SDXL_KEY,
        DEVICE,
        {"fp32_modules": ISLANDS},
        summary,
        "health check",
        torch_version=TORCH,
        made_at=tested.dtype_settings(),
    )


def _detail(view) -> str:
    return view.detail.toPlainText().replace("\u200b", "")  # break opportunities in paths


def test_the_selected_fix_is_said_in_full_and_forget_acts_on_it(window):
    fix = _checked_fix(Quality(55.3))
    save()
    save("d" * 64, reports.report(model=replace(reports.SDXL, name="flux", source="/m/flux")))
    view = _page(window)
    assert view.detail.isVisible()
    text = _detail(view)
    assert f"sdxl\nOn: {DEVICE}, torch {TORCH}" in text
    assert "Fix: Keep 2 VAE layers in fp32" in text
    assert "Where: the VAE, which turns the finished latents into pixels." in text
    assert "Layers in fp32 (2):" in text
    for entry in ISLANDS:
        path = entry.partition(":")[2]
        said = words.describe_module("vae", path).removesuffix(", in the VAE")
        assert f"{path} in the VAE: {said}" in text
    assert "Proved at: fp16 everywhere, the precision it is a fix for" in text
    assert f"Proved by: the health check, {when_words(fix.saved_at)}." in text
    assert (
        "How well it worked: Matches full precision closely: its output was within about 0.17% "
        "of an fp32 run of the same inputs (55.3 dB signal-to-noise; a fix counts as verified "
        "from 20 dB, about 10%)."
    ) in text
    # The last check's headline, its figure in words as the Health check page says it.
    assert "Last check: Fixable, " not in text and ": Fixable: at your settings" in text
    assert "verified fix (identical to full precision): run the VAE in fp32." in text

    # Another row selected: the pane follows it.
    view.table.setCurrentItem(view.table.topLevelItem(1))
    text = _detail(view)
    assert "Fix: none needed: the last check found this model safe here." in text
    assert "Keep 2 layers" not in text and "Last check: Healthy, " not in text
    assert ": Healthy " in text

    # Forget and Re-verify act on the row the pane shows.
    asked = []
    window.dialogs.confirm = lambda *args, **kwargs: asked.append(args) or True
    assert view.forget()
    assert asked[0][1] == f"Forget the saved health report of flux on {DEVICE}?"
    assert [s.profile_key for s in profiles.stored_fixes().fixes] == [SDXL_KEY]
    assert [row.profile_key for row in view.rows] == [SDXL_KEY]
    assert "Keep 2 VAE layers in fp32" in _detail(view)


def test_a_fix_with_no_figure_or_edited_since_says_so_instead(window, engines):
    fix = remember(DEMO_SUMMARY.profile_key)  # saved without a figure
    _loaded_with_fix(window, engines, fix)
    view = _page(window)
    assert (
        "How well it worked: no figure kept: the health check that proved it did not compare "
        "it with an fp32 run."
    ) in _detail(view)
    editor = view.edit()
    assert editor is not None
    editor.editors["fp32_modules"].setPlainText("vae:decoder.conv_in")
    editor.accept()
    text = _detail(view)
    assert "How well it worked: not measured since you edited it." in text
    assert "edited by you" in text and "decoder.conv_in in the VAE: the input convolution" in text


def test_a_row_without_a_remembered_fix_says_what_the_check_found(window):
    kept = save()  # fixable, by a plain setting: nothing remembered for the model
    view = _page(window)
    assert _cells(view)[0][2] == "None remembered"
    text = _detail(view)
    assert f"The check found: {kept.fix_summary}" in text
    assert "Fix: none remembered." in text


@pytest.mark.parametrize(
    ("quality", "said"),
    [
        (Quality(200.0), "Identical to full precision: its output was the same as an fp32 run"),
        (Quality(25.0), "Close enough to full precision: its output was within about 5.6% of"),
        (Quality(4.2), "Differs from full precision: its output was about 62% off an fp32 run"),
        (Quality(float("-inf")), "Differs from full precision: its output was not finite"),
    ],
)
def test_the_quality_figure_is_said_in_plain_words(quality, said):
    """From the data, and from a sentence kept as text (read back by `diagnosis`, which
    writes it) alike."""
    from app.core.fixing.quality import qualities_in

    assert quality_words(quality).startswith(said)
    sentence = f"Verified by re-running it with the fix: finite, and {quality.words()}."
    (read_back,) = qualities_in(sentence)
    assert quality_words(read_back).startswith(said)
    assert qualities_in("Verified by repairing the image, which came out finite.") == []
    assert quality_words(None) == ""


# The fix's words ------------------------------------------------------------------------------


def test_the_fix_is_named_as_on_the_models_page_and_inside_sentences(window, engines):
    fix = remember()
    save()
    view = _page(window)
    models_page = browser.health_by_model(
        saved.saved_reports().reports, profiles.stored_fixes().fixes
    )
    [health] = models_page.values()
    assert _cells(view)[0][2] == health.fix == words.fix_short(fix.settings)
    assert f"Fix: {health.fix}" in _detail(view)
    # Inside a sentence it starts lower case, its names as they are ("VAE", not "vae").
    load_fake_model(window, engines)
    asked = []
    window.dialogs.confirm = lambda *args, **kwargs: asked.append(args) or False
    view.reverify()
    assert "with the fix: keep 1 VAE layer in fp32." in asked[0][2]


def test_a_transformer_models_fix_says_transformer_whether_loaded_or_not(window, engines):
    profiles.remember_fix(
        SDXL_KEY,
        DEVICE,
        {"unet_precision": "bf16"},
        "The transformer overflowed in fp16; run it in bf16.",
        "health check",
        torch_version=TORCH,
        parts=("text_encoder", "text_encoder_2", "transformer", "vae"),
    )
    view = _page(window)  # the demo (a UNet) loaded, not this model
    assert _cells(view)[0][2] == "Run the transformer in bf16"
    fixes = profiles.stored_fixes().fixes
    [health] = browser.health_by_model([], fixes, loaded=(SDXL_KEY, "flux.gguf")).values()
    assert health.fix == "Run the transformer in bf16"


# View -----------------------------------------------------------------------------------------


def test_view_shows_the_saved_report_and_the_fix(window):
    remember()
    save()
    view = _page(window)
    dialog = view.view()
    assert dialog is not None and dialog.isVisible()
    text = dialog.findChild(QTextBrowser).toPlainText()
    assert "HalfSafe health check: sdxl" in text  # the report's own Markdown
    assert "Layers in fp32" in text and LAYERS[0] in text
    assert "health check" in text and TORCH in text
    dialog.reject()


# Forget ---------------------------------------------------------------------------------------


def test_forget_asks_first_then_removes_the_fix_and_report_and_refreshes_the_loaded_model(
    window, engines
):
    fix = remember(DEMO_SUMMARY.profile_key)
    save(DEMO_SUMMARY.profile_key)
    _loaded_with_fix(window, engines, fix)
    view = _page(window)
    asked = []
    window.dialogs.confirm = lambda *args, **kwargs: asked.append(args) or False
    assert not view.forget()
    assert profiles.stored_fixes().fixes and saved.saved_reports().reports
    assert "the remembered fix and the saved health report" in asked[0][1]

    health = window.health_view
    assert health.markdown  # the saved report, shown on the Health check page
    window.dialogs.confirm = lambda *args, **kwargs: True
    assert view.forget()
    assert profiles.stored_fixes().fixes == [] and saved.saved_reports().reports == []
    assert window.state.model is not None and window.state.model.remembered_fix is None
    assert _cells(view) == []
    # Forgotten there too: no saved report left to show, copy or export.
    assert not health.markdown and not health.verdict.isVisible()
    assert not health.copy_button.isEnabled()


def test_forgetting_a_repair_remembered_after_the_load_leaves_no_fix_in_the_status_bar(
    window, engines
):
    """A generation's repair is remembered by the engine over the fix the model loaded with,
    and the window's summary still holds that older one. Forget then changed nothing the
    status bar reads: it went on naming the forgotten fix's layers."""
    here = replace(gtx_1660_super().devices[0], name=DEVICE)
    window.state.set_hardware(replace(gtx_1660_super(), devices=[here], torch=TORCH))
    window.state.apply({"precision": "fp16"})
    _loaded_with_fix(window, engines, remember(DEMO_SUMMARY.profile_key))
    assert "1 VAE layer in fp32" in window.precision_status.text()
    repair = LAYERS + ["vae:decoder.up_blocks.3.resnets.0.conv1"]
    profiles.remember_fix(
        DEMO_SUMMARY.profile_key,
        DEVICE,
        {"fp32_modules": repair},
        "The VAE overflowed; 2 VAE layers in fp32.",
        "generation repair",
        torch_version=TORCH,
    )
    # What the generation that made the repair ran with, as the Generate page says it.
    window.state.set_effective(
        words.precision_summary({"precision": "fp16", "fp32_modules": repair})
    )
    assert "layers in fp32" in window.precision_status.text()

    view = _page(window)
    window.dialogs.confirm = lambda *args, **kwargs: True
    assert view.forget()
    assert profiles.stored_fixes().fixes == []
    assert window.state.model is not None and window.state.model.remembered_fix is None
    assert "in fp32" not in window.precision_status.text(), window.precision_status.text()


def test_forgetting_another_models_fix_leaves_the_loaded_models_summary_alone(window, engines):
    mine = remember(DEMO_SUMMARY.profile_key)
    _loaded_with_fix(window, engines, mine)
    remember()
    save()
    view = _page(window)
    sdxl = next(i for i, row in enumerate(view.rows) if row.profile_key == SDXL_KEY)
    view.table.setCurrentItem(view.table.topLevelItem(sdxl))
    window.dialogs.confirm = lambda *args, **kwargs: True
    view.forget()
    assert [s.profile_key for s in profiles.stored_fixes().fixes] == [DEMO_SUMMARY.profile_key]
    assert window.state.model is not None and window.state.model.remembered_fix == mine


# Edit -----------------------------------------------------------------------------------------


def test_edit_validates_the_layer_lists_through_the_schema_before_saving(window, engines):
    fix = remember(DEMO_SUMMARY.profile_key)
    _loaded_with_fix(window, engines, fix)
    view = _page(window)
    editor = view.edit()
    assert editor is not None
    assert editor.editors["fp32_modules"].toPlainText() == LAYERS[0]

    editor.editors["fp32_modules"].setPlainText("decoder.conv_in")
    editor.accept()
    assert editor.isVisible() and "Layers in fp32" in editor.problem.text()
    assert profiles.stored_fixes().fixes[0].fix == fix  # nothing saved

    edited = ["vae:decoder.conv_in", "vae:decoder.up_blocks.0.resnets.0.conv1"]
    editor.editors["fp32_modules"].setPlainText("\n".join(edited) + "\n\n")
    editor.accept()
    assert not editor.isVisible()
    [stored] = profiles.stored_fixes().fixes
    assert stored.fix.settings == {"fp32_modules": edited}
    assert stored.fix.edited_at is not None and stored.fix.verified_by == "health check"
    # The loaded model's summary says what jobs now run with.
    assert window.state.model is not None and window.state.model.remembered_fix == stored.fix
    assert _cells(view)[0][3].startswith("Edited by you, ")
    assert view.notice.text.text().startswith("Saved the fix of demo")

    # Forgotten, it is no longer "saved": the banner says what happened instead.
    window.dialogs.confirm = lambda *args, **kwargs: True
    assert view.forget()
    assert "Saved" not in view.notice.text.text()
    assert view.notice.text.text() == "Forgot the remembered fix of demo."
    # Away and back (a check on another page may remember a new fix): it said so of then.
    window.show_page("Health check")
    window.show_page("Fixes")
    assert view.notice.isHidden()


def test_an_edit_that_leaves_no_layers_is_refused_with_forget_named(window):
    remember()
    view = _page(window)
    editor = view.edit()
    assert editor is not None
    editor.editors["fp32_modules"].setPlainText("")
    editor.accept()
    assert editor.isVisible() and "Forget" in editor.problem.text()
    editor.reject()


def test_an_edit_naming_a_layer_the_loaded_model_lacks_is_refused_naming_it(window, engines):
    fix = remember(DEMO_SUMMARY.profile_key)
    layers = {"vae": ("decoder", "decoder.conv_in", "decoder.up_blocks.2.resnets.1.conv2")}
    summary = replace(DEMO_SUMMARY, remembered_fix=fix, remembered_on=DEVICE, layers=layers)
    load_fake_model(window, engines, summary)
    view = _page(window)
    editor = view.edit()
    assert editor is not None
    editor.editors["fp32_modules"].setPlainText("vae:decoder.conv_in\nvae:decoder.no_such_layer")
    editor.accept()
    assert editor.isVisible()
    assert editor.problem.text() == (
        "Not saved: Layers in fp32: vae:decoder.no_such_layer is not a layer of demo."
    )
    assert profiles.stored_fixes().fixes[0].fix == fix  # nothing saved
    editor.editors["fp32_modules"].setPlainText("vae:decoder.conv_in")
    editor.accept()
    assert not editor.isVisible()
    assert profiles.stored_fixes().fixes[0].fix.settings == {
        "fp32_modules": ["vae:decoder.conv_in"]
    }


# Re-verify ------------------------------------------------------------------------------------


def test_re_verify_says_what_happens_before_unloading_then_checks_with_the_fix(window, engines):
    remember()
    save()
    load_fake_model(window, engines)
    view = _page(window)
    asked = []
    window.dialogs.confirm = lambda *args, **kwargs: asked.append(args) or False
    assert view.reverify() is None and engines.current.jobs("check_models") == []
    assert "unloads demo, loads sdxl" in asked[0][2] and "loads demo again" in asked[0][2]

    window.dialogs.confirm = lambda *args, **kwargs: True
    view.reverify()
    job = engines.current.last_job("check_models")
    assert job.params.models == (reports.SDXL.source,)
    assert job.params.precision.fp32_modules == tuple(LAYERS)  # with its fix
    assert not view.verify_button.isEnabled() and not view.check_all_button.isEnabled()

    row = ModelCheckRow(reports.SDXL.source, "sdxl.safetensors", Verdict.HEALTHY, "Safe.")
    engines.current.finish(
        job,
        ModelChecks((row,), loaded=DEMO_SUMMARY, loaded_request=LoadRequest("demo")),
    )
    assert view.notice.level == "good"
    assert "Re-verified sdxl at fp16 everywhere with its fix:" in view.notice.text.text()
    assert view.verify_button.isEnabled()
    assert window.state.model == DEMO_SUMMARY
    assert view.run_table.isVisible()
    # Forgotten, the run's summary goes too: it was checked with what is now forgotten.
    view.table.setCurrentItem(view.table.topLevelItem(0))
    window.dialogs.confirm = lambda *args, **kwargs: True
    assert view.forget()
    assert not view.run_table.isVisible() and not view.run_title.isVisible()


def test_re_verifying_the_loaded_model_asks_nothing(window, engines):
    fix = remember(DEMO_SUMMARY.profile_key)
    _loaded_with_fix(window, engines, fix)
    view = _page(window)
    window.dialogs.confirm = lambda *args, **kwargs: (_ for _ in ()).throw(AssertionError)
    view.reverify()
    assert engines.current.last_job("check_models").params.models == ("demo",)


def _on_the_cpu(window) -> str:
    """The window's device made a CPU whose Auto is fp32 everywhere; returns its name."""
    cpu = on_a_cpu(
        gtx_1660_super(), precision="fp32", no_half=False, no_half_vae=False, allow_tf32=True
    )
    window.state.set_hardware(cpu)
    return cpu.devices[0].name


def test_re_verify_runs_the_fix_at_the_precision_it_was_proved_at(window, engines):
    """At Auto on a CPU every part runs in fp32, where a fix for fp16 passes without running:
    Re-verify runs the model at fp16 with the fix, and says so."""
    device = _on_the_cpu(window)
    assert window.state.settings["precision"] == "auto"
    proved_at = {"precision": "fp16", "unet_precision": "fp16", "vae_precision": "fp16"}
    profiles.remember_fix(
        SDXL_KEY,
        device,
        {"fp32_modules": LAYERS},
        "The VAE overflowed; 1 VAE layer in fp32.",
        "health check",
        torch_version=TORCH,
        made_at={**proved_at, "no_half": False, "no_half_vae": False},
    )
    saved.save_report(
        SDXL_KEY,
        reports.result(replace(reports.fixable(), device=replace(reports.RTX_3060, name=device))),
    )
    load_fake_model(window, engines)
    view = _page(window)
    asked = []
    window.dialogs.confirm = lambda *args, **kwargs: asked.append(args) or True
    view.reverify()
    assert "runs it at fp16 everywhere, the precision the fix is for" in asked[0][2]
    assert "keep 1 VAE layer in fp32" in asked[0][2]
    assert "A CPU computes fp16 slowly" in asked[0][2]
    precision = engines.current.last_job("check_models").params.precision
    assert (precision.precision, precision.unet_precision, precision.vae_precision) == (
        "fp16",
        "fp16",
        "fp16",
    )
    assert precision.fp32_modules == tuple(LAYERS) and not precision.no_half
    assert "at fp16 everywhere with its fix" in view.stage.text()


def test_a_fix_saved_without_its_precision_is_re_verified_at_fp16(window, engines):
    window.state.set_setting("no_half", True)  # which would run the fix in fp32
    fix = remember(DEMO_SUMMARY.profile_key)
    assert fix.made_at == {} and fix.proved_at()["precision"] == "fp16"
    _loaded_with_fix(window, engines, fix)
    view = _page(window)
    view.reverify()
    precision = engines.current.last_job("check_models").params.precision
    assert precision.precision == "fp16" and not precision.no_half
    assert precision.fp32_modules == tuple(LAYERS)


def test_a_fix_the_device_cannot_run_is_said_not_checked(window, engines):
    device = _on_the_cpu(window)
    fix = profiles.remember_fix(
        DEMO_SUMMARY.profile_key,
        device,
        {"attention_backend": "efficient", "fp16_reduced_precision_reduction": False},
        "Memory-efficient attention, full-precision sums.",
        "health check",
        torch_version=TORCH,
    )
    _loaded_with_fix(window, engines, fix)
    view = _page(window)
    assert view.reverify() is None
    assert engines.current.jobs("check_models") == []
    assert view.notice.level == "warn"
    assert "changes only what a CUDA GPU runs" in view.notice.text.text()
    assert f"a check on {device} cannot prove it" in view.notice.text.text()


# Check all my models --------------------------------------------------------------------------


def test_check_all_runs_one_job_shows_progress_and_ends_with_a_summary(window, engines, tmp_path):
    window.state.set_setting("model_folders", [str(tmp_path)])
    load_fake_model(window, engines)
    view = _page(window)
    asked = []
    window.dialogs.confirm = lambda *args, **kwargs: asked.append(args) or True
    view.check_all_button.click()
    assert "demo is unloaded meanwhile and loaded again" in asked[0][2]
    job = engines.current.last_job("check_models")
    assert job.params.models is None and job.params.folders == (str(tmp_path),)

    engines.current.emit(
        job, EventState.PROGRESS, stage="b.safetensors (2 of 3): Checking the VAE", done=1, total=3
    )
    assert view.progress.value() == 1 and view.progress.maximum() == 3
    assert "b.safetensors (2 of 3)" in view.stage.text()
    view.cancel_button.click()
    assert engines.current.cancels() == [job.job_id]

    save()  # the engine kept the report of what it checked
    rows = (
        ModelCheckRow("/m/a.safetensors", "a.safetensors", Verdict.HEALTHY, "Healthy."),
        ModelCheckRow("/m/b.safetensors", "b.safetensors", Verdict.FIXABLE, "Fix.", "VAE fp32"),
        ModelCheckRow("/m/c.safetensors", "c.safetensors", None, "c.safetensors is damaged."),
    )
    run = ModelChecks(rows, cancelled=True, loaded=DEMO_SUMMARY, loaded_request=LoadRequest("demo"))
    engines.current.finish(job, run)
    summary = [
        [view.run_table.topLevelItem(i).text(c) for c in range(3)]
        for i in range(view.run_table.topLevelItemCount())
    ]
    assert summary == [
        ["a.safetensors", "Healthy", "None needed"],
        ["b.safetensors", "Fixable", "VAE fp32"],
        ["c.safetensors", "Not checked", "c.safetensors is damaged."],
    ]
    assert view.run_title.text() == (
        "Checked 2 models: 1 healthy, 1 fixable; 1 not checked. Cancelled before the end."
    )
    assert len(_cells(view)) == 1  # the list is read again
    assert view.check_all_button.isEnabled() and not view.progress.isVisible()


def test_the_last_runs_fix_says_its_figure_in_words_and_is_whole_in_its_tooltip(window, engines):
    view = _page(window)
    window.dialogs.confirm = lambda *args, **kwargs: True
    view.check_all()
    fixed = reports.plan(dtypes={"vae": "fp32"})
    summary = fix_summary(["vae"], ["run the VAE in fp32"], reports.plan(), fixed, Quality(47.3))
    row = ModelCheckRow("/m/b.safetensors", "b.safetensors", Verdict.FIXABLE, "Fixable.", summary)
    engines.current.finish(engines.current.last_job("check_models"), ModelChecks((row,)))
    item = view.run_table.topLevelItem(0)
    said = "Verified by re-running it with the fix: finite, and matches full precision closely."
    assert said in item.text(2)
    assert item.toolTip(2) == f"{item.text(2)}\nFixable."
    assert view.run_table.horizontalScrollBar().maximum() == 0


def test_a_run_that_could_not_load_the_users_model_again_says_so_and_shows_none(window, engines):
    load_fake_model(window, engines)
    view = _page(window)
    window.dialogs.confirm = lambda *args, **kwargs: True
    view.check_all()
    job = engines.current.last_job("check_models")
    problem = "demo could not be loaded again: out of memory."
    engines.current.finish(job, ModelChecks((), restore_problem=problem))
    assert window.state.model is None
    assert problem in view.run_title.text()


def test_check_all_asks_first(window, engines):
    view = _page(window)
    window.dialogs.confirm = lambda *args, **kwargs: False
    assert view.check_all() is None
    assert engines.started == [] or engines.current.jobs("check_models") == []


# The Health check page ------------------------------------------------------------------------


def test_a_model_loaded_again_shows_its_last_saved_report_until_a_check_runs(window, engines):
    health = reports.fixable()
    save(DEMO_SUMMARY.profile_key, health)
    load_fake_model(window, engines)
    page = window.health_view
    assert page.verdict.level == "warn"
    # The headline up to its agreement figure, which the page says in plain words.
    assert html.escape(health.headline.partition(" (")[0]) in page.verdict.text.text()
    assert DEVICE in page.verdict.text.text()
    assert page.markdown == reports.MARKDOWN and page.copy_button.isEnabled()

    # A check of its own replaces it, and a refreshed summary of the same model keeps that.
    page.run_check()
    demo = reports.report(model=replace(reports.SDXL, source="demo", name="demo"))
    engines.current.finish(engines.current.last_job("check"), reports.result(demo))
    window.state.set_model(DEMO_SUMMARY, window.state.model_request)
    assert page.report is not None and page.verdict.level == "good"


def test_a_model_with_no_saved_report_shows_none(window, engines):
    save()  # another model's
    load_fake_model(window, engines)
    page = window.health_view
    assert not page.verdict.isVisible() and page.markdown == ""
    assert not page.copy_button.isEnabled()


def test_a_run_that_found_no_model_says_why(window, engines, tmp_path):
    view = _page(window)
    window.dialogs.confirm = lambda *args, **kwargs: True
    for folders, why in (
        ([], "no model folder is set. Add the folders that hold your models in Settings"),
        ([str(tmp_path)], f"none was found in your model folders ({tmp_path})"),
    ):
        window.state.set_setting("model_folders", folders)
        view.check_all()
        engines.current.finish(engines.current.last_job("check_models"), ModelChecks(()))
        assert view.run_title.text().startswith(f"Checked 0 models: {why}")
        assert "the built-in demos are not checked here" in view.run_title.text().lower()
