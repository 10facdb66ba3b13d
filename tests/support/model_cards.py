"""Small model and LoRA files whose headers carry the metadata trainers write (kohya's `ss_*`
keys, modelspec), hostile headers, and preview pictures beside them. numpy only, no torch."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

KOHYA_SDXL = {
    "ss_base_model_version": "sdxl_base_v1-0",
    "ss_sd_model_name": "sd_xl_base_1.0.safetensors",
    "ss_resolution": "(1024, 1024)",
    "ss_network_dim": "32",
    "ss_network_alpha": "16.0",
    "ss_output_name": "inkwash",
    "ss_tag_frequency": json.dumps(
        {"10_inkwash": {"inkwash style": 40, "1girl": 12, "mountain": 25}, "5_extra": {"1girl": 30}}
    ),
}
MODELSPEC_SD1 = {
    "modelspec.architecture": "stable-diffusion-v1/lora",
    "modelspec.title": "Paper Cut",
    "modelspec.trigger_phrase": "papercut, layered paper",
    "modelspec.resolution": "512x512",
}


def lora_file(path: Path, metadata: dict[str, str] | None = None) -> Path:
    """A tiny kohya-layout LoRA (one down/up pair) with `metadata`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {
        "lora_unet_down_blocks_0_attn.lora_down.weight": np.zeros((4, 8), np.float16),
        "lora_unet_down_blocks_0_attn.lora_up.weight": np.zeros((8, 4), np.float16),
    }
    save_file(tensors, str(path), metadata=metadata)
    return path


def raw_header(path: Path, header: bytes, *, length: int | None = None, data: bytes = b"") -> Path:
    """A safetensors file written byte by byte: any header bytes, any length field."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(header) if length is None else length) + header + data)
    return path


def metadata_header(metadata: object) -> bytes:
    """A header with no tensors and `metadata` as its __metadata__ (any JSON value)."""
    return json.dumps({"__metadata__": metadata}).encode()


def png_file(path: Path, size: tuple[int, int] = (64, 48), colour=(200, 40, 40)) -> Path:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path)
    return path
