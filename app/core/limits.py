"""Bounds on what a file can make HalfSafe do: which files it opens, how much it reads, how big a
model it builds.

Every model file is untrusted, and a few hostile bytes can name a size that costs gigabytes or
minutes: a config with `layers_per_block: 100000`, a 20M-entry vocabulary, a FIFO named
`config.json` that blocks a reader forever. Everything here runs BEFORE anything is allocated
from such a size: files are opened only when they are regular files, JSON is read with a size
and nesting cap, and every size a config sets is checked against what real models of that kind
use, with a wide margin (the coming families, Flux, SD3.5, Z-Image and Qwen-Image, fit too).
The bounds are here, with the readers that keep to them; config_limits checks each config's
sizes against them, and component_limits the files of a diffusers component folder.

A check that fails raises ValueError (or an OSError for files) whose text completes the
sentence "<file>: ..."; the loaders turn it into BadFileError. No torch here.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
from collections.abc import Iterable
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, BinaryIO

# Layers of one text encoder: CLIP ViT-L 12, OpenCLIP ViT-H 24, ViT-bigG 32, T5-XXL 24,
# Qwen2.5-VL-7B (Qwen-Image) 28, Qwen3-4B (Z-Image) 36; even Llama-70B has 80.
MAX_TEXT_LAYERS = 128
# Resnet layers per UNet or VAE level: 2 in SD1.x, SD2.x, SDXL and their VAEs (3 per decoder
# level, which diffusers derives from the same number).
MAX_LAYERS_PER_BLOCK = 16
# Transformer blocks in one UNet attention (transformer_layers_per_block): SDXL 10.
MAX_TRANSFORMER_DEPTH = 128
# Levels of a UNet or VAE (entries of block_out_channels): 4 in every Stable Diffusion model.
MAX_LEVELS = 8
# Channels of one UNet or VAE level: SD1.x 1280, SDXL 1280, the SD VAEs 512.
MAX_CHANNELS = 8192
# Image and latent channels: 3 and 4 in SD1.x/SDXL, 16 in SD3/Flux, 9 for inpainting UNets.
MAX_IMAGE_CHANNELS = 128
# A transformer's input channels: latent channels in 2x2 patches and what it reads beside them
# (Flux.1 Fill: 64 + 64 + 256 = 384).
MAX_TRANSFORMER_INPUTS = 1024
# A transformer's width (heads x head width), which sizes every weight: Flux's 3072.
MAX_TRANSFORMER_WIDTH = 16_384
# Widths of text encoders and attention (hidden, MLP, cross-attention, projection sizes):
# CLIP-bigG 1280/5120, T5-XXL 4096/10240, Qwen2.5-VL-7B 3584/18944, Flux 3072/12288.
MAX_WIDTH = 65_536
# A transformer block's MLP width per unit of its own (mlp_ratio): Flux.2 and Qwen-Image 2.1
# use 3, most transformers 4.
MAX_MLP_RATIO = 16
# A VAE level's width per unit of its base width (dim_mult): Qwen-Image 2.1's VAE uses 8.
MAX_WIDTH_MULTIPLE = 64
# Attention heads (and SD1.x's attention_head_dim, which counts heads): SDXL 20, T5-XXL 64.
MAX_HEADS = 1024
# Vocabulary: CLIP 49,408, T5 32,128, Qwen2 151,646 (151,936 padded), Gemma 3 262,144.
MAX_VOCAB = 300_000
# BPE merges: CLIP 48,894, Qwen2 151,387.
MAX_MERGES = 300_000
# Text positions: CLIP 77, T5 512 (relative), Qwen2.5-VL 128,000 (rotary).
MAX_POSITIONS = 1 << 18
# Pixels of a picture HalfSafe reads or makes (explain's reader, input pictures, a final picture
# with the hires fix's upscale): 8944 x 8944; below PIL's decompression-bomb warning (89 million).
MAX_PIXELS = 80_000_000
# Training timesteps of a noise schedule: 1000 in every SD scheduler and in flow matching.
MAX_TRAIN_TIMESTEPS = 10_000
# Any other number in a schedule (a key of a scheduler HalfSafe does not name): none of a real
# one comes near.
MAX_SCHEDULE_NUMBER = 1e6
# UNet sample_size, in latents: SD1.x 64, SD2.x 96, SDXL 128 (2048 px at most).
MAX_LATENT_SIZE = 256
# VAE sample_size, in pixels: SD1.x 512, SD2.x 768, SDXL 1024.
MAX_IMAGE_SIZE = 2048
# Convolution kernels: 3 in every SD UNet and VAE.
MAX_KERNEL = 15
# One tensor: Gemma 3's token embedding, 262,144 x 3,840, is 1.0e9 elements; eight times that.
MAX_TENSOR_ELEMENTS = 1 << 33
# One dimension of a tensor (a 0-element tensor can still name any size): vocabularies reach
# 262,144; nothing real comes near 2**31.
MAX_TENSOR_DIMENSION = 1 << 31
# Dimensions of a tensor: 4 for convolutions, 5 for video models.
MAX_TENSOR_RANK = 8
# JSON configs: a UNet config is 2 KB; tokenizer files reach a few MB (CLIP's vocab.json 1 MB,
# Qwen2's tokenizer.json 7 MB, Gemma 3's 33 MB).
MAX_CONFIG_BYTES = 1 << 20
MAX_TOKENIZER_BYTES = 64 << 20
# Nesting of a JSON document: configs nest 2-3 levels, tokenizer.json 5.
MAX_JSON_DEPTH = 32
# Digits of a block index in a tensor name or of a part of a version read as a number: real
# models number a few hundred blocks, but an index of 1e12 must still be read, to be refused by
# the bounds above as the size it claims. Past this, the part is a name (int() refuses a text
# of thousands of digits).
MAX_INDEX_DIGITS = 18
# GGUF headers (walked in gguf.check_gguf_header before anything maps the file).
# Tensors in one GGUF file: a Flux.1 transformer has about 780, SD3.5 Large about 1,200, Wan
# 14B about 1,100, the largest language models (Llama 3 70B, Mixtral) under 1,000. The header
# walk costs 10-30 us per tensor, and the companion search walks every file beside a model,
# so this bound is what keeps a folder of hostile files to seconds.
MAX_GGUF_TENSORS = 1 << 13
# Metadata entries: a diffusion GGUF has a handful, a language model's a few dozen, and
# ComfyUI-GGUF adds one original shape per reshaped tensor.
MAX_GGUF_KEYS = 1 << 14
# Array elements over all metadata: a language model's vocabulary and merges are 150k-260k each.
MAX_GGUF_ARRAY_ITEMS = 1 << 22
# Strings among them, each walked one by one: Qwen2's 151,936 tokens and 151,387 merges, Gemma
# 3's 262,144 tokens and its merges.
MAX_GGUF_ARRAY_STRINGS = 1 << 20
# One string (a key, a tensor name, a chat template in the metadata).
MAX_GGUF_STRING = 1 << 20
MAX_GGUF_ALIGNMENT = 1 << 16


# Files ------------------------------------------------------------------------------------


class NotRegularFileError(OSError):
    """The name is a pipe, socket, device or folder where a file belongs."""


class FileTooLargeError(OSError):
    """The file is larger than any real file of its kind."""


_KINDS = (
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a device"),
    (stat.S_ISBLK, "a device"),
    (stat.S_ISDIR, "a folder"),
)


def file_kind(mode: int) -> str:
    """What a file of stat mode `mode` that is no regular file is, in words ("a socket")."""
    return next((words for test, words in _KINDS if test(mode)), "not a regular file")


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """Open `path` for binary reading if, and only if, it is a regular file (a symlink to one is
    fine).

    A plain open() of a FIFO waits for a writer forever, and a device can be read endlessly.
    The file is opened non-blocking (so a FIFO returns at once) and the decision is made on the
    opened descriptor, which a rename cannot swap; then blocking reads are restored. Raises
    NotRegularFileError (an OSError) for anything else, or the OSError of the open.
    """
    nonblocking = getattr(os, "O_NONBLOCK", 0)  # POSIX; Windows has no FIFOs to wait on
    fd = os.open(path, os.O_RDONLY | nonblocking | getattr(os, "O_BINARY", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFileError(
                errno.EINVAL, f"it is {file_kind(mode)}, not a regular file", str(path)
            )
        if nonblocking:
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def is_regular_file(path: str | os.PathLike[str]) -> bool:
    """True for a regular file (or a symlink to one); never opens it, never blocks."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def read_regular(path: str | os.PathLike[str], limit: int) -> bytes:
    """The whole content of a regular file of at most `limit` bytes (see `open_regular`).

    Raises FileTooLargeError before reading when the file is larger, and also when it grows
    past `limit` while being read.
    """
    with open_regular(path) as handle:
        size = os.fstat(handle.fileno()).st_size
        if size > limit:
            raise FileTooLargeError(errno.EFBIG, _too_large(size, limit), str(path))
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise FileTooLargeError(errno.EFBIG, _too_large(len(data), limit), str(path))
    return data


