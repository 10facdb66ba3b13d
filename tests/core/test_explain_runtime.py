"""What in the tool, not the model, made an image black (`app.core.explain.runtime`): a step
cache its record shows ran (ComfyUI's cache nodes, an extension's infotext key), checked
without it before a precision fix is believed and named first when the check runs clean; and
the tool's memory manager (ComfyUI's DynamicVRAM, Forge's swap settings) with its switch, or
a fresh start of the tool as the test where HalfSafe knows no switch.

The models are tiny SD1.x pipelines saved as single files in a fake ComfyUI tree: a healthy
one (the check runs clean: the image was not the model's doing) and one whose VAE overflows
fp16 (the check reproduces it: the cache did not make it).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from app.cli import main
from app.core import explain
from app.core.explain import runtime
from tests.support.image_files import (
    a1111_parameters,
    comfy_prompt,
    comfy_workflow,
    forge_parameters,
    png_text,
)
from tests.support.model_files import save_single_file
from tests.support.planted_sd import plant
from tests.support.tiny_models import build_tiny_sd_pipeline


def with_node(prompt: str, key: str, class_type: str, **inputs) -> str:
    nodes = json.loads(prompt)
    nodes[key] = {"class_type": class_type, "inputs": {"model": ["4", 0], **inputs}}
    nodes["3"]["inputs"]["model"] = [key, 0]
    return json.dumps(nodes)


def cached_prompt(ckpt_name: str, node: str = "EasyCache", **inputs) -> str:
    return with_node(comfy_prompt(ckpt_name), "9", node, reuse_threshold=0.2, **inputs)


def comfy_png(tmp_path: Path, prompt: str, workflow: str | None = None) -> Path:
    texts = {"prompt": prompt}
    if workflow is not None:
        texts["workflow"] = workflow
    return png_text(tmp_path / "ComfyUI_00001_.png", texts)


# Reading the record -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "node", ["EasyCache", "LazyCache", "ApplyFBCacheOnModel", "TeaCache", "MagCache"]
)
def test_a_comfyui_step_cache_node_is_read_from_the_prompt(tmp_path, node):
    record, _, _ = explain.read_image(comfy_png(tmp_path, cached_prompt("sd.safetensors", node)))
    assert [c.node for c in record.caches] == [node]
    assert record.to_json()["step_caches"] == [{"node": node}]


def test_a_cache_node_switched_off_did_not_cache(tmp_path):
    prompt = cached_prompt("sd.safetensors", "TeaCache", enable=False)
    record, _, _ = explain.read_image(comfy_png(tmp_path, prompt))
    assert record.caches == []


@pytest.mark.parametrize(("mode", "counted"), [(0, True), (2, False), (4, False)])
def test_a_workflow_cache_node_counts_unless_muted_or_bypassed(mode, counted):
    workflow = json.loads(comfy_workflow("sd.safetensors"))
    workflow["nodes"].append({"id": 9, "type": "MagCache", "mode": mode, "widgets_values": []})
    found = runtime.from_comfy_workflow(workflow, 100)
    assert bool(found) is counted


def test_an_extension_cache_in_infotext_is_read():
    text = a1111_parameters("m", "0123456789") + ", TeaCache: 0.25, First Block Cache: on"
    record = explain.records._infotext_record(text)
    assert [c.node for c in record.caches] == ["TeaCache", "First Block Cache"]


def test_comfyui_version_is_read_from_the_workflows_core_nodes(tmp_path):
    workflow = json.loads(comfy_workflow("sd.safetensors"))
    for node, version in zip(workflow["nodes"], ["0.3.9", "0.3.40"], strict=True):
        node["properties"] = {"cnr_id": "comfy-core", "ver": version}
    workflow["nodes"].append({"id": 9, "type": "X", "properties": {"cnr_id": "pack", "ver": "9"}})
    image = comfy_png(tmp_path, comfy_prompt("sd.safetensors"), json.dumps(workflow))
    record, _, _ = explain.read_image(image)
    assert record.version == "0.3.40"  # the newest core node; a pack's version is not ComfyUI's


def test_a_hostile_version_is_not_read():
    workflow = {"nodes": [{"properties": {"cnr_id": "comfy-core", "ver": "1." + "9" * 60}}]}
    assert runtime.comfy_version(workflow, 100) is None
    assert runtime.comfy_version({"nodes": "x"}, 100) is None


# Without the model: next steps ----------------------------------------------------------------


def test_a_black_comfyui_image_with_a_cache_rules_the_cache_out_first(tmp_path, home, capsys):
    image = comfy_png(tmp_path, cached_prompt("missing.safetensors"))
    assert main(["explain", str(image), "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert "step_cache" in document["next_steps"]["rule_out"]
    message = document["message"]
    assert "First rule out the step cache (EasyCache)" in message
    # The memory manager and its switch, as what to rule out when the model was reused.
    assert "DynamicVRAM" in message and "--disable-dynamic-vram" in message
    assert document["memory_manager"]["tool"] == "comfyui"
    assert any("step cache (EasyCache)" in note for note in document["notes"])


@pytest.mark.parametrize(
    ("version", "switch"),
    [
        ("0.3.40", "--disable-smart-memory"),
        ("0.16.2", "--disable-dynamic-vram"),
        (None, "--disable-dynamic-vram"),
    ],
)
def test_a_comfyui_workflow_older_than_dynamic_vram_names_smart_memory(
    tmp_path, home, capsys, version, switch
):
    """A workflow whose core nodes come from before DynamicVRAM was ComfyUI's default names
    the memory manager of its time, whose switch covers both."""
    workflow = json.loads(comfy_workflow("missing.safetensors"))
    if version is not None:
        for node in workflow["nodes"]:
            node["properties"] = {"cnr_id": "comfy-core", "ver": version}
    image = comfy_png(tmp_path, comfy_prompt("missing.safetensors"), json.dumps(workflow))
    assert main(["explain", str(image), "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert switch in document["message"]
    assert document["memory_manager"]["switch"] == f"start ComfyUI with {switch}"
    assert ("DynamicVRAM (on by default" in document["message"]) == (
        switch != "--disable-smart-memory"
    )


def test_a_forge_image_names_forges_swap_settings(tmp_path, home, capsys):
    image = png_text(tmp_path / "f.png", {"parameters": forge_parameters()})
    assert main(["explain", str(image), "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert "Swap Method to Queue" in document["message"]
    assert document["memory_manager"]["name"] == "GPU Weights and Swap Method"


def test_an_a1111_image_says_a_fresh_start_is_the_test(tmp_path, home, capsys):
    image = png_text(tmp_path / "a.png", {"parameters": a1111_parameters("m", "0123456789")})
    assert main(["explain", str(image), "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert "a fresh start of AUTOMATIC1111" in document["message"]
    assert document["memory_manager"] is None


# With the model: the check runs without the cache --------------------------------------------


@pytest.fixture(scope="module")
def healthy_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("model") / "calm.safetensors"
    return save_single_file(build_tiny_sd_pipeline(), path)


@pytest.fixture(scope="module")
def overflowing_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("model") / "dreamy.safetensors"
    return save_single_file(plant(build_tiny_sd_pipeline(), "vae"), path)


def in_comfy(home: Path, model: Path) -> Path:
    folder = home / "ComfyUI" / "models" / "checkpoints"
    folder.mkdir(parents=True)
    return Path(shutil.copy(model, folder / model.name))


@pytest.mark.slow
def test_a_clean_check_names_the_cache_first_then_dynamic_vram(
    tmp_path, home, capsys, healthy_file
):
    model = in_comfy(home, healthy_file)
    image = comfy_png(tmp_path, cached_prompt(model.name))
    assert main(["explain", str(image), "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["check"]["verdict"] == "healthy"
    assert document["fix"] is None
    message = document["message"]
    assert "did not overflow" in message
    cache = message.index("the cache is the first suspect")
    assert "bypass EasyCache" in message
    assert message.index("DynamicVRAM") > cache
    assert document["memory_manager"]["switch"] == "start ComfyUI with --disable-dynamic-vram"


@pytest.mark.slow
def test_an_overflow_the_check_reproduces_is_the_models_not_the_caches(
    tmp_path, home, capsys, overflowing_file
):
    model = in_comfy(home, overflowing_file)
    image = comfy_png(tmp_path, cached_prompt(model.name, "ApplyFBCacheOnModel"))
    assert main(["explain", str(image), "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["check"]["verdict"] == "fixable"
    assert "The health check reproduced it" in document["message"]
    assert "first suspect" not in document["message"]
    assert any("is the model's, not the cache's" in n for n in document["notes"])
    assert document["memory_manager"] is None  # nothing points at the tool's memory


def test_the_runtime_fields_are_documented():
    docs = (Path(__file__).resolve().parents[2] / "docs" / "json.md").read_text(encoding="utf-8")
    for word in ("record.step_caches", "memory_manager", "`step_cache`"):
        assert word in docs
