"""Building a component from a config and stored tensors: the config checked against real
models' sizes, the module built empty, the tensors assigned as they are stored; a failure
is one sentence naming the file."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from app.core import architecture as arch
from app.core.checkpoint.reader import Checkpoint
from app.core.errors import BadFileError, UnsupportedModelError

_TORCH_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32", "fp64": "float64"}


def infer(
    path: Path, detection: arch.Detection, function, check, *args, **kwargs
) -> dict[str, Any]:
    """A component config inferred from the file's shapes, and `check`ed against the sizes of
    real models before anything is built from it (a 0-byte tensor can name any size)."""
    try:
        config = function(*args, **kwargs)
    except ValueError as error:
        raise UnsupportedModelError(
            path, f"this looks like {detection.looks_like}, but {error}."
        ) from None
    try:
        check(config)
    except ValueError as error:
        raise BadFileError(
            path, f"the weights' shapes describe a model no real file holds: {error}."
        ) from None
    return config


def built(path: Path, words: str, build, *args):
    """`build(*args)` for one component, where a file whose names and shapes passed every
    check still does not fit what diffusers or transformers expect: a sentence, not a trace."""
    try:
        return build(*args)
    except (ValueError, KeyError, IndexError, TypeError, AttributeError, RuntimeError) as error:
        raise UnsupportedModelError(
            path,
            f"the {words} cannot be built from this file's weights ({first_line(error)}).",
        ) from None


def empty(build, *args) -> Any:
    """`build(*args)` without allocating or initialising parameters (they come from the
    checkpoint)."""
    import importlib
    from contextlib import nullcontext

    from accelerate import init_empty_weights

    # transformers would otherwise run its random init on the empty tensors; the helper moved
    # between modules across transformers versions.
    no_init_weights: Any = nullcontext
    for module in ("transformers.initialization", "transformers.modeling_utils"):
        with contextlib.suppress(ImportError, AttributeError):
            no_init_weights = importlib.import_module(module).no_init_weights
            break
    with init_empty_weights(include_buffers=False), no_init_weights():
        return build(*args)


def assign(path: Path, model, state: dict[str, Any], words: str):
    """Put `state` into `model` as is (no copy), all or nothing, in the component's dtype."""
    import torch

    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    if missing:
        raise BadFileError(
            path,
            f"the {words} is incomplete: {len(missing)} of its weights are "
            f"missing (e.g. {missing[0]}).",
        )
    if unexpected:
        raise UnsupportedModelError(
            path,
            f"the {words} has {len(unexpected)} weights HalfSafe "
            f"cannot place (e.g. {unexpected[0]}).",
        )
    for key, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[key].shape):
            raise BadFileError(
                path,
                f"the {words} weight {key} has shape {list(tensor.shape)} "
                f"where the rest of the file implies "
                f"{list(expected[key].shape)}.",
            )
        if expected[key].is_floating_point() and not tensor.is_floating_point():
            kind = "bool" if tensor.dtype == torch.bool else "integer"
            raise BadFileError(
                path,
                f"the {words} weight {key} is stored as {kind} values "
                f"({str(tensor.dtype).removeprefix('torch.')}) where a floating-point weight "
                "belongs, so the file is damaged or not this model.",
            )
    by_dtype: dict[Any, int] = {}
    for tensor in state.values():
        if tensor.is_floating_point():
            by_dtype[tensor.dtype] = by_dtype.get(tensor.dtype, 0) + tensor.numel()
    dtype = max(by_dtype, key=by_dtype.__getitem__) if by_dtype else torch.float32
    state = {
        k: (v.to(dtype) if v.is_floating_point() and v.dtype != dtype else v)
        for k, v in state.items()
    }
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval()


def nbytes(checkpoint: Checkpoint, key: str) -> int:
    if checkpoint.header is not None:
        return checkpoint.header.tensors[key].nbytes
    tensor = checkpoint.get(key)
    return tensor.numel() * tensor.element_size()


def torch_dtype(name: str):
    import torch

    return getattr(torch, _TORCH_DTYPES.get(name, "float32"))


def first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    line = text[0] if text else type(error).__name__
    return line[:200].rstrip(".")
