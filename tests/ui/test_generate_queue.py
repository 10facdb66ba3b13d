"""Cancel with generations queued: the button says it stops them all, and the status says
how many queued ones were dropped with the running one."""

from __future__ import annotations

from app.engine.events import CancelRequest, EventState
from tests.ui.conftest import load_fake_model


def test_cancel_says_it_drops_the_queued_generations(window, engines):
    load_fake_model(window, engines)
    view = window.generate_view
    for _ in range(3):
        view.generate()
    jobs = engines.current.jobs("generate")
    assert view.cancel_button.text() == "Cancel all 3"
    assert "drops the 2 queued after it" in view.cancel_button.toolTip()
    engines.current.emit(jobs[0], EventState.PROGRESS, stage="Denoising", done=1, total=20)

    view.cancel_button.click()

    assert view.progress_label.text() == "Cancelling, with the 2 generations queued…"
    assert all(CancelRequest(job.job_id) in engines.current.sent for job in jobs)
    for job in jobs:
        engines.current.emit(job, EventState.CANCELLED, message="Cancelled.")
    assert view.progress_label.text() == "Cancelled, and the 2 generations queued after it."
    assert view.cancel_button.text() == "Cancel" and not view.cancel_button.isEnabled()


def test_cancel_of_a_lone_generation_says_only_that(window, engines):
    load_fake_model(window, engines)
    view = window.generate_view
    view.generate()
    (job,) = engines.current.jobs("generate")
    assert view.cancel_button.text() == "Cancel"
    view.cancel_button.click()
    assert view.progress_label.text() == "Cancelling…"
    engines.current.emit(job, EventState.CANCELLED, message="Cancelled.")
    assert view.progress_label.text() == "Cancelled."
