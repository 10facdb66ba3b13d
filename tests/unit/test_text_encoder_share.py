"""The text encoders' share of a remembered fix (`file_fixes.text_encoder_settings`), the one
definition the desktop and the ComfyUI nodes' store read: their precision settings, the switch
of a layer group their kind keeps wider (T5's feed-forward, the fix a Flux or SD3.5 T5 in fp16
gets) and their layers. A fix the node proves for a checkpoint's diffusion model keeps that
share of the entry the desktop stored for the same file (nothing already saved is lost)."""

from __future__ import annotations

import pytest

from app.core.fixing import profiles
from app.core.fixing.file_fixes import text_encoder_settings
from tests.support.node_package import node_module

DESKTOP_FIX = {
    "text_encoder_2_precision": "bf16",
    "t5_fp32_feed_forward": True,
    "unet_precision": "fp16",
    "fp32_modules": ["text_encoder:text_model.encoder.layers.0.mlp.fc2", "unet:mid_block"],
    "no_half_vae": True,
}


def test_the_share_holds_the_encoders_settings_switches_and_layers():
    assert text_encoder_settings(DESKTOP_FIX) == {
        "text_encoder_2_precision": "bf16",
        "t5_fp32_feed_forward": True,
        "fp32_modules": ["text_encoder:text_model.encoder.layers.0.mlp.fc2"],
    }
    assert text_encoder_settings({"t5_fp32_feed_forward": False, "unet_precision": "fp32"}) == {}
    upsampler = {"prompt_upsampler_precision": "fp32"}
    assert text_encoder_settings(upsampler) == upsampler
    assert text_encoder_settings(upsampler, upsampler=False) == {}


def test_a_fix_the_node_proves_keeps_the_desktops_text_encoder_share():
    store = node_module("store")
    key, device = "file:sd35-checkpoint", "NVIDIA GeForce RTX 2060"
    profiles.remember_fix(key, device, DESKTOP_FIX, "the desktop's fix", "health check")
    node_fix = {
        "settings": {"unet_precision": "fp16", "fp32_modules": ["unet:down_blocks.0"]},
        "summaries": ["keep 1 UNet layer in fp32"],
        "made_at": {},
        "parts": ["unet"],
    }
    notes: list[str] = []
    store._store(key, device, node_fix, notes)

    stored = profiles.lookup(key, device).fix
    assert stored is not None and notes == []
    assert text_encoder_settings(stored.settings) == text_encoder_settings(DESKTOP_FIX)
    assert stored.settings["no_half_vae"] is True  # the VAE's share kept too
    assert "unet:down_blocks.0" in stored.settings["fp32_modules"]
    assert "unet:mid_block" not in stored.settings["fp32_modules"]  # the node's replaced it


def _stored_after_the_node(key: str, desktop: dict, parts: tuple[str, ...], node: dict, proved):
    """The entry stored for `key` after the desktop stored `desktop` (for its `parts`) and the
    node then proved `node` for the parts `proved`."""
    store = node_module("store")
    device = "NVIDIA GeForce RTX 3060"
    profiles.remember_fix(key, device, desktop, "the desktop's fix", "health check", parts=parts)
    entry = {"settings": node, "summaries": ["the node's fix"], "made_at": {}, "parts": proved}
    store._store(key, device, entry, [])
    stored = profiles.lookup(key, device).fix
    assert stored is not None
    return stored


SD = ("text_encoder", "unet", "vae")


