"""fp16 products on the CPU computed in fp32 and rounded once, for the tests.

A CPU without AVX-512 FP16 or AMX FP16 has no fp16 matrix kernels: torch 2.13 runs fp16 `mm`
and `conv2d` there in scalar loops that accumulate in fp32, 45 and 70 times slower than fp32
(measured on a 2-core Xeon with AVX-512F only: a 64x320 by 320x320 matmul, 13.6 ms against
0.30 ms; a 3x3 conv of 64 channels at 32x32, 102 ms against 1.5 ms). The suite's fp16 checks
then take hours on such a machine.

`install()` makes those kernels (`mm`, `addmm`, `bmm`, `baddbmm`, and the convolutions in 2D
and 3D, transposed or not), where every operand is fp16 and on the CPU, upcast their
operands to fp32 (a wide weight a slice of columns at a time), run torch's own fp32 kernel (oneDNN's for the 3D convolutions, which torch
sends to a nine times slower loop in fp32) and round the result to fp16 once. That is the
exact sum in fp32 rounded once, as the scalar loops compute it in another order (and as a
GPU's fp16 matmul does): within half a unit in fp16's last place plus the fp32 sum's own
error, `inf` where the sum passes 65504 (`tests/unit/test_cpu_fp16.py` holds these to that
bound, and torch's scalar convolutions too; its transposed ones round twice). Every other
dtype and every other device keep torch's own kernels: fp32 and bf16 calls run as before,
through the variants with an `out=` tensor, which these overrides leave alone.

Subprocesses get it too: `tests/conftest.py` puts `site/` on PYTHONPATH, whose
`sitecustomize` installs this once torch is imported (`HALFSAFE_TEST_CPU_FP16=fp32-sum`).
"""

from __future__ import annotations

import warnings

ENV = "HALFSAFE_TEST_CPU_FP16"
VALUE = "fp32-sum"

_library = None
# A product's second operand past WIDE elements is widened COLUMNS columns at a time (`install`).
# 256 columns were quickest on that machine at 3840 and 10240 rows (64 and 128 took twice as long).
WIDE, COLUMNS = 1 << 20, 256


def _out(dtype):
    import torch

    return torch.empty((0,), dtype=dtype)


