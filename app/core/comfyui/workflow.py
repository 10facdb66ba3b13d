"""A ComfyUI graph with HalfSafe's fix in it: HalfSafe Fix placed between the model loader's
MODEL output and every node that took it, and HalfSafe Check, fed the same MODEL, handing
HalfSafe Fix the fix it proves as that ComfyUI runs the model. Every other node and link is
kept as it was.

Both of ComfyUI's forms are rewritten: the UI workflow an image carries in its `workflow` chunk
(nodes with positions, and a `links` table of [id, origin, origin slot, target, target slot,
type] rows, or objects of those keys in the newer schema), and the API prompt of its `prompt`
chunk (node id -> class_type and inputs, a link being [node id, output slot]). Where an image
carries neither with a model loader, a minimal workflow (ComfyUI's default graph) is rewritten
instead. The frontend loads either form dropped on its canvas. Plain JSON; no torch.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.core.words.nodes import CHECK_NODE, FIX_NODE, NODE_TITLES, NODE_WORDS

# A UI workflow node's mode: 2 muted, 4 bypassed; neither runs.
_SKIPPED_MODES = (2, 4)
# ComfyUI's loaders whose MODEL is their first output (its nodes.py; ComfyUI-GGUF's). A graph
# with another source of a MODEL is read by its links: a node with no MODEL input whose output
# feeds an input named "model" (API prompt) or typed MODEL (UI workflow).
MODEL_LOADERS = (
    "CheckpointLoaderSimple",
    "CheckpointLoader",
    "UNETLoader",
    "ImageOnlyCheckpointLoader",
    "unCLIPCheckpointLoader",
    "DiffusersLoader",
    "UnetLoaderGGUF",
    "UnetLoaderGGUFAdvanced",
)
CHECK_FIX_OUTPUT = 2  # HalfSafe Check's outputs: report, report_image, fix
# HalfSafe Check's widgets' bounds (comfyui-halfsafe/nodes.py): a size in 8 px steps.
_SIZE = (64, 8192)
_STEPS = (1, 1000)
_SEED_MAX = 0xFFFFFFFFFFFFFFFF
# The room left below the loader for each new node in a UI workflow, in canvas units.
_ROW = 130
# Consumers named in the sentence (a graph may feed one loader to thousands of nodes), and the
# characters of a node's class and id a name keeps.
NAMED = 4
_NAME_CHARS = 200

# ComfyUI's default graph as an API prompt (its script_examples/basic_api_example.py): the
# template for an image that carries no graph to rewrite.
_TEMPLATE_PROMPT = {
    "3": {
        "class_type": "KSampler",
        "inputs": {
            "seed": 0,
            "steps": 20,
            "cfg": 8,
            "sampler_name": "euler",
            "scheduler": "normal",
            "denoise": 1,
            "model": ["4", 0],
            "positive": ["6", 0],
            "negative": ["7", 0],
            "latent_image": ["5", 0],
        },
    },
    "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "model.safetensors"}},
    "5": {
        "class_type": "EmptyLatentImage",
        "inputs": {"width": 512, "height": 512, "batch_size": 1},
    },
    "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["4", 1]}},
    "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["4", 1]}},
    "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
    "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "ComfyUI", "images": ["8", 0]}},
}


@dataclass(frozen=True)
class CheckInputs:
    """What HalfSafe Check runs at: the image's size, step count and seed (bounded to the
    node's widgets)."""

    width: int = 512
    height: int = 512
    steps: int = 20
    seed: int = 0

    def bounded(self) -> CheckInputs:
        def side(value: int) -> int:
            value = min(max(int(value), _SIZE[0]), _SIZE[1])
            return value - value % 8

        return CheckInputs(
            side(self.width),
            side(self.height),
            min(max(int(self.steps), _STEPS[0]), _STEPS[1]),
            min(max(int(self.seed), 0), _SEED_MAX),
        )


