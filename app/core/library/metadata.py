"""What a model or LoRA file says about itself, read from its safetensors header alone: the base
model, trigger words and training resolution that trainers write in `__metadata__` (kohya's
`ss_*` keys, the `modelspec.*` keys of Stability AI's model metadata spec), and the preview
picture the tools keep beside it (Civitai helper's and AUTOMATIC1111's `name.preview.png`,
`name.png`, ...), opened only as PNG, JPEG or WebP. No torch; no tensor is ever read.
"""

from __future__ import annotations

import math
import os
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.core import limits
from app.core.checkpoint import SAFETENSORS_SUFFIX, read_safetensors_header
from app.core.checkpoint.header import not_safetensors_words
from app.core.errors import BadFileError

# A header read for its metadata: a checkpoint's is some 200 KB, a LoRA's with kohya's tag
# counts a few MB at most. The format allows 100 MB; a browser listing hundreds of files
# reads no header past this, and says so instead.
MAX_CARD_HEADER_BYTES = 16 << 20
# kohya's ss_tag_frequency is JSON inside one metadata string: a few hundred KB for thousands
# of training pictures.
MAX_TAG_FREQUENCY_CHARS = 4 << 20
MAX_TAG_FOLDERS = 1000
MAX_TAGS_COUNTED = 100_000
# Trigger words offered for one file; a tag or phrase longer than a short sentence is no
# trigger word.
TRIGGER_WORDS_KEPT = 8
MAX_WORD_CHARS = 100
MAX_TEXT_CHARS = 200
# A training resolution outside this range (pixels per side) is damage, not a resolution.
RESOLUTION_RANGE = (64, 16384)
# Files whose headers carry metadata; the others (pickles, GGUF, folders) get an empty card.
CARD_SUFFIXES = (SAFETENSORS_SUFFIX, ".sft")
# Preview pictures beside `name.safetensors`, in the order the tools look for them.
PREVIEW_ENDINGS = (
    ".preview.png",
    ".preview.jpg",
    ".preview.jpeg",
    ".preview.webp",
    ".png",
    ".jpg",
    ".jpeg",
    ".webp",
)
# A preview is a small picture; a file past this is not read.
MAX_PREVIEW_BYTES = 32 << 20
# Cards kept in memory, by path, size and modification time: a rescan reads only what changed.
MAX_CARDS_KEPT = 8192

_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")


@dataclass(frozen=True)
class ModelCard:
    """What one file's metadata says, each field bounded and cleaned; empty fields where it
    says nothing. `problem` is one sentence when the header could not be read for it."""

    base_model: str | None = None  # HalfSafe's architecture name ("sdxl", "flux-dev"), mapped
    base_model_stated: str | None = None  # the words the file used, as written
    trained_on: str | None = None  # the checkpoint it was trained from (kohya ss_sd_model_name)
    title: str | None = None  # modelspec.title, else kohya's ss_output_name
    trigger_words: tuple[str, ...] = ()
    resolution: tuple[int, int] | None = None  # width, height in pixels
    rank: int | None = None  # a LoRA's network dim
    alpha: float | None = None
    problem: str | None = None


_cards: dict[tuple[str, int, int], ModelCard] = {}


def read_card(path: str | Path) -> ModelCard:
    """The card of a model or LoRA file: its safetensors `__metadata__` read through the
    validated header reader (`read_safetensors_header`), after the header's length field is
    checked against MAX_CARD_HEADER_BYTES. Never raises: a file that cannot be read, an
    oversized or malformed header gives a card whose `problem` is one sentence. Files that are
    not safetensors (pickles, GGUF, diffusers folders) give an empty card without being opened.
    Cards are kept in memory by path, size and modification time. Safe on any thread."""
    path = Path(path)
    if not path.name.lower().endswith(CARD_SUFFIXES):
        return ModelCard()
    try:
        info = path.stat()
    except OSError as error:
        return ModelCard(problem=f"{path}: the file cannot be read ({error.strerror or error}).")
    key = (str(path), info.st_size, info.st_mtime_ns)
    card = _cards.get(key)
    if card is None:
        card = _read_card(path)
        if len(_cards) >= MAX_CARDS_KEPT:
            _cards.clear()
        _cards[key] = card
    return card


