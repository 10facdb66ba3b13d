"""The one settings schema: every option declared once, with its persistence.

The settings panel, the CLI's precision flags and the settings file are all generated from
`SCHEMA`. Loading is forgiving field by field: a damaged file costs the user the damaged fields,
never the rest, and the damaged file is kept aside. Saving is atomic and keeps a `.bak`.

This module must stay cheap to import (no torch).
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from app.core import paths
from app.core.files import write_atomic

SCHEMA_VERSION = 1
SETTINGS_FILE = "settings.json"

DTYPE_CHOICES = ("auto", "fp16", "bf16", "fp32")
ATTENTION_BACKENDS = ("auto", "flash", "efficient", "cudnn", "math", "classic")
AUTO_FIX_CHOICES = ("off", "ask", "auto")
SCHEDULERS = ("euler", "euler_a", "dpmpp_2m_karras", "ddim")
DEVICE_PATTERN = re.compile(r"^(auto|cpu|cuda|cuda:\d+|mps|xpu|xpu:\d+)$")

GROUPS = ("Device", "Precision", "Attention", "Accumulation", "NaN safety", "Generation", "Folders")


@dataclass(frozen=True)
class Field:
    """One option: its type, default, allowed values, and the words the user sees.

    `kind` is one of "bool", "choice", "int", "float", "text", "device", "paths", "path".
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

    @property
    def flag_name(self) -> str:
        """The CLI flag, without dashes: the key with '-' for '_' unless `flag` says otherwise."""
        return self.flag or self.key.replace("_", "-")

    def validate(self, value: Any) -> Any:
        """Return `value` normalised to this field's type, or raise ValueError saying why."""
        if self.kind == "bool":
            if isinstance(value, bool):
                return value
            raise ValueError(f"expected true or false, got {value!r}")
        if self.kind in ("choice", "device"):
            if not isinstance(value, str):
                raise ValueError(f"expected text, got {value!r}")
            if self.kind == "choice" and value not in self.choices:
                raise ValueError(f"expected one of {', '.join(self.choices)}, got {value!r}")
            if self.kind == "device" and not DEVICE_PATTERN.match(value):
                raise ValueError(f"expected auto, cpu, cuda, cuda:N, mps or xpu, got {value!r}")
            return value
        if self.kind in ("int", "float"):
            # bool is an int in Python; a JSON `true` for a step count is damage, not 1.
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"expected a number, got {value!r}")
            if self.kind == "int":
                if float(value) != int(value):
                    raise ValueError(f"expected a whole number, got {value!r}")
                value = int(value)
            else:
                value = float(value)
            if self.minimum is not None and value < self.minimum:
                raise ValueError(f"{value} is below the minimum {self.minimum:g}")
            if self.maximum is not None and value > self.maximum:
                raise ValueError(f"{value} is above the maximum {self.maximum:g}")
            if self.step and value % self.step:
                raise ValueError(f"{value} is not a multiple of {self.step}")
            return value
        if self.kind in ("text", "path"):
            if not isinstance(value, str):
                raise ValueError(f"expected text, got {value!r}")
            return value
        if self.kind == "paths":
            if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
                raise ValueError(f"expected a list of folders, got {value!r}")
            return list(value)
        raise AssertionError(f"unknown field kind {self.kind}")


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
        "Base number format for every part of the model. " + _DTYPE_HELP,
        "Precision",
        choices=DTYPE_CHOICES,
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
            FIELDS[f.name].validate(getattr(self, f.name))

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

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
    """Settings as loaded, plus one plain line for each thing that was wrong with the file."""

    settings: Settings
    warnings: list[str] = field(default_factory=list)
    kept_aside: Path | None = None


def settings_path() -> Path:
    return paths.config_dir() / SETTINGS_FILE


def load_settings(path: Path | None = None) -> LoadResult:
    """Read the settings file, recovering field by field from any damage.

    A missing file gives the defaults silently. An unreadable or non-JSON file falls back to the
    `.bak` left by the last save, else to the defaults. An unknown key is dropped; a value of the
    wrong type or out of range falls back to that field's default. Whenever anything was wrong,
    the damaged file is copied aside (`settings.json.damaged-<time>`) so nothing is lost, and
    each problem is reported as one line in `warnings`. Never raises for a bad file.
    """
    path = path or settings_path()
    if not path.exists():
        return LoadResult(Settings())

    warnings: list[str] = []
    raw, problem = _read_json_object(path)
    if raw is None:
        warnings.append(f"{path}: {problem}; using the last good copy or the defaults.")
        backup = path.with_name(path.name + ".bak")
        raw, _ = _read_json_object(backup) if backup.exists() else (None, None)
        if raw is not None:
            warnings.append(f"Restored settings from {backup}.")
        raw = raw or {}

    version = raw.get("schema_version", SCHEMA_VERSION)
    stored = raw.get("settings", {})
    if not isinstance(stored, dict):
        warnings.append(f"{path}: 'settings' is not an object; using the defaults.")
        stored = {}
    if isinstance(version, int) and version > SCHEMA_VERSION:
        warnings.append(
            f"{path} was written by a newer HalfSafe (schema {version}); "
            "reading the fields this version knows."
        )

    settings = Settings()
    for key, value in stored.items():
        if key not in FIELDS:
            warnings.append(f"{path}: ignored unknown setting '{key}'.")
            continue
        try:
            settings[key] = value
        except ValueError as error:
            warnings.append(f"{path}: setting '{key}': {error}; using the default.")

    kept_aside = None
    if warnings and raw is not None:
        kept_aside = _keep_aside(path)
    return LoadResult(settings, warnings, kept_aside)


def save_settings(settings: Settings, path: Path | None = None) -> Path:
    """Write the settings atomically: temp file, fsync, keep the old file as `.bak`, rename.

    A crash at any point leaves either the old file or the new one in place, never half of one.
    """
    path = path or settings_path()
    document = {"schema_version": SCHEMA_VERSION, "settings": settings.to_dict()}
    # Only a readable file is worth keeping as the backup: never replace a good .bak with junk.
    keep = path.exists() and _read_json_object(path)[0] is not None
    return write_atomic(
        path, json.dumps(document, indent=2, sort_keys=True) + "\n", keep_backup=keep
    )


def _read_json_object(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        return None, f"cannot be read ({error.strerror or error})"
    except UnicodeDecodeError:
        return None, "is not text"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        return None, f"is not valid JSON (line {error.lineno}: {error.msg})"
    if not isinstance(data, dict):
        return None, "does not hold a JSON object"
    return data, None


def _keep_aside(path: Path) -> Path | None:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = path.with_name(f"{path.name}.damaged-{stamp}")
    try:
        shutil.copy2(path, target)
    except OSError:
        return None
    return target
