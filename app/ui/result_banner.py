"""What the banner above a generated image says: an image only in memory asks to be saved, one
that went NaN or black says where and offers its fix (or, where the fault came and went, to
make it again), one the run repaired says so, and one made again with a fix says what it ran
as, that the fix ran for that image only (over which of the user's own settings), offers to
make it the setting, and says whether its layers are remembered for the model. A fine image has no banner."""

from __future__ import annotations

import html
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from app.core.fixing.profiles import overridden_words
from app.ui import words
from app.ui.fixes import layers_ran, split_fix
from app.ui.image_entry import GalleryEntry, where_words

# What a banner's button does, for the page to run with its own methods: save the image to a
# file, make it again with its fix, make it again unchanged, or make the fix an image was made
# again with (for that job only) the setting.
Action = Literal["save_as", "apply_fix", "make_again", "make_setting"]


@dataclass(frozen=True)
class BannerWords:
    """A banner's colour ("bad", "warn", "info", "good"), its text (HTML) and its buttons, each
    as (its words, what it does)."""

    level: str
    text: str
    actions: tuple[tuple[str, Action], ...] = ()


def banner_words(
    entry: GalleryEntry, remembered: Mapping[str, Any] | None = None
) -> BannerWords | None:
    """What the banner says about `entry`; None when the image needs no banner. `remembered`:
    the fix remembered for the model that the image did not run with, which its fix button
    runs in place of the image's own (`GenerateView.apply_fix_and_regenerate`): named, so
    that the button runs the fix the banner names."""
    if entry.unsaved:
        # Above any diagnosis: this image is lost when the window closes unless saved.
        return BannerWords(
            "bad",
            "<b>Not saved: this image is only in memory.</b> Save it before closing "
            "HalfSafe; the error said why it could not be written.",
            (("Save as…", "save_as"),),
        )
    status = entry.status
    message = html.escape(entry.message)
    fix = entry.fix
    actions: tuple[tuple[str, Action], ...] = ()
    intermittent = status == "nan" and entry.cause == "intermittent"
    if fix and status in ("nan", "black"):
        actions = (("Apply fix and regenerate", "apply_fix"),)
        if remembered:
            message += html.escape(
                " Apply fix and regenerate runs the fix remembered for this model instead ("
                + words.first_lower(words.fix_short(dict(remembered)))
                + "), which your own settings set aside for this image."
            )
    elif intermittent:
        actions = (("Make it again", "make_again"),)
    where = where_words(entry)
    if status == "nan":
        head = f"NaN{where}." if where else "This image went NaN (black)."
        hint = (
            "" if fix or intermittent else " Run the health check to find which setting fixes it."
        )
        return BannerWords("bad", f"<b>{head}</b> {message}{html.escape(hint)}", actions)
    if status == "black":
        head = f"Completely black{where}." if where else "This image is completely black."
        return BannerWords("warn", f"<b>{head}</b> {message}", actions)
    if status == "safety_checker":
        return BannerWords(
            "warn", "<b>The safety checker blanked this image.</b> " + message, actions
        )
    if status == "fixed":
        applied = ", ".join(entry.fixes_applied)
        return BannerWords(
            "info",
            "<b>Fixed automatically.</b> "
            + message
            + (f" Fix applied: {html.escape(applied)}." if applied else ""),
        )
    if entry.applied_fix:
        over = (
            f", over your own {overridden_words(entry.fix_overrode)}" if entry.fix_overrode else ""
        )
        return BannerWords(
            "good",
            "<b>Fixed.</b> Made again with the fix ("
            + html.escape(words.first_lower(words.fix_short(dict(entry.applied_fix))))
            + f") for this image only{html.escape(over)}"
            # What ran, fixes remembered for the model included, from the image's record.
            + f", running as {html.escape(words.precision_summary(entry.settings))}"
            + "; this time every value stayed finite. Your settings are unchanged: make it "
            "the setting to run it on every job. "
            + _remembered_words(split_fix(dict(entry.applied_fix))[1], entry.settings),
            (("Make it the setting", "make_setting"),),
        )
    return None


def _remembered_words(own: dict[str, Any], settings: Mapping[str, Any]) -> str:
    """What became of a fix the image was made again with: its layer lists remembered for the
    model when the job ran them (`fixes.layers_ran`), else why not."""
    if not own:
        return ""
    if layers_ran(own, settings):
        return "The fix is remembered for this model on this device."
    return (
        "Its layers were not tested, though: the part they belong to ran wholly wider in this "
        "job, so the fix is not remembered."
    )
