"""What to try in the tool that made a black image whose model is not in the library: the likely
cause, from what the image's record and pixels say (the model family the record implies, a NaN
replaced by zeros before the VAE, what the tool runs wider than fp16 by default), and that
tool's own switches in the order to try them, from the tables in `app.core.words.tools`.

Nothing here was reproduced: the words say likely, never the cause, and end with the step that
lets the health check prove it (adding the model's folder). Plain data and words; no torch.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from app.core.explain import runtime
from app.core.explain.pixels import PixelFigures, zeroed_stage
from app.core.explain.records import Record
from app.core.families.faults import ToolFault
from app.core.families.registry import tool_faults
from app.core.settings.values import SettingValue
from app.core.words.tools import TERMS, TOOLS, setting_words, wide_by_default

# Where the NaN most likely is, completing "the likely cause is ..." (and each family's known
# faults in other tools, `Family.tool_faults`).
LIKELY_WORDS = {
    "vae_decode": (
        "a NaN in the VAE's decode, the most common one (its values pass fp16's limit of "
        "65504 while it turns the latents into pixels)"
    ),
    "denoiser": "a NaN in the UNet, most often its attention overflowing fp16",
}
# What in the record or the pixels points there, one clause each; {placeholders} are filled
# from NextSteps.reasons.
REASON_WORDS = {
    "family_stated": "its record says the model is {family} ({stated})",
    "family_named": "the model's name ({name}) says {family}",
    "family_vae": "its VAE ({vae}) is {family}'s",
    "fp16_vae": (
        "it used a VAE made for fp16 ({vae}), so the VAE is an unlikely place for the NaN"
    ),
    "latent": (
        "the flat colour is what latents replaced by zeros decode to, so the NaN came before "
        "the VAE"
    ),
    "wide": "{tool} {does}, so {part} is an unlikely place for the NaN unless {unless}",
}
# What to rule out before any precision switch; the notes say how.
RULE_OUT_WORDS = {
    "sageattention": "SageAttention ({nodes})",
    "compile": "the compile step ({compiled}), which can hide a NaN",
    "step_cache": runtime.RUNTIME_WORDS["cache_rule_out"],
}
# The sentences around them.
STEP_WORDS = {
    "intro": (
        "Until it can, this is what images like this one from {tool} usually are, not a diagnosis."
    ),
    "likely": "The likely cause is {likely}.",
    "rule_out": "First rule out {things} (see the notes).",
    "switches": "In {tool}, try {first}{switches}.",
    "switches_then": "Then, in {tool}, try {first}{switches}.",
    "still_black": "if the image is still black: {switch}",
    "only_if": "only if {unless}: {switch}",
    "add_folder": (
        "To know rather than guess, add the folder that holds the model in Settings > Model "
        "folders and explain the image again: the health check then reproduces the image and "
        "verifies a fix."
    ),
}
PART_WORDS = {"vae": "the VAE", "attention": "attention"}

# Each switch is the HalfSafe setting that widens one part; tools.TERMS says it in each tool.
PART_SETTINGS: dict[str, tuple[str, Any]] = {
    "vae": ("vae_precision", "fp32"),
    "attention": ("upcast_attention", True),
    "unet": ("unet_precision", "fp32"),
    "all": ("no_half", True),
}
# The parts to widen, first to last, for each likely cause (and a family's known fault's own).
ORDER = {
    "vae_decode": ("vae", "attention", "all"),
    "denoiser": ("attention", "unet", "all"),
}
_FP16_FIX = re.compile(r"fp16[-_ ]?fix", re.IGNORECASE)


@dataclass(frozen=True)
class Switch:
    """One switch to try in the image's tool: its flags and settings (from `tools.TERMS`), the
    part it widens, and, for a part the tool runs wide by default, when it helps at all."""

    part: str  # "vae", "attention", "unet", "all"
    flags: list[str]
    settings: dict[str, SettingValue]
    note: str = ""  # where the tool's switch is wider than the part
    only_if: str | None = None  # completes "only if ...": the default it undoes

    def to_json(self) -> dict[str, Any]:
        return {
            "part": self.part,
            "flags": list(self.flags),
            "settings": dict(self.settings),
            "note": self.note,
            "only_if": self.only_if,
        }


@dataclass(frozen=True)
class NextSteps:
    """What to try in the tool that made the image until the check can run: the likely cause
    (a LIKELY_WORDS key) and why (REASON_WORDS keys with their values), what to rule out first,
    the switches in order, and whether adding the model's folder lets the check prove it."""

    tool: str
    likely: str
    family: str | None
    reasons: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    rule_out: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    switches: list[Switch] = field(default_factory=list)
    add_folder: bool = True
    version: str | None = None  # the tool's version, as its record names it

    @property
    def how(self) -> str:
        return TOOLS[self.tool].how

    def to_json(self) -> dict[str, Any]:
        return {
            "tool": self.tool,
            "family": self.family,
            "likely": self.likely,
            "rule_out": [key for key, _ in self.rule_out],
            "switches": [s.to_json() for s in self.switches],
            "how": self.how,
            "add_folder": self.add_folder,
        }


