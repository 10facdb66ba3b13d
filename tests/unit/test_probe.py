"""The activation probe's one number per tensor: max |x| with NaN and inf kept, as HalfSafe's
verdicts read it (a NaN anywhere must make the peak NaN, an inf alone inf), checked against a
result computed here element by element, on the CPU and, where there is one, on CUDA."""

from __future__ import annotations

import math

import pytest
import torch

from app.core.run.probe import ActivationRecorder, _distinct, fused, max_abs, peaks

DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _expected(values: list[float]) -> float:
    """max |x| as the verdicts need it, computed by hand: NaN wins, then inf."""
    if any(math.isnan(v) for v in values):
        return math.nan
    return max(abs(v) for v in values)


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def _cases(dtype: torch.dtype, device: str):
    """Tensors with a NaN, an inf, both, or neither at positions across a large tensor (the
    vectorised reductions' head, body and tail), each as `dtype` on `device`."""
    generator = torch.Generator().manual_seed(5)
    for size in (3, 4099, 2 * 65536 + 7):
        for plant in ((), (math.nan,), (math.inf,), (-math.inf,), (math.nan, math.inf)):
            base = torch.randn(size, generator=generator) * 3
            for index, value in enumerate(plant):
                position = (size - 1) if index else (size // 2 if size > 3 else 0)
                base[position] = value
            yield base.to(dtype).to(device)


def _check_device(device: str) -> None:
    for dtype in DTYPES:
        for tensor in _cases(dtype, device):
            values = tensor.float().cpu().tolist()
            (peak,) = peaks(tensor)
            assert peak.dtype == torch.float32 and peak.dim() == 0
            assert _same(peak.item(), _expected(values)), (dtype, device, tensor.numel())
        # Several tensors: the largest of them, a NaN in any one making it NaN.
        parts = [torch.tensor([1.0, -7.0]), torch.tensor([3.0, math.nan]), torch.tensor([2.0])]
        assert math.isnan(max_abs([p.to(dtype).to(device) for p in parts]).item())
        assert max_abs([p.to(dtype).to(device) for p in (parts[0], parts[2])]).item() == 7.0


def test_the_peak_is_max_abs_with_nan_and_inf_kept_on_the_cpu():
    _check_device("cpu")


@pytest.mark.gpu
def test_the_peak_is_max_abs_with_nan_and_inf_kept_on_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    _check_device("cuda")


class _Two(torch.nn.Module):
    def forward(self, a, b):
        return a * 2, b + 1


class _Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.two = _Two()

    def forward(self, a, b):
        x, y = self.two(a, b)
        return x + y.sum()


def _attached(model: torch.nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def test_a_call_with_several_tensors_reads_as_their_largest_and_a_nan_in_any():
    """A module's inputs and outputs are combined at `read()`: the same numbers as one
    reduction over all of them."""
    model = _Outer()
    with ActivationRecorder(model) as recorder:
        model(torch.tensor([1.0, -3.0]), torch.tensor([5.0, 0.5]))
    result = recorder.read()
    two = result.modules["two"]
    assert (two.input_max_abs, two.max_abs) == (5.0, 6.0)  # max(|-6|, |2|, 6, 1.5)
    assert not two.non_finite and not result.non_finite

    with ActivationRecorder(model) as recorder:
        output = model(torch.tensor([1.0, -3.0]), torch.tensor([math.nan, 0.5]))
    result = recorder.read(output)
    two = result.modules["two"]
    # NaN in one of its inputs: bad, and not its own doing.
    assert two.non_finite and not two.bad_with_finite_inputs and not result.output_finite


def test_inputs_given_by_keyword_are_read_and_the_recorder_leaves_nothing_attached():
    """A full recorder reads a module's keyword inputs too; a lean one its outputs only; both
    take every hook they attached away with them."""
    model = _Outer()
    with ActivationRecorder(model) as recorder:
        assert _attached(model) == 4  # a pre-hook and a hook on each module
        model(a=torch.tensor([1.0, -3.0]), b=torch.tensor([5.0, 0.5]))
    assert _attached(model) == 0
    outer = recorder.read().modules[""]
    assert (outer.input_max_abs, outer.max_abs) == (5.0, 9.5)  # 2 + (6 + 1.5)
    with ActivationRecorder(model, lean=True) as recorder:
        assert _attached(model) == 2
        model(a=torch.tensor([1.0, -3.0]), b=torch.tensor([5.0, 0.5]))
    assert _attached(model) == 0
    outer = recorder.read().modules[""]
    assert (outer.input_max_abs, outer.max_abs) == (0.0, 9.5)


def test_a_lean_call_with_several_tensors_is_one_reduction_read_as_their_largest():
    """A lean recorder reads a call's outputs in one reduction (`fused`): the largest of them,
    a NaN in any one making it NaN, whatever their dtypes, and the same tensor twice once."""
    model = _Outer()
    for a, b in (
        (torch.tensor([1.0, -3.0]), torch.tensor([5.0, 0.5])),
        (torch.tensor([1.0, -3.0], dtype=torch.float16), torch.tensor([5.0, 0.5])),
    ):
        with ActivationRecorder(model, lean=True) as recorder:
            model(a, b)
            assert (recorder.module_calls, recorder.reductions) == (2, 2)
        assert recorder.read().modules["two"].max_abs == 6.0  # max(|-6|, |2|, 6, 1.5)
    with ActivationRecorder(model, lean=True) as recorder:
        model(torch.tensor([1.0, -3.0]), torch.tensor([math.nan, 0.5]))
    two = recorder.read().modules["two"]
    assert two.non_finite and not two.overflow
    same = torch.tensor([2.0, -9.0])
    assert len(_distinct([same, same])) == 1
    assert max(abs(v.item()) for v in fused([same, torch.tensor([4.0])])) == 9.0
