"""Planted comfy-kitchen backends with the low-bit kernel faults users meet on older cards,
registered with comfy-kitchen's own registry (`registry.register(name, module, capabilities)`,
the eager backend's constraints) and put first in its order of preference, for the duration.

Each offers the int8 GEMM (`int8_linear`) and the int8 decode (`dequantize_int8_simple_dtype`),
computed by the eager backend, except where its fault strikes:
- "wrong_m": the GEMM's output is garbage for M = 97..127 (rows between two tile sizes) while
  96 and 128 are right;
- "tiled": the GEMM returns one tile of noise repeated over the output, at every M (the
  "deterministic tiled psychedelic noise" of an int8 GEMM on a card it does not support);
- "refuses": the GEMM raises "INT8 GEMM not supported on this GPU for these dimensions" for
  M = 97..127;
- "cuda_only": no fault, but the GEMM's declared constraints take CUDA tensors only, so the
  registry turns a CPU call away (to the next backend) before it runs.
The decode is always right: the faults are the GEMM's.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

import torch

from tests.support.kitchen_backends import registered

NAME = "planted_lowbit"
OPS = ("int8_linear", "dequantize_int8_simple_dtype")
REFUSAL = "INT8 GEMM not supported on this GPU for these dimensions"
BAD_MS = range(97, 128)


def _gemm(fault: str):
    def int8_linear(**kwargs):
        import comfy_kitchen

        honest = comfy_kitchen.registry.get_implementation("int8_linear", backend="eager")
        m = kwargs["x"].reshape(-1, kwargs["x"].shape[-1]).shape[0]
        if fault == "refuses" and m in BAD_MS:
            raise RuntimeError(REFUSAL)
        out = honest(**kwargs)
        if fault == "wrong_m" and m in BAD_MS:
            return torch.randn(out.shape, generator=torch.Generator().manual_seed(m)).to(out)
        if fault == "tiled":
            tile = torch.randn(16, 16, generator=torch.Generator().manual_seed(0)) * 100
            rows, cols = out.shape[-2], out.shape[-1]
            tiled = tile.repeat(-(-rows // 16), -(-cols // 16))[:rows, :cols]
            return tiled.to(out).expand_as(out).clone()
        return out

    return int8_linear


@contextmanager
def planted_lowbit(fault: str) -> Iterator[str]:
    """The planted backend with `fault` ("wrong_m", "tiled", "refuses", "cuda_only"), registered and
    preferred; the registry is put back as it was in a finally."""
    import comfy_kitchen

    registry = comfy_kitchen.registry
    module = ModuleType(f"comfy_kitchen_{NAME}")
    module.int8_linear = _gemm(fault)  # type: ignore[attr-defined]
    module.dequantize_int8_simple_dtype = registry.get_implementation(  # type: ignore[attr-defined]
        "dequantize_int8_simple_dtype", backend="eager"
    )
    constraints = {op: registry.get_constraints("eager", op) for op in OPS}
    if fault == "cuda_only":
        from comfy_kitchen.constraints import FunctionConstraints, ParamConstraint

        cuda = frozenset({"cuda"})
        constraints["int8_linear"] = FunctionConstraints(
            params={"x": ParamConstraint(devices=cuda)}, default_devices=cuda
        )
    with registered(NAME, module, constraints) as name:
        yield name
