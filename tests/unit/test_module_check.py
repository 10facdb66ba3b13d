"""The check's pieces on a plain torch module tree, called by code that is not a diffusers
pipeline (as ComfyUI calls its diffusion model): the first bad layer named in the tree's own
names, an fp32 reference of the same call, and an island copy that computes one layer wider
in its place and brings the output back to the reference."""

from __future__ import annotations

import copy

import pytest
import torch

from app.core.fixing.layer_islands import overflow_islands
from app.core.fixing.module_check import (
    closed_islands,
    island_copy,
    recorded_call,
    reference_call,
)
from app.core.fixing.quality import compare
from tests.support.parameter_copies import ParameterCopies, own_parameter_bytes


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(16)
        self.up = torch.nn.Linear(16, 32)
        self.down = torch.nn.Linear(32, 16)

    def forward(self, x, *, scale=None):
        # The layer after `up` sees a normalised input: an overflow of `up` is the only one.
        h = self.up(self.norm(x))
        h = torch.nn.functional.layer_norm(h, h.shape[-1:])
        return x + self.down(h) * (1.0 if scale is None else scale)


class _Tree(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([_Block(), _Block()])

    def forward(self, x, context=None):
        for block in self.blocks:
            x = block(x, scale=context)
        return x


@pytest.fixture()
def planted():
    torch.manual_seed(0)
    tree = _Tree()
    with torch.no_grad():
        tree.blocks[1].up.weight.mul_(1e5)  # past 65504 in fp16, finite in fp32
    return tree.half()


def test_the_first_bad_layer_is_named_in_the_trees_own_names(planted):
    x = torch.randn(2, 4, 16, dtype=torch.float16)
    seen = recorded_call(planted, lambda: planted(x, context=torch.tensor(1.0)))
    assert not seen.finite
    assert seen.first_bad_layer == "blocks.1.up"


def test_an_island_copy_brings_the_call_back_to_the_fp32_reference(planted):
    x = torch.randn(2, 4, 16, dtype=torch.float16)
    before = {k: v.clone() for k, v in planted.state_dict().items()}
    reference = reference_call(planted, (x,), {"context": torch.tensor(1.0)})
    assert reference.finite and reference.output.dtype == torch.float32
    islands = overflow_islands(reference.probe, planted)
    assert islands == ["blocks.1.up"]
    # Cast back to fp16 at its end, `up` alone would hand on inf: the island closes where the
    # values are back in range, at the block holding it.
    assert closed_islands(reference.probe, islands) == ["blocks.1"]

    original = planted.blocks[1]
    planted.blocks[1] = island_copy(original, torch.float32)
    try:
        fixed = recorded_call(planted, lambda: planted(x, context=torch.tensor(1.0)))
    finally:
        planted.blocks[1] = original
    assert fixed.finite and fixed.output.dtype == torch.float16  # the rest stays fp16
    assert compare(fixed.output, reference.output).passed
    # The tree handed in is as it was: its weights, its dtype, no hook left on it.
    after = planted.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in planted.modules())


def test_an_island_copy_keeps_the_layers_parameter_names_and_costs_only_its_weights(planted):
    layer = planted.blocks[0].up
    island = island_copy(layer, torch.float32)
    assert [n for n, _ in island.named_parameters()] == [n for n, _ in layer.named_parameters()]
    assert all(p.dtype == torch.float32 for p in island.parameters())
    assert layer.weight.dtype == torch.float16  # the original is untouched


class _Int8Linear(torch.nn.Module):
    """A host's low-bit layer: int8 values and their scale, which a cast cannot widen (a cast
    of the int8 weight gives the stored values, not the weight)."""

    def __init__(self, layer: torch.nn.Linear) -> None:
        super().__init__()
        scale = layer.weight.detach().float().abs().amax() / 127
        values = torch.round(layer.weight.detach().float() / scale).to(torch.int8)
        self.weight = torch.nn.Parameter(values, requires_grad=False)
        self.scale = torch.nn.Parameter(scale, requires_grad=False)

    def forward(self, x):
        return x @ (self.weight.to(x.dtype) * self.scale.to(x.dtype)).t()


def test_an_island_copy_rebuilds_the_hosts_low_bit_layers_from_their_weights(planted):
    block = planted.blocks[1]
    block.down = _Int8Linear(block.down)
    built = []

    def dequantized(module, dtype):
        if not isinstance(module, _Int8Linear):
            return None
        weight = module.weight.float() * module.scale
        plain = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False, dtype=dtype)
        plain.weight = torch.nn.Parameter(weight.to(dtype), requires_grad=False)
        built.append(plain)
        return plain

    island = island_copy(block, torch.float32, rebuild=dequantized)
    # The rebuilt layer itself takes the low-bit one's place: its int8 values are not copied.
    assert built == [island.down] and island.down is built[0]
    assert all(p.dtype == torch.float32 for p in island.parameters())
    assert isinstance(block.down, _Int8Linear) and block.down.weight.dtype == torch.int8
    wide = block.down.weight.float() * block.down.scale
    assert torch.equal(island.down.weight, wide)
    # The block computes in fp32 what the host's own layer computes there, handed back in fp16.
    x = torch.randn(2, 4, 16, dtype=torch.float16)
    wide_block = copy.deepcopy(block).float()
    got = island(x)
    assert got.dtype == torch.float16
    assert torch.allclose(got.float(), wide_block(x.float()).half().float())


def test_the_fp32_reference_widens_one_layer_at_a_time_and_matches_a_whole_fp32_copy(planted):
    x = torch.randn(2, 4, 16, dtype=torch.float16)
    context = torch.tensor(1.0)
    with ParameterCopies(planted) as copies:
        reference = reference_call(planted, (x,), {"context": context})
    # No copy of the tree: at most one layer's own weights in fp32 at once.
    assert 0 < copies.peak_bytes <= own_parameter_bytes(planted, torch.float32)
    # The same call as a whole fp32 copy computes it, and the same peaks layer by layer.
    whole = copy.deepcopy(planted).float()
    before = recorded_call(whole, lambda: whole(x.float(), context=context.float()))
    assert torch.equal(reference.output, before.output)
    assert {n: s.max_abs for n, s in reference.probe.modules.items()} == {
        n: s.max_abs for n, s in before.probe.modules.items()
    }
    assert overflow_islands(reference.probe, planted) == overflow_islands(before.probe, whole)
    # The tree is left as it was: fp16 weights, no hook.
    assert all(p.dtype == torch.float16 for p in planted.parameters())
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in planted.modules())
