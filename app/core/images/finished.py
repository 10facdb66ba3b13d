"""Finished images: pixel diagnosis (NaN, black, one flat colour) and PNG files that
carry their generation parameters the way AUTOMATIC1111's web UI writes them.

numpy and PIL only; torch tensors are converted by the caller (`generation`).
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from app.core.errors import BadFileError, HalfSafeError
from app.core.files import write_atomic
from app.core.images.channels import channel_all
from app.core.limits import MAX_PIXELS as MAX_PIXELS  # the bound on a picture, read here too

# Bounds on an image file HalfSafe reads (one to explain, an input picture), checked before it
# is decoded: a generated picture is a few MB (and `MAX_PIXELS`, from limits).
MAX_IMAGE_BYTES = 512 << 20
# The formats a picture is opened in (an input picture, a mask, an image to explain): what
# generated pictures and photos come as (a JPEG holding several pictures, MPO, is opened by the
# JPEG reader). Left to itself Pillow tries every format it knows, whatever the file's name, and
# its EPS reader hands the file to Ghostscript, an outside program that runs it.
PICTURE_FORMATS = ("PNG", "JPEG", "WEBP")


def read_head(path: Path) -> bytes:
    """The first 16 bytes of an image file (its kind), within the file-size bound."""
    try:
        if not path.is_file():
            raise BadFileError(path, "not a file (no such file, or a folder).")
        size = path.stat().st_size
        if size > MAX_IMAGE_BYTES:
            raise BadFileError(
                path,
                f"a file of {size / 2**20:.0f} MB; a generated image is far smaller than "
                f"{MAX_IMAGE_BYTES >> 20} MB, so it is not read.",
            )
        with path.open("rb") as file:
            return file.read(16)
    except OSError as error:
        raise BadFileError(path, f"cannot be read ({error.strerror or error}).") from None


def open_picture(path: str | Path, formats: tuple[str, ...] = PICTURE_FORMATS) -> Any:
    """The picture file opened by Pillow as one of `formats` (of PICTURE_FORMATS), lazily: its
    header read, nothing decoded. Any other file, whatever its name says, raises Pillow's
    UnidentifiedImageError (an OSError) without another reader seeing it."""
    from PIL import Image

    return Image.open(path, formats=list(formats))


# A finite image counts as black when nearly every pixel is this dark and the picture is flat.
BLACK_LEVEL = 12 / 255
BLACK_SPREAD = 4 / 255

# A picture, or a region of it, that is one exact colour: what a tool that replaces NaN with
# zeros writes instead of black. Measured with HalfSafe's tiny VAEs (tests/core/
# test_explain_flat.py): all-zero latents decode to one exact colour inside a band of
# structure along the edges (zero padding), 18-23% of a 256 px picture, 47-52% at 512 px,
# 63-65% at 768 px; NaN replaced by 0 after decoding is exact mid-grey everywhere it was.
# An ordinary decoded picture's most common colour covers well under 1%.
FLAT_SHARE = 0.10
# 0 in the decoder's [-1, 1] range, written as 8 bits: 127.5, truncated (A1111, ComfyUI) or
# rounded (diffusers, HalfSafe).
MID_GREY = (127, 128)
# A colour whose every channel is 0 or 255 is clipping (a blown-out white background), not a
# value a NaN became: all-zero pixels are NaN-black already, by their own rule.
_CLIPPED = (0, 255)
# The most common colour is looked for among at most this many evenly spaced pixels, then
# counted exactly over the whole picture.
_FLAT_SAMPLE = 1 << 20


class ImageSaveError(HalfSafeError):
    """An image could not be written. The images stay available on `result` (a
    `generation.GenerationResult` whose entries keep their PIL images) to be saved elsewhere."""

    def __init__(self, message: str, result: Any = None) -> None:
        super().__init__(message)
        self.result = result


# --- pixels --------------------------------------------------------------------------------


@dataclass(frozen=True)
class PixelStats:
    """What the finished pixels say. Brightness figures are over the finite pixels, 0..1."""

    non_finite: float  # fraction of pixels with a NaN or inf in any channel
    mean: float
    spread: float  # standard deviation of brightness
    bright: float  # 99.5th percentile of brightness
    # The smallest box (x0, y0, x1, y1; ends exclusive, in pixels) holding every non-finite
    # pixel: a few bad tiles of a tiled decode are a finding with a place, never averaged away.
    non_finite_box: tuple[int, int, int, int] | None = None

    @property
    def all_non_finite(self) -> bool:
        return self.non_finite >= 1.0

    @property
    def near_black(self) -> bool:
        """Uniform and near-black, though finite: a blank picture, not a dark one with detail."""
        return self.non_finite == 0 and self.bright <= BLACK_LEVEL and self.spread <= BLACK_SPREAD


def to_image(pixels) -> tuple[Any, PixelStats]:
    """A decoded image as an (H, W, 3) float array in [-1, 1], or (H, W, 4) from a VAE that
    decodes RGBA -> (PIL image, RGB or RGBA, PixelStats).

    Non-finite pixels become black, as every Stable Diffusion front end shows them; they are
    counted first so the diagnosis sees them.

    The alpha channel is written to the picture and judged by nothing: the NaN count, the
    brightness figures and so the black/flat status are of the colour channels, as for an RGB
    picture. It comes out of the same last convolution as the colours, so a non-finite input
    there shows in the colours too (and a NaN weight of its own is the load-time weight scan's
    to find). A non-finite alpha is written opaque, so a NaN pixel shows black as elsewhere.
    """
    import numpy as np
    from PIL import Image

    pixels = np.asarray(pixels, dtype=np.float32)
    alpha = pixels[..., 3] if pixels.ndim == 3 and pixels.shape[-1] == 4 else None
    pixels = pixels[..., :3]
    finite = np.isfinite(pixels)
    bad_pixels = ~finite.all(axis=-1)
    non_finite = float(bad_pixels.mean()) if pixels.size else 0.0
    unit = np.clip(np.where(finite, pixels, -1.0) / 2 + 0.5, 0.0, 1.0)
    stats = brightness_stats(unit.mean(axis=-1)[~bad_pixels], non_finite)
    if non_finite > 0:
        rows, columns = np.nonzero(bad_pixels)
        box = (int(columns.min()), int(rows.min()), int(columns.max()) + 1, int(rows.max()) + 1)
        stats = replace(stats, non_finite_box=box)
    if alpha is not None:
        opacity = np.clip(np.where(np.isfinite(alpha), alpha, 1.0) / 2 + 0.5, 0.0, 1.0)
        rgba = np.concatenate([unit, opacity[..., None]], axis=-1)
        return Image.fromarray((rgba * 255).round().astype(np.uint8), "RGBA"), stats
    image = Image.fromarray((unit * 255).round().astype(np.uint8), "RGB")
    return image, stats


def brightness_stats(brightness, non_finite: float = 0.0) -> PixelStats:
    """PixelStats of the finite pixels' brightness values (any shape, 0..1)."""
    import numpy as np

    brightness = np.asarray(brightness, dtype=np.float32).ravel()
    if not brightness.size:
        return PixelStats(non_finite=non_finite, mean=0.0, spread=0.0, bright=0.0)
    return PixelStats(
        non_finite=non_finite,
        mean=float(brightness.mean()),
        spread=float(brightness.std()),
        bright=float(np.percentile(brightness, 99.5)),
    )