def install() -> None:
    """Register the overrides in this process (once; later calls do nothing)."""
    global _library
    if _library is not None:
        return
    import torch

    half = torch.float16
    aten = torch.ops.aten

    def halves(*tensors) -> bool:
        # Operands of mixed dtypes go to torch's kernel, which refuses them as it always has:
        # a dtype mismatch in the code under test must fail here as it fails for a user.
        return all(t.dtype is half for t in tensors)

    def by_columns(a, b, c=None, beta=1, alpha=1):
        # A wide `b` (a released-width layer's weight) widened whole is a fresh allocation of
        # up to hundreds of MB, paged in on every call: widened COLUMNS at a time instead, each
        # slice's fp32 sum is the same sum (a 16x3840 by 3840x10240 product: 45 ms against
        # 187 ms on the machine above).
        rows, width = a.shape[0], b.shape[1]
        wide_a = a.float()
        out = torch.empty((rows, width), dtype=torch.float32)
        wide_c = None if c is None else c.float().expand(rows, width)
        for start in range(0, width, COLUMNS):
            part, into = b[:, start : start + COLUMNS].float(), out[:, start : start + COLUMNS]
            if wide_c is None:
                aten.mm.out(wide_a, part, out=into)
            else:
                aten.addmm.out(
                    wide_c[:, start : start + COLUMNS], wide_a, part, beta=beta, alpha=alpha,
                    out=into,
                )  # fmt: skip
        return out.to(half)

    def is_wide(b) -> bool:
        return b.numel() > WIDE and b.shape[1] > COLUMNS

    def mm(a, b):
        if halves(a, b):
            if is_wide(b):
                return by_columns(a, b)
            return aten.mm.out(a.float(), b.float(), out=_out(torch.float32)).to(half)
        return aten.mm.out(a, b, out=_out(a.dtype))

    def bmm(a, b):
        if halves(a, b):
            return aten.bmm.out(a.float(), b.float(), out=_out(torch.float32)).to(half)
        return aten.bmm.out(a, b, out=_out(a.dtype))

    def addmm(c, a, b, *, beta=1, alpha=1):
        if halves(c, a, b):
            if is_wide(b):
                return by_columns(a, b, c, beta, alpha)
            wide_sum = aten.addmm.out(
                c.float(), a.float(), b.float(), beta=beta, alpha=alpha, out=_out(torch.float32)
            )
            return wide_sum.to(half)
        return aten.addmm.out(c, a, b, beta=beta, alpha=alpha, out=_out(a.dtype))

    def baddbmm(c, a, b, *, beta=1, alpha=1):
        if halves(c, a, b):
            wide = aten.baddbmm.out(
                c.float(), a.float(), b.float(), beta=beta, alpha=alpha, out=_out(torch.float32)
            )
            return wide.to(half)
        return aten.baddbmm.out(c, a, b, beta=beta, alpha=alpha, out=_out(a.dtype))

    # A convolution in fp16 on such a CPU leaves oneDNN for these scalar kernels (fp32 never
    # reaches them while oneDNN takes it): each runs as one fp32 convolution instead. Their
    # arguments, in schema order: self, weight, kernel_size, bias, stride, padding, then
    # output_padding and dilation (the transposed ones). The dilated ones stay torch's (slow in
    # fp16): their `out=` variants call them back, so fp32 would have no kernel left to run.
    def convolution(name: str, out: str, transposed: bool):
        theirs = getattr(getattr(aten, name), out)
        dims = 3 if "3d" in name else 2

        def kernel(x, weight, kernel_size, bias=None, stride=None, padding=None, *rest):
            stride, padding = stride or [1] * dims, padding or [0] * dims
            if not halves(x, weight, *([] if bias is None else [bias])):
                wanted = {out: _out(x.dtype)}
                return theirs(x, weight, kernel_size, bias, stride, padding, *rest, **wanted)
            output_padding = rest[0] if transposed and rest else [0] * dims
            dilation = rest[1] if transposed and len(rest) == 2 else [1] * dims
            bias = None if bias is None else bias.float()
            if dims == 3 and not transposed and onednn:
                # torch hands an fp32 3D convolution on one thread to its im2col loop, nine
                # times slower here than oneDNN's fp32 kernel (a 16-channel 3x3x3 at 3x64x64:
                # 25.8 ms against 2.9 ms); the sum is fp32 either way.
                wide = aten.mkldnn_convolution.default(
                    x.float().contiguous(), weight.float().contiguous(), bias, padding, stride,
                    [1] * dims, 1,
                )  # fmt: skip
                return wide.to(half)
            wide = aten.convolution.default(
                x.float(), weight.float(), bias, stride, padding, dilation, transposed,
                output_padding, 1,
            )  # fmt: skip
            return wide.to(half)

        return kernel

    onednn = torch.backends.mkldnn.is_available()
    convolutions = {  # name: its out= variant, transposed
        "_slow_conv2d_forward": ("output", False),
        "slow_conv3d_forward": ("output", False),
        "slow_conv_transpose2d": ("out", True),
        "slow_conv_transpose3d": ("out", True),
    }

    library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        # "Overriding a previously registered kernel": that is the point.
        warnings.simplefilter("ignore", UserWarning)
        library.impl("mm", mm, "CPU")
        library.impl("bmm", bmm, "CPU")
        library.impl("addmm", addmm, "CPU")
        library.impl("baddbmm", baddbmm, "CPU")
        for name, (out, transposed) in convolutions.items():
            library.impl(name, convolution(name, out, transposed), "CPU")
    _library = library
