"""The image file handed to `explain`, read within bounds: a PNG chunk by chunk (its size and
text chunks), a JPEG's or WebP's EXIF (the record other tools keep there), and what its pixels
say (NaN-black, one flat colour, black, or fine).

Every chunk of the file is hostile until read: the PNG is walked chunk by chunk with bounds on
the file, each chunk, all text together and decompressed text; any breach is one sentence
naming the file (BadFileError). Nothing is written.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, replace
from pathlib import Path

from app.core.errors import BadFileError
from app.core.explain.pixels import PixelFigures
from app.core.images.finished import MAX_IMAGE_BYTES, MAX_PIXELS, open_picture

# Bounds on an image handed to `explain` beyond the file's size and pixel count (those are
# `images.MAX_IMAGE_BYTES` and `images.MAX_PIXELS`, shared with input pictures). A generated
# PNG's text is a few kB; ComfyUI's workflow JSON reaches a few MB for large graphs (4.5 MB
# seen), written twice (prompt and workflow).
MAX_CHUNKS = 100_000
MAX_TEXT_CHUNK_BYTES = 16 << 20  # one text chunk, as stored and after decompression
MAX_TEXT_TOTAL_BYTES = 32 << 20  # all text chunks together, decompressed

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp")


# --- the file ----------------------------------------------------------------------------------


def is_image_path(path: str | Path) -> bool:
    """Whether a dropped or opened file is an image for `explain` rather than a model."""
    return Path(str(path)).suffix.lower() in IMAGE_SUFFIXES


# --- the PNG, chunk by chunk -------------------------------------------------------------------


@dataclass
class PngFacts:
    width: int
    height: int
    text: dict[str, str]  # text chunks by keyword (the first of each keyword wins)


def read_png(path: str | Path) -> PngFacts:
    """The size and text chunks (tEXt, zTXt, iTXt) of a PNG, read chunk by chunk within the
    bounds above; pixel data is skipped, not read. Raises BadFileError with one sentence for a
    missing, oversized, truncated, damaged or non-PNG file."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if not path.is_file():
            raise BadFileError(path, "not a file.")
        if size > MAX_IMAGE_BYTES:
            raise BadFileError(
                path,
                f"a file of {size / 2**20:.0f} MB; a generated image is far smaller than "
                f"{MAX_IMAGE_BYTES >> 20} MB, so it is not read.",
            )
        with path.open("rb") as file:
            return _read_png(path, file, size)
    except OSError as error:
        raise BadFileError(path, f"cannot be read ({error.strerror or error}).") from None


def _read_png(path: Path, file, size: int) -> PngFacts:
    if file.read(8) != PNG_SIGNATURE:
        raise BadFileError(path, "not a PNG image (its first bytes are not PNG's signature).")
    text: dict[str, str] = {}
    total_text = 0
    width = height = 0
    for count in range(MAX_CHUNKS + 1):
        if count == MAX_CHUNKS:
            raise BadFileError(path, f"holds more than {MAX_CHUNKS} PNG chunks; it is not read.")
        head = file.read(8)
        if len(head) < 8:
            raise BadFileError(path, "truncated: the PNG ends before its IEND chunk.")
        length, kind = struct.unpack(">I4s", head)
        if length > size - file.tell():
            raise BadFileError(
                path,
                f"truncated or damaged: its {_kind(kind)} chunk claims {length} bytes, "
                "more than the file has left.",
            )
        if kind in (b"tEXt", b"zTXt", b"iTXt") or kind == b"IHDR":
            if length > MAX_TEXT_CHUNK_BYTES:
                raise BadFileError(
                    path,
                    f"has a {_kind(kind)} chunk of {length >> 20} MB; text chunks over "
                    f"{MAX_TEXT_CHUNK_BYTES >> 20} MB are not read.",
                )
            data = file.read(length)
            crc = file.read(4)
            if len(crc) < 4 or zlib.crc32(kind + data) != struct.unpack(">I", crc)[0]:
                raise BadFileError(path, f"damaged: its {_kind(kind)} chunk fails its checksum.")
        else:
            file.seek(length + 4, 1)
            data = b""
        if count == 0 and kind != b"IHDR":
            raise BadFileError(path, "damaged: a PNG must start with its IHDR chunk.")
        if kind == b"IHDR":
            if length != 13:
                raise BadFileError(path, "damaged: its IHDR chunk is not 13 bytes.")
            width, height = struct.unpack(">II", data[:8])
            if not width or not height or width * height > MAX_PIXELS:
                raise BadFileError(
                    path,
                    f"says it is {width}x{height} pixels; explain reads images of 1 to "
                    f"{MAX_PIXELS // 1_000_000} million pixels.",
                )
        elif kind in (b"tEXt", b"zTXt", b"iTXt"):
            keyword, value = _text_chunk(path, kind, data)
            total_text += len(value)
            if total_text > MAX_TEXT_TOTAL_BYTES:
                raise BadFileError(
                    path,
                    f"holds more than {MAX_TEXT_TOTAL_BYTES >> 20} MB of text chunks; "
                    "it is not read.",
                )
            text.setdefault(keyword, value)
        elif kind == b"IEND":
            return PngFacts(width, height, text)
    raise AssertionError("unreachable")


