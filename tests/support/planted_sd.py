"""Tiny SD1.x pipelines with fp16 overflows planted, as the check's tests build them: the
layers planted and the plants (a layer's weights scaled so that its output passes 65504 in fp16
while staying finite in fp32, or a block's own code scaling what passes through it), the
pipeline held as a loaded model, and the check on the CPU at 64 px."""

from __future__ import annotations

import types

import torch

from app.core import causes, health
from app.core.checkpoint import scan_weights
from app.core.health.request import CheckRequest, CheckRun
from app.core.models import LoadedModel
from app.core.settings import PrecisionSettings
from tests.support.tiny_models import build_tiny_sd_pipeline

VAE_LAYER = "decoder.up_blocks.0.resnets.0.conv1"
FF_LAYER = "down_blocks.0.attentions.0.transformer_blocks.0.ff.net.0.proj"
ATTN_LAYER = "down_blocks.0.attentions.0.transformer_blocks.0.attn1"
TE_LAYER = "encoder.layers.0.mlp.fc1"
FP16 = PrecisionSettings(precision="fp16")


def plant(pipeline, fault: str):
    with torch.no_grad():
        if fault == "vae":
            pipeline.vae.get_submodule(VAE_LAYER).weight.mul_(1e6)
        elif fault == "unet_ff":
            pipeline.unet.get_submodule(FF_LAYER).weight.mul_(1e5)
        elif fault == "attention":
            attn = pipeline.unet.get_submodule(ATTN_LAYER)
            attn.to_q.weight.mul_(300)
            attn.to_k.weight.mul_(300)
        elif fault == "nan_weights":
            pipeline.unet.conv_in.weight[0, 0, 0, 0] = float("nan")
        else:
            raise AssertionError(fault)
    return pipeline


def loaded(pipeline, key: str = "tiny") -> LoadedModel:
    return LoadedModel(
        pipeline=pipeline,
        source=f"<{key}>",
        name=key,
        format="demo",
        architecture="sd1",
        prediction_type="epsilon",
        native_size=64,
        stored_dtype="fp32",
        model_hash=None,
        profile_key=key,
        weights=scan_weights(pipeline),
        detected_because="built in a test",
    )


def check(
    model,
    precision=FP16,
    remember=True,
    measure_cost=False,
    on_progress=None,
    cancel=None,
    complete_table=True,
    **asked,
):
    """`check_loaded` on the CPU at 64 px; `asked`: more of the request (steps, scheduler);
    without `complete_table`, stopped at the proved fix (`--quick`)."""
    # The fix's cost (extra UNet steps per plan) is measured in one test, not in every one.
    run = CheckRun(remember=remember, measure_cost=measure_cost, complete_table=complete_table)
    return health.check_loaded(
        model,
        CheckRequest(precision=precision, device="cpu", size=64, **asked),
        run=run,
        on_progress=on_progress,
        cancel=cancel,
    )


def stored_in_fp16(pipeline):
    """The model as users download it: its weights stored in fp16."""
    model = loaded(pipeline.to(torch.float16), "fp16-stored")
    model.stored_dtype = "fp16"
    return model


def half_stored(fault: str | None = None):
    """The tiny SD1.x model stored in fp16, as most files are (a fault planted first)."""
    pipeline = build_tiny_sd_pipeline()
    if fault:
        pipeline = plant(pipeline, fault)
    return pipeline.to(torch.float16)


def unet_inputs(pipeline):
    generator = torch.Generator().manual_seed(0)
    config = pipeline.unet.config
    return {
        "sample": torch.randn(2, config.in_channels, 8, 8, generator=generator),
        "timestep": torch.tensor(500.0),
        "encoder_hidden_states": torch.randn(
            2, 77, config.cross_attention_dim, generator=generator
        ),
    }


FF_BLOCK = FF_LAYER.rsplit(".net.", 1)[0]  # the FeedForward holding that layer


def between_layers(pipeline, masked: bool):
    """The feed-forward block's own code scales (or, `masked`, plants NaN in and then zeroes)
    what passes between its first layer and its second: no layer of its own is at fault."""
    block = pipeline.unet.get_submodule(FF_BLOCK)

    def forward(self, hidden_states, *args, **kwargs):
        hidden = self.net[0](hidden_states)
        if masked:
            hidden = torch.where(hidden > 0, hidden, torch.full_like(hidden, float("nan")))
            hidden = torch.nan_to_num(hidden, nan=0.0)
        else:
            hidden = hidden * 1e5
        for layer in self.net[1:]:
            hidden = layer(hidden)
        return hidden

    block.forward = types.MethodType(forward, block)
    return pipeline


def _text_encoder(pipeline):
    with torch.no_grad():
        pipeline.text_encoder.get_submodule(TE_LAYER).weight.mul_(1e5)
    return pipeline


PLANTS = {
    "healthy": lambda p: p,
    "vae": lambda p: plant(p, "vae"),
    "unet_ff": lambda p: plant(p, "unet_ff"),
    "attention": lambda p: plant(p, "attention"),
    "nan_weights": lambda p: plant(p, "nan_weights"),
    "text_encoder": _text_encoder,
    "between_layers": lambda p: between_layers(p, masked=False),
    "masked_nan": lambda p: between_layers(p, masked=True),
}


def check_and_attribute(model):
    """`causes.check_and_attribute` on the CPU at 64 px in fp16, nothing remembered."""
    return causes.check_and_attribute(
        model,
        CheckRequest(precision=FP16, device="cpu", size=64),
        run=CheckRun(remember=False, measure_cost=False),
    )


def plant_encoder(pipeline, factor=1e6):
    """Scale the VAE encoder's first conv past fp16 (finite in fp32): its first layer."""
    encoder = pipeline.vae.encoder
    first = encoder.down_blocks[0]
    layer = first.resnets[0].conv1 if hasattr(first, "resnets") else encoder.conv_in
    with torch.no_grad():
        layer.weight.mul_(factor)
    return next(n for n, m in pipeline.vae.named_modules() if m is layer)
