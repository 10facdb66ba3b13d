"""HalfSafe Check in ComfyUI and `halfsafe check` on the desktop give the same verdict on the same
transformer file: the same component, the same first bad layer and the same fix, each in its own
names (ComfyUI's are the file's original layout, the desktop's diffusers'), mapped through the
layout's key table (`app.core.formats.layer_names`). Each side runs in its own environment, on
the CPU in fp16, as a separate process, with a store of its own.

Families: Flux.2 Klein, SD3.5, Krea 2 and Anima, and SDXL from a single-file checkpoint
(Z-Image's, Chroma's and Qwen-Image's, at their released widths, are checked by the desktop on
the very file test_dit_families.py's node checks). The file: a small transformer in the widths
ComfyUI's detection reads (comfyui_dits.py; comfyui_families.py for the others, Krea 2's reading
the 12 encoder layers the released model reads, which the desktop needs to build it), one
query projection planted past fp16's range, with the family's tiny text encoders and VAE
beside it in ComfyUI's folders for the desktop (which loads the whole model; the node checks
the diffusion model alone, its text zeros of the model's widths). Flux.1's agreement, and the
fix each side remembers for the other, is in test_shared_store_dit.py; SD1's in
test_shared_store.py and test_node_work.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.comfyui_env import NEEDS_COMFYUI, run_driver
from tests.support.desktop_check import assert_same_layer_and_fix, desktop_check

BUILDERS = {  # the family's tiny pipeline, with its text as wide as the transformer reads it
    "flux2klein": ("build_tiny_flux2_klein_pipeline", {}),
    "sd3": ("build_tiny_sd3_pipeline", {}),
    "krea2": ("build_tiny_krea2_pipeline", {"text": 160, "released_taps": True}),
    "anima": ("build_tiny_anima_pipeline", {}),
}
# Text encoders as wide as the files read (comfyui_families.py): Anima's LLM adapter, fixed at
# its released size, reads Qwen3 0.6B's 1024.
TEXT_ENCODERS = {"anima": ("tiny_qwen3", {"hidden": 1024})}

pytestmark = NEEDS_COMFYUI


def planted_model(family: str, folder: Path):
    """The planted transformer file in diffusion_models/ with its companions beside it, and the
    layout's layer names for it."""
    import torch
    from safetensors.torch import load_file

    from app.core.families.krea2 import KREA2_TAPS
    from app.core.families.registry import family_of_denoiser
    from app.core.formats.layer_names import LayerNames
    from tests.support import tiny_models
    from tests.support.comfyui_dits import (
        PLANT_SCALE,
        TINY_DITS,
        save_transformer_file,
        tiny_transformer,
    )
    from tests.support.comfyui_families import FAMILY_FILES, family_adapter, family_transformer
    from tests.support.model_files import save_split_files

    builder, options = BUILDERS[family]
    pipeline = getattr(tiny_models, builder)(**options)
    if family in TEXT_ENCODERS:
        encoder, sizes = TEXT_ENCODERS[family]
        pipeline.text_encoder = getattr(tiny_models, encoder)(2, **sizes)
    if family == "anima":  # the released adapter's shape, which ComfyUI fixes
        pipeline.text_conditioner = family_adapter()
    if family in TINY_DITS:
        planted, layer = tiny_transformer(family), TINY_DITS[family].planted
    else:  # in the shape ComfyUI's detection reads (comfyui_families.py), reading the text
        # encoder's layers the released model reads, as the desktop builds it
        shaped = family_transformer(family)
        if family == "krea2":
            reads = {"num_text_layers": len(KREA2_TAPS)}
            planted = type(shaped).from_config({**shaped.config, **reads})
        else:
            planted = shaped
        layer = FAMILY_FILES[family].planted
    with torch.no_grad():
        planted.get_submodule(layer).weight.mul_(PLANT_SCALE)
    pipeline.transformer = planted  # its text widths are the tiny encoders'
    written = save_split_files(pipeline, folder / "models")
    file = save_transformer_file(planted, written["transformer"])  # in fp16, as ComfyUI runs it
    if family == "anima":  # the LLM adapter inside the DiT's file, as Anima's file keeps it
        from app.core.checkpoint import write_safetensors

        state = load_file(str(file))
        adapter = pipeline.text_conditioner.state_dict()
        state.update({f"llm_adapter.{k}": v.half() for k, v in adapter.items()})
        write_safetensors(file, state)
    layout = family_of_denoiser(planted).layout
    config = {**planted.config, "_class_name": type(planted).__name__}
    return file, LayerNames(layout.table(config))


@pytest.mark.parametrize("family", sorted(BUILDERS))
def test_the_node_and_the_desktop_name_the_same_layer_and_fix(family, tmp_path):
    file, names = planted_model(family, tmp_path)

    (tmp_path / "desktop").mkdir()
    (tmp_path / "node").mkdir()
    report = desktop_check(file, tmp_path / "desktop")
    found = run_driver("drive_dit_store.py", [str(file), "check"], tmp_path / "node")

    # The verdict, the component, the first bad layer, and the fix inside the node's island.
    text = found["check"]["text"]
    node_layer = text.split("First bad layer: diffusion_model.")[1].split()[0].rstrip(".")
    assert_same_layer_and_fix(report, found["check"], node_layer, names)


# Where the SDXL checkpoint's planted region sits in ComfyUI's names (HalfSafe's on the left).
SDXL_BLOCK = ("down_blocks.1.attentions.0", "input_blocks.4.1")


def test_the_node_and_the_desktop_agree_on_an_sdxl_checkpoint(tmp_path):
    """SDXL at its released depths, one single file as users download it: the desktop loads
    it whole (its text encoders at CLIP-L's and CLIP-G's widths); the node checks ComfyUI's
    MODEL from the same file with the zeros of those widths."""
    from tests.support.comfyui_checkpoints import PLANTED_SDXL, tiny_sdxl_checkpoint

    checkpoint = tiny_sdxl_checkpoint(tmp_path / "tiny_sdxl.safetensors")
    (tmp_path / "desktop").mkdir()
    (tmp_path / "node").mkdir()
    report = desktop_check(checkpoint, tmp_path / "desktop")
    found = run_driver("drive_store.py", [str(checkpoint), "check"], tmp_path / "node")

    assert report["verdict"] == "fixable" and report["fix"]["verified"]
    assert [n for n, c in report["components"].items() if c.get("first_bad_module")] == ["unet"]
    assert report["components"]["unet"]["first_bad_module"] == PLANTED_SDXL
    text, fix = found["check"]["text"], found["check"]["fix"]
    assert "Checked: diffusion model fixable." in text and fix["component"] is None
    node_layer = text.split("First bad layer: diffusion_model.")[1].split()[0].rstrip(".")
    assert node_layer == PLANTED_SDXL.replace(*SDXL_BLOCK)
    (island,) = fix["islands"]
    settings = report["fix"]["settings"]
    kept = [
        e.removeprefix("unet:").replace(*SDXL_BLOCK)
        for key in ("fp32_modules", "bf16_modules", "clamp_modules")
        for e in settings.get(key, [])
    ]
    assert kept, settings
    assert all(p == island or p.startswith(island + ".") for p in kept), (kept, island)