def _read_card(path: Path) -> ModelCard:
    try:
        with limits.open_regular(path) as handle:
            head = handle.read(64)
    except OSError as error:
        return ModelCard(problem=f"{path}: the file cannot be read ({error.strerror or error}).")
    if len(head) >= 8:
        (length,) = struct.unpack("<Q", head[:8])
        if length > MAX_CARD_HEADER_BYTES:
            foreign = not_safetensors_words(head)  # a text file renamed, say
            if foreign:
                return ModelCard(problem=f"{path}: {foreign}")
            return ModelCard(
                problem=f"{path}: its header says it is {length / 2**20:,.0f} MB, far more "
                "than any model's, so its details were not read."
            )
    try:
        header = read_safetensors_header(path)
    except BadFileError as error:
        return ModelCard(problem=str(error))
    except (RecursionError, MemoryError, ValueError):
        return ModelCard(problem=f"{path}: its header could not be read as JSON.")
    return card_from_metadata(header.metadata)


def card_from_metadata(metadata: Mapping[str, Any]) -> ModelCard:
    """The card a `__metadata__` map gives. Keys of the wrong type, values that are not text,
    numbers out of range and JSON that is not what kohya writes are passed over one by one."""
    stated = _text(metadata, "modelspec.architecture") or _text(metadata, "ss_base_model_version")
    base = base_architecture(stated) if stated else None
    if base is None and not stated and _text(metadata, "ss_v2").lower() == "true":
        stated, base = "ss_v2", "sd2"
    trained_on = _text(metadata, "ss_sd_model_name")
    title = _text(metadata, "modelspec.title") or _text(metadata, "ss_output_name")
    words = _phrases(_text(metadata, "modelspec.trigger_phrase", MAX_TAG_FREQUENCY_CHARS))
    for tag in _frequent_tags(metadata.get("ss_tag_frequency")):
        if tag.lower() not in {w.lower() for w in words}:
            words.append(tag)
    resolution = _resolution(_text(metadata, "modelspec.resolution")) or _resolution(
        _text(metadata, "ss_resolution")
    )
    rank = _number(_text(metadata, "ss_network_dim"))
    alpha = _number(_text(metadata, "ss_network_alpha"))
    return ModelCard(
        base_model=base,
        base_model_stated=stated or None,
        trained_on=trained_on or None,
        title=title or None,
        trigger_words=tuple(words[:TRIGGER_WORDS_KEPT]),
        resolution=resolution,
        rank=int(rank) if rank is not None and rank == int(rank) and rank > 0 else None,
        alpha=alpha,
    )


def base_architecture(stated: str) -> str | None:
    """HalfSafe's architecture name for a trainer's base-model words ("sdxl_base_v1-0" ->
    "sdxl", "flux-1-dev/lora" -> "flux-dev", as each family's `trainer_words` say, any
    `/lora...` suffix dropped); None for words it does not know."""
    from app.core.families import FAMILIES

    text = stated.strip().lower().split("/")[0]
    text = re.sub(r"[\s_.]+", "-", text)
    for family in FAMILIES:
        for pattern, architecture in family.trainer_words:
            if re.search(pattern, text):
                return architecture
    return None


def _text(metadata: Mapping[str, Any], key: str, limit: int = MAX_TEXT_CHARS) -> str:
    value = metadata.get(key)
    if not isinstance(value, str):
        return ""
    return _CONTROL.sub(" ", value[:limit]).strip()


def _phrases(text: str) -> list[str]:
    """modelspec.trigger_phrase: one phrase, or several separated by commas."""
    found: list[str] = []
    for part in text.split(","):
        word = part.strip()
        if word and len(word) <= MAX_WORD_CHARS and word not in found:
            found.append(word)
        if len(found) >= TRIGGER_WORDS_KEPT:
            break
    return found


