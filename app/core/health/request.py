"""What a check is asked (`CheckRequest`: the job, as the window, the command or an image's
record describes it) and how one call of it runs (`CheckRun`), as plain data.

The request is defined here, below the parts that build one (generation's repair by cause,
explain, the engine and the command through `app.core.requests.records`, which re-exports it),
and travels whole from them through `causes.check_and_attribute` into `health.check_loaded`.
Importing this module never pulls in torch or Qt: the record crosses the engine's process
boundary as itself, pickled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from app.core.images.canvas import Canvas
from app.core.lora.request import LoraRequest
from app.core.settings import FIELDS, PrecisionSettings

# The prompt a check reads where the job names none (the window's check, `halfsafe check`).
DEFAULT_PROMPT = "a photograph of an astronaut riding a horse, highly detailed"


@dataclass(frozen=True)
class CheckRequest:
    """Check the loaded model at `precision` on `device`: probed at `size` px (None: the
    model's native size) at the ends of the sampler (`steps`, `scheduler`) the user generates
    with, on `prompt` read at `clip_skip`; a model whose family states steps of its own
    (Z-Image Turbo's 9) is probed at those. `loras`: exactly these applied (None: leave the
    model's LoRAs as they are); they and `allow_pickle` are for whoever applies them before
    the check (`requests.requested.check`)."""

    kind: ClassVar[str] = "check"
    precision: PrecisionSettings = field(default_factory=PrecisionSettings)
    device: str = "auto"
    size: int | None = None
    steps: int = FIELDS["steps"].default
    scheduler: str = FIELDS["scheduler"].default
    loras: tuple[LoraRequest, ...] | None = None
    allow_pickle: bool = False
    # The path an image-to-image or inpainting job runs: its input picture and mask, probed
    # through the VAE's encoder (none: the text-to-image path).
    images: tuple[str, ...] = ()
    mask: str | None = None
    canvas: Canvas = field(default_factory=Canvas)  # inpainting's layout, as the job's
    clip_skip: int = FIELDS["clip_skip"].default  # the prompt's CLIP layer, as the job's
    # The job's hires fix enlarges the decoded picture (a pixel upscaler): the VAE's encoder
    # is probed too, on the picture the VAE decodes at the check's size.
    pixel_upscale: bool = False
    # What the text encoders read: the job's prompt (an image's recorded one, for explain).
    prompt: str = DEFAULT_PROMPT


@dataclass(frozen=True)
class CheckRun:
    """How one call of the check runs, beside the job it checks: the caller's policy, not the
    job's description, so it is not part of the request the window sends.

    `remember`: a verified fix is stored in the model's remembered profile for the device.
    `measure_cost`: a verified fix is priced as the user's generation pays it, beside no-half.
    `use_remembered`: the fix remembered for the model is applied first; False runs exactly
    the settings given (an image's recorded ones, to reproduce what made it black).
    `complete_table`: once the fix is proved, the candidates it needed no run of are run for
    the table; False stops at the proved fix (`halfsafe check --quick`, and a generation
    finding the cause of its failed images).

    A record rather than four keywords: `check_and_attribute` hands it on with one field
    changed (it remembers only once the cause is known), and every caller reads which policy
    it runs at a glance. Progress and cancel stay keywords, as every core job takes them."""

    remember: bool = True
    measure_cost: bool = True
    use_remembered: bool = True
    complete_table: bool = True


# The policy of a check the user asked for: its fix remembered, priced, the remembered one used,
# its table of candidates completed.
AS_ASKED = CheckRun()
# `halfsafe check --quick`: stopped at the proved fix (remembered), neither priced nor tabled.
QUICK = CheckRun(measure_cost=False, complete_table=False)
