"""comfy-kitchen's fused ops against PyTorch's own, backend by backend, on the same fp16 inputs.

comfy-kitchen (PyPI `comfy-kitchen`, Apache-2.0) is the kernel library ComfyUI and Forge Neo run
fused ops through. It replaces nothing in `torch.nn.functional`: the tool calls its ops by name,
and each call is sent to the first of its backends (`ascend`, `cuda`, `triton`, `eager`, in that
order; `hip` first on a supported AMD GPU) that is registered, not disabled and able to take the
inputs. `eager` is plain PyTorch. Facts read from comfy-kitchen 0.2.40 and ComfyUI:
- ComfyUI's Flux-style attention applies RoPE with `comfy_kitchen.apply_rope` and `apply_rope1`
  whenever it is not training (comfy/ldm/flux/math.py), so every DiT it runs that way goes
  through the chosen backend's RoPE.
- ComfyUI turns the `triton` backend off unless it is started with `--enable-triton-backend`
  (and `--disable-triton-backend` overrides that), and the `cuda` backend off under a PyTorch
  built for CUDA older than 13 (comfy/cli_args.py, comfy/quant_ops.py); it has no flag for
  `cuda` or `hip`. comfy-kitchen's own `COMFY_KITCHEN_DISABLE_HIP=1` keeps `hip` off.
- The registry: `list_backends()` (each backend's `available`, `disabled`, `capabilities`),
  `registry.get_implementation(op, backend=..., kwargs=...)` (raises when that backend cannot
  take the call, where `use_backend` would quietly fall back to the next one),
  `registry.register(name, module, capabilities)` and `set_priority`.

Compared here (`OPS`): the RoPE ops (interleaved and split-half pairs, alone and after an RMS
norm) and the modulated norms (`adaln`, `rms_adaln`, `rms_gated_residual`): the ops every DiT
step runs. The quantised matmuls (`scaled_mm_*`, `int8_linear`, ...) take fp8/fp4/int8 weights,
which have no fp16 reference of the same inputs, and `fp16_linear` sends small calls to PyTorch's
own linear; they are not compared.

Each op runs twice on the same inputs: typical activations (unit scale), and large ones (up to
30,000, inside fp16's range, where an fp16 accumulation in a norm overflows). The reference is
PyTorch's own ops on the same fp16 tensors (RoPE, which PyTorch has no op for, computed in the
tables' fp32 as ComfyUI's own code does, then rounded to fp16). A call whose reference is
non-finite is not judged (the inputs overflow PyTorch too); one whose output is NaN or Inf where
PyTorch's is finite is `non_finite`; one agreeing below the threshold is `drift`.

Detection imports nothing (`importlib.util.find_spec`); comparing imports comfy_kitchen and torch.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.core.precision.kernels import AttentionKernel, KernelComparison, _snr_db, _version

DISTRIBUTION = "comfy-kitchen"
MODULE = "comfy_kitchen"
LARGE = (
    30000.0  # the large inputs' peak: inside fp16's 65504, past what an fp16 sum of squares holds
)
_TOKENS, _HEADS, _HEAD_DIM = 64, 2, 64


def installed() -> str | None:
    """comfy-kitchen's version when it can be imported here ("" when its version is unknown),
    else None. Imports nothing."""
    try:
        if importlib.util.find_spec(MODULE) is None:
            return None
    except (ImportError, ValueError):
        return None
    return _version(DISTRIBUTION) or ""


def _rotations(dtype):
    """RoPE tables as comfy-kitchen takes them: (1, 1, tokens, head_dim/2, 2, 2) rotation
    matrices [[cos, -sin], [sin, cos]], in `dtype` (fp32, as ComfyUI builds them)."""
    import torch

    positions = torch.arange(_TOKENS, dtype=torch.float64)
    omega = 1.0 / (
        10000.0 ** (torch.arange(_HEAD_DIM // 2, dtype=torch.float64) / (_HEAD_DIM // 2))
    )
    angle = positions[:, None] * omega[None]
    table = torch.stack([angle.cos(), -angle.sin(), angle.sin(), angle.cos()], dim=-1)
    return table.reshape(1, 1, _TOKENS, _HEAD_DIM // 2, 2, 2).to(dtype)


def _rotate(x, table, split_half: bool):
    """`x` rotated pairwise by `table` in the table's dtype, rounded back to x's dtype: pairs
    (2i, 2i+1), or (i, i + d/2) for split-half."""
    import torch

    wide = x.to(table.dtype)
    if split_half:
        half = wide.shape[-1] // 2
        first, second = wide[..., :half], wide[..., half:]
    else:
        first, second = wide[..., 0::2], wide[..., 1::2]
    out_first = table[..., 0, 0] * first + table[..., 0, 1] * second
    out_second = table[..., 1, 0] * first + table[..., 1, 1] * second
    if split_half:
        out = torch.cat([out_first, out_second], dim=-1)
    else:
        out = torch.stack([out_first, out_second], dim=-1).flatten(-2)
    return out.to(x.dtype)


def _rms(x, weight, eps):
    import torch.nn.functional as F

    return F.rms_norm(x, (x.shape[-1],), weight, eps)


@dataclass(frozen=True)
class FusedOp:
    """One comfy-kitchen op: its inputs at a scale, and PyTorch's own result on them."""

    name: str
    inputs: Callable[[Any, Any, float], dict[str, Any]]  # (generator, dtype, scale) -> kwargs
    reference: Callable[..., Any]  # kwargs -> tensor or tuple


