"""Attention kernels HalfSafe does not ship, found in this Python environment: SageAttention and
xformers installed, and PyTorch's `scaled_dot_product_attention` replaced at run time by another
library ("patched SDPA"); the functional ops a library of fused kernels replaces the same way
(`FUSED_OPS`: RMS and layer norm, group norm, linear, GELU, SiLU, the ops Apex- and Liger-style
libraries fuse; comfy-kitchen's own ops are compared in `fused`); PyTorch's own SDPA and ops;
and the comparison of a replacement with PyTorch's own on the same inputs (the math kernel for
attention), call by call, during one run.

Detection is cheap and imports nothing: a package is found with `importlib.util.find_spec` and
its version read from its distribution's metadata (a CUDA extension is never imported just to
be listed), and the SDPA function is compared with PyTorch's own only when torch is already
imported (nothing can have replaced it before). Imports no other HalfSafe module, and
`importlib.metadata` only when detecting: the window's process reads `AttentionKernel` (in a
hardware report) and never detects.
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

# Attention libraries that image tools use in place of PyTorch's kernels: the name a user
# installs (its distribution) and the module it imports as.
KNOWN = {
    "sageattention": "sageattention",  # thu-ml/SageAttention: 8-bit (int8/fp8) attention
    "xformers": "xformers",  # facebookresearch/xformers: memory_efficient_attention
}
# diffusers' attention dispatcher reads its default backend from this variable
# (diffusers/utils/constants.py); "native" is PyTorch's SDPA.
DIFFUSERS_BACKEND_ENV = "DIFFUSERS_ATTN_BACKEND"
SDPA = "scaled_dot_product_attention"
# The functional ops fused-kernel libraries replace (Apex- and Liger-style fused norms and
# activations), each with PyTorch's own implementation at the same signature (`_torch_op`).
# comfy-kitchen replaces none of them: its tool calls its ops by name (`fused`).
FUSED_OPS = ("rms_norm", "layer_norm", "group_norm", "linear", "gelu", "silu")


@dataclass(frozen=True)
class AttentionKernel:
    """One attention kernel found here. `patched_sdpa` when its function is what
    `torch.nn.functional.scaled_dot_product_attention` is now (`function` names it);
    `diffusers_backend` when diffusers' dispatcher is set to it by the environment."""

    name: str  # the distribution ("sageattention"), or the module a patched function lives in
    version: str | None = None
    patched_sdpa: bool = False
    function: str | None = None  # module.qualname of the function that replaced SDPA or `op`
    diffusers_backend: str | None = None
    # The torch.nn.functional op it replaced: SDPA for an attention kernel, else one of
    # FUSED_OPS (a fused kernel: `patched_sdpa` is False then); for comfy-kitchen, which
    # replaces nothing, the op of its own it runs (`fused.OPS`).
    op: str = SDPA
    # The library's backend that ran the op, where it has several (comfy-kitchen's `cuda`,
    # `triton`, ...); None for a library with one.
    backend: str | None = None

    @property
    def fused(self) -> bool:
        """A fused kernel replacing a functional op other than attention."""
        return self.op != SDPA

    def words(self) -> str:
        """ "sageattention 2.1.1", "comfy-kitchen 0.2.40 (triton backend)"; the name alone
        when no version is known."""
        words = f"{self.name} {self.version}" if self.version else self.name
        return f"{words} ({self.backend} backend)" if self.backend else words

    def what(self) -> str:
        """ "the attention kernel" or "the fused rms_norm kernel", before its words."""
        return f"the fused {self.op} kernel" if self.fused else "the attention kernel"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "patched_sdpa": self.patched_sdpa,
            "function": self.function,
            "diffusers_backend": self.diffusers_backend,
            "op": self.op,
            "backend": self.backend,
        }


def _version(distribution: str) -> str | None:
    import importlib.metadata  # tens of ms of imports (email, zipfile): only when detecting

    try:
        return importlib.metadata.version(distribution)
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken package, or one half-imported with no spec
        return False


def torch_sdpa() -> Callable[..., Any]:
    """PyTorch's own scaled_dot_product_attention (its C++ entry point, which
    `torch.nn.functional` exports unless something replaced it). Imports torch."""
    import torch

    return torch._C._nn.scaled_dot_product_attention  # pyright: ignore[reportAttributeAccessIssue]


