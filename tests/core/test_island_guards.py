"""An island's guards sit only where its wider values arrive.

A layer-level fix keeps a few layers of an fp16 component in fp32; each layer the wider values
reach casts them back (its guard). Guarding every layer of the component cost a real UNet step
17% on a GPU (a Python hook on ~1,000 layers); after the first call only the layers that were
handed another dtype keep a guard. The answers stay those of a copy guarded everywhere, bit for
bit: each test runs the same job with the guards left on every layer beside it.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from PIL import Image

from app.core.generation import GenerationRequest, generate
from app.core.precision import PlacedPipeline, placement, resolve_plan
from app.core.settings import PrecisionSettings
from tests.support.planted_sd import TE_LAYER, VAE_LAYER, loaded
from tests.support.tiny_models import build_tiny_sd_pipeline

UNET_LAYER = "down_blocks.0.resnets.0.conv1"


def _norm(layer: str) -> str:
    return layer.replace("conv1", "norm2")


# component, planted layer, factor, the islands a check keeps for it (fp32, as without bf16)
PLANTS = [
    ("unet", UNET_LAYER, 1e6, (UNET_LAYER, _norm(UNET_LAYER))),
    ("vae", VAE_LAYER, 1e6, (VAE_LAYER, _norm(VAE_LAYER))),
    (
        "text_encoder",
        TE_LAYER,
        1e5,
        (
            TE_LAYER,
            TE_LAYER.replace("fc1", "fc2"),
            "encoder.layers.1.layer_norm1",
            "encoder.layers.1.layer_norm2",
            "final_layer_norm",
        ),
    ),
]


# The layers left guarded: the UNet's and the VAE's `conv2` after the islands' `norm2`; in the
# text encoder the fp32 residual stream reaches the next layer's attention projections (its
# layer norms are islands), which take it back to fp16.
GUARDS_LEFT = {"unet": 1, "vae": 1, "text_encoder": 4}


@pytest.fixture
def guarded_everywhere(monkeypatch):
    """Today's islands as they were placed before: every layer keeps its guard for good."""

    def keep_every_guard(self):
        pass

    def use():
        monkeypatch.setattr(placement.Guards, "_settle", keep_every_guard)

    return use


def _placed(component: str, layer: str, factor: float, islands) -> PlacedPipeline:
    pipeline = build_tiny_sd_pipeline()
    with torch.no_grad():
        getattr(pipeline, component).get_submodule(layer).weight.mul_(factor)
    layers = tuple(f"{component}:{path}" for path in islands)
    settings = PrecisionSettings(precision="fp16", fp32_modules=layers)
    plan = resolve_plan(settings, device="cpu", components=["text_encoder", "unet", "vae"])
    return PlacedPipeline(pipeline, plan, [component])


def _call(component: str, module):
    """One call of the placed `component` on fixed inputs (the UNet's CFG batch)."""
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        if component == "unet":
            sample = torch.randn(2, module.config.in_channels, 8, 8, generator=generator)
            context = torch.randn(2, 77, module.config.cross_attention_dim, generator=generator)
            return module(sample.half(), torch.tensor(500.0), context.half()).sample
        if component == "vae":
            latents = torch.randn(1, module.config.latent_channels, 8, 8, generator=generator)
            return module.decode(latents.half()).sample
        ids = torch.randint(0, module.config.vocab_size, (2, 77), generator=generator)
        return module(ids)[0]


def _pre_hooks(module) -> int:
    return sum(len(layer._forward_pre_hooks) for layer in module.modules())


