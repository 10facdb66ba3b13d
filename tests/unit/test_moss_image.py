"""MOSS-Image, in ComfyUI's October templates, is in no diffusers release HalfSafe runs
(0.42.1 has no MOSS-Image pipeline or transformer) and no key of its files is published where
HalfSafe could read it: its files are told by their published names and refused in one
sentence saying so, exit 2 in the command; a LoRA or an SD checkpoint of that name is still
what its keys say."""

from __future__ import annotations

import pytest
import torch

from app.cli import main
from app.core.checkpoint import write_safetensors
from app.core.errors import UnsupportedModelError
from app.core.families import detect_architecture
from app.core.models import load_model
from tests.support.cli_output import without_progress

# A transformer in a layout HalfSafe does not read (blocks of a DiT it does not know).
DIT = {
    "blocks.0.attn.qkv.weight": torch.zeros(96, 32, dtype=torch.bfloat16),
    "blocks.0.adaLN_modulation.1.weight": torch.zeros(192, 32, dtype=torch.bfloat16),
    "final_layer.linear.weight": torch.zeros(16, 32, dtype=torch.bfloat16),
}


@pytest.mark.parametrize(
    "name", ["moss_image_int8_convrot.safetensors", "MOSS-Image-bf16.safetensors"]
)
def test_a_moss_image_file_is_named_and_refused_in_one_sentence(tmp_path, name, capsys):
    (tmp_path / "diffusion_models").mkdir()
    path = write_safetensors(tmp_path / "diffusion_models" / name, DIT)

    with pytest.raises(UnsupportedModelError) as caught:
        load_model(str(path))
    text = str(caught.value)
    assert text == (
        f"{path}: this looks like a MOSS-Image model: its name says MOSS-Image, which "
        "diffusers 0.42.1 does not run (it has no MOSS-Image pipeline or transformer), so "
        "HalfSafe can neither load nor check it."
    )
    assert main(["check", str(path), "--device", "cpu"]) == 2
    err = without_progress(capsys.readouterr().err)
    assert [line for line in err.splitlines() if line.startswith("halfsafe: ")] == [
        f"halfsafe: {text}"
    ]


def test_a_lora_or_an_sd_checkpoint_named_so_is_what_its_keys_say():
    lora = {"lora_unet_x.lora_up.weight": (4, 1), "lora_unet_x.lora_down.weight": (1, 4)}
    assert detect_architecture(lora, name="moss_image_style.safetensors").architecture == "lora"
    same = detect_architecture(DIT_SHAPES, name="some_dit.safetensors")
    assert same.architecture != "moss-image"


DIT_SHAPES = {k: tuple(v.shape) for k, v in DIT.items()}
