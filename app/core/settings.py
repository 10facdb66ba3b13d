"""The one settings schema: every option declared once, with its persistence.

The settings panel, the CLI's precision flags and the settings file are all generated from
`SCHEMA`. Loading is forgiving field by field: a damaged file costs the user the damaged fields,
never the rest, and the damaged file is kept aside. Saving is atomic, keeps a `.bak`, and holds
a lock file so that two processes saving at once never lose each other's changes.

This module must stay cheap to import (no torch).
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import reprlib
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from app.core import paths
from app.core.components import COMPONENTS
from app.core.files import (
    aside_name,
    clear_non_regular,
    is_regular_file,
    locked,
    read_regular_file,
    write_atomic,
)

SCHEMA_VERSION = 1
SETTINGS_FILE = "settings.json"

DTYPE_CHOICES = ("auto", "fp16", "bf16", "fp32")
# The base precision also takes `autocast`: fp16 weights under torch.autocast, AUTOMATIC1111's
# default; a per-component setting is a plain dtype.
PRECISION_CHOICES = (*DTYPE_CHOICES, "autocast")
ATTENTION_BACKENDS = ("auto", "flash", "efficient", "cudnn", "math", "classic")
AUTO_FIX_CHOICES = ("off", "ask", "auto")
SCHEDULERS = ("euler", "euler_a", "dpmpp_2m_karras", "ddim")
DEVICE_PATTERN = re.compile(r"^(auto|cpu|cuda|cuda:\d+|mps|xpu|xpu:\d+)$")

GROUPS = ("Device", "Precision", "Attention", "Accumulation", "NaN safety", "Generation", "Folders")


# Any integer longer than this in the settings file is out of every field's range.
MAX_NUMBER_DIGITS = 40
_SHOWN = reprlib.Repr()
_SHOWN.maxstring = _SHOWN.maxother = 40
_SHOWN.maxlevel = 2


def shown(value: Any) -> str:
    """A value as a warning quotes it: short, whatever its size or depth (a damaged file can
    hold a 5,000-digit number or a list nested a thousand deep)."""
    if isinstance(value, _LongNumber):
        return f"a number of {value.digits} digits"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**15:
        return f"a number of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    return _SHOWN.repr(value)


def parse_number(text: str, kind: str) -> int | float:
    """A number the user typed (a CLI flag), ready for `Field.validate` of an "int" or "float"
    field. Never fails on length: an integer of thousands of digits comes back as an infinite
    number that names its length, which every bound refuses in a short sentence."""
    text = text.strip()
    if re.fullmatch(r"[+-]?\d+", text):
        return _parse_int(text.lstrip("+"))
    if kind == "int":
        raise ValueError(f"expected a whole number, got {shown(text)}")
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"expected a number, got {shown(text)}") from None


def _bound(limit: float) -> str:
    """A minimum or maximum as the user reads it: 4294967295, not 4.29497e+09."""
    return str(int(limit)) if float(limit).is_integer() else f"{limit:g}"


# Module-level precision settings (`fp32_modules`, `bf16_modules`, `clamp_modules`): entries
# "COMPONENT:PATH", a PyTorch module path inside one component. Bounded so that a damaged file
# or a pasted flag cannot grow without limit; whether a path exists is checked against the model
# when it loads (`diagnosis.check_module_settings`).
MAX_MODULE_ENTRIES = 256
MAX_MODULE_PATH = 200
MODULE_PATH = re.compile(r"^[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*$")


def parse_module_entries(text: str) -> list[str]:
    """'vae:decoder.a,decoder.b' (a flag's value) -> ['vae:decoder.a', 'vae:decoder.b']."""
    component, sep, paths_ = text.partition(":")
    if not sep:
        raise ValueError(f"expected COMPONENT:PATH[,PATH...], got {shown(text)}")
    return [f"{component.strip()}:{p.strip()}" for p in paths_.split(",")]


def _check_module_entries(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(e, str) for e in value):
        raise ValueError(f"expected a list of COMPONENT:PATH entries, got {shown(value)}")
    if len(value) > MAX_MODULE_ENTRIES:
        raise ValueError(f"{len(value)} modules is more than the {MAX_MODULE_ENTRIES} allowed")
    for entry in value:
        component, sep, path = entry.partition(":")
        if not sep or len(entry) > MAX_MODULE_PATH or not MODULE_PATH.match(path):
            raise ValueError(
                f"expected COMPONENT:PATH with a dotted module path of at most "
                f"{MAX_MODULE_PATH} characters, got {shown(entry)}"
            )
        if component not in COMPONENTS:
            raise ValueError(
                f"{shown(component)} is not a component (one of {', '.join(COMPONENTS)})"
            )
    return list(dict.fromkeys(value))


def modules_by_component(entries: list[str]) -> dict[str, list[str]]:
    """['vae:a', 'vae:b', 'unet:c'] -> {'vae': ['a', 'b'], 'unet': ['c']} (validated entries)."""
    grouped: dict[str, list[str]] = {}
    for entry in entries:
        component, _, path = entry.partition(":")
        grouped.setdefault(component, []).append(path)
    return grouped


def _check_path(text: str) -> None:
    """Refuse what no file system accepts in a path (a NUL byte), so it is caught here, with
    the setting named, and not after an image has been generated."""
    if "\0" in text:
        raise ValueError("a folder name cannot contain a NUL character")


@dataclass(frozen=True)
class Field:
    """One option: its type, default, allowed values, and the words the user sees.

    `kind` is one of "bool", "choice", "int", "float", "text", "device", "paths", "path",
    "modules" (COMPONENT:PATH entries, `parse_module_entries`).
    `cli` marks options that every model-loading command takes as a flag (named `flag_name`).
    """

    key: str
    kind: str
    default: Any
    label: str
    help: str
    group: str
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    step: int | None = None
    cli: bool = False
    flag: str = ""

    def bounds(self) -> tuple[float, float]:
        """(minimum, maximum) of a numeric field that declares both."""
        if self.minimum is None or self.maximum is None:
            raise ValueError(f"{self.key} declares no bounds")
        return self.minimum, self.maximum

    @property
    def flag_name(self) -> str:
        """The CLI flag, without dashes: the key with '-' for '_' unless `flag` says otherwise."""
        return self.flag or self.key.replace("_", "-")

    def validate(self, value: Any) -> Any:
        """Return `value` normalised to this field's type, or raise ValueError saying why."""
        if self.kind == "bool":
            if isinstance(value, bool):
                return value
            raise ValueError(f"expected true or false, got {shown(value)}")
        if self.kind in ("choice", "device"):
            if not isinstance(value, str):
                raise ValueError(f"expected text, got {shown(value)}")
            if self.kind == "choice" and value not in self.choices:
                raise ValueError(f"expected one of {', '.join(self.choices)}, got {shown(value)}")
            if self.kind == "device" and not DEVICE_PATTERN.match(value):
                raise ValueError(
                    f"expected auto, cpu, cuda, cuda:N, mps or xpu, got {shown(value)}"
                )
            return value
        if self.kind in ("int", "float"):
            return self._number(value)
        if self.kind in ("text", "path"):
            if not isinstance(value, str):
                raise ValueError(f"expected text, got {shown(value)}")
            if self.kind == "path":
                _check_path(value)
            return value
        if self.kind == "paths":
            if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
                raise ValueError(f"expected a list of folders, got {shown(value)}")
            for folder in value:
                _check_path(folder)
            return list(value)
        if self.kind == "modules":
            return _check_module_entries(value)
        raise AssertionError(f"unknown field kind {self.kind}")

    def _number(self, value: Any) -> int | float:
        """Check a number against the bounds before converting it, so that no value (inf, NaN,
        a number of thousands of digits) can overflow the checks themselves."""
        # bool is an int in Python; a JSON `true` for a step count is damage, not 1.
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"expected a number, got {shown(value)}")
        # A number too long to hold (an infinite _LongNumber) fails the bounds below, by name.
        if (
            isinstance(value, float)
            and not isinstance(value, _LongNumber)
            and not math.isfinite(value)
        ):
            raise ValueError(f"expected a finite number, got {shown(value)}")
        # Python compares ints and floats exactly, whatever their size.
        if self.minimum is not None and value < self.minimum:
            raise ValueError(f"{shown(value)} is below the minimum {_bound(self.minimum)}")
        if self.maximum is not None and value > self.maximum:
            raise ValueError(f"{shown(value)} is above the maximum {_bound(self.maximum)}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{shown(value)} is out of range")
        if self.kind == "int":
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(f"expected a whole number, got {shown(value)}")
            value = int(value)
            if self.step and value % self.step:
                raise ValueError(f"{value} is not a multiple of {self.step}")
            return value
        return float(value)


