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
from app.core.explain.records import Record
from app.core.words.tools import TERMS, TOOLS, setting_words, wide_by_default

# Where the NaN most likely is, completing "the likely cause is ...".
LIKELY_WORDS = {
    "vae_decode": (
        "a NaN in the VAE's decode, the most common one (its values pass fp16's limit of "
        "65504 while it turns the latents into pixels)"
    ),
    "sdxl_vae": (
        "SDXL's original VAE overflowing fp16 while it decodes, as it is known to (the reason "
        "fp16-fixed SDXL VAEs exist)"
    ),
    "sd2_attention": (
        "SD 2.x's attention overflowing fp16 in the UNet, as it is known to (the reason "
        "upcast-attention switches exist)"
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
FAMILY_WORDS = {"sdxl": "SDXL", "sd2": "SD 2.x"}
PART_WORDS = {"vae": "the VAE", "attention": "attention"}

# Each switch is the HalfSafe setting that widens one part; tools.TERMS says it in each tool.
PART_SETTINGS: dict[str, tuple[str, Any]] = {
    "vae": ("vae_precision", "fp32"),
    "attention": ("upcast_attention", True),
    "unet": ("unet_precision", "fp32"),
    "all": ("no_half", True),
}
# The parts to widen, first to last, for each likely cause.
ORDER = {
    "vae_decode": ("vae", "attention", "all"),
    "sdxl_vae": ("vae", "attention", "all"),
    "sd2_attention": ("attention", "all"),
    "denoiser": ("attention", "unet", "all"),
}

# Names that say a family (checked case-insensitively, bounded by non-letters): sd_xl_base,
# "Juggernaut XL", ponyDiffusionV6XL; v2-1_768-ema-pruned, sd21, stable-diffusion-2-1.
_SDXL_NAME = re.compile(r"sd[-_ ]?xl|(?<![a-z])xl(?![a-z])", re.IGNORECASE)
_SDXL_CAMEL = re.compile(r"[a-z]XL(?![a-z])")  # juggernautXL_v9, dreamshaperXL
_SD2_NAME = re.compile(
    r"(?<![a-z0-9])(?:sd[-_ ]?2(?:[-_. ]?[01])?|stable[-_ ]?diffusion[-_ ]?2(?:[-_. ]?[01])?"
    r"|v2-[01]_(?:512|768)|768-v-ema)(?![0-9])",
    re.IGNORECASE,
)
_FP16_FIX = re.compile(r"fp16[-_ ]?fix", re.IGNORECASE)


@dataclass(frozen=True)
class Switch:
    """One switch to try in the image's tool: its flags and settings (from `tools.TERMS`), the
    part it widens, and, for a part the tool runs wide by default, when it helps at all."""

    part: str  # "vae", "attention", "unet", "all"
    flags: list[str]
    settings: dict[str, Any]
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


def model_family(record: Record) -> tuple[str | None, tuple[str, dict[str, str]] | None]:
    """The family the record implies ("sdxl", "sd2", or None when it does not tell) and the
    reason: what the tool states (InvokeAI's base, SD.Next's pipeline) first, then the model's
    name, then an SDXL VAE's name. A stated family that is neither is believed: no name
    overrides it."""
    stated = _stated_family(record.base)
    if stated in FAMILY_WORDS:
        family = FAMILY_WORDS[stated]
        return stated, ("family_stated", {"family": family, "stated": record.base or ""})
    if stated == "other":
        return None, None
    for name in (record.model, record.unet):
        if not name:
            continue
        if stated is None and (_SDXL_NAME.search(name) or _SDXL_CAMEL.search(name)):
            return "sdxl", ("family_named", {"family": "SDXL", "name": name})
        if _SD2_NAME.search(name):
            return "sd2", ("family_named", {"family": "SD 2.x", "name": name})
    vae = record.vae or ""
    if stated is None and re.search(r"sd[-_ ]?xl", vae, re.IGNORECASE):
        return "sdxl", ("family_vae", {"family": "SDXL", "vae": vae})
    return None, None


def _stated_family(base: str | None) -> str | None:
    """ "sdxl" or "sd2" from what a tool states, "sd" for SD 1.x or 2.x (SD.Next's plain
    StableDiffusionPipeline), "other" for another family, None when nothing is stated."""
    if not base:
        return None
    text = base.strip().lower()
    if text.startswith("sdxl") or text.startswith("stablediffusionxl"):
        return "sdxl"
    if text in ("sd-2", "sd2"):
        return "sd2"
    if text.startswith("stablediffusion") and not text.startswith("stablediffusion3"):
        return "sd"
    return "other"


def plan(
    record: Record, status: str, pixels: dict[str, Any], *, add_folder: bool
) -> NextSteps | None:
    """What to try in the tool that made a NaN-black image (or one whose NaN was replaced by
    zeros, or saturated: an overflow to infinity) whose model cannot be checked; None for
    another status, or an image whose maker is unknown."""
    tool = record.made_by
    if status not in ("nan", "nan_zeroed", "saturated") or tool not in TOOLS:
        return None
    family, because = model_family(record)
    reasons = [because] if because else []
    flat = pixels.get("flat") or {}
    if status == "nan_zeroed" and flat.get("stage") == "latent":
        reasons.append(("latent", {}))
        cause = "denoiser"
    elif record.vae and _FP16_FIX.search(record.vae):
        reasons.append(("fp16_vae", {"vae": record.vae}))
        cause = "denoiser"
    else:
        cause = {"sdxl": "sdxl_vae", "sd2": "sd2_attention"}.get(family or "", "vae_decode")
    order = list(ORDER[cause])
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
    sentences.append(STEP_WORDS["likely"].format(likely=LIKELY_WORDS[steps.likely]))
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
