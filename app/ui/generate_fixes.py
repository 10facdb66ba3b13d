"""What the Generate page does for an image that went NaN or black: its banner (the words are
`result_banner`'s) and the buttons on it, which make the image again with the fix for that job
only, make that fix the user's setting, or make the image again unchanged; and the layer lists
a job proved finite, remembered for the model (`fixes.remember_for_model`), which the banner
counts as remembered while the answer is on its way."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from app.core.fixing.remembered_fix import RememberedFix
from app.core.generation.records import GenerationResult
from app.core.models.summary import ModelSummary
from app.core.settings import FIELDS
from app.core.settings.values import setting_entries
from app.engine.events import EngineEvent
from app.ui import words
from app.ui.dialogs import Dialogs
from app.ui.engine_client import EngineClient
from app.ui.fixes import (
    apply_fix,
    fix_in_place,
    layers_ran,
    ran_with,
    remember_for_model,
    set_aside_by,
    split_fix,
)
from app.ui.image_entry import GalleryEntry
from app.ui.result_banner import Action, Remembered, banner_words, making_again_words
from app.ui.state import AppState
from app.ui.widgets import Banner


class FixOffers:
    """The banner over the Generate page's image, and what its buttons do. The page gives
    `request()`, the form's request; `submit(request, fix)`, which queues a job (with `fix`
    over the settings for it alone) and returns its id; `save_as()`, which saves the image
    shown; `refresh()`, which says the shown image's banner again; and `fix_of_job`, where a
    job made again with a fix is recorded (its id: that fix). GUI thread only."""

    def __init__(
        self,
        state: AppState,
        client: EngineClient,
        dialogs: Dialogs,
        banner: Banner,
        request: Callable[[], dict[str, Any]],
        submit: Callable[[dict[str, Any], dict[str, Any] | None], int],
        save_as: Callable[[], object],
        refresh: Callable[[], None],
        fix_of_job: dict[int, dict[str, Any]],
    ) -> None:
        self.state = state
        self.client = client
        self.dialogs = dialogs
        self.banner = banner
        self._request = request
        self._submit = submit
        self._save_as = save_as
        self._refresh = refresh
        self._fix_of_job = fix_of_job
        # Layer lists a repair proved, sent to be remembered for the model, whose answer has
        # not come back yet: the banner says them remembered meanwhile.
        self.remembering: list[dict[str, Any]] = []

    def model_changed(self, model: ModelSummary | None) -> None:
        """Layer lists the model now remembers (or, with no model, all) are no longer on
        their way."""
        has_model = model is not None
        held = model.remembered_fix.settings if model and model.remembered_fix else {}
        self.remembering[:] = [
            own
            for own in self.remembering
            if has_model
            and not all(set(v or ()) <= set(setting_entries(held, k)) for k, v in own.items())
        ]

    def show(self, entry: GalleryEntry) -> None:
        """The banner for `entry`, as the settings and the remembered fix stand now (none for
        a fine image)."""
        components = self.state.components()
        in_place = (
            fix_in_place(self.state, entry.applied_fix, self.remembering_lists())
            if entry.applied_fix
            else None
        )
        said = banner_words(entry, self.remembered_since(entry), in_place, components)
        if said is None:
            self.banner.dismiss()
            return
        does: dict[Action, Callable[[], object]] = {
            "save_as": lambda: self._save_as(),
            "apply_fix": lambda: self.apply_fix_and_regenerate(entry),
            "make_again": lambda: self.make_again(entry),
            "make_setting": lambda: self.make_fix_the_setting(entry),
        }
        self.banner.show_message(
            said.level, said.text, [(text, does[action]) for text, action in said.actions]
        )

    def remember_proved(self, result: GenerationResult, applied_fix: dict[str, Any] | None) -> None:
        """Remember for the model the layer lists of the fix a finished job ran with, when
        every image came out finite with them."""
        _shared, own = split_fix(applied_fix or {})
        images = result.images
        if not (
            own
            and images
            and all(i.status == "ok" for i in images)
            and layers_ran(own, result.settings)
        ):
            return
        # Proved: the same image came out finite with it, at the job's precision (a part that
        # ran wholly wider proves nothing of its layers: not remembered).
        from app.core.precision.plan import dtype_settings_of

        proved = dict(own)
        self.remembering.append(proved)

        def not_remembered(event: EngineEvent) -> None:
            if proved in self.remembering:
                self.remembering.remove(proved)
            self._refresh()
            self.dialogs.job_failed(event)

        remember_for_model(
            self.state,
            self.client,
            own,
            words.fix_short(own, self.state.components()),
            "generation",
            on_failed=not_remembered,
            made_at=dtype_settings_of(result.settings, self.state.components()),
        )

    def apply_fix_and_regenerate(self, entry: GalleryEntry) -> int | None:
        """Make the same image again with the fix the banner names, for this job only: the
        request carries it (`GenerateRequest.fix`), over the settings, the user's own choices
        included, which stay as they are (the result's banner offers to make it the setting).
        A fix remembered for the model since the image was made is that fix. Layer lists that
        come out finite are remembered for the model (`app.ui.fixes`)."""
        remembered = self.remembered_since(entry)
        fix = dict(remembered.settings if remembered is not None else entry.fix or {})
        try:
            for key, value in fix.items():
                FIELDS[key].validate(value)
        except (KeyError, ValueError) as error:
            self.dialogs.error(f"The fix could not be applied: {error}.")
            return None
        # The image's own values over the form's; its seed makes that one image again, from
        # the same input picture and mask when it had them.
        request = {**self._request(), **entry.generate_values(), **entry.picture_values()}
        if entry.seed is not None:
            request["batch"] = 1
        self.banner.show_message(
            "info", making_again_words(fix, remembered, self.state.components())
        )
        job_id = self._submit(request, fix)
        self._fix_of_job[job_id] = fix
        return job_id

    def remembered_since(self, entry: GalleryEntry) -> Remembered | None:
        """The fix remembered for the loaded model when this image did not run with it and it
        is not the image's own: a health check or an edit remembered it after the image was
        made, or the user's own settings set it aside (which of them, as they are now); it is
        the model's proved fix, so the fix button runs it (for that job, over those settings)
        rather than the image's quick suggestion, and the banner names it alone. None when the
        image ran with it (it did not keep this image finite, so the image's fix is what is
        left to try) or there is none."""
        model = self.state.model
        remembered: RememberedFix | None = model.remembered_fix if model is not None else None
        if remembered is None or dict(remembered.settings) == dict(entry.fix or {}):
            return None
        if ran_with(entry.settings, remembered.settings):
            return None
        return Remembered(dict(remembered.settings), set_aside_by(self.state, remembered.settings))

    def remembering_lists(self) -> dict[str, list[str]]:
        """The layer lists sent to be remembered whose answer has not come back, by kind."""
        lists: dict[str, list[str]] = {}
        for own in self.remembering:
            for key, entries in own.items():
                lists.setdefault(key, []).extend(entries or ())
        return lists

    def make_fix_the_setting(self, entry: GalleryEntry) -> list[str]:
        """Make the fix an image was made again with the user's setting, from the next job on:
        its plain settings set, its layer lists remembered for the model (`fixes.apply_fix`).
        Returns the setting keys that changed."""
        fix = dict(entry.applied_fix or {})
        shared, _own = split_fix(fix)
        if fix_in_place(self.state, fix, self.remembering_lists()).layers_remembered:
            fix = shared  # its layers are remembered for the model already
        summary = words.fix_short(fix, self.state.components())
        try:
            changed = apply_fix(self.state, self.client, fix, summary, self.dialogs.job_failed)
        except ValueError as error:
            self.dialogs.error(f"The fix could not be applied: {error}.")
            return []
        self._refresh()  # the image's banner, as the settings stand now
        return changed

    def make_again(self, entry: GalleryEntry) -> int:
        """Make the same image again with nothing changed: for a NaN that did not come back
        when the failing part ran again (an intermittent kernel or device fault), the cure is
        another run, not a setting."""
        request = {**self._request(), **entry.generate_values(), **entry.picture_values()}
        if entry.seed is not None:
            request["batch"] = 1
        self.banner.show_message("info", "<b>Making the same image again</b>, unchanged…")
        return self._submit(request, None)
