"""The Fixes page's words: a check that ran only in fp32 is not called healthy without saying
what it did not prove, and a fix's name in a narrow column is cut between words, never in
the middle of one."""

from __future__ import annotations

import pytest
from PySide6.QtWidgets import QStyleOptionViewItem, QTreeWidgetItem

from app.core.components import Verdict
from app.core.health import saved
from app.core.requests.library_check import ModelCheckRow, ModelChecks
from app.ui.widgets import FittedTree
from tests.support import reports


def _page(window):
    window.show_page("Fixes")
    view = window.fixes_view
    view.refresh()
    return view


def _cells(view) -> list[str]:
    item = view.table.topLevelItem(0)
    return [item.text(c) for c in range(view.table.columnCount())]


def test_a_check_that_ran_only_in_fp32_says_it_proved_nothing_of_half_precision(window, engines):
    kept = saved.save_report("c" * 64, reports.result(reports.healthy_with_advice()))
    assert kept is not None and kept.verdict is Verdict.HEALTHY
    view = _page(window)
    cells = _cells(view)
    assert cells[4].startswith("Healthy in fp32 only, "), cells
    assert cells[2] == "None needed in fp32"
    detail = view.detail.toPlainText()
    assert "Last check: Healthy in fp32 only, " in detail, detail
    assert "proved nothing about half precision (fp16 or bf16)" in detail
    assert "found this model safe here" not in detail

    # "Check all my models" says the same of the report its run saved.
    window.dialogs.confirm = lambda *args, **kwargs: True
    view.check_all()
    row = ModelCheckRow(kept.source, "sdxl.safetensors", Verdict.HEALTHY, kept.headline)
    engines.current.finish(engines.current.last_job("check_models"), ModelChecks((row,)))
    item = view.run_table.topLevelItem(0)
    assert (item.text(1), item.text(2)) == ("Healthy in fp32 only", "None needed in fp32")


def test_a_check_that_ran_in_fp16_is_healthy_as_before(window):
    saved.save_report("c" * 64, reports.result(reports.report()))
    cells = _cells(_page(window))
    assert cells[4].startswith("Healthy, ") and cells[2] == "None needed"


FIX = "Keep 2 VAE layers in bf16 and run the text encoder in fp32"


def test_a_narrow_column_cuts_a_fix_between_words(qtbot):
    tree = FittedTree(("Model", "Fix"), (1, 1), (1,))
    qtbot.addWidget(tree)
    tree.addTopLevelItem(QTreeWidgetItem(["sdxl.safetensors", FIX]))
    tree.resize(260, 200)
    tree.show()
    qtbot.waitExposed(tree)
    tree.header().resizeSection(1, 150)
    index = tree.model().index(0, 1)
    option = QStyleOptionViewItem()
    option.initFrom(tree)
    option.rect = tree.visualRect(index)
    delegate = tree.itemDelegateForIndex(index)
    delegate.initStyleOption(option, index)
    shown = delegate.shown_text(option)
    assert shown != FIX and shown.endswith("…"), shown
    words = shown.removesuffix("…").split(" ")
    assert words == FIX.split(" ")[: len(words)], shown  # whole words only
    assert option.fontMetrics.horizontalAdvance(shown) <= option.rect.width()


@pytest.mark.parametrize(
    ("text", "width_of", "shown"),
    [
        (FIX, "Keep 2 VAE layers in bf16 an", "Keep 2 VAE layers in bf16…"),
        (FIX, FIX, FIX),
        (FIX, "Ke", None),  # not even the first word: cut at its end
    ],
)
def test_elide_words_cuts_after_the_last_whole_word(qtbot, text, width_of, shown):
    from app.ui.widgets import elide_words

    tree = FittedTree(("Fix",), (1,), (0,))
    qtbot.addWidget(tree)
    metrics = tree.fontMetrics()
    said = elide_words(text, metrics, metrics.horizontalAdvance(width_of))
    if shown is not None:
        assert said == shown
    else:
        assert said.endswith("…") and metrics.horizontalAdvance(said) <= metrics.horizontalAdvance(
            width_of
        )
