"""The chain of a ComfyUI graph that made the picture a file holds: from the node that saved it
back, link by link, to the VAE decode that drew it. Only what lies on that chain changed the
file's pixels: an `ImageInvert` on a mask branch, or on a preview never saved, did not.

A graph may save more than one picture (the picture and its mask, a preview beside a save).
ComfyUI names each file after its saving node's `filename_prefix` ("ComfyUI" gives
"ComfyUI_00001_.png"), so the file's name picks its saver among several; where it cannot (two
savers with one prefix, a saver HalfSafe does not know) and their chains disagree, the graph
saves both the picture and its negative, and which one the file is stays open (`Inversion`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The nodes that invert a decoded picture's colours.
INVERTING = ("ImageInvert",)
# The inputs an image node takes its picture through (SaveImage's `images`, ImageInvert's and
# ImageScale's `image`, a VAE encode's `pixels`), followed towards the decoder in this order.
_PICTURE_INPUTS = ("images", "image", "pixels")
_DECODER = "VAEDecode"  # VAEDecode, VAEDecodeTiled, VAEDecodeHunyuan3D ...
_MOST_LINKS = 200  # a chain this long is no graph ComfyUI draws; never round a cycle


@dataclass(frozen=True)
class Inversion:
    """What the graph did to the file's colours after the decoder: `inverts` the inverting node
    on the saved picture's chain ("" where none is), or, where the file may be either of two
    saved pictures, one inverted and one not, `unsure` that node ("" otherwise)."""

    inverts: str = ""
    unsure: str = ""


def _saver(kind: str) -> bool:
    lowered = kind.lower()
    return "save" in lowered or "preview" in lowered


def _picture_link(inputs: dict[str, Any]) -> Any:
    return next((inputs[n] for n in _PICTURE_INPUTS if isinstance(inputs.get(n), list)), None)


def _inverting_on_chain(prompt: dict[str, Any], link: Any) -> str:
    """The inverting node between a saver's picture input (`link`, ComfyUI's [node id, output])
    and the decoder, or "" (also where the chain ends before a decoder: what it holds still
    made the file)."""
    seen: set[str] = set()
    found = ""
    for _ in range(_MOST_LINKS):
        if not (isinstance(link, list) and link and isinstance(link[0], (str, int))):
            return found
        node_id = str(link[0])
        node = prompt.get(node_id)
        if node_id in seen or not isinstance(node, dict):
            return found
        seen.add(node_id)
        kind = str(node.get("class_type", ""))[:200]
        if _DECODER in kind:
            return found
        if kind in INVERTING:
            # Inverted twice is the picture again.
            found = "" if found else kind
        inputs = node.get("inputs")
        link = _picture_link(inputs) if isinstance(inputs, dict) else None
    return found


def _prefix_match(inputs: dict[str, Any], file_name: str) -> int:
    """How long a prefix of `file_name` the saver's `filename_prefix` names (its folder part
    left out), 0 where it names none."""
    prefix = inputs.get("filename_prefix")
    if not isinstance(prefix, str) or not prefix:
        return 0
    base = prefix.replace("\\", "/").rsplit("/", 1)[-1]
    return len(base) if base and file_name.startswith(base + "_") else 0


def saved_inversion(prompt: Any, file_name: str, most_nodes: int) -> Inversion:
    """What a ComfyUI API prompt did to the colours of the file `file_name` after decoding (see
    the module's words); reads at most `most_nodes` nodes."""
    if not isinstance(prompt, dict):
        return Inversion()
    nodes = [n for n in list(prompt.values())[:most_nodes] if isinstance(n, dict)]
    savers = [
        inputs
        for node in nodes
        if _saver(str(node.get("class_type", "")))
        and isinstance(inputs := node.get("inputs"), dict)
        and _picture_link(inputs) is not None
    ]
    if not savers:
        inverting = [str(n.get("class_type")) for n in nodes if n.get("class_type") in INVERTING]
        return Inversion(unsure=inverting[0] if inverting else "")
    longest = max(_prefix_match(inputs, file_name) for inputs in savers)
    chosen = [s for s in savers if _prefix_match(s, file_name) == longest]
    found = {_inverting_on_chain(prompt, _picture_link(inputs)) for inputs in chosen}
    if len(found) == 1:
        return Inversion(inverts=found.pop())
    return Inversion(unsure=next(kind for kind in found if kind))
