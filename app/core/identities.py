"""Which model and which device a job ran on: `ModelIdentity` and `DeviceIdentity`, the records
a health report and a generation result carry, each with the JSON docs/json.md promises.

(Not the identity of the weights that remembered fixes are keyed by: see `models.identity`.)
Plain data: importing this never pulls in torch, and the records cross to the GUI as themselves.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from app.core.formats.weight_findings import StoredQuantization

if TYPE_CHECKING:
    from app.core.hardware import DeviceInfo


@dataclass(frozen=True)
class Prediction:
    """What a model predicts (`type`: "epsilon" | "v_prediction"), whether its schedule
    reaches zero terminal SNR, and one clause saying how HalfSafe knows (`because`)."""

    type: str = "epsilon"
    zero_terminal_snr: bool = False
    because: str = ""

    @classmethod
    def of(cls, model: Any) -> Prediction:
        from app.core.models.prediction import (
            prediction_summary,  # the engine's side, not the window's
        )

        return cls(**prediction_summary(model))

    def to_json(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "zero_terminal_snr": self.zero_terminal_snr,
            "because": self.because,
        }


@dataclass(frozen=True)
class LoraIdentity:
    """A LoRA a job ran with: its name, file and weight, the A1111 short hash of the file,
    and the tensors its scan found holding NaN/Inf (`non_finite`) or past any trained
    LoRA's size (`absurd`)."""

    name: str
    path: str
    weight: float
    hash: str | None = None
    non_finite: tuple[str, ...] = ()
    absurd: tuple[str, ...] = ()

    @classmethod
    def of(cls, applied: Any) -> LoraIdentity:
        """The identity of a `lora.AppliedLora`, read from its JSON so the two never differ."""
        document = applied.to_json()
        return cls(
            name=document["name"],
            path=document["path"],
            weight=document["weight"],
            hash=document["hash"],
            non_finite=tuple(document["non_finite"]),
            absurd=tuple(document["absurd"]),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": self.path,
            "weight": self.weight,
            "hash": self.hash,
            "non_finite": list(self.non_finite),
            "absurd": list(self.absurd),
        }


@dataclass(frozen=True)
class ModelIdentity:
    """Which model a job ran: what the user gave (`source`: a path or a built-in demo name),
    its `name`, `architecture` ("sd1", "sdxl", ...) and `format` ("diffusers",
    "single_file", "demo", ...), its AUTOMATIC1111 short `hash` (None where it has none), what
    it predicts, how its files store quantized weights (`quantization`: `quantized.summary`'s
    object, None when no file is quantized), the files a split transformer's other components
    were read from (`companions`, by component) and the LoRAs it ran with.

    The health report and the generation result carry this one record, made from the loaded
    model by `of`. Their JSON shows different parts of it, as docs/json.md has promised tools
    from the start: a check says how the model was read (`check_json`), a generation what its
    images' parameters name it by (`generation_json`: its hash and LoRAs)."""

    source: str
    name: str
    architecture: str
    format: str = ""
    hash: str | None = None
    prediction: Prediction = field(default_factory=Prediction)
    quantization: StoredQuantization | None = None
    companions: Mapping[str, str] = field(default_factory=dict)
    loras: tuple[LoraIdentity, ...] = ()

    @classmethod
    def of(cls, model: Any) -> ModelIdentity:
        """The identity of a loaded model (`models.LoadedModel`), its LoRAs as applied now."""
        quantization = getattr(model, "quantization", None)
        return cls(
            source=str(model.source),
            name=str(model.name),
            architecture=str(model.architecture),
            format=str(model.format),
            hash=getattr(model, "model_hash", None),
            prediction=Prediction.of(model),
            quantization=quantization,
            companions=dict(getattr(model, "companions", {})),
            loras=tuple(LoraIdentity.of(a) for a in getattr(model, "loras", [])),
        )

    def check_json(self) -> dict[str, Any]:
        """The check report's `model` object."""
        return {
            "source": self.source,
            "format": self.format,
            "architecture": self.architecture,
            "name": self.name,
            "prediction": self.prediction.to_json(),
            "quantization": self.quantization.to_json() if self.quantization is not None else None,
            "companions": dict(self.companions),
        }

    def generation_json(self) -> dict[str, Any]:
        """The generation result's `model` object."""
        return {
            "source": self.source,
            "name": self.name,
            "architecture": self.architecture,
            "hash": self.hash,
            "loras": [lora.to_json() for lora in self.loras],
        }


@dataclass(frozen=True)
class DeviceIdentity:
    """Which device a job ran on: its `kind` ("cuda", "rocm", "mps", "xpu" or "cpu") and
    `name`, as `hardware.DeviceInfo` has them; the name is also the device a fix is
    remembered for."""

    kind: str
    name: str

    @classmethod
    def of(cls, info: DeviceInfo) -> DeviceIdentity:
        return cls(kind=info.kind, name=info.name)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name}
