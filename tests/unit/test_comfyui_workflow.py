"""HalfSafe Fix placed in a ComfyUI graph (`comfyui.workflow`): ComfyUI's own default SD1 graph,
a checkpoint loader into a KSampler, as the API prompt its source ships and as the UI workflow
its frontend saves. The Fix node sits between the loader's MODEL and the sampler, HalfSafe
Check feeds it the fix, every other node and link is kept, and the nodes' inputs and outputs
are those HalfSafe's node package declares."""

from __future__ import annotations

import copy
import json

import pytest

from app.core.comfyui.workflow import CheckInputs, with_fix_node
from tests.support.comfyui_graphs import (
    comfyui_api_prompt,
    comfyui_default_workflow,
    halfsafe_nodes,
    ui_link_problems,
    ui_widget_values,
)

CHECK = CheckInputs(width=512, height=768, steps=20, seed=8566257)


@pytest.fixture(scope="module")
def api_prompt() -> dict:
    text = comfyui_api_prompt()
    if text is None:
        pytest.skip("ComfyUI's source archive is not in ../shared/vendor")
    return json.loads(text)


def test_the_api_prompt_gets_the_fix_between_its_checkpoint_loader_and_ksampler(api_prompt):
    before = copy.deepcopy(api_prompt)
    placed = with_fix_node(api_prompt, None, CHECK, ["v1-5-pruned-emaonly.safetensors"])

    assert api_prompt == before  # the image's graph is not touched
    graph = json.loads(json.dumps(placed.graph))  # what is written is what loads
    assert (placed.format, placed.source) == ("api", "image")
    added = {k: v for k, v in graph.items() if k not in before}
    fix_id = next(k for k, v in added.items() if v["class_type"] == "HalfSafeFix")
    check_id = next(k for k, v in added.items() if v["class_type"] == "HalfSafeCheck")
    assert len(added) == 2
    # The sampler takes its model from HalfSafe Fix, which takes the loader's MODEL and the
    # check's fix; the check is fed the same MODEL at the image's size, steps and seed.
    assert graph["3"]["inputs"]["model"] == [fix_id, 0]
    assert graph[fix_id]["inputs"] == {"model": ["4", 0], "fix": [check_id, 2]}
    assert graph[check_id]["inputs"] == {
        "model": ["4", 0],
        "width": 512,
        "height": 768,
        "steps": 20,
        "seed": 8566257,
    }
    # Every other node and link as it was: only the sampler's model input changed.
    for node_id, node in before.items():
        expected = copy.deepcopy(node)
        if node_id == "3":
            expected["inputs"]["model"] = [fix_id, 0]
        assert graph[node_id] == expected
    assert placed.loader == "CheckpointLoaderSimple (node 4)"
    assert placed.consumers == ["KSampler (node 3)"]


def test_the_api_prompts_new_nodes_are_what_the_node_package_declares(api_prompt):
    nodes = halfsafe_nodes()
    graph = with_fix_node(api_prompt, None, CHECK).graph
    returns = {"CheckpointLoaderSimple": ("MODEL", "CLIP", "VAE")}
    for node in graph.values():
        declared = nodes.get(node["class_type"])
        if declared is None:
            continue
        inputs = declared.INPUT_TYPES()
        assert set(inputs["required"]) <= set(node["inputs"])
        assert set(node["inputs"]) <= set(inputs["required"]) | set(inputs.get("optional", {}))
        for name, value in node["inputs"].items():
            if isinstance(value, list):  # a link: the origin's output type is the input's
                origin = graph[value[0]]["class_type"]
                made = nodes[origin].RETURN_TYPES if origin in nodes else returns[origin]
                wanted = (inputs["required"] | inputs.get("optional", {}))[name][0]
                assert made[value[1]] == wanted


