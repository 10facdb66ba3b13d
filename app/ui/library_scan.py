"""The model library as the Models page reads it: the scan of the model folders on a worker thread
(`LibraryScanner`, the window never waits on a disk) and the words that count what it found."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Signal

from app.ui import words
from app.ui.browser import (
    card_dict,
)


class LibraryScanner(QObject):
    """Scans the model folders on a worker thread (file headers only, no torch).

    `finished(list[dict], str)` is emitted from the worker thread; Qt queues it to the
    receiver's (GUI) thread. The second argument is a plain sentence when the scan failed.
    """

    finished = Signal(list, str)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.running = False

    def scan(self, folders: list[str]) -> bool:
        if self.running:
            return False
        self.running = True
        threading.Thread(
            target=self._run, args=(list(folders),), name="library-scan", daemon=True
        ).start()
        return True

    def _run(self, folders: list[str]) -> None:
        entries: list[dict[str, Any]] = []
        problem = ""
        try:
            from app.core.library import scan_library
            from app.core.library.metadata import read_card

            for entry in scan_library([str(Path(f)) for f in folders]):
                card = read_card(entry.path) if not getattr(entry, "error", None) else None
                entries.append(
                    {
                        "path": str(entry.path),
                        "architecture": getattr(entry, "architecture", None),
                        "stored_dtype": getattr(entry, "stored_dtype", None),
                        "size_bytes": getattr(entry, "size_bytes", None),
                        "error": getattr(entry, "error", None),
                        "format": getattr(entry, "format", None),
                        "supported": getattr(entry, "supported", True),
                        "detected_because": getattr(entry, "detected_because", None),
                        "role": getattr(entry, "role", "model"),
                        "vae": getattr(entry, "vae", None),
                        "companions": getattr(entry, "companions", None),
                        "missing": getattr(entry, "missing", None),
                        "card": card_dict(card) if card is not None else None,
                    }
                )
        except ImportError:
            problem = "Scanning model folders is not available in this version."
        except Exception as error:  # noqa: BLE001 - a failed scan must not take the window down
            problem = f"The model folders could not be scanned ({type(error).__name__}: {error})."
        self.running = False
        # The window may have been closed and deleted meanwhile: then nobody is told.
        with contextlib.suppress(RuntimeError):
            self.finished.emit(entries, problem)


def library_count_words(models: int, vaes: int, broken: int) -> str:
    """What the scan of the model folders found; the built-in demos listed beside them are not
    counted, and said so when nothing else is listed."""
    if models == 0 and vaes == 0:
        return "No models in your model folders yet; the built-in demos are always listed."
    return (
        f"{models} model{'s' if models != 1 else ''} found in your model folders"
        + (f", {vaes} VAE{'s' if vaes != 1 else ''}" if vaes else "")
        + (f", {broken} damaged" if broken else "")
        + "."
    )


def library_words(entry: dict[str, Any]) -> tuple[str, str, str | None]:
    """The Type column, the tooltip and a text colour (a scheme colour's name) for one library
    entry."""
    path = entry.get("path", "")
    because = entry.get("detected_because") or ""
    if entry.get("error"):
        return "damaged", entry["error"], "invalid"
    if entry.get("role") == "vae":
        return (
            "VAE" + (" (pickle)" if entry.get("format") == "pickle" else ""),
            f"{path}\nA VAE: double-click to use it with the next model you load.",
            None,
        )
    if entry.get("vae") and entry.get("format") != "pickle":
        kind = words.architecture_name(entry.get("architecture"))
        return (
            f"{kind} + VAE",
            f"{path}\nLoads with the VAE beside it, as AUTOMATIC1111 does: {entry['vae']}",
            None,
        )
    if entry.get("format") == "pickle":
        return (
            "pickle checkpoint",
            f"{path}\nPickle files are only opened when you load one and confirm.",
            None,
        )
    if entry.get("opened") and not entry.get("architecture"):
        return "opened before", f"{path}\nOpened from a file or folder; load it to see more.", None
    kind = words.architecture_name(entry.get("architecture"))
    if entry.get("missing"):  # a transformer file whose text encoder or VAE was not found
        return f"{kind} (incomplete)", f"{path}\n{because}\n{entry['missing']}".strip(), "muted"
    if entry.get("supported") is False:
        return f"{kind} (not supported)", f"{path}\n{because}".strip(), "muted"
    companions = [p for p in (entry.get("companions") or {}).values() if p]
    if companions:
        because += "\nLoads with: " + ", ".join(Path(p).name for p in companions)
    return kind, f"{path}\n{because}".strip(), None
