"""An int8 ConvRot layer computed as its tool computes it in every grad mode, and so on every
path that runs one.

The tool (ComfyUI, every prompt under `torch.inference_mode`, through comfy-kitchen's int8
tensor) rotates a ConvRot layer's input in the compute dtype before its int8 product, so an fp16
input whose rotated values pass 65,504 overflows there. HalfSafe's layer must overflow alike
whether the run computing it is under inference mode, plain `no_grad` or autograd: under all
but inference mode, torch splits a linear layer before the weight's own dispatch sees it.
"""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch
from comfy_kitchen.backends.eager import quantization as kitchen
from comfy_kitchen.tensor.base import QuantizedTensor
from comfy_kitchen.tensor.int8 import TensorWiseINT8Layout
from PIL import Image

from app.core import generation, models
from app.core.checkpoint.stored import from_int8_convrot, hadamard
from app.core.components import Verdict
from app.core.hires import Hires
from app.core.run import stage_run
from app.core.settings import PrecisionSettings
from tests.support.convrot_files import rotation_overflowing_zimage
from tests.support.family_helpers import (
    check,
    offline,  # noqa: F401 - an autouse fixture: no network
)

FP16 = PrecisionSettings(precision="fp16")
GRAD_MODES = {
    "inference_mode": torch.inference_mode,
    "no_grad": torch.no_grad,
    "autograd": torch.enable_grad,
}
GROUP = 256
PEAK = 5000.0  # rotated: 16 * 5,000 = 80,000, past fp16's 65,504


def layer_weights():
    values = torch.randn(32, 2 * GROUP, generator=torch.Generator().manual_seed(2)) * 0.02
    return kitchen.quantize_int8_convrot_weight(values, GROUP)


def rows(batch: int, tokens: int) -> torch.Tensor:
    """fp16 input rows: each one's first group `PEAK` times the signs of one row of H (what a
    rotation grows most, to sqrt(256) = 16 times), but the very first row, which stays small."""
    x = torch.randn(batch, tokens, 2 * GROUP, generator=torch.Generator().manual_seed(1))
    x[..., :GROUP] = PEAK * torch.sign(hadamard(GROUP)[3])
    x[0, 0, :GROUP] = 1.0
    return x.half()


# How torch hands a linear layer on: whole (inference mode), as `.t()` then `mm` or `addmm`, or
# as `expand` then `bmm` (rows that are not one block), depending on the mode and the input.
INPUTS = {
    "one row": lambda: rows(1, 2)[0, 1],
    "rows": lambda: rows(1, 5)[0],
    "batch": lambda: rows(2, 3),
    "batch of strided rows": lambda: rows(3, 2).transpose(0, 1),
    "images": lambda: rows(2, 4).reshape(2, 2, 2, 2 * GROUP),
}


@pytest.mark.parametrize("bias", [False, True], ids=["no bias", "bias"])
@pytest.mark.parametrize("shape", list(INPUTS))
@pytest.mark.parametrize("mode", ["no_grad", "autograd", "autograd, input recorded"])
def test_a_convrot_layer_computes_alike_in_every_grad_mode(mode, shape, bias):
    stored, scale = layer_weights()
    layer = torch.nn.Linear(2 * GROUP, 32, bias=bias).to(torch.float16)
    layer.weight = torch.nn.Parameter(
        from_int8_convrot(stored, scale, GROUP).to(torch.float16), requires_grad=False
    )
    x = INPUTS[shape]()

    with torch.inference_mode():
        as_the_stages_run = layer(x)
    with GRAD_MODES[mode.split(",")[0]]():
        recorded = x.detach().requires_grad_(True) if "recorded" in mode else x
        here = layer(recorded).detach()

    torch.testing.assert_close(here, as_the_stages_run, rtol=0, atol=0, equal_nan=True)
    assert not bool(here.isfinite().all())
    # The tool's own layer, as ComfyUI runs it: every row but the small one overflows.
    params = TensorWiseINT8Layout.Params(
        scale=scale,
        orig_dtype=torch.float16,
        orig_shape=tuple(stored.shape),
        convrot=True,
        convrot_groupsize=GROUP,
    )
    weight = QuantizedTensor(stored, "TensorWiseINT8Layout", params)
    with torch.inference_mode():
        tool = torch.nn.functional.linear(x, weight, layer.bias)
    assert torch.equal(here.isfinite(), tool.isfinite())


# Every path, whatever grad mode the stage runner chose ----------------------------------------


@contextmanager
def computing_under_no_grad(plan):
    """`stage_run.computing` with plain `no_grad` in place of inference mode."""
    from app.core.precision import backend_flags

    with backend_flags(plan), torch.no_grad():
        yield


@pytest.fixture(scope="module")
def rotation_overflow(tmp_path_factory):
    """Z-Image as int8 ConvRot whose every block modulation's rotated input passes 65,504 in
    fp16 while its input and output stay finite (`rotation_overflowing_zimage`), loaded, and
    those layers' names."""
    written, _, modulations = rotation_overflowing_zimage(tmp_path_factory.mktemp("int8"))
    layers = {key.removesuffix(".weight") for key in modulations}
    return models.load_model(str(written.path)), layers


PATHS = ("check", "txt2img", "img2img", "hires fix")


@pytest.mark.slow
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("stages_run_under", ["inference_mode", "no_grad"])
def test_the_rotation_only_overflow_is_found_on_every_path(
    rotation_overflow, tmp_path, monkeypatch, stages_run_under, path
):
    model, layers = rotation_overflow
    if stages_run_under == "no_grad":
        monkeypatch.setattr(stage_run, "computing", computing_under_no_grad)

    if path == "check":
        report = check(model)

        # The fp16 run itself went NaN where the rotation overflowed (not only predicted from
        # the layers' peaks), and the fix was verified by running it.
        assert report.verdict is Verdict.FIXABLE
        transformer = report.to_json()["components"]["transformer"]
        assert transformer["precisions"]["fp16"] == {"status": "nan", "measured": True}
        assert report.components["transformer"].first_bad_module in layers
        assert report.fix is not None and report.fix.verified
        assert set(report.to_json()["fix"]["modules"]["transformer"]) == layers
        return

    picture = tmp_path / "picture.png"
    Image.new("RGB", (64, 64), (120, 80, 40)).save(picture)
    extra = {
        "txt2img": {},
        "img2img": {"images": [str(picture)], "strength": 0.6},
        "hires fix": {"hires": Hires(scale=1.5)},
    }[path]
    request = generation.GenerationRequest(
        prompt="a red cat",
        steps=2,
        cfg=1.0,
        seed=3,
        width=64,
        height=64,
        output_dir=str(tmp_path),
        **extra,
    )
    result = generation.generate(model, request, precision=FP16, device="cpu")

    (image,) = result.images
    # The NaN watch caught the transformer, its re-run of the failing call named the layer, and
    # the repair was verified against fp32 before the image was made again with it.
    assert (image.status, image.component) == ("fixed", "transformer"), image.message
    assert image.first_bad_module in layers
    assert image.quality is not None and image.quality.passed
