"""The text encoders' share of a remembered fix (`file_fixes.text_encoder_settings`), the one
definition the desktop and the ComfyUI nodes' store read: their precision settings, the switch
of a layer group their kind keeps wider (T5's feed-forward, the fix a Flux or SD3.5 T5 in fp16
gets) and their layers. A fix the node proves for a checkpoint's diffusion model keeps that
share of the entry the desktop stored for the same file (nothing already saved is lost)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from app.core.fixing import profiles
from app.core.fixing.file_fixes import text_encoder_settings

PACKAGE = Path(__file__).resolve().parents[2] / "comfyui-halfsafe"

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


def _node_store():
    """The nodes' store module, imported as ComfyUI imports the package's modules, without
    ComfyUI (its imports of ComfyUI are inside the functions that run in it)."""
    name = "halfsafe_nodes_under_test"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, PACKAGE / "__init__.py", submodule_search_locations=[str(PACKAGE)]
        )
        assert spec is not None
        sys.modules[name] = importlib.util.module_from_spec(spec)  # its __init__ not run
    return importlib.import_module(f"{name}.store")


def test_a_fix_the_node_proves_keeps_the_desktops_text_encoder_share():
    store = _node_store()
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


def test_a_switch_no_part_owns_stays_beside_a_fix_the_node_proves():
    """A desktop fix that turned CUDA's reduced-precision sums off (a switch every part runs
    under, set False over the user's True) for a checkpoint stays when the node proves the
    diffusion model's fix for the same file; the parts' own shares follow their parts."""
    store = _node_store()
    key, device = "file:sdxl-checkpoint", "NVIDIA GeForce RTX 3060"
    desktop = {
        "fp16_accumulation": False,
        "attention_reduced_precision": False,
        "fp16_reduced_precision_reduction": False,
        "upcast_attention": True,  # the denoiser's: the node's proof replaces it
        "vae_precision": "fp32",
    }
    profiles.remember_fix(key, device, desktop, "the desktop's fix", "health check")
    node_fix = {
        "settings": {"fp32_modules": ["unet:mid_block.attentions.0"]},
        "summaries": ["keep 1 UNet layer in fp32"],
        "made_at": {},
        "parts": ["unet"],
    }
    store._store(key, device, node_fix, [])

    stored = profiles.lookup(key, device).fix
    assert stored is not None
    assert stored.settings == {
        "fp32_modules": ["unet:mid_block.attentions.0"],
        "fp16_accumulation": False,
        "attention_reduced_precision": False,
        "fp16_reduced_precision_reduction": False,
        "vae_precision": "fp32",
    }
    assert "Kept from the fix remembered before:" in stored.summary
    assert set(stored.parts) >= {"unet", "vae"}
