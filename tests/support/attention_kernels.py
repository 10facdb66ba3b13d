"""A planted attention kernel, installed the way such libraries are: a real package on sys.path
with its distribution metadata (so `importlib.metadata` names and versions it), whose attention
function replaces `torch.nn.functional.scaled_dot_product_attention` for the duration, as
SageAttention is commonly patched in. Its fault is deterministic: NaN for every fp16 input (as
an 8-bit kernel whose quantisation overflows gives); in other dtypes, and when built honest, it
is PyTorch's own math kernel.

`flash_nan_in_fp16` plants a fault in PyTorch's own SDPA instead: its flash kernel NaN in fp16."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import pytest
import torch
import torch.nn.functional as F

NAME = "quantattn"
VERSION = "0.3.0"

_CORE = """
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

FAULTY = {faulty}


def quant_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                    scale=None, **kwargs):
    with sdpa_kernel([SDPBackend.MATH]):
        out = torch._C._nn.scaled_dot_product_attention(
            query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
            scale=scale,
        )
    if FAULTY and query.dtype == torch.float16:
        return torch.full_like(out, float("nan"))
    return out
"""


def write_distribution(root: Path, name: str, version: str, files: dict[str, str]) -> Path:
    """A package `name` under `root` as pip leaves it: its modules and a dist-info folder with
    METADATA, top_level.txt and RECORD."""
    package = root / name
    package.mkdir(parents=True, exist_ok=True)
    for relative, text in files.items():
        (package / relative).write_text(text, encoding="utf-8")
    info = root / f"{name}-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", encoding="utf-8"
    )
    (info / "top_level.txt").write_text(f"{name}\n", encoding="utf-8")
    record = [f"{name}/{relative},," for relative in files] + [f"{info.name}/METADATA,,"]
    (info / "RECORD").write_text("\n".join(record) + "\n", encoding="utf-8")
    return package


@contextmanager
def on_path(root: Path) -> Iterator[None]:
    """`root` importable for the duration; what was imported from it is forgotten after."""
    sys.path.insert(0, str(root))
    importlib.invalidate_caches()
    before = set(sys.modules)
    try:
        yield
    finally:
        sys.path.remove(str(root))
        for name in set(sys.modules) - before:
            module = sys.modules.get(name)
            if str(root) in str(getattr(module, "__file__", "") or ""):
                del sys.modules[name]
        importlib.invalidate_caches()


@contextmanager
def patched_in(root: Path, *, faulty: bool = True) -> Iterator[ModuleType]:
    """The planted kernel installed under `root` and patched over PyTorch's SDPA, as a user
    script or node pack patches SageAttention in; PyTorch's function is restored in a finally."""
    write_distribution(
        root,
        NAME,
        VERSION,
        {
            "__init__.py": "from .core import quant_attention\n",
            "core.py": _CORE.format(faulty=faulty),
        },
    )
    original = F.scaled_dot_product_attention
    with on_path(root):
        module = importlib.import_module(NAME)
        F.scaled_dot_product_attention = module.quant_attention
        try:
            yield module
        finally:
            F.scaled_dot_product_attention = original


def flash_nan_in_fp16(patcher: pytest.MonkeyPatch) -> None:
    """PyTorch's own SDPA returning NaN for every fp16 call while its flash kernel may run
    (every backend but math, which turns it off), for as long as `patcher` holds: every
    attention that runs SDPA fails alike, transformers' text encoders' as diffusers' UNet's and
    VAE's, and the math backend is finite at the same precision. Both names are patched: the
    fault is in PyTorch's kernel, not in a library patched over it."""
    real = F.scaled_dot_product_attention

    def sdpa(query, *args, **kwargs):
        out = real(query, *args, **kwargs)
        if query.dtype == torch.float16 and torch.backends.cuda.flash_sdp_enabled():
            return torch.full_like(out, float("nan"))
        return out

    patcher.setattr(F, "scaled_dot_product_attention", sdpa)
    patcher.setattr(torch._C._nn, "scaled_dot_product_attention", sdpa)
