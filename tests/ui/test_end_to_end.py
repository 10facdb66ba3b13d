"""The window with the REAL engine process and the built-in demo model: load, health check,
generate one image, see it in the gallery."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.core.components import Verdict
from app.core.settings import load_settings, save_settings
from app.engine.events import EventState

LONG = 240_000  # ms; a loaded 2-core machine needs a while to import torch and run the demo
# An engine process that imports torch and runs the demo: 8-10 s each on 2 cores.
pytestmark = pytest.mark.slow


@pytest.fixture
def real_window(qtbot, tmp_path):
    from app.ui.application import application, build_main_window

    loaded = load_settings().settings
    loaded["output_folder"] = str(tmp_path / "images")
    loaded["steps"] = 4  # previews come every other step, before the last
    loaded["width"] = 64
    loaded["height"] = 64
    save_settings(loaded)
    application()
    window = build_main_window()
    qtbot.addWidget(window)
    window.show()
    yield window
    window.close()
    assert window.client.transport is None


def _no_errors(window) -> None:
    assert window.dialogs.shown == [], window.dialogs.shown[0]
    assert not window.engine_banner.isVisible(), window.engine_banner.text.text()


def _wait(qtbot, window, condition) -> None:
    def check() -> None:
        _no_errors(window)
        assert condition()

    qtbot.waitUntil(check, timeout=LONG)


def _load_demo(qtbot, window) -> None:
    window.models_view.load_path("demo")
    _wait(qtbot, window, lambda: window.state.model is not None)
    assert window.state.model.architecture == "sd1"
    assert "draws coloured shapes" in window.models_view.details.title.text()


def test_load_and_health_check_with_the_real_engine(qtbot, real_window):
    window = real_window
    _load_demo(qtbot, window)
    window.show_page("Health check")
    window.health_view.run_button.click()
    _wait(qtbot, window, lambda: window.health_view.report is not None)
    report = window.health_view.report
    assert report.verdict in (Verdict.HEALTHY, Verdict.FIXABLE)
    assert {"text_encoder", "unet", "vae"} <= set(window.health_view.cards)
    assert window.health_view.charts["unet"].blocks
    assert window.health_view.markdown.startswith("# HalfSafe health check")


def test_generate_one_image_with_the_real_engine(qtbot, real_window, tmp_path):
    window = real_window
    _load_demo(qtbot, window)
    window.show_page("Generate")
    view = window.generate_view
    view.prompt.setPlainText("a red cube")
    view.batch.setValue(1)
    previews = []
    window.client.job_event.connect(
        lambda event: previews.append(event) if event.state == EventState.PREVIEW else None
    )
    view.generate()
    _wait(qtbot, window, lambda: view.gallery.count() == 1)
    entry = view.current_entry
    assert Path(entry.path).is_file()
    assert Path(entry.path).parent == tmp_path / "images"
    assert entry.status in ("ok", "fixed", "black")
    assert not view.image.pixmap.isNull()
    assert "a red cube" in view.parameters.text()
    assert previews and previews[0].preview_png.startswith(b"\x89PNG")


def test_image_to_image_with_the_real_engine(qtbot, real_window, tmp_path):
    from PySide6.QtGui import QColor, QImage

    from app.core.images.pictures import Mode

    window = real_window
    _load_demo(qtbot, window)
    # The engine asked the demo's family: an SD 1.x pipeline runs both picture modes.
    assert window.state.model.picture_modes == {Mode.IMAGE: "", Mode.INPAINT: ""}
    window.show_page("Generate")
    view = window.generate_view
    view.prompt.setPlainText("a red cube")
    view.batch.setValue(1)
    picture = QImage(96, 64, QImage.Format.Format_RGB32)
    picture.fill(QColor("orange"))
    assert picture.save(str(tmp_path / "photo.png"))
    assert view.pictures.picture_slot.choose(str(tmp_path / "photo.png"))
    assert (view.width_box.value(), view.height_box.value()) == (128, 80)  # 96x64 at 128 px
    view.width_box.setValue(64)  # smaller is quicker; the user's own size stands
    view.height_box.setValue(48)
    view.pictures.strength.setValue(0.5)
    view.generate()
    _wait(qtbot, window, lambda: view.gallery.count() == 1)
    entry = view.current_entry
    assert Path(entry.path).is_file()
    assert entry.mode is Mode.IMAGE and entry.strength == 0.5
    assert "Image-to-image from photo.png, strength 0.5" in view.parameters.text()
    assert (
        window.message_status.full_text()
        == "Last image: image-to-image from photo.png, strength 0.5."
    )


# The GUI process as a user starts it, in a process of its own: whatever the engine sends back
# (devices, a model, a report, an image), the GUI must never load torch (DESIGN: process model).
_GUI_SESSION = """
import sys, time
from app.ui.application import application, build_main_window
from app.core.components import Verdict
from app.core.settings import load_settings, save_settings

loaded = load_settings().settings
for key, value in dict(output_folder=sys.argv[1], steps=4, width=64, height=64).items():
    loaded[key] = value
save_settings(loaded)
app = application()
window = build_main_window()
window.show()
window.start_background()
deadline = time.monotonic() + 240

def wait(condition, what):
    while not condition():
        app.processEvents()
        time.sleep(0.02)
        if window.dialogs.shown or time.monotonic() > deadline:
            print("STOPPED at", what, [d.message for d in window.dialogs.shown])
            sys.exit(3)

wait(lambda: window.state.hardware is not None, "the devices")
window.models_view.load_path("demo")
wait(lambda: window.state.model is not None, "the demo")
window.health_view.run_button.click()
wait(lambda: window.health_view.report is not None, "the check")
window.generate_view.generate()
wait(lambda: window.generate_view.gallery.count() == 1, "the image")
print("torch in the GUI process:", "torch" in sys.modules)
window.close()
"""


def test_the_gui_process_never_loads_torch_whatever_the_engine_sends(tmp_path):
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _GUI_SESSION, str(tmp_path / "images")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "torch in the GUI process: False" in done.stdout, done.stdout
