"""The scan: the model files and diffusers folders below each library folder (symlinks followed,
each real folder once, bounded in depth and entries), each read into a row or taken from the
cache, VAEs told apart and paired with their models as A1111 pairs them.
"""

from __future__ import annotations

import os
from dataclasses import asdict, replace
from pathlib import Path

from app.core.checkpoint import PICKLE_SUFFIXES, SAFETENSORS_SUFFIX
from app.core.jobs import CancelToken, ProgressCallback, no_progress
from app.core.library.entries import MAX_DEPTH, MAX_FOLDER_ENTRIES, MODEL, VAE, LibraryEntry
from app.core.library.folders import _plan
from app.core.library.index import _cached_entry, _load_index, _save_index, _stamp
from app.core.library.inspection import _inspect_one, _with_companions

# Single files the library lists: safetensors, also as ComfyUI's short `.sft` (same format), and
# GGUF (quantized transformers kept as split files).
MODEL_SUFFIXES = (SAFETENSORS_SUFFIX, ".sft", ".gguf")
# A1111 pairs `name.vae.safetensors` (or .vae.pt/.vae.ckpt) with the checkpoint `name.*`.
VAE_PAIR_SUFFIXES = (".vae.safetensors", ".vae.sft", ".vae.pt", ".vae.ckpt")


def scan_library(
    folders: list[str] | None = None,
    *,
    include_defaults: bool = True,
    use_cache: bool = True,
    on_progress: ProgressCallback | None = None,
    cancel: CancelToken | None = None,
) -> list[LibraryEntry]:
    """List the checkpoints and VAEs under `folders` (None: the settings' model folders), plus
    the default folders (`default_folders()`) unless `include_defaults` is False.

    Safetensors files (`.safetensors`, `.sft`) get architecture and stored dtype from their
    header; diffusers folders (with model_index.json) from their configs; pickles are listed
    unopened. Files in VAE folders, named `*.vae.*`, or holding only a VAE are rows with role
    "vae"; a model with an A1111 `name.vae.*` beside it carries that VAE in `vae`. Symlinked
    subfolders are followed, each real folder once, at most MAX_DEPTH deep and
    MAX_FOLDER_ENTRIES entries per folder (a folder past that gets a row saying so). A folder
    that does not exist or cannot be read is skipped; a configuration file that cannot be read
    is a row. Sorted by path. The index is cached in `paths.data_dir()/library.json`; entries
    whose file size and time are unchanged are reused. Runs on the calling thread and checks
    `cancel` between files.
    """
    progress = on_progress or no_progress
    given = [str(f) for f in folders] if folders is not None else None
    if not include_defaults and given is None:
        given = []
    roots, problems = _plan(given, include_defaults)
    cache = _load_index() if use_cache else {}
    candidates: list[tuple[Path, str, str]] = []
    visited: set[tuple[int, int]] = set()
    listed: set[str] = set()
    for root in roots:
        found, overflow = _candidates(root.path, visited)
        for path, kind in found:
            if str(path) not in listed:
                listed.add(str(path))
                candidates.append((path, kind, root.role))
        if overflow:
            problems.append(
                LibraryEntry(
                    str(root.path),
                    None,
                    None,
                    0,
                    f"{root.path}: it holds more than {MAX_FOLDER_ENTRIES:,} files and folders, "
                    "so HalfSafe listed only the first ones; add the folders that hold your "
                    "models instead.",
                    format="folder",
                )
            )
    entries: list[LibraryEntry] = []
    fresh: dict[str, dict] = {}
    for done, (path, kind, role) in enumerate(candidates):
        if cancel is not None:
            cancel.raise_if_cancelled()
        progress("Scanning model folders", done, len(candidates))
        key = str(path)
        stamp = _stamp(path, kind)
        entry = _cached_entry(cache.get(key), stamp, key)
        if entry is None:
            entry = _inspect_one(path, kind)
        if stamp is not None:
            fresh[key] = {"stamp": stamp, "entry": asdict(entry)}
        if entry.format == "split_files" and entry.supported:
            entry = _with_companions(entry)  # never cached: companions come and go
        vae = role == VAE or _is_paired_vae_name(path.name) or entry.architecture == "vae"
        entries.append(replace(entry, role=VAE if vae else MODEL, vae=None))
    progress("Scanning model folders", len(candidates), len(candidates))
    if use_cache:
        _save_index(fresh)
    return sorted(_pair_vaes(entries) + problems, key=lambda e: e.path)


def _is_paired_vae_name(name: str) -> bool:
    return name.lower().endswith(VAE_PAIR_SUFFIXES)


def _pair_vaes(entries: list[LibraryEntry]) -> list[LibraryEntry]:
    """Give each single-file model the `name.vae.*` file beside it, as A1111 does
    (safetensors first, then the pickles, which load only when pickles are allowed)."""
    vaes = {e.path.lower(): e.path for e in entries if e.role == VAE and e.error is None}
    paired = []
    for entry in entries:
        if entry.role == MODEL and entry.format in ("single_file", "pickle"):
            path = Path(entry.path)
            stem = str(path.with_suffix(""))
            match = next(
                (vaes[(stem + s).lower()] for s in VAE_PAIR_SUFFIXES if (stem + s).lower() in vaes),
                None,
            )
            entry = replace(entry, vae=match)
        paired.append(entry)
    return paired


def _candidates(root: Path, visited: set[tuple[int, int]]) -> tuple[list[tuple[Path, str]], bool]:
    """The model files and diffusers folders below `root`, and whether the listing stopped at
    MAX_FOLDER_ENTRIES. Symlinked folders are followed as A1111, Forge and ComfyUI do; each
    real folder (device and inode, shared across roots through `visited`) is listed once, so a
    link loop ends, and nothing deeper than MAX_DEPTH is listed."""
    found: list[tuple[Path, str]] = []
    looked = 0
    pending: list[tuple[Path, int]] = [(root, 0)]
    while pending:
        here, depth = pending.pop()
        try:
            info = os.stat(here)
        except OSError:
            continue
        identity = (info.st_dev, info.st_ino) if info.st_ino else (0, hash(os.path.realpath(here)))
        if identity in visited:
            continue
        visited.add(identity)
        children = []
        try:
            with os.scandir(here) as listing:
                for child in listing:
                    looked += 1
                    if looked > MAX_FOLDER_ENTRIES:
                        return found, True
                    children.append(child)
        except OSError:
            continue  # an unreadable subfolder is left out; the rest of the scan goes on
        children.sort(key=lambda c: c.name)
        if any(c.name == "model_index.json" for c in children):
            found.append((here, "diffusers"))
            continue
        folders = []
        for child in children:
            if child.name.startswith("."):
                continue
            try:
                is_folder = child.is_dir()  # follows a symlink
            except OSError:
                continue
            lowered = child.name.lower()
            if is_folder:
                if depth < MAX_DEPTH:
                    folders.append(Path(child.path))
            elif lowered.endswith(MODEL_SUFFIXES):
                found.append((Path(child.path), "single_file"))
            elif lowered.endswith(PICKLE_SUFFIXES):
                found.append((Path(child.path), "pickle"))
        pending.extend((folder, depth + 1) for folder in reversed(folders))
    return found, False
