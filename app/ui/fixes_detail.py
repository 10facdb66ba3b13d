"""The Fixes page's longer words: the selected row in full (its fix's parts, each layer by name,
the precision it was proved at, what proved it and how well, the last check), what a Re-verify
will do before it does it, the fix as Markdown for its viewer, and what a run of "Check all my
models" found. Plain text and HTML, built from the rows and the state's values."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from app.core.components import COMPONENTS, Verdict
from app.core.fixing.quality import plain_figures
from app.core.precision import idle_settings
from app.core.settings import FIELDS
from app.ui import words
from app.ui.fix_editor import LAYER_KEYS
from app.ui.fixes_rows import (
    FP32_ONLY_WORDS,
    LearnedRow,
    _first_quality,
    fix_quality,
    no_fix_words,
    quality_words,
    ran_only_in_fp32,
    report_words,
    torch_of,
    verdict_words,
    verified_words,
)

if TYPE_CHECKING:
    from app.core.fixing.profiles import RememberedFix
    from app.core.hardware import DeviceInfo
    from app.core.models.summary import ModelSummary
    from app.core.requests.library_check import ModelChecks


def at_words(
    proved_at: Mapping[str, Any], recommended: Mapping[str, Any], model: ModelSummary | None
) -> str:
    """'fp16 everywhere': the precision a fix is for, on this computer (`recommended`, its
    recommendation), said of the loaded `model`'s parts."""
    return words.precision_summary(
        proved_at, recommended, model.components if model is not None else ()
    )


def detail_html(row: LearnedRow, model: ModelSummary | None, recommended: Mapping[str, Any]) -> str:
    """The row in full: its fix's parts (each layer by name), the precision it was proved
    at, what proved it and when, how close it came to fp32, and the last check. `model`: the
    loaded model (its components say a fix of it: a transformer's, not a UNet's)."""
    stored, report = row.stored, row.report
    torch = torch_of(row)
    components = _loaded_components(row, model)
    parts = [
        f"<h3>{html.escape(row.name)}</h3>",
        _para("On", row.device + (f", torch {torch}" if torch else "")),
    ]
    if row.source and row.source != row.name:  # a built-in demo's source is its name
        parts.append(_para("File", row.source))
    if stored is None:
        parts.append(_para("Fix", no_fix_words(report)))
        if report is not None and report.fix_summary:
            parts.append(_para("The check found", report.fix_summary))
            quality = quality_words(report.fix_quality or _first_quality(report.fix_summary))
            if quality:
                parts.append(_para("How well it worked", quality))
    else:
        fix = stored.fix
        said = words.fix_short(fix.settings, fix.parts or components)
        parts.append(_para("Fix", said or fix.summary, bold=True))
        parts.extend(_fix_parts(fix.settings, components))
        at = at_words(fix.proved_at(), recommended, model)
        parts.append(
            _para(
                "Proved at",
                f"{at}, the precision it is a fix for"
                + ("" if fix.made_at else " (assumed: it was saved without it)")
                + "; Re-verify runs it there.",
            )
        )
        parts.append(_para("Proved by", f"the {verified_words(fix)}."))
        parts.append(_para("How well it worked", fix_quality(fix)))
        # The sentence it was saved with, unless it only lists the settings said above.
        if fix.summary and fix.summary not in (
            said,
            words.fix_short(fix.settings, fix.parts),
            words.settings_listed(fix.settings),
        ):
            said = f"In the words of the {fix.verified_by}"
            parts.append(_para(said, fix.summary, quoted=True))
    if report is not None:
        headline = plain_figures(report.headline)
        # The verdict once: most headlines begin with it ("Fixable: at your settings ...").
        said = report_words(report)
        verdict = words.first_upper(report.verdict.value)
        if headline.startswith(verdict) and verdict == verdict_words(report):
            said = said.removeprefix(f"{verdict}, ")
        if ran_only_in_fp32(report):
            headline += " " + FP32_ONLY_WORDS
        parts.append(_para("Last check", f"{said}: {headline}"))
    else:
        parts.append(_para("Last check", "none kept for this model on this device."))
    return "".join(parts)


