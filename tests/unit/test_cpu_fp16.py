"""The suite's fp16 products on the CPU (`tests/support/cpu_fp16.py`) against torch's own
fp16 kernels, which stay reachable through the `out=` variants the overrides leave alone."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from tests.support import cpu_fp16

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def installed():
    cpu_fp16.install()


def _empty(dtype=torch.float16):
    return torch.empty((0,), dtype=dtype)


def _rounded_once(out: torch.Tensor, exact: torch.Tensor, magnitude: torch.Tensor, terms: int):
    """`out` is the exact result (fp64) summed in fp32 and rounded to fp16 once: within half a
    unit in fp16's last place plus the fp32 sum's own bound (`terms` times fp32's unit roundoff
    times the sum of the terms' magnitudes), and `inf` exactly where that sum passes 65504."""
    assert out.dtype == torch.float16
    assert out.shape == exact.shape
    assert torch.equal(torch.isinf(out), exact.abs() > 65504)
    finite = torch.isfinite(out)
    got, want = out[finite].double(), exact[finite]
    spacing = torch.pow(2.0, torch.floor(torch.log2(got.abs().clamp_min(2**-14))) - 10)
    bound = spacing / 2 + terms * 2**-24 * magnitude[finite]
    assert bool(((got - want).abs() <= bound).all())


def test_products_in_fp16_are_the_exact_sums_rounded_once():
    generator = torch.Generator().manual_seed(0)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=generator) * scale).half()

    def wide(*tensors, magnitude=False):
        return [t.double().abs() if magnitude else t.double() for t in tensors]

    a, w, bias = randn(64, 320, scale=4), randn(200, 320), randn(200)
    q, c = randn(16, 64, 32), randn(16, 64, 64)
    x, k, kb = randn(1, 64, 16, 16, scale=4), randn(32, 64, 3, 3), randn(32)
    t, tb = randn(64, 8, 2, 2), randn(8)
    v, k3, kb3, t3 = randn(1, 8, 4, 6, 6), randn(4, 8, 3, 3, 3), randn(4), randn(8, 8, 2, 2, 2)
    # A weight past cpu_fp16.WIDE elements, widened a slice of columns at a time.
    ta, tw, tbias = randn(5, 1100, scale=4), randn(1000, 1100), randn(1000)
    assert tw.numel() > cpu_fp16.WIDE and tw.shape[0] > cpu_fp16.COLUMNS
    cases = [
        (lambda a, w: a @ w.t(), (ta, tw), 1100, None),
        (F.linear, (ta, tw, tbias), 1101, None),
        (
            lambda b, a, w: torch.addmm(b[None], a, w.t(), beta=0.5, alpha=2),
            (tbias, ta, tw),
            1101,
            None,
        ),
        # What the suite's code calls, then torch's own scalar fp16 kernel where the overrides
        # leave one to call. Not for the matrix products: on a CPU with fp16 kernels their
        # `out=` variants run oneDNN, whose sums this test need not hold.
        (lambda a, w: a @ w.t(), (a, w), 320, None),
        (F.linear, (a, w, bias), 321, None),
        (
            lambda b, a, w: torch.addmm(b, a, w.t(), beta=0.5, alpha=2),
            (bias, a, w),
            321,
            None,
        ),
        (
            lambda q: torch.bmm(q, q.transpose(1, 2)),
            (q,),
            32,
            None,
        ),
        (
            lambda c, q: torch.baddbmm(c, q, q.transpose(1, 2), beta=0.5, alpha=0.3),
            (c, q),
            33,
            None,
        ),
        (
            lambda x, k, b: F.conv2d(x, k, b, stride=2, padding=1),
            (x, k, kb),
            577,
            lambda: aten._slow_conv2d_forward.output(
                x, k, [3, 3], kb, [2, 2], [1, 1], output=_empty()
            ),
        ),
        (
            lambda v, k, b: F.conv3d(v, k, b, padding=1),
            (v, k3, kb3),
            73,
            lambda: aten.slow_conv3d_forward.output(
                v, k3, [3, 3, 3], kb3, [1, 1, 1], [1, 1, 1], output=_empty()
            ),
        ),
        # torch's own round the product before they add the bias: not held to one rounding
        (lambda x, t, b: F.conv_transpose2d(x, t, b, stride=2), (x, t, tb), 65, None),
        (
            lambda v, t, b: F.conv_transpose3d(v, t, b, stride=2, output_padding=1),
            (v, t3, tb),
            65,
            None,
        ),
    ]
    for call, operands, terms, theirs in cases:
        exact = call(*wide(*operands))
        magnitude = call(*wide(*operands, magnitude=True))
        _rounded_once(call(*operands), exact, magnitude, terms)
        if theirs is not None:
            _rounded_once(theirs(), exact, magnitude, terms)


def test_a_product_past_65504_is_inf_as_in_torchs_kernel():
    big, weights = torch.full((4, 320), 100.0).half(), torch.full((320, 4), 3.0).half()
    assert bool(torch.isinf(big @ weights).all())
    assert bool(torch.isinf(aten.mm.out(big, weights, out=_empty())).all())


def test_other_dtypes_keep_torchs_kernels_bit_for_bit():
    generator = torch.Generator().manual_seed(1)
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        a = torch.randn(8, 48, generator=generator).to(dtype)
        b = torch.randn(48, 24, generator=generator).to(dtype)
        assert torch.equal(a @ b, aten.mm.out(a, b, out=_empty(dtype)))
        x = torch.randn(1, 4, 9, 9, generator=generator).to(dtype)
        k = torch.randn(6, 4, 3, 3, generator=generator).to(dtype)
        assert F.conv2d(x, k).dtype == dtype
    ints = torch.arange(6).reshape(2, 3)
    assert torch.equal(ints @ ints.t(), torch.tensor([[5, 14], [14, 50]]))
    # Gradients still flow: autograd sits above the CPU kernels these replace.
    layer = torch.nn.Linear(4, 3)
    layer(torch.randn(2, 4)).sum().backward()
    assert layer.weight.grad is not None and layer.weight.grad.shape == (3, 4)


def test_a_subprocess_of_the_suite_gets_the_overrides_once_it_imports_torch():
    code = (
        "import sys; assert 'torch' not in sys.modules\n"
        "overrides = sys.modules['cpu_fp16']; assert overrides._library is None\n"
        "import torch; print(overrides._library is not None)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"


def test_operands_of_mixed_dtypes_are_refused_as_torch_refuses_them():
    # A dtype mismatch in the code under test must fail in the suite as it fails for a user.
    half, wide = torch.randn(4, 8).half(), torch.randn(8, 3)
    mixed = [
        lambda: half @ wide,
        lambda: F.linear(half, wide.t()),
        lambda: torch.addmm(torch.zeros(3), half, wide.half()),
        lambda: torch.bmm(half[None], wide[None]),
        lambda: torch.baddbmm(torch.zeros(1, 4, 3), half[None], wide.half()[None]),
        lambda: F.conv2d(torch.randn(1, 2, 5, 5).half(), torch.randn(3, 2, 3, 3)),
        lambda: F.conv2d(
            torch.randn(1, 2, 5, 5).half(), torch.randn(3, 2, 3, 3).half(), torch.randn(3)
        ),
    ]
    for call in mixed:
        with pytest.raises(RuntimeError):
            call()
