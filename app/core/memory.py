"""Running out of memory, said as a sentence: which memory ran out, during what, how much more
was asked for, and what to try. torch raises `torch.OutOfMemoryError` for a GPU (CUDA, ROCm)
and a plain RuntimeError for the CPU's and Apple's allocators; both become `OutOfMemoryError`
at the edge of a job, so a half-run job says one sentence and remembers nothing."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from app.core.errors import HalfSafeError, OutOfMemoryError

# What each allocator says when it runs out (torch's messages, lower-cased).
_GPU_WORDS = ("cuda out of memory", "hip out of memory", "out of memory on device")
_APPLE_WORDS = ("mps backend out of memory",)
_RAM_WORDS = ("can't allocate memory", "not enough memory", "cannot allocate memory")
_ASKED = re.compile(r"tried to allocate ([0-9.]+ ?[kmgt]?i?b(?:ytes)?)", re.IGNORECASE)
_BYTES = re.compile(r"tried to allocate (\d+) bytes", re.IGNORECASE)


def is_out_of_memory(error: BaseException) -> bool:
    """Whether `error` is an allocator running out of memory (of any device)."""
    if isinstance(error, HalfSafeError):  # already said (ours is named OutOfMemoryError too)
        return False
    if isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError":
        return True
    if not isinstance(error, RuntimeError):
        return False
    text = str(error).lower()
    return any(words in text for words in (*_GPU_WORDS, *_APPLE_WORDS, *_RAM_WORDS))


def _which_memory(error: BaseException) -> str:
    text = str(error).lower()
    if any(words in text for words in _APPLE_WORDS):
        return "The GPU's share of this Mac's memory"
    if type(error).__name__ == "OutOfMemoryError" or any(w in text for w in _GPU_WORDS):
        return "The GPU's memory"
    return "The computer's memory"


def _asked(error: BaseException) -> str:
    """How much the failing allocation asked for, in the allocator's own words, else ''."""
    text = str(error)
    exact = _BYTES.search(text)
    if exact:
        return f" (it asked for {int(exact.group(1)) / 1024**3:.2f} GiB more)"
    found = _ASKED.search(text)
    return f" (it asked for {found.group(1)} more)" if found else ""


def sentence(error: BaseException, doing: str) -> str:
    """One sentence for running out of memory while `doing` ("checking the model")."""
    memory = _which_memory(error)
    gpu = memory.startswith("The GPU")
    # On a GPU a lower budget makes the large parts stream block by block (`streaming`); the
    # computer's memory holds the loaded model whole, which no budget changes.
    budget = (
        ", a lower Memory budget (Settings, or --max-vram) so that large parts stream"
        if gpu
        else ""
    )
    other = "the GPU" if gpu else "memory"
    return (
        f"{memory} ran out while {doing}{_asked(error)}: try a smaller size or fewer images "
        f"at once{budget}, or close other programs that use {other}; nothing from this job "
        "was saved or remembered."
    )


@contextmanager
def said_as_sentence(doing: str) -> Iterator[None]:
    """Turn running out of memory inside the block into `OutOfMemoryError` (its sentence);
    the device's cached memory is handed back first, so the next job starts clean."""
    try:
        yield
    except Exception as error:
        if not is_out_of_memory(error):
            raise
        _release_cached_memory()
        raise OutOfMemoryError(sentence(error, doing)) from error


def _release_cached_memory() -> None:
    import torch

    from app.core import work

    work.collect_garbage()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    mps = getattr(torch, "mps", None)
    if mps is not None and torch.backends.mps.is_available():
        mps.empty_cache()


# glibc's malloc gives a block below its mmap threshold from its heaps and keeps the pages of a
# freed one for reuse. The threshold starts at 128 KiB but rises, each time a larger mapped
# block is freed, up to 32 MiB: after a job's first layers every tensor up to 32 MiB comes from
# the heaps, and the holes freed tensors leave there stay resident. A check that widens an SDXL
# UNet's layers to fp32 one at a time thus peaked 0.3-0.5 GiB higher than with the threshold held
# at its start (`docs/benchmarks.md`, whole jobs). Held there, each freed tensor's pages go back
# to the system at once; the cost is the page faults of touching fresh pages again.
HEAP_MMAP_THRESHOLD = 128 * 1024
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number, from glibc's malloc.h


