"""ComfyUI graphs as ComfyUI writes them, and checks that a graph still loads: its default
SD1 graph (a checkpoint loader into a KSampler) as the API prompt its source ships
(script_examples/basic_api_example.py, read from the vendored archive) and as the UI workflow
its frontend saves (schema 0.4: nodes with typed inputs and outputs, a links table of
[id, origin, origin slot, target, target slot, type]); HalfSafe's node package loaded as
ComfyUI loads a custom node, for its nodes' real inputs and outputs."""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
import tarfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
ARCHIVE = ROOT.parent / "shared" / "vendor" / "comfyui-0.29.0-4f874c5.tar.gz"
EXAMPLE = "ComfyUI/script_examples/basic_api_example.py"
PACKAGE = ROOT / "comfyui-halfsafe"


def comfyui_api_prompt() -> str | None:
    """The default workflow's API prompt as ComfyUI's own example holds it (its
    `prompt_text`), or None where the archive is not here."""
    if not ARCHIVE.is_file():
        return None
    with tarfile.open(ARCHIVE) as archive:
        member = archive.extractfile(EXAMPLE)
        assert member is not None
        source = member.read().decode("utf-8")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "prompt_text":
            return ast.literal_eval(node.value)
    raise AssertionError(f"{EXAMPLE} holds no prompt_text")


def _node(node_id, kind, pos, size, inputs, outputs, widgets, order) -> dict[str, Any]:
    return {
        "id": node_id,
        "type": kind,
        "pos": pos,
        "size": size,
        "flags": {},
        "order": order,
        "mode": 0,
        "inputs": [{"name": n, "type": t, "link": link} for n, t, link in inputs],
        "outputs": [
            {"name": n, "type": t, "links": links, "slot_index": slot}
            for slot, (n, t, links) in enumerate(outputs)
        ],
        "properties": {"Node name for S&R": kind},
        "widgets_values": widgets,
    }


def comfyui_default_workflow(ckpt_name: str = "v1-5-pruned-emaonly.safetensors") -> dict:
    """ComfyUI's default graph as its frontend saves it (the `workflow` chunk of its PNGs)."""
    nodes = [
        _node(
            4,
            "CheckpointLoaderSimple",
            [26, 474],
            [315, 98],
            [],
            [("MODEL", "MODEL", [1]), ("CLIP", "CLIP", [3, 5]), ("VAE", "VAE", [8])],
            [ckpt_name],
            0,
        ),
        _node(
            3,
            "KSampler",
            [863, 186],
            [315, 262],
            [
                ("model", "MODEL", 1),
                ("positive", "CONDITIONING", 4),
                ("negative", "CONDITIONING", 6),
                ("latent_image", "LATENT", 2),
            ],
            [("LATENT", "LATENT", [7])],
            [156680208700286, "randomize", 20, 8, "euler", "normal", 1],
            4,
        ),
        _node(
            5,
            "EmptyLatentImage",
            [473, 609],
            [315, 106],
            [],
            [("LATENT", "LATENT", [2])],
            [512, 512, 1],
            1,
        ),
        _node(
            6,
            "CLIPTextEncode",
            [415, 186],
            [422, 164],
            [("clip", "CLIP", 3)],
            [("CONDITIONING", "CONDITIONING", [4])],
            ["beautiful scenery nature glass bottle landscape, purple galaxy bottle"],
            2,
        ),
        _node(
            7,
            "CLIPTextEncode",
            [413, 389],
            [425, 180],
            [("clip", "CLIP", 5)],
            [("CONDITIONING", "CONDITIONING", [6])],
            ["text, watermark"],
            3,
        ),
        _node(
            8,
            "VAEDecode",
            [1209, 188],
            [210, 46],
            [("samples", "LATENT", 7), ("vae", "VAE", 8)],
            [("IMAGE", "IMAGE", [9])],
            [],
            5,
        ),
        _node(9, "SaveImage", [1451, 189], [210, 58], [("images", "IMAGE", 9)], [], ["ComfyUI"], 6),
    ]
    links = [
        [1, 4, 0, 3, 0, "MODEL"],
        [2, 5, 0, 3, 3, "LATENT"],
        [3, 4, 1, 6, 0, "CLIP"],
        [4, 6, 0, 3, 1, "CONDITIONING"],
        [5, 4, 1, 7, 0, "CLIP"],
        [6, 7, 0, 3, 2, "CONDITIONING"],
        [7, 3, 0, 8, 0, "LATENT"],
        [8, 4, 2, 8, 1, "VAE"],
        [9, 8, 0, 9, 0, "IMAGE"],
    ]
    return {
        "last_node_id": 9,
        "last_link_id": 9,
        "nodes": nodes,
        "links": links,
        "groups": [],
        "config": {},
        "extra": {"ds": {"scale": 1, "offset": [0, 0]}},
        "version": 0.4,
    }


