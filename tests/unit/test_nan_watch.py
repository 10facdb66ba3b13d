"""The NaN watch's hooks: a block clamped to fp16's limit that saturates marks its image bad,
though the denoiser's output stays finite, and `remove` leaves nothing attached."""

from __future__ import annotations

import torch

from app.core.generation.watch import NanWatch, read_flags


class _HeldAtTheLimit(torch.nn.Module):
    """A stand-in denoiser whose block hands on image 1 at 65504 in fp16 (what a clamp leaves
    of an overflow) and whose output is finite for both images."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(1))
        self.block = torch.nn.Identity()

    def forward(self, sample, timestep, return_dict=True):
        held = sample.half()
        held[1] = 65504.0
        return (self.block(held).float() * 0 * self.weight,)


def _flags_after_one_step(clamped: bool) -> tuple[list[int], NanWatch, _HeldAtTheLimit]:
    unet = _HeldAtTheLimit()
    watch = NanWatch(unet, batch=2, clamped=[unet.block] if clamped else ())
    latents = torch.zeros(2, 4, 8, 8)
    unet(latents, torch.tensor(900.0))
    watch.after_step(0, latents)
    return read_flags(watch.flags()), watch, unet


def test_a_saturated_clamped_block_marks_its_image_and_remove_detaches_every_hook():
    flags, watch, unet = _flags_after_one_step(clamped=True)
    assert flags == [0, 1, -1, 0]  # image 1 bad from step 0
    unwatched, _, _ = _flags_after_one_step(clamped=False)
    assert unwatched == [0, 0, -1, -1]  # the output alone is finite
    watch.remove()
    for module in (unet, unet.block):
        assert not module._forward_hooks and not module._forward_pre_hooks
    unet(torch.zeros(2, 4, 8, 8), torch.tensor(800.0))
    assert read_flags(watch.flags()) == flags
