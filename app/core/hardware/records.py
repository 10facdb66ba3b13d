"""The hardware report's records: the classes a device can be given, a known quirk and the
devices it matches, one device (`DeviceInfo`), the whole report (`HardwareReport`), their JSON,
and the entry of a `gpu --json` device list that a device setting picks.

Every field holds plain data: builtins (exactly: no str subclass such as torch's version), and
these records nested, so that the report unpickles in a process that never imports torch.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from app.core.hardware.selftest_records import SelfTestResult
from app.core.precision.kernels import AttentionKernel
from app.core.settings import PrecisionSettings
from app.core.settings.values import SettingValue

FP16_CLASSES = ("fast", "slow", "unreliable", "unsupported")  # best to worst
BF16_CLASSES = ("native", "emulated", "unsupported")
KINDS = ("cuda", "rocm", "mps", "xpu", "cpu")
BACKENDS = (*KINDS, "directml")


@dataclass(frozen=True)
class Bounds:
    """A range of versions or capabilities, each bound a tuple of numbers: at least `min`, at
    most `max`, below `below` (None: unbounded on that side)."""

    min: tuple[int, ...] | None = None
    max: tuple[int, ...] | None = None
    below: tuple[int, ...] | None = None

    def holds(self, value: tuple[int, ...]) -> bool:
        if self.min is not None and value < self.min:
            return False
        if self.max is not None and value > self.max:
            return False
        return not (self.below is not None and value >= self.below)

    @classmethod
    def read(cls, value: object, parse: Callable[[Any], tuple[int, ...]]) -> Bounds:
        """The bounds a quirks-table range gives (`{"min": [7, 5]}`, `{"below": "14.5"}`);
        ValueError for anything else."""
        if not isinstance(value, Mapping) or not value or set(value) - {"min", "max", "below"}:
            raise ValueError("must be a range with keys among ['below', 'max', 'min']")
        return cls(**{key: parse(bound) for key, bound in value.items()})


@dataclass(frozen=True)
class QuirkMatch:
    """Which devices a quirk hits: every condition given must hold. `name` and `arch` are
    regular expressions (the name's case ignored); an empty tuple or None leaves that side of
    the device unasked."""

    backend: tuple[str, ...] = ()
    vendor: tuple[str, ...] = ()
    name: str = ""
    arch: str = ""
    capability: Bounds | None = None
    os: tuple[str, ...] = ()
    os_version: Bounds | None = None
    driver: Bounds | None = None

    def matches(self, device: DeviceInfo) -> bool:
        if self.backend and device.backend not in self.backend:
            return False
        if self.vendor and device.vendor not in self.vendor:
            return False
        if self.name and not re.search(self.name, device.name, re.IGNORECASE):
            return False
        if self.arch and not (device.arch and re.search(self.arch, device.arch)):
            return False
        if self.capability is not None and (
            device.capability is None or not self.capability.holds(tuple(device.capability))
        ):
            return False
        if self.os and device.os_name not in self.os:
            return False
        for bounds, value in ((self.os_version, device.os_version), (self.driver, device.driver)):
            if bounds is not None and not (
                value and re.search(r"\d", value) and bounds.holds(_version(value))
            ):
                return False
        return True

    @classmethod
    def read(cls, rule: object) -> QuirkMatch:
        """The match rule of a quirks-table entry; ValueError (re.error for a bad pattern)
        naming what is wrong."""
        keys = {f.name for f in fields(cls)}
        if not isinstance(rule, Mapping) or not rule or set(rule) - keys:
            raise ValueError(f"match keys must be among {sorted(keys)}")
        values: dict[str, Any] = {}
        for key, value in rule.items():
            if key in ("backend", "vendor", "os"):
                values[key] = tuple(str(v) for v in _as_list(value))
            elif key in ("name", "arch"):
                values[key] = re.compile(str(value)).pattern
            else:
                numbers = _capability if key == "capability" else _version
                try:
                    values[key] = Bounds.read(value, numbers)
                except ValueError as error:
                    raise ValueError(f"{key} {error}") from None
        match = cls(**values)
        for backend in match.backend:
            if backend not in BACKENDS:
                raise ValueError(f"unknown backend {backend!r}")
        return match


@dataclass(frozen=True)
class Quirk:
    """One known fault or limit: which devices it hits, what it changes, and where it is from.

    `effects` maps "fp16"/"bf16" to a (worse) class, "tf32" to False, or a precision setting
    (a key of `PrecisionSettings`) to the value that device needs.
    """

    id: str
    summary: str
    source: str
    match: QuirkMatch
    effects: Mapping[str, SettingValue]

    def matches(self, device: DeviceInfo) -> bool:
        """Whether every condition of the match rule holds for `device`."""
        return self.match.matches(device)

    def to_json(self) -> dict[str, str]:
        return {"id": self.id, "summary": self.summary, "source": self.source}


def _capability(bound: Sequence[int]) -> tuple[int, ...]:
    return tuple(int(n) for n in bound)


def _as_list(value: object) -> list[object]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _version(text: str) -> tuple[int, ...]:
    """ "14.5" -> (14, 5, 0, 0); "macOS 15.1" -> (15, 1, 0, 0); "560.94" -> (560, 94, 0, 0)."""
    numbers = [int(n) for n in re.findall(r"\d+", str(text))][:4]
    return tuple(numbers + [0] * (4 - len(numbers)))


@dataclass(frozen=True)
class DeviceInfo:
    """One device: what the system reports, its classification, and the recommended settings.

    `kind` is the contract's device kind ("cuda", "rocm", "mps", "xpu", "cpu"); `backend` is
    the same except for a DirectML adapter ("directml"). `arch` is an AMD GPU's gfx target.
    `features` holds hints the classification uses (CPU instruction sets, Intel XMX).
    `recommended` maps every precision setting to a resolved value; `reasons` says why, one line
    per setting.
    """

    kind: str
    index: int | None
    name: str
    capability: tuple[int, int] | None = None
    memory_total_mb: int | None = None
    driver: str | None = None
    vendor: str = ""
    arch: str | None = None
    os_name: str = ""
    os_version: str = ""
    backend: str = ""
    features: frozenset[str] = frozenset()
    fp16: str = "fast"
    bf16: str = "native"
    tf32: bool = False
    quirks: tuple[Quirk, ...] = ()
    recommended: Mapping[str, SettingValue] = field(default_factory=dict)
    reasons: Mapping[str, str] = field(default_factory=dict)
    self_test: SelfTestResult | None = None

    def __post_init__(self) -> None:
        if not self.backend:
            object.__setattr__(self, "backend", self.kind)

    @property
    def torch_device(self) -> str:
        """The PyTorch device string: "cuda:0" (ROCm too), "mps", "xpu:0" or "cpu"."""
        if self.kind in ("cuda", "rocm"):
            return f"cuda:{self.index or 0}"
        if self.kind == "xpu":
            return f"xpu:{self.index or 0}"
        return self.kind

    def recommended_settings(self) -> PrecisionSettings:
        return PrecisionSettings.from_mapping(self.recommended)

    def to_json(self) -> dict[str, Any]:
        """This device as `halfsafe gpu --json` lists it."""
        test = self.self_test or SelfTestResult.skipped()
        return {
            "kind": self.kind,
            "index": self.index,
            "name": self.name,
            "capability": list(self.capability) if self.capability else None,
            "memory_total_mb": self.memory_total_mb,
            "driver": self.driver,
            "fp16": self.fp16,
            "bf16": self.bf16,
            "tf32": self.tf32,
            "quirks": [q.to_json() for q in self.quirks],
            "self_test": test.to_json(),
            "recommended": dict(self.recommended),
            "reasons": dict(self.reasons),
        }


@dataclass
class HardwareReport:
    """Every device PyTorch can use on this computer, assessed, plus notes for the user, and the
    attention kernels HalfSafe does not ship found in this Python environment."""

    halfsafe: str
    torch: str
    cuda: str | None
    devices: list[DeviceInfo]
    notes: list[str] = field(default_factory=list)
    attention_kernels: list[AttentionKernel] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The object `halfsafe gpu --json` prints (see DESIGN.md)."""
        return {
            "halfsafe": self.halfsafe,
            "torch": self.torch,
            "cuda": self.cuda,
            "devices": [d.to_json() for d in self.devices],
            "attention_kernels": [k.to_json() for k in self.attention_kernels],
        }


def device_entry(devices: Sequence[DeviceInfo], wanted: str) -> DeviceInfo | None:
    """The device of a report's list that the device setting `wanted` picks: auto (or a
    device that is not there) picks the first listed; a ROCm device also answers to cuda and
    cuda:N, as PyTorch names it."""
    if not devices:
        return None
    for device in devices:
        kind, index = device.kind, device.index
        names = {str(kind)} | ({f"{kind}:{index}"} if index is not None else set())
        if kind == "rocm":
            names |= {"cuda"} | ({f"cuda:{index}"} if index is not None else set())
        if wanted in names:
            return device
    return devices[0]