def _kind(kind: bytes) -> str:
    shown = kind.decode("latin-1")
    return shown if shown.isalnum() else repr(kind)


def _text_chunk(path: Path, kind: bytes, data: bytes) -> tuple[str, str]:
    keyword, sep, rest = data.partition(b"\0")
    if not sep or not 1 <= len(keyword) <= 79:
        raise BadFileError(path, f"damaged: a {_kind(kind)} chunk has no valid keyword.")
    name = keyword.decode("latin-1")
    if kind == b"tEXt":
        return name, rest.decode("latin-1")
    if kind == b"zTXt":
        if not rest or rest[0] != 0:
            raise BadFileError(path, f"damaged: its {name!r} text uses an unknown compression.")
        return name, _inflate(path, name, rest[1:]).decode("latin-1")
    # iTXt: compression flag, method, language tag \0, translated keyword \0, UTF-8 text.
    if len(rest) < 2:
        raise BadFileError(path, f"damaged: its {name!r} text chunk is cut short.")
    compressed, method, tail = rest[0], rest[1], rest[2:]
    _language, sep1, tail = tail.partition(b"\0")
    _translated, sep2, body = tail.partition(b"\0")
    if not (sep1 and sep2) or compressed not in (0, 1) or (compressed and method != 0):
        raise BadFileError(path, f"damaged: its {name!r} text chunk is malformed.")
    if compressed:
        body = _inflate(path, name, body)
    try:
        return name, body.decode("utf-8")
    except UnicodeDecodeError:
        raise BadFileError(path, f"damaged: its {name!r} text is not valid UTF-8.") from None


def _inflate(path: Path, name: str, data: bytes) -> bytes:
    """Decompress at most MAX_TEXT_CHUNK_BYTES: a zip bomb stops at the bound."""
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(data, MAX_TEXT_CHUNK_BYTES)
    except zlib.error:
        raise BadFileError(path, f"damaged: its {name!r} text cannot be decompressed.") from None
    if inflater.unconsumed_tail:
        raise BadFileError(
            path,
            f"has a {name!r} text chunk that inflates past {MAX_TEXT_CHUNK_BYTES >> 20} MB; "
            "it is not read.",
        )
    return out


# --- pixels ------------------------------------------------------------------------------------