def test_a_switch_every_part_runs_under_stays_beside_a_fix_the_node_proves():
    """A desktop fix may set a switch every part runs under for any part (the VAE's attention
    upcast; CUDA's reduced-precision sums turned off over the user's True): the node's fix for
    the diffusion model keeps it, each fix's group whole; the parts' own shares follow them."""
    desktop = {
        "fp16_accumulation": False,
        "attention_reduced_precision": False,
        "fp16_reduced_precision_reduction": False,
        "upcast_attention": True,
        "attention_backend": "math",
        "vae_precision": "fp32",
        "unet_precision": "bf16",
    }
    node = {"fp32_modules": ["unet:mid_block.attentions.0"]}
    stored = _stored_after_the_node("file:sdxl", desktop, SD, node, ["unet"])
    assert stored.settings == {
        "fp32_modules": ["unet:mid_block.attentions.0"],
        "fp16_accumulation": False,
        "attention_reduced_precision": False,
        "fp16_reduced_precision_reduction": False,
        "upcast_attention": True,
        "attention_backend": "math",
        "vae_precision": "fp32",
    }
    assert "Kept from the fix remembered before:" in stored.summary
    assert stored.parts == ("unet", "vae")


def test_everything_in_fp32_stays_as_the_other_parts_in_fp32():
    """The desktop's last resort, everything in fp32: the node's fix for the diffusion model
    stands in for the UNet's share, and the text encoder and VAE stay in fp32."""
    stored = _stored_after_the_node(
        "file:sd1", {"no_half": True}, SD, {"unet_precision": "bf16"}, ["unet"]
    )
    assert stored.settings == {
        "unet_precision": "bf16",
        "text_encoder_precision": "fp32",
        "vae_precision": "fp32",
    }


def test_the_vaes_encoder_layers_stay_where_the_node_proved_its_decode():
    """The node checks the VAE's decode: a fix of it replaces the decoder's layers and the
    VAE's precision, and keeps the encoder's layers a desktop image-to-image check found."""
    desktop = {
        "fp32_modules": ["vae:encoder.mid_block.attentions.0", "vae:decoder.up_blocks.1"],
        "no_half_vae": True,
    }
    node = {"fp32_modules": ["vae:decoder.up_blocks.0.resnets.0"]}
    stored = _stored_after_the_node("file:sd1-vae", desktop, SD, node, ["vae"])
    assert stored.settings == {
        "fp32_modules": ["vae:decoder.up_blocks.0.resnets.0", "vae:encoder.mid_block.attentions.0"]
    }


def test_each_role_is_one_part_and_the_entrys_own_name_comes_first():
    """A Flux entry keeps its transformer's share beside the node's VAE fix: the parts are
    named as the entry named them, once a role."""
    desktop = {"unet_precision": "bf16", "text_encoder_2_precision": "bf16"}
    parts = ("text_encoder", "text_encoder_2", "transformer", "vae")
    stored = _stored_after_the_node("file:flux", desktop, parts, {"vae_precision": "fp32"}, ["vae"])
    assert stored.settings == {**desktop, "vae_precision": "fp32"}
    assert stored.parts == ("vae", "text_encoder", "transformer")


def test_the_node_reads_the_held_fix_under_the_lock_its_write_takes(monkeypatch):
    """What is held for the file is read inside the lock the write takes (another process
    that tries to write then waits), so a fix stored between a read and the write is never
    lost; the fix stored is the same as before."""
    from app.core import files
    from app.core.fixing import file_fixes

    real = file_fixes.kept_beside
    read_locked: list[bool] = []

    def kept_beside(*args):
        try:
            with files.locked(profiles._path(), timeout=0.05):
                read_locked.append(False)
        except TimeoutError:
            read_locked.append(True)
        return real(*args)

    monkeypatch.setattr(file_fixes, "kept_beside", kept_beside)
    node = {"fp32_modules": ["unet:mid_block.attentions.0"]}
    stored = _stored_after_the_node("file:sd15", {"vae_precision": "fp32"}, SD, node, ["unet"])
    assert read_locked == [True]
    assert stored.settings == {
        "fp32_modules": ["unet:mid_block.attentions.0"],
        "vae_precision": "fp32",
    }
    assert stored.parts == ("unet", "vae")
    with pytest.raises(ValueError):  # a fix made under the lock is validated as any other
        profiles.remember_fix(
            "file:sd15",
            "NVIDIA GeForce RTX 3060",
            {},
            "a fix",
            "health check",
            beside=lambda held, fix: type(fix)({"vae_precision": "fp64"}, "", "health check", 0.0),
        )
