"""An output folder for the window's gallery: pictures written with an age and a generation
record (one of them a NaN's), the window pointed at the folder, and a file manager that opens
nothing."""

from __future__ import annotations

import os
from pathlib import Path

from PIL import Image

from app.core.images.finished import png_bytes
from app.core.words.infotext import join_text

NAN_PARAMETERS = join_text(
    "a red circle on a blue background",
    "blurry",
    [
        ("Steps", 12),
        ("Sampler", "DPM++ 2M Karras"),
        ("CFG scale", "6.5"),
        ("Seed", 4242),
        ("Size", "128x96"),
        ("Model", "demo"),
        ("Precision", "fp16"),
        ("VAE precision", "fp16"),
        ("NaN watch", "nan"),
        ("NaN component", "vae"),
        ("NaN step", 8),
    ],
)


def write_png(folder: Path, name: str, age_s: int, parameters: str | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(png_bytes(Image.new("RGB", (64, 48), (200, 40, 40)), parameters))
    stamp = 1_700_000_000 - age_s
    os.utime(path, (stamp, stamp))
    return path


def fill(window, qtbot, folder: Path, expected: int) -> None:
    window.state.apply({"output_folder": str(folder)})
    gallery = window.generate_view.gallery
    qtbot.waitUntil(lambda: gallery.count() == expected, timeout=5000)


class NoFileManager:
    opened: list[str] = []

    @staticmethod
    def openUrl(url) -> bool:  # noqa: N802 - Qt's name
        NoFileManager.opened.append(url.toLocalFile())
        return False