def _activations(generator, dtype, scale, shape):
    import torch

    x = torch.randn(shape, generator=generator, dtype=torch.float32)
    if scale > 1:
        x = x / x.abs().max() * scale
    return x.to(dtype)


def _rope_inputs(pair: bool, norm: bool):
    def build(generator, dtype, scale):
        import torch

        shape = (1, _HEADS, _TOKENS, _HEAD_DIM)
        table = _rotations(torch.float32)
        first = _activations(generator, dtype, scale, shape)
        weight = (1 + 0.1 * torch.randn(_HEAD_DIM, generator=generator)).to(dtype)
        if pair:
            second = _activations(generator, dtype, scale, shape)
            kwargs = {"freqs_cis": table}
            if norm:
                return {"q": first, "k": second, **kwargs, "q_scale": weight, "k_scale": weight}
            return {"xq": first, "xk": second, **kwargs}
        if norm:
            return {"x": first, "freqs_cis": table, "scale": weight}
        return {"x": first, "freqs_cis": table}

    return build


def _rope_reference(pair: bool, norm: bool, split_half: bool):
    def reference(**kw):
        table = kw["freqs_cis"]
        if pair:
            q, k = kw.get("xq", kw.get("q")), kw.get("xk", kw.get("k"))
            if norm:
                eps = kw.get("epsilon", 1e-6)
                q, k = _rms(q, kw["q_scale"], eps), _rms(k, kw["k_scale"], eps)
            return _rotate(q, table, split_half), _rotate(k, table, split_half)
        x = kw["x"]
        if norm:
            x = _rms(x, kw["scale"], kw.get("epsilon", 1e-6))
        return _rotate(x, table, split_half)

    return reference


def _modulation_inputs(generator, dtype, scale):
    import torch

    x = _activations(generator, dtype, scale, (1, _TOKENS, _HEAD_DIM * _HEADS))
    shape = (1, 1, _HEAD_DIM * _HEADS)
    return {
        "x": x,
        "scale": (0.1 * torch.randn(shape, generator=generator)).to(dtype),
        "shift": (0.1 * torch.randn(shape, generator=generator)).to(dtype),
        "eps": 1e-6,
    }


def _adaln_reference(rms: bool):
    def reference(x, scale, shift, eps):
        import torch.nn.functional as F

        normal = _rms(x, None, eps) if rms else F.layer_norm(x, x.shape[-1:], eps=eps)
        return normal * (1 + scale) + shift

    return reference


def _gated_inputs(generator, dtype, scale):
    import torch

    width = _HEAD_DIM * _HEADS
    return {
        "activation": _activations(generator, dtype, scale, (1, _TOKENS, width)),
        "norm_weight": (1 + 0.1 * torch.randn(width, generator=generator)).to(dtype),
        "residual": torch.randn(1, _TOKENS, width, generator=generator).to(dtype),
        "gate": (0.1 * torch.randn(1, 1, width, generator=generator)).to(dtype),
        "eps": 1e-5,
    }