_DTYPE_HELP = (
    "fp16 is fastest and halves memory but overflows past 65504; bf16 has fp32's range with "
    "less precision and needs a recent GPU; fp32 is always safe and costs about twice the "
    "time and memory. 'auto' picks from your GPU and the model's health check."
)

SCHEMA: tuple[Field, ...] = (
    Field(
        "device",
        "device",
        "auto",
        "Device",
        "Which device runs the model: auto picks the best GPU, else the CPU. "
        "Use cuda:N to pick one of several NVIDIA GPUs.",
        "Device",
        cli=False,
    ),
    Field(
        "precision",
        "choice",
        "auto",
        "Precision",
        "Base number format for every part of the model. "
        + _DTYPE_HELP
        + " 'autocast' is AUTOMATIC1111's default: fp16 weights under PyTorch's autocast, which "
        "runs softmax and normalisation in fp32 on NVIDIA and AMD GPUs (on a CPU it runs like "
        "fp16).",
        "Precision",
        choices=PRECISION_CHOICES,
        cli=True,
    ),
    Field(
        "unet_precision",
        "choice",
        "auto",
        "UNet precision",
        "Override for the denoising UNet, the largest and slowest part. 'auto' follows "
        "Precision. Running it in fp32 roughly doubles the time of every step.",
        "Precision",
        choices=DTYPE_CHOICES,
        cli=True,
    ),
    Field(
        "vae_precision",
        "choice",
        "auto",
        "VAE precision",
        "Override for the VAE that turns latents into pixels. SDXL's original VAE overflows "
        "in fp16; fp32 here costs little time (it runs once per image) and some memory.",
        "Precision",
        choices=DTYPE_CHOICES,
        cli=True,
    ),
    Field(
        "text_encoder_precision",
        "choice",
        "auto",
        "Text encoder precision",
        "Override for the text encoder (the first one on SDXL). Text encoders run once per "
        "prompt, so fp32 here is cheap in time but holds more memory.",
        "Precision",
        choices=DTYPE_CHOICES,
        cli=True,
    ),
    Field(
        "text_encoder_2_precision",
        "choice",
        "auto",
        "Second text encoder precision",
        "Override for SDXL's second, larger text encoder (OpenCLIP bigG). 'auto' follows the "
        "text encoder precision. A fix for one encoder leaves the other alone.",
        "Precision",
        choices=DTYPE_CHOICES,
        cli=True,
    ),
    Field(
        "text_encoder_3_precision",
        "choice",
        "auto",
        "Third text encoder precision",
        "Override for SD3's third text encoder (T5-XXL), the one known to overflow in fp16. "
        "'auto' follows the text encoder precision.",
        "Precision",
        choices=DTYPE_CHOICES,
        cli=True,
    ),
    Field(
        "t5_fp32_feed_forward",
        "bool",
        False,
        "T5 feed-forward output in fp32",
        "Keep the output projection of every T5 feed-forward layer (wo) in fp32 while the rest "
        "of the T5 text encoder (Flux, SD3) runs in half precision: the known fix for T5-XXL's "
        "fp16 overflow, which transformers applies when it loads T5 in fp16. Costs almost "
        "nothing.",
        "Precision",
        cli=True,
    ),
    Field(
        "fp32_modules",
        "modules",
        [],
        "Layers in fp32",
        "Named layers (COMPONENT:PATH, e.g. vae:decoder.up_blocks.0.resnets.0.conv1) that run "
        "in fp32 while the rest of their component runs in half precision: the health check's "
        "layer-level fix, which pays for precision only where the model overflows. Values "
        "leave these layers in fp32 until the next layer casts them back.",
        "Precision",
        cli=True,
    ),
    Field(
        "bf16_modules",
        "modules",
        [],
        "Layers in bf16",
        "Like 'Layers in fp32', in bf16 (fp32's range at half the memory) for GPUs with "
        "native bf16.",
        "Precision",
        cli=True,
    ),
    Field(
        "clamp_modules",
        "modules",
        [],
        "Clamp layer outputs",
        "Named layers whose fp16 output is clamped to +-65504 (what some pipelines do for Flux "
        "and SDXL). Finite, but a clamp that cuts real values changes the image: use it only "
        "when the health check verified it against fp32.",
        "Precision",
        cli=True,
    ),
    Field(
        "no_half",
        "bool",
        False,
        "No half precision (everything fp32)",
        "Run every part in fp32, like --no-half. Always safe; about 2x slower and 2x the "
        "memory. Prefer a targeted fix from the health check.",
        "Precision",
        cli=True,
    ),
    Field(
        "no_half_vae",
        "bool",
        False,
        "VAE in fp32 (no-half-VAE)",
        "Run only the VAE in fp32, like --no-half-vae. The usual cure for black SDXL images; "
        "costs a little memory and a fraction of a second per image.",
        "Precision",
        cli=True,
    ),
    Field(
        "upcast_attention",
        "bool",
        False,
        "Upcast attention to fp32",
        "Compute attention scores and softmax in fp32 with any attention backend. Fixes "
        "overflow in attention (SD2.x, Apple MPS) for a small slowdown of attention layers.",
        "Attention",
        cli=True,
    ),
    Field(
        "attention_backend",
        "choice",
        "auto",
        "Attention backend",
        "Which attention kernel runs: flash and efficient are fastest and lean on memory; "
        "cudnn is fast on recent NVIDIA GPUs; math is the plain reference; classic is "
        "diffusers' original processor, the slowest and most memory-hungry.",
        "Attention",
        choices=ATTENTION_BACKENDS,
        cli=True,
    ),
    Field(
        "attention_reduced_precision",
        "bool",
        False,
        "Reduced-precision math attention",
        "Let the math attention kernel reduce in fp16/bf16. Slightly faster, and can "
        "overflow where fp32 reduction would not. Off is safer.",
        "Attention",
        cli=True,
    ),
    Field(
        "allow_tf32",
        "bool",
        True,
        "TF32 for fp32 work",
        "Use TensorFloat-32 for fp32 matrix multiplies and convolutions on Ampere and newer "
        "NVIDIA GPUs: several times faster fp32, same range, fewer mantissa bits. Has no "
        "effect elsewhere.",
        "Accumulation",
        cli=True,
        flag="tf32",
    ),
    Field(
        "fp16_reduced_precision_reduction",
        "bool",
        True,
        "fp16 reduced-precision reduction",
        "Let fp16 matrix multiplies sum partial results (split-K) in fp16. PyTorch's default "
        "and a little faster; turning it off can cure an overflow where the true result fits.",
        "Accumulation",
        cli=True,
    ),
    Field(
        "fp16_accumulation",
        "bool",
        False,
        "Full fp16 accumulation",
        "Accumulate fp16 matrix multiplies entirely in fp16. Much faster on consumer GPUs, "
        "and the riskiest setting here: sums past 65504 become inf. Needs PyTorch 2.7+.",
        "Accumulation",
        cli=True,
    ),
    Field(
        "nan_check",
        "bool",
        True,
        "NaN watch",
        "Watch every denoising step for values that went non-finite, at no per-step cost, so a "
        "broken image is caught where it broke and repaired. Off (like --disable-nan-check): "
        "no watch and no repair; finished images are still labelled NaN or black.",
        "NaN safety",
    ),
    Field(
        "auto_fix",
        "choice",
        "auto",
        "When an image goes NaN",
        "off: keep the broken image and say why; ask: offer the fix; auto: repair only the "
        "part that failed (for a VAE, decode the same latents again) and remember the fix.",
        "NaN safety",
        choices=AUTO_FIX_CHOICES,
    ),
    Field(
        "steps",
        "int",
        25,
        "Steps",
        "Denoising steps per image: more is slower and finer.",
        "Generation",
        minimum=1,
        maximum=150,
    ),
    Field(
        "cfg",
        "float",
        7.0,
        "CFG scale",
        "How strongly the image follows the prompt. 5-9 suits most models.",
        "Generation",
        minimum=1.0,
        maximum=30.0,
    ),
    Field(
        "width",
        "int",
        512,
        "Width",
        "Image width in pixels (a multiple of 8).",
        "Generation",
        minimum=64,
        maximum=4096,
        step=8,
    ),
    Field(
        "height",
        "int",
        512,
        "Height",
        "Image height in pixels (a multiple of 8).",
        "Generation",
        minimum=64,
        maximum=4096,
        step=8,
    ),
    Field(
        "batch",
        "int",
        1,
        "Batch size",
        "Images generated together; each costs memory.",
        "Generation",
        minimum=1,
        maximum=16,
    ),
    Field(
        "seed",
        "int",
        -1,
        "Seed",
        "-1 picks a random seed for each run.",
        "Generation",
        minimum=-1,
        maximum=2**32 - 1,
    ),
    Field(
        "scheduler",
        "choice",
        "dpmpp_2m_karras",
        "Sampler",
        "The denoising schedule: DPM++ 2M Karras is a good default; Euler a is varied; "
        "DDIM is deterministic.",
        "Generation",
        choices=SCHEDULERS,
    ),
    Field(
        "negative_prompt",
        "text",
        "",
        "Negative prompt",
        "What the image should not contain, used when a job gives none.",
        "Generation",
    ),
    Field(
        "model_folders",
        "paths",
        [],
        "Model folders",
        "Extra folders to scan for checkpoints, besides the usual AUTOMATIC1111, ComfyUI and "
        "StabilityMatrix folders found on this computer.",
        "Folders",
    ),
    Field(
        "output_folder",
        "path",
        "",
        "Output folder",
        "Where images are saved. Empty means the HalfSafe folder in your Pictures.",
        "Folders",
    ),
)