def _frequent_tags(value: Any) -> list[str]:
    """kohya's ss_tag_frequency ({"folder": {"tag": count}}), as its most frequent tags over all
    folders, most frequent first (ties alphabetically)."""
    if not isinstance(value, str) or not value or len(value) > MAX_TAG_FREQUENCY_CHARS:
        return []
    try:
        document = limits.parse_json(value.encode("utf-8", errors="replace"))
    except ValueError:
        return []
    if not isinstance(document, dict):
        return []
    counts: dict[str, float] = {}
    looked = 0
    for tags in list(document.values())[:MAX_TAG_FOLDERS]:
        if not isinstance(tags, dict):
            continue
        for tag, count in tags.items():
            looked += 1
            if looked > MAX_TAGS_COUNTED:
                break
            if isinstance(count, bool) or not isinstance(count, (int, float)):
                continue
            word = _CONTROL.sub(" ", str(tag)).strip()
            if word and len(word) <= MAX_WORD_CHARS and math.isfinite(count) and count > 0:
                counts[word] = counts.get(word, 0.0) + count
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return [tag for tag, _ in ranked[:TRIGGER_WORDS_KEPT]]


def _resolution(text: str) -> tuple[int, int] | None:
    """ "1024x1024", "(512, 768)", "[1024, 1024]" or "512" -> (width, height)."""
    numbers = [int(n) for n in re.findall(r"\d{1,6}", text)[:3]]
    if not numbers or len(numbers) > 2:
        return None
    width, height = numbers[0], numbers[-1]
    low, high = RESOLUTION_RANGE
    if not (low <= width <= high and low <= height <= high):
        return None
    return width, height


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and 0 <= value <= 1e6 else None


# Preview pictures -----------------------------------------------------------------------------


def preview_file(model: str | Path) -> Path | None:
    """The preview picture kept beside a model file or folder (`name.preview.png`, `name.png`,
    `name.jpg`, ... in PREVIEW_ENDINGS' order), a regular file; None when there is none. Only
    stats files."""
    model = Path(model)
    name = model.name
    lowered = name.lower()
    for suffix in (*CARD_SUFFIXES, ".ckpt", ".pt", ".pth", ".bin", ".gguf"):
        if lowered.endswith(suffix):
            name = name[: -len(suffix)]
            break
    for ending in PREVIEW_ENDINGS:
        candidate = model.parent / (name + ending)
        if limits.is_regular_file(candidate):
            return candidate
    return None


def read_preview(path: str | Path, edge: int) -> Any:
    """A preview picture made small: an RGBA PIL image at most `edge` pixels on its longer side.
    The file is opened only as PNG, JPEG or WebP (`images.open_picture`), checked against
    MAX_PREVIEW_BYTES and the picture-size bound before it is decoded. Raises BadFileError with
    one sentence for anything else. Runs on the calling thread (a worker's)."""
    from app.core.images.finished import MAX_PIXELS, open_picture

    path = Path(path)
    try:
        size = os.stat(path).st_size
        if not limits.is_regular_file(path):
            raise BadFileError(path, "this preview is not a regular file.")
        if size > MAX_PREVIEW_BYTES:
            raise BadFileError(path, f"this preview is {size / 2**20:,.0f} MB, too large to show.")
        with open_picture(path) as picture:
            width, height = picture.size
            if width <= 0 or height <= 0 or width * height > MAX_PIXELS:
                raise BadFileError(path, f"this preview claims {width}×{height} pixels.")
            picture.draft("RGB", (edge, edge))  # JPEG decodes at a fraction of its size
            picture.thumbnail((edge, edge))
            return picture.convert("RGBA")
    except BadFileError:
        raise
    except Exception as error:  # noqa: BLE001 - Pillow raises many kinds for a broken picture
        raise BadFileError(
            path, f"this preview is not a PNG, JPEG or WebP picture ({type(error).__name__})."
        ) from None
