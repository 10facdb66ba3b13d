"""`precision.twin.module_twin` makes the twin `copy.deepcopy(source, converted)` makes, on
every family's tiny components: the same classes and names, the twins `converted` gives as the
parameters and buffers, nothing mutable shared with the source (hook tables, processors,
configs), whatever refers to a module of the tree referring to its twin, and the same outputs.
A class that copies itself its own way goes to deepcopy whole."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch

from app.core.precision.twin import module_twin
from tests.support import family_rows

COMPONENTS = ("unet", "transformer", "vae", "text_encoder", "text_encoder_2", "text_encoder_3")


def converted_of(source) -> dict[int, torch.Tensor]:
    """Every parameter and buffer cast to fp16 where floating (a placement's twins)."""
    converted: dict[int, torch.Tensor] = {}
    for tensor in itertools.chain(source.parameters(), source.buffers()):
        if id(tensor) not in converted:
            twin = tensor.detach().to(torch.float16) if tensor.is_floating_point() else tensor
            if isinstance(tensor, torch.nn.Parameter):
                twin = torch.nn.Parameter(twin, requires_grad=False)
            converted[id(tensor)] = twin
    return converted


def components():
    for name, row in family_rows.ROWS.items():
        pipeline = row.build()
        for part in COMPONENTS:
            module = getattr(pipeline, part, None)
            if isinstance(module, torch.nn.Module):
                yield pytest.param(module, id=f"{name}-{part}")


def mutable_values(module):
    """(module name, attribute, value) of every non-atomic value a module holds itself."""
    for name, sub in module.named_modules(remove_duplicate=False):
        for key, value in vars(sub).items():
            if key not in ("_parameters", "_buffers", "_modules") and not isinstance(
                value, (type(None), bool, int, float, str, tuple, torch.dtype, torch.device)
            ):
                yield name, key, value


def shared_with(copied, source) -> set[tuple[str, str]]:
    held = {(name, key): value for name, key, value in mutable_values(source)}
    return {
        (name, key)
        for name, key, value in mutable_values(copied)
        if (name, key) in held and held[name, key] is value
    }


@pytest.mark.parametrize("source", list(components()))
def test_the_twin_is_deepcopys(source):
    converted = converted_of(source)
    theirs = copy.deepcopy(source, dict(converted))
    ours = module_twin(source, dict(converted))

    assert [(n, type(m)) for n, m in ours.named_modules()] == [
        (n, type(m)) for n, m in theirs.named_modules()
    ]
    for (name, mine), (_, their) in zip(
        itertools.chain(ours.named_parameters(), ours.named_buffers()),
        itertools.chain(theirs.named_parameters(), theirs.named_buffers()),
        strict=True,
    ):
        assert mine is their, name  # both the very twin `converted` gave
    source_modules = {id(m) for m in source.modules()}
    # What each copy shares with the source: the same values deepcopy hands back as they are
    # (functions, classes), nothing else.
    assert shared_with(ours, source) == shared_with(theirs, source)
    for name, key, value in mutable_values(ours):
        if isinstance(value, torch.nn.Module):
            assert id(value) not in source_modules, (name, key)
    # The same hooks, attributes and configs by value.
    for (name, mine), (_, their) in zip(ours.named_modules(), theirs.named_modules(), strict=True):
        assert set(vars(mine)) == set(vars(their)), name
        for key in ("_forward_hooks", "_forward_pre_hooks", "_non_persistent_buffers_set"):
            assert len(getattr(mine, key)) == len(getattr(their, key)), (name, key)
        if hasattr(mine, "config") and isinstance(mine.config, dict):
            assert dict(mine.config) == dict(their.config)


def test_hooks_and_references_into_the_tree_follow_the_twin():
    block = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    seen = []
    block[0].register_forward_hook(lambda module, args, output: seen.append(module))
    # Modules referred to outside `_modules`: a plain attribute, and a bound method.
    object.__setattr__(block, "head", block[2])
    object.__setattr__(block, "first_forward", block[0].forward)
    block.scale = torch.tensor(2.0)  # a plain tensor attribute: copied, as deepcopy copies it
    twin = module_twin(block, converted_of(block))

    assert twin.head is twin[2] and twin.first_forward.__self__ is twin[0]
    assert twin.scale is not block.scale and torch.equal(twin.scale, block.scale)
    twin[0].register_forward_hook(lambda module, args, output: None)
    assert len(block[0]._forward_hooks) == 1 and len(twin[0]._forward_hooks) == 2
    twin(torch.ones(1, 4, dtype=torch.float16))
    assert seen == [twin[0]]
    with torch.no_grad():
        twin[0].weight.zero_()
    assert block[0].weight.abs().sum() > 0


class OwnCopy(torch.nn.Linear):
    copies = 0

    def __deepcopy__(self, memo):
        OwnCopy.copies += 1
        made = OwnCopy(self.in_features, self.out_features)
        memo[id(self)] = made
        return made


def test_a_class_with_its_own_copy_sends_the_tree_to_deepcopy():
    tree = torch.nn.Sequential(torch.nn.Linear(2, 2), OwnCopy(2, 2))
    before = OwnCopy.copies
    twin = module_twin(tree, converted_of(tree))
    assert OwnCopy.copies == before + 1 and isinstance(twin[1], OwnCopy)