def _gated_reference(activation, norm_weight, residual, gate, eps):
    return residual + gate * _rms(activation, norm_weight, eps)


def _rope_op(name: str, pair: bool, norm: bool, split_half: bool) -> FusedOp:
    return FusedOp(name, _rope_inputs(pair, norm), _rope_reference(pair, norm, split_half))


OPS = (
    _rope_op("apply_rope", True, False, False),
    _rope_op("apply_rope1", False, False, False),
    _rope_op("apply_rope_split_half", True, False, True),
    _rope_op("apply_rope_split_half1", False, False, True),
    _rope_op("rms_rope", True, True, False),
    _rope_op("rms_rope1", False, True, False),
    FusedOp("adaln", _modulation_inputs, _adaln_reference(False)),
    FusedOp("rms_adaln", _modulation_inputs, _adaln_reference(True)),
    FusedOp("rms_gated_residual", _gated_inputs, _gated_reference),
)
SCALES = (1.0, LARGE)


def _flat(value):
    import torch

    parts = value if isinstance(value, tuple | list) else (value,)
    return torch.cat([p.detach().reshape(-1).float() for p in parts])


def backends() -> list[str]:
    """The comfy-kitchen backends a call can go to here: registered and not disabled, in the
    registry's order of preference. Imports comfy_kitchen."""
    import comfy_kitchen

    registry = comfy_kitchen.registry
    states = comfy_kitchen.list_backends()
    order = list(getattr(registry, "_priority", [])) + sorted(states)
    return [
        name
        for name in dict.fromkeys(order)
        if name in states and states[name]["available"] and not states[name]["disabled"]
    ]


def compare(threshold_db: float, device: str = "cpu") -> list[KernelComparison]:
    """Every op of `OPS` that each usable backend offers, run on the same fp16 inputs as
    PyTorch's own (both `SCALES`) on `device`, as one `KernelComparison` per (backend, op): its
    kernel names the backend (`AttentionKernel.backend`) and the op. A backend that refuses the
    call (another device's kernels) is left out. [] when comfy-kitchen is not installed. Runs on
    the calling thread; milliseconds on a GPU, well under a second on a CPU."""
    version = installed()
    if version is None:
        return []
    import comfy_kitchen
    import torch

    registry = comfy_kitchen.registry
    states = comfy_kitchen.list_backends()
    found = []
    for backend in backends():
        offered = set(states[backend]["capabilities"])
        for op in OPS:
            if op.name not in offered:
                continue
            kernel = AttentionKernel(
                DISTRIBUTION,
                version or None,
                function=f"{MODULE}.{op.name}",
                op=op.name,
                backend=backend,
            )
            result = KernelComparison(kernel)
            for index, scale in enumerate(SCALES):
                generator = torch.Generator().manual_seed(index)
                inputs = {
                    k: v.to(device) if isinstance(v, torch.Tensor) else v
                    for k, v in op.inputs(generator, torch.float16, scale).items()
                }
                try:
                    run = registry.get_implementation(op.name, backend=backend, kwargs=inputs)
                    theirs = _flat(run(**inputs))
                except Exception:  # noqa: BLE001 - a backend that cannot take the call is not judged
                    break
                reference = _flat(op.reference(**inputs))
                result.calls += 1
                if not bool(torch.isfinite(reference).all()):
                    continue  # PyTorch's own overflows on these inputs: not the kernel's doing
                if not bool(torch.isfinite(theirs).all()):
                    finding, snr = "non_finite", -math.inf
                else:
                    snr = _snr_db(theirs, reference)
                    finding = "drift" if snr < threshold_db else None
                result.worst_snr_db = min(result.worst_snr_db, snr)
                if finding is not None and (
                    result.finding is None or finding == "non_finite" != result.finding
                ):
                    result.finding, result.first_bad_call = finding, index
                    first = next(v for v in inputs.values() if isinstance(v, torch.Tensor))
                    result.shape, result.dtype = list(first.shape), "float16"
            if result.calls:
                found.append(result)
    return found


def at_fault(comparisons: list[KernelComparison]) -> KernelComparison | None:
    """The first comparison found at fault, a NaN before a drift; None when all agree."""
    bad = [c for c in comparisons if c.finding is not None]
    bad.sort(key=lambda c: c.finding != "non_finite")
    return bad[0] if bad else None
