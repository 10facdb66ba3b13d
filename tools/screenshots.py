"""Render every page and dialog to docs/screenshots/*.png, with real data from the real engine:
a scripted walk-through of a first start, as a user would take it.

    xvfb-run -a sh -c 'openbox & .venv/bin/python tools/screenshots.py'           # 1024x700
    xvfb-run -a sh -c 'openbox & .venv/bin/python tools/screenshots.py --dark'    # *-dark.png
    ... --size 1920x1080                                                # *-1920x1080.png

Run under a window manager (openbox here) so dialogs are placed and sized as on a desktop.

The model is the built-in `demo-overflow` (the trained demo with one VAE layer scaled past
fp16's limit), loaded from its row in the model list as a user would, so the health check and
the generation have a real overflow to find, explain and fix, and the repaired image is the
demo's picture of a prompt it was trained on. Settings run it in fp16 at 128 px with auto-fix
set to "ask", which is what makes the black-image banner appear. Nothing touches your own
settings: every HalfSafe folder points at a scratch folder.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODEL = "demo-overflow"
PROMPT = "a yellow triangle on a purple background"
SEED = 7
SIZE = (1024, 700)  # the smallest window HalfSafe is made for; the README shows these


def wait_until(app, condition: Callable[[], bool], what: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        app.processEvents()
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.02)
    for _ in range(20):  # let layouts settle and images decode
        app.processEvents()
        time.sleep(0.01)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "screenshots"))
    parser.add_argument(
        "--dark", action="store_true", help="render under a dark desktop palette (-dark names)"
    )
    parser.add_argument(
        "--size",
        default=f"{SIZE[0]}x{SIZE[1]}",
        help=f"window size WIDTHxHEIGHT (default {SIZE[0]}x{SIZE[1]}; another size adds it to "
        "the file names, as in models-1024x700.png)",
    )
    args = parser.parse_args()
    width, height = (int(n) for n in args.size.lower().split("x"))
    suffix = ("" if (width, height) == SIZE else f"-{width}x{height}") + (
        "-dark" if args.dark else ""
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    scratch = Path(tempfile.mkdtemp(prefix="halfsafe-shots-"))
    for var in ("HALFSAFE_CONFIG_DIR", "HALFSAFE_DATA_DIR", "HALFSAFE_CACHE_DIR"):
        os.environ[var] = str(scratch / var.lower())
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    models = scratch / "models"
    models.mkdir()

    from app.core.settings import load_settings, save_settings

    settings = load_settings().settings
    settings["precision"] = "fp16"
    settings["auto_fix"] = "ask"
    settings["width"] = 128
    settings["height"] = 128
    settings["seed"] = SEED
    settings["model_folders"] = [str(models)]
    settings["output_folder"] = str(scratch / "images")
    save_settings(settings)

    from PySide6.QtCore import QPointF
    from PySide6.QtWidgets import QScrollArea

    from app.ui.application import application, build_main_window
    from app.ui.help_view import show_guide
    from app.ui.main_window import PAGES

    app = application()
    if args.dark:
        from app.ui.theme import dark_palette

        app.setStyle("Fusion")  # a style that paints with the palette it is given
        app.setPalette(dark_palette())
    window = build_main_window()
    shown_errors: list[str] = []
    show_error = window.dialogs.error

    def error(message: str, details: str = "", *args, **kwargs):
        """Every error the walk-through meets is printed too: a screenshot run that shows one
        is a failed run."""
        shown_errors.append(message)
        print(f"error shown: {message}\n{details}", file=sys.stderr)
        return show_error(message, details, *args, **kwargs)

    window.dialogs.error = error
    window.resize(width, height)
    window.show()
    window.start_background()  # as `halfsafe` does once the window shows
    window.generate_view.prompt.setPlainText(PROMPT)
    wait_until(app, window.isVisible, "the window")

    def shot(name: str, widget=None) -> None:
        """The window (or a dialog of it) as it is now."""
        window.resize(width, height)
        wait_until(app, lambda: True, "layout")
        path = out / f"{name}{suffix}.png"
        (widget or window).grab().save(str(path))
        print(f"wrote {path}")

    # First start: the model-folder step over the window, and the hint on the Models page.
    window.show_page("Models")
    window.first_start.show_hint()
    folders = window.first_start.open_folder_step()
    wait_until(app, lambda: not folders.finder.running, "the model-folder search", 120)
    shot("first-start-folders", folders)
    folders.reject()
    shot("first-start")

    # GPU: the real report of this machine, self-test included.
    window.show_page("Devices")
    wait_until(app, lambda: window.state.hardware is not None, "the hardware report")
    wait_until(app, lambda: window.gpu_view.job_id is None, "the Devices page")
    shot("gpu")

    # Models: the library scan and demo-overflow loaded from its row.
    window.show_page("Models")
    models_view = window.models_view
    models_view.rescan()
    wait_until(app, lambda: not models_view.scanner.running, "the library scan", 60)
    row = models_view.library.item_for(MODEL)
    if row is None:
        raise SystemExit(f"the model list has no {MODEL} row")
    models_view.library.setCurrentItem(row)
    models_view.load_item(row)
    wait_until(app, lambda: window.state.model is not None, "the model to load")
    window.first_start.dismiss_hint()
    shot("models")

    # Generate: with auto-fix on "ask", the NaN image gets its banner and the fix button.
    window.show_page("Generate")
    window.generate_view.generate()
    wait_until(app, lambda: window.generate_view.gallery.count() > 0, "the generation")
    shot("generate-nan")

    # The black image, large, with its parameters; then why it is black.
    black = window.generate_view.current_entry
    viewer = window.view_image(black)
    wait_until(app, viewer.isVisible, "the image viewer")
    viewer.resize(min(width - 80, 1100), min(height - 80, 760))
    shot("image-viewer", viewer)
    viewer.close()
    explained = window.explain_image(black.path)
    wait_until(
        app,
        lambda: explained.explanation is not None or explained.job_id is None,
        "the explanation",
        900,
    )
    if explained.explanation is None:
        stopped = window.engine_banner.text.text() if window.engine_banner.isVisible() else ""
        raise SystemExit(
            f"the explanation failed: {'; '.join(shown_errors) or 'no answer'} {stopped}"
        )
    shot("explain", explained)
    explained.close()

    # Health check: finds the VAE overflow, names the layer, proves the fix.
    window.show_page("Health check")
    health = window.health_view
    health.size_choice.setCurrentIndex(0)  # at the model's size: 128 px for the demo
    health.run_check()
    wait_until(app, lambda: health.progress.maximum() > 0, "the check's counted progress")
    shot("health-check-running")
    wait_until(app, lambda: health.report is not None, "the health check")
    shot("health-check")

    # Back to the black image: one click applies the fix and makes it again.
    window.show_page("Generate")
    window.generate_view.banner.buttons["Apply fix and regenerate"].click()
    wait_until(app, lambda: window.generate_view.gallery.count() > 1, "the regeneration")
    shot("generate-fixed")

    # Inpainting: the fixed image as the input picture, a mask painted over its middle.
    pictures = window.generate_view.pictures
    fixed = window.generate_view.current_entry
    if fixed is None or not fixed.path or not pictures.picture_slot.take(fixed.path):
        raise SystemExit("the fixed image could not be taken as the input picture")
    pictures.paint_mask()
    painter = pictures.painter
    wait_until(app, lambda: painter is not None and painter.isVisible(), "the mask painter")
    wait_until(app, lambda: True, "layout")
    side = painter.canvas.mask_image.width()
    painter.canvas._dab(QPointF(side * 0.3, side * 0.35), QPointF(side * 0.7, side * 0.6))
    # A soft stroke beside it, the brush's outline (and where it starts to fade) shown.
    painter.hardness.setValue(30)
    painter.canvas._dab(QPointF(side * 0.25, side * 0.75), QPointF(side * 0.6, side * 0.8))
    painter.canvas._pointer = painter.canvas.from_mask(QPointF(side * 0.75, side * 0.3))
    painter.canvas.update()
    shot("mask-painter", painter)
    painter.accept()
    wait_until(app, lambda: pictures.painter is None, "the mask taken")

    # Inpainting's layout: open, only the masked area, the canvas extended to the right.
    options = pictures.canvas_options
    options.toggle.setChecked(True)
    options.only_masked.setChecked(True)
    options.extend["right"].setValue(128)
    form = window.generate_view.findChild(QScrollArea, "generate-form")
    wait_until(app, lambda: True, "layout")
    if form is not None:
        form.ensureWidgetVisible(options)
    shot("generate-inpainting")
    options.extend["right"].setValue(0)
    options.only_masked.setChecked(False)
    options.toggle.setChecked(False)
    pictures.picture_slot.remove()

    if "Fixes" in PAGES:
        window.show_page("Fixes")
        shot("fixes")

    window.show_page("Settings")
    shot("settings")

    guide = show_guide(window)
    guide.resize(min(width - 80, 1000), min(height - 80, 800))
    shot("user-guide", guide)
    guide.close()

    # The engine dies: the window stays and offers a restart.
    window.show_page("Generate")
    window.client.transport._process.kill()
    wait_until(app, window.engine_banner.isVisible, "the engine banner", 30)
    shot("engine-stopped")

    window.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
