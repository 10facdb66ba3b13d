"""The main window on a real X display, for tests that drive it with real input (xdotool).

Run as `python -m tests.support.real_x_window` with DISPLAY set and QT_QPA_PLATFORM=xcb. It opens
the window as the first start does (no engine is started: nothing here needs one), then answers
one command a line on stdin with one JSON line on stdout:

    show PAGE    the page made current; the screen centre of its fields, the window's frame
                 and the screen rectangles of the status bar and "Load the demo model"
    state        the fields' values and which widget has the keyboard focus
    quit         the window closed (its geometry saved), the process ends
"""

from __future__ import annotations

import json
import sys
from typing import Any

from PySide6.QtCore import QSocketNotifier, QTimer
from PySide6.QtWidgets import QApplication, QWidget

from app.ui.application import application, build_main_window
from app.ui.main_window import MainWindow


def _fields(window: MainWindow) -> dict[str, QWidget]:
    fields: dict[str, QWidget] = {}
    if window.page_hosts["Settings"].built:
        for key in ("precision", "unet_precision", "vae_precision"):
            fields[key] = window.settings_view.editors[key].input
    if window.page_hosts["Generate"].built:
        view = window.generate_view
        fields.update(cfg=view.cfg, steps=view.steps)
    return fields


def _rect(widget: QWidget) -> list[int]:
    """x, y, width, height on the screen."""
    corner = widget.mapToGlobal(widget.rect().topLeft())
    return [corner.x(), corner.y(), widget.width(), widget.height()]


def _where(window: MainWindow) -> dict[str, Any]:
    fields = {}
    for name, widget in _fields(window).items():
        if widget.isVisible():
            centre = widget.mapToGlobal(widget.rect().center())
            fields[name] = [centre.x(), centre.y()]
    frame = window.frameGeometry()
    where: dict[str, Any] = {
        "page": window.current_page(),
        "fields": fields,
        "frame": [frame.x(), frame.y(), frame.width(), frame.height()],
        "status_bar": _rect(window.statusBar()),
    }
    if window.page_hosts["Generate"].built and window.current_page() == "Generate":
        where["demo_button"] = _rect(window.generate_view.demo_button)
    return where


def _state(window: MainWindow) -> dict[str, Any]:
    values = {}
    for name, widget in _fields(window).items():
        read = getattr(widget, "currentData", None) or getattr(widget, "value", None)
        values[name] = read() if read is not None else None
    focused = QApplication.focusWidget()
    owner = next((n for n, w in _fields(window).items() if w is focused), None)
    return {"values": values, "focus": owner, "settings": window.state.settings.to_dict()}


def main() -> int:
    app = application(sys.argv[:1])
    window = build_main_window()
    window.show()
    window.raise_()
    window.activateWindow()

    def answer(payload: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(payload, default=str) + "\n")
        sys.stdout.flush()

    def command() -> None:
        line = sys.stdin.readline()
        words = line.split(maxsplit=1)
        if not words or words[0] == "quit":
            notifier.setEnabled(False)
            window.close()
            app.quit()
        elif words[0] == "show":
            window.show_page(words[1].strip())
            window.activateWindow()
            # The layouts take their sizes on the next turns of the event loop.
            QTimer.singleShot(300, lambda: answer(_where(window)))
        elif words[0] == "state":
            answer(_state(window))
        else:
            answer({"error": f"unknown command {words[0]!r}"})

    notifier = QSocketNotifier(sys.stdin.fileno(), QSocketNotifier.Type.Read)
    notifier.activated.connect(command)
    QTimer.singleShot(300, lambda: answer({"ready": True, **_where(window)}))
    return app.exec()


if __name__ == "__main__":
    raise SystemExit(main())
