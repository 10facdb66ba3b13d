"""A page of the main window that is built the first time it is shown or asked for.

Why: building all six pages, and importing their modules, before the window could show took
about half of the launch (the window within 0.2 s of a bare PySide6 one,
`benchmarks/gui_launch.py`). Only the page on screen is built at start; the others are built on
their first visit, or when the window first needs one of them (an engine event for the health
check, a picture sent to Generate).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PySide6.QtWidgets import QVBoxLayout, QWidget


class PageHost(QWidget):
    """Holds one page in the window's stack: empty until `page` is first read, which calls
    `build` once and keeps what it returns. Showing the host reads `page`, so a page is never
    shown empty. GUI thread only."""

    def __init__(self, name: str, build: Callable[[], QWidget], parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName(f"page-{name}")
        self.name = name
        self._build = build
        self._page: QWidget | None = None
        self._building = False
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(0, 0, 0, 0)
        self._layout.setSpacing(0)

    @property
    def built(self) -> bool:
        return self._page is not None

    @property
    def page(self) -> QWidget:
        """The page, built now if it was not yet."""
        if self._page is None:
            if self._building:
                raise RuntimeError(f"the {self.name} page reads itself while it is being built")
            self._building = True
            try:
                page = self._build()
            finally:
                self._building = False
            self._page = page
            self._layout.addWidget(page)
            if self.isVisible():
                # A widget added to a visible parent would show only after the next event-loop
                # turn; the page must not paint empty once.
                page.show()
        return self._page

    def showEvent(self, event: Any) -> None:  # noqa: N802 - Qt's name
        self.page  # noqa: B018 - reading it builds the page before it paints
        super().showEvent(event)
