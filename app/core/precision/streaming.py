"""A component streamed block by block: its repeated blocks (the children of its outermost
ModuleLists: a UNet's down and up blocks, a DiT's transformer blocks, a text encoder's layers,
a VAE's up and down blocks) stay where the loaded model keeps them, in its memory and its stored
form, and each is brought to the device as its forward starts and let go as it ends. Everything
else in the component (embeddings, norms, the blocks' glue) is placed on the device for the
whole stage. So the device holds the resident part and one block at a time, whatever the
component's size: ComputeUI's partial loading and Forge's GPU weights do this for the same users.

The placed twin holds, for each streamed tensor, a placeholder on the meta device in the dtype
the plan gives it (islands, clamps and compute-dtype hooks see and change that dtype as they
would a resident copy's). Bringing a block in converts its loaded tensors to those dtypes on the
device (weights kept as stored move as their stored bytes); letting it go puts the placeholders
back, so nothing is copied back and the loaded model is never changed. A streamed tensor read
outside its block's forward is a meta tensor there, and fails loudly on a CPU as on a GPU.

diffusers' group offloading (block level) was the first candidate; it is not used because it
brings a component's other parts in only through the forward of their parent, which a VAE's
`decode` and a pipeline reading an embedding directly never call, and without CUDA streams it
copies every weight back to the CPU each time it lets a group go.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.core.hooks import Hooks
from app.core.precision.plan import torch_dtype
from app.core.precision.transfer import cuda_free_bytes, moved_as
from app.core.precision.twin import module_twin


def wanted_dtypes(source, dtype, islands: Mapping[str, str]) -> dict[int, Any]:
    """id of each floating tensor of `source` -> the dtype a placed copy holds it in: an
    island's own dtype for a tensor of an island layer, else `dtype`. An island is converted
    straight from the loaded values, never through the component's narrower dtype (an fp32
    island made from an fp16 copy would hold fp16's roundings and infinities)."""

    prefixes = [(path + ".", torch_dtype(wanted)) for path, wanted in islands.items()]
    named = itertools.chain(
        source.named_parameters(remove_duplicate=False),
        source.named_buffers(remove_duplicate=False),
    )
    wanted_of: dict[int, Any] = {}
    for name, tensor in named:
        if not tensor.is_floating_point():
            continue
        own = next((d for prefix, d in prefixes if name.startswith(prefix)), None)
        if own is not None or id(tensor) not in wanted_of:
            wanted_of[id(tensor)] = own or dtype
    return wanted_of


def block_paths(module) -> list[str]:
    """The paths of `module`'s blocks: the children of each outermost ModuleList or Sequential
    of two or more children holding weights (a child that is itself a list is looked into)."""

    def holds_weights(child) -> bool:
        return next(child.parameters(), None) is not None

    def find(parent, prefix: str) -> list[str]:
        found: list[str] = []
        for name, child in parent.named_children():
            path = f"{prefix}{name}"
            is_list = _is_container(child)
            weighted = [c for c in child.children() if holds_weights(c)] if is_list else []
            if is_list and len(weighted) >= 2:
                for index, block in child.named_children():
                    if not holds_weights(block):
                        continue
                    if _is_container(block, dicts=True):
                        found += find(block, f"{path}.{index}.")
                    else:
                        found.append(f"{path}.{index}")
            else:
                found += find(child, f"{path}.")
        return found

    return find(module, "")


def _is_container(module, dicts: bool = False) -> bool:
    """A ModuleList or Sequential (and with `dicts`, a ModuleDict): a holder of blocks."""
    import torch

    kinds = (torch.nn.ModuleList, torch.nn.Sequential)
    return isinstance(module, (*kinds, torch.nn.ModuleDict) if dicts else kinds)


@dataclass(frozen=True)
class Sizes:
    """What a component placed with its floating tensors in one dtype holds: `whole` placed
    whole; streamed, `resident` for the whole stage plus one of `blocks` at a time, the
    largest `block`. A record only: it holds no reference to a placed module, so a dropped
    copy is freed."""

    whole: int
    resident: int
    block: int
    blocks: int

    def to_json(self) -> dict[str, Any]:
        """How a streamed component was held (check --json's memory.streamed)."""
        return {
            "blocks": self.blocks,
            "resident_mb": round(self.resident / 2**20, 3),
            "block_mb": round(self.block / 2**20, 3),
        }


