"""The pictures a job starts from: image-to-image's input picture and inpainting's mask, read
within bounds and made into what the pipeline and the VAE's encoder take.

A job's mode follows from what it is given and what the model is: no picture is
text-to-image, a picture is image-to-image, a picture and a mask is inpainting (white in the
mask is painted again, black is kept, as every tool has it); an editing model (Flux.1 Kontext,
Qwen-Image-Edit, Flux.2) given pictures alone edits them, its prompt saying how, with no
strength; a control model (Flux.1 Depth, Canny) given a picture follows it (a depth map or an
edge picture) while it draws from noise, with no strength either. The picture is resized to
the job's size; the mask to the same size, then made hard (0 or 1) at half grey. PIL is
imported inside the functions, so that naming a mode stays cheap (the GUI does).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, cast

from app.core.errors import BadFileError, HalfSafeError
from app.core.images.canvas import Canvas, Paste, extended_size, fit, lay_out
from app.core.settings.schema import FIELDS


class Mode(str, Enum):
    """What a job makes its pictures from. The value is the word the JSON and the PNG use."""

    TEXT = "txt2img"
    IMAGE = "img2img"
    INPAINT = "inpaint"
    EDIT = "edit"
    CONTROL = "control"

    @property
    def words(self) -> str:
        return _MODE_WORDS[self]


_MODE_WORDS = {
    Mode.TEXT: "text-to-image",
    Mode.IMAGE: "image-to-image",
    Mode.INPAINT: "inpainting",
    Mode.EDIT: "editing",
    Mode.CONTROL: "drawing after a control picture",
}

# The modes that draw from noise with every step, whatever the strength.
FROM_NOISE = (Mode.TEXT, Mode.EDIT, Mode.CONTROL)

STRENGTH_DEFAULT = 0.75  # how much of the picture is drawn again (A1111's "denoising strength")

# Why no strength applies to a picture job that draws from noise with every step, by mode (the
# Generate page's caption, and the sentence when a strength was asked for anyway).
NO_STRENGTH_BECAUSE = {
    Mode.EDIT: "An edit draws the whole picture anew from noise with every step",
    Mode.CONTROL: "A control model draws from noise with every step, after the picture",
    Mode.INPAINT: "This model draws the masked area from noise with every step",
}


def mode_of(
    images: Sequence[str],
    mask: str | None,
    references: int = 0,
    control: bool = False,
    extends: bool = False,
) -> Mode:
    """The mode of a job given these input pictures and this mask, for a model that edits up
    to `references` pictures (0: a model that does not edit), or with `control` a control model.
    A picture and a mask inpaint (whether this model inpaints is its family's to say,
    `Family.picture_problem`), and so does a picture whose canvas `extends` (outpainting, the
    new area its mask); pictures alone are what an editing model edits, the picture a
    control model follows, and image-to-image's one picture for any other model. A mask
    without a picture to mask, a mask with several pictures, more pictures than an editing
    model takes, or several for any other model is refused."""
    if extends and not images:
        raise HalfSafeError("Extending the canvas needs the picture to extend: give it too.")
    if mask is not None and not images:
        raise HalfSafeError("A mask needs the picture it masks: give the input picture too.")
    if mask is not None or extends:
        # A control model takes no mask at all: its family says so (`Family.picture_problem`)
        # whatever the number of pictures.
        if len(images) > 1 and not control:
            given = "with a mask" if mask is not None else "to extend"
            raise HalfSafeError(
                f"{len(images)} input pictures were given {given}; inpainting starts from one."
            )
        return Mode.INPAINT
    if control and images:
        if len(images) > 1:
            raise HalfSafeError(
                f"{len(images)} pictures were given; a control model follows one (a depth map "
                "or an edge picture)."
            )
        return Mode.CONTROL
    if references > 0 and images:
        if len(images) > references:
            takes = "one picture" if references == 1 else f"at most {references} pictures"
            raise HalfSafeError(
                f"{len(images)} pictures were given; this editing model takes {takes}."
            )
        return Mode.EDIT
    if len(images) > 1:
        raise HalfSafeError(
            f"{len(images)} input pictures were given; image-to-image and inpainting start "
            "from one (only an editing model takes several)."
        )
    return Mode.IMAGE if images else Mode.TEXT


def check_flags(images: Sequence[str], mask: str | None) -> None:
    """What can be refused before the model is known: a mask without a picture."""
    if mask is not None and not images:
        raise HalfSafeError("A mask needs the picture it masks: give the input picture too.")


def steps_run(steps: int, strength: float, mode: Mode) -> int:
    """How many of `steps` the pipeline runs: all for text-to-image, editing and a control
    picture (each draws the whole picture anew from noise); for a picture, the last `strength`
    of the schedule (as every diffusers picture pipeline counts them)."""
    if mode in FROM_NOISE:
        return steps
    return min(int(steps * strength), steps)


def check_strength(steps: int, strength: float, mode: Mode) -> None:
    """Refuse a strength outside (0, 1], or one so small that no step runs."""
    if mode in FROM_NOISE:
        return
    if not isinstance(strength, (int, float)) or not 0.0 < strength <= 1.0:
        raise HalfSafeError(
            f"Strength: {strength!r} is not between 0 and 1 (0.75 redraws three quarters)."
        )
    if steps_run(steps, strength, mode) < 1:
        raise HalfSafeError(
            f"Strength: {strength:g} of {steps} steps runs no step; raise the strength or the "
            "steps."
        )


@dataclass(frozen=True)
class Pictures:
    """A job's input, made ready: `pixels` (N, 3, H, W) float32 in [-1, 1] (one picture; for
    editing, one row per reference) and, for inpainting, `mask` (1, 1, H, W) float32, 1 where
    the picture is painted again, with `mask_image` the same as a greyscale PIL image (what a
    pipeline's mask processor takes). `references` are the pictures as RGB PIL images (what an
    editing model's text encoder reads beside the prompt). All on the CPU; `sources` are the
    files they came from. `paste` says where an inpainting job's result goes back into the
    picture (`canvas.Paste`): every inpainting job's images are blended in through it."""

    mode: Mode
    pixels: Any
    mask: Any | None
    mask_image: Any | None
    sources: tuple[str, ...]
    references: tuple[Any, ...] = ()
    paste: Paste | None = None

    def masked_pixels(self) -> Any:
        """The picture with the part to paint again set to grey (0), as inpainting models
        take it."""
        if self.mask is None:
            raise ValueError("only an inpainting job's pictures have a mask")
        return self.pixels * (self.mask < 0.5)


def read_pictures(
    images: Sequence[str],
    mask: str | None,
    width: int,
    height: int,
    references: int = 0,
    control: bool = False,
    canvas: Canvas | None = None,
) -> Pictures | None:
    """The input pictures (and mask) at `width` x `height`, or None for text-to-image;
    `references` and `control` as `mode_of` takes them. An inpainting job is laid out by
    `canvas` (`canvas.lay_out`: the whole picture by default; only the mask's box; the canvas
    extended). A file that is not a readable picture within the bounds is one sentence naming
    it."""
    canvas = (canvas or Canvas()).checked()
    mode = mode_of(images, mask, references, control, canvas.extends)
    if mode is Mode.TEXT:
        return None
    sources = tuple(str(image) for image in images)
    if mode is Mode.INPAINT:
        return _inpainting(Path(images[0]).expanduser(), mask, width, height, canvas, sources)
    opened = [fit(_decode(Path(image).expanduser(), "RGB"), width, height) for image in images]
    kept = tuple(opened) if mode is Mode.EDIT else ()
    return Pictures(mode, _pixels(opened), None, None, sources, kept)


def _pixels(pictures: Sequence[Any]):
    """RGB PIL pictures of one size as a (N, 3, H, W) float32 tensor in [-1, 1]."""
    import numpy as np
    import torch

    unit = np.stack([np.asarray(picture, dtype=np.float32) for picture in pictures]) / 255.0
    return (torch.from_numpy(unit).permute(0, 3, 1, 2) * 2.0 - 1.0).contiguous()


def _inpainting(
    image: Path, mask: str | None, width: int, height: int, canvas: Canvas, sources: tuple
) -> Pictures:
    """An inpainting job's picture and hard mask at the job's size, laid out by `canvas`."""
    import numpy as np
    import torch
    from PIL import Image

    from app.core.images.finished import MAX_PIXELS  # the image reader's bound

    picture = _decode(image, "RGB")
    wide, high = extended_size(picture.size, canvas.extend)
    if wide * high > MAX_PIXELS:
        raise BadFileError(
            image,
            f"is {picture.size[0]}x{picture.size[1]} pixels; extended it would be "
            f"{wide}x{high}, past the {MAX_PIXELS // 1_000_000} million pixels HalfSafe draws "
            "on: extend it less.",
        )
    if mask is not None:
        mask_path = Path(mask).expanduser()
        grey = _mask_decoded(mask_path)
        sources += (str(mask),)
    else:
        mask_path = image
        grey = Image.new("L", picture.size, 0)
    shown = grey.size
    if (canvas.extends or canvas.only_masked) and grey.size != picture.size:
        grey = grey.resize(picture.size, Image.Resampling.BILINEAR)
    drawn, drawn_mask, paste = lay_out(picture, grey, canvas, width, height)
    hard = (np.asarray(drawn_mask, dtype=np.float32) >= 128.0).astype(np.float32)
    if not hard.any():
        raise BadFileError(
            mask_path,
            f"the mask's white is too small to outlast scaling it from {shown[0]}x{shown[1]} "
            f"to {width}x{height} px, so nothing would be painted: paint a larger area.",
        )
    mask_image = Image.fromarray((hard * 255).astype(np.uint8), "L")
    mask_tensor = torch.from_numpy(hard)[None, None]
    return Pictures(Mode.INPAINT, _pixels([drawn]), mask_tensor, mask_image, sources, (), paste)


def check_picture_files(images: Sequence[str], mask: str | None) -> None:
    """Refuse, before a model is loaded, an input picture or mask that the job would refuse
    after loading it: each file is decoded in full within the bounds (a truncated or damaged
    picture, a file of another kind whatever its name), and the mask must paint something.
    One sentence naming the file (BadFileError). Decodes each file once at its own size
    (at most `images.MAX_PIXELS`) and keeps nothing; whether the mask's white outlasts scaling
    is known only at the job's size (`read_pictures`)."""
    for image in images:
        with _opened(Path(image).expanduser()) as opened:
            opened.load()
    if mask is not None:
        _mask_decoded(Path(mask).expanduser())


def picture_header(path: str | Path) -> tuple[int, int]:
    """A picture file's width and height as it is shown (its EXIF orientation applied), read
    from its header within the bounds: a file that is no picture, or one of more pixels than
    HalfSafe reads, is one sentence naming it."""
    file = Path(path).expanduser()
    with _opened(file) as image:
        return _upright_size(image)


def picture_size(
    path: str | Path,
    native: int,
    width: int | None = None,
    height: int | None = None,
    extend: tuple[int, int, int, int] = (0, 0, 0, 0),
) -> tuple[int, int]:
    """The size to draw a picture at: `width` and `height` where the user gave them, a side
    left out following the picture's proportions (its longer side the model's `native` size
    when neither is given), with `extend` (left, top, right, bottom) pixels added to its
    canvas. Each side is a multiple of 16 (every family's grid divides it) and at least the
    smallest size, the other side growing with it to keep the proportions; a picture too
    narrow for that within the largest size is one sentence naming it."""
    if width and height:
        return int(width), int(height)
    shown = picture_header(path)
    w, h = extended_size(shown, extend)
    if width:
        scale = int(width) / w
    elif height:
        scale = int(height) / h
    else:
        scale = native / max(w, h)
    scale = max(scale, MIN_SIDE / min(w, h))  # the short side no smaller than the smallest
    sides = [round(side * scale / SIDE_STEP) * SIDE_STEP for side in (w, h)]
    if width:
        sides[0] = int(width)
    if height:
        sides[1] = int(height)
    if max(sides) > MAX_SIDE:
        raise BadFileError(
            Path(path).expanduser(),
            f"is {shown[0]}x{shown[1]} pixels{f' ({w}x{h} extended)' if any(extend) else ''}; "
            f"drawn at its proportions it would be {sides[0]}x{sides[1]} px, past the largest "
            f"side, {MAX_SIDE} px: give the width and height to draw it at.",
        )
    return sides[0], sides[1]


# The sizes a picture is drawn at when it sets them (`picture_size`): the width and height
# settings' bounds, on the grid every family divides.
MIN_SIDE = int(cast(float, FIELDS["width"].minimum))
MAX_SIDE = int(cast(float, FIELDS["width"].maximum))
SIDE_STEP = 16

# EXIF orientations that turn the picture a quarter turn (width and height swap).
_QUARTER_TURNS = (5, 6, 7, 8)
_EXIF_ORIENTATION = 0x0112


@contextmanager
def _opened(path: Path):
    """The picture file opened lazily (its header read, nothing decoded), its pixel count
    within the bounds of the image reader; any failure is one sentence naming the file."""
    import warnings

    from PIL import Image, UnidentifiedImageError

    from app.core.images.finished import (  # the image reader's bounds
        MAX_PIXELS,
        open_picture,
        read_head,
    )

    read_head(path)  # a file, and not larger than a picture can be
    too_many = f"input pictures of 1 to {MAX_PIXELS // 1_000_000} million pixels are read."
    try:
        with warnings.catch_warnings():
            # Counted against HalfSafe's own bound below, before anything is decoded.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = open_picture(path)  # PNG, JPEG or WebP only: no reader that runs a program
    except UnidentifiedImageError:
        raise BadFileError(path, "not a picture HalfSafe can read (PNG, JPEG or WebP).") from None
    except Image.DecompressionBombError:  # past twice Pillow's MAX_IMAGE_PIXELS
        bomb = 2 * (Image.MAX_IMAGE_PIXELS or 0) // 1_000_000
        raise BadFileError(path, f"says it has over {bomb} million pixels; {too_many}") from None
    except (OSError, ValueError) as error:
        raise BadFileError(path, f"the picture cannot be read ({error}).") from None
    with image:
        w, h = image.size
        if not w or not h or w * h > MAX_PIXELS:
            raise BadFileError(path, f"says it is {w}x{h} pixels; {too_many}")
        try:
            yield image
        except (OSError, ValueError, SyntaxError) as error:
            # Pillow raises these from a damaged file's data (SyntaxError from a bad header
            # field read late).
            raise BadFileError(path, _damage_words(error)) from None


def _damage_words(error: BaseException) -> str:
    """Why a picture's data cannot be decoded, completing "<file>: "."""
    text = str(error).strip() or type(error).__name__
    if "truncated" in text.lower():
        return "the picture cannot be read: the file ends before its pixels do (truncated)."
    return f"the picture cannot be read ({text.rstrip('.')})."


def _upright_size(image) -> tuple[int, int]:
    w, h = image.size
    if _header_exif(image) and image.getexif().get(_EXIF_ORIENTATION) in _QUARTER_TURNS:
        return h, w
    return w, h


def _header_exif(image) -> bool:
    """Whether the file's EXIF was read with its header (a JPEG's or WebP's, a PNG's eXIf
    chunk before its pixels). Only that EXIF turns a picture: Pillow looks for a PNG's
    elsewhere by decoding the whole picture, which a header read must not do."""
    return "exif" in image.info


def _decode(path: Path, kind: str):
    """A picture file decoded as `kind` ("RGB" or "L"), upright as its EXIF says, at its own
    size. A 16-bit greyscale picture is brought to 8 bits by its top byte (Pillow's own
    conversion clips it, turning nearly all of it white)."""
    from PIL import Image, ImageOps

    with _opened(path) as image:
        turns = _header_exif(image)  # as `picture_header` sizes it
        image.load()
        upright = (ImageOps.exif_transpose(image) if turns else None) or image
        if upright.mode.startswith("I"):  # "I;16", "I;16B" and "I" (16-bit values held wider)
            import numpy as np

            wide = np.asarray(upright, dtype=np.uint32).clip(0, 65535)
            upright = Image.fromarray((wide >> 8).astype(np.uint8), "L")
        return upright.convert(kind)


def _mask_decoded(path: Path):
    """The mask file decoded as greyscale at its own size; a mask with no pixel as light as
    half grey paints nothing, and is one sentence naming it."""
    grey = _decode(path, "L")
    if not any(grey.histogram()[128:]):
        raise BadFileError(
            path, "the mask is black all over, so nothing would be painted (white is painted)."
        )
    return grey
