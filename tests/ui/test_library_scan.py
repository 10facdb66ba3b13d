"""The model folders' scan runs on a worker thread: a window closed while it runs (its scanner
deleted) leaves the worker nobody to tell, and that is no error."""

from __future__ import annotations

import threading

import shiboken6

from app.core import library
from app.ui.library_scan import LibraryScanner


def test_a_scan_whose_window_closed_meanwhile_ends_quietly(qapp, monkeypatch):
    reading, release = threading.Event(), threading.Event()

    def slow_scan(folders):
        reading.set()
        release.wait(10)
        return []

    monkeypatch.setattr(library, "scan_library", slow_scan)
    failures: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: failures.append(args.exc_value))
    scanner = LibraryScanner()
    assert scanner.scan(["/nowhere"])
    assert reading.wait(10)
    (worker,) = [t for t in threading.enumerate() if t.name == "library-scan"]
    shiboken6.delete(scanner)  # the window, and its scanner with it, closed mid-scan
    release.set()
    worker.join(10)
    assert not worker.is_alive()
    assert failures == []
