"""What a family can do beyond drawing from a prompt, each a class the family lists among its
bases (as diffusers lists its loader mixins): `Editing` (pictures given as references, edited
by the family's editing pipelines) and `Control` (a control picture the model follows). A
family that lists neither keeps `Family`'s narrow contract: text-to-image, and image-to-image
and inpainting through its picture pipelines.

Code outside the families asks through `references` and `controls`, which answer for every
family, and reaches an edit's steps through `editing` once a job is known to be an edit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from app.core.images.pictures import Mode

if TYPE_CHECKING:  # a capability is listed beside Family, whose steps it uses
    from app.core.families.base import Family as _Listed
else:
    _Listed = object


class Editing(_Listed):
    """A family that edits pictures: its editing pipelines (a variant with its own folder
    class: Flux.1 Kontext, Qwen-Image-Edit; or the family's own pipeline where it takes
    references: Flux.2) with how many reference pictures each takes, and how the prompt, the
    references, the pipeline's call and the check's probe take them. A model loaded as one of
    those pipelines edits the pictures it is given (`Mode.EDIT`), with its own pipeline."""

    edit_pipelines: ClassVar[Mapping[str, int]] = {}

    def recognises(self, class_name: str) -> bool:
        return class_name in self.edit_pipelines or super().recognises(class_name)

    def max_references(self, pipeline) -> int:
        """How many pictures this loaded model edits at most (0: not an editing pipeline)."""
        return self.edit_pipelines.get(type(pipeline).__name__, 0)

    def encode_edit(
        self, pipe, prompt: str, negative: str, device, guidance: bool, references
    ) -> dict[str, Any]:
        """The prompt as an editing pipeline takes it, where its text encoder reads the
        reference pictures (PIL) beside the prompt; by default the prompt alone (`encode`)."""
        return self.encode(pipe, prompt, negative, device, guidance)

    def edit_latents_given(self, pipeline) -> bool:
        """Whether the editing pipeline takes its references as latents that HalfSafe's VAE
        encoder stage made (True), or encodes the pictures itself, watched by a hook (False)."""
        return True

    def edit_pixels(self, pipeline, pictures) -> list[Any]:
        """The references' pixels (1, 3, H, W) each, as the editing pipeline's VAE encoder
        takes them: by default at the job's size, as read."""
        return list(pictures.pixels.split(1))

    def probed_references(self, pipeline, pictures) -> list[Any]:
        """The references' pixels (1, 3, H, W) each that the check's VAE-encoder stage
        encodes for an edit's probe: by default at the job's size, as read (the same path at
        the probe's cost); a family whose transformer must meet each reference at the size its
        text encoder saw it reads them as its pipeline does (`edit_pixels`)."""
        return list(pictures.pixels.split(1))

    def edit_call(
        self, pipeline, embeds: dict[str, Any], batch: int, latents, pictures, size
    ) -> dict[str, Any]:
        """The editing pipeline's call arguments for `batch` images beyond the noise and
        the steps: the prompt and the references (`latents`, a list of (1, C, h, w), when
        `edit_latents_given`; else the pipeline encodes `pictures.references` itself); `size`
        is (width, height)."""
        raise NotImplementedError

    def probe_edit(self, pipe, conditioning, size: int, device, timesteps, references) -> Any:
        """The check's denoising of an edit: as `probe_denoise`, with the references' latents
        (a list of (1, C, h, w)) in the transformer's sequence beside the noise."""
        raise NotImplementedError

    def editing_picture_problem(self, pipeline, mode: Mode) -> str | None:
        """Why an editing model cannot make pictures in `mode` (image-to-image or
        inpainting). A picture given alone is one it edits (`mode_of` makes that job an edit),
        so a picture is never refused; a mask is, unless the family inpaints with it."""
        if mode is Mode.INPAINT:
            return (
                "this is an editing model: it takes no mask; give only the pictures to edit "
                "and say in the prompt what to change."
            )
        return None


class Control(_Listed):
    """A family some of whose models draw after a control picture (a depth map or an edge
    picture: Flux.1 Depth and Canny), so that a picture given alone to one is that."""

    def takes_control(self, pipeline) -> bool:
        """Whether this loaded model follows a control picture."""
        raise NotImplementedError

    def control_call(self, pipeline, latents) -> dict[str, Any]:
        """The call arguments that hand a control model the control picture's latents (1, C,
        h, w), as HalfSafe's encoder stage made them."""
        raise NotImplementedError


def editing(family) -> Editing:
    """The editing side of `family`, for a job known to be an edit (`Mode.EDIT` is only ever
    given a model `references` says edits)."""
    assert isinstance(family, Editing), f"{type(family).__name__} edits no pictures"
    return family


def control(family) -> Control:
    """The control side of `family`, for a job known to follow a control picture."""
    assert isinstance(family, Control), f"{type(family).__name__} follows no control picture"
    return family


def references(family, pipeline) -> int:
    """How many pictures the loaded `pipeline` of `family` edits at most (0: none)."""
    return family.max_references(pipeline) if isinstance(family, Editing) else 0


def controls(family, pipeline) -> bool:
    """Whether the loaded `pipeline` of `family` follows a control picture."""
    return isinstance(family, Control) and family.takes_control(pipeline)
