"""What in a tool's run, as the image's record (or the tool's log) shows it, draws tiles, static
or false colour rather than an fp16 overflow, each with the switch its maker gives. Plain data
and words; no torch. Used by `records` (reading), `explanation` (the words) and the CLI.

HalfSafe computes with PyTorch's own kernels on decoded weights, so it never runs the fast
paths that fail here; the record names them where it can:
- Low-bit files (`int8`, `int4`, `w4a8`, `nvfp4`, `convrot` in a loader's file name): their
  GEMMs run in kernels for the stored form, which older cards lack or run wrong per tile (a T4
  gives "deterministic tiled psychedelic noise" with INT8 Krea 2 files, comfy-kitchen issue
  55; a GTX 1650 refuses INT8 GEMM for some M only, ComfyUI issue 16431; int8 ConvRot on RDNA1
  draws "blocky noise", comfyui-rocm issue 111). Another stored form of the same model (bf16,
  fp8, GGUF) runs other kernels.
- An inpainting sampler of LanPaint's kind (its nodes) with an int8 ConvRot file: noise and
  colour blocks (LanPaint issue 99).
- Qwen-Image 2.1's prefix cache (`QwenImage21Cache`) keeps keys and values in int8 or int4
  ("int4 roughly doubles the per-step error"); its `device=off` is the only way to rule it out,
  and an fp16 cache keeps them unrounded.
- ComfyUI 0.41 and later captures a CUDA graph per DynamicVRAM block once warm and replays it
  (its model compiler: `--disable-comfy-compiler`, `--disable-cuda-graphs`); its version is in
  the UI workflow's core nodes or the log's "ComfyUI version" line.
- DynamicVRAM (ComfyUI 0.15 and later) pages weights and writes them back to the host: "pure
  RGB static" or a false-colour, normal-map-like picture on an RX 9070 XT (ComfyUI issue
  16337); `--disable-dynamic-vram`, which ComfyUI says will be removed soon.
- A loader's unexpected keys (ComfyUI's log: "unet unexpected: [...]"): weights the loader
  did not use, a file of another variant than the one it builds, which draws noise.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.core.errors import BadFileError
from app.core.limits import index_in_name, open_regular

# The marks of a low-bit stored form in a file name, and the form each names.
_LOW_BIT = re.compile(r"(?<![a-z])(int8|int4|w4a8|nvfp4|convrot)(?![a-z])")
# A node or infotext key whose class names LanPaint's samplers.
_INPAINT_SAMPLER = "lanpaint"
PREFIX_CACHE_NODE = "qwenimage21cache"
_LOW_BIT_CACHE = ("int8", "int4")
_SKIPPED_MODES = (2, 4)  # a UI workflow node muted (2) or bypassed (4) did not run
_MODEL_FILE = re.compile(r"\.(safetensors|sft|gguf|ckpt|pt|pth|bin)$", re.IGNORECASE)
# ComfyUI's versions where its model compiler and DynamicVRAM start.
COMPILER_SINCE = (0, 41)
DYNAMIC_VRAM_SINCE = (0, 15)
# A log is read up to this many bytes (a ComfyUI log of a long session is a few MB).
MAX_LOG_BYTES = 16 * 1024 * 1024
# No two quantifiers here can share a run of blanks between them: `\s*(?:keys?)?\s*` splits a
# run of n blanks n ways and tries each (a 400 KB run took minutes); as written below, a run is
# taken once and given back once, so a log is read in time linear in its size.
_LOG_VERSION = re.compile(r"ComfyUI version:\s*v?([0-9]{1,6}(?:\.[0-9]{1,6}){1,3})")
_LOG_UNEXPECTED = re.compile(
    r"(?i)\b(unet|clip|vae|model|diffusion_model|text_encoder)\s+unexpected"
    r"(?:\s*keys?)?\s*:\s*(.*)"
)
_QUOTED = re.compile(r"'([^']{1,300})'|\"([^\"]{1,300})\"")


@dataclass(frozen=True)
class LowBitFile:
    """A file in a low-bit stored form the record shows a loader ran: its node, its name as
    the record gives it, the form (`int8`, `int4`, `w4a8`, `nvfp4`) and whether it is ConvRot's."""

    node: str
    file: str
    form: str
    convrot: bool

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "file": self.file, "format": self.form, "convrot": self.convrot}