def _torch_op(op: str) -> Callable[..., Any]:
    """PyTorch's own `op`, called as torch.nn.functional calls it, built on torch's C entry
    points (which a library patching torch.nn.functional leaves alone). Imports torch."""
    import torch

    nn = torch._C._nn  # pyright: ignore[reportAttributeAccessIssue]

    def rms_norm(input, normalized_shape, weight=None, eps=None):
        return torch.rms_norm(input, normalized_shape, weight, eps)

    def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
        return torch.layer_norm(input, normalized_shape, weight, bias, eps)

    def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
        return torch.group_norm(input, num_groups, weight, bias, eps)

    def linear(input, weight, bias=None):
        return nn.linear(input, weight, bias)

    def gelu(input, approximate="none"):
        return nn.gelu(input, approximate=approximate)

    own = {
        "rms_norm": rms_norm,
        "layer_norm": layer_norm,
        "group_norm": group_norm,
        "linear": linear,
        "gelu": gelu,
        "silu": _silu,
    }
    return own[op]


def _silu(input, inplace=False):
    import torch

    return torch._C._nn.silu_(input) if inplace else torch._C._nn.silu(input)  # pyright: ignore[reportAttributeAccessIssue]


def current_sdpa() -> Callable[..., Any] | None:
    """What `torch.nn.functional.scaled_dot_product_attention` is now; None while torch is not
    imported (then nothing has replaced it)."""
    functional = sys.modules.get("torch.nn.functional")
    return getattr(functional, "scaled_dot_product_attention", None) if functional else None


def _owner(function: Callable[..., Any]) -> tuple[str, str | None]:
    """(the distribution that provides `function`, its version), from the function's module;
    the module's top-level name when no installed distribution claims it."""
    import importlib.metadata

    module = str(getattr(function, "__module__", None) or "unknown")
    top = module.split(".")[0]
    try:
        owners = importlib.metadata.packages_distributions().get(top) or []
    except Exception:  # noqa: BLE001 - a damaged metadata folder must not break the listing
        owners = []
    name = owners[0] if owners else top
    return name, _version(name)


def patched_sdpa() -> AttentionKernel | None:
    """The function that replaced PyTorch's SDPA in this process, named after the library it
    comes from; None when SDPA is PyTorch's own (or torch is not imported)."""
    function = current_sdpa()
    if function is None or function is torch_sdpa():
        return None
    name, version = _owner(function)
    qualname = getattr(function, "__qualname__", getattr(function, "__name__", "?"))
    where = f"{getattr(function, '__module__', None) or '?'}.{qualname}"
    return AttentionKernel(name, version, patched_sdpa=True, function=where)


def _is_torch_own(op: str, function: Callable[..., Any]) -> bool:
    """Whether `function` is PyTorch's own `op`: its C entry point itself, or a function whose
    code is torch.nn.functional's (a wrapper copies the name and module, never the code)."""
    import torch

    if function is getattr(torch._C._nn, op, None):  # pyright: ignore[reportAttributeAccessIssue]
        return True
    code = getattr(function, "__code__", None)
    filename = str(getattr(code, "co_filename", "")).replace("\\", "/")
    return filename.endswith("torch/nn/functional.py")


def patched_ops() -> list[AttentionKernel]:
    """The fused kernels that replaced functional ops (FUSED_OPS) in this process, each named
    after the library it comes from; [] while torch is not imported."""
    functional = sys.modules.get("torch.nn.functional")
    if functional is None:
        return []
    found = []
    for op in FUSED_OPS:
        function = getattr(functional, op, None)
        if function is None or _is_torch_own(op, function):
            continue
        name, version = _owner(function)
        qualname = getattr(function, "__qualname__", getattr(function, "__name__", "?"))
        where = f"{getattr(function, '__module__', None) or '?'}.{qualname}"
        found.append(AttentionKernel(name, version, function=where, op=op))
    return found


def foreign_kernels() -> list[AttentionKernel]:
    """Every kernel HalfSafe does not ship that this process's runs go through: the SDPA
    replacement first, then the fused ops."""
    sdpa = patched_sdpa()
    return ([sdpa] if sdpa is not None else []) + patched_ops()


