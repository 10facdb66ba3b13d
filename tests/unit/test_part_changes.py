"""Whether a plan runs one part otherwise than another (`job_plans.changes_part`): what the check
asks before it decodes the VAE as the user runs it as well as under the fixes found for earlier
parts (a switch every part runs under reaches the VAE; a UNet layer kept wider does not)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.core.fixing.job_plans import SHARED_SWITCHES, changes_part
from app.core.precision import PrecisionPlan

BASE = PrecisionPlan(device="cpu", dtypes={"text_encoder": "fp16", "unet": "fp16", "vae": "fp16"})


def test_another_parts_own_settings_leave_the_part_alone():
    unet_fixed = replace(
        BASE,
        dtypes={**BASE.dtypes, "text_encoder": "bf16"},
        modules={"unet": {"down_blocks.0.attentions.0": "fp32"}},
        clamps={"unet": ("up_blocks.1.resnets.0",)},
    )
    assert not changes_part("vae", unet_fixed, BASE)
    assert changes_part("unet", unet_fixed, BASE) and changes_part("text_encoder", unet_fixed, BASE)


@pytest.mark.parametrize(
    "changed",
    [
        {"upcast_attention": True},
        {"attention_backend": "math"},
        {"allow_tf32": False},
        {"fp16_reduced_precision_reduction": False},
        {"fp16_accumulation": True},
        {"attention_reduced_precision": True},
        {"autocast": True},
    ],
)
def test_a_switch_every_part_runs_under_reaches_the_part(changed):
    assert set(changed) <= set(SHARED_SWITCHES)
    assert changes_part("vae", replace(BASE, **changed), BASE)


def test_the_parts_own_settings_change_it():
    assert changes_part("vae", replace(BASE, dtypes={**BASE.dtypes, "vae": "bf16"}), BASE)
    assert changes_part("vae", replace(BASE, modules={"vae": {"decoder.conv_in": "fp32"}}), BASE)
    assert changes_part("vae", replace(BASE, clamps={"vae": ("decoder.conv_out",)}), BASE)
    assert not changes_part("vae", replace(BASE, modules={"vae": {}}), BASE)  # none is empty


def test_the_vaes_encoder_and_decoder_are_told_apart():
    """The VAE's encoder (a job from a picture) and its decoder are one module: a layer fix of
    the one leaves the other's run alone, the whole VAE's dtype reaches both."""
    decoder_fixed = replace(BASE, modules={"vae": {"decoder.mid_block.attentions.0": "fp32"}})
    assert changes_part("vae", decoder_fixed, BASE)
    assert not changes_part("vae_encoder", decoder_fixed, BASE)
    encoder_fixed = replace(BASE, clamps={"vae": ("encoder.down_blocks.1.resnets.0",)})
    assert changes_part("vae_encoder", encoder_fixed, BASE)
    assert not changes_part("vae", encoder_fixed, BASE)
    assert changes_part("vae_encoder", replace(BASE, modules={"vae": {"quant_conv": "fp32"}}), BASE)
    whole = replace(BASE, dtypes={**BASE.dtypes, "vae": "fp32"})
    assert changes_part("vae", whole, BASE) and changes_part("vae_encoder", whole, BASE)
    assert changes_part("vae_encoder", replace(BASE, upcast_attention=True), BASE)