@dataclass(frozen=True)
class PrefixCache:
    """Qwen-Image 2.1's prefix cache node as the record shows it: its cache dtype and device
    (None where not recorded)."""

    node: str
    dtype: str | None
    device: str | None

    @property
    def off(self) -> bool:
        return (self.device or "").strip().lower() == "off"

    @property
    def low_bit(self) -> bool:
        return not self.off and (self.dtype or "").strip().lower() in _LOW_BIT_CACHE

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "dtype": self.dtype, "device": self.device, "off": self.off}


@dataclass(frozen=True)
class UnexpectedKeys:
    """A loader's warning that it did not use some of a file's weights: the part, how many
    keys it listed, the first."""

    part: str
    count: int
    first: str | None

    def to_json(self) -> dict[str, Any]:
        return {"part": self.part, "count": self.count, "first": self.first}


@dataclass
class ToolLog:
    """What a tool's log says: its version and the loader's unexpected keys."""

    path: str
    version: str | None = None
    unexpected: list[UnexpectedKeys] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "version": self.version,
            "unexpected_keys": [u.to_json() for u in self.unexpected],
        }


def low_bit_form(name: str) -> tuple[str, bool] | None:
    """(the low-bit form a file name marks, whether ConvRot's), or None for another file."""
    marks = set(_LOW_BIT.findall(Path(name.replace("\\", "/")).name.lower()))
    if not marks:
        return None
    for form in ("nvfp4", "w4a8", "int4", "int8"):
        if form in marks:
            return form, "convrot" in marks
    return "int8", True  # ConvRot's files are int8 (`convrot` alone)


def _loader_files(kind: str, values: Iterable[Any]) -> Iterator[LowBitFile]:
    for value in values:
        if isinstance(value, str) and _MODEL_FILE.search(value.strip()):
            form = low_bit_form(value)
            if form is not None:
                yield LowBitFile(kind[:200], value[:1024], form[0], form[1])


def _prefix_cache(kind: str, inputs: dict[str, Any]) -> PrefixCache:
    dtype = device = None
    for key, value in inputs.items():
        if not isinstance(value, str):
            continue
        if "dtype" in key.lower() or "precision" in key.lower():
            dtype = value[:40]
        elif key.lower() == "device":
            device = value[:40]
    return PrefixCache(kind[:200], dtype, device)


@dataclass
class RunRecord:
    """What a record shows of the run's fast paths (`records.Record.run`)."""

    low_bit_files: list[LowBitFile] = field(default_factory=list)
    prefix_cache: PrefixCache | None = None
    inpaint_samplers: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        cache = self.prefix_cache
        return {
            "low_bit_files": [f.to_json() for f in self.low_bit_files],
            "prefix_cache": cache.to_json() if cache is not None else None,
            "inpaint_samplers": list(self.inpaint_samplers),
        }


def from_comfy_prompt(nodes: Iterable[tuple[str, dict[str, Any]]]) -> RunRecord:
    """The fast paths of a ComfyUI API prompt's nodes ((class_type, inputs): what ran)."""
    found = RunRecord()
    for kind, inputs in nodes:
        _take(found, kind, inputs, inputs.values())
    return found