@dataclass(frozen=True)
class FlatRegion:
    """The picture's most common colour, when it is one exact value over a large share of it."""

    colour: tuple[int, int, int]  # 8-bit RGB
    share: float  # fraction of the picture's pixels that are exactly `colour`, 0..1
    box: tuple[int, int, int, int]  # smallest box (x0, y0, x1, y1; ends exclusive) holding them

    @property
    def mid_grey(self) -> bool:
        """Exact mid-grey (127 or 128 in every channel): a NaN replaced by 0 after decoding."""
        return len(set(self.colour)) == 1 and self.colour[0] in MID_GREY


def flat_region(rgb, where=None) -> FlatRegion | None:
    """The colour that is exactly the same over at least FLAT_SHARE of an (H, W, 3) uint8
    picture, or None. Exact equality, not low variance: a dark or smooth picture still varies
    in its last bit. A colour whose every channel is 0 or 255 (clipping) is not counted.
    `where`: an (H, W) bool array of the pixels to judge (those that show), else all; the share
    is of those."""
    import numpy as np

    rgb = np.asarray(rgb)
    if rgb.ndim != 3 or rgb.shape[-1] != 3 or not rgb.size:
        return None
    if where is not None and not where.any():
        return None
    height, width = rgb.shape[:2]
    step = max(1, int(np.ceil(np.sqrt(height * width / _FLAT_SAMPLE))))
    sample = rgb[::step, ::step]
    if where is not None:
        sample = sample[where[::step, ::step]]
    sample = sample.reshape(-1, 3).astype(np.uint32)
    codes = (sample[:, 0] << 16) | (sample[:, 1] << 8) | sample[:, 2]
    values, counts = np.unique(codes, return_counts=True)
    for code in values[np.argsort(counts)[::-1][:4]]:
        colour = (int(code >> 16), int((code >> 8) & 255), int(code & 255))
        if all(c in _CLIPPED for c in colour):
            continue
        same = channel_all(rgb == np.array(colour, dtype=rgb.dtype))
        if where is not None:
            same &= where
        share = float(same.sum() / (where.sum() if where is not None else same.size))
        if share < FLAT_SHARE:
            return None
        rows = np.flatnonzero(same.any(axis=1))
        columns = np.flatnonzero(same.any(axis=0))
        box = (int(columns[0]), int(rows[0]), int(columns[-1]) + 1, int(rows[-1]) + 1)
        return FlatRegion(colour, share, box)
    return None


