"""What in the tool that made an image, not in its model, can make it black when HalfSafe's
check of the model runs clean: the step cache its record shows ran, and the tool's memory
manager. Plain data and words; no torch. Used by `records` (reading) and `explanation`.

Step caches reuse a block's output across denoising steps instead of computing it again
(ComfyUI's own EasyCache and LazyCache, comfy_extras/nodes_easycache.py; the TeaCache, MagCache
and WaveSpeed first-block-cache node packs; diffusers' FirstBlockCache, MagCache, TaylorSeer
hooks), so a NaN cached once repeats in every step after it, and a stale cache carries one
image's values into the next. ComfyUI records the node in the image's graph; A1111-style tools
record an extension's settings as infotext keys. HalfSafe's check never caches: where it finds
the overflow, the cache did not make it; where it runs clean, the cache is the first suspect.

Memory managers keep a model's weights where the tool last put them and reuse them: a part
corrupted in memory stays corrupted until the tool starts afresh, and a fresh load is clean.
Neither tool writes its memory settings into the image, so the words name the tool's own
manager and its switch as what to rule out, with a fresh start of the tool as the test:
- ComfyUI's DynamicVRAM, on by default in its stable releases since March 2026 on NVIDIA GPUs
  (Windows and Linux, not WSL; ComfyUI pull request 12658), turned off with
  `--disable-dynamic-vram` (also by `--disable-smart-memory`, pull request 12722). ComfyUI
  issue 15452: a reused model gives NaN or black output on VAE decode where a fresh load does
  not; issue 16490: a schedule that leaks into later runs of the same checkpoint.
- Forge's GPU Weights and Swap Method (Queue or Async) at the top of its page: Async moves
  weights while the GPU computes (forge issue 2343: problems with async swap).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from app.core.limits import index_in_name

# Words in a ComfyUI node's class, or an infotext key, that mark a step cache.
_CACHE_WORDS = (
    "easycache",
    "lazycache",
    "teacache",
    "magcache",
    "fbcache",
    "firstblockcache",
    "taylorseer",
    "seacache",
    "deepcache",
    "promptcache",  # HalfSafe's own (`infotext.PROMPT_CACHE`): keys and values kept
)
_SKIPPED_MODES = (2, 4)  # a UI workflow node muted (2) or bypassed (4) did not run
_OFF = (False, "disabled", "false", "off", "none")


@dataclass(frozen=True)
class RecordedCache:
    """A step cache the image's record shows ran: a ComfyUI node, or an infotext key."""

    node: str  # "EasyCache", "ApplyFBCacheOnModel", or the infotext key ("TeaCache")

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node}


def _is_cache(name: str) -> bool:
    folded = name.lower().replace(" ", "").replace("_", "").replace("-", "")
    return any(word in folded for word in _CACHE_WORDS)


def _switched_off(inputs: dict[str, Any]) -> bool:
    return any(
        (v.strip().lower() if isinstance(v, str) else v) in _OFF
        for k, v in inputs.items()
        if k.lower() in ("enable", "enabled")
    )


def from_comfy_prompt(nodes: Iterable[tuple[str, dict[str, Any]]]) -> list[RecordedCache]:
    """The step-cache nodes of a ComfyUI API prompt (what ran), unless switched off."""
    return [
        RecordedCache(kind[:200])
        for kind, inputs in nodes
        if _is_cache(kind) and not _switched_off(inputs)
    ]


def from_comfy_workflow(workflow: Any, max_nodes: int) -> list[RecordedCache]:
    """The step-cache nodes of a ComfyUI UI workflow that were neither muted nor bypassed."""
    if not isinstance(workflow, dict) or not isinstance(workflow.get("nodes"), list):
        return []
    found = []
    for node in workflow["nodes"][:max_nodes]:
        if not isinstance(node, dict) or node.get("mode") in _SKIPPED_MODES:
            continue
        kind = str(node.get("type", ""))[:200]
        if _is_cache(kind):
            found.append(RecordedCache(kind))
    return found


def from_infotext_keys(keys: Iterable[str]) -> list[RecordedCache]:
    """An extension's step cache in A1111-style infotext: a key that names one."""
    return [RecordedCache(key[:100]) for key in keys if _is_cache(key)]


def comfy_version(workflow: Any, max_nodes: int) -> str | None:
    """ComfyUI's version as its UI workflow records it: the newest `ver` of its core nodes
    (`properties.cnr_id` "comfy-core"), or None."""
    if not isinstance(workflow, dict) or not isinstance(workflow.get("nodes"), list):
        return None
    found: list[tuple[tuple[int, ...], str]] = []
    for node in workflow["nodes"][:max_nodes]:
        properties = node.get("properties") if isinstance(node, dict) else None
        if not isinstance(properties, dict) or properties.get("cnr_id") != "comfy-core":
            continue
        version = properties.get("ver")
        if isinstance(version, str) and 0 < len(version) <= 40:
            numbers = [index_in_name(p) for p in version.split(".")]
            if all(n is not None for n in numbers):
                found.append((tuple(n for n in numbers if n is not None), version))
    return max(found)[1] if found else None