def _too_large(size: int, limit: int) -> str:
    return f"it is {_megabytes(size)}, more than the {_megabytes(limit)} any real one needs"


def _megabytes(size: int) -> str:
    return f"{size / (1 << 20):.1f} MB" if size >= 1 << 20 else f"{size / 1024:.0f} KB"


# JSON -------------------------------------------------------------------------------------


def parse_json(raw: bytes) -> Any:
    """Parse a JSON document, refusing one nested deeper than MAX_JSON_DEPTH levels.

    Raises ValueError with the reason: not UTF-8, not JSON, or nested too deeply (a document
    of 100,000 brackets would otherwise exhaust Python's recursion inside json or later).
    """
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ValueError("it is not UTF-8 text") from None
    try:
        document = json.loads(text)
    except RecursionError:
        raise ValueError(_too_deep()) from None
    except ValueError as error:
        raise ValueError(f"it is not valid JSON ({str(error).split(':')[0]})") from None
    if json_depth(document) > MAX_JSON_DEPTH:
        raise ValueError(_too_deep())
    return document


def _too_deep() -> str:
    return (
        f"it is nested more than {MAX_JSON_DEPTH} levels deep, which no real config is "
        "(it is damaged or hostile)"
    )


def json_depth(document: Any) -> int:
    """How many levels of lists and objects nest in a parsed document, counted a level at a
    time (no recursion, so any depth json could parse is measured; and a tokenizer's 151,669
    entries and merges in a third of the time a walk value by value took). Stops counting once
    past MAX_JSON_DEPTH."""
    deepest = 0
    level: list[Any] = [document]
    while True:
        containers = [value for value in level if isinstance(value, (dict, list))]
        if not containers:
            return deepest
        deepest += 1
        if deepest > MAX_JSON_DEPTH:
            return deepest
        level = []
        for container in containers:
            level.extend(container.values() if isinstance(container, dict) else container)