def pixel_status(path: str | Path, facts: PngFacts | None = None) -> tuple[str, PixelFigures]:
    """What the pixels say, from the pixels alone: "nan", "rgb_static", "saturated", "flat",
    "black", "tiled_noise", "noise", "false_colour", "noise_region" or "ok", in that order of
    precedence, with the figures.

    The rule: NaN becomes 0 when a tool writes its image as 8-bit (NumPy's cast, which
    A1111, ComfyUI, diffusers and HalfSafe all use), so an image whose every colour value is
    exactly 0 is NaN-black. A decoded picture, however dark, carries the VAE's noise and is
    never exactly 0 everywhere. A finite image that is near-black and flat by
    `images.PixelStats.near_black` (99.5% of pixels at most 12/255 bright, spread at most
    4/255) is "black": a dark picture, or a blank. A safety checker's blank is also all
    zeros; only the generation record can tell it apart (see `explain_image`).

    A picture that is one exact colour over at least a tenth of it (`images.flat_region`;
    clipped white aside) is "flat": what a tool that replaces NaN with zeros writes instead
    of black (exact mid-grey when it happened after decoding; another colour framed by a band
    of structure along the edges when all-zero latents were decoded), and also what a
    solid-colour design looks like. Only the generation record tells which (`explain_image`).

    A picture with an alpha channel (Qwen-Image 2.1 decodes RGBA) is judged by the pixels that
    show (alpha above 0): a cut-out's transparent background, whatever colour it is written
    in, is not black, flat or saturated. Coloured noise is measured only on a picture every
    pixel of which shows. A picture with nothing showing is judged as stored.

    Saturated and coloured noise are `signatures`: almost every pixel with every channel at 0
    or 255 (values that overflowed to infinity, clipped), and a picture with no large shapes
    whose neighbouring pixels differ in colour more than in brightness. A white or noisy design
    looks the same; again only the record tells which. A picture with such noise in one box
    only, the rest a picture, is "noise_region" (`regions`: a second pass's).

    Tiled noise, RGB static and false colour are `looks`: what a tool's fast path draws when it
    fails (a low-bit kernel wrong per tile, weights paged back wrong), each measured only on a
    picture every pixel of which shows.
    """
    import numpy as np
    from PIL import Image, PngImagePlugin, UnidentifiedImageError

    # PIL refuses a compressed text chunk past 1 MB while it opens a PNG, a legitimate large
    # ComfyUI workflow included. `read_png` has already held every chunk to the bounds above
    # (zip bombs stop there), so PIL gets the same ones.
    PngImagePlugin.MAX_TEXT_CHUNK = max(PngImagePlugin.MAX_TEXT_CHUNK, MAX_TEXT_CHUNK_BYTES)
    PngImagePlugin.MAX_TEXT_MEMORY = max(PngImagePlugin.MAX_TEXT_MEMORY, MAX_TEXT_TOTAL_BYTES)
    path = Path(path)
    if facts is not None and facts.width * facts.height > MAX_PIXELS:
        raise BadFileError(path, "too large to read.")
    try:
        with open_picture(path) as image:
            if image.width * image.height > MAX_PIXELS:
                raise BadFileError(path, "too large to read.")
            alpha = None
            if image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info:
                rgba = np.asarray(image.convert("RGBA"))
                rgb, alpha = rgba[..., :3], rgba[..., 3]
            else:
                rgb = np.asarray(image.convert("RGB"))
    except BadFileError:
        raise
    except UnidentifiedImageError:
        raise BadFileError(
            path, "not a PNG, JPEG or WebP image, the kinds explain reads."
        ) from None
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as error:
        raise BadFileError(path, f"its pixels cannot be decoded ({_short(error)}).") from None
    return picture_status(rgb, alpha)


def picture_status(rgb, alpha=None) -> tuple[str, PixelFigures]:
    """`pixel_status` of pixels in memory: an (H, W, 3) uint8 array and its (H, W) alpha, if
    any."""

    from app.core.explain import designs, looks, regions, signatures
    from app.core.images.finished import brightness_stats, flat_region

    # Only what shows is judged: a transparent pixel's colour is never seen (a cut-out's
    # background is often written 0, which must not make it read as black). A picture with no
    # pixel showing at all (NaN written as zeros in every channel, alpha included) is judged
    # as stored.
    visible = alpha > 0 if alpha is not None and alpha.any() else None
    shown = rgb[visible] if visible is not None else rgb
    zero = not shown.any()
    stats = brightness_stats(shown.mean(axis=-1) / 255.0)
    flat = None if zero else flat_region(rgb, visible)
    # Noise is measured over whole blocks of neighbouring pixels: only where every one shows.
    whole = visible is None or bool(visible.all())
    # RGB static before saturation: static whose every channel is 0 or 255 is saturated too,
    # but an overflow keeps its shapes and static has none (`looks`).
    static = None if zero or not whole else looks.static(rgb)
    saturated = None if zero or static else signatures.saturated(shown.reshape(1, -1, 3))
    noise = None if zero or saturated or static or flat or not whole else signatures.noise(rgb)
    fine = not (zero or static or saturated or flat or stats.near_black)
    # A repeat or blocks at a kernel's tile size before coloured noise (blocks are noise too),
    # and false colour after it (it is smooth, noise is not).
    tiled = looks.tiled(rgb) if whole and fine else None
    coloured = noise is not None and noise.coloured_noise
    false = looks.false_colour(rgb) if whole and fine and not tiled and not coloured else None
    # A box of noise in a picture that is otherwise fine (`regions`): a second pass's.
    region = None
    if whole and fine and not (tiled or coloured or false):
        region = regions.noisy_region(rgb)
    figures = PixelFigures(
        width=int(rgb.shape[1]),
        height=int(rgb.shape[0]),
        transparent=round(float((alpha == 0).mean()), 4) if alpha is not None else 0.0,
        all_zero=bool(zero),
        mean=round(stats.mean, 4),
        spread=round(stats.spread, 4),
        bright=round(stats.bright, 4),
        flat=flat,
        saturated=saturated,
        noise=noise,
        noise_region=region,
        tiled=tiled,
        static=static,
        false_colour=false,
    )
    status = _status(zero, static, saturated, flat, stats.near_black, tiled, coloured, false)
    if status is None:
        status = "noise_region" if region is not None else "ok"
    if status in ("flat", *designs.NEEDS_EVIDENCE):
        # What a picture made so on purpose cannot show, for the verdict (`designs`).
        figures = replace(figures, design=designs.design(status, rgb, figures))
    return status, figures


