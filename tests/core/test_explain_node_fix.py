"""`halfsafe explain` of a black image ComfyUI made from a model whose UNet overflows fp16: the
fix comes as HalfSafe Fix between the loader and the sampler, in the image's own workflow
rewritten (written beside the image; in `--json`'s `fix.for_tool.workflow`), with ComfyUI's
whole-UNet flag kept as the fallback. A fix of the VAE alone stays a flag.

The model is a tiny SD1.x pipeline with one UNet feed-forward layer scaled past fp16's range
(the health tests' planted fault), in a fake ComfyUI tree under a fake home folder; the image
carries ComfyUI's API prompt and the UI workflow its frontend saves."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from app.cli import main
from app.core.explain.node_fix import changes_denoiser
from tests.support.comfyui_graphs import comfyui_default_workflow, ui_link_problems
from tests.support.image_files import comfy_prompt, png_text
from tests.support.model_files import save_single_file
from tests.support.planted_sd import plant
from tests.support.tiny_models import build_tiny_sd_pipeline

# On a device with native bf16 the cheapest verified whole-UNet switch is bf16, else fp32.
COMFY_UNET_FLAGS = {"--bf16-unet", "--fp32-unet"}


@pytest.fixture(scope="module")
def overflowing_unet(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("model") / "dreamy-unet.safetensors"
    return save_single_file(plant(build_tiny_sd_pipeline(), "unet_ff"), path)


@pytest.fixture
def black_comfy_png(home, tmp_path, overflowing_unet) -> Path:
    folder = home / "ComfyUI" / "models" / "checkpoints"
    folder.mkdir(parents=True)
    (folder / overflowing_unet.name).write_bytes(overflowing_unet.read_bytes())
    return png_text(
        tmp_path / "ComfyUI_00007_.png",
        {
            "prompt": comfy_prompt(overflowing_unet.name),
            "workflow": json.dumps(comfyui_default_workflow(overflowing_unet.name)),
        },
    )


def test_a_black_comfyui_image_gets_halfsafe_fix_in_its_own_workflow(black_comfy_png, capsys):
    assert main(["explain", str(black_comfy_png), "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["check"]["verdict"] == "fixable"
    for_tool = document["fix"]["for_tool"]
    assert for_tool["tool"] == "comfyui"
    assert len(for_tool["flags"]) == 1 and set(for_tool["flags"]) <= COMFY_UNET_FLAGS
    workflow = for_tool["workflow"]
    assert workflow["nodes"] == ["HalfSafeCheck", "HalfSafeFix"]
    assert (workflow["format"], workflow["source"]) == ("ui", "image")
    assert workflow["loader"] == "CheckpointLoaderSimple (node 4)"
    assert workflow["consumers"] == ["KSampler (node 3)"]
    assert workflow["without_nodes"]["flags"] == for_tool["flags"]
    assert workflow["also_flags"] == []  # the VAE is fine: nothing beside the nodes
    graph = workflow["graph"]
    assert ui_link_problems(graph) == []
    fix = next(n for n in graph["nodes"] if n["type"] == "HalfSafeFix")
    assert [r for r in graph["links"] if r[0] == 1] == [[1, fix["id"], 0, 3, 0, "MODEL"]]
    check = next(n for n in graph["nodes"] if n["type"] == "HalfSafeCheck")
    assert check["widgets_values"] == [64, 64, 12, 42, "fixed"]  # the image's size, steps, seed
    message = document["message"]
    assert "add HalfSafe Fix between the loader and the sampler" in message
    assert for_tool["flags"][0] in message  # the fallback, in the same sentence
    assert "has no switch" not in message and not any("no switch" in n for n in document["notes"])

    written = black_comfy_png.with_name("ComfyUI_00007_-halfsafe-fix.json")
    assert not written.exists()  # --json carries it; only the text answer writes the file
    assert main(["explain", str(black_comfy_png)]) == 1
    out = capsys.readouterr().out
    assert "add HalfSafe Fix between the loader and the sampler" in out.splitlines()[0]
    assert f"workflow: The workflow with HalfSafe Fix: {written}" in out
    assert json.loads(written.read_text()) == graph


def test_only_a_fix_of_the_diffusion_model_is_given_as_the_node():
    unet_layers = SimpleNamespace(settings={"bf16_modules": ["unet:mid_block.attentions.0"]})
    transformer = SimpleNamespace(settings={"fp32_modules": ["transformer:blocks.3.ff"]})
    whole_unet = SimpleNamespace(settings={"unet_precision": "fp32"})
    vae = SimpleNamespace(settings={"vae_precision": "bf16"})
    vae_layers = SimpleNamespace(settings={"fp32_modules": ["vae:decoder.conv_out"]})
    assert changes_denoiser(unet_layers) and changes_denoiser(transformer)
    assert changes_denoiser(whole_unet)
    assert not changes_denoiser(vae) and not changes_denoiser(vae_layers)
