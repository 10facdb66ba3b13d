"""What the banner above a generated image says: an image only in memory asks to be saved, one
that went NaN or black says where and offers its fix (or, where the fault came and went, to
make it again), one the run repaired says so, and one made again with a fix says what it ran
as and where that fix stands now: remembered for the model (every job runs it), the user's
setting, or run for that image only (over which of the user's own settings), with the offer
to make it the setting only then. A fine image has no banner.

Every sentence is rendered from the image's one record (`GalleryEntry`, built from the
generation result) and from how the settings and the model's remembered fix stand when the
banner is shown (`fixes.FixInPlace`), so the banner changes with them and never says two things
of one fix."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from app.ui import words
from app.ui.fixes import FixInPlace, layers_ran, split_fix
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


@dataclass(frozen=True)
class Remembered:
    """The fix remembered for the model that an image did not run with, which its fix button
    runs in place of the image's own suggestion (`settings`), and the user's own settings that
    set it aside (`set_aside_by`, each as the user has it; empty: the settings leave it to
    run, so every job from now on runs it)."""

    settings: Mapping[str, Any]
    set_aside_by: Mapping[str, Any] = field(default_factory=dict)


def banner_words(
    entry: GalleryEntry,
    remembered: Remembered | None = None,
    in_place: FixInPlace | None = None,
    parts: Sequence[str] = (),
) -> BannerWords | None:
    """What the banner says about `entry`; None when the image needs no banner. `remembered`:
    the fix remembered for the model that the image did not run with, which its fix button
    runs in place of the image's own (`GenerateView.apply_fix_and_regenerate`): the banner
    names that one fix only. `in_place`: where the fix the image was made again with stands
    for the next job now (none: nowhere). `parts`: the model's components, which name its
    denoiser."""
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
        if remembered is not None:
            # The NaN watch's sentence names the image's own suggestion, which the button
            # does not run: the one fix it runs is said instead.
            message = html.escape(_remembered_fix_words(remembered, parts))
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
        return _made_again_words(entry, in_place or FixInPlace(), parts)
    return None


def making_again_words(
    fix: Mapping[str, Any], remembered: Remembered | None, parts: Sequence[str] = ()
) -> str:
    """The banner's words (HTML) while the same image is made again with `fix`: which fix, and
    whether it runs for this image only (the user's settings unchanged) or is the fix every
    job runs already."""
    said = html.escape(words.first_lower(words.fix_short(fix, parts)))
    shared, own = split_fix(fix)
    if remembered is not None and remembered.set_aside_by:
        return (
            f"<b>Making the same image again with the fix remembered for this model</b> "
            f"({said}), over your own {html.escape(_settings_words(remembered.set_aside_by))}, "
            "for this image only: your settings stay as they are…"
        )
    if remembered is not None:
        return (
            f"<b>Making the same image again with the fix remembered for this model</b> "
            f"({said}), which every job runs from now on…"
        )
    if own and not shared:
        return (
            f"<b>Making the same image again with the fix</b> ({said}); if every value stays "
            "finite, it is remembered for this model on this device…"
        )
    return (
        f"<b>Making the same image again with the fix</b> ({said}), for this image only: your "
        "settings stay as they are…"
    )


def _remembered_fix_words(remembered: Remembered, parts: Sequence[str]) -> str:
    """The NaN banner's sentence when its fix button runs the fix remembered for the model:
    why this image ran without it, and what the button does with it."""
    does = words.first_lower(words.fix_short(dict(remembered.settings), parts))
    if remembered.set_aside_by:
        mine = _settings_words(remembered.set_aside_by)
        return (
            f"Your own {mine} set aside the fix remembered for this model on this device "
            f"({does}), so this image ran without it. Apply fix and regenerate makes it again "
            "with that fix, for this image only; your settings stay as they are."
        )
    return (
        f"This image ran without the fix remembered for this model on this device ({does}), "
        "which every job runs now. Apply fix and regenerate makes it again with that fix."
    )


def _made_again_words(
    entry: GalleryEntry, in_place: FixInPlace, parts: Sequence[str]
) -> BannerWords:
    """An image made again with a fix and finite: what ran, and where that fix stands for the
    next job now. "For this image only" is said of what no setting and no remembered fix
    holds, and only then is making it the setting offered."""
    fix = dict(entry.applied_fix or {})
    shared, own = split_fix(fix)
    said = [
        "<b>Fixed.</b> Made again with the fix ("
        + html.escape(words.first_lower(words.fix_short(fix, parts)))
        # What ran, fixes remembered for the model included, from the image's record, in the
        # caption's words.
        + f"), running as {html.escape(words.precision_summary(entry.settings))}"
        + "; this time every value stayed finite."
    ]
    if own and not layers_ran(own, entry.settings):
        said.append(
            "Its layers were not tested, though: the part they belong to ran wholly wider in "
            "this job, so the fix is not remembered."
        )
    elif own and in_place.layers_remembered:
        said.append(
            ("Its layers are" if shared else "The fix is")
            + " remembered for this model on this device: every job with this model runs "
            + ("them." if shared else "it.")
        )
    elif own:
        said.append("Its layers ran for this image only: they are not remembered.")
    offer: tuple[tuple[str, Action], ...] = ()
    if shared:
        what = "The rest of it" if own else "The fix"
        if in_place.settings_hold:
            said.append(f"{what} is now your setting: every job runs with it.")
        elif in_place.remembered_holds:
            said.append(
                f"{what} is the fix remembered for this model on this device: every job "
                "runs with it."
            )
        else:
            over = (
                f", over your own {_settings_words(entry.fix_overrode)}"
                if entry.fix_overrode
                else ""
            )
            rest = f" ({_settings_words(shared)})" if own else ""
            said.append(
                f"{what}{rest} ran for this image only{over}; your settings are unchanged: "
                "make it the setting to run it on every job."
            )
            offer = (("Make it the setting", "make_setting"),)
    return BannerWords(
        "good", " ".join(html.escape(s) if i else s for i, s in enumerate(said)), offer
    )


def _settings_words(settings: Mapping[str, Any]) -> str:
    """Settings as the Settings page names them, each with its value: 'VAE precision fp16 and
    Precision fp16'; a layer list by its count ('FP32 layers (2)')."""
    said = []
    for key, value in settings.items():
        if isinstance(value, list | tuple):
            said.append(f"{words.setting_label(key)} ({len(value)})")
        elif isinstance(value, bool):
            said.append(f"{words.setting_label(key)} {'on' if value else 'off'}")
        else:
            said.append(f"{words.setting_label(key)} {value}")
    if len(said) <= 1:
        return "".join(said)
    return ", ".join(said[:-1]) + " and " + said[-1]