@dataclass
class NodeWorkflow:
    """A graph with HalfSafe Check and HalfSafe Fix placed in it."""

    graph: dict[str, Any]
    format: str  # "ui" (the frontend's workflow) or "api" (a prompt)
    source: str  # "image" (its own graph, rewritten) or "template"
    loader: str  # the node whose MODEL HalfSafe Fix takes, in words
    consumers: list[str] = field(default_factory=list)  # the nodes it feeds now, in words

    @property
    def how(self) -> str:
        named = ", ".join(self.consumers[:NAMED])
        if len(self.consumers) > NAMED:
            named += f" and {len(self.consumers) - NAMED:,} more"
        placed = NODE_WORDS["placed"].format(loader=self.loader, consumers=named)
        whose = NODE_WORDS["from_image" if self.source == "image" else "from_template"]
        return f"{placed} {whose} {NODE_WORDS['drop']}"

    def to_json(self) -> dict[str, Any]:
        return {
            "nodes": [CHECK_NODE, FIX_NODE],
            "format": self.format,
            "source": self.source,
            "loader": self.loader,
            "consumers": list(self.consumers),
            "how": self.how,
            "graph": self.graph,
        }


def with_fix_node(
    prompt: Any, workflow: Any, check: CheckInputs, model_names: Sequence[str] = ()
) -> NodeWorkflow:
    """The image's graph with HalfSafe Fix between its model loader and that loader's
    consumers: its UI workflow where it has one with a loader, else its API prompt, else
    ComfyUI's default graph (its loader named after `model_names[0]` where given). Where the
    graph has several loaders, the one that names a file of `model_names` is taken, else the
    first of ComfyUI's own loaders, else the first node that feeds a MODEL. The inputs are
    never changed."""
    names = [_base(n) for n in model_names if n]
    check = check.bounded()
    if isinstance(workflow, dict):
        placed = _rewrite_ui(workflow, check, names)
        if placed is not None:
            return placed
    if isinstance(prompt, dict):
        placed = _rewrite_api(prompt, check, names, "image")
        if placed is not None:
            return placed
    template = copy.deepcopy(_TEMPLATE_PROMPT)
    if model_names:
        template["4"]["inputs"]["ckpt_name"] = str(model_names[0])
    template["5"]["inputs"].update(width=check.width, height=check.height)
    template["3"]["inputs"].update(steps=check.steps, seed=check.seed)
    placed = _rewrite_api(template, check, names, "template")
    assert placed is not None  # the template has its loader
    return placed


def _base(name: str) -> str:
    """A file name as a tool wrote it (ComfyUI on Windows: "SD1.5\\model.safetensors"), its
    last part alone, for comparing."""
    return str(name).replace("\\", "/").rsplit("/", 1)[-1].lower()


def _names_file(values: Any, names: list[str]) -> bool:
    """Whether a node's widget values (a list) or inputs (a dict) name one of `names`."""
    items = list(values.values()) if isinstance(values, dict) else values
    return isinstance(items, list) and any(isinstance(v, str) and _base(v) in names for v in items)


def _pick(candidates: list[tuple[Any, int, str, Any]], names: list[str]):
    """The loader to place the fix after: (id, slot, class, its values) of the one naming
    the image's model file, else the first of ComfyUI's loaders, else the first."""
    for wanted in (
        lambda c: _names_file(c[3], names),
        lambda c: c[2] in MODEL_LOADERS,
        lambda c: True,
    ):
        for candidate in candidates:
            if wanted(candidate):
                return candidate
    return None


def _words(kind: str, node_id: Any) -> str:
    return f"{kind[:_NAME_CHARS]} (node {str(node_id)[:_NAME_CHARS]})"


# The API prompt --------------------------------------------------------------------------------


def _is_link(value: Any) -> bool:
    return (
        isinstance(value, list)
        and len(value) == 2
        and isinstance(value[0], (str, int))
        and isinstance(value[1], int)
    )


def _api_nodes(prompt: dict) -> Iterator[tuple[str, dict[str, Any]]]:
    for node_id, node in prompt.items():
        if isinstance(node, dict) and isinstance(node.get("inputs"), dict):
            yield str(node_id), node


