"""The Generate page says what is so: a model loading is not "no model", a sampler that drops the
chosen schedule says it, the "Use 128×128" offer goes once the size is 128, and an engine death
speaks of the image it took, not over the last finished one."""

from __future__ import annotations

from PySide6.QtGui import QColor, QImage

from app.engine.events import EventState
from tests.support import reports
from tests.ui.conftest import DEMO_SUMMARY, load_fake_model


def _png(path, colour="steelblue") -> str:
    image = QImage(32, 32, QImage.Format.Format_RGB32)
    image.fill(QColor(colour))
    assert image.save(str(path))
    return str(path)


def test_while_the_demo_loads_the_page_says_it_is_loading(window, engines):
    window.show_page("Generate")
    view = window.generate_view
    view.demo_button.click()
    window.show_page("Generate")
    said = view.model_hint.text()
    assert said == "The demo model is loading: Generate works once it is loaded.", said
    assert not view.demo_button.isVisible()
    view.generate()  # Ctrl+Enter, say
    assert "Load a model first" not in view.model_hint.text()
    assert "is loading" in view.model_hint.text()
    load = engines.current.last_job("load")
    engines.current.emit(load, EventState.PROGRESS, stage="Building the demo model", total=1)
    assert "is loading" in view.model_hint.text()
    engines.current.finish(load, DEMO_SUMMARY)
    assert view.model_hint.text() == "Model: demo"


def test_a_load_that_fails_offers_the_demo_again(window, engines):
    window.show_page("Generate")
    view = window.generate_view
    view.demo_button.click()
    load = engines.current.last_job("load")
    engines.current.emit(load, EventState.ERROR, message="It failed.", error_type="ValueError")
    window.dialogs.close_all()
    window.show_page("Generate")
    assert "No model is loaded" in view.model_hint.text()
    assert view.demo_button.isVisible()


def test_a_sampler_that_does_not_run_the_schedule_says_so_and_gives_it_back(window, engines):
    load_fake_model(window, engines)
    window.show_page("Generate")
    view = window.generate_view
    pair = view.form.scheduler
    pair.sampler.setCurrentIndex(pair.sampler.findText("DPM++ 2M"))
    pair.schedule.setCurrentIndex(pair.schedule.findText("Karras"))
    pair.sampler.setCurrentIndex(pair.sampler.findText("Euler a"))
    assert pair.schedule.currentText() == "Automatic"
    said = view.progress_label.text()
    assert said.startswith("Euler a does not run the Karras schedule, so it runs its own"), said
    # Karras comes back with a sampler that runs it.
    pair.sampler.setCurrentIndex(pair.sampler.findText("DPM++ 2M SDE"))
    assert pair.schedule.currentText() == "Karras"
    assert pair.value() == "dpmpp_2m_sde_karras"


def test_the_use_native_size_offer_goes_once_the_size_is_the_models(window, engines):
    load_fake_model(window, engines)  # the demo is made for 128 px: the size is set to it
    window.show_page("Generate")
    view = window.generate_view
    form = view.form
    form.width_box.setValue(512)
    assert "Use 128×128" in form.size_hint.text()
    form.size_hint.linkActivated.emit("128")
    assert (form.width_box.value(), form.height_box.value()) == (128, 128)
    assert "Use 128×128" not in form.size_hint.text()
    # The model's summary again (a fix remembered for it, say): still nothing to offer.
    view.state.set_model(DEMO_SUMMARY, view.state.model_request)
    assert "Use 128×128" not in form.size_hint.text()
    # Typed back by hand to the model's size: the offer goes too.
    form.height_box.setValue(256)
    assert "Use 128×128" in form.size_hint.text()
    form.height_box.setValue(128)
    assert "Use 128×128" not in form.size_hint.text()


def test_an_engine_death_speaks_of_the_lost_image_not_over_the_last_one(window, engines, tmp_path):
    load_fake_model(window, engines)
    window.show_page("Generate")
    view = window.generate_view
    view.prompt.setPlainText("a red circle on a blue background")
    view.generate()
    first = engines.current.last_job("generate")
    engines.current.finish(
        first,
        reports.generation({"images": [reports.image(_png(tmp_path / "a.png"))], "seconds": 1.0}),
    )
    assert not view.image.pixmap.isNull()
    view.prompt.setPlainText("a green square on a purple background")
    view.generate()
    lost = engines.current.last_job("generate")
    engines.current.emit(lost, EventState.PROGRESS, stage="Denoising", done=3, total=20)
    engines.current.crash(returncode=-9)
    assert "the image it was making" in view.banner.text.text()
    # Under that banner: words that the image is lost, not the last finished picture.
    assert view.image.pixmap.isNull()
    assert "engine stopped before this image was finished" in view.image.placeholder
    assert view.parameters.text() == "Not finished: a green square on a purple background"
    assert view.gallery.count() == 1  # the finished one stays, a click away
    view.gallery.setCurrentRow(0)
    view.show_entry(view.gallery_view.full_entry(view.gallery.item(0)))
    assert not view.image.pixmap.isNull()