def _loaded_components(row: LearnedRow, model: ModelSummary | None) -> tuple[str, ...]:
    """The row's model's components where it is the loaded `model`, else none known."""
    mine = model is not None and model.profile_key == row.profile_key
    return tuple(model.components) if model is not None and mine else ()


def _fix_parts(settings: Mapping[str, Any], loaded: Sequence[str]) -> list[str]:
    """Which components a fix is about, what they do, each layer list by name, and the
    fix's other settings; `loaded`: the components of the model, where it is loaded."""
    parts = []
    components = fix_components(settings, loaded)
    if components:
        where = "; ".join(
            f"{words.component_phrase(c)}, which {words.COMPONENT_ROLES.get(c, '')}"
            if words.COMPONENT_ROLES.get(c)
            else words.component_phrase(c)
            for c in components
        )
        parts.append(_para("Where", where + "."))
    for key in LAYER_KEYS:
        entries = [str(entry) for entry in settings.get(key) or ()]
        if not entries:
            continue
        parts.append(f"<p><b>{html.escape(FIELDS[key].label)}</b> ({len(entries)}):</p><ul>")
        for entry in entries:
            component, _, path = entry.partition(":")
            said = words.describe_module(component, path).removesuffix(
                f", in {words.component_phrase(component)}"
            )
            parts.append(
                f"<li><code>{html.escape(words.breakable(path or entry))}</code>"
                + (f" in {html.escape(words.component_phrase(component))}" if path else "")
                + (f": {html.escape(said)}" if said else "")
                + "</li>"
            )
        parts.append("</ul>")
    others = {k: v for k, v in settings.items() if k not in LAYER_KEYS}
    if others:
        parts.append(_para("Settings it changes", words.settings_listed(others)))
    return parts


def fix_components(settings: Mapping[str, Any], loaded: Sequence[str] = ()) -> list[str]:
    """The components a fix's settings are about, in run order: those its layer lists name and
    those its per-component precisions set (the UNet or the transformer by `loaded`, the
    loaded model's components, when they are known)."""
    named: set[str] = set()
    for key, value in settings.items():
        if key in LAYER_KEYS:
            named.update(str(entry).partition(":")[0] for entry in value or ())
            continue
        if key == "no_half_vae" and value:
            named.add("vae")
        # A part that borrows its setting (Anima's text conditioner) is named after its owner.
        owners = [
            c.name
            for c in sorted(COMPONENTS.values(), key=lambda c: c.borrows_setting)
            if c.setting == key and c.part_of is None
        ]
        present = [name for name in owners if name in loaded]
        named.update((present or owners)[:1])
    return [name for name in COMPONENTS if name in named] + sorted(named - set(COMPONENTS))


def _para(title: str, text: str, bold: bool = False, quoted: bool = False) -> str:
    """One line of the detail pane: 'Title: text', the text in bold (what matters most) or in
    italics (a sentence quoted as it was saved)."""
    body = html.escape(text)
    body = f"<b>{body}</b>" if bold else f"<i>{body}</i>" if quoted else body
    return f"<p><b>{html.escape(title)}:</b> {body}</p>"


# Re-verify ------------------------------------------------------------------------------------


def reverify_words(
    row: LearnedRow,
    loaded: str | None,
    fix: RememberedFix | None,
    at: str,
    device: DeviceInfo | None,
) -> str:
    """What a Re-verify of `row` does, asked before it unloads the `loaded` model (its name;
    None: none is loaded): the swap, the precision it runs `fix` at (`at`, in words), and the
    `device` it runs on where that is not the one the fix was found on."""
    return _swap_words(loaded, row.name) + _fix_words(fix, at, device) + _device_words(row, device)