def installed_kernels() -> list[AttentionKernel]:
    """Every attention kernel found here: the known libraries installed (`KNOWN`), the library
    that replaced SDPA (merged into its installed entry), and diffusers' dispatcher backend when
    the environment sets one other than PyTorch's; then each functional op a fused-kernel
    library replaced (`patched_ops`). Imports nothing new; tens of ms at most."""
    found: dict[str, AttentionKernel] = {}
    for distribution, module in KNOWN.items():
        if _installed(module):
            found[distribution] = AttentionKernel(distribution, _version(distribution))
    patched = patched_sdpa()
    if patched is not None:
        base = found.get(patched.name)
        found[patched.name] = AttentionKernel(
            patched.name,
            patched.version or (base.version if base else None),
            patched_sdpa=True,
            function=patched.function,
        )
    backend = os.environ.get(DIFFUSERS_BACKEND_ENV, "").strip()
    if backend and backend != "native":
        name = next((d for d in KNOWN if backend.startswith(d[:4])), f"diffusers:{backend}")
        base = found.get(name)
        found[name] = AttentionKernel(
            name,
            base.version if base else _version(name),
            patched_sdpa=base.patched_sdpa if base else False,
            function=base.function if base else None,
            diffusers_backend=backend,
        )
    return list(found.values()) + patched_ops()


@contextmanager
def torch_own_kernels() -> Iterator[None]:
    """PyTorch's own SDPA and functional ops (FUSED_OPS) in `torch.nn.functional` for the
    duration, whatever replaced them; the replacements are put back after. Process-wide: the
    engine runs one job at a time."""
    import torch.nn.functional as F

    replaced = {SDPA: F.scaled_dot_product_attention}
    if replaced[SDPA] is torch_sdpa():
        del replaced[SDPA]
    replaced.update({k.op: getattr(F, k.op) for k in patched_ops()})
    for op in replaced:
        setattr(F, op, torch_sdpa() if op == SDPA else _torch_op(op))
    try:
        yield
    finally:
        for op, function in replaced.items():
            setattr(F, op, function)


# --- the replacement against PyTorch's math kernel, on the same inputs ------------------------


@dataclass
class KernelComparison:
    """What a replacement SDPA gave against PyTorch's math kernel on the same q/k/v, call by
    call. `snr_db` is 10*log10(signal/noise) of the replacement's output against the math
    kernel's (as `quality.snr_db` measures whole outputs)."""

    kernel: AttentionKernel
    calls: int = 0
    first_bad_call: int | None = None  # 0-based index of the first call judged bad
    finding: str | None = None  # "non_finite" | "drift" | None
    worst_snr_db: float = math.inf
    shape: list[int] = field(default_factory=list)  # q's shape at the first bad call
    dtype: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "first_bad_call": self.first_bad_call,
            "finding": self.finding,
            "worst_snr_db": round(self.worst_snr_db, 2)
            if math.isfinite(self.worst_snr_db)
            else None,
            "shape": list(self.shape),
            "dtype": self.dtype,
        }


def _snr_db(output, reference) -> float:
    ref = reference.detach().float()
    noise = float((output.detach().float() - ref).square().sum())
    signal = float(ref.square().sum())
    if not (math.isfinite(noise) and math.isfinite(signal)):
        return -math.inf
    if noise == 0.0:
        return math.inf
    return -math.inf if signal == 0.0 else 10.0 * math.log10(signal / noise)


@contextmanager
def comparing(kernel: AttentionKernel, threshold_db: float) -> Iterator[KernelComparison]:
    """While active, every call of the replaced op (`kernel.op`: SDPA or a fused op) runs both
    the replacement and PyTorch's own (for attention, its math kernel) on the same inputs;
    PyTorch's output is returned, so the run goes on with trusted values and every later call is
    compared on the inputs a correct run gives. A call is bad when the replacement's output is
    non-finite where PyTorch's is finite (`non_finite`), or agrees with it below `threshold_db`
    (`drift`). The replacement is put back in a finally. Doubles the cost of the op for the
    run."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    replacement = getattr(F, kernel.op)
    own = torch_sdpa() if kernel.op == SDPA else _torch_op(kernel.op)
    result = KernelComparison(kernel)

    def compared(query, *args, **kwargs):
        in_place = kwargs.get("inplace") is True or (kernel.op == "silu" and True in args)
        theirs = replacement(query.clone() if in_place else query, *args, **kwargs)
        if kernel.op == SDPA:
            with sdpa_kernel([SDPBackend.MATH]):
                reference = own(query, *args, **kwargs)
        else:
            reference = own(query, *args, **kwargs)
        index = result.calls
        result.calls += 1
        if not bool(torch.isfinite(reference).all()):
            return reference  # the inputs themselves overflow: not the kernel's doing
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
            result.shape, result.dtype = list(query.shape), str(query.dtype).replace("torch.", "")
        return reference

    setattr(F, kernel.op, compared)
    try:
        yield result
    finally:
        setattr(F, kernel.op, replacement)
