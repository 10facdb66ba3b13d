"""fp16 products on the CPU computed in fp32 and rounded once, for the tests.

A CPU without AVX-512 FP16 or AMX FP16 has no fp16 matrix kernels: torch 2.13 runs fp16 `mm`
and `conv2d` there in scalar loops that accumulate in fp32, 45 and 70 times slower than fp32
(measured on a 2-core Xeon with AVX-512F only: a 64x320 by 320x320 matmul, 13.6 ms against
0.30 ms; a 3x3 conv of 64 channels at 32x32, 102 ms against 1.5 ms). The suite's fp16 checks
then take hours on such a machine.

`install()` makes those kernels, for fp16 tensors on the CPU only, upcast their operands to
fp32, run torch's own fp32 kernel and round the result to fp16 once: the same sum, in another
order, so a result differs from the scalar loops' by at most one unit in the last place in a
few elements out of a thousand (`tests/unit/test_cpu_fp16.py` holds that), and a product past
65504 is `inf` in both. This is also what a GPU's fp16 matmul does (fp32 accumulation). Every
other dtype and every other device keep torch's own kernels: the fp32 and bf16 calls run
exactly as before, through the variants with an `out=` tensor, which these overrides leave.

Subprocesses get it too: `tests/conftest.py` puts `site/` on PYTHONPATH, whose
`sitecustomize` installs this once torch is imported (`HALFSAFE_TEST_CPU_FP16=fp32-sum`).
"""

from __future__ import annotations

import warnings

ENV = "HALFSAFE_TEST_CPU_FP16"
VALUE = "fp32-sum"

_library = None


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

    def mm(a, b):
        if a.dtype is half:
            return aten.mm.out(a.float(), b.float(), out=_out(torch.float32)).to(half)
        return aten.mm.out(a, b, out=_out(a.dtype))

    def bmm(a, b):
        if a.dtype is half:
            return aten.bmm.out(a.float(), b.float(), out=_out(torch.float32)).to(half)
        return aten.bmm.out(a, b, out=_out(a.dtype))

    def addmm(c, a, b, *, beta=1, alpha=1):
        if a.dtype is half:
            wide = aten.addmm.out(
                c.float(), a.float(), b.float(), beta=beta, alpha=alpha, out=_out(torch.float32)
            )
            return wide.to(half)
        return aten.addmm.out(c, a, b, beta=beta, alpha=alpha, out=_out(a.dtype))

    def baddbmm(c, a, b, *, beta=1, alpha=1):
        if a.dtype is half:
            wide = aten.baddbmm.out(
                c.float(), a.float(), b.float(), beta=beta, alpha=alpha, out=_out(torch.float32)
            )
            return wide.to(half)
        return aten.baddbmm.out(c, a, b, beta=beta, alpha=alpha, out=_out(a.dtype))

    # A convolution in fp16 on such a CPU leaves oneDNN for these scalar kernels (fp32 never
    # reaches them while oneDNN takes it): each runs as one fp32 convolution instead.
    def slow_conv2d(x, weight, kernel_size, bias, stride, padding):
        if x.dtype is half:
            wide = aten.convolution.default(
                x.float(),
                weight.float(),
                None if bias is None else bias.float(),
                stride,
                padding,
                [1, 1],
                False,
                [0, 0],
                1,
            )
            return wide.to(half)
        return aten._slow_conv2d_forward.output(
            x, weight, kernel_size, bias, stride, padding, output=_out(x.dtype)
        )

    def slow_conv_transpose2d(
        x, weight, kernel_size, bias=None, stride=(1, 1), padding=(0, 0), output_padding=(0, 0),
        dilation=(1, 1),
    ):  # fmt: skip
        if x.dtype is half:
            wide = aten.convolution.default(
                x.float(),
                weight.float(),
                None if bias is None else bias.float(),
                stride,
                padding,
                dilation,
                True,
                output_padding,
                1,
            )
            return wide.to(half)
        return aten.slow_conv_transpose2d.out(
            x, weight, kernel_size, bias, stride, padding, output_padding, dilation,
            out=_out(x.dtype),
        )  # fmt: skip

    library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        # "Overriding a previously registered kernel": that is the point.
        warnings.simplefilter("ignore", UserWarning)
        library.impl("mm", mm, "CPU")
        library.impl("bmm", bmm, "CPU")
        library.impl("addmm", addmm, "CPU")
        library.impl("baddbmm", baddbmm, "CPU")
        library.impl("_slow_conv2d_forward", slow_conv2d, "CPU")
        library.impl("slow_conv_transpose2d", slow_conv_transpose2d, "CPU")
    _library = library