def _swap_words(loaded: str | None, name: str) -> str:
    if loaded is None:
        return f"HalfSafe loads {name}, runs the health check with its fix, and unloads it again."
    return (
        f"HalfSafe unloads {loaded}, loads {name} and runs the health check with its fix, then "
        f"loads {loaded} again."
    )


def _fix_words(fix: RememberedFix | None, at: str, device: DeviceInfo | None) -> str:
    if fix is None:
        return ""
    assumed = (
        ""
        if fix.made_at
        else " (it was saved without the precision it was proved at: fp16 is what "
        "HalfSafe's fixes are for)"
    )
    emulated = ""
    if device is not None and device.kind == "cpu" and "fp16" in at:
        emulated = " A CPU computes fp16 slowly, so this check takes longer than on a GPU."
    return (
        f" The check runs it at {at}, the precision the fix is for{assumed}, with the fix: "
        f"{words.first_lower(words.fix_short(fix.settings, fix.parts)) or 'none'}.{emulated}"
    )


def _device_words(row: LearnedRow, device: DeviceInfo | None) -> str:
    if device is None or device.name == row.device:
        return ""
    return f" The check runs on {device.name}, the device you use now, not on {row.device}."


def idle_words(fix: RememberedFix | None, device: DeviceInfo | None) -> str:
    """The sentence saying `device` cannot prove `fix` (every setting it changes does nothing
    there); "" when it can."""
    if fix is None or device is None or not fix.settings:
        return ""
    idle = idle_settings(fix.settings, device.kind)
    if len(idle) < len(fix.settings):
        return ""
    return (
        f"This fix ({words.first_lower(words.fix_short(fix.settings, fix.parts))}) changes "
        f"only what a CUDA GPU runs, so a check on {device.name} cannot prove it: re-verify "
        "it on the GPU it was found on."
    )


# The viewer and the run's summary ---------------------------------------------------------------


def fix_markdown(row: LearnedRow) -> str:
    """The row's remembered fix as Markdown, above its saved report in the viewer."""
    assert row.stored is not None
    stored = row.stored
    lines = [
        f"# The fix remembered for {row.name}",
        "",
        f"- **Device:** {stored.device} (torch {stored.torch_version})",
        f"- **What it does:** {stored.fix.summary}",
        f"- **Verified by:** {verified_words(stored.fix)}",
        "- **Settings:**",
    ]
    for key, value in stored.fix.settings.items():
        lines.append(f"    - {words.setting_label(key)}: {words.setting_value(key, value)}")
    return "\n".join(lines)


def run_words(run: ModelChecks, folders: Sequence[str] = ()) -> str:
    """'Checked 3 models: 1 fixable, 2 healthy; 1 not checked.' and what else the run says; a
    run that found no model says why (no model folder, or none in them: the built-in demos are
    not among "my models")."""
    checked = [row for row in run.rows if row.verdict is not None]
    counts = {v: sum(1 for row in checked if row.verdict is v) for v in Verdict}
    parts = ", ".join(f"{n} {v.value}" for v, n in counts.items() if n)
    text = f"Checked {len(checked)} model{'s' if len(checked) != 1 else ''}"
    text += f": {parts}" if parts else ""
    skipped = len(run.rows) - len(checked) + run.not_checked
    if skipped:
        text += f"; {skipped} not checked"
    text += "."
    if not run.rows and not run.not_checked and not run.cancelled:
        text = text.removesuffix(".") + (
            ": no model folder is set. Add the folders that hold your models in Settings > "
            "Folders; the built-in demos are not checked here."
            if not folders
            else ": none was found in your model folders (" + ", ".join(folders) + "). The "
            "built-in demos are not checked here."
        )
    if run.cancelled:
        text += " Cancelled before the end."
    if run.restore_problem:
        text += f" {run.restore_problem}"
    return text