def test_the_ui_workflow_gets_the_fix_with_every_link_intact():
    workflow = comfyui_default_workflow()
    before = copy.deepcopy(workflow)
    placed = with_fix_node(None, workflow, CHECK, ["v1-5-pruned-emaonly.safetensors"])

    assert workflow == before
    graph = json.loads(json.dumps(placed.graph))
    assert (placed.format, placed.source) == ("ui", "image")
    assert ui_link_problems(graph) == []
    nodes = {n["id"]: n for n in graph["nodes"]}
    fix = next(n for n in graph["nodes"] if n["type"] == "HalfSafeFix")
    check = next(n for n in graph["nodes"] if n["type"] == "HalfSafeCheck")
    assert len(nodes) == len(before["nodes"]) + 2
    rows = {row[0]: row for row in graph["links"]}
    # The sampler's model link (1) now comes from HalfSafe Fix; the loader feeds Fix and Check.
    assert rows[1] == [1, fix["id"], 0, 3, 0, "MODEL"]
    loader_links = nodes[4]["outputs"][0]["links"]
    assert sorted(rows[i][3] for i in loader_links) == sorted([fix["id"], check["id"]])
    fix_input = rows[fix["inputs"][1]["link"]]
    assert fix_input[1:5] == [check["id"], 2, fix["id"], 1]
    # Every other link as it was, ids and ends.
    for row in before["links"]:
        if row[0] != 1:
            assert rows[row[0]] == row
    for node in before["nodes"]:
        if node["id"] != 4:
            assert nodes[node["id"]] == node
    # The widgets in the order the node package declares them (a seed with its control).
    declared = halfsafe_nodes()
    assert check["widgets_values"] == ui_widget_values(
        declared["HalfSafeCheck"], {"width": 512, "height": 768, "steps": 20, "seed": 8566257}
    )
    assert fix["widgets_values"] == ui_widget_values(declared["HalfSafeFix"], {})
    for node in (fix, check):
        kind = declared[node["type"]]
        assert [o["type"] for o in node["outputs"]] == list(kind.RETURN_TYPES)
        linked = [i["name"] for i in node["inputs"]]
        spec = kind.INPUT_TYPES()
        links = [
            k
            for k, v in (spec["required"] | spec.get("optional", {})).items()
            if v[0] not in ("INT", "FLOAT", "STRING", "BOOLEAN")
        ]
        assert linked == links
    assert graph["last_node_id"] == max(nodes) and graph["last_link_id"] == max(rows)


def test_the_newer_schemas_link_objects_are_rewritten_alike():
    workflow = comfyui_default_workflow()
    keys = ("id", "origin_id", "origin_slot", "target_id", "target_slot", "type")
    workflow["links"] = [dict(zip(keys, row, strict=True)) for row in workflow["links"]]
    graph = with_fix_node(None, workflow, CHECK).graph
    as_rows = {**graph, "links": [[link[k] for k in keys] for link in graph["links"]]}
    assert all(isinstance(link, dict) for link in graph["links"])
    assert ui_link_problems(as_rows) == []


def test_the_loader_that_names_the_images_model_is_the_one_fixed(api_prompt):
    prompt = copy.deepcopy(api_prompt)
    # A second checkpoint (a refiner) feeding a second sampler, listed first.
    prompt = {
        "20": {
            "class_type": "CheckpointLoaderSimple",
            "inputs": {"ckpt_name": "refiner.safetensors"},
        },
        "21": {"class_type": "KSampler", "inputs": {**prompt["3"]["inputs"], "model": ["20", 0]}},
        **prompt,
    }
    graph = with_fix_node(prompt, None, CHECK, ["SD15\\v1-5-pruned-emaonly.safetensors"]).graph
    fix_id = next(k for k, v in graph.items() if v["class_type"] == "HalfSafeFix")
    assert graph[fix_id]["inputs"]["model"] == ["4", 0]
    assert graph["21"]["inputs"]["model"] == ["20", 0]  # the refiner's sampler as it was


def test_a_muted_loader_or_a_graph_without_one_falls_back():
    workflow = comfyui_default_workflow()
    workflow["nodes"][0]["mode"] = 2  # the loader muted: nothing ran through it
    placed = with_fix_node(None, workflow, CHECK, ["mine.safetensors"])
    assert (placed.format, placed.source) == ("api", "template")
    graph = placed.graph
    assert graph["4"]["inputs"]["ckpt_name"] == "mine.safetensors"
    fix_id = next(k for k, v in graph.items() if v["class_type"] == "HalfSafeFix")
    assert graph["3"]["inputs"]["model"] == [fix_id, 0]
    assert graph["5"]["inputs"]["width"] == 512 and graph["5"]["inputs"]["height"] == 768
    # Nonsense where a graph should be is no graph.
    assert with_fix_node(["x"], {"nodes": 3}, CHECK).source == "template"


def test_the_checks_widgets_are_bounded_as_the_node_takes_them():
    placed = with_fix_node(None, None, CheckInputs(width=9, height=99999, steps=0, seed=-5))
    check = next(v for v in placed.graph.values() if v["class_type"] == "HalfSafeCheck")
    assert check["inputs"] | {"model": None} == {
        "model": None,
        "width": 64,
        "height": 8192,
        "steps": 1,
        "seed": 0,
    }


def test_a_loader_feeding_thousands_of_nodes_is_named_within_bounds(api_prompt):
    prompt = copy.deepcopy(api_prompt)
    sampler = prompt["3"]
    for number in range(100, 5100):
        prompt[str(number)] = copy.deepcopy(sampler)
    placed = with_fix_node(prompt, None, CHECK)
    fix_id = next(k for k, v in placed.graph.items() if v["class_type"] == "HalfSafeFix")
    fed = [k for k, v in placed.graph.items() if v["inputs"].get("model") == [fix_id, 0]]
    assert len(fed) == 5001
    assert "and 4,997 more" in placed.how and len(placed.how) < 1000