def model_family(record: Record) -> tuple[ToolFault | None, tuple[str, dict[str, str]] | None]:
    """The known fault of the family the record implies (None when it does not tell) and the
    reason: what the tool states (InvokeAI's base, SD.Next's pipeline) first, then the model's
    name, then its VAE's name. A stated family with no known fault is believed: no name
    overrides it; a stated base that leaves the family open (a plain Stable Diffusion pipeline)
    lets the model's name tell."""
    faults = tool_faults()
    base = (record.base or "").strip().lower()
    open_to_names = faults
    if base:
        for fault in faults:
            if fault.stated(base):
                return fault, (
                    "family_stated",
                    {"family": fault.title, "stated": record.base or ""},
                )
        open_to_names = tuple(f for f in faults if f.vaguely_stated(base))
    for name in (record.model, record.unet):
        for fault in open_to_names if name else ():
            if fault.named(name or ""):
                return fault, ("family_named", {"family": fault.title, "name": name or ""})
    vae = record.vae or ""
    for fault in () if base else faults:
        if fault.vae_named(vae):
            return fault, ("family_vae", {"family": fault.title, "vae": vae})
    return None, None


def plan(
    record: Record, status: str, pixels: PixelFigures, *, add_folder: bool
) -> NextSteps | None:
    """What to try in the tool that made a NaN-black image (or one whose NaN was replaced by
    zeros, or saturated: an overflow to infinity) whose model cannot be checked; None for
    another status, or an image whose maker is unknown."""
    tool = record.made_by
    if status not in ("nan", "nan_zeroed", "saturated") or tool not in TOOLS:
        return None
    fault, because = model_family(record)
    family = fault.family if fault is not None else None
    reasons = [because] if because else []
    flat = pixels.flat
    if status == "nan_zeroed" and flat is not None and zeroed_stage(flat) == "latent":
        reasons.append(("latent", {}))
        cause = "denoiser"
    elif record.vae and _FP16_FIX.search(record.vae):
        reasons.append(("fp16_vae", {"vae": record.vae}))
        cause = "denoiser"
    else:
        cause = fault.likely if fault is not None else "vae_decode"
    order = list(fault.order if fault is not None and cause == fault.likely else ORDER[cause])
    default = wide_by_default(tool, order[0], family)
    if default is not None and cause != "denoiser":
        # The tool already runs that part wide: the NaN is more likely in the UNet, and the
        # part's own switch comes last, for the case where its default was changed.
        values: dict[str, str] = {
            "tool": TOOLS[tool].name,
            "does": default.does,
            "unless": default.unless,
            "part": PART_WORDS.get(order[0]) or order[0],
        }
        reasons.append(("wide", values))
        order = [*ORDER["denoiser"], *(p for p in order if p not in ORDER["denoiser"])]
        cause = "denoiser"
    rule_out = []
    if record.attention:
        nodes = ", ".join(k.words() for k in record.attention)
        rule_out.append(("sageattention", {"nodes": nodes}))
    if status == "nan_zeroed" and record.compiled:
        rule_out.append(("compile", {"compiled": record.compiled}))
    if record.caches:
        rule_out.append(("step_cache", {"nodes": runtime.cache_nodes(record.caches)}))
    return NextSteps(
        tool,
        cause,
        family,
        reasons,
        rule_out,
        _switches(tool, order, family, record),
        add_folder,
        record.version,
    )