def sizes(source, dtype, islands=None, bytes_of=None) -> Sizes:
    """`source`'s bytes placed in `dtype` (islands in theirs; weights kept as stored at their
    stored bytes), whole and streamed, counted from the loaded model without placing it (a
    model on the meta device too). `bytes_of(name, tensor, dtype)`, where given, says what a
    tensor holds instead (a projection of a file format the model is not loaded from)."""
    import torch

    from app.core.checkpoint.stored import StoredTensor, stored_bytes

    wanted_of = wanted_dtypes(source, dtype, islands or {})
    paths = block_paths(source)
    owner_of = _block_of_each_tensor(source, paths)
    per_block = [0] * len(paths)
    resident = 0
    seen: set[int] = set()
    named = itertools.chain(source.named_parameters(), source.named_buffers())
    for name, tensor in named:
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        wanted = wanted_of.get(id(tensor), tensor.dtype)
        if bytes_of is not None:
            held = bytes_of(name, tensor, wanted)
        elif isinstance(tensor, StoredTensor):
            held = stored_bytes(tensor)
        else:
            held = tensor.numel() * torch.empty((), dtype=wanted).element_size()
        block = owner_of.get(id(tensor))
        if block is None:
            resident += held
        else:
            per_block[block] += held
    return Sizes(
        whole=resident + sum(per_block),
        resident=resident,
        block=max(per_block, default=0),
        blocks=len(paths),
    )


def streamed_copy(source, device, dtype, islands=None) -> tuple[Any, Sizes]:
    """A twin of `source` whose blocks stream to `device` (see the module's words) and whose
    other floating tensors are on `device` in `dtype` (an island's in its own); tensors
    already there in that dtype are shared with `source`, as `placement._copy_as` shares them."""
    import torch

    wanted_of = wanted_dtypes(source, dtype, islands or {})
    paths = block_paths(source)
    owner_of = _block_of_each_tensor(source, paths)
    converted: dict[int, Any] = {}
    for tensor in itertools.chain(source.parameters(), source.buffers()):
        if id(tensor) in converted:
            continue
        wanted = wanted_of.get(id(tensor), tensor.dtype)
        block = owner_of.get(id(tensor))
        twin = moved_as(tensor, "meta" if block is not None else device, wanted)
        if isinstance(tensor, torch.nn.Parameter):
            twin = torch.nn.Parameter(twin, requires_grad=False)
        converted[id(tensor)] = twin
    module = module_twin(source, converted)
    streamed = sizes(source, dtype, islands)
    for index, path in enumerate(paths):
        block, loaded = module.get_submodule(path), source.get_submodule(path)
        tensors = []
        for owner_name, owner in block.named_modules():
            loaded_owner = loaded.get_submodule(owner_name) if owner_name else loaded
            for kind, named in (("parameter", owner._parameters), ("buffer", owner._buffers)):
                for name, placeholder in named.items():
                    loaded_tensor = getattr(loaded_owner, name)
                    if placeholder is not None and owner_of.get(id(loaded_tensor)) == index:
                        tensors.append((owner, name, kind, loaded_tensor))
        _add_stream_hooks(block, tensors, torch.device(device))
    module._halfsafe_streamed = streamed
    module._halfsafe_onload_device = torch.device(device)
    return module, streamed


def _block_of_each_tensor(source, paths: list[str]) -> dict[int, int]:
    """id of each tensor that lies in exactly one block -> that block's index; a tensor also
    used outside it (tied to an embedding, shared by two blocks) stays resident."""
    blocks: dict[int, set[int | None]] = {}
    named = itertools.chain(
        source.named_parameters(remove_duplicate=False),
        source.named_buffers(remove_duplicate=False),
    )
    for name, tensor in named:
        index = next((i for i, p in enumerate(paths) if name.startswith(p + ".")), None)
        blocks.setdefault(id(tensor), set()).add(index)
    only: dict[int, int] = {}
    for key, held in blocks.items():
        (index, *others) = held
        if index is not None and not others:
            only[key] = index
    return only