def from_comfy_workflow(workflow: Any, max_nodes: int) -> RunRecord:
    """The fast paths of a ComfyUI UI workflow's nodes that were neither muted nor bypassed:
    a loader's file from its widgets; the prefix cache's dtype and device from its widgets'
    values ("off" is the device; a dtype is one of int8, int4, fp16, bf16, fp32)."""
    found = RunRecord()
    if not isinstance(workflow, dict) or not isinstance(workflow.get("nodes"), list):
        return found
    for node in workflow["nodes"][:max_nodes]:
        if not isinstance(node, dict) or node.get("mode") in _SKIPPED_MODES:
            continue
        kind = str(node.get("type", ""))[:200]
        values = node.get("widgets_values")
        values = values if isinstance(values, list) else []
        named: dict[str, Any] = {}
        for value in values:
            if not isinstance(value, str):
                continue
            folded = value.strip().lower()
            if folded in ("int8", "int4", "fp16", "bf16", "fp32"):
                named.setdefault("cache_dtype", value)
            elif folded in ("off", "cpu", "cuda", "gpu", "auto"):
                named.setdefault("device", value)
        _take(found, kind, named, values)
    return found


def _take(found: RunRecord, kind: str, inputs: dict[str, Any], values: Iterable[Any]) -> None:
    folded = kind.lower().replace("_", "").replace(" ", "")
    if PREFIX_CACHE_NODE in folded and found.prefix_cache is None:
        found.prefix_cache = _prefix_cache(kind, inputs)
    if _INPAINT_SAMPLER in folded:
        found.inpaint_samplers.append(kind[:200])
    if "loader" in folded:
        found.low_bit_files.extend(_loader_files(kind, values))


def from_names(names: Iterable[str | None]) -> RunRecord:
    """The low-bit files among the model names an infotext records (Forge Neo's `Model`)."""
    return RunRecord(low_bit_files=list(_loader_files("Model", (n for n in names if n))))


def read_log(path: str | Path) -> ToolLog:
    """The version and unexpected-key warnings of a tool's log file (its first MAX_LOG_BYTES,
    read as UTF-8 with bad bytes replaced). Raises BadFileError for a file that cannot be read."""
    path = Path(path).expanduser()
    try:
        with open_regular(path) as handle:  # a FIFO or a device is refused, never waited on
            text = handle.read(MAX_LOG_BYTES).decode("utf-8", errors="replace")
    except OSError as error:
        raise BadFileError(path, f"the log cannot be read ({error.strerror or error}).") from None
    if "\0" in text[:4096]:
        raise BadFileError(path, "not a text log (it holds binary data).")
    log = ToolLog(str(path))
    versions = _LOG_VERSION.findall(text)
    if versions:
        log.version = versions[-1]  # the last start in the log: the run that made the image
    for match in _LOG_UNEXPECTED.finditer(text):
        keys = [a or b for a, b in _QUOTED.findall(match.group(2)[:100_000])]
        if keys:
            log.unexpected.append(UnexpectedKeys(match.group(1).lower(), len(keys), keys[0]))
        if len(log.unexpected) >= 20:
            break
    return log


def version_tuple(version: str | None) -> tuple[int, ...] | None:
    if not version:
        return None
    numbers = [index_in_name(p) for p in version.strip().lstrip("v").split(".")[:3]]
    if len(numbers) < 2 or any(n is None for n in numbers):
        return None
    return tuple(n for n in numbers if n is not None)


# --- the suspects and their switches ---------------------------------------------------------

# Each suspect's kind, the cause it is (`words.causes.CAUSE_WORDS`), and the looks it draws
# first (the order in which a look's suspects are named).
KINDS = {
    "low_bit_file": "kernel",
    "inpaint_low_bit": "kernel",
    "prefix_cache": "cache",
    "model_compiler": "kernel",
    "dynamic_vram": "state",
    "unexpected_keys": "weights",
}
_ORDER = {
    "tiled_noise": (
        "inpaint_low_bit",
        "low_bit_file",
        "prefix_cache",
        "unexpected_keys",
        "model_compiler",
        "dynamic_vram",
    ),
    "rgb_static": (
        "dynamic_vram",
        "model_compiler",
        "low_bit_file",
        "inpaint_low_bit",
        "prefix_cache",
        "unexpected_keys",
    ),
    "noise": (
        "unexpected_keys",
        "inpaint_low_bit",
        "low_bit_file",
        "prefix_cache",
        "model_compiler",
        "dynamic_vram",
    ),
}
_ORDER["false_colour"] = _ORDER["rgb_static"]
LOOKS = ("tiled_noise", "rgb_static", "false_colour")
# The looks DynamicVRAM is known to draw (ComfyUI issue 16337).
_PAGED_LOOKS = ("rgb_static", "false_colour")