def ui_link_problems(graph: dict) -> list[str]:
    """What would not load in a UI workflow: a link whose ends do not list it (the origin's
    output `links`, the target's input `link`), a type that differs between a link and its
    ends, an output or input naming a link that is not in the table, duplicate ids, or last
    ids below those used."""
    problems = []
    nodes = {n["id"]: n for n in graph["nodes"]}
    if len(nodes) != len(graph["nodes"]):
        problems.append("duplicate node ids")
    rows = {row[0]: row for row in graph["links"]}
    if len(rows) != len(graph["links"]):
        problems.append("duplicate link ids")
    for link_id, origin, origin_slot, target, target_slot, kind in rows.values():
        out = nodes[origin]["outputs"][origin_slot]
        into = nodes[target]["inputs"][target_slot]
        if link_id not in (out["links"] or []) or into["link"] != link_id:
            problems.append(f"link {link_id} is not listed by its ends")
        if not out["type"] == into["type"] == kind:
            problems.append(f"link {link_id} joins {out['type']} to {into['type']} as {kind}")
    for node in nodes.values():
        for slot, out in enumerate(node.get("outputs") or []):
            for link_id in out["links"] or []:
                if link_id not in rows or rows[link_id][1:3] != [node["id"], slot]:
                    problems.append(f"node {node['id']} output {slot} lists link {link_id}")
        for slot, into in enumerate(node.get("inputs") or []):
            if into["link"] is not None and (
                into["link"] not in rows or rows[into["link"]][3:5] != [node["id"], slot]
            ):
                problems.append(f"node {node['id']} input {slot} names link {into['link']}")
    if graph["last_node_id"] < max(nodes) or graph["last_link_id"] < max(rows):
        problems.append("last ids below those used")
    return problems


def halfsafe_nodes() -> dict[str, Any]:
    """HalfSafe's node classes (NODE_CLASS_MAPPINGS), loaded from the package folder as ComfyUI
    loads a custom node (a package of the folder's name); no ComfyUI needed to read them."""
    name = "halfsafe_nodes_under_test"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, PACKAGE / "__init__.py", submodule_search_locations=[str(PACKAGE)]
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name].NODE_CLASS_MAPPINGS


def widget_names(node_class) -> list[str]:
    """A node's widget inputs in the order the frontend lays them out (its required inputs,
    then its optional ones, that are not links: INT, FLOAT, STRING, BOOLEAN or a list)."""
    declared = node_class.INPUT_TYPES()
    names = []
    for group in ("required", "optional"):
        for key, spec in declared.get(group, {}).items():
            kind = spec[0]
            if isinstance(kind, list) or kind in ("INT", "FLOAT", "STRING", "BOOLEAN"):
                names.append(key)
    return names


_SEED = re.compile(r"^(noise_)?seed$")


def ui_widget_values(node_class, values: dict[str, Any]) -> list[Any]:
    """The widgets_values the frontend saves for `values` by widget name: a seed widget is
    followed by its "control after generate" value."""
    saved = []
    for name in widget_names(node_class):
        saved.append(values[name])
        if _SEED.match(name):
            saved.append("fixed")
    return saved
