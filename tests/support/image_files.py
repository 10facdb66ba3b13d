"""Builders for the images `explain` reads: PNGs with any text chunks, good or hostile, and the
generation records other tools write (shapes from each tool's own writer; values are made up).

Everything is written in code into tmp_path; nothing is downloaded.
"""

from __future__ import annotations

import io
import json
import struct
import zlib
from pathlib import Path

import numpy as np
from PIL import Image

from app.core.words import infotext

SIGNATURE = b"\x89PNG\r\n\x1a\n"


def chunk(kind: bytes, data: bytes, *, crc: int | None = None, length: int | None = None) -> bytes:
    """One PNG chunk; `crc` and `length` can lie."""
    crc = zlib.crc32(kind + data) if crc is None else crc
    size = len(data) if length is None else length
    return struct.pack(">I", size) + kind + data + struct.pack(">I", crc)


def text_chunk(keyword: str, text: str, kind: str = "tEXt") -> bytes:
    key = keyword.encode("latin-1")
    if kind == "tEXt":
        return chunk(b"tEXt", key + b"\0" + text.encode("latin-1"))
    if kind == "zTXt":
        return chunk(b"zTXt", key + b"\0\0" + zlib.compress(text.encode("latin-1")))
    return chunk(b"iTXt", key + b"\0\0\0\0\0" + text.encode("utf-8"))


def pixels(kind: str, size: int = 64) -> Image.Image:
    """'zero' (NaN-black), 'dark' (a dark picture with detail), 'noise' (an ordinary one)."""
    rng = np.random.default_rng(0)
    if kind == "zero":
        array = np.zeros((size, size, 3), np.uint8)
    elif kind == "dark":
        array = rng.integers(0, 6, (size, size, 3)).astype(np.uint8)
    else:
        array = rng.integers(0, 256, (size, size, 3)).astype(np.uint8)
    return Image.fromarray(array, "RGB")


def png_with(path: Path, chunks: list[bytes], image: Image.Image | None = None) -> Path:
    """A PNG of `image` (NaN-black by default) with `chunks` inserted right after IHDR."""
    buffer = io.BytesIO()
    (image or pixels("zero")).save(buffer, format="PNG")
    data = buffer.getvalue()
    ihdr_end = 8 + 8 + 13 + 4
    path.write_bytes(data[:ihdr_end] + b"".join(chunks) + data[ihdr_end:])
    return path


def png_text(path: Path, texts: dict[str, str], image: Image.Image | None = None) -> Path:
    return png_with(
        path,
        [text_chunk(k, v) if _latin1(v) else text_chunk(k, v, "iTXt") for k, v in texts.items()],
        image,
    )


def _latin1(text: str) -> bool:
    try:
        text.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return True


def a1111_parameters(model: str, model_hash: str, version: str = "v1.10.1", **extra) -> str:
    pairs = {
        "Steps": 12,
        "Sampler": "Euler a",
        "Schedule type": "Automatic",
        "CFG scale": 7,
        "Seed": 1234,
        "Size": "64x64",
        "Model hash": model_hash,
        "Model": model,
        "Version": version,
        **extra,
    }
    line = ", ".join(f"{k}: {v}" for k, v in pairs.items())
    return f"a lighthouse at night\nNegative prompt: blurry\n{line}"


def comfy_prompt(ckpt_name: str, vae_name: str | None = None) -> str:
    nodes = {
        "3": {
            "class_type": "KSampler",
            "inputs": {
                "seed": 42,
                "steps": 12,
                "cfg": 7.0,
                "sampler_name": "euler",
                "scheduler": "normal",
                "denoise": 1.0,
                "model": ["4", 0],
                "positive": ["6", 0],
                "negative": ["7", 0],
                "latent_image": ["5", 0],
            },
        },
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": ckpt_name}},
        "5": {
            "class_type": "EmptyLatentImage",
            "inputs": {"width": 64, "height": 64, "batch_size": 1},
        },
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a lighthouse", "clip": ["4", 1]}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "blurry", "clip": ["4", 1]}},
    }
    if vae_name:
        nodes["8"] = {"class_type": "VAELoader", "inputs": {"vae_name": vae_name}}
    return json.dumps(nodes)


def comfy_workflow(ckpt_name: str) -> str:
    return json.dumps(
        {
            "last_node_id": 9,
            "nodes": [
                {"id": 4, "type": "CheckpointLoaderSimple", "widgets_values": [ckpt_name]},
                {
                    "id": 3,
                    "type": "KSampler",
                    "widgets_values": [42, "fixed", 12, 7, "euler", "normal", 1],
                },
            ],
        }
    )


# --- input pictures that are not what they seem -------------------------------------------------


def postscript(path: Path, side: int = 64) -> Path:
    """An Encapsulated PostScript file (whatever `path` is named: `.eps`, or `.png` to pass
    for a picture). Pillow identifies it by its first bytes and, asked for its pixels, hands it
    to Ghostscript; this one would loop for ever there."""
    path.write_bytes(
        b"%!PS-Adobe-3.0 EPSF-3.0\n"
        + f"%%BoundingBox: 0 0 {side} {side}\n".encode()
        + b"%%EndComments\n{ } loop\n%%EOF\n"
    )
    return path


def truncated(path: Path, kind: str = "PNG", keep: float = 0.5) -> Path:
    """A picture of seeded noise (PNG or JPEG, by `kind`) cut after `keep` of its bytes: its
    header is whole, its pixels end early, as a download stopped half-way leaves it."""
    buffer = io.BytesIO()
    pixels("noise", 64).save(buffer, format=kind)
    data = buffer.getvalue()
    path.write_bytes(data[: int(len(data) * keep)])
    return path


FORGE_VERSION = "f2.0.1v1.10.1-previous-669-gdfdcbab6"


def forge_parameters(model: str = "nowhere", model_hash: str = "0123456789") -> str:
    """Forge's infotext, written with HalfSafe's own writer (Forge's Version: f, a digit)."""
    values = [
        (infotext.STEPS, 12),
        (infotext.SAMPLER, "Euler a"),
        (infotext.SEED, 1234),
        (infotext.SIZE, (64, 64)),
        (infotext.MODEL_HASH, model_hash),
        (infotext.MODEL, model),
        (infotext.VERSION, FORGE_VERSION),
    ]
    return infotext.write("a lighthouse at night", "blurry", values)
