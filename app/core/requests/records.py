"""What a job is asked to do, one frozen record per kind of job.

The GUI builds these and the engine runs them (each record crosses the process boundary as
itself, pickled). `kind` names the engine job that runs a record. Everything here is plain
data: importing it never pulls in torch or Qt. `CheckRequest` is defined beside the check
(`app.core.health.request`), below generation and explain, which build one too (this package
imports generation's records), and is re-exported here with the other jobs' records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, NamedTuple, Protocol

from app.core.generation.records import GenerationRequest
from app.core.health.request import CheckRequest
from app.core.images.canvas import Canvas
from app.core.lora.request import LoraRequest
from app.core.settings import FIELDS, PrecisionSettings
from app.core.settings.values import SettingValue


class Request(Protocol):
    """What every job's request is: a frozen record whose class picks the engine job that runs
    it, and whose `kind` names that job in the events it sends."""

    kind: ClassVar[str]


@dataclass(frozen=True)
class LoadRequest:
    """Load `source` (a path or a built-in demo name), with `vae` in place of its own VAE.
    `device` is where a fix remembered for the model is looked up."""

    kind: ClassVar[str] = "load"
    source: str
    vae: str | None = None
    allow_pickle: bool = False
    device: str = "auto"


class PicturePath(NamedTuple):
    """What the next job starts from, for the health check to probe the same path: the input
    pictures (none: text-to-image), the mask, and inpainting's layout."""

    images: tuple[str, ...] = ()
    mask: str | None = None
    canvas: Canvas = Canvas()


@dataclass(frozen=True)
class GenerateRequest:
    """Make the images `generation` describes with the loaded model, at `precision` on
    `device`. The LoRAs applied are `loras` and those the prompt names in `<lora:...>` tags.
    `fix`: a fix (settings values) this job runs with over `precision`, the user's own
    choices included, for this job only ("Apply fix and regenerate"; `job_fix`)."""

    kind: ClassVar[str] = "generate"
    generation: GenerationRequest
    precision: PrecisionSettings = field(default_factory=PrecisionSettings)
    device: str = "auto"
    loras: tuple[LoraRequest, ...] = ()
    allow_pickle: bool = False
    fix: dict[str, SettingValue] = field(default_factory=dict)


@dataclass(frozen=True)
class ExplainRequest:
    """Explain why the image at `path` came out as it did; a check runs on `device`."""

    kind: ClassVar[str] = "explain"
    path: str
    device: str = "auto"
    model: str | None = None  # the model the user says made it, where the image does not
    remake: bool = False  # make it again from its record and compare (`explain.remake`)


@dataclass(frozen=True)
class HardwareRequest:
    """Describe the devices; `self_test` runs the on-device test (cached), `retest` anew."""

    kind: ClassVar[str] = "hardware"
    self_test: bool = True
    retest: bool = False


@dataclass(frozen=True)
class RememberFixRequest:
    """Remember `settings` (a verified fix, in settings values) for the loaded model on
    `device`. `verified_by` says what proved it: "health check" or "generation"; `made_at`
    the precision it was proved at, as settings (`PrecisionPlan.dtype_settings`)."""

    kind: ClassVar[str] = "remember_fix"
    settings: dict[str, SettingValue]
    summary: str = ""
    verified_by: str = "health check"
    device: str = "auto"
    made_at: dict[str, SettingValue] = field(default_factory=dict)


@dataclass(frozen=True)
class CheckModelsRequest:
    """Check several models in turn, each loaded for its check and checked as `CheckRequest`
    says, then load the model that was loaded before again. `models`: these sources (Re-verify
    of one model, whose fix `precision` then names); None: every model the library lists under
    `folders` and the usual model folders ("Check all my models")."""

    kind: ClassVar[str] = "check_models"
    models: tuple[str, ...] | None = None
    folders: tuple[str, ...] = ()
    precision: PrecisionSettings = field(default_factory=PrecisionSettings)
    device: str = "auto"
    size: int | None = None
    steps: int = FIELDS["steps"].default
    scheduler: str = FIELDS["scheduler"].default
    clip_skip: int = FIELDS["clip_skip"].default


@dataclass(frozen=True)
class PingRequest:
    """Proves the engine is up and answering."""

    kind: ClassVar[str] = "ping"


JobParams = (
    LoadRequest
    | CheckRequest
    | GenerateRequest
    | ExplainRequest
    | HardwareRequest
    | RememberFixRequest
    | CheckModelsRequest
    | PingRequest
)
