"""The pickle policy. Pickle checkpoints (`.ckpt`, `.pt`, `.bin`) can run code when opened; they
are refused unless the user allows them, and even then only PyTorch's weights-only loader reads
them, and only plain dense tensors are kept.

Imports torch only inside the functions that need it.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

from app.core.checkpoint.header import (
    _ZIP_MAGIC,
    SAFETENSORS_SUFFIX,
    _file_size,
    _looks_like_pickle,
)
from app.core.errors import BadFileError, PickleRefusedError
from app.core.limits import check_tensor_shape, open_regular

PICKLE_SUFFIXES = (".ckpt", ".pt", ".pth", ".bin", ".pkl")


def is_pickle_file(path: str | Path) -> bool:
    """True for the pickle suffixes, and for any file whose first bytes are a pickle or a zip."""
    path = Path(path)
    if path.suffix.lower() in PICKLE_SUFFIXES:
        return True
    try:
        with open_regular(path) as handle:
            head = handle.read(8)
    except OSError:
        return False
    return head.startswith(_ZIP_MAGIC) or _looks_like_pickle(head)


def _refuse_if_not_torch_save(path: Path) -> None:
    """A file under a pickle suffix that torch.save did not write (neither a zip archive nor a
    pickle of protocol 2+: random or damaged bytes) is named as such, not as possible code."""
    with open_regular(path) as handle:
        head = handle.read(8)
    if not (head.startswith(_ZIP_MAGIC) or _looks_like_pickle(head)):
        raise BadFileError(
            path,
            "the file is neither a zip archive nor a pickle, so it is not a PyTorch checkpoint "
            "(it is damaged, or another kind of file under this name).",
        )


def refuse_pickle(path: str | Path) -> None:
    """Raise the one-sentence refusal for a pickle file the user has not allowed (or, for a
    file that is no pickle at all, the sentence saying so)."""
    path = Path(path)
    _refuse_if_not_torch_save(path)
    kind = path.suffix.lower() or "pickle"
    raise PickleRefusedError(
        path,
        f"this is a pickle file ({kind}), which can run any code on your computer when "
        "opened; HalfSafe opens it only if you allow pickles (--allow-pickle), and then only "
        "with PyTorch's weights-only loader.",
    )


def load_pickle_state_dict(path: str | Path) -> dict[str, Any]:
    """Read a pickle checkpoint with PyTorch's weights-only loader and return its tensors.

    Nothing in the file runs: the weights-only unpickler accepts tensors and plain containers
    only, and fails on anything else (which is reported as a bad file). A nested "state_dict"
    (Lightning/LDM checkpoints) is unwrapped, stopping at a loop; non-tensor entries are
    dropped. Each tensor must be a plain dense CPU tensor whose elements its stored bytes
    really hold (see `_pickle_tensor_problem`). Zip checkpoints are memory-mapped, as
    safetensors are (see `Checkpoint.check_unchanged`). PyTorch's warnings stay quiet.
    """
    import pickle
    import warnings
    import zipfile

    import torch

    path = Path(path)
    size = _file_size(path)
    if size == 0:
        raise BadFileError(path, "the file is empty (0 bytes), so it holds no model.")
    _refuse_if_not_torch_save(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loaded = _torch_load(path)
    except pickle.UnpicklingError:
        raise BadFileError(
            path,
            "PyTorch's weights-only loader refused this file because it holds more than "
            "plain tensors (possibly code), so HalfSafe will not open it.",
        ) from None
    except OSError as error:
        raise BadFileError(path, f"the file cannot be read ({error.strerror or error}).") from None
    except (RuntimeError, EOFError, ValueError, zipfile.BadZipFile, struct.error):
        raise BadFileError(
            path,
            "the file is damaged, truncated or changed while it was read: PyTorch could not "
            "read it as a checkpoint.",
        ) from None
    except MemoryError:
        raise BadFileError(
            path, "the file declares more data than this computer's memory, so it is damaged."
        ) from None
    loaded = _unwrap_state_dict(path, loaded)
    tensors = {
        k: v for k, v in loaded.items() if isinstance(k, str) and isinstance(v, torch.Tensor)
    }
    if not tensors:
        raise BadFileError(path, "the file holds no weights.")
    total = 0
    for name, tensor in tensors.items():
        problem = _pickle_tensor_problem(tensor)
        if problem is not None:
            raise BadFileError(path, f"tensor '{name}' {problem}.")
        total += tensor.numel() * tensor.element_size()
    # Tied weights may share bytes, but never many times over: without this bound, thousands of
    # names for one large tensor would make the weight scan read the file thousands of times.
    if total > _MAX_PICKLE_REUSE * size + (1 << 20):
        raise BadFileError(
            path,
            f"its tensors add up to {total / 1e9:.1f} GB but the file holds only "
            f"{size / 1e9:.1f} GB, so it names the same data over and over.",
        )
    return tensors


def _torch_load(path: Path) -> Any:
    """torch.load with the weights-only loader, memory-mapping zip checkpoints.

    torch.load hands any path ending in ".safetensors" to safetensors, whatever the file holds;
    a pickle under that name is read through a file object instead (not mapped). The legacy
    (pre-zip) format cannot be mapped either.
    """
    import torch

    if not str(path).endswith(SAFETENSORS_SUFFIX):
        try:
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as error:
            if "mmap" not in str(error):
                raise
    with open_regular(path) as handle:
        return torch.load(handle, map_location="cpu", weights_only=True)


# How many times over a pickle's tensors may cover its file: tied embeddings count twice.
_MAX_PICKLE_REUSE = 4


def _unwrap_state_dict(path: Path, loaded: Any) -> dict[str, Any]:
    """Follow "state_dict" entries (a Lightning checkpoint holds the weights one level down)
    to the dictionary of weights; a chain that loops back on itself is a bad file."""
    seen: set[int] = set()
    while isinstance(loaded, dict) and isinstance(loaded.get("state_dict"), dict):
        if id(loaded) in seen:
            raise BadFileError(
                path,
                "its state_dict entries refer back to each other in a loop, so it holds no "
                "weights (the file is damaged or hostile).",
            )
        seen.add(id(loaded))
        loaded = loaded["state_dict"]
    if not isinstance(loaded, dict):
        raise BadFileError(path, "the file does not hold a dictionary of weights.")
    return loaded


def _pickle_tensor_problem(tensor) -> str | None:
    """Why a tensor from a pickle is not a plain weight HalfSafe can read, or None.

    The weights-only loader still builds sparse, quantized, nested and meta tensors, and views
    whose elements repeat a few stored values (a stride-0 view of 4 bytes can claim 1e12
    elements, which a weight scan would add up for hours).
    """
    import torch

    if tensor.is_meta or tensor.device.type != "cpu":
        return "is a placeholder without data (a meta tensor), so the file holds no weights there"
    if tensor.layout != torch.strided or tensor.is_nested:
        return f"is a {str(tensor.layout).removeprefix('torch.')} tensor, not a dense weight"
    if tensor.is_quantized:
        return "is a quantized tensor, which HalfSafe cannot check or run"
    too_big = check_tensor_shape(tensor.shape)
    if too_big is not None:
        return too_big
    stored = tensor.untyped_storage().nbytes()
    if tensor.numel() * tensor.element_size() > stored:
        return (
            f"claims {tensor.numel():.3g} elements but stores only {stored} bytes (a stride-0 "
            "or overlapping view), which no model file holds"
        )
    return None
