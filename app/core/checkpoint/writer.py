"""Writing tensors as a safetensors file, each one's bytes streamed from its memory.

Imports torch only inside the function that needs it.
"""

from __future__ import annotations

import json
import os
import struct
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from app.core.checkpoint.dtypes import _safetensors_dtype


def write_safetensors(
    path: str | Path, tensors: Mapping[str, Any], metadata: Mapping[str, str] | None = None
) -> Path:
    """Write tensors as a safetensors file, streaming each tensor's bytes straight from its
    memory (no serialised copy of the whole model), to a temp file renamed into place."""
    import torch

    path = Path(path)
    ready = {name: t.detach().to("cpu").contiguous() for name, t in tensors.items()}
    header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for name, tensor in ready.items():
        size = tensor.numel() * tensor.element_size()
        header[name] = {
            "dtype": _safetensors_dtype(tensor.dtype),
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # keep tensor data 8-byte aligned, as the format advises
    # A plain exclusive open (not mkstemp) so the file gets the usual permissions.
    tmp = path.with_name(f"{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "xb") as handle:
            handle.write(struct.pack("<Q", len(raw)) + raw)
            for tensor in ready.values():
                if tensor.numel():
                    handle.write(memoryview(tensor.view(-1).view(torch.uint8).numpy()))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