def _rewrite_api(
    prompt: dict, check: CheckInputs, names: list[str], source: str
) -> NodeWorkflow | None:
    nodes = dict(_api_nodes(prompt))
    fed_model = set()  # (node id, slot) linked into an input named "model"
    takes_model = set()  # nodes with a linked "model" input
    for node_id, node in nodes.items():
        value = node["inputs"].get("model")
        if _is_link(value):
            fed_model.add((str(value[0]), value[1]))
            takes_model.add(node_id)
    candidates = []
    for node_id, node in nodes.items():
        kind = str(node.get("class_type", ""))
        slots = sorted(s for n, s in fed_model if n == node_id)
        if slots and node_id not in takes_model and kind not in NODE_TITLES:
            candidates.append((node_id, slots[0], kind, node["inputs"]))
    chosen = _pick(candidates, names)
    if chosen is None:
        return None
    loader, slot, kind, _ = chosen
    graph = copy.deepcopy(prompt)
    numbers = [int(k) for k in graph if str(k).isdigit()]
    check_id, fix_id = (str(max(numbers, default=0) + i) for i in (1, 2))
    consumers = []
    for node_id, node in _api_nodes(graph):
        for key, value in node["inputs"].items():
            if _is_link(value) and str(value[0]) == loader and value[1] == slot:
                node["inputs"][key] = [fix_id, 0]
                consumers.append(_words(str(node.get("class_type", "")), node_id))
    graph[check_id] = {
        "class_type": CHECK_NODE,
        "inputs": {
            "model": [loader, slot],
            "width": check.width,
            "height": check.height,
            "steps": check.steps,
            "seed": check.seed,
        },
        "_meta": {"title": NODE_TITLES[CHECK_NODE]},
    }
    graph[fix_id] = {
        "class_type": FIX_NODE,
        "inputs": {"model": [loader, slot], "fix": [check_id, CHECK_FIX_OUTPUT]},
        "_meta": {"title": NODE_TITLES[FIX_NODE]},
    }
    return NodeWorkflow(graph, "api", source, _words(kind, loader), list(dict.fromkeys(consumers)))


# The UI workflow -------------------------------------------------------------------------------


def _link_row(link: Any) -> tuple[Any, Any, Any, Any] | None:
    """(id, origin id, origin slot, target id) of a link row, either schema's."""
    if isinstance(link, list) and len(link) >= 5:
        return link[0], link[1], link[2], link[3]
    if isinstance(link, dict):
        return link.get("id"), link.get("origin_id"), link.get("origin_slot"), link.get("target_id")
    return None


def _model_sources(nodes: list[Any]) -> list[tuple[Any, int, str, Any]]:
    """Nodes that run, take no MODEL and give one that is linked: (id, slot, type, widgets)."""
    found = []
    for node in nodes:
        if not isinstance(node, dict) or node.get("mode") in _SKIPPED_MODES:
            continue
        inputs = [i for i in node.get("inputs") or [] if isinstance(i, dict)]
        if any(i.get("type") == "MODEL" and i.get("link") is not None for i in inputs):
            continue
        kind = str(node.get("type", ""))
        if kind in NODE_TITLES:
            continue
        for slot, output in enumerate(node.get("outputs") or []):
            if isinstance(output, dict) and output.get("type") == "MODEL" and output.get("links"):
                found.append((node.get("id"), slot, kind, node.get("widgets_values")))
                break
    return found


def _xy(value: Any, default: tuple[float, float]) -> tuple[float, float]:
    if isinstance(value, dict):
        value = [value.get("0"), value.get("1")]
    if (
        isinstance(value, list)
        and len(value) >= 2
        and all(isinstance(v, (int, float)) for v in value[:2])
    ):
        return float(value[0]), float(value[1])
    return default


