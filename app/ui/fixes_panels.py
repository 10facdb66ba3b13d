"""The Fixes page's widgets: the run's row (Check all my models, Cancel, its bar and stage), the
list of what was learned with the pane saying the selected row in full under it, the row's
buttons (View, Re-verify, Edit, Forget), the window View opens (the fix and the saved report),
and the table of the last "Check all my models" run. The page connects their signals to its
own slots."""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QHBoxLayout,
    QProgressBar,
    QPushButton,
    QSplitter,
    QTextBrowser,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.core.fixing.quality import plain_figures
from app.core.health.saved import SavedReport
from app.core.requests.library_check import ModelChecks
from app.ui import words
from app.ui.fixes_detail import fix_markdown
from app.ui.fixes_rows import (
    LearnedRow,
    cells,
    no_fix_cell,
    place_of,
    same_row,
    tips,
    verdict_words,
)
from app.ui.widgets import FittedTree, label, primary_button


class RunControls(QWidget):
    """Check all my models and Cancel, beside the run's bar and stage line."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.check_all_button = primary_button("Check all my models")
        self.check_all_button.setToolTip(
            "Load each model in your model folders in turn and run the health check on it; "
            "the model you have loaded is loaded again at the end."
        )
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setToolTip(
            "Stop the run: the models checked so far keep their reports, and your model is "
            "loaded again."
        )
        self.cancel_button.setEnabled(False)
        self.progress = QProgressBar()
        self.progress.setTextVisible(False)
        self.progress.setMaximumWidth(220)
        self.progress.hide()
        self.stage = label("", "muted", wrap=True)
        controls = QHBoxLayout(self)
        controls.setContentsMargins(0, 0, 0, 0)
        controls.addWidget(self.check_all_button)
        controls.addWidget(self.cancel_button)
        controls.addWidget(self.progress)
        controls.addWidget(self.stage, 1)

    def start(self, stage: str) -> None:
        """A run started, at `stage` (in words): the bar busy, Cancel usable."""
        self.stage.setText(stage)
        self.progress.setRange(0, 0)
        self.progress.show()
        self.cancel_button.setEnabled(True)

    def finish(self) -> None:
        """The run ended: no bar, Cancel idle."""
        self.progress.hide()
        self.cancel_button.setEnabled(False)


def fill_learned_table(
    table: FittedTree, rows: Sequence[LearnedRow], selected: LearnedRow | None
) -> None:
    """A line per row in `table`, with the `selected` row current again where it still exists
    (else the first)."""
    # A model on one device under two torch versions: the cells say which is which.
    places = [(row.profile_key, row.device) for row in rows]
    table.clear()
    for row in rows:
        item = QTreeWidgetItem(cells(row, with_torch=places.count(place_of(row)) > 1))
        for column, tip in enumerate(tips(row)):
            item.setToolTip(column, tip)
        table.addTopLevelItem(item)
        if selected is not None and same_row(row, selected):
            table.setCurrentItem(item)
    first = table.topLevelItem(0)
    if table.currentItem() is None and first is not None:
        table.setCurrentItem(first)
    table.fit_columns()


def learned_split(table: QTreeWidget, detail: QTextBrowser) -> QSplitter:
    """The list over the detail pane, the pane given the larger share; neither collapses."""
    split = QSplitter(Qt.Orientation.Vertical)
    split.setChildrenCollapsible(False)
    split.addWidget(table)
    split.addWidget(detail)
    split.setStretchFactor(0, 2)
    split.setStretchFactor(1, 3)
    return split


def detail_pane() -> QTextBrowser:
    """The pane under the list: the table says each fix in a few words, this says which
    layers, at what precision, what proved it and how well (`fixes_detail.detail_html`)."""
    detail = QTextBrowser()
    detail.setObjectName("fix-detail")
    detail.setOpenLinks(False)
    detail.setMinimumHeight(120)
    detail.document().setDefaultStyleSheet(
        "h3 { margin-top: 0px; margin-bottom: 6px; } p { margin-top: 0px; margin-bottom: 6px; }"
        " ul { margin-top: 0px; margin-bottom: 6px; }"
    )
    return detail


class RowActions(QWidget):
    """The selected row's buttons, in a row of their own under the list."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.view_button = QPushButton("View")
        self.view_button.setToolTip("Open the saved health report and the fix in a window.")
        self.verify_button = QPushButton("Re-verify")
        self.edit_button = QPushButton("Edit…")
        self.edit_button.setToolTip("Change the layers a fix keeps wider.")
        self.forget_button = QPushButton("Forget…")
        actions = QHBoxLayout(self)
        actions.setContentsMargins(0, 0, 0, 0)
        for button in (self.view_button, self.verify_button, self.edit_button, self.forget_button):
            actions.addWidget(button)
        actions.addStretch(1)


def report_viewer(row: LearnedRow, parent: QWidget) -> QDialog:
    """A window with the row's remembered fix and its saved report (their Markdown), not yet
    open."""
    parts = []
    if row.stored is not None:
        parts.append(fix_markdown(row))
    if row.report is not None:
        parts.append(row.report.markdown)
    else:
        parts.append("No health check of this model on this device has been kept.")
    viewer = QDialog(parent)
    viewer.setWindowTitle(f"{row.name} on {row.device}")
    viewer.resize(760, 640)
    layout = QVBoxLayout(viewer)
    text = QTextBrowser()
    text.setMarkdown("\n\n---\n\n".join(parts))
    layout.addWidget(text)
    buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
    buttons.rejected.connect(viewer.reject)
    layout.addWidget(buttons)
    return viewer


def fill_run_table(table: QTreeWidget, run: ModelChecks, rows: Sequence[LearnedRow]) -> None:
    """A line per model the run checked in `table`: its verdict and fix, said as the page's
    `rows` (read again after the run) say the report it saved."""
    newest: dict[str, SavedReport] = {}
    for learned in rows:
        report = learned.report
        if report is not None and (
            report.source not in newest or report.saved_at > newest[report.source].saved_at
        ):
            newest[report.source] = report
    table.clear()
    for row in run.rows:
        verdict = words.first_upper(row.verdict.value) if row.verdict else "Not checked"
        detail = plain_figures(row.fix if row.verdict is not None else row.words)
        saved = newest.get(row.source)
        if saved is not None and saved.verdict is row.verdict:
            verdict, detail = verdict_words(saved), detail or no_fix_cell(saved)
        item = QTreeWidgetItem([row.name, verdict, detail or "None needed"])
        item.setToolTip(0, row.source)
        # The cell may be elided: the tooltip says it whole, and the check's headline.
        said = (detail, plain_figures(row.words))
        item.setToolTip(2, "\n".join(t for t in dict.fromkeys(said) if t))
        table.addTopLevelItem(item)