# --- memory managers -------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryManager:
    """A tool's memory manager: what keeps a model's weights between jobs, and its switch."""

    tool: str
    name: str
    default: str  # when it is on, in words
    switch: str  # how to turn it off, in the tool's terms
    source: str

    def to_json(self) -> dict[str, Any]:
        return {
            "tool": self.tool,
            "name": self.name,
            "default": self.default,
            "switch": self.switch,
            "source": self.source,
        }


_COMFY_MANAGER = MemoryManager(
    "comfyui",
    "DynamicVRAM",
    "on by default since March 2026 on NVIDIA GPUs (Windows and Linux, not WSL)",
    "start ComfyUI with --disable-dynamic-vram",
    "ComfyUI issue 15452: a reused model gives NaN or black output on VAE decode where a "
    "fresh load does not",
)
# Before DynamicVRAM (made the default in ComfyUI's 0.15 line, February-March 2026: ComfyUI
# pull request 12658), ComfyUI's smart memory kept a model in VRAM between jobs; its switch
# turns DynamicVRAM off too from then on (pull request 12722).
_COMFY_SMART_MEMORY = MemoryManager(
    "comfyui",
    "smart memory",
    "on by default before DynamicVRAM replaced it in ComfyUI 0.15 (March 2026), and its "
    "switch turns DynamicVRAM off too in later versions",
    "start ComfyUI with --disable-smart-memory",
    "ComfyUI's --disable-smart-memory: offload models to RAM instead of keeping them in VRAM",
)
DYNAMIC_VRAM_SINCE = (0, 15)
MEMORY_MANAGERS = {
    "comfyui": _COMFY_MANAGER,
    # SwarmUI generates through a ComfyUI backend: the switch goes in its ExtraArgs.
    "swarmui": MemoryManager(
        "swarmui",
        "its ComfyUI backend's DynamicVRAM",
        _COMFY_MANAGER.default,
        "add --disable-dynamic-vram to ExtraArgs in Server > Backends",
        _COMFY_MANAGER.source,
    ),
    "forge": MemoryManager(
        "forge",
        "GPU Weights and Swap Method",
        "set at the top of Forge's page; Async swap moves weights while the GPU computes",
        "set Swap Method to Queue, and lower GPU Weights if the image is black only at large sizes",
        "forge issue 2343: problems with async swap",
    ),
}

RUNTIME_WORDS = {
    "cache_note": (
        "The image's workflow ran a step cache ({nodes}), which reuses what one denoising step "
        "computed (a block's output, the prompt's keys and values) in later steps instead of "
        "computing it again: a NaN cached once repeats in every later step. HalfSafe's check "
        "computes every step; to rule the cache out in the tool, bypass {first} and make the "
        "image again."
    ),
    "cache_reproduced": (
        "The image's workflow ran a step cache ({nodes}); HalfSafe's check runs without one, "
        "so what it found is the model's, not the cache's."
    ),
    "cache_suspect": (
        "The image's workflow ran a step cache ({nodes}), which reuses what one step computed "
        "in later steps: a NaN it cached repeats in every later step, and a stale cache carries "
        "one image's values into the next. The check without it ran finite, so the cache is "
        "the first suspect: bypass {first} and make the image again; if it comes out right, it "
        "was the cache."
    ),
    "cache_rule_out": "the step cache ({nodes})",
    "manager": (
        "If the model was already loaded when the image was made, rule out {tool}'s memory "
        "manager, {name} ({default}; {source}): {switch} and make the image again."
    ),
    "fresh_start": (
        "If the model was already loaded when the image was made, a fresh start of {tool} "
        "(quit it, start it, make the image again with the same seed) is the test: an image "
        "that comes out right then was made by a part gone bad in memory, not by the model."
    ),
}


def cache_nodes(caches: list[RecordedCache]) -> str:
    return ", ".join(dict.fromkeys(c.node for c in caches))


def memory_manager(tool: str, version: str | None = None) -> MemoryManager | None:
    """The memory manager of the tool that made an image, for the version its record names
    where that matters (a ComfyUI workflow whose newest core node is older than DynamicVRAM:
    the smart memory before it, whose switch covers both)."""
    if tool == "comfyui" and version is not None:
        parts = (index_in_name(p) for p in version.lstrip("v").split(".")[:2])
        numbers = tuple(n for n in parts if n is not None)
        if len(numbers) == 2 and numbers < DYNAMIC_VRAM_SINCE:
            return _COMFY_SMART_MEMORY
    return MEMORY_MANAGERS.get(tool)


def state_words(tool: str, tool_name: str, version: str | None = None) -> str:
    """What rules out a part gone bad in the tool's memory: its memory manager and switch
    where HalfSafe knows one (for the tool's version, where its record names one), otherwise a
    fresh start of the tool."""
    manager = memory_manager(tool, version)
    if manager is None:
        return RUNTIME_WORDS["fresh_start"].format(tool=tool_name)
    return RUNTIME_WORDS["manager"].format(
        tool=tool_name,
        name=manager.name,
        default=manager.default,
        source=manager.source,
        switch=manager.switch,
    )
