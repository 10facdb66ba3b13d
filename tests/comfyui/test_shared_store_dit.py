"""One store of remembered fixes for a transformer file, whose layers ComfyUI names in the
file's original layout (Black Forest Labs' `double_blocks.0.img_attn.qkv`) and the desktop in
diffusers' (`transformer_blocks.0.attn.to_q`): a layer fix `halfsafe check` proved is applied by
HalfSafe Fix in ComfyUI with no fix connected, and one HalfSafe Check proved is the remembered
fix `halfsafe check` runs with. Both sides key the file by its own bytes; each runs in its own
environment, on the CPU, as a separate process.

The model is a tiny Flux.1 transformer file in fp16 (the widths ComfyUI's detection reads, one
query projection planted past fp16's range), loaded by ComfyUI's own diffusion-model loader,
and by the desktop with its tiny text encoders and VAE beside it, as ComfyUI's folders keep
them. Needs HALFSAFE_COMFYUI and HALFSAFE_COMFYUI_PYTHON, as test_nodes.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.comfyui_env import NEEDS_COMFYUI, run_driver
from tests.support.desktop_check import desktop_check

# The desktop's layers and what ComfyUI keeps for them (HalfSafe's on the left). The attention
# op runs in ComfyUI's block code, not in a module of its own: its whole block is kept, in
# fp32, as the mapping keeps every island it widens.
COMFY_ISLANDS = {"transformer:transformer_blocks.0.attn": "diffusion_model.double_blocks.0"}
# The desktop's other verified candidate for this file: a clamp, which holds a layer's values
# for the code after it. ComfyUI computes that code otherwise: the clamp is not used there.
DESKTOP_CLAMP = "transformer:transformer_blocks.0.attn.to_q"
NOT_USED = "The remembered fix clamps transformer_blocks.0.attn.to_q"
COMFY_BLOCK = "double_blocks.0"  # the island HalfSafe Check proves
HALFSAFE_BLOCK = "transformer:transformer_blocks.0"  # the same block in HalfSafe's names

pytestmark = NEEDS_COMFYUI


@pytest.fixture(scope="module")
def transformer(tmp_path_factory) -> Path:
    """The planted transformer file in diffusion_models/, its companions beside it."""
    import torch

    from tests.support.comfyui_dits import (
        PLANT_SCALE,
        TINY_DITS,
        save_transformer_file,
        tiny_transformer,
    )
    from tests.support.model_files import save_split_files
    from tests.support.tiny_models import build_tiny_flux_pipeline

    pipeline = build_tiny_flux_pipeline()
    planted = tiny_transformer("flux")
    with torch.no_grad():
        planted.get_submodule(TINY_DITS["flux"].planted).weight.mul_(PLANT_SCALE)
    pipeline.transformer = planted  # its text widths are the tiny encoders' (32)
    written = save_split_files(pipeline, tmp_path_factory.mktemp("store_dit") / "models")
    return save_transformer_file(planted, written["transformer"])  # in fp16, as ComfyUI runs it


def in_comfyui(transformer: Path, home: Path, action: str) -> dict:
    return run_driver("drive_dit_store.py", [str(transformer), action], home)


def test_a_layer_fix_the_desktop_proved_is_applied_by_the_fix_node(transformer, tmp_path):
    report = desktop_check(transformer, tmp_path)
    assert report["verdict"] == "fixable" and report["fix"]["verified"]
    assert report["components"]["transformer"]["first_bad_module"].endswith("attn.to_q")
    settings = report["fix"]["settings"]

    found = in_comfyui(transformer, tmp_path, "fix")
    assert found["precision"]["compute"] == "fp16"
    fix = found["fix"]
    assert not fix["original_finite"] or fix["original_db"] < 0
    assert fix["original_patches"] == 0  # the MODEL passed in is not changed
    if settings.get("clamp_modules"):  # see DESKTOP_CLAMP
        assert settings["clamp_modules"] == [DESKTOP_CLAMP] and NOT_USED in fix["said"]
        return
    # The desktop picks among verified fixes by their cost on this machine: whichever it
    # remembered is the one the node applies, in ComfyUI's names, with no fix connected.
    wider = [e for k in ("fp32_modules", "bf16_modules") for e in settings.get(k, [])]
    assert fix["islands"] == sorted(COMFY_ISLANDS[e] for e in wider)
    if wider:
        assert "double_blocks.0 is kept in fp32" in fix["said"]  # more than proved, said so
    expected = {"bf16": "bfloat16", "fp32": "float32"}.get(settings.get("unet_precision", ""))
    assert fix["compute"] == expected
    assert report["fix"]["summary"] in fix["said"]
    assert "not used" not in fix["said"]
    # The call as ComfyUI runs it, against fp32: close to it with the fix.
    assert fix["fixed_finite"] and fix["fixed_db"] >= report["fix"]["quality"]["threshold"]


def test_a_layer_fix_the_check_node_proved_is_the_one_the_desktop_runs_with(transformer, tmp_path):
    found = in_comfyui(transformer, tmp_path, "check")
    proved = found["check"]["fix"]
    assert proved and proved["islands"] == {COMFY_BLOCK: "fp32"}
    assert "not remembered" not in found["check"]["text"]
    stored = json.loads((tmp_path / "data" / "profiles.json").read_text())
    (entry,) = stored.values()  # under the transformer file's own key
    assert entry["settings"] == {"fp32_modules": [HALFSAFE_BLOCK]}
    assert entry["parts"] == ["transformer"]

    report = desktop_check(transformer, tmp_path)
    assert report["remembered"] == proved["summary"]
    assert report["tested"]["transformer"] == "fp16"
    assert report["verdict"] == "healthy"  # its fp16 run, with the node's block kept in fp32
    assert report["headline"].startswith("Safe with the fix remembered for this model")
    assert not any("does not have" in note for note in report["notes"])


def test_a_block_the_desktop_stores_is_kept_in_its_own_dtype_and_a_clamp_is_not_used(
    transformer, tmp_path, monkeypatch
):
    """A block named exactly in both layouts keeps the dtype it was proved in; a clamp, the
    desktop's other verified candidate, is said and not used (ComfyUI computes the code after
    the clamped layer otherwise: applied there, it leaves the call as wrong as it was)."""
    from app.core import hardware
    from app.core.fixing import profiles
    from app.core.models.identity import file_key

    monkeypatch.setenv("HALFSAFE_DATA_DIR", str(tmp_path / "data"))
    key, device = file_key(transformer), hardware.describe_device("cpu").name
    remembered = {"bf16_modules": [HALFSAFE_BLOCK]}
    profiles.remember_fix(key, device, remembered, "A fix.", "health check", parts=("transformer",))

    fix = in_comfyui(transformer, tmp_path, "fix")["fix"]

    assert fix["islands"] == [f"diffusion_model.{COMFY_BLOCK}"] and "kept wider" in fix["said"]
    assert "not used" not in fix["said"] and "kept in fp32" not in fix["said"]
    assert fix["fixed_finite"] and fix["fixed_db"] >= 20

    clamp = {"clamp_modules": [DESKTOP_CLAMP]}
    profiles.remember_fix(key, device, clamp, "A clamp.", "health check", parts=("transformer",))

    fix = in_comfyui(transformer, tmp_path, "fix")["fix"]

    assert NOT_USED in fix["said"] and fix["islands"] == []