# What each suspect is, one sentence each; {placeholders} from Suspect.values.
SUSPECT_WORDS = {
    "low_bit_file": (
        "The record loads {file} ({form}{convrot}), whose matrix products run in kernels for "
        "that stored form; on older cards such kernels refuse some shapes or give tiled or "
        "blocky noise (comfy-kitchen issue 55: INT8 files on a T4; ComfyUI issue 16431: INT8 "
        "GEMM refused for some sizes on a GTX 1650), while HalfSafe computes on the decoded "
        "weights with ordinary kernels."
    ),
    "inpaint_low_bit": (
        "The record runs {sampler} on {file}, an int8 ConvRot file: that pairing gives noise "
        "and colour blocks (LanPaint issue 99)."
    ),
    "prefix_cache": (
        "The record runs {node} with its cache in {dtype}: Qwen-Image 2.1's prefix cache keeps "
        "the prompt's keys and values rounded to {dtype} (int4 roughly doubles the per-step "
        "error)."
    ),
    "model_compiler": (
        "{version_words} captures a CUDA graph per DynamicVRAM block once warm and replays it "
        "(its model compiler), so a block that ran wrong once runs wrong in every replay."
    ),
    "dynamic_vram": (
        "{version_words} pages weights through DynamicVRAM and writes them back to the host; "
        "it has drawn pure RGB static and a false-colour, normal-map-like picture (ComfyUI "
        "issue 16337, on an RX 9070 XT)."
    ),
    "unexpected_keys": (
        "The log shows the loader did not use {count} of the file's {part} weights (the first: "
        "{first}): the file is another variant than the one the loader builds, which draws "
        "noise whatever the precision."
    ),
}
_VERSION_WORDS = {
    "known": "ComfyUI {version}, the version the record names,",
    "unknown": "ComfyUI, if it is {since} or later (the record does not name its version),",
}
# Each suspect's switch, in the tool's terms; "*" for any tool. {placeholders} as above.
SWITCH_WORDS = {
    ("*", "low_bit_file"): (
        "load another stored form of the same model (its bf16, fp8 or GGUF file) in place of "
        "{file} and make the image again"
    ),
    ("*", "inpaint_low_bit"): (
        "run the inpaint on another stored form of the model (bf16, fp8 or GGUF) in place of "
        "{file}, or with ComfyUI's own KSampler in place of {sampler}"
    ),
    ("*", "prefix_cache"): (
        "set {node}'s device to off (the only way to rule the cache out), or its cache dtype "
        "to fp16"
    ),
    ("comfyui", "model_compiler"): (
        "start ComfyUI with --disable-comfy-compiler (or --disable-cuda-graphs, which keeps "
        "the compiler and replays no CUDA graph)"
    ),
    ("swarmui", "model_compiler"): (
        "add --disable-comfy-compiler (or --disable-cuda-graphs) to ExtraArgs in Server > Backends"
    ),
    ("comfyui", "dynamic_vram"): (
        "start ComfyUI with --disable-dynamic-vram (ComfyUI says this flag will be removed soon)"
    ),
    ("swarmui", "dynamic_vram"): "add --disable-dynamic-vram to ExtraArgs in Server > Backends",
    ("*", "unexpected_keys"): (
        "load the file with the loader (or the model config) made for its variant, or use "
        "another stored form of the model that the loader knows"
    ),
}
# The sentences around them.
LOOK_CAUSE_WORDS = {
    "intro": "What the record shows that draws such pictures, in the order to rule it out:",
    "item": "{words} To rule it out, {switch}.",
    "none": (
        "The record shows none of the fast paths that draw such pictures (a low-bit file, "
        "LanPaint with int8 ConvRot, Qwen-Image 2.1's int8 or int4 prefix cache, ComfyUI's "
        "model compiler or DynamicVRAM); the tool's own log (explain --log) may name a loader "
        "that did not use some of the file's weights."
    ),
    "cache_off": "The record runs {node} with device=off: its prefix cache is ruled out.",
}


