"""Weights cross to the computing device before a widening cast, not after it (torch converts a
blocking copy's dtype on the CPU); a narrowing cast still happens before the move."""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode

from app.core.precision.placement import _copy_as
from app.core.precision.transfer import moved_as


class _Moves(TorchFunctionMode):
    """Each `Tensor.to` call: (device asked for, dtype asked for)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[object, object]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.to:
            device = kwargs.get("device")
            dtype = kwargs.get("dtype")
            for value in args[1:]:
                if isinstance(value, torch.dtype):
                    dtype = value
                elif isinstance(value, (str, torch.device)):
                    device = value
            self.calls.append((None if device is None else torch.device(device).type, dtype))
        return func(*args, **kwargs)


def _moves(stored, device, wanted):
    with _Moves() as seen:
        out = moved_as(torch.ones(4, dtype=stored), device, wanted)
    return seen.calls, out


@pytest.mark.parametrize("wanted", [torch.bfloat16, torch.float32])
def test_a_widening_cast_happens_on_the_device_after_the_move(wanted):
    calls, out = _moves(torch.float16, "meta", wanted)
    assert calls == [("meta", None), (None, wanted)]
    assert (out.device.type, out.dtype) == ("meta", wanted)


def test_a_narrowing_cast_happens_before_the_move():
    calls, out = _moves(torch.float32, "meta", torch.float16)
    assert calls == [("meta", torch.float16)]
    assert (out.device.type, out.dtype) == ("meta", torch.float16)


def test_on_one_device_it_is_one_cast_with_the_same_values():
    source = torch.randn(64, dtype=torch.float16)
    calls, _ = _moves(torch.float16, "cpu", torch.float32)
    assert calls == [("cpu", torch.float32)]
    assert torch.equal(moved_as(source, "cpu", torch.float32), source.to(torch.float32))


def test_placing_a_part_moves_each_weight_before_widening_it():
    module = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4)).half()
    with _Moves() as seen:
        placed = _copy_as(module, torch.device("meta"), torch.float32)
    moves = [call for call in seen.calls if call[0] is not None]
    assert moves and all(dtype is None for _, dtype in moves)
    assert {p.dtype for p in placed.parameters()} == {torch.float32}
    assert {p.device.type for p in placed.parameters()} == {"meta"}
