"""The few named errors that core raises; each message is one sentence a user can act on."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


class HalfSafeError(Exception):
    """An error the user can act on. `str(error)` is one plain sentence, shown as is.

    The CLI turns it into exit status 2 and one line on stderr; the GUI shows it in its
    error dialog. Anything else that escapes is a bug in HalfSafe.
    """


class BadFileError(HalfSafeError):
    """A file the user handed over is missing, unreadable, malformed or hostile."""

    def __init__(self, path: str | Path, problem: str) -> None:
        self.path = Path(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class PickleRefusedError(BadFileError):
    """A pickle checkpoint (.ckpt/.pt/.bin) was offered without the user allowing pickles."""


class UnsupportedModelError(BadFileError):
    """The file is well formed but holds a model HalfSafe cannot run."""


class DeviceError(HalfSafeError):
    """The requested device does not exist or cannot be used."""


class CancelledError(HalfSafeError):
    """The user cancelled the job; not a failure."""

    def __init__(self, message: str = "Cancelled.") -> None:
        super().__init__(message)


class WrongPartError(UnsupportedModelError):
    """A part of another family or size handed to a model or found beside it (a text encoder,
    a VAE, a LoRA): the message names both files and what each belongs to. Raised before the
    part is built or the model changed (see `app.core.models.parts`)."""

    def __init__(self, part: str | Path, model: str | Path, problem: str) -> None:
        self.model = Path(model)
        super().__init__(part, problem)


class OutOfMemoryError(HalfSafeError):
    """The GPU's or the computer's memory ran out during a job. The job stopped and left
    nothing behind: no image saved, no fix remembered (see `app.core.memory`)."""


@dataclass(frozen=True)
class WrongVariant:
    """A model's weights and the config it would be built with describe different variants of
    it: more or fewer numbered blocks (Anima 2.9B's 40 under Anima 2B's 28), or a tensor of
    another width. Built that way, a model drops or invents weights and draws noise, which looks
    like a numeric failure and is none. `kind` is "blocks" (`where`: the numbered group, the
    counts ints) or "shape" (`where`: the tensor, the counts its shapes); `setting` the config
    value that alone makes the config's count, where one does; `config` the config's file, or
    the variant a tool's loader builds (`proved` False: the file is a later variant than the
    family's first, which a loader that knows only that one builds in its place)."""

    component: str
    kind: str
    where: str
    in_file: int | tuple[int, ...]
    in_config: int | tuple[int, ...]
    setting: str | None
    config: str
    proved: bool = True

    def to_json(self) -> dict[str, object]:
        def plain(value: int | tuple[int, ...]) -> int | list[int]:
            return value if isinstance(value, int) else list(value)

        return {
            "component": self.component,
            "kind": self.kind,
            "where": self.where,
            "in_file": plain(self.in_file),
            "in_config": plain(self.in_config),
            "setting": self.setting,
            "config": self.config,
            "proved": self.proved,
        }


class WrongVariantError(BadFileError):
    """A config that describes another variant of the model than its weights (`WrongVariant`):
    the message says both counts before anything else."""

    def __init__(self, path: str | Path, problem: str, variant: WrongVariant) -> None:
        self.variant = variant
        super().__init__(path, problem)
