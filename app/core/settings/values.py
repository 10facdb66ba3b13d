"""Settings as values in memory: the precision settings of one job (`PrecisionSettings`) and the
user's settings (`Settings`), each field validated against the schema.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from app.core.settings.schema import FIELDS, defaults

# One setting's value, as the schema's field kinds hold them (`validation.Field.kind`): a
# switch, a number, a word or a path, a list of folders or COMPONENT:PATH entries; None where
# a record leaves it unset.
SettingValue = bool | int | float | str | list[str] | None


def setting_entries(settings: Mapping[str, SettingValue], key: str) -> list[str]:
    """A list setting's entries (`fp32_modules`, `clamp_modules`, ...): [] where unset."""
    value = settings.get(key)
    return list(value) if isinstance(value, list) else []


def setting_word(settings: Mapping[str, SettingValue], key: str) -> str:
    """A word setting's value (a dtype, a backend): "" where unset."""
    value = settings.get(key)
    return value if isinstance(value, str) else ""


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
    prompt_upsampler_precision: str = FIELDS["prompt_upsampler_precision"].default
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
    max_vram_gb: float = FIELDS["max_vram_gb"].default
    vae_tiling: str = FIELDS["vae_tiling"].default

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
