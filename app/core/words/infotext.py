"""The `parameters` text a generated PNG carries (AUTOMATIC1111's "infotext"): one table of the
keys HalfSafe writes and reads, a writer for generation, and a parser for every reader.

The text is the prompt, a "Negative prompt:" line when there is one, then one line of
`Key: value` pairs joined by ", ". Each key is listed once in `KEYS`: its name as written,
what it means, which tool defined it, how its value is written and read back, and the
precision setting it records, if any. Readers keep the keys they use but take them from here,
and read values through `Key.read`, which is bounded: the text comes from a file someone
handed over. Plain Python: no Qt, no torch.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from app.core import samplers
from app.core.components import COMPONENT_SETTINGS

# --- the text: prompt, negative prompt, one line of pairs -------------------------------------

# A key of word characters, spaces, hyphens and slashes; a value that is a JSON string in double
# quotes or anything up to the next comma. The same rule A1111's PNG-info reader applies, with
# one difference: a key only starts the line or follows a comma (as every writer puts them).
# Without that anchor the search restarts inside every run of word characters, which takes
# quadratic time: 13 s for a 32 kB line of one word, read from a file someone handed over.
_PARAM = re.compile(r'(?:^|(?<=,))\s*(\w[\w \-/]+):\s*("(?:\\.|[^\\"])+"|[^,]*)(?:,|$)')
_NEGATIVE = "Negative prompt:"


def quote(value: Any) -> str:
    """A value as A1111 writes it: as is, or as a JSON string when it holds , : or a newline."""
    text = str(value)
    if "," not in text and ":" not in text and "\n" not in text:
        return text
    return json.dumps(text, ensure_ascii=False)


def unquote(text: str) -> str:
    if len(text) >= 2 and text[0] == '"' and text[-1] == '"':
        try:
            return str(json.loads(text))
        except ValueError:
            return text
    return text


def join_text(prompt: str, negative_prompt: str, params: Iterable[tuple[str, Any]]) -> str:
    """The `parameters` text: the prompt, a "Negative prompt:" line when there is one, then one
    line of `Key: value` pairs joined by ", " (pairs whose value is None are left out)."""
    line = ", ".join(f"{key}: {quote(value)}" for key, value in params if value is not None)
    negative = f"\n{_NEGATIVE} {negative_prompt}" if negative_prompt else ""
    return f"{prompt}{negative}\n{line}".strip()


def split_text(text: str) -> tuple[str, str, dict[str, str]]:
    """Read a `parameters` text back: (prompt, negative prompt, {key: value}).

    The last line holds the pairs when at least three parse from it (as A1111 decides); the
    lines before it are the prompt, up to a line starting "Negative prompt:".
    """
    lines = text.strip().split("\n")
    last = lines[-1] if lines else ""
    pairs = _PARAM.findall(last)
    if len(pairs) >= 3:
        lines = lines[:-1]
    else:
        pairs = []
    prompt: list[str] = []
    negative: list[str] = []
    in_negative = False
    for line in lines:
        if line.startswith(_NEGATIVE):
            in_negative = True
            line = line[len(_NEGATIVE) :].strip()
        (negative if in_negative else prompt).append(line)
    params = {key.strip(): unquote(value.strip()) for key, value in pairs}
    return "\n".join(prompt).strip(), "\n".join(negative).strip(), params


# --- values, read from a file someone handed over ---------------------------------------------


def read_text(value: Any, limit: int = 4096) -> str | None:
    """A text value cut to `limit` characters; None for a blank or a value that is no text."""
    return value[:limit] if isinstance(value, str) and value.strip() else None


def read_int(value: Any) -> int | None:
    """A whole number (an int, an integral float, or up to 20 digits of text); else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if abs(value) < 2**64 else None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"\s*-?\d{1,20}\s*", value):
        return int(value)
    return None