@pytest.mark.parametrize(("component", "layer", "factor", "islands"), PLANTS)
def test_after_one_call_only_the_layers_fed_wider_values_stay_guarded(
    component, layer, factor, islands
):
    placed = _placed(component, layer, factor, islands)
    module = placed[component]
    layers = sum(next(m.parameters(recurse=False), None) is not None for m in module.modules())
    hooks_before = _pre_hooks(module)
    assert hooks_before >= layers  # the first call watches every layer, as before

    first = _call(component, module)
    assert torch.isfinite(first).all()
    guards = module._halfsafe_guards
    assert guards.calls >= layers // 2  # the VAE's encoder does not run in a decode

    # Each later call runs a guard on the few layers the islands' fp32 output reaches before a
    # layer takes it back to fp16 (a layer that has not run yet, as the encoder, keeps its
    # guard: it costs nothing until it runs), and gives the first call's answer, bit for bit.
    calls = guards.calls
    second = _call(component, module)
    assert guards.calls - calls == GUARDS_LEFT[component]
    assert _pre_hooks(module) < hooks_before - layers // 2
    assert torch.equal(first, second)


@pytest.mark.parametrize(("component", "layer", "factor", "islands"), PLANTS)
def test_the_answer_is_that_of_a_copy_guarded_everywhere_bit_for_bit(
    guarded_everywhere, component, layer, factor, islands
):
    lean = _placed(component, layer, factor, islands)
    lean_outputs = [_call(component, lean[component]) for _ in range(3)]
    guarded_everywhere()
    full = _placed(component, layer, factor, islands)
    full_outputs = [_call(component, full[component]) for _ in range(3)]
    guards = full[component]._halfsafe_guards
    assert guards.attached == len(guards.layers)  # every layer kept its guard
    for a, b in zip(lean_outputs, full_outputs, strict=True):
        assert torch.equal(a, b)


def test_a_kept_copy_keeps_its_guards_settled_unless_its_attention_changes():
    """A check's timed runs place the same copy again before each call: it keeps the guards
    settled (each timed call costs what a generation's step after the first does). Run with
    other attention settings, it watches its next call again."""
    placed = _placed("unet", UNET_LAYER, 1e6, (UNET_LAYER, _norm(UNET_LAYER)))
    module = placed["unet"]
    _call("unet", module)
    guards = module._halfsafe_guards
    settled = guards.attached
    placed.apply(placed.plan, ["unet"])  # the same copy, kept, the same settings
    assert placed["unet"] is module and guards.attached == settled
    calls = guards.calls
    _call("unet", module)
    assert guards.calls - calls == GUARDS_LEFT["unet"]

    placed.apply(placement.replace(placed.plan, upcast_attention=True), ["unet"])
    assert placed["unet"] is module
    assert guards.attached > settled  # every layer watched again
    _call("unet", module)
    assert guards.attached == settled


def test_a_generation_with_an_island_fix_makes_the_same_image_guarded_everywhere(
    guarded_everywhere, tmp_path, monkeypatch
):
    """The user's own generation under a remembered UNet island fix: every denoising step
    after the first runs only the few guards left, and the image is the same, bit for bit."""
    made: list[placement.Guards] = []
    init = placement.Guards.__init__

    def noting(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(placement.Guards, "__init__", noting)
    pipeline = build_tiny_sd_pipeline()
    with torch.no_grad():
        pipeline.unet.get_submodule(UNET_LAYER).weight.mul_(1e6)
    islands = (f"unet:{UNET_LAYER}", f"unet:{_norm(UNET_LAYER)}")
    settings = PrecisionSettings(precision="fp16", fp32_modules=islands, auto_fix="off")
    steps = 4

    def image(folder: str):
        request = GenerationRequest(
            prompt="a lighthouse at dusk",
            steps=steps,
            width=64,
            height=64,
            seed=1234,
            output_dir=str(tmp_path / folder),
        )
        model = loaded(copy.deepcopy(pipeline), key=f"guards-{folder}")
        (entry,) = generate(model, request, precision=settings, device="cpu").images
        assert entry.status == "ok"
        return np.asarray(Image.open(entry.path))

    lean = image("lean")
    (unet_guards,) = made
    # The CFG batch is one UNet call per step: the first watches every layer, the rest run
    # one guard each (the layer after the islands).
    assert unet_guards.attached == 1
    layers = len(unet_guards.layers)
    assert unet_guards.calls == layers + (steps - 1) * unet_guards.attached

    guarded_everywhere()
    made.clear()
    full = image("full")
    assert made[0].calls == steps * layers
    assert np.array_equal(lean, full)
