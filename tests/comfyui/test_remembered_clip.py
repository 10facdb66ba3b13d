"""The text encoder's share of a remembered fix, between the desktop and the nodes, for a
checkpoint that carries its CLIP: a text-encoder fix `halfsafe check` proved is handed to
HalfSafe Fix with the CLIP connected and no fix connected; and a fix HalfSafe Check proves
afterwards for the same file keeps that share in the store (each part's share of one file's
entry is kept where a check proves another part).

The checkpoint: the tiny SD1 one (one attention query planted past fp16) with CLIP-L at its
released size (ComfyUI's loader loads no other), one MLP layer scaled past fp16's range. The
desktop computes it in fp16 and keeps some of its layers wider; HalfSafe Fix runs ComfyUI's
CLIP in fp32, which holds them, and says so. Each side runs in its own
environment, on the CPU, as a separate process, over one store.

Needs HALFSAFE_COMFYUI and HALFSAFE_COMFYUI_PYTHON, as test_nodes.py; skipped without them."""

from __future__ import annotations

import json

from tests.support.comfyui_checkpoints import PLANTED_CLIP, tiny_sd1_checkpoint
from tests.support.comfyui_env import NEEDS_COMFYUI, run_driver
from tests.support.desktop_check import desktop_check

pytestmark = NEEDS_COMFYUI


def _text_encoder_share(settings: dict) -> dict:
    share = {k: v for k, v in settings.items() if k == "text_encoder_precision"}
    for name in ("fp32_modules", "bf16_modules", "clamp_modules"):
        entries = [e for e in settings.get(name, []) if e.startswith("text_encoder:")]
        if entries:
            share[name] = entries
    return share


def test_the_text_encoders_share_travels_and_stays(tmp_path):
    checkpoint = tiny_sd1_checkpoint(tmp_path / "sd1_clip_l.safetensors", full_clip=True)

    report = desktop_check(checkpoint, tmp_path)
    assert report["verdict"] == "fixable" and report["fix"]["verified"]
    assert report["components"]["text_encoder"]["first_bad_module"].startswith(PLANTED_CLIP)
    share = _text_encoder_share(report["fix"]["settings"])
    # The cheapest fix keeps the encoder's overflowing layers wider, not the whole encoder.
    count = sum(len(v) for k, v in share.items() if k.endswith("_modules"))
    assert count, report["fix"]["settings"]

    # HalfSafe Fix without the CLIP: the share waits for it, in one sentence.
    fixed = run_driver("drive_store.py", [str(checkpoint), "fix"], tmp_path)["fix"]
    assert (
        "The remembered fix has a text-encoder part: connect the CLIP to HalfSafe Fix to "
        "apply it." in fixed["said"]
    )

    # With the CLIP connected and no fix: the share is this CLIP's fix, put on as the whole
    # CLIP in fp32, which holds those layers, and said so.
    fixed = run_driver("drive_store.py", [str(checkpoint), "fix+clip"], tmp_path)["fix"]
    # ComfyUI's CLIP-L keeps one compute dtype of its own, told fp32 on the clone.
    assert (
        "The CLIP: the text encoder computes in fp32 (1 of its modules told so)." in (fixed["said"])
    )
    assert "HalfSafe Fix runs the whole CLIP in fp32, which holds it." in fixed["said"]
    (patch,) = fixed["clip_patches_added"]
    assert patch.endswith(".dtype"), patch
    assert fixed["clip_passed_on"]

    # HalfSafe Check without the CLIP proves the diffusion model's fix for the same file: the
    # text encoder's share stays in the store beside it, and the summary says it.
    checked = run_driver("drive_store.py", [str(checkpoint), "check"], tmp_path)["check"]
    assert checked["fix"]["islands"] and "not remembered" not in checked["text"]
    stored = json.loads((tmp_path / "data" / "profiles.json").read_text())
    (entry,) = stored.values()
    assert _text_encoder_share(entry["settings"]) == share
    assert (
        f"Kept from the fix remembered before: keep {count} text encoder layers in"
        in (entry["summary"])
    )
    assert any(e.startswith("unet:") for e in entry["settings"].get("fp32_modules", []))