def free_large_blocks_promptly() -> bool:
    """Have the C library hand each freed block of `HEAP_MMAP_THRESHOLD` bytes or more back to
    the system at once, for the rest of the process (a job's process: the command line's, the
    engine's). Only glibc needs telling: macOS's and Windows' allocators give large blocks
    back by themselves, as does musl. Returns whether the setting took."""
    import ctypes
    import platform

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own C library
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt(_M_MMAP_THRESHOLD, HEAP_MMAP_THRESHOLD) == 1


def _gb(count: int) -> str:
    return f"{count / 2**30:.1f} GB" if count >= 2**30 / 10 else f"{count / 2**20:,.0f} MB"


def budget_source_words(budget_from: str | None) -> str:
    """Where a budget the user did not set came from, in words ("" for the user's own)."""
    from app.core.precision.streaming import FROM_GPU, FROM_RAM

    return {FROM_GPU: "the GPU's free memory", FROM_RAM: "the computer's free memory"}.get(
        budget_from or "", ""
    )


def plan_words(
    parts, budget_mb: float | None, vae_tiled: bool = False, tile_px: int = 0
) -> str | None:
    """One line saying how a job's components will be held under the memory budget (from
    `placement.memory_plan`), said before a long job; None when every part fits whole as
    the plan asks (nothing to say)."""
    from app.core.components import words as component_words

    if budget_mb is None:
        return None
    said = []
    for part in parts:
        words = component_words(part.component)
        held = part.sizes
        if part.streams and held is not None:
            said.append(
                f"the {words} streams block by block ({_gb(held.whole)} as held: "
                f"{_gb(held.resident)} kept on the device and one of {held.blocks} blocks, "
                f"up to {_gb(held.block)}, at a time)"
            )
        if part.stored_dtype is not None:
            said.append(
                f"the {words} computes in {part.dtype} from its {part.stored_dtype} weights "
                "layer by layer"
            )
    if vae_tiled:
        said.append(
            f"the VAE decodes in {tile_px} px tiles" if tile_px else "the VAE decodes in tiles"
        )
    if not said:
        return None
    return f"Memory budget {budget_mb * 2**20 / 2**30:.1f} GB: " + "; ".join(said) + "."


@dataclass(frozen=True)
class MemoryRecord:
    """How a job held its parts under its memory budget (`placement.memory_plan`): the budget
    in MB (the user's, or the device's free memory), the parts that streamed block by block and
    those kept as stored computing wider layer by layer."""

    budget_mb: float
    streamed: tuple[str, ...] = ()
    computed_in_place: tuple[str, ...] = ()
    # Where the budget came from: "setting", "free memory" (a GPU's) or "free RAM" (a CPU's or
    # an Apple GPU's: the computer's), as `PrecisionPlan.memory_budget_from`.
    budget_from: str = "setting"

    def to_json(self) -> dict[str, Any]:
        return {
            "budget_mb": round(self.budget_mb),
            "budget_from": self.budget_from,
            "streamed": list(self.streamed),
            "computed_in_place": list(self.computed_in_place),
        }

    def budget_words(self) -> str:
        """The budget as the PNG records it: "4.1 GB"."""
        return f"{self.budget_mb / 1024:.1f} GB"


def said_memory_plan(pipeline, plan, progress) -> MemoryRecord | None:
    """Say before a long job how its components will be held under the memory budget (a
    `Headline`: a line of its own), where any part streams or computes in place; and return
    that plan as the job's records keep it (None when no budget applies)."""
    from app.core.jobs import Headline
    from app.core.precision.placement import memory_plan

    if plan.memory_budget_mb is None:
        return None
    parts = memory_plan(pipeline, plan)
    words = plan_words(parts, plan.memory_budget_mb, plan.vae_tiling == "on", plan.vae_tile_px)
    if words:
        progress(Headline(words), 0, 0)
    return MemoryRecord(
        plan.memory_budget_mb,
        tuple(p.component for p in parts if p.streams),
        tuple(p.component for p in parts if p.stored_dtype is not None),
        plan.memory_budget_from or "setting",
    )
