"""Moving a weight to the device that computes with it, in the dtype it computes in; how much
of a CUDA device this process can still take."""

from __future__ import annotations

from typing import Any


def moved_as(tensor, device, dtype) -> Any:
    """`tensor` (detached) on `device` in `dtype`.

    Across devices, a widening cast (fp16 to bf16 or fp32, bf16 to fp16) happens after the move,
    on the device: in one call torch converts a blocking copy's dtype on the CPU before it
    crosses, which for a UNet's 2.6 billion weights is seconds of one desktop CPU's time on
    every placement, and sends no fewer bytes. A narrowing cast (fp32 to fp16) still happens
    before the move, where it halves the bytes that cross. A tensor of a subclass (weights kept
    as stored, quantised) moves as its class says, in one call."""
    import torch

    tensor = tensor.detach()
    target = torch.device(device)
    if (
        type(tensor) is not torch.Tensor
        or tensor.device == target
        or tensor.dtype == dtype
        or dtype.itemsize < tensor.dtype.itemsize
        or not tensor.is_floating_point()
    ):
        return tensor.to(device=target, dtype=dtype)
    return tensor.to(device=target).to(dtype)


def cuda_free_bytes(device) -> int:
    """The bytes of the CUDA `device` this process can still take: what the driver calls free,
    plus what torch's allocator holds cached but unused (freed tensors' blocks, which it hands
    out again before asking the driver; after SDXL's check on an H200 it held 13.8 GiB for
    5.3 GiB in use)."""
    import torch

    device = torch.device(device)
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