def image_array(image) -> Any:
    """A PIL image as an (H, W, 3) float array in [0, 1] (what safety checkers take)."""
    import numpy as np

    return np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0


# --- PNG files -------------------------------------------------------------------------------

_NUMBERED = re.compile(r"^(\d+)-")


def next_number(folder: Path) -> int:
    """One past the highest leading number of the files in `folder` (A1111's numbering)."""
    highest = 0
    try:
        names = [entry.name for entry in folder.iterdir()]
    except OSError:
        names = []
    for name in names:
        match = _NUMBERED.match(name)
        if match:
            highest = max(highest, int(match.group(1)))
    return highest + 1


def png_bytes(image, parameters: str | None = None) -> bytes:
    """The image as PNG, with `parameters` in a text chunk (tEXt, or iTXt beyond Latin-1)."""
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    if parameters:
        info.add_text("parameters", parameters)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", pnginfo=info)
    return buffer.getvalue()


def save_png(image, folder: str | Path, seed: int, parameters: str | None = None) -> Path:
    """Write `image` as `<folder>/<NNNNN>-<seed>.png`, atomically and never over another file.

    The number is one past the highest in the folder; if the name is taken meanwhile, the next
    one is tried. Raises ImageSaveError with one plain sentence when the folder cannot be
    created or written, or its name cannot be a folder at all (a NUL byte); the sentence does
    not say what became of the image, which is the caller's to say.
    """
    try:
        folder = Path(folder).expanduser()
        folder.mkdir(parents=True, exist_ok=True)
    except (OSError, ValueError) as error:  # ValueError: a NUL byte in the name
        raise _save_error(folder, error) from None
    if not folder.is_dir():
        raise ImageSaveError(f"Cannot save images in {folder}: it is a file, not a folder.")
    data = png_bytes(image, parameters)
    number = next_number(folder)
    for _ in range(10_000):
        path = folder / f"{number:05d}-{seed}.png"
        try:
            return write_atomic(path, data, overwrite=False, shared=True)
        except FileExistsError:
            number += 1
        except OSError as error:
            raise _save_error(folder, error) from None
    raise ImageSaveError(f"Cannot save images in {folder}: no free file name was found.")


def _save_error(folder: str | Path, error: OSError | ValueError) -> ImageSaveError:
    if isinstance(error, ValueError):
        reason = "a folder name cannot contain a NUL character"
    else:
        reason = error.strerror or str(error)
    shown = str(folder).replace("\0", "\\0")  # never print a NUL to the terminal
    return ImageSaveError(f"Cannot save images in {shown} ({reason}).")


def read_parameters(path: str | Path) -> str | None:
    """The `parameters` text of a PNG file, or None when it has none."""
    with open_picture(path, ("PNG",)) as image:
        text = image.info.get("parameters")
    return text if isinstance(text, str) else None
