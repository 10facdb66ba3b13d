"""The Health check page's fix row: Apply fix beside the verdict, and what it says of the next
job (the fix applied here, the one the check remembered, one the settings make moot), with each
"Apply instead" of the candidates' table. A part of `HealthView`, which holds the widgets and the
report it acts on."""

from __future__ import annotations

import html
from typing import Any

from PySide6.QtWidgets import QLabel, QPushButton, QWidget

from app.core.components import in_run_order, join_words
from app.core.health import Fix, HealthReport
from app.core.precision import PrecisionPlan
from app.core.precision.words import plan_words
from app.core.settings.values import setting_entries
from app.engine.events import EngineEvent
from app.ui import words
from app.ui.dialogs import Dialogs
from app.ui.engine_client import EngineClient
from app.ui.fixes import apply_fix, layers_ran, ran_with, split_fix
from app.ui.state import AppState

# The row's words for a layer fix whose parts the settings run as wide as its layers or wider.
MOOT_WORDS = (
    "Not needed at your settings: they run the {parts} at least as wide as this fix keeps its "
    "layers, so it would change nothing. It applies again when you go back to fp16."
)

# The row's words once the settings no longer run a fix applied from it.
UNDONE_WORDS = (
    "Your settings have changed since this fix was applied: the next job runs without it. "
    "Apply it again to use it."
)


def _in_use_words(held: bool, remembered: bool) -> str:
    """The row's words for the chosen fix in use before any click: its layers remembered for
    this model by the check, its settings `held` by the user's own or else taken by this
    model's jobs from the fix the check remembered."""
    if held and remembered:
        return (
            "In use: the check remembered this fix for this model, so your next job runs with "
            "it; other models are not affected."
        )
    if held:
        return "In use: your settings already include this fix."
    return (
        "In use for this model: the check remembered it, so your next job runs with it. Apply "
        "fix writes it into Settings too, for every model you run."
    )


