"""Attention kernels HalfSafe does not ship, found in this Python environment: SageAttention and
xformers installed, and PyTorch's `scaled_dot_product_attention` replaced at run time by another
library ("patched SDPA"); PyTorch's own SDPA function; and the comparison of a replacement with
PyTorch's math kernel on the same inputs, call by call, during one run.

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


@dataclass(frozen=True)
class AttentionKernel:
    """One attention kernel found here. `patched_sdpa` when its function is what
    `torch.nn.functional.scaled_dot_product_attention` is now (`function` names it);
    `diffusers_backend` when diffusers' dispatcher is set to it by the environment."""

    name: str  # the distribution ("sageattention"), or the module a patched function lives in
    version: str | None = None
    patched_sdpa: bool = False
    function: str | None = None  # module.qualname of the function that replaced SDPA
    diffusers_backend: str | None = None

    def words(self) -> str:
        """ "sageattention 2.1.1"; the name alone when no version is known."""
        return f"{self.name} {self.version}" if self.version else self.name

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "patched_sdpa": self.patched_sdpa,
            "function": self.function,
            "diffusers_backend": self.diffusers_backend,
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


def installed_kernels() -> list[AttentionKernel]:
    """Every attention kernel found here: the known libraries installed (`KNOWN`), the library
    that replaced SDPA (merged into its installed entry), and diffusers' dispatcher backend when
    the environment sets one other than PyTorch's. Imports nothing new; tens of ms at most."""
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
    return list(found.values())


@contextmanager
def torch_own_sdpa() -> Iterator[None]:
    """PyTorch's own SDPA in `torch.nn.functional` for the duration, whatever replaced it; the
    replacement is put back after. Process-wide: the engine runs one job at a time."""
    import torch.nn.functional as F

    replaced = F.scaled_dot_product_attention
    own = torch_sdpa()
    if replaced is own:
        yield
        return
    F.scaled_dot_product_attention = own
    try:
        yield
    finally:
        F.scaled_dot_product_attention = replaced


# --- the replacement against PyTorch's math kernel, on the same inputs ------------------------


@dataclass
class KernelComparison:
    """What a replacement SDPA gave against PyTorch's math kernel on the same q/k/v, call by
    call. `snr_db` is 10*log10(signal/noise) of the replacement's output against the math
    kernel's (as `diagnosis.snr_db` measures whole outputs)."""

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
    """While active, every call of the replaced SDPA runs both the replacement and PyTorch's math
    kernel on the same inputs; the math kernel's output is returned, so the run goes on with
    trusted values and every later call is compared on the inputs a correct run gives. A call is
    bad when the replacement's output is non-finite where the math kernel's is finite
    (`non_finite`), or agrees with it below `threshold_db` (`drift`). The replacement is put
    back in a finally. Doubles the cost of attention for the run."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    replacement = F.scaled_dot_product_attention
    own = torch_sdpa()
    result = KernelComparison(kernel)

    def compared(query, key, value, *args, **kwargs):
        theirs = replacement(query, key, value, *args, **kwargs)
        with sdpa_kernel([SDPBackend.MATH]):
            reference = own(query, key, value, *args, **kwargs)
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

    F.scaled_dot_product_attention = compared
    try:
        yield result
    finally:
        F.scaled_dot_product_attention = replacement
