"""Placed copies kept from one job to the next (`KeptCopies`), so that a generation after a check
(or the next generation) runs the copy of a part the last job made instead of casting it again.

A part that runs in a dtype or on a device other than the loaded one is copied for each job
(`placement.PlacedPipeline`); on a 2-core CPU, SD1.5 cast from its stored fp32 to bf16 took
0.6-0.7 s of a 4.3 s healthy check and as much of the generation after it, and on a GPU the
same copy crosses from the RAM every job. A loaded model keeps at most one copy per part, the
last one a job let go, while the copies it keeps and the job's own fit the job's memory budget
(the device's free memory, less the reserve for activations, or the user's own limit): a budget
taken from the device counts the kept copies as free (`bytes` is added back), and a copy a job
makes evicts kept ones until it fits, so a job that fits without them fits beside them. A copy
is taken only while the loaded part is what it was copied from (`signature`): the same tensor
objects at the same version, the same forward hooks, the same LoRA adapters at the same
strengths; any other change (a LoRA loaded, removed or reweighted, a VAE swapped in, a hook
added) makes a new copy. HalfSafe changes
loaded weights only so; a write through `.data` after loading would go unseen, and none is made.
Running out of memory frees every kept copy (`free_all`).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from typing import Any

# A dropped placed copy holding this many bytes of its own (not shared with the loaded model) or
# more, and a kept copy as large, is freed at once by a collection (see
# `placement.PlacedPipeline._drop`); a collection takes a fraction of a second, a small copy is
# left to Python's own collector.
COLLECT_AFTER_DROPPING_BYTES = 64 << 20

# Every store alive, so that running out of memory can empty them all (`free_all`).
_STORES: weakref.WeakSet[KeptCopies] = weakref.WeakSet()


def _layer_state(name: str, layer) -> Iterator[tuple]:
    """What decides a layer's output beside its tensors and is copied with it: the forward
    hooks on it (by their handles' ids, which are never given twice), and a peft LoRA layer's
    strengths, the adapters it runs, and whether they are merged or turned off."""
    hooks = (*layer._forward_pre_hooks, *layer._forward_hooks)
    if hooks:
        yield (name, "hooks", hooks)
    scaling = layer.__dict__.get("scaling")
    if isinstance(scaling, dict):
        active = getattr(layer, "active_adapters", ())
        yield (
            name,
            tuple(sorted((str(k), float(v)) for k, v in scaling.items())),
            tuple(active) if isinstance(active, (list, tuple)) else (str(active),),
            tuple(getattr(layer, "merged_adapters", ()) or ()),
            bool(getattr(layer, "disable_adapters", False)),
        )


@dataclass(frozen=True)
class Signature:
    """What a copy was made from: each tensor of the loaded part as an object (weakly: a
    tensor freed and another made at its address is not the same) with its version, and its
    adapters' state."""

    tensors: tuple[tuple[weakref.ref, int], ...]
    adapters: tuple

    def matches(self, other: Signature) -> bool:
        if self.adapters != other.adapters or len(self.tensors) != len(other.tensors):
            return False
        for (mine, version), (theirs, now) in zip(self.tensors, other.tensors, strict=True):
            tensor = mine()
            if tensor is None or tensor is not theirs() or version != now:
                return False
        return True


def signature(module) -> Signature:
    """The loaded part `module` as a copy of it depends on (`Signature`), in one walk of its
    layers."""
    tensors = []
    state = []
    seen: set[int] = set()
    for name, layer in module.named_modules():
        for tensor in (*layer._parameters.values(), *layer._buffers.values()):
            if tensor is not None and id(tensor) not in seen:
                seen.add(id(tensor))
                tensors.append((weakref.ref(tensor), int(tensor._version)))
        state.extend(_layer_state(name, layer))
    return Signature(tuple(tensors), tuple(state))


@dataclass
class _Kept:
    key: Hashable  # the placement's key (dtype, islands, clamps, ...) and its device
    module: Any
    bytes: int  # what it holds beside the loaded part
    held: int  # what it holds placed, shared tensors included (`PlacedPipeline.placed_bytes`)
    made_from: Signature


class KeptCopies:
    """One loaded model's placed copies kept between jobs, at most one per part."""

    def __init__(self) -> None:
        self._copies: dict[str, _Kept] = {}
        self._lock = threading.Lock()
        self.taken = 0  # copies handed back to a job instead of being made again
        _STORES.add(self)

    @property
    def bytes(self) -> int:
        """What the kept copies hold on their devices."""
        with self._lock:
            return sum(k.bytes for k in self._copies.values())

    def held_on(self, device: str) -> int:
        """What the kept copies hold on `device` ("cuda:0", "cpu"), which a budget taken from
        that device's free memory counts as free."""
        with self._lock:
            return sum(k.bytes for k in self._copies.values() if k.key[0] == device)

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._copies)

    def take(self, name: str, key: Hashable, loaded) -> tuple[Any, int] | None:
        """The kept copy of part `name` placed under `key`, taken out, and what it holds placed,
        when the loaded part `loaded` is still what it was made from; else None (a copy made
        from something else is freed)."""
        with self._lock:
            kept = self._copies.get(name)
            if kept is None or kept.key != key:
                return None
            del self._copies[name]
        if not kept.made_from.matches(signature(loaded)):
            self._free([kept])
            return None
        self.taken += 1
        return kept.module, kept.held

    def offer(
        self, name: str, key: Hashable, module, own: int, held: int, loaded, room: int
    ) -> bool:
        """Keep `module`, the copy of part `name` placed under `key` holding `own` bytes beside
        the loaded part `loaded` (`held` placed), in place of any kept copy of that part, where
        all the kept copies then hold at most `room` bytes; False (nothing kept) otherwise."""
        if own <= 0:
            return False
        with self._lock:
            others = sum(k.bytes for n, k in self._copies.items() if n != name)
            if others + own > room:
                return False
            replaced = self._copies.pop(name, None)
            self._copies[name] = _Kept(key, module, own, held, signature(loaded))
        if replaced is not None:
            self._free([replaced])
        return True

    def evict(self, name: str | None = None, room: int | None = None) -> int:
        """Free the kept copy of `name` (None: of any part), and then, with `room`, the
        largest others until what is kept holds at most `room` bytes. The bytes freed."""
        with self._lock:
            gone = [self._copies.pop(name)] if name in self._copies else []
            if name is None and room is None:
                gone = list(self._copies.values())
                self._copies.clear()
            while room is not None and self._copies:
                if sum(k.bytes for k in self._copies.values()) <= room:
                    break
                largest = max(self._copies, key=lambda n: self._copies[n].bytes)
                gone.append(self._copies.pop(largest))
        freed = sum(k.bytes for k in gone)
        self._free(gone)
        return freed

    @staticmethod
    def _free(gone: list[_Kept]) -> None:
        from app.core import work

        held = sum(k.bytes for k in gone)
        gone.clear()
        if held >= COLLECT_AFTER_DROPPING_BYTES:
            work.collect_garbage()  # a placed copy sits in reference cycles


def free_all() -> int:
    """Free every kept copy of every loaded model (when memory ran out). The bytes freed."""
    return sum(store.evict() for store in list(_STORES))
