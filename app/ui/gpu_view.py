"""The Devices page (GPUs and the CPU): this computer's devices, what they can do in fp16/bf16, known quirks with their
sources, the self-test, and the recommended settings with the reason for each."""

from __future__ import annotations

import html
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QWidget,
)

from app.core.hardware import DeviceInfo, HardwareReport
from app.core.hardware.selftest_records import SelfTestResult
from app.core.requests.records import HardwareRequest
from app.core.settings import PRECISION_KEYS
from app.engine.events import EngineEvent, EventState
from app.ui import words
from app.ui.dialogs import Dialogs
from app.ui.engine_client import EngineClient
from app.ui.state import AppState
from app.ui.widgets import Card, Chip, hline, label, page_layout, primary_button, scroll_column

_TEST_LEVEL = {"pass": "good", "fail": "bad", "skipped": "muted"}
_FP16_LEVEL = {"fast": "good", "slow": "warn", "unreliable": "bad", "unsupported": "bad"}
_BF16_LEVEL = {"native": "good", "emulated": "warn", "unsupported": "muted"}


class GpuView(QWidget):
    """Shows the hardware report; asks the engine for it the first time the page is shown."""

    def __init__(
        self, state: AppState, client: EngineClient, dialogs: Dialogs, parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self.state = state
        self.client = client
        self.dialogs = dialogs
        self.job_id: int | None = None
        self.apply_buttons: list[tuple[QPushButton, dict[str, Any]]] = []
        self._waiting: list[Any] = []

        layout = page_layout(
            self,
            "Devices",
            "What each device in this computer can do in half precision, the known faults that "
            "apply to it, and the settings HalfSafe recommends, with the reason for each.",
        )
        controls = QHBoxLayout()
        self.check_button = QPushButton("Check again")
        self.check_button.clicked.connect(lambda: self.request(retest=False))
        self.self_test_button = QPushButton("Run the self-test again")
        self.self_test_button.setToolTip(
            "Runs small fp16 and bf16 operations on each device and compares them with fp32; "
            "a few seconds. The result is cached per driver and PyTorch version."
        )
        self.self_test_button.clicked.connect(lambda: self.request(retest=True))
        self.progress = QProgressBar()
        self.progress.setRange(0, 0)
        self.progress.setMaximumWidth(160)
        self.progress.setTextVisible(False)
        self.progress.hide()
        self.status = label("", "muted", wrap=True)
        controls.addWidget(self.check_button)
        controls.addWidget(self.self_test_button)
        controls.addWidget(self.progress)
        controls.addWidget(self.status, 1)
        layout.addLayout(controls)

        self.body = scroll_column(layout)
        self.status.setText("This computer has not been checked yet.")
        state.hardware_changed.connect(self.show_report)
        state.settings_changed.connect(lambda _keys: self._refresh_apply_buttons())

    def showEvent(self, event: Any) -> None:  # noqa: N802 - Qt's name
        super().showEvent(event)
        if self.state.hardware is None and self.job_id is None:
            self.request(retest=False)

    def request(self, retest: bool = False, then: Any = None) -> None:
        """Ask the engine for the hardware report; `then()` runs once it has arrived."""
        if then is not None:
            self._waiting.append(then)
        if self.job_id is not None:
            return
        self.progress.show()
        self.check_button.setEnabled(False)
        self.self_test_button.setEnabled(False)
        self.status.setText(
            "Running the self-test on each device…"
            if retest
            else "Checking this computer's devices…"
        )
        self.job_id = self.client.submit(
            HardwareRequest(self_test=True, retest=retest), self._on_event
        )

    def _on_event(self, event: EngineEvent) -> None:
        if event.state == EventState.PROGRESS and event.stage:
            self.status.setText(f"{event.stage}…")
        if not event.state.final:
            return
        self.job_id = None
        self.progress.hide()
        self.check_button.setEnabled(True)
        self.self_test_button.setEnabled(True)
        waiting, self._waiting = self._waiting, []
        if event.state == EventState.RESULT:
            self.state.set_hardware(event.result_as(HardwareReport))
            for callback in waiting:
                callback()
        elif event.state == EventState.CANCELLED:
            self.status.setText("Cancelled.")
        else:
            self.status.setText("The check did not finish.")
            self.dialogs.job_failed(event)

    # Showing ----------------------------------------------------------------------------------

    def show_report(self, report: HardwareReport) -> None:
        while self.body.count() > 1:
            item = self.body.takeAt(0)
            widget = item.widget() if item is not None else None
            if widget is not None:
                widget.deleteLater()
        self.apply_buttons = []
        devices = report.devices
        versions = f"PyTorch {report.torch}" + (f", CUDA {report.cuda}" if report.cuda else "")
        self.status.setText(
            f"{len(devices)} device{'s' if len(devices) != 1 else ''} found ({versions})."
        )
        for position, device in enumerate(devices):
            self.body.insertWidget(position, self._device_card(device))
        self._refresh_apply_buttons()

    def _device_card(self, device: DeviceInfo) -> Card:
        kind, index = device.kind, device.index
        card = Card(device.name or kind)
        where = kind if index is None else f"{kind}:{index}"
        card.header.insertWidget(1, label(f"({where})", "muted"))
        if self.state.device_report() is device:
            card.header.addWidget(Chip("Used for jobs", "info"))

        facts = QGridLayout()
        facts.setHorizontalSpacing(16)
        facts.setVerticalSpacing(4)
        rows: list[tuple[str, QWidget]] = []
        fp16, bf16 = device.fp16, device.bf16
        rows.append(
            ("fp16", Chip(words.FP16_WORDS.get(fp16, fp16), _FP16_LEVEL.get(fp16, "muted")))
        )
        rows.append(
            ("bf16", Chip(words.BF16_WORDS.get(bf16, bf16), _BF16_LEVEL.get(bf16, "muted")))
        )
        rows.append(("TF32", QLabel("yes" if device.tf32 else "no")))
        if device.capability:
            rows.append(("Compute capability", QLabel(".".join(map(str, device.capability)))))
        if device.memory_total_mb:
            rows.append(("Memory", QLabel(words.megabytes(device.memory_total_mb))))
        if device.driver:
            rows.append(("Driver", QLabel(device.driver)))
        for row, (name, widget) in enumerate(rows):
            facts.addWidget(label(name, "muted"), row, 0)
            facts.addWidget(widget, row, 1, Qt.AlignmentFlag.AlignLeft)
        facts.setColumnStretch(2, 1)
        card.body.addLayout(facts)

        card.body.addWidget(hline())
        card.body.addWidget(label("Known faults that apply", "muted"))
        if device.quirks:
            for quirk in device.quirks:
                source = html.escape(quirk.source)
                text = label(
                    f"• {html.escape(quirk.summary)} <a href='{source}'>Source</a>", wrap=True
                )
                text.setOpenExternalLinks(True)
                text.setToolTip(quirk.source)
                card.body.addWidget(text)
        else:
            card.body.addWidget(label("None known for this device.", wrap=True))

        test = device.self_test or SelfTestResult.skipped()
        card.body.addWidget(hline())
        test_row = QHBoxLayout()
        test_row.addWidget(label("Self-test", "muted"))
        for dtype, result in (("fp16", test.fp16), ("bf16", test.bf16)):
            test_row.addWidget(Chip(f"{dtype}: {result}", _TEST_LEVEL.get(result, "muted")))
        test_row.addStretch(1)
        card.body.addLayout(test_row)
        failed = [d for d in test.details if d.status == "fail"]
        if failed:
            card.body.addWidget(
                label(
                    "Failed: "
                    + ", ".join(f"{d.op} in {d.dtype}" for d in failed)
                    + ". These operations give wrong results here, so HalfSafe avoids them.",
                    wrap=True,
                )
            )
        elif test.fp16 == "skipped" and test.bf16 == "skipped":
            card.body.addWidget(label("Not run yet: use “Run the self-test again”.", "muted"))
        from app.core.advice.kernels import untried_words  # once a report is shown

        kernels = untried_words(device)
        if kernels:
            card.body.addWidget(label(kernels, "muted", wrap=True, selectable=True))

        recommended = dict(device.recommended)
        if recommended:
            card.body.addWidget(hline())
            card.body.addWidget(label("Recommended settings", "muted"))
            card.body.addLayout(self._recommendations(recommended, dict(device.reasons), kind))
            button_row = QHBoxLayout()
            button = primary_button("Apply recommended")
            button.setToolTip("Write these values into your settings; the next job uses them.")
            button.clicked.connect(lambda _checked=False, r=recommended: self.apply(r))
            self.apply_buttons.append((button, recommended))
            button_row.addWidget(button)
            button_row.addStretch(1)
            card.body.addLayout(button_row)
        return card

    def _recommendations(
        self, recommended: dict[str, Any], reasons: dict[str, str], kind: str | None = None
    ) -> QGridLayout:
        grid = QGridLayout()
        grid.setHorizontalSpacing(14)
        grid.setVerticalSpacing(3)
        grid.setColumnStretch(2, 1)
        keys = [k for k in PRECISION_KEYS if k in recommended]
        for row, key in enumerate(keys):
            grid.addWidget(QLabel(words.setting_label(key)), row, 0, Qt.AlignmentFlag.AlignTop)
            shown = words.setting_value_on(key, recommended[key], kind)
            value = label(f"<b>{html.escape(shown)}</b>")
            grid.addWidget(value, row, 1, Qt.AlignmentFlag.AlignTop)
            reason = label(reasons.get(key, ""), "help", wrap=True)
            grid.addWidget(reason, row, 2)
        return grid

    def apply(self, recommended: dict[str, Any]) -> None:
        try:
            changed = self.state.apply(
                {k: v for k, v in recommended.items() if k in PRECISION_KEYS}
            )
        except ValueError as error:
            self.dialogs.error(f"The recommended settings could not be applied: {error}.")
            return
        self.status.setText(
            "Applied the recommended settings; the next job uses them."
            if changed
            else "Your settings already match the recommendation."
        )

    def _refresh_apply_buttons(self) -> None:
        for button, recommended in self.apply_buttons:
            matches = all(
                self.state.settings[k] == v for k, v in recommended.items() if k in PRECISION_KEYS
            )
            button.setText("Recommended settings in use" if matches else "Apply recommended")
            button.setEnabled(not matches)
