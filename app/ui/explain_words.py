"""What the explanation of an image says, as text for the "Why was this image black?" dialog:
its title by how the image looks, the verdict line and its level, the fix in the terms of the
tool that made the image, and what to try there while the model is not found. Plain text and
rich-text HTML only; no Qt, so each answer can be read without a window."""

from __future__ import annotations

import html

from app.core.explain import STATUS_WORDS, Explanation, findings
from app.core.explain.next_steps import NextSteps, Switch, likely_words, rule_out_words
from app.core.explain.node_fix import NodeFix
from app.core.generation.records import IMAGE_STATUS_WORDS
from app.core.words.nodes import NODE_WORDS
from app.core.words.tools import TOOLS, ToolFix, setting_words
from app.ui import words

_STATUS_WORDS = {**IMAGE_STATUS_WORDS, **STATUS_WORDS}  # a generated image's, and explain's own
_LEVELS = {
    "nan": "bad",
    "nan_zeroed": "bad",
    "flat": "warn",
    "saturated": "bad",
    "noise": "bad",
    "noise_region": "bad",
    "inverted": "bad",
    "tiled_noise": "bad",
    "rgb_static": "bad",
    "false_colour": "bad",
    "unclaimed": "warn",
    "safety_checker": "warn",
    "black": "info",
    "ok": "good",
}


def title_for(name: str, result: Explanation) -> str:
    """The dialog's title, by what the image looks like: black, grey, white, saturated, noise,
    one flat colour, or nothing wrong."""
    if result.status == "nan_zeroed":
        return f"Why is {name} grey?"
    if result.status == "inverted":
        return f"Why are the colours of {name} inverted?"
    pixels = result.pixels
    saturated = pixels.saturated
    if saturated:
        return f"Why is {name} {'white' if saturated.white else 'saturated'}?"
    look = findings.look_figures(pixels)
    if look is not None:  # tiled noise, RGB static, false colour (`looks`)
        return f"Why is {name} {findings.LOOK_NAMES[look[0]]}?"
    if pixels.noise_region or result.status == "noise_region":
        return f"Why is part of {name} noise?"
    if result.status in ("noise", "unclaimed"):
        return f"Why is {name} noise?"
    if pixels.clipped_white:
        return f"Why is {name} white?"  # clipped white is never "flat": read it here
    flat = pixels.flat
    if flat:
        low, high = min(flat.colour), max(flat.colour)
        look = (
            "white"
            if low >= 245
            else "black"
            if high <= 10
            else "grey"
            if high - low <= 8
            else "one flat colour"
        )
        return f"Why is {name} {look}?"
    if result.status == "ok":
        return f"{name}: nothing went wrong"
    return f"Why is {name} black?"


def verdict(result: Explanation) -> tuple[str, str]:
    """The verdict banner's level ("bad", "warn", "info", "good") and its rich text: what the
    image is, and the tool that made it."""
    status, made_by = result.status, result.made_by
    tool = TOOLS[made_by].name if made_by in TOOLS else "an unknown tool"
    return (
        _LEVELS.get(status, "info"),
        f"<b>{html.escape(words.first_upper(_STATUS_WORDS.get(status, status)))}</b>"
        " · made by "
        f"{html.escape(tool)}",
    )


def fix_words(for_tool: ToolFix, halfsafe_flags: list[str]) -> tuple[str, str, str]:
    """The fix in the terms of the tool that made the image: the card's title, its rich text,
    and the plain text copied (the flags and the settings, one a line)."""
    tool_key = for_tool.tool
    tool = TOOLS[tool_key].name if tool_key in TOOLS else tool_key
    lines: list[str] = []
    plain: list[str] = []
    flags = " ".join(for_tool.flags)
    if flags:
        lines.append(f"Start {html.escape(tool)} with <code>{html.escape(flags)}</code>")
        plain.append(flags)
    if tool_key == "halfsafe" and for_tool.settings:
        # HalfSafe's own settings by the names its Settings page shows them.
        lines.append("Or in Settings: " + html.escape(words.settings_listed(for_tool.settings)))
    else:
        for key, value in for_tool.settings.items():
            shown = setting_words(tool_key, key)
            setting = f"{key} = {value}" + (f" (“{shown}”)" if shown else "")
            lines.append(f"Set {html.escape(setting)}")
            plain.append(f"{key} = {value}")
    lines.append(html.escape(for_tool.how))
    if tool_key != "halfsafe" and halfsafe_flags:
        lines.append("In HalfSafe: <code>" + html.escape(" ".join(halfsafe_flags)) + "</code>")
    return f"Fix in {tool}", "<br>".join(lines), "\n".join(plain)


def node_fix_lines(node_fix: NodeFix) -> list[str]:
    """For a ComfyUI user, the rich-text lines put before the fix: HalfSafe Fix first, the
    flags as its fallback, and the flags it still needs beside it, if any."""
    lines = [
        f"<b>{html.escape(NODE_WORDS['title'])}</b> {html.escape(node_fix.workflow.how)}",
        html.escape(node_fix.fallback_words),
    ]
    if node_fix.also:
        also = NODE_WORDS["also"].format(flags=" ".join(node_fix.also))
        lines.append(html.escape(words.first_upper(also)) + ".")
    return lines


def next_steps_words(steps: NextSteps, can_add_folder: bool) -> tuple[str, str]:
    """What to try in the image's tool while its model is not found, said as likely, not
    proven: the card's title and its rich text. `can_add_folder`: the dialog offers "Add model
    folder…" (else the step points to Settings)."""
    tool = TOOLS[steps.tool].name
    why = "the model was not found" if steps.add_folder else "the image names no model"
    lines = [
        f"<b>Likely, not proven:</b> {why}, so nothing was reproduced. "
        + html.escape(likely_words(steps))
    ]
    rule_out = rule_out_words(steps)
    if rule_out:
        lines.append(html.escape(rule_out))
    number = 0
    for switch in steps.switches:
        step = _switch_html(steps.tool, switch)
        if switch.only_if:
            lines.append(f"Only if {html.escape(switch.only_if)}: {step[0].lower()}{step[1:]}")
        else:
            number += 1
            lines.append(f"{number}. {'' if number == 1 else 'Still black? '}{step}")
    if steps.switches:
        lines.append(html.escape(steps.how))
    if steps.add_folder:
        where = (
            "<b>Add model folder…</b> above" if can_add_folder else "Settings &gt; Model folders"
        )
        lines.append(
            f"To know rather than guess: add the folder that holds the model ({where}) and "
            "the health check reproduces the image and verifies a fix."
        )
    return f"What to try in {tool}", "<br>".join(lines)


def _switch_html(tool_key: str, switch: Switch) -> str:
    """One switch in the tool's terms: its flags as code, its settings by the tool's labels."""
    parts = []
    if switch.flags:
        verb = "Run" if tool_key == "halfsafe" else "Start"
        tool = html.escape(TOOLS[tool_key].name)
        parts.append(f"{verb} {tool} with <code>{html.escape(' '.join(switch.flags))}</code>")
    for key, value in switch.settings.items():
        shown = setting_words(tool_key, key)
        setting = f"{key} = {value}" + (f" (“{shown}”)" if shown else "")
        parts.append(f"Set {html.escape(setting)}")
    said = " and ".join(parts)
    return f"{said} ({html.escape(switch.note)})" if switch.note else said