def read_json_object(path: str | os.PathLike[str], limit: int = MAX_CONFIG_BYTES) -> dict[str, Any]:
    """A JSON object from a regular file of at most `limit` bytes, nested at most
    MAX_JSON_DEPTH levels. Raises OSError (missing, unreadable, not a regular file, too large)
    or ValueError (not UTF-8, not JSON, too deep, not an object)."""
    document = parse_json(read_regular(path, limit))
    if not isinstance(document, dict):
        raise ValueError("it holds JSON but not an object")
    return document


# Tensors ----------------------------------------------------------------------------------


def check_tensor_shape(shape: Iterable[int]) -> str | None:
    """Why a tensor shape is beyond any real model's (rank, a dimension or the element count),
    or None. Works on shapes of zero-element tensors too, which cost no bytes in a file."""
    shape = list(shape)
    if len(shape) > MAX_TENSOR_RANK:
        return f"has {len(shape)} dimensions, more than the {MAX_TENSOR_RANK} any real weight has"
    if any(d > MAX_TENSOR_DIMENSION for d in shape):
        return f"has shape {shown_value(shape)}, a dimension larger than any real weight's"
    if math.prod(shape) > MAX_TENSOR_ELEMENTS:
        return f"has {math.prod(shape):.2g} elements, more than any real weight"
    return None