def _switches(tool: str, order: list[str], family: str | None, record: Record) -> list[Switch]:
    """The tool's switch for each part, in order; one the tool runs wide by default goes last,
    with when it helps; a switch that repeats an earlier one (a tool whose one switch covers
    several parts) is said once. HalfSafe's own image skips what its record shows was on."""
    switches: list[Switch] = []
    later: list[Switch] = []
    seen: set[str] = set()
    for part in order:
        key, value = PART_SETTINGS[part]
        if tool == "halfsafe":
            already = (record.precision.get(key), record.precision.get("precision"))
            if any(v not in (None, "auto", "fp16", False) for v in already):
                continue
            from app.core.health.words import flag

            switch = Switch(part, [flag(key, value)], {})
        else:
            term = TERMS[(key, value)][tool]
            switch = Switch(part, list(term.flags), dict(term.settings), term.note)
        same = json.dumps([switch.flags, switch.settings], sort_keys=True)
        if same in seen:
            continue
        seen.add(same)
        default = wide_by_default(tool, part, family)
        if default is None:
            switches.append(switch)
        else:
            later.append(Switch(part, switch.flags, switch.settings, switch.note, default.unless))
    return switches + later


def switch_words(tool: str, switch: Switch) -> str:
    """One switch in the tool's terms: 'start it with --no-half-vae', 'set upcast_attn = true
    ("Upcast cross attention layer to float32")', with its note."""
    parts = []
    if switch.flags:
        verb = "run it with" if tool == "halfsafe" else "start it with"
        parts.append(f"{verb} {' '.join(switch.flags)}")
    for key, value in switch.settings.items():
        shown = setting_words(tool, key)
        parts.append(f"set {key} = {json.dumps(value)}" + (f' ("{shown}")' if shown else ""))
    words = " and ".join(parts)
    return f"{words} ({switch.note})" if switch.note else words


def likely_words(steps: NextSteps) -> str:
    """The likely cause, said as likely, after what in the record and the pixels points there."""
    sentences = []
    reasons = "; ".join(REASON_WORDS[key].format(**values) for key, values in steps.reasons)
    if reasons:
        sentences.append(f"{reasons[0].upper()}{reasons[1:]}.")
    faults = {fault.likely: fault.likely_words for fault in tool_faults()}
    likely = LIKELY_WORDS.get(steps.likely) or faults[steps.likely]
    sentences.append(STEP_WORDS["likely"].format(likely=likely))
    return " ".join(sentences)


def rule_out_words(steps: NextSteps) -> str:
    """What to rule out before any precision switch, one sentence ('' when nothing)."""
    if not steps.rule_out:
        return ""
    things = [RULE_OUT_WORDS[key].format(**values) for key, values in steps.rule_out]
    return STEP_WORDS["rule_out"].format(things=" and ".join(things))


def words(steps: NextSteps) -> str:
    """The next steps in words: the likely cause, what to rule out, the switches in order, and
    how to make the check prove it."""
    sentences = [STEP_WORDS["intro"].format(tool=TOOLS[steps.tool].name), likely_words(steps)]
    rule_out = rule_out_words(steps)
    if rule_out:
        sentences.append(rule_out)
    if steps.switches:
        clauses = []
        for index, switch in enumerate(steps.switches):
            clause = switch_words(steps.tool, switch)
            if switch.only_if:
                clause = STEP_WORDS["only_if"].format(unless=switch.only_if, switch=clause)
            elif index:
                clause = STEP_WORDS["still_black"].format(switch=clause)
            clauses.append(clause)
        sentences.append(
            STEP_WORDS["switches_then" if rule_out else "switches"].format(
                tool=TOOLS[steps.tool].name,
                first="first: " if len(clauses) > 1 else "",
                switches="; ".join(clauses),
            )
        )
    if steps.tool != "halfsafe":
        sentences.append(runtime.state_words(steps.tool, TOOLS[steps.tool].name, steps.version))
    if steps.add_folder:
        sentences.append(STEP_WORDS["add_folder"])
    return " ".join(sentences)
