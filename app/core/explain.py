"""Why was this image black? Read an image's generation record (AUTOMATIC1111, Forge, SD.Next,
ComfyUI, InvokeAI, SwarmUI or HalfSafe), say what its pixels are (NaN-black, a dark picture, a
safety-checker blank, or fine), find the model in the library, re-run the health check with the
image's settings, and give the fix in the terms of the tool that made it.

Every chunk of the file is hostile until read: the PNG is walked chunk by chunk with bounds on
the file, each chunk, all text together, decompressed text, JSON depth and node counts; any
breach is one sentence naming the file (BadFileError). Nothing is written. torch is imported
only when the check runs.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app import __version__
from app.core import infotext
from app.core.errors import BadFileError, HalfSafeError
from app.core.infotext import read_float, read_int, read_text
from app.core.jobs import CancelToken, ProgressCallback, no_progress
from app.core.tools import MADE_BY, TOOLS, ToolFix, in_tool_terms

# Bounds on an image handed to `explain` (the image file's own; checkpoint bounds live with
# the checkpoint reader). A generated PNG is a few MB and its text a few kB; ComfyUI's
# workflow JSON reaches a few MB for large graphs (4.5 MB seen), written twice (prompt and
# workflow).
MAX_IMAGE_BYTES = 512 << 20
MAX_PIXELS = 80_000_000  # 8944 x 8944; below PIL's decompression-bomb warning (89 million)
MAX_CHUNKS = 100_000
MAX_TEXT_CHUNK_BYTES = 16 << 20  # one text chunk, as stored and after decompression
MAX_TEXT_TOTAL_BYTES = 32 << 20  # all text chunks together, decompressed
MAX_JSON_DEPTH = 64
MAX_NODES = 20_000  # ComfyUI graph nodes read

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp")

# Image statuses (DESIGN.md): NaN-black, a genuinely dark picture, a safety-checker blank, fine.
STATUSES = ("nan", "black", "safety_checker", "ok")

# The text chunks each tool writes.
TEXT_KEYS = ("parameters", "prompt", "workflow", "invokeai_metadata", "sd-metadata")


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


def pixel_status(path: str | Path, facts: PngFacts | None = None) -> tuple[str, dict[str, Any]]:
    """What the pixels say, from the pixels alone: "nan", "black" or "ok", with the figures.

    The rule: NaN becomes 0 when a tool writes its image as 8-bit (NumPy's cast, which
    A1111, ComfyUI, diffusers and HalfSafe all use), so an image whose every colour value is
    exactly 0 is NaN-black. A decoded picture, however dark, carries the VAE's noise and is
    never exactly 0 everywhere. A finite image that is near-black and flat by
    `images.PixelStats.near_black` (99.5% of pixels at most 12/255 bright, spread at most
    4/255) is "black": a dark picture, or a blank. A safety checker's blank is also all
    zeros; only the generation record can tell it apart (see `explain_image`).
    """
    import numpy as np
    from PIL import Image, PngImagePlugin

    from app.core.images import brightness_stats

    # PIL refuses a compressed text chunk past 1 MB while it opens a PNG, a legitimate large
    # ComfyUI workflow included. `read_png` has already held every chunk to the bounds above
    # (zip bombs stop there), so PIL gets the same ones.
    PngImagePlugin.MAX_TEXT_CHUNK = max(PngImagePlugin.MAX_TEXT_CHUNK, MAX_TEXT_CHUNK_BYTES)
    PngImagePlugin.MAX_TEXT_MEMORY = max(PngImagePlugin.MAX_TEXT_MEMORY, MAX_TEXT_TOTAL_BYTES)
    path = Path(path)
    if facts is not None and facts.width * facts.height > MAX_PIXELS:
        raise BadFileError(path, "too large to read.")
    try:
        with Image.open(path) as image:
            if image.width * image.height > MAX_PIXELS:
                raise BadFileError(path, "too large to read.")
            rgb = np.asarray(image.convert("RGB"))
    except BadFileError:
        raise
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as error:
        raise BadFileError(path, f"its pixels cannot be decoded ({_short(error)}).") from None
    zero = not rgb.any()
    stats = brightness_stats(rgb.mean(axis=-1) / 255.0)
    figures = {
        "width": int(rgb.shape[1]),
        "height": int(rgb.shape[0]),
        "all_zero": bool(zero),
        "mean": round(stats.mean, 4),
        "spread": round(stats.spread, 4),
        "bright": round(stats.bright, 4),
    }
    if zero:
        return "nan", figures
    return ("black" if stats.near_black else "ok"), figures


def _short(error: BaseException) -> str:
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return text[:160].rstrip(".")


# --- the generation record ---------------------------------------------------------------------


@dataclass
class Record:
    """What the image says about how it was made. Every field may be missing."""

    made_by: str = "unknown"
    model: str | None = None  # a checkpoint name, path or stem as the tool wrote it
    model_hash: str | None = None  # A1111 short (10 hex), old (8 hex) or full sha256
    unet: str | None = None  # ComfyUI's unet_name (a denoiser-only file)
    vae: str | None = None
    sampler: str | None = None  # the tool's own words
    scheduler: str | None = None  # HalfSafe's scheduler when the sampler maps to one
    steps: int | None = None
    cfg: float | None = None
    seed: int | None = None
    width: int | None = None
    height: int | None = None
    prompt: str = ""
    version: str | None = None
    halfsafe_status: str | None = None  # HalfSafe's own "NaN watch" entry
    precision: dict[str, Any] = field(default_factory=dict)  # settings recorded by HalfSafe

    def to_json(self) -> dict[str, Any]:
        keys = ("model", "model_hash", "unet", "vae", "sampler", "steps", "cfg", "seed")
        document = {k: getattr(self, k) for k in keys}
        document["size"] = [self.width, self.height] if self.width and self.height else None
        document["version"] = self.version
        return document


def read_record(path: str | Path, text: dict[str, str]) -> Record:
    """The generation record from a PNG's text chunks; `made_by` says which tool wrote it.

    Order: HalfSafe's own pairs, SwarmUI's JSON `parameters`, ComfyUI's `prompt`/`workflow`,
    InvokeAI's `invokeai_metadata` (or its older `sd-metadata`), then A1111-style infotext
    (Forge when its Version starts with "f" and a digit, SD.Next when it names itself or writes
    its own keys). Raises BadFileError when a chunk a tool reads is malformed or hostile.
    """
    path = Path(path)
    parameters = text.get("parameters")
    record = None
    if parameters is not None:
        if parameters.lstrip().startswith("{"):
            try:
                data = _json(path, "parameters", parameters)
            except BadFileError:
                data = None  # infotext whose prompt opens a brace ("{red|blue} car")
            if isinstance(data, dict) and isinstance(data.get("sui_image_params"), dict):
                return _swarm_record(data["sui_image_params"])
        record = _infotext_record(parameters)
        if record.made_by == "halfsafe":
            return record
    if "prompt" in text or "workflow" in text:
        comfy = _comfy_record(path, text.get("prompt"), text.get("workflow"))
        if comfy.model or comfy.unet or record is None:
            return comfy
    if "invokeai_metadata" in text:
        return _invoke_record(_json(path, "invokeai_metadata", text["invokeai_metadata"]))
    if "sd-metadata" in text:
        return _invoke_legacy_record(_json(path, "sd-metadata", text["sd-metadata"]))
    return record or Record()


# A JSON string, escapes included; what is left once they are blanked is structure.
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')


def json_depth(text: str) -> int:
    """How deep `text`'s brackets nest outside JSON strings: NumPy's running sum over the
    bracket bytes once strings are blanked. Measured on 8 MB (2-core EPYC): 40-60 ms for
    ordinary text, 0.6 s for an unterminated string (the pattern backtracks once through it),
    where a Python loop over the characters takes over a second."""
    import numpy as np

    structure = _JSON_STRING.sub('""', text).encode("utf-8", errors="replace")
    codes = np.frombuffer(structure, dtype=np.uint8)
    # "[" and "{" are 0x5B and 0x7B, "]" and "}" 0x5D and 0x7D: bit 5 aside, one byte each.
    folded = codes | 0x20
    steps = (folded == 0x7B).astype(np.int8) - (folded == 0x7D)
    return int(np.cumsum(steps, dtype=np.int32).max()) if steps.size else 0


def _json(path: Path, chunk: str, text: str) -> Any:
    """JSON from a chunk, refused when nested deeper than MAX_JSON_DEPTH (the depth is measured
    before parsing, so a hostile nesting never reaches the parser's recursion)."""
    if json_depth(text) > MAX_JSON_DEPTH:
        raise BadFileError(
            path,
            f"its {chunk!r} chunk nests JSON deeper than {MAX_JSON_DEPTH} levels; it is not read.",
        )
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        raise BadFileError(path, f"its {chunk!r} chunk is not valid JSON.") from None


# The precision settings an image's record carries into the check (see _reproduced_precision).
_REPRODUCED_SETTINGS = (
    infotext.PRECISION,
    infotext.UNET_PRECISION,
    infotext.VAE_PRECISION,
    infotext.TEXT_ENCODER_PRECISION,
    infotext.TEXT_ENCODER_2_PRECISION,
    infotext.UPCAST_ATTENTION,
    infotext.ATTENTION_BACKEND,
    infotext.TF32,
    infotext.FP16_REDUCED_PRECISION_REDUCTION,
    infotext.FP16_ACCUMULATION,
    infotext.ATTENTION_REDUCED_PRECISION,
)


def _infotext_record(text: str) -> Record:
    parsed = infotext.parse(text[:MAX_TEXT_CHUNK_BYTES])
    version = parsed.get(infotext.VERSION)
    if infotext.HALFSAFE in parsed:
        made_by = "halfsafe"
        version = parsed.get(infotext.HALFSAFE)
    elif (parsed.raw(infotext.APP) or "").lower().startswith("sd.next") or any(
        key in parsed for key in (infotext.PIPELINE, infotext.OPERATIONS)
    ):
        made_by = "sdnext"
    elif version and re.match(r"f\d", version):
        made_by = "forge"
    elif parsed.pairs:
        made_by = "a1111"
    else:
        made_by = "unknown"
    width, height = parsed.get(infotext.SIZE, (None, None))
    record = Record(
        made_by=made_by,
        model=parsed.get(infotext.MODEL),
        model_hash=parsed.get(infotext.MODEL_HASH),
        vae=parsed.get(infotext.VAE),
        sampler=parsed.get(infotext.SAMPLER),
        scheduler=parsed.scheduler(),
        steps=parsed.get(infotext.STEPS),
        cfg=parsed.get(infotext.CFG_SCALE),
        seed=parsed.get(infotext.SEED),
        width=width,
        height=height,
        prompt=parsed.prompt[:4096],
        version=version,
    )
    if made_by == "halfsafe":
        record.halfsafe_status = parsed.raw(infotext.NAN_WATCH)
        record.precision = parsed.settings(_REPRODUCED_SETTINGS)
    return record


def _swarm_record(params: dict[str, Any]) -> Record:
    return Record(
        made_by="swarmui",
        model=read_text(params.get("model")),
        vae=read_text(params.get("vae")),
        sampler=read_text(params.get("sampler")),
        scheduler=infotext.scheduler_for(
            read_text(params.get("sampler")), read_text(params.get("scheduler"))
        ),
        steps=read_int(params.get("steps")),
        cfg=read_float(params.get("cfgscale")),
        seed=read_int(params.get("seed")),
        width=read_int(params.get("width")),
        height=read_int(params.get("height")),
        prompt=read_text(params.get("prompt")) or "",
        version=read_text(params.get("swarm_version"), 100),
    )


def _comfy_nodes(prompt: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """(class_type, inputs) of each node of a ComfyUI API prompt, at most MAX_NODES."""
    if not isinstance(prompt, dict):
        return
    for count, node in enumerate(prompt.values()):
        if count >= MAX_NODES:
            return
        if isinstance(node, dict) and isinstance(node.get("inputs"), dict):
            yield str(node.get("class_type", ""))[:200], node["inputs"]


# The UI workflow's widgets_values, in the order ComfyUI's nodes declare their widgets.
_WORKFLOW_WIDGETS = {
    "CheckpointLoaderSimple": ("ckpt_name",),
    "CheckpointLoader": ("config_name", "ckpt_name"),
    "UNETLoader": ("unet_name", "weight_dtype"),
    "VAELoader": ("vae_name",),
    "KSampler": ("seed", "control_after_generate", "steps", "cfg", "sampler_name", "scheduler"),
    "EmptyLatentImage": ("width", "height", "batch_size"),
}


def _workflow_nodes(workflow: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    if not isinstance(workflow, dict) or not isinstance(workflow.get("nodes"), list):
        return
    for node in workflow["nodes"][:MAX_NODES]:
        if not isinstance(node, dict):
            continue
        kind = str(node.get("type", ""))[:200]
        values = node.get("widgets_values")
        names = _WORKFLOW_WIDGETS.get(kind)
        if names and isinstance(values, list):
            yield kind, dict(zip(names, values, strict=False))


def _comfy_record(path: Path, prompt_text: str | None, workflow_text: str | None) -> Record:
    nodes: list[tuple[str, dict[str, Any]]] = []
    if prompt_text is not None:
        nodes = list(_comfy_nodes(_json(path, "prompt", prompt_text)))
    if not any(_loader_name(inputs) for _kind, inputs in nodes) and workflow_text is not None:
        nodes = list(_workflow_nodes(_json(path, "workflow", workflow_text)))
    record = Record(made_by="comfyui")
    for kind, inputs in nodes:
        record.model = record.model or read_text(inputs.get("ckpt_name"), 1024)
        record.unet = record.unet or read_text(inputs.get("unet_name"), 1024)
        record.vae = record.vae or read_text(inputs.get("vae_name"), 1024)
        if kind.startswith("KSampler") and record.steps is None:
            record.steps = read_int(inputs.get("steps"))
            record.cfg = read_float(inputs.get("cfg"))
            record.seed = read_int(inputs.get("seed", inputs.get("noise_seed")))
            record.sampler = read_text(inputs.get("sampler_name"), 100)
            schedule = read_text(inputs.get("scheduler"), 100)
            record.scheduler = infotext.scheduler_for(record.sampler, schedule)
            if record.sampler and schedule:
                record.sampler = f"{record.sampler} ({schedule})"
        if "Latent" in kind and record.width is None:
            record.width, record.height = (
                read_int(inputs.get("width")),
                read_int(inputs.get("height")),
            )
    return record


def _loader_name(inputs: dict[str, Any]) -> bool:
    return any(isinstance(inputs.get(k), str) for k in ("ckpt_name", "unet_name"))


def _model_field(value: Any) -> tuple[str | None, str | None]:
    """InvokeAI's model entry: (name, hash) from a v4 dict, a v3 dict or a bare name."""
    if isinstance(value, dict):
        name = read_text(value.get("name")) or read_text(value.get("model_name"))
        return name, read_text(value.get("hash"), 200)
    return read_text(value), None


def _invoke_record(data: Any) -> Record:
    if not isinstance(data, dict):
        return Record(made_by="invokeai")
    model, model_hash = _model_field(data.get("model"))
    vae, _ = _model_field(data.get("vae"))
    sampler = read_text(data.get("scheduler"), 100)
    return Record(
        made_by="invokeai",
        model=model,
        model_hash=model_hash,
        vae=vae,
        sampler=sampler,
        scheduler=_INVOKE_SCHEDULERS.get(sampler or ""),
        steps=read_int(data.get("steps")),
        cfg=read_float(data.get("cfg_scale")),
        seed=read_int(data.get("seed")),
        width=read_int(data.get("width")),
        height=read_int(data.get("height")),
        prompt=read_text(data.get("positive_prompt")) or "",
        version=read_text(data.get("app_version"), 100),
    )


# InvokeAI's scheduler names (invokeai/backend/stable_diffusion/schedulers) that HalfSafe runs.
_INVOKE_SCHEDULERS = {
    "euler": "euler",
    "euler_a": "euler_a",
    "dpmpp_2m_k": "dpmpp_2m_karras",
    "ddim": "ddim",
}


def _invoke_legacy_record(data: Any) -> Record:
    if not isinstance(data, dict):
        return Record(made_by="invokeai")
    found = data.get("image")
    image: dict[str, Any] = found if isinstance(found, dict) else {}
    prompt = image.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
        prompt = prompt[0].get("prompt")
    sampler = read_text(image.get("sampler"), 100)
    return Record(
        made_by="invokeai",
        model=read_text(data.get("model_weights")),
        model_hash=read_text(data.get("model_hash"), 200),
        sampler=sampler,
        scheduler=infotext.scheduler_for(sampler),
        steps=read_int(image.get("steps")),
        cfg=read_float(image.get("cfg_scale")),
        seed=read_int(image.get("seed")),
        width=read_int(image.get("width")),
        height=read_int(image.get("height")),
        prompt=read_text(prompt) or "",
    )


# --- the model in the library ------------------------------------------------------------------


@dataclass
class ModelMatch:
    found: bool
    path: str | None
    looked_in: list[str]
    matched_by: str | None = None  # "hash", "hash and name", "name", "built-in demo"
    note: str | None = None
    vaes: list[str] = field(default_factory=list)  # the VAE files the library found
    # Every library folder (models and VAEs): where names from the image may resolve.
    roots: list[Path] = field(default_factory=list)
    # Files that say where models are (another tool's extra_model_paths.yaml) but could not be
    # read, one sentence each: the folders they name were not looked in.
    unread: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "found": self.found,
            "path": self.path,
            "looked_in": list(self.looked_in),
            "matched_by": self.matched_by,
        }


def _wanted_names(record: Record) -> list[str]:
    """The names the record gives, with folders as the tool wrote them (ComfyUI keeps the
    subfolder below its models folder, with either slash)."""
    names = []
    for value in (record.model, record.unet):
        if value:
            cleaned = value.replace("\\", "/").strip().strip("/")
            # A1111 writes "name [hash]" in some versions' Model field.
            cleaned = re.sub(r"\s*\[[0-9a-fA-F]{8,64}\]$", "", cleaned)
            if cleaned and cleaned not in names:
                names.append(cleaned)
    return names


def _name_matches(entry_path: str, wanted: str) -> bool:
    entry = Path(entry_path)
    full = entry.as_posix().lower()
    wanted_lower = wanted.lower()
    if "/" in wanted_lower:
        # ComfyUI writes the file's path below its folder; SwarmUI the same without the suffix.
        bare = full[: -len(entry.suffix)] if entry.suffix else full
        return full.endswith("/" + wanted_lower) or bare.endswith("/" + wanted_lower)
    if entry.name.lower() == wanted_lower:
        return True
    stem = entry.stem.lower() if entry.suffix else entry.name.lower()
    return stem == wanted_lower or stem == Path(wanted_lower).stem


def _hash_kind(value: str | None) -> tuple[str, str] | None:
    """("short"|"old"|"full", hex) for a hash an image records; None for another kind (InvokeAI
    v4 records BLAKE3, which HalfSafe does not compute)."""
    if not value:
        return None
    text = value.strip().lower()
    if text.startswith("sha256:"):
        text = text[7:]
    if not re.fullmatch(r"[0-9a-f]+", text):
        return None
    return {8: ("old", text), 10: ("short", text), 64: ("full", text)}.get(len(text))


def old_a1111_hash(path: str | Path) -> str:
    """A1111's hash before v1.0: sha256 of the 64 KiB at offset 1 MiB, first 8 hex digits."""
    with Path(path).open("rb") as file:
        file.seek(0x100000)
        return hashlib.sha256(file.read(0x10000)).hexdigest()[:8]


def _file_matches_hash(
    path: str, kind: str, value: str, cancel: CancelToken | None, cached_only: bool
) -> bool:
    from app.core import checkpoint

    try:
        if kind == "old":
            return old_a1111_hash(path) == value
        if cached_only:
            short = checkpoint.cached_model_hash(path)
            if short is None:
                return False
        else:
            short = checkpoint.model_hash(path, cancel=cancel)
        if kind == "short":
            return short == value
        resolved = Path(path).resolve()
        full = checkpoint.cached_value(str(resolved), checkpoint.file_stamp(resolved), "sha256")
        return full == value
    except OSError:
        return False


def find_model(
    record: Record,
    folders: list[str] | None = None,
    *,
    on_progress: ProgressCallback | None = None,
    cancel: CancelToken | None = None,
) -> ModelMatch:
    """The record's model in the library (`library.scan_library`: the settings' model folders
    plus the usual installs, or `folders`), by name and hash.

    Names first (a file name, a stem, or ComfyUI's path below its models folder); a recorded
    hash then confirms one of them. When no named file carries the hash, files whose hashes
    are already cached are compared, then the other safetensors files are hashed (seconds per
    GB, cached for next time; cancellable). A file found by name whose hash differs is still
    returned, with a note. Runs on the calling thread.
    """
    from app.core import library
    from app.core.demo import DEMO_MODELS

    if record.made_by == "halfsafe" and record.model in DEMO_MODELS:
        # HalfSafe's own built-in demos live in no folder: they are built, not found.
        return ModelMatch(True, record.model, [], "built-in demo")
    progress = on_progress or no_progress
    looked_in = [str(f) for f in library.library_folders(folders)]
    scanned = library.scan_library(folders, on_progress=progress, cancel=cancel)
    # A VAE is never the image's model, but may be the VAE it names.
    entries = [e for e in scanned if e.error is None and e.role == library.MODEL]
    vaes = [e.path for e in scanned if e.error is None and e.role == library.VAE]

    roots = library.library_roots(folders)
    unread = [e.error for e in scanned if e.error and e.format == "config"]

    def match(*args: Any) -> ModelMatch:
        return ModelMatch(*args, vaes=vaes, roots=roots, unread=unread)

    names = _wanted_names(record)
    by_name = [e for e in entries if any(_name_matches(e.path, n) for n in names)]
    hashed = _hash_kind(record.model_hash)
    files = [e for e in entries if e.format == "single_file"]
    if hashed is not None:
        kind, value = hashed
        for entry in by_name:
            if entry.format == "single_file" and _file_matches_hash(
                entry.path, kind, value, cancel, cached_only=False
            ):
                return match(True, entry.path, looked_in, "hash and name")
        for entry in files:
            if _file_matches_hash(entry.path, kind, value, cancel, cached_only=True):
                return match(True, entry.path, looked_in, "hash")
        if not by_name:
            for done, entry in enumerate(files):
                if cancel is not None:
                    cancel.raise_if_cancelled()
                progress("Looking for the model by its hash", done, len(files))
                if _file_matches_hash(entry.path, kind, value, cancel, cached_only=False):
                    return match(True, entry.path, looked_in, "hash")
    if by_name:
        note = None
        if hashed is not None:
            note = (
                f"{by_name[0].path} has the image's model name but not its hash "
                f"({record.model_hash}): it may be another version of the file."
            )
        return match(True, by_name[0].path, looked_in, "name", note)
    return match(False, None, looked_in)


def find_vae(
    name: str | None,
    model_path: str,
    library_vaes: Sequence[str] = (),
    folders: Sequence[str | Path] | None = None,
) -> str | None:
    """A separate VAE the record names, by its file name: next to the model, in the VAE
    folders (A1111's models/VAE, ComfyUI's models/vae) beside the model's folder, then among
    the VAEs the library found (`library_vaes`: VAE folders of other installs, ComfyUI's
    extra_model_paths.yaml).

    The name comes from an image, so it resolves only inside the model folders (`folders`,
    default the library's, `library.library_roots`): the search climbs from the model no
    higher than the model folder that holds it, and a file that is a link leading out of the
    folders is passed over. Stats files; never opens one."""
    if not name or name.lower() in ("none", "automatic", "baked vae", "default"):
        return None
    from app.core import limits

    if folders is None:
        from app.core import library

        folders = library.library_roots()
    wanted = Path(name.replace("\\", "/")).name.lower()
    model = Path(model_path)
    places = [model.parent]
    for parent in model.parents:
        if not limits.within(parent, folders):
            break
        places.extend([parent / "VAE", parent / "vae"])
    for place in places:
        try:
            for candidate in place.iterdir():
                if (
                    candidate.name.lower() in (wanted, wanted + ".safetensors")
                    and limits.is_regular_file(candidate)
                    and limits.within(candidate, folders)
                ):
                    return str(candidate)
        except OSError:
            continue
    return next(
        (
            v
            for v in library_vaes
            if Path(v).name.lower() in (wanted, wanted + ".safetensors")
            and limits.within(v, folders)
        ),
        None,
    )


# --- the explanation ---------------------------------------------------------------------------


@dataclass
class Explanation:
    path: str
    made_by: str
    status: str
    record: Record
    pixels: dict[str, Any]
    model: ModelMatch
    check: Any = None  # health.HealthReport
    halfsafe_flags: list[str] = field(default_factory=list)
    tool_fix: ToolFix | None = None
    message: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def problem(self) -> bool:
        """A NaN-black image: the command's exit status 1, with a fix or without one."""
        return self.status == "nan"

    def to_json(self) -> dict[str, Any]:
        fix = None
        if self.tool_fix is not None:
            fix = {"halfsafe": list(self.halfsafe_flags), "for_tool": self.tool_fix.to_json()}
        return {
            "halfsafe": __version__,
            "image": {"path": self.path, "made_by": self.made_by, "status": self.status},
            "model": self.model.to_json(),
            "check": self.check.to_json() if self.check is not None else None,
            "fix": fix,
            "record": self.record.to_json(),
            "pixels": dict(self.pixels),
            "message": self.message,
            "notes": list(self.notes),
        }


def read_image(path: str | Path) -> tuple[Record, str, dict[str, Any]]:
    """(record, status, pixel figures) of an image file, without the library or a model.
    PNG is read chunk by chunk (`read_png`); JPEG and WebP through their EXIF (`read_exif`).
    Raises BadFileError with one sentence for a file that cannot be read."""
    path = Path(path)
    head = _head(path)
    if head.startswith(PNG_SIGNATURE):
        facts = read_png(path)
    elif head.startswith(b"\xff\xd8\xff") or (head[:4] == b"RIFF" and head[8:12] == b"WEBP"):
        facts = read_exif(path)
    else:
        raise BadFileError(
            path, "not a PNG, JPEG or WebP image (its first bytes are none of theirs)."
        )
    record = read_record(path, facts.text)
    status, figures = pixel_status(path, facts)
    if status in ("nan", "black") and record.halfsafe_status == "safety_checker":
        status = "safety_checker"
    return record, status, figures


def _head(path: Path) -> bytes:
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


# EXIF tags where tools keep the record in JPEG and WebP files: A1111, Forge and SD.Next write
# the infotext as the Exif IFD's UserComment (piexif's "UNICODE" or "ASCII" prefix); ComfyUI's
# WebP writes "workflow:<json>" and "prompt:<json>" into Make and Model (0x010F, 0x0110).
_EXIF_IFD, _USER_COMMENT, _MAKE, _MODEL = 0x8769, 0x9286, 0x010F, 0x0110


def read_exif(path: str | Path) -> PngFacts:
    """The size and the generation record of a JPEG or WebP, from its EXIF, as `read_png`'s
    text chunks ("parameters", "prompt", "workflow"). Bounds: the same file, pixel and text
    bounds as PNG; EXIF itself is at most MAX_TEXT_CHUNK_BYTES."""
    from PIL import Image, UnidentifiedImageError

    path = Path(path)
    text: dict[str, str] = {}
    try:
        with Image.open(path) as image:
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
            path, "damaged: it starts like a JPEG or WebP image but cannot be read as one."
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


def _reproduced_precision(record: Record):
    """The precision the image was made with: HalfSafe's record says; another tool ran the
    half precision it uses by default on a GPU (fp16)."""
    from app.core.settings import FIELDS, PrecisionSettings

    values: dict[str, Any] = {"precision": "fp16"}
    for key, value in record.precision.items():
        try:
            values[key] = FIELDS[key].validate(value)
        except (KeyError, ValueError):
            continue
    if values.get("precision") == "auto":
        values["precision"] = "fp16"
    return PrecisionSettings.from_mapping(values)


def _probe_size(record: Record, native: int) -> int:
    """The side the check runs at: the image's longer side, but never more than the model's
    native size (the model's own size when the image records none). An image records whatever
    size it claims (`Size: 999999x999999`), and even a real 2048 px image would make the
    check cost many generations, so the work is bounded by the model, not by the image; a note
    says when the check ran smaller than the image."""
    from app.core.settings import FIELDS

    side = max(record.width or 0, record.height or 0)
    size = FIELDS["width"]
    low, _ = size.bounds()
    side = int(min(max(side or native, low), native))
    return side - side % int(size.step or 1)


def explain_image(
    path: str | Path,
    *,
    device: str = "auto",
    folders: list[str] | None = None,
    loaded: Any = None,
    measure_cost: bool = False,
    on_progress: ProgressCallback | None = None,
    cancel: CancelToken | None = None,
) -> Explanation:
    """Explain one image: its record and pixels, its model, and for a NaN-black image the
    health check at the image's settings (steps, sampler, size, and the precision the tool ran)
    with the fix in that tool's terms.

    `loaded` is a model already in memory (the engine's): used when it is the file found.
    Runs on the calling thread; the check takes seconds on a GPU. Raises BadFileError for an
    unreadable or hostile image, and passes on the model loader's errors. Writes nothing but
    the hash cache and the library index; a verified fix is not remembered as a profile.
    """
    progress = on_progress or no_progress
    cancel = cancel or CancelToken()
    path = Path(path).expanduser()
    progress("Reading the image", 0, 1)
    record, status, figures = read_image(path)
    made_by = record.made_by if record.made_by in MADE_BY else "unknown"
    cancel.raise_if_cancelled()
    if record.model or record.unet or record.model_hash:
        model = find_model(record, folders, on_progress=progress, cancel=cancel)
    else:
        from app.core import library

        model = ModelMatch(False, None, [str(f) for f in library.library_folders(folders)])
    explanation = Explanation(str(path), made_by, status, record, figures, model)
    if model.note:
        explanation.notes.append(model.note)
    explanation.notes.extend(model.unread)
    if status != "nan":
        explanation.message = _status_words(explanation)
        return explanation
    if not model.found:
        explanation.message = f"{_status_words(explanation)} {_not_found_words(record, model)}"
        return explanation
    _run_check(explanation, device, loaded, measure_cost, progress, cancel)
    return explanation


def _fix_the_tool_can_apply(fix, tool: str) -> dict[str, Any]:
    """The check's fix as settings, or, when the tool that made the image has no switch for it
    (a layer-level fix: no other tool keeps single layers wider), per failing component the
    best verified candidate that tool can apply (the checks's ranking decides which)."""
    chosen = dict(fix.settings)
    if tool == "halfsafe" or in_tool_terms(tool, chosen, []).covered:
        return chosen
    settings: dict[str, Any] = {}
    for component in dict.fromkeys(c.component for c in fix.candidates):
        usable = [
            c
            for c in fix.candidates
            if c.component == component
            and c.verified
            and in_tool_terms(tool, c.settings, []).covered
        ]
        if not usable:
            return chosen
        settings.update(usable[0].settings)
    return settings


def _apply_image_loras(explanation, model) -> None:
    """The LoRAs the image's prompt names (`<lora:name:weight>`), looked up beside its model
    and in the Lora folders; one that is missing or does not load is a note, and the check runs
    without it."""
    from app.core.lora import (
        LoraRequest,
        OutsideModelFoldersError,
        find_lora,
        load_requested,
        prompt_loras_quiet,
    )

    requests = []
    for tag in prompt_loras_quiet(explanation.record.prompt or ""):
        try:
            requests.append(
                LoraRequest(
                    str(
                        find_lora(tag.path, explanation.model.path, explanation.model.roots or None)
                    ),
                    tag.weight,
                )
            )
        except OutsideModelFoldersError as refused:
            explanation.notes.append(f"{refused} The check ran without it.")
        except HalfSafeError:
            explanation.notes.append(
                f"The image used the LoRA {tag.path}, which was not found beside its model or "
                "in the Lora folders; the check ran without it."
            )
    try:
        load_requested(model, requests)
    except HalfSafeError as error:
        explanation.notes.append(f"{error} The check ran without the image's LoRAs.")
        load_requested(model, [])


def _run_check(explanation, device, loaded, measure_cost, progress, cancel) -> None:
    from app.core import health
    from app.core.causes import check_and_attribute
    from app.core.lora import strip_tags
    from app.core.models import load_model
    from app.core.settings import FIELDS

    record = explanation.record
    model_path = explanation.model.path
    vae = None
    if record.vae:
        vae = find_vae(
            record.vae, model_path, explanation.model.vaes, explanation.model.roots or None
        )
    if record.vae and vae is None and record.vae.lower() not in ("none", "automatic", "baked vae"):
        explanation.notes.append(
            f"The image used the VAE {record.vae}, which was not found next to the model; "
            "the check ran with the model's own VAE."
        )
    same = (
        loaded is not None
        and vae is None
        and str(getattr(loaded, "source", "")) not in ("", "demo")
        and Path(loaded.source).resolve() == Path(model_path).resolve()
    )
    if same and loaded is not None:
        model = loaded
    else:
        try:
            model = load_model(model_path, vae=vae, on_progress=progress, cancel=cancel)
        except BadFileError as error:
            # The image was read and is NaN-black; it is the model file that failed.
            explanation.notes.append(str(error))
            explanation.message = (
                f"{_status_words(explanation)} Its model was found at {model_path}, but the "
                f"health check could not load it: {error.problem}"
            )
            return
    steps = record.steps
    try:
        steps = FIELDS["steps"].validate(steps) if steps is not None else None
    except ValueError:
        steps = None
    if record.sampler and record.scheduler is None:
        explanation.notes.append(
            f"HalfSafe does not run the image's sampler ({record.sampler}); the check probed "
            f"the schedule of {FIELDS['scheduler'].default} at the same step count."
        )
    _apply_image_loras(explanation, model)
    size = _probe_size(record, model.native_size)
    if max(record.width or 0, record.height or 0) > size:
        explanation.notes.append(
            f"The image records a size of {record.width}x{record.height}; the check ran at "
            f"{size} px, the model's native size, so overflow that appears only at larger "
            "sizes is not tested."
        )
    report = check_and_attribute(
        model,
        precision=_reproduced_precision(record),
        device=device,
        size=size,
        steps=steps or health.DEFAULT_STEPS,
        scheduler=record.scheduler or health.DEFAULT_SCHEDULER,
        prompt=strip_tags(record.prompt or "").strip() or health.DEFAULT_PROMPT,
        on_progress=progress,
        cancel=cancel,
        remember=False,
        measure_cost=measure_cost,
    )
    explanation.check = report
    if report.fix is not None and report.verdict == "fixable":
        settings = _fix_the_tool_can_apply(report.fix, explanation.made_by)
        explanation.halfsafe_flags = [
            f for f in (health.flag(k, v) for k, v in settings.items()) if f
        ]
        explanation.tool_fix = in_tool_terms(
            explanation.made_by, settings, explanation.halfsafe_flags
        )
        explanation.notes.extend(explanation.tool_fix.notes)
    explanation.message = f"{_status_words(explanation)} {_check_words(explanation)}"


def _status_words(explanation: Explanation) -> str:
    tool = TOOLS.get(explanation.made_by)
    by = f"made by {tool.name}" if tool else "whose maker is unknown"
    if explanation.status == "nan":
        return (
            f"This image ({by}) is NaN-black: every pixel is exactly 0, which is what a NaN "
            "becomes when the image is saved; a value overflowed somewhere in the model."
        )
    if explanation.status == "safety_checker":
        return (
            f"This image ({by}) was blanked by the model's safety checker; nothing overflowed, "
            "so no precision setting changes it."
        )
    if explanation.status == "black":
        return (
            f"This image ({by}) is very dark but not NaN-black: its pixels are finite and not "
            "all zero, so nothing overflowed; it is a dark picture (try another seed or prompt)."
        )
    return f"This image ({by}) is not black: nothing to fix."


def _not_found_words(record: Record, model: ModelMatch) -> str:
    wanted = record.model or record.unet
    if wanted is None and record.model_hash is None:
        return "The image does not say which model made it, so the check could not run."
    named = wanted or f"with hash {record.model_hash}"
    where = "; ".join(model.looked_in) or "no model folders"
    return (
        f"Its model ({named}) was not found in {where}; add the folder that holds it in "
        "Settings > Model folders, then explain the image again."
    )


def _headline(report) -> str:
    # The check ran at the image's settings, not the user's own.
    return report.headline.replace("at your settings", "at the image's settings")


def _check_words(explanation: Explanation) -> str:
    report = explanation.check
    if report.verdict == "fixable" and explanation.tool_fix is not None:
        fix = explanation.tool_fix
        tool = TOOLS[fix.tool].name
        parts = []
        if fix.flags:
            parts.append("start it with " + " ".join(fix.flags))
        if fix.settings:
            parts.append(
                "set " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in fix.settings.items())
            )
        return (
            f"The health check reproduced it: {_headline(report)} In {tool}, "
            + " and ".join(parts)
            + f". In HalfSafe: {' '.join(explanation.halfsafe_flags)}."
        )
    if report.verdict == "broken":
        return f"The health check says: {_headline(report)} No precision setting fixes it."
    return (
        "The health check at the image's settings did not overflow on this device "
        f"({report.device.get('name')}); the image's GPU may differ. {_headline(report)}"
    )


def is_image_path(path: str | Path) -> bool:
    """Whether a dropped or opened file is an image for `explain` rather than a model."""
    return Path(str(path)).suffix.lower() in IMAGE_SUFFIXES