@dataclass(frozen=True)
class Suspect:
    """One fast path the record (or log) shows, named as a look's possible cause: `kind` (a
    SUSPECT_WORDS key), `cause` (its kind in `causes.CAUSES`), the sentence and the switch."""

    kind: str
    cause: str
    words: str
    switch: str

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "cause": self.cause, "words": self.words, "switch": self.switch}


def _switch(tool: str, kind: str, values: dict[str, str]) -> str:
    template = SWITCH_WORDS.get((tool, kind)) or SWITCH_WORDS.get(("*", kind))
    if template is None:  # a tool with no switch HalfSafe knows: ComfyUI's words serve
        template = SWITCH_WORDS[("comfyui", kind)]
    return template.format(**values)


def _suspect(tool: str, kind: str, values: dict[str, str]) -> Suspect:
    return Suspect(
        kind, KINDS[kind], SUSPECT_WORDS[kind].format(**values), _switch(tool, kind, values)
    )


def _version_words(version: str | None, since: tuple[int, int]) -> str | None:
    """How the words name ComfyUI's version, or None where it is older than `since`."""
    found = version_tuple(version)
    if found is None:
        return _VERSION_WORDS["unknown"].format(since=".".join(map(str, since)))
    if found[:2] < since:
        return None
    return _VERSION_WORDS["known"].format(version=version)


def suspects(
    look: str, tool: str, run: RunRecord, version: str | None, log: ToolLog | None
) -> list[Suspect]:
    """The fast paths the record and the log show that draw `look` (a LOOKS status, or
    "noise"), in the order to rule them out, each with `tool`'s switch."""
    found: dict[str, Suspect] = {}
    convrot = [f for f in run.low_bit_files if f.convrot and f.form == "int8"]
    if run.inpaint_samplers and convrot:
        values = {"sampler": run.inpaint_samplers[0], "file": convrot[0].file}
        found["inpaint_low_bit"] = _suspect(tool, "inpaint_low_bit", values)
    if run.low_bit_files:
        first = run.low_bit_files[0]
        values = {
            "file": first.file,
            "form": first.form,
            "convrot": ", ConvRot" if first.convrot else "",
        }
        found["low_bit_file"] = _suspect(tool, "low_bit_file", values)
    cache = run.prefix_cache
    if cache is not None and cache.low_bit:
        values = {"node": cache.node, "dtype": (cache.dtype or "").strip().lower()}
        found["prefix_cache"] = _suspect(tool, "prefix_cache", values)
    for keys in log.unexpected[:1] if log is not None else []:
        values = {"count": str(keys.count), "part": keys.part, "first": keys.first or "?"}
        found["unexpected_keys"] = _suspect(tool, "unexpected_keys", values)
    if tool in ("comfyui", "swarmui"):
        words = _version_words(version, COMPILER_SINCE)
        if words is not None and look != "noise":
            found["model_compiler"] = _suspect(tool, "model_compiler", {"version_words": words})
        words = _version_words(version, DYNAMIC_VRAM_SINCE)
        if words is not None and look in _PAGED_LOOKS:
            found["dynamic_vram"] = _suspect(tool, "dynamic_vram", {"version_words": words})
    return [found[kind] for kind in _ORDER[look] if kind in found]


def words(look: str, named: list[Suspect], run: RunRecord) -> str:
    """The suspects in words, in order; or that the record shows none."""
    sentences = []
    if named:
        sentences.append(LOOK_CAUSE_WORDS["intro"])
        for suspect in named:
            sentences.append(
                LOOK_CAUSE_WORDS["item"].format(words=suspect.words, switch=suspect.switch)
            )
    elif look in LOOKS:
        sentences.append(LOOK_CAUSE_WORDS["none"])
    cache = run.prefix_cache
    if cache is not None and cache.off:
        sentences.append(LOOK_CAUSE_WORDS["cache_off"].format(node=cache.node))
    return " ".join(sentences)
