"""One option's declaration (`Field`) and the checking of a value against it: types, bounds,
devices, folders and COMPONENT:PATH module entries; numbers of any length, read without
overflowing; a bad value quoted short in a warning.
"""

from __future__ import annotations

import math
import re
import reprlib
from dataclasses import dataclass
from typing import Any

from app.core.components import PIPELINE_PARTS

DEVICE_PATTERN = re.compile(r"^(auto|cpu|cuda|cuda:\d+|mps|xpu|xpu:\d+)$")

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
# when it loads (`job_plans.check_module_settings`).
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
        if component not in PIPELINE_PARTS:
            raise ValueError(
                f"{shown(component)} is not a component (one of {', '.join(PIPELINE_PARTS)})"
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
