"""The dtype codes of checkpoint files: bits per element, which ones are floating point, the
names HalfSafe shows for a model's storage precision, and the torch dtype each code is read as
(and written from).

Imports torch only inside the functions that need it.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from app.core.errors import BadFileError
from app.core.formats import gguf

# Bits per element of every dtype the safetensors format defines.
DTYPE_BITS = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "I64": 64,
    "U64": 64,
    "F64": 64,
    "C64": 64,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
}
# The floating dtypes, and the codes of weights that stand for floating values though their file
# stores integers (`quantized.model_view`: NVFP4, INT8).
FLOAT_DTYPES = {
    "NVFP4",
    "INT8",
    "F16",
    "BF16",
    "F32",
    "F64",
    "F8_E5M2",
    "F8_E4M3",
    "F8_E8M0",
    "F4",
    "F6_E2M3",
    "F6_E3M2",
}
# The names HalfSafe shows for a model's storage precision.
DTYPE_NAMES = {
    "F16": "fp16",
    "BF16": "bf16",
    "F32": "fp32",
    "F64": "fp64",
    "F8_E5M2": "fp8",
    "F8_E4M3": "fp8",
    "F8_E8M0": "fp8",
    "NVFP4": "nvfp4",
    "INT8": "int8",
}


def _torch_dtype(path: Path, name: str, code: str):
    import torch

    names = {
        "F16": "float16",
        "BF16": "bfloat16",
        "F32": "float32",
        "F64": "float64",
        "I8": "int8",
        "U8": "uint8",
        "I16": "int16",
        "U16": "uint16",
        "I32": "int32",
        "U32": "uint32",
        "I64": "int64",
        "U64": "uint64",
        "BOOL": "bool",
        "F8_E4M3": "float8_e4m3fn",
        "F8_E5M2": "float8_e5m2",
        "F8_E8M0": "float8_e8m0fnu",
        "C64": "complex64",
    }
    dtype = getattr(torch, names.get(code, ""), None)
    if dtype is None:
        raise BadFileError(
            path, f"tensor '{name}' is stored as {code}, which this PyTorch cannot read."
        )
    return dtype


_GGUF_PREFIX = gguf.GGUF_DTYPE_PREFIX
_gguf_code = gguf.gguf_dtype_code


def _safetensors_dtype(dtype: Any) -> str:
    import torch

    names = {
        torch.float16: "F16",
        torch.bfloat16: "BF16",
        torch.float32: "F32",
        torch.float64: "F64",
        torch.int64: "I64",
        torch.int32: "I32",
        torch.int16: "I16",
        torch.int8: "I8",
        torch.uint8: "U8",
        torch.bool: "BOOL",
        torch.float8_e4m3fn: "F8_E4M3",
        torch.float8_e5m2: "F8_E5M2",
        torch.float8_e8m0fnu: "F8_E8M0",
    }
    return names.get(dtype, str(dtype).removeprefix("torch.").upper())


def stored_dtype(dtypes: Iterable[str]) -> str:
    """ "fp16", "bf16", "fp32" (or "fp8", a GGUF type such as "q8_0") when every floating
    tensor has that dtype, else "mixed".

    Integer tensors (position ids, step counters) do not count.
    """
    found = {
        DTYPE_NAMES.get(d, d.removeprefix(_GGUF_PREFIX).lower())
        for d in dtypes
        if d in FLOAT_DTYPES or d.startswith(_GGUF_PREFIX)
    }
    if len(found) == 1:
        return found.pop()
    return "mixed" if found else "none"