def read_float(value: Any) -> float | None:
    """A finite number below 1e12 in size (a number, or text of one); else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) if abs(value) < 1e12 else None
    if isinstance(value, str):
        try:
            number = float(value[:32])
        except ValueError:
            return None
        return number if abs(number) < 1e12 else None
    return None


def read_size(text: str | None) -> tuple[int, int] | None:
    """'512x768' -> (512, 768); None when the text is not a size of up to six digits a side."""
    match = re.fullmatch(r"\s*(\d{1,6})\s*x\s*(\d{1,6})\s*", text or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


# --- the keys -----------------------------------------------------------------------------------

# How a value is written and read back, by a key's `kind`:
#   text      written as is; read as text of at most `limit` characters, None when blank
#   word      written as is; read exactly as written (a status or a component name)
#   int       written as the number; read by `read_int`
#   float     written as the number (guidance comes formatted from the family); `read_float`
#   size      written from (width, height) as "WxH"; read as (width, height) by `read_size`
#   setting   a precision setting: written as is (booleans as True/False); read the same way
#   modules   module-level settings ["vae:decoder.a", ...]: written space-separated, left out
#             when empty; read back as the list
#   list      written joined by "; ", left out when empty; read back as the list
KINDS = ("text", "word", "int", "float", "size", "setting", "modules", "list")


@dataclass(frozen=True)
class Key:
    """One key of the `parameters` text."""

    name: str  # as written in the text ("CFG scale")
    meaning: str
    kind: str = "text"  # one of KINDS
    origin: str = "AUTOMATIC1111"  # the tool whose key it is: HalfSafe writes others' keys too
    setting: str | None = None  # the precision setting it records (kind "setting"/"modules")
    limit: int = 4096  # a text value's length, as read

    def write(self, value: Any) -> Any:
        """The value as it goes into the text (quoted by `join_text`); None leaves it out."""
        if value is None:
            return None
        if self.kind == "size":
            width, height = value
            return f"{width}x{height}"
        if self.kind == "modules":
            return " ".join(value) if value else None
        if self.kind == "list":
            return "; ".join(value) or None
        return value

    def read(self, raw: str | None) -> Any:
        """The value back from its text (None when missing or unreadable)."""
        if raw is None:
            return None
        if self.kind == "text":
            return read_text(raw, self.limit)
        if self.kind == "int":
            return read_int(raw)
        if self.kind == "float":
            return read_float(raw)
        if self.kind == "size":
            return read_size(raw)
        if self.kind == "setting":
            return raw == "True" if raw in ("True", "False") else raw
        if self.kind == "modules":
            return raw.split()
        if self.kind == "list":
            return [part.strip() for part in raw.split(";")] if raw else []
        return raw


def _halfsafe(name: str, meaning: str, kind: str = "text", setting: str | None = None) -> Key:
    return Key(name, meaning, kind, origin="HalfSafe", setting=setting)


# Written by HalfSafe, in this order (AUTOMATIC1111's own keys first, as A1111 orders them).
STEPS = Key("Steps", "denoising steps", "int")
SAMPLER = Key("Sampler", "the sampler, in the tool's words (`samplers` for HalfSafe's)")
CFG_SCALE = Key("CFG scale", "classifier-free guidance scale (1 for a distilled model)", "float")
DISTILLED_CFG_SCALE = Key(
    "Distilled CFG Scale", "the guidance embedding's scale (Flux dev)", "float", origin="Forge"
)
SEED = Key("Seed", "the seed of this image (a batch counts up from the first)", "int")
SIZE = Key("Size", "width x height in pixels", "size")
MODEL_HASH = Key("Model hash", "A1111's short hash of the model file (10 hex digits)")
MODEL = Key("Model", "the model's name: a file stem, or what the tool calls it")
LORA_HASHES = Key("Lora hashes", "each LoRA's name and short hash: 'name: hash, ...'")
VAE_HASH = Key("VAE hash", "short hash of a separate VAE file (10 hex digits)")
VAE = Key("VAE", "a separate VAE's file name (none when the model's own)")
RNG = Key("RNG", "where the starting noise was made (CPU, GPU or NV)", "word")
DENOISING_STRENGTH = Key(
    "Denoising strength",
    "image-to-image and inpainting: how much of the picture was redrawn",
    "float",
)
CLIP_SKIP = Key(
    "Clip skip", "the prompt read this many CLIP layers from the end (written when past 1)", "int"
)
HIRES_UPSCALE = Key("Hires upscale", "hires fix: the second pass's size over the first's", "float")
HIRES_RESIZE = Key("Hires resize", "hires fix: the second pass's size, where set instead", "size")
HIRES_STEPS = Key("Hires steps", "hires fix: the second pass's steps (0: the first's)", "int")
HIRES_UPSCALER = Key("Hires upscaler", "hires fix: how the first picture was enlarged")
# Named as the step-cache extensions name theirs, so that explain reads it as one.
STEP_CACHE = _halfsafe(
    "First block cache", "the step cache's threshold (written when on): steps were skipped", "float"
)
# Read by explain as a cache that ran (`explain.runtime`: its name says "prompt cache").
PROMPT_CACHE = _halfsafe(
    "Prompt cache",
    "the prompt's keys and values were kept from the first step and reused (written 'on' when on)",
    "word",
)
MASK = _halfsafe("Mask", "inpainting: the mask's file name (white was painted again)")
INPUT_PICTURE = _halfsafe(
    "Input picture",
    "image-to-image: the input picture's file name (editing: each reference's, comma-separated)",
)
MASK_BLUR = Key(
    "Mask blur", "inpainting: pixels the mask's edge was blurred to blend the result in", "int"
)
INPAINT_AREA = Key(
    "Inpaint area", "'Only masked': the mask's box alone was drawn, at the Size, and pasted back"
)
MASKED_AREA_PADDING = Key(
    "Masked area padding", "'Only masked': pixels added around the mask's box", "int"
)
CANVAS_EXTENDED = _halfsafe(
    "Canvas extended", "outpainting: pixels added to the picture's sides ('right 256, top 64')"
)
ARCHITECTURE = _halfsafe(
    "Architecture", "HalfSafe's name for the kind of model (sdxl, zimage-base, ...)", "word"
)
MODE = _halfsafe("Mode", "what the image was made from: img2img, inpaint, edit or control", "word")
PRECISION = _halfsafe("Precision", "base dtype", "setting", "precision")
# The per-component precision settings, from the components table (in its order).
COMPONENT_PRECISION: dict[str, Key] = {
    setting.key: _halfsafe(setting.png, setting.png_meaning, "setting", setting.key)
    for setting in COMPONENT_SETTINGS
}
UPCAST_ATTENTION = _halfsafe(
    "Upcast attention", "attention scores and softmax in fp32", "setting", "upcast_attention"
)
ATTENTION_BACKEND = _halfsafe(
    "Attention backend", "the attention kernel", "setting", "attention_backend"
)
TF32 = _halfsafe("TF32", "TF32 for fp32 matmul and convolution", "setting", "allow_tf32")
FP16_REDUCED_PRECISION_REDUCTION = _halfsafe(
    "FP16 reduced precision reduction",
    "split-K reduced-precision reduction in fp16 GEMMs",
    "setting",
    "fp16_reduced_precision_reduction",
)
FP16_ACCUMULATION = _halfsafe(
    "FP16 accumulation", "full fp16 accumulation in matmuls", "setting", "fp16_accumulation"
)
ATTENTION_REDUCED_PRECISION = _halfsafe(
    "Attention reduced precision",
    "reduced-precision reduction inside the math attention kernel",
    "setting",
    "attention_reduced_precision",
)
FP32_LAYERS = _halfsafe("FP32 layers", "layers kept in fp32", "modules", "fp32_modules")
BF16_LAYERS = _halfsafe("BF16 layers", "layers run in bf16", "modules", "bf16_modules")
CLAMPED_LAYERS = _halfsafe(
    "Clamped layers", "layers whose output is clamped to fp16's range", "modules", "clamp_modules"
)
VAE_TILING = _halfsafe(
    "VAE tiling", "whether the VAE decoded the picture in tiles (on, off)", "setting", "vae_tiling"
)
NAN_CHECK = _halfsafe("NaN check", "whether the NaN watch was on", "setting", "nan_check")
AUTO_FIX = _halfsafe("Auto fix", "what to do when an output goes non-finite", "setting", "auto_fix")
DEVICE = _halfsafe("Device", "the device it ran on", "setting", "device")
DEVICE_NAME = _halfsafe("Device name", "that device's name (a GPU's, or the CPU's)")
MEMORY_BUDGET = _halfsafe(
    "Memory budget",
    "the memory budget its parts were held under (the setting, or the device's free memory)",
)
STREAMED = _halfsafe("Streamed", "the parts that streamed block by block under it", "list")
COMPUTED_IN_PLACE = _halfsafe(
    "Computed in place", "the parts kept as stored, computing wider layer by layer", "list"
)
NAN_WATCH = _halfsafe("NaN watch", "the image's status (ok, fixed, nan, black, ...)", "word")
NAN_COMPONENT = _halfsafe("NaN component", "the component that first went non-finite", "word")
NAN_STEP = _halfsafe("NaN step", "the denoising step (from 1) that first went non-finite", "int")
FIXES_APPLIED = _halfsafe("Fixes applied", "the repairs made to this image", "list")
FIX_FOR_JOB = _halfsafe(
    "Fix for this job",
    "a fix its job ran with over the settings, for that job only: each setting it set, and "
    "the user's own value it replaced ('VAE precision bf16 (over fp16)')",
    "list",
)
NON_FINITE_PIXELS = _halfsafe("Non-finite pixels", "the share of pixels that came out NaN")
NON_FINITE_REGION = _halfsafe("Non-finite region", "where they are: 'x 0-63, y 0-63'")
HALFSAFE = Key(
    "HalfSafe", "HalfSafe's version: the image is HalfSafe's", origin="HalfSafe", limit=100
)

# Read only: other tools write them, and they say which tool it was or what it ran.
SCHEDULE_TYPE = Key("Schedule type", "A1111 1.9+: the noise schedule (Karras, ...)")
VERSION = Key("Version", "the tool's version (Forge's starts with f and a digit)", limit=100)
APP = Key("App", "the tool's name (SD.Next writes it)", origin="SD.Next")
PIPELINE = Key("Pipeline", "the diffusers pipeline (SD.Next writes it)", origin="SD.Next")
OPERATIONS = Key("Operations", "what the job did (SD.Next writes it)", origin="SD.Next")

KEYS: tuple[Key, ...] = (
    STEPS,
    SAMPLER,
    SCHEDULE_TYPE,
    CFG_SCALE,
    DISTILLED_CFG_SCALE,
    SEED,
    SIZE,
    MODEL_HASH,
    MODEL,
    LORA_HASHES,
    VAE_HASH,
    VAE,
    RNG,
    DENOISING_STRENGTH,
    CLIP_SKIP,
    HIRES_UPSCALE,
    HIRES_RESIZE,
    HIRES_STEPS,
    HIRES_UPSCALER,
    STEP_CACHE,
    PROMPT_CACHE,
    MASK_BLUR,
    INPAINT_AREA,
    MASKED_AREA_PADDING,
    MODE,
    INPUT_PICTURE,
    MASK,
    CANVAS_EXTENDED,
    ARCHITECTURE,
    PRECISION,
    *COMPONENT_PRECISION.values(),
    UPCAST_ATTENTION,
    ATTENTION_BACKEND,
    TF32,
    FP16_REDUCED_PRECISION_REDUCTION,
    FP16_ACCUMULATION,
    ATTENTION_REDUCED_PRECISION,
    FP32_LAYERS,
    BF16_LAYERS,
    CLAMPED_LAYERS,
    VAE_TILING,
    NAN_CHECK,
    AUTO_FIX,
    DEVICE,
    DEVICE_NAME,
    MEMORY_BUDGET,
    STREAMED,
    COMPUTED_IN_PLACE,
    NAN_WATCH,
    NAN_COMPONENT,
    NAN_STEP,
    FIXES_APPLIED,
    FIX_FOR_JOB,
    NON_FINITE_PIXELS,
    NON_FINITE_REGION,
    HALFSAFE,
    VERSION,
    APP,
    PIPELINE,
    OPERATIONS,
)
BY_NAME: dict[str, Key] = {key.name: key for key in KEYS}
# The effective settings an image records, in the order they are written.
SETTING_KEYS: tuple[Key, ...] = tuple(key for key in KEYS if key.setting)


def setting_values(settings: Mapping[str, Any]) -> list[tuple[Key, Any]]:
    """(Key, value) of every setting key, from effective settings (missing ones are None)."""
    return [(key, settings.get(key.setting)) for key in SETTING_KEYS if key.setting]


def keyed(pairs: Iterable[tuple[str, Any]]) -> list[tuple[Key, Any]]:
    """(name, value) pairs (a family's guidance) as (Key, value); a name the table does not
    hold raises KeyError: every key written must be one the readers know."""
    values = []
    for name, value in pairs:
        if name not in BY_NAME:
            raise KeyError(f"{name!r} is not a key of the parameters text (infotext.KEYS)")
        values.append((BY_NAME[name], value))
    return values


# --- writing and reading ------------------------------------------------------------------------


def write(prompt: str, negative_prompt: str, values: Iterable[tuple[Key, Any]]) -> str:
    """The `parameters` text of an image: each value written as its key says, in the order
    given; a value of None (or an empty list) leaves its key out."""
    return join_text(prompt, negative_prompt, ((key.name, key.write(v)) for key, v in values))


@dataclass
class Infotext:
    """A `parameters` text, read: the prompts and every pair as written (keys the table does
    not hold included), with each key's value read back through the table."""

    prompt: str
    negative_prompt: str
    pairs: dict[str, str]

    def __contains__(self, key: Key) -> bool:
        return key.name in self.pairs

    def raw(self, key: Key) -> str | None:
        """The value exactly as written, or None when the key is missing."""
        return self.pairs.get(key.name)

    def get(self, key: Key, default: Any = None) -> Any:
        """The value read back as the key's kind says; `default` when the key is missing or
        its value cannot be read."""
        value = key.read(self.pairs.get(key.name))
        return default if value is None else value

    def settings(self, keys: Iterable[Key]) -> dict[str, Any]:
        """{setting: value} of the setting keys among `keys` that the text holds."""
        return {
            key.setting: key.read(self.pairs[key.name])
            for key in keys
            if key.setting and key in self
        }

    def scheduler(self) -> str | None:
        """HalfSafe's scheduler for the sampler (and A1111's schedule type), or None."""
        return samplers.key_for(self.raw(SAMPLER), self.raw(SCHEDULE_TYPE))


def parse(text: str) -> Infotext:
    """Read a `parameters` text (HalfSafe's or another tool's)."""
    prompt, negative_prompt, pairs = split_text(text)
    return Infotext(prompt, negative_prompt, pairs)
