"""A health check as the Health check page runs it: the request it sends (the user's settings,
the probe size, the Generate page's pictures), the card shown in place of the report while it
runs (its stages, where it is, what it found so far, so the page is never blank), and how the
page's bar and stage line follow its progress."""

from __future__ import annotations

import html

from PySide6.QtWidgets import QProgressBar

from app.core import hires
from app.core.jobs import DONE
from app.core.requests.records import CheckRequest, PicturePath
from app.engine.events import EngineEvent
from app.ui.check_progress import CheckProgress
from app.ui.state import AppState
from app.ui.widgets import Card, Chip, label, show_progress

# The bar's steps: fine enough that every stage of a check moves it.
_BAR_STEPS = 1000


def check_request(state: AppState, size: int | None, pictures: PicturePath) -> CheckRequest:
    """The check of the loaded model at the user's settings, at `size` px (None: the model's
    own), along the path the next image takes with `pictures` (the VAE's encoder included)."""
    images, mask, canvas = pictures
    settings = state.settings
    return CheckRequest(
        precision=state.precision(),
        device=state.device(),
        size=size,
        # The denoiser is probed at the ends of the sampler schedule the user generates with.
        steps=int(settings["steps"]),
        scheduler=str(settings["scheduler"]),
        clip_skip=int(settings["clip_skip"]),  # the prompt read as jobs read it
        images=images,
        mask=mask,
        canvas=canvas,
        # A hires fix from a pixel upscaler runs the VAE's encoder at the final size.
        pixel_upscale=hires.Hires(
            scale=float(settings["hires_scale"]), upscaler=str(settings["hires_upscaler"])
        ).pixels,
    )


class RunningCard(Card):
    """The running check's card, following `progress`; `stop` says where and why it stopped
    when it ends without a report."""

    def __init__(self, progress: CheckProgress) -> None:
        super().__init__("Checking the model")
        self.progress = progress
        self.chip = Chip("Starting", "muted")
        self.header.addWidget(self.chip)
        self.lines = label("", wrap=True)
        self.body.addWidget(self.lines)
        self.note = label(
            "A card for each part, its chart and the fix, if one is needed, appear here when "
            "the check ends.",
            "muted",
            wrap=True,
        )
        self.body.addWidget(self.note)
        self.refresh()

    def refresh(self) -> None:
        """Show what the check has said so far, and the stage it is at."""
        progress = self.progress
        self.lines.setText("<br>".join(progress.lines()))
        if progress.count:
            self.chip.setText(
                f"Stage {min(progress.index + 1, progress.count)} of {progress.count}"
            )

    def stop(self, title: str, level: str, why: str) -> None:
        """The check stopped without a report: where it stopped (`title`, the chip's `level`),
        and `why` unless that only repeats that it was cancelled."""
        self.progress.stopped()
        self.title.setText(title)
        self.chip.set_level(level, "Stopped")
        self.lines.setText("<br>".join(self.progress.lines()))
        self.note.setText(html.escape(why) if why and why != "Cancelled." else "")
        self.note.setVisible(bool(self.note.text()))


def progress_words(
    event: EngineEvent, bar: QProgressBar, running: CheckProgress | None, found: str | None
) -> str:
    """Move `bar` (and `running`, the check's stages) on by a PROGRESS event, and return the
    page's stage line: the stage it is at, under `found`, the check's first finding, if any.
    The last step is counted before the report is written: a full bar and "Done" would claim
    the check finished while it still runs."""
    if event.stage == DONE:
        bar.setRange(0, 0)
        if running is not None:
            running.writing()
        return "Writing the report…"
    stage = event.stage or "Working"
    if running is not None:
        running.advance(stage, event.done, event.total)
    if running is not None and running.count:
        bar.setRange(0, _BAR_STEPS)
        bar.setValue(round(running.filled * _BAR_STEPS))
        stage = f"Stage {running.index + 1} of {running.count} — {stage}"
    else:  # no stage named yet: the phase's own count, or a busy bar
        show_progress(bar, event.done, event.total)
    return f"{found}\n{stage}…" if found else f"{stage}…"