def _status(zero, static, saturated, flat, near_black, tiled, coloured, false) -> str | None:
    """The pixels' status in its order of precedence, or None for a picture."""
    ranked = (
        (zero, "nan"),
        (static is not None, "rgb_static"),
        (saturated is not None, "saturated"),
        (flat is not None, "flat"),
        (near_black, "black"),
        (tiled is not None, "tiled_noise"),
        (coloured, "noise"),
        (false is not None, "false_colour"),
    )
    return next((status for found, status in ranked if found), None)


def _short(error: BaseException) -> str:
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return text[:160].rstrip(".")


# --- JPEG and WebP: the record in EXIF -------------------------------------------------------

# EXIF tags where tools keep the record in JPEG and WebP files: A1111, Forge and SD.Next write
# the infotext as the Exif IFD's UserComment (piexif's "UNICODE" or "ASCII" prefix); ComfyUI's
# WebP writes "workflow:<json>" and "prompt:<json>" into Make and Model (0x010F, 0x0110).
_EXIF_IFD, _USER_COMMENT, _MAKE, _MODEL = 0x8769, 0x9286, 0x010F, 0x0110


def read_exif(path: str | Path) -> PngFacts:
    """The size and the generation record of a JPEG or WebP, from its EXIF, as `read_png`'s
    text chunks ("parameters", "prompt", "workflow"). Bounds: the same file, pixel and text
    bounds as PNG; EXIF itself is at most MAX_TEXT_CHUNK_BYTES."""
    from PIL import UnidentifiedImageError

    path = Path(path)
    text: dict[str, str] = {}
    try:
        with open_picture(path, ("JPEG", "WEBP")) as image:
            width, height = image.size
            if not width or not height or width * height > MAX_PIXELS:
                raise BadFileError(
                    path,
                    f"says it is {width}x{height} pixels; explain reads images of 1 to "
                    f"{MAX_PIXELS // 1_000_000} million pixels.",
                )
            raw = image.info.get("exif") or b""
            if len(raw) > MAX_TEXT_CHUNK_BYTES:
                raise BadFileError(
                    path, f"its EXIF data is over {MAX_TEXT_CHUNK_BYTES >> 20} MB; it is not read."
                )
            exif = image.getexif() if raw else None
            if exif is not None:
                comment = exif.get_ifd(_EXIF_IFD).get(_USER_COMMENT)
                if isinstance(comment, (bytes, str)):
                    text["parameters"] = _user_comment(comment)
                for tag in (_MAKE, _MODEL):
                    value = exif.get(tag)
                    if isinstance(value, str) and ":" in value[:20]:
                        key, _, body = value.partition(":")
                        if key in ("workflow", "prompt"):
                            text.setdefault(key, body)
    except BadFileError:
        raise
    except UnidentifiedImageError:
        raise BadFileError(
            path, "not a JPEG or WebP image that can be read (damaged, or another kind of file)."
        ) from None
    except Exception as error:  # noqa: BLE001 - PIL's EXIF reader raises many kinds
        raise BadFileError(path, f"its EXIF data cannot be read ({_short(error)}).") from None
    return PngFacts(width, height, text)


def _user_comment(value: bytes | str) -> str:
    """EXIF UserComment: an 8-byte character-code prefix, then the text."""
    if isinstance(value, str):
        return value
    prefix, body = value[:8], value[8:]
    if prefix == b"UNICODE\0":
        # piexif writes UTF-16 big-endian; some writers use little-endian: the one whose
        # text reads as text wins.
        big = body.decode("utf-16-be", errors="replace")
        little = body.decode("utf-16-le", errors="replace")
        return big if _printable(big) >= _printable(little) else little
    return body.decode("utf-8" if prefix != b"ASCII\0\0\0" else "latin-1", errors="replace")


def _printable(text: str) -> int:
    return sum(1 for char in text[:2000] if char.isprintable() or char in "\n\t")
