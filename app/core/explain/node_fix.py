"""The fix for an image ComfyUI made, as HalfSafe's nodes apply it: HalfSafe Fix between the
loader and the sampler, in a workflow to drop in (the image's own graph rewritten,
`comfyui.workflow`), with ComfyUI's whole-component flag kept as the fallback for those who will
not install the nodes. Offered where the check's fix changes the diffusion model, the part
HalfSafe Fix patches; a fix of the VAE or a text encoder stays a flag."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.core.comfyui.workflow import CheckInputs, NodeWorkflow, with_fix_node
from app.core.components import Role, component
from app.core.errors import HalfSafeError
from app.core.explain.image_file import PNG_SIGNATURE, read_exif, read_png
from app.core.explain.records import MAX_JSON_DEPTH, Record, json_depth
from app.core.images.finished import read_head
from app.core.words.nodes import NODE_WORDS
from app.core.words.tools import in_tool_terms

# The tools whose images carry a ComfyUI graph HalfSafe's nodes can be placed in.
NODE_TOOLS = ("comfyui",)
# The settings that govern the denoiser as a whole (what HalfSafe Fix does for a component).
_DENOISER_SETTINGS = ("unet_precision",)
FILE_SUFFIX = "-halfsafe-fix.json"


@dataclass
class NodeFix:
    """The workflow with HalfSafe Fix, the flags still needed beside it (a failing VAE's), and
    the whole-component flags for ComfyUI without the nodes."""

    workflow: NodeWorkflow
    fallback: list[str]
    also: list[str] = field(default_factory=list)
    file_name: str = "workflow" + FILE_SUFFIX
    saved: str = ""  # where the command wrote it, in words ("" until written)

    @property
    def words(self) -> str:
        """The fix in one clause, for the answer's first sentence."""
        said = NODE_WORDS["fix"].format(flags=" ".join(self.fallback) or "--force-fp32")
        if self.also:
            said += "; " + NODE_WORDS["also"].format(flags=" ".join(self.also))
        return said

    @property
    def fallback_words(self) -> str:
        return NODE_WORDS["fallback"].format(flags=" ".join(self.fallback) or "--force-fp32")

    def to_json(self) -> dict[str, Any]:
        return {
            **self.workflow.to_json(),
            "file_name": self.file_name,
            "also_flags": list(self.also),
            "without_nodes": {"flags": list(self.fallback), "how": self.fallback_words},
        }

    def save(self, path: str | Path) -> Path:
        """Write the workflow's graph to `path` (whole, or not at all). Raises HalfSafeError
        with one sentence where it cannot be written."""
        path = Path(path)
        text = json.dumps(self.workflow.graph, indent=2)
        try:
            handle, temporary = tempfile.mkstemp(prefix=".halfsafe-", dir=path.parent)
            try:
                with os.fdopen(handle, "w", encoding="utf-8") as file:
                    file.write(text)
                os.replace(temporary, path)
            except BaseException:
                Path(temporary).unlink(missing_ok=True)
                raise
        except OSError as error:
            problem = f"{path}: {error.strerror or error}"
            raise HalfSafeError(NODE_WORDS["not_saved"].format(problem=problem)) from None
        return path

    def save_beside(self, image: str | Path) -> str:
        """Write it beside the image it fixes; the words that say where (or why not)."""
        try:
            where = self.save(Path(image).with_name(self.file_name))
            self.saved = NODE_WORDS["saved"].format(path=where)
        except HalfSafeError as error:
            self.saved = str(error)
        return self.saved


def changes_denoiser(fix) -> bool:
    """Whether a check's fix changes the diffusion model (its component setting, or layers of
    it kept wider): the part HalfSafe Fix patches."""
    names = {"unet" for key in fix.settings if key in _DENOISER_SETTINGS}
    for value in fix.settings.values():
        if isinstance(value, list):
            names.update(str(entry).partition(":")[0] for entry in value)
    return any(_is_denoiser(name) for name in names)


def _is_denoiser(name: str) -> bool:
    try:
        return component(name).role == Role.DENOISER
    except KeyError:
        return False


def node_fix_for(
    path: str | Path,
    made_by: str,
    record: Record,
    fix,
    settings: dict[str, Any],
    fallback: list[str],
) -> NodeFix | None:
    """The node fix for an image `made_by` a tool whose graph can hold HalfSafe's nodes, where
    the check's `fix` changes the diffusion model; None otherwise. `settings`: the fix the
    tool can apply, in HalfSafe's settings; `fallback`: those in the tool's flags. The image's
    graph is read again from its file, bounded as its record was; one that cannot be read
    gives the template."""
    if made_by not in NODE_TOOLS or fix is None or not changes_denoiser(fix):
        return None
    texts = _graph_texts(Path(path))
    check = CheckInputs(
        record.width or 512, record.height or 512, record.steps or 20, record.seed or 0
    )
    names = [n for n in (record.model, record.unet) if n]
    prompt, graph = _parsed(texts.get("prompt")), _parsed(texts.get("workflow"))
    workflow = with_fix_node(prompt, graph, check, names)
    # What the nodes leave to a flag: a failing VAE's or text encoder's fix.
    others = {k: v for k, v in settings.items() if not _denoiser_setting(k, v)}
    also = in_tool_terms(made_by, others, []).flags if others else []
    return NodeFix(workflow, list(fallback), also, Path(path).stem + FILE_SUFFIX)


def _denoiser_setting(key: str, value: Any) -> bool:
    if key in _DENOISER_SETTINGS:
        return True
    if isinstance(value, list):
        return all(_is_denoiser(str(entry).partition(":")[0]) for entry in value)
    return False


def _graph_texts(path: Path) -> dict[str, str]:
    """The image's text chunks, read again within the same bounds; {} where they cannot be."""
    try:
        facts = read_png(path) if read_head(path).startswith(PNG_SIGNATURE) else read_exif(path)
    except (HalfSafeError, OSError):
        return {}
    return facts.text


def _parsed(text: str | None) -> Any:
    """A graph chunk's JSON, or None where it is missing, nested past MAX_JSON_DEPTH or not
    JSON."""
    if not text or json_depth(text) > MAX_JSON_DEPTH:
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None