FIELDS: dict[str, Field] = {f.key: f for f in SCHEMA}


def defaults() -> dict[str, Any]:
    """A fresh copy of every field's default."""
    return {f.key: list(f.default) if isinstance(f.default, list) else f.default for f in SCHEMA}


@dataclass(frozen=True)
class PrecisionSettings:
    """The precision settings of one job, as DESIGN.md's table lists them.

    Values are the user's choices; `auto` is resolved later, against the device and the model.
    """

    precision: str = FIELDS["precision"].default
    unet_precision: str = FIELDS["unet_precision"].default
    vae_precision: str = FIELDS["vae_precision"].default
    text_encoder_precision: str = FIELDS["text_encoder_precision"].default
    text_encoder_2_precision: str = FIELDS["text_encoder_2_precision"].default
    text_encoder_3_precision: str = FIELDS["text_encoder_3_precision"].default
    t5_fp32_feed_forward: bool = FIELDS["t5_fp32_feed_forward"].default
    fp32_modules: tuple[str, ...] = ()
    bf16_modules: tuple[str, ...] = ()
    clamp_modules: tuple[str, ...] = ()
    no_half: bool = FIELDS["no_half"].default
    no_half_vae: bool = FIELDS["no_half_vae"].default
    upcast_attention: bool = FIELDS["upcast_attention"].default
    attention_backend: str = FIELDS["attention_backend"].default
    allow_tf32: bool = FIELDS["allow_tf32"].default
    fp16_reduced_precision_reduction: bool = FIELDS["fp16_reduced_precision_reduction"].default
    fp16_accumulation: bool = FIELDS["fp16_accumulation"].default
    attention_reduced_precision: bool = FIELDS["attention_reduced_precision"].default
    nan_check: bool = FIELDS["nan_check"].default
    auto_fix: str = FIELDS["auto_fix"].default

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if FIELDS[f.name].kind == "modules":  # held as a tuple: the settings are frozen
                value = tuple(FIELDS[f.name].validate(list(value)))
                object.__setattr__(self, f.name, value)
            else:
                FIELDS[f.name].validate(value)

    def to_dict(self) -> dict[str, Any]:
        return {
            f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v
            for f in fields(self)
        }

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> PrecisionSettings:
        """Pick the precision keys out of a larger mapping (the settings, a CLI namespace)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})


PRECISION_KEYS: tuple[str, ...] = tuple(f.name for f in fields(PrecisionSettings))


@dataclass
class Settings:
    """The user's settings: a validated value for every schema field.

    Not thread-safe; the GUI owns one instance and hands copies (`precision()`, `to_dict()`) to
    jobs, so a change applies to the next job without a restart.
    """

    values: dict[str, Any] = field(default_factory=defaults)

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def __setitem__(self, key: str, value: Any) -> None:
        if key not in FIELDS:
            raise KeyError(f"unknown setting {key!r}")
        self.values[key] = FIELDS[key].validate(value)

    def __iter__(self) -> Iterator[str]:
        return iter(self.values)

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, list) else v for k, v in self.values.items()}

    def precision(self) -> PrecisionSettings:
        return PrecisionSettings.from_mapping(self.values)

    def update_precision(self, precision: PrecisionSettings) -> None:
        """Apply a set of precision settings, e.g. a fix from the health check."""
        for key, value in precision.to_dict().items():
            self[key] = value


@dataclass
class LoadResult:
    """Settings as loaded, plus one plain line for each thing that was wrong with the file.

    `summary` is one sentence saying what the damage cost (a few fields, the latest change, or
    everything), for the headline above the `warnings`; empty when nothing was wrong.
    """

    settings: Settings
    warnings: list[str] = field(default_factory=list)
    kept_aside: Path | None = None
    summary: str = ""


# Words for LoadResult.summary: what the user lost, said plainly.
FIELDS_RESET = (
    "Some saved settings could not be read and were reset to their defaults; everything else "
    "was kept."
)
RESTORED_BACKUP = (
    "The settings file could not be read, so the copy from the save before it was restored; "
    "the latest change may be missing."
)
ALL_RESET = (
    "The settings file could not be read and there was no usable backup copy, so every "
    "setting is back to its default."
)
FOLDER_UNUSABLE = "The settings folder cannot be used, so the defaults apply for this session."

# A settings file is a few kB; anything past this is not ours.
MAX_SETTINGS_BYTES = 1024 * 1024
# A field list longer than this in one warning helps nobody.
_NAMES_SHOWN = 5


def settings_path() -> Path:
    return paths.config_dir() / SETTINGS_FILE


def load_settings(path: Path | None = None) -> LoadResult:
    """Read the settings file, recovering field by field from any damage.

    A missing file gives the defaults silently. An unreadable or non-JSON file (or a folder, a
    FIFO: only a regular file is opened) falls back to the `.bak` left by the last save, else to
    the defaults. An unknown key is dropped; a value of the wrong type or out of range (inf,
    NaN, a number of thousands of digits) falls back to that field's default. Whenever anything
    was wrong, the damaged file is kept aside (`settings.json.damaged-<time>`; a folder or FIFO
    is moved there so the next save can write the file), each problem is one line in
    `warnings`, and `summary` says what it cost. Never raises for a bad file or folder.
    """
    path = path or settings_path()
    folder_problem = _folder_problem(path.parent)
    if folder_problem:
        return LoadResult(Settings(), [folder_problem], None, FOLDER_UNUSABLE)
    if not os.path.lexists(path):
        return LoadResult(Settings())

    warnings: list[str] = []
    summary = FIELDS_RESET
    raw, problem = _read_json_object(path)
    if raw is None:
        backup = path.with_name(path.name + ".bak")
        raw, _ = _read_json_object(backup) if os.path.lexists(backup) else (None, None)
        if raw is not None:
            warnings.append(f"{path}: {problem}; restored the settings from {backup}.")
            summary = RESTORED_BACKUP
        else:
            warnings.append(f"{path}: {problem}; no usable backup, so the defaults apply.")
            summary = ALL_RESET
            raw = {}

    settings, field_warnings = _settings_from(raw, path)
    warnings += field_warnings
    if not warnings:
        return LoadResult(settings)
    return LoadResult(settings, warnings, _keep_aside(path), summary)


def _settings_from(raw: dict[str, Any], path: Path) -> tuple[Settings, list[str]]:
    """The fields of a parsed settings document, each validated alone, and what was wrong."""
    warnings: list[str] = []
    version = raw.get("schema_version", SCHEMA_VERSION)
    stored = raw.get("settings", {})
    if not isinstance(stored, dict):
        warnings.append(f"{path}: 'settings' is not an object; using the defaults.")
        stored = {}
    if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
        warnings.append(
            f"{path} was written by a newer HalfSafe (schema {shown(version)}); "
            "reading the fields this version knows."
        )
    settings = Settings()
    unknown = [key for key in stored if key not in FIELDS]
    if unknown:
        names = ", ".join(f"'{shown(key)[1:-1]}'" for key in unknown[:_NAMES_SHOWN])
        more = f" and {len(unknown) - _NAMES_SHOWN} more" if len(unknown) > _NAMES_SHOWN else ""
        noun = "setting" if len(unknown) == 1 else "settings"
        warnings.append(f"{path}: ignored unknown {noun} {names}{more}.")
    for key, value in stored.items():
        if key not in FIELDS:
            continue
        try:
            settings[key] = value
        except ValueError as error:
            warnings.append(f"{path}: setting '{key}': {error}; using the default.")
    return settings, warnings


def save_settings(settings: Settings, path: Path | None = None) -> Path:
    """Write every field of `settings` atomically: temp file, fsync, keep the old file as
    `.bak` (itself written atomically), rename; under the settings lock, so that saves from
    two processes never interleave.

    A crash at any point leaves either the old file or the new one in place, never half of one.
    Raises OSError (with a plain `strerror`) when the file cannot be written.
    """
    path = path or settings_path()
    with _settings_lock(path):
        return _write(settings, path)


def update_settings(
    changes: Mapping[str, Any], path: Path | None = None, *, base: Settings | None = None
) -> Settings:
    """Save `changes` without losing what another process saved meanwhile, and return the
    settings now in the file.

    Under the settings lock: read the file as it is now, lay `changes` over it, write it. A
    field the file lacks or holds damaged comes from `base` (the caller's copy; else the
    default). Validates `changes` first (ValueError, nothing written); OSError if the file
    cannot be written.
    """
    path = path or settings_path()
    checked = {key: _field(key).validate(value) for key, value in changes.items()}
    with _settings_lock(path):
        merged = Settings(dict((base or Settings()).values))
        if os.path.lexists(path):
            raw, _ = _read_json_object(path)
            stored = (raw or {}).get("settings")
            for key, value in (stored if isinstance(stored, dict) else {}).items():
                with contextlib.suppress(KeyError, ValueError):
                    merged[key] = value
        for key, value in checked.items():
            merged[key] = value
        _write(merged, path)
    return merged


def _field(key: str) -> Field:
    if key not in FIELDS:
        raise ValueError(f"unknown setting {key!r}")
    return FIELDS[key]


def _settings_lock(path: Path) -> contextlib.AbstractContextManager[None]:
    problem = _folder_problem(path.parent)
    if problem:
        raise NotADirectoryError(errno.ENOTDIR, problem)
    return locked(path)


def _write(settings: Settings, path: Path) -> Path:
    document = {"schema_version": SCHEMA_VERSION, "settings": settings.to_dict()}
    # Only a readable file is worth keeping as the backup: never replace a good .bak with junk.
    keep = _read_json_object(path)[0] is not None if os.path.lexists(path) else False
    return write_atomic(
        path, json.dumps(document, indent=2, sort_keys=True) + "\n", keep_backup=keep
    )


def _folder_problem(folder: Path) -> str | None:
    """One sentence when the settings folder is a file (or cannot be looked at), else None."""
    try:
        if not folder.exists() or folder.is_dir():
            return None
    except OSError as error:
        return f"The settings folder {folder} cannot be used ({error.strerror or error})."
    return (
        f"{folder} should be HalfSafe's settings folder but it is a file; changes cannot be "
        "saved until it is moved or HALFSAFE_CONFIG_DIR names a folder."
    )


class _LongNumber(float):
    """A JSON integer too long for any setting, read as an infinite float: json would refuse it
    outright past 4,300 digits, costing the whole file. `digits` says how long it was."""

    digits: int

    def __new__(cls, text: str) -> _LongNumber:
        number = super().__new__(cls, "-inf" if text.startswith("-") else "inf")
        number.digits = len(text.lstrip("-"))
        return number


def _parse_int(text: str) -> int | float:
    return int(text) if len(text) <= MAX_NUMBER_DIGITS else _LongNumber(text)


def _read_json_object(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """The JSON object in `path`, or None and a phrase saying what is wrong with the file."""
    try:
        text = read_regular_file(path, MAX_SETTINGS_BYTES).decode("utf-8")
    except OSError as error:
        return None, f"cannot be read ({error.strerror or error})"
    except UnicodeDecodeError:
        return None, "is not text"
    try:
        data = json.loads(text, parse_int=_parse_int)
    except json.JSONDecodeError as error:
        return None, f"is not valid JSON (line {error.lineno}: {error.msg})"
    except RecursionError:
        return None, "is nested too deeply to be a settings file"
    if not isinstance(data, dict):
        return None, "does not hold a JSON object"
    return data, None


def _keep_aside(path: Path) -> Path | None:
    """Keep the damaged file as `<name>.damaged-<time>`: a copy of a regular file, or the thing
    itself moved out of the way (a folder or FIFO would block every later save)."""
    if not is_regular_file(path):
        return clear_non_regular(path)
    target = aside_name(path)
    try:
        shutil.copy2(path, target)
    except OSError:
        return None
    return target
