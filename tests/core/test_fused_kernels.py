"""Fused kernels beyond attention: a library that replaced one of torch.nn.functional's ops (a
fused group norm here; RMS and layer norm, linear, GELU and SiLU likewise) is found, turned off
by a named attention backend (which runs PyTorch's own kernels throughout), compared with
PyTorch's own op on the same inputs when a check fails, and named as the cause with its switch,
while a true fp16 overflow in the same model is still `precision`. The library is a planted
package (`tests.support.fused_kernels`)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from app.core.precision import PrecisionPlan, backend_flags, kernels
from tests.support import fused_kernels as planted
from tests.support.planted_sd import check_and_attribute, loaded, plant
from tests.support.tiny_models import build_tiny_sd_pipeline


def group_input(dtype=torch.float16):
    generator = torch.Generator().manual_seed(0)
    return torch.randn(1, 8, 4, 4, generator=generator).to(dtype)


# --- detection --------------------------------------------------------------------------------


def test_pytorchs_own_ops_are_not_called_replaced():
    assert kernels.patched_ops() == []


def test_a_replaced_op_is_named_after_its_library_with_the_op(tmp_path):
    with planted.patched_in(tmp_path):
        (found,) = kernels.patched_ops()
        everything = kernels.foreign_kernels()
    assert (found.name, found.version, found.op) == ("fusedkit", "0.2.0", "group_norm")
    assert found.fused and not found.patched_sdpa
    assert found.function == "fusedkit.core.fused_group_norm"
    assert found.what() == "the fused group_norm kernel"
    assert found.to_json()["op"] == "group_norm"
    assert everything == [found]
    assert kernels.patched_ops() == []


def test_a_wrapper_that_copies_torchs_name_and_module_is_still_found():
    import functools

    original = F.layer_norm

    @functools.wraps(original)
    def wrapped(*args, **kwargs):
        return original(*args, **kwargs)

    F.layer_norm = wrapped
    try:
        (found,) = kernels.patched_ops()
    finally:
        F.layer_norm = original
    assert found.op == "layer_norm"


@pytest.mark.parametrize("op", kernels.FUSED_OPS)
def test_pytorchs_own_op_equals_the_functional_one(op):
    """`_torch_op` is what a named backend restores: it must be exactly torch's op."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(2, 8, 6, generator=generator)
    weight, bias = torch.randn(6, generator=generator), torch.randn(6, generator=generator)
    own = kernels._torch_op(op)
    calls = {
        "rms_norm": ((x, (6,), weight, 1e-6), {}),
        "layer_norm": ((x, (6,), weight, bias), {"eps": 1e-5}),
        "group_norm": ((x, 2), {}),
        "linear": ((x, torch.randn(3, 6, generator=generator), torch.zeros(3)), {}),
        "gelu": ((x,), {"approximate": "tanh"}),
        "silu": ((x.clone(),), {}),
    }
    args, kwargs = calls[op]
    assert torch.equal(own(*args, **kwargs), getattr(F, op)(*args, **kwargs))


def test_a_named_backend_runs_pytorchs_own_ops_and_puts_the_replacement_back(tmp_path):
    with planted.patched_in(tmp_path) as module:
        x = group_input()
        assert torch.isnan(F.group_norm(x, 4)).all()
        with backend_flags(PrecisionPlan(device="cpu", dtypes={}, attention_backend="classic")):
            assert torch.isfinite(F.group_norm(x, 4)).all()
        assert F.group_norm is module.fused_group_norm
        with backend_flags(PrecisionPlan(device="cpu", dtypes={}, attention_backend="auto")):
            assert F.group_norm is module.fused_group_norm  # auto runs what is installed


def test_the_comparison_returns_pytorchs_values_and_finds_the_nan(tmp_path):
    with planted.patched_in(tmp_path):
        (suspect,) = kernels.patched_ops()
        with kernels.comparing(suspect, 20.0) as comparison:
            out = F.group_norm(group_input(), 4)
            F.group_norm(group_input(torch.float32), 4)
    assert torch.isfinite(out).all()  # the run goes on with PyTorch's values
    assert comparison.calls == 2 and comparison.finding == "non_finite"
    assert comparison.first_bad_call == 0 and comparison.dtype == "float16"


# --- the check ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_fused_op_that_gives_nan_in_fp16_is_named_as_the_kernel_cause(tmp_path):
    with planted.patched_in(tmp_path) as module:
        report = check_and_attribute(loaded(build_tiny_sd_pipeline(), "planted-fused"))
        still = F.group_norm
    cause = report.cause

    assert still is module.fused_group_norm  # the check put the user's library back
    assert cause is not None and cause.kind == "kernel", report.headline
    assert cause.kernel is not None and cause.kernel.kernel.op == "group_norm"
    assert cause.kernel.comparison.finding == "non_finite"
    assert cause.action == "switch_backend" and cause.verified
    backend = cause.settings["attention_backend"]
    assert cause.repair == f"turn off fusedkit 0.2.0: use the {backend} attention backend"
    assert "the fused group_norm kernel fusedkit 0.2.0" in report.headline
    assert "PyTorch's own group_norm is right" in report.headline
    assert report.verdict == "fixable" and report.fix.settings == {"attention_backend": backend}
    document = report.to_json()["cause"]["kernel"]
    assert document["op"] == "group_norm" and document["patched_sdpa"] is False


@pytest.mark.slow
@pytest.mark.parametrize("faulty", [True, False], ids=["nan-fused", "honest-fused"])
def test_a_true_fp16_overflow_with_a_fused_op_is_still_precision(tmp_path, faulty):
    pipeline = plant(build_tiny_sd_pipeline(), "unet_ff")  # a UNet layer scaled past 65504
    with planted.patched_in(tmp_path, faulty=faulty):
        report = check_and_attribute(loaded(pipeline, "overflow-with-fused"))
    cause = report.cause
    # The faulty op makes the UNet NaN before its overflowing layer; the honest one does not.
    assert report.components["unet"].status == ("nan" if faulty else "overflow")
    assert cause is not None and cause.kind == "precision" and cause.kernel is None
    assert "fusedkit" not in report.headline
    # The faulty library is still named, as a note: turning it off alone is not enough here.
    named = [n for n in report.notes if "fused group_norm kernel fusedkit 0.2.0 gives NaN" in n]
    assert len(named) == (1 if faulty else 0), report.notes