class FixRow:
    """Apply fix and its row, for `HealthView` (a mixin: the page owns the widgets and state it
    names: `report`, `state`, `client`, `dialogs`, `fix_actions`, `apply_button`,
    `applied_label`, `alternative_buttons`; it calls `_show_fix_actions(None)` once they are
    made, which sets the row's own fields)."""

    # The page's, set in its __init__.
    report: HealthReport | None
    state: AppState
    client: EngineClient
    dialogs: Dialogs
    fix_actions: QWidget
    apply_button: QPushButton
    applied_label: QLabel
    alternative_buttons: list[Any]  # "Apply instead", one per verified candidate not chosen
    # The row's own, set by `_show_fix_actions`: the report's fix; what Apply last wrote and
    # what the row said of it then; whether the engine has yet to remember its layers; whether
    # the next plan that runs it is to be kept as one this check verified, and those plans;
    # the plain settings the last Apply changed, key -> (before, as set), set back by the
    # next Apply of another of the report's fixes (two fixes at once are none).
    _fix_settings: dict[str, Any]
    _applied_settings: dict[str, Any]
    _applied_words: str
    _awaiting_applied: bool
    _record_plan: bool
    _verified_plans: set[str]
    _set_by_apply: dict[str, tuple[Any, Any]]

    def _show_headline(self) -> None:
        """The page's: the verdict, then this row (`_show_applied`)."""

    def _show_fix_actions(self, fix: Fix | None) -> None:
        """The row with Apply fix, over the report, for a report with a fix."""
        self.fix_actions.setVisible(fix is not None)
        self._fix_settings = dict(fix.settings) if fix is not None else {}
        self._applied_settings = {}
        self._applied_words = ""
        self._awaiting_applied = False
        self._record_plan = False
        self._verified_plans = set()
        self._set_by_apply = {}
        self.apply_button.setEnabled(bool(self._fix_settings))
        self.apply_button.setText("Apply fix")
        self.applied_label.setText("")

    def _show_applied(self) -> None:
        """The row under Apply fix says whether the next job runs the fix, as the settings and
        the model's remembered fix make it: one applied here (each setting as it set it; each
        of its layers in the plan, not replaced by layer lists of the user's own and not in a
        part set wider than they are), said applied while it runs and that the settings
        changed while it does not, and again once it does; or, before any click, the fix the
        check remembered for this model, already in use. Apply fix and each "Apply instead"
        is idle while the fix it applies runs as applied."""
        fix, applied = self._fix_settings, self._applied_settings
        plan = self.state.expected_plan()  # the next job's, resolved once for the whole row
        idle = False  # Apply fix has nothing to do
        applied_runs = bool(applied) and self._runs(applied, plan)
        moot = self._moot(fix, plan)
        if moot:
            # Its layers sit in parts the settings run wider: applying it changes nothing.
            self.applied_label.setText(MOOT_WORDS.format(parts=moot))
            self.apply_button.setText("Not needed")
            idle = True
        elif applied and self._applied_words:
            if self._awaiting_applied and self._remembered(applied):
                self._awaiting_applied = False  # the engine has remembered its layers
            if applied_runs and self._record_plan and plan is not None:
                # The fix applied here now makes the next job's plan: this check verified it.
                self._record_plan = False
                self._verified_plans.add(plan_words(plan))
            shown = applied_runs or self._awaiting_applied
            self.applied_label.setText(self._applied_words if shown else UNDONE_WORDS)
            idle = shown and applied == fix
            self.apply_button.setText("Applied" if idle else "Apply fix")
        elif fix and self._runs(fix, plan):
            shared, own = split_fix(fix)
            # Its settings held by the user's own (nothing left to apply), or by the fix the
            # check remembered for this model (Apply would write them for every model).
            idle = all(self.state.settings[k] == v for k, v in shared.items())
            remembered = bool(own) and self._remembered(fix)
            self.applied_label.setText(_in_use_words(idle, remembered))
            self.apply_button.setText("In use" if idle else "Apply fix")
        else:
            self.applied_label.setText("")
            self.apply_button.setText("Apply fix")
        self.apply_button.setEnabled(bool(fix) and not idle)
        for button in self.alternative_buttons:
            mine = bool(applied) and button.property("fix_settings") == applied
            runs = mine and (self._awaiting_applied or applied_runs)
            button.setText("Applied" if runs else "Apply instead")
            button.setEnabled(not runs)

    def _moot(self, settings: dict[str, Any], plan: PrecisionPlan | None) -> str:
        """The parts, in words, whose layers a layer fix of only layer lists names but which
        the next job runs as wide as those layers or wider (fp32 everywhere, say): there it
        changes nothing. '' for any other fix, or where it would run."""
        shared, own = split_fix(settings)
        if shared or not own or plan is None or layers_ran(own, plan.dtype_settings()):
            return ""
        if settings != self._applied_settings and any(
            self.state.settings[key] == set_to for key, (_, set_to) in self._set_by_apply.items()
        ):
            return ""  # another fix applied here widened it: applying this one sets that back
        parts = {str(e).partition(":")[0] for entries in own.values() for e in entries or ()}
        return join_words(in_run_order(parts))

    def _remembered(self, settings: dict[str, Any]) -> bool:
        """Whether the loaded model's remembered fix holds `settings`' layer lists."""
        model = self.state.model
        fix = model.remembered_fix if model is not None else None
        if fix is None:
            return False
        _, own = split_fix(settings)
        return all(set(v or ()) <= set(setting_entries(fix.settings, k)) for k, v in own.items())

    def _runs(self, settings: dict[str, Any], plan: PrecisionPlan | None) -> bool:
        """Whether the next job runs the fix `settings` as the settings and the remembered fix
        make its plan, `plan` (each layer in a part narrower than it)."""
        shared, own = split_fix(settings)
        if plan is None:  # no device known yet: by the settings and the remembered fix
            held = all(self.state.settings[k] == v for k, v in shared.items())
            return held and (not own or self._remembered(settings))
        return ran_with(plan.effective_settings(), settings) and (
            not own or layers_ran(own, plan.dtype_settings())
        )

    def apply_fix(self, settings: dict[str, Any]) -> None:
        """Apply a verified fix (the chosen one, or a candidate's "Apply instead"): its layer
        lists are remembered for this model (see `app.ui.fixes`), with the sentence that holds
        its measured agreement with fp32; its other settings are written into the settings,
        which every model uses, and the row under the report says which it was."""
        from app.core.health.fix import candidate_summary

        report = self.report
        fix = report.fix if report is not None else None
        summary = words.fix_short(settings, tuple(report.components) if report else ())
        if fix is not None and dict(fix.settings) == dict(settings):
            summary = fix.summary
        elif fix is not None:
            for candidate in fix.candidates:
                if dict(candidate.settings) == dict(settings):
                    summary = candidate_summary(candidate)

        def failed(event: EngineEvent) -> None:  # the layers were not remembered
            self._applied_settings, self._awaiting_applied = {}, False
            self._show_headline()
            self.dialogs.job_failed(event)

        shared, own = split_fix(settings)
        # Another of this report's fixes applied before: its plain settings that this one does
        # not set go back to what they were (where the user has not changed them since).
        undo = {
            key: before
            for key, (before, set_to) in self._set_by_apply.items()
            if key not in shared and self.state.settings[key] == set_to
        }
        before = {key: self.state.settings[key] for key in shared}
        try:
            if undo:
                self.state.apply(undo)
            changed = apply_fix(
                self.state,
                self.client,
                settings,
                summary,
                on_failed=failed,
                made_at=report.plan.dtype_settings() if report is not None else None,
            )
        except ValueError as error:
            self.dialogs.error(f"The fix could not be applied: {error}.")
            return
        self._applied_settings = dict(settings)
        self._awaiting_applied = bool(own)
        self._record_plan = True
        self._set_by_apply = {key: (before[key], value) for key, value in shared.items()}
        named = words.fix_short(settings, tuple(report.components) if report else ())
        if own:
            said = (
                f"Applied ({named}): remembered for this model on this device, so other models "
                "are not affected. Your next job uses it; run the check again to see the model "
                "pass."
            )
        elif changed:
            said = (
                f"Applied ({named}): written into Settings, so it holds for every model you "
                "run. Your next job uses it; run the check again to see the model pass."
            )
        else:
            said = f"Your settings already include this fix ({named})."
        if undo:
            said += f" Set back as before: {html.escape(words.settings_listed(undo))}."
        self._applied_words = said
        self._show_headline()  # the row and buttons, and the verdict at the plan it makes
