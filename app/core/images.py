"""Finished images: pixel diagnosis (NaN, black) and PNG files that
carry their generation parameters the way AUTOMATIC1111's web UI writes them.

numpy and PIL only; torch tensors are converted by the caller (`generation`).
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from app.core.errors import HalfSafeError
from app.core.files import write_atomic

# The names AUTOMATIC1111 writes in its `Sampler:` field for our schedulers.
SAMPLER_NAMES = {
    "euler": "Euler",
    "euler_a": "Euler a",
    "dpmpp_2m_karras": "DPM++ 2M Karras",
    "ddim": "DDIM",
}
SCHEDULER_BY_SAMPLER = {name: key for key, name in SAMPLER_NAMES.items()}

# A finite image counts as black when nearly every pixel is this dark and the picture is flat.
BLACK_LEVEL = 12 / 255
BLACK_SPREAD = 4 / 255

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
    """A decoded image as an (H, W, 3) float array in [-1, 1] -> (PIL image, PixelStats).

    Non-finite pixels become black, as every Stable Diffusion front end shows them; they are
    counted first so the diagnosis sees them.
    """
    import numpy as np
    from PIL import Image

    pixels = np.asarray(pixels, dtype=np.float32)
    finite = np.isfinite(pixels)
    bad_pixels = ~finite.all(axis=-1)
    non_finite = float(bad_pixels.mean()) if pixels.size else 0.0
    unit = np.clip(np.where(finite, pixels, -1.0) / 2 + 0.5, 0.0, 1.0)
    stats = brightness_stats(unit.mean(axis=-1)[~bad_pixels], non_finite)
    if non_finite > 0:
        rows, columns = np.nonzero(bad_pixels)
        box = (int(columns.min()), int(rows.min()), int(columns.max()) + 1, int(rows.max()) + 1)
        stats = replace(stats, non_finite_box=box)
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


def image_array(image) -> Any:
    """A PIL image as an (H, W, 3) float array in [0, 1] (what safety checkers take)."""
    import numpy as np

    return np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0


# --- AUTOMATIC1111 parameters ---------------------------------------------------------------

# A key of word characters, spaces, hyphens and slashes; a value that is a JSON string in double
# quotes or anything up to the next comma. The same rule A1111's PNG-info reader applies, with
# one difference: a key only starts the line or follows a comma (as every writer puts them).
# Without that anchor the search restarts inside every run of word characters, which takes
# quadratic time: 13 s for a 32 kB line of one word, read from a file someone handed over.
_PARAM = re.compile(r'(?:^|(?<=,))\s*(\w[\w \-/]+):\s*("(?:\\.|[^\\"])+"|[^,]*)(?:,|$)')
_NEGATIVE = "Negative prompt:"


def quote(value: Any) -> str:
    """A value as A1111 writes it: as is, or as a JSON string when it holds , : or a newline."""
    text = str(value)
    if "," not in text and ":" not in text and "\n" not in text:
        return text
    return json.dumps(text, ensure_ascii=False)


def unquote(text: str) -> str:
    if len(text) >= 2 and text[0] == '"' and text[-1] == '"':
        try:
            return str(json.loads(text))
        except ValueError:
            return text
    return text


def infotext(prompt: str, negative_prompt: str, params: Iterable[tuple[str, Any]]) -> str:
    """The `parameters` text: the prompt, a "Negative prompt:" line when there is one, then one
    line of `Key: value` pairs joined by ", " (pairs whose value is None are left out)."""
    line = ", ".join(f"{key}: {quote(value)}" for key, value in params if value is not None)
    negative = f"\n{_NEGATIVE} {negative_prompt}" if negative_prompt else ""
    return f"{prompt}{negative}\n{line}".strip()


def parse_infotext(text: str) -> tuple[str, str, dict[str, str]]:
    """Read a `parameters` text back: (prompt, negative prompt, {key: value}).

    The last line holds the pairs when at least three parse from it (as A1111 decides); the
    lines before it are the prompt, up to a line starting "Negative prompt:".
    """
    lines = text.strip().split("\n")
    last = lines[-1] if lines else ""
    pairs = _PARAM.findall(last)
    if len(pairs) >= 3:
        lines = lines[:-1]
    else:
        pairs = []
    prompt: list[str] = []
    negative: list[str] = []
    in_negative = False
    for line in lines:
        if line.startswith(_NEGATIVE):
            in_negative = True
            line = line[len(_NEGATIVE) :].strip()
        (negative if in_negative else prompt).append(line)
    params = {key.strip(): unquote(value.strip()) for key, value in pairs}
    return "\n".join(prompt).strip(), "\n".join(negative).strip(), params


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
    from PIL import Image

    with Image.open(path) as image:
        text = image.info.get("parameters")
    return text if isinstance(text, str) else None
