"""The LoRA files a browser lists: those in the Lora folders AUTOMATIC1111, Forge, ComfyUI,
StabilityMatrix and InvokeAI keep beside their model folders (`models/Lora`, `models/loras`,
`models/LyCORIS`, InvokeAI's `<base>/lora`), each with the card its header gives. Headers only;
no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from app.core.library import library_roots
from app.core.library.metadata import CARD_SUFFIXES, ModelCard, read_card
from app.core.library.scan import _candidates
from app.core.lora.files import LORA_FOLDERS

# LoRAs listed at most: collections of a few thousand are common, tens of thousands are not.
MAX_LORAS_LISTED = 10_000


@dataclass(frozen=True)
class LoraFound:
    """One LoRA file in a Lora folder, with what its header says."""

    path: str
    size_bytes: int
    card: ModelCard


def lora_folders(roots: list[Path]) -> list[Path]:
    """The Lora folders that exist in and beside each library folder (`roots`): a folder named
    as the tools name theirs is one itself; each real folder once."""
    found: list[Path] = []
    seen: set[Path] = set()
    names = {name.lower() for name in LORA_FOLDERS}
    for root in roots:
        candidates = [root] if root.name.lower() in names else []
        candidates += [base / name for base in (root, root.parent) for name in LORA_FOLDERS]
        for folder in candidates:
            try:
                if not folder.is_dir():
                    continue
                real = folder.resolve()
            except OSError:
                continue
            if real not in seen:
                seen.add(real)
                found.append(folder)
    return found


def list_loras(
    model_folders: list[str] | None = None,
    *,
    include_defaults: bool = True,
    limit: int = MAX_LORAS_LISTED,
) -> list[LoraFound]:
    """The safetensors LoRA files in the Lora folders beside the library's folders (the
    settings' model folders, or `model_folders`, and the tools' usual ones unless
    `include_defaults` is False), sorted by name, at most `limit`, each with its card. Folders
    are walked as the library walks them (symlinks followed once, bounded in depth and
    entries); a file that cannot be read has a card naming its problem. Runs on the calling
    thread."""
    if include_defaults:
        roots = library_roots(model_folders)
    else:
        from app.core.library.folders import _plan

        roots = [f.path for f in _plan(list(model_folders or []), False)[0]]
    files: list[Path] = []
    visited: set[tuple[int, int]] = set()
    for folder in lora_folders(roots):
        found, _overflow = _candidates(folder, visited)
        files += [
            path
            for path, kind in found
            if kind == "single_file" and path.name.lower().endswith(CARD_SUFFIXES)
        ]
    listed: list[LoraFound] = []
    for path in sorted(set(files), key=lambda p: (p.name.lower(), str(p)))[:limit]:
        try:
            size = path.stat().st_size
        except OSError:
            size = 0
        listed.append(LoraFound(str(path), size, read_card(path)))
    return listed