def index_in_name(part: str, digits: int = MAX_INDEX_DIGITS) -> int | None:
    """The number a part of a tensor name or a version ("12" in "blocks.12.attn", "41" in
    "0.41") writes in ASCII digits, at most `digits` of them; None for anything else. str's
    isdigit() holds for "²" and "٣", which int() refuses or reads as another number, and int()
    refuses a text of thousands of digits: such a part is a name, never a number."""
    if 0 < len(part) <= digits and part.isascii() and part.isdigit():
        return int(part)
    return None


def shown_value(value: Any) -> str:
    """A value from a file as a sentence quotes it: JSON (a float as Python writes it), cut to
    40 characters."""
    text = json.dumps(value) if not isinstance(value, float) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# Names from an image or a prompt -----------------------------------------------------------


class OutsideFoldersError(ValueError):
    """A name from an image or a prompt that would reach outside the model folders: an absolute
    path, a drive or network share, a `..` step, or a link that leads out of its folder."""


def relative_name(name: str) -> PurePosixPath:
    """`name` as a path below some folder, with either slash. Raises OutsideFoldersError for
    anything that is not: absolute (`/x`, `C:\\x`, `C:x`, `\\\\server\\share`), from the home
    folder (`~`), with a `..` step, or not a file name at all (empty, a NUL character)."""
    text = name.strip()
    if not text or "\0" in text:
        raise OutsideFoldersError("it is not a file name")
    windows = PureWindowsPath(text)
    posix = PurePosixPath(text.replace("\\", "/"))
    if windows.drive or windows.root or posix.is_absolute():
        raise OutsideFoldersError("it is an absolute path")
    if posix.parts[0].startswith("~"):
        raise OutsideFoldersError("it starts from a home folder")
    if ".." in posix.parts:
        raise OutsideFoldersError("it steps out of its folder with '..'")
    return posix


def within(path: str | os.PathLike[str], folders: Iterable[str | os.PathLike[str]]) -> bool:
    """True when `path`, every link followed, lies inside one of `folders` (links followed too),
    so a link inside a model folder that leads elsewhere is outside."""
    try:
        target = Path(path).resolve()
    except (OSError, RuntimeError, ValueError):
        return False
    for folder in folders:
        try:
            if target.is_relative_to(Path(folder).resolve()):
                return True
        except (OSError, RuntimeError, ValueError):
            continue
    return False


def find_in_folders(
    name: str, folders: Iterable[str | os.PathLike[str]], suffixes: Iterable[str] = ("",)
) -> Path | None:
    """The first regular file `folder / (name + suffix)` that lies inside that folder, for a
    `name` that came from an image or a prompt; None when no folder has one.

    This is where such names are resolved, so that they reach only the model folders: a name
    that is absolute or climbs out (`relative_name`) raises OutsideFoldersError before any file
    is looked at, and so does one whose only matches are links leading out of their folder.
    Only stats files; never opens one.
    """
    relative = relative_name(name)
    escaped = False
    for folder in folders:
        for suffix in suffixes:
            candidate = Path(folder) / f"{relative}{suffix}"
            if not is_regular_file(candidate):
                continue
            if within(candidate, [folder]):
                return candidate
            escaped = True
    if escaped:
        raise OutsideFoldersError("it is a link to a file outside the model folders")
    return None