def _add_stream_hooks(block, tensors, device) -> None:
    """Bring `block`'s tensors in as its forward starts and put the placeholders back as it
    ends. The tensors are replaced in their modules, not refilled (a meta tensor cannot take
    another device's data): every hook looks its module's tensors up at each call."""
    import torch

    placeholders: list[Any] = []

    def bring_in(module, args) -> None:
        if placeholders:  # already in (a block called again from inside itself)
            return
        for owner, name, kind, loaded in tensors:
            table = owner._parameters if kind == "parameter" else owner._buffers
            placeholder = table[name]
            placeholders.append(placeholder)
            moved = moved_as(loaded, device, placeholder.dtype)
            table[name] = (
                torch.nn.Parameter(moved, requires_grad=False) if kind == "parameter" else moved
            )

    def let_go(module, args, output):
        while placeholders:
            owner, name, kind, _ = tensors[len(placeholders) - 1]
            table = owner._parameters if kind == "parameter" else owner._buffers
            table[name] = placeholders.pop()
        return None

    Hooks().around(block, bring_in, let_go)  # for as long as the streamed copy lives


def host_bytes(modules) -> int:
    """The bytes the tensors of `modules` take in the computer's memory (stored ones at their
    stored bytes), each tensor counted once."""
    from app.core.checkpoint.stored import stored_bytes

    seen: set[int] = set()
    total = 0
    for module in modules:
        for tensor in itertools.chain(module.parameters(), module.buffers()):
            if id(tensor) not in seen and tensor.device.type == "cpu":
                seen.add(id(tensor))
                total += stored_bytes(tensor)
    return total


def streamed_of(module) -> Sizes | None:
    """The streaming of a placed component, None for one placed whole."""
    return getattr(module, "_halfsafe_streamed", None)


def device_of(module):
    """The device a placed component computes on: where its streamed blocks are brought, else
    where its first weight is."""
    onload = getattr(module, "_halfsafe_onload_device", None)
    if onload is not None:
        return onload
    return next(t for t in itertools.chain(module.parameters(), module.buffers())).device


# What a job leaves free beside the weights it places, when no budget is set: the activations
# (a 1024 px VAE decode takes GBs in fp16), the CUDA context, the system and other programs.
RESERVE_SHARE = 0.2  # of the device's memory (the computer's, for a CPU or an Apple GPU)
RESERVE_MIN_MB = 1536.0
BUDGET_MIN_MB = 256.0

# Where a budget the user did not set comes from (`PrecisionPlan.memory_budget_from`).
FROM_GPU = "free memory"  # a CUDA or ROCm GPU's free memory
FROM_RAM = "free RAM"  # the computer's, where the device computes in it (a CPU, an Apple GPU)


def device_budget(device: str, held_bytes: int = 0) -> tuple[float, str] | tuple[None, None]:
    """The memory budget of a job on `device` when the user set none, in MiB, and where it came
    from; (None, None) where there is nothing to ask.

    A CUDA (or ROCm) GPU: its free memory now. A CPU or an Apple GPU computes in the computer's
    own memory, beside the loaded model: the RAM the system says is available less the
    `held_bytes` the model's weights take there (counted again, since a model read from a
    mapped file sits in the page cache the system calls available; an Apple GPU also no more
    than Metal's recommended working set left). Either way less a reserve for activations of a
    fifth of the device's memory or 1.5 GB, whichever is more."""
    import torch

    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            return None, None
        _, total = torch.cuda.mem_get_info(torch.device(device))
        return _less_reserve(cuda_free_bytes(device), total), FROM_GPU
    if device.startswith(("cpu", "mps")):
        import psutil

        memory = psutil.virtual_memory()
        free = memory.available - held_bytes
        if device.startswith("mps"):
            free = min(free, _metal_free())
        return _less_reserve(free, memory.total), FROM_RAM
    return None, None


def _metal_free() -> int:
    import torch

    mps = torch.mps
    return int(mps.recommended_max_memory()) - int(mps.driver_allocated_memory())


def _less_reserve(free: int, total: int) -> float:
    reserve = max(RESERVE_MIN_MB, RESERVE_SHARE * total / 2**20)
    return max(free / 2**20 - reserve, BUDGET_MIN_MB)