def _rewrite_ui(workflow: dict, check: CheckInputs, names: list[str]) -> NodeWorkflow | None:
    nodes, links = workflow.get("nodes"), workflow.get("links")
    if not isinstance(nodes, list) or not isinstance(links, list):
        return None
    chosen = _pick(_model_sources(nodes), names)
    if chosen is None:
        return None
    loader_id, slot, kind, _ = chosen
    graph = copy.deepcopy(workflow)
    nodes, links = graph["nodes"], graph["links"]
    by_id = {n.get("id"): n for n in nodes if isinstance(n, dict)}
    loader = by_id[loader_id]
    state: dict[str, Any] = graph["state"] if isinstance(graph.get("state"), dict) else {}
    node_ids = [i for i in by_id if isinstance(i, int)]
    node_ids += [
        v for v in (graph.get("last_node_id"), state.get("lastNodeId")) if isinstance(v, int)
    ]
    link_ids = [r[0] for r in map(_link_row, links) if r and isinstance(r[0], int)]
    link_ids += [
        v for v in (graph.get("last_link_id"), state.get("lastLinkId")) if isinstance(v, int)
    ]
    check_id, fix_id = max(node_ids, default=0) + 1, max(node_ids, default=0) + 2
    fix_model, fix_fix, check_model = (max(link_ids, default=0) + i for i in (1, 2, 3))
    moved, consumers = [], []
    for link in links:
        row = _link_row(link)
        if row is None or row[1] != loader_id or row[2] != slot:
            continue
        moved.append(row[0])
        target = by_id.get(row[3])
        consumers.append(_words(str(target.get("type", "")) if target else "?", row[3]))
        if isinstance(link, list):
            link[1], link[2] = fix_id, 0
        else:
            link.update(origin_id=fix_id, origin_slot=0)
    rows = [
        (fix_model, loader_id, slot, fix_id, 0, "MODEL"),
        (fix_fix, check_id, CHECK_FIX_OUTPUT, fix_id, 1, "HALFSAFE_FIX"),
        (check_model, loader_id, slot, check_id, 0, "MODEL"),
    ]
    as_objects = bool(links) and isinstance(links[0], dict)
    keys = ("id", "origin_id", "origin_slot", "target_id", "target_slot", "type")
    links.extend(dict(zip(keys, r, strict=True)) if as_objects else list(r) for r in rows)
    loader["outputs"][slot]["links"] = [fix_model, check_model]
    x, y = _xy(loader.get("pos"), (0.0, 0.0))
    _, height = _xy(loader.get("size"), (315.0, 98.0))
    orders = [n.get("order") for n in nodes if isinstance(n, dict)]
    order = max((o for o in orders if isinstance(o, int)), default=0)
    nodes.append(_ui_fix(fix_id, [x, y + height + 60], order + 2, fix_model, fix_fix, moved))
    nodes.append(
        _ui_check(check_id, [x, y + height + 60 + _ROW], order + 1, check_model, fix_fix, check)
    )
    if "last_node_id" in graph or not state:
        graph["last_node_id"] = fix_id
        graph["last_link_id"] = check_model
    if state:
        state.update(lastNodeId=fix_id, lastLinkId=check_model)
    return NodeWorkflow(
        graph, "ui", "image", _words(kind, loader_id), list(dict.fromkeys(consumers))
    )


def _ui_node(node_id: int, kind: str, pos: list[float], order: int, size: list[int]) -> dict:
    return {
        "id": node_id,
        "type": kind,
        "pos": pos,
        "size": size,
        "flags": {},
        "order": order,
        "mode": 0,
        "properties": {"Node name for S&R": kind},
    }


def _ui_fix(
    node_id: int, pos: list[float], order: int, model: int, fix: int, moved: list[Any]
) -> dict:
    node = _ui_node(node_id, FIX_NODE, pos, order, [270, 66])
    node["inputs"] = [
        {"name": "model", "type": "MODEL", "link": model},
        {"name": "fix", "type": "HALFSAFE_FIX", "shape": 7, "link": fix},
        {"name": "vae", "type": "VAE", "shape": 7, "link": None},
        {"name": "clip", "type": "CLIP", "shape": 7, "link": None},
    ]
    node["outputs"] = [
        {"name": "model", "type": "MODEL", "links": moved, "slot_index": 0},
        {"name": "report", "type": "STRING", "links": None},
        {"name": "vae", "type": "VAE", "links": None},
        {"name": "clip", "type": "CLIP", "links": None},
    ]
    node["widgets_values"] = []
    return node


def _ui_check(
    node_id: int, pos: list[float], order: int, model: int, fix: int, check: CheckInputs
) -> dict:
    node = _ui_node(node_id, CHECK_NODE, pos, order, [300, 170])
    node["inputs"] = [
        {"name": "model", "type": "MODEL", "link": model},
        {"name": "clip", "type": "CLIP", "shape": 7, "link": None},
        {"name": "vae", "type": "VAE", "shape": 7, "link": None},
    ]
    node["outputs"] = [
        {"name": "report", "type": "STRING", "links": None},
        {"name": "report_image", "type": "IMAGE", "links": None},
        {"name": "fix", "type": "HALFSAFE_FIX", "links": [fix], "slot_index": CHECK_FIX_OUTPUT},
    ]
    # The frontend gives an INT widget named seed a "control after generate" value: fixed, so
    # that the check is not run again for a new seed on every queue.
    node["widgets_values"] = [check.width, check.height, check.steps, check.seed, "fixed"]
    return node
