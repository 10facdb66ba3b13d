"""The image's model and VAE in the user's library: by the names the record gives and by the
hash it records (A1111's short, old or full sha256), inside the model folders only."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.core.explain.records import Record
from app.core.jobs import CancelToken, ProgressCallback, no_progress


@dataclass
class ModelMatch:
    found: bool
    path: str | None
    looked_in: list[str]
    matched_by: str | None = None  # "hash", "hash and name", "name", "built-in demo"
    note: str | None = None
    vaes: list[str] = field(default_factory=list)  # the VAE files the library found
    # Every library folder (models and VAEs): where names from the image may resolve.
    roots: list[Path] = field(default_factory=list)
    # Files that say where models are (another tool's extra_model_paths.yaml) but could not be
    # read, one sentence each: the folders they name were not looked in.
    unread: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "found": self.found,
            "path": self.path,
            "looked_in": list(self.looked_in),
            "matched_by": self.matched_by,
        }


def named_model(model: str, record: Record) -> ModelMatch:
    """The model the user says made the image (a file, a folder or a built-in demo's name), as
    a match; its note says whose word it is, and which model the image names where it names
    another. Raises BadFileError for a path that is not there."""
    from app.core.demo import DEMO_MODELS
    from app.core.errors import BadFileError

    if model in DEMO_MODELS:
        path, how = model, "named by you"
    else:
        found = Path(model).expanduser()
        if not found.exists():
            raise BadFileError(str(found), "there is no such file or folder")
        path, how = str(found), "named by you"
    said = record.model or record.unet
    note = f"The check ran with the model you named ({Path(path).name})"
    note += f"; the image names {said}." if said and Path(said).name != Path(path).name else "."
    return ModelMatch(True, path, [], how, note)


def _wanted_names(record: Record) -> list[str]:
    """The names the record gives, with folders as the tool wrote them (ComfyUI keeps the
    subfolder below its models folder, with either slash)."""
    names = []
    for value in (record.model, record.unet):
        if value:
            cleaned = value.replace("\\", "/").strip().strip("/")
            # A1111 writes "name [hash]" in some versions' Model field.
            cleaned = re.sub(r"\s*\[[0-9a-fA-F]{8,64}\]$", "", cleaned)
            if cleaned and cleaned not in names:
                names.append(cleaned)
    return names


def _name_matches(entry_path: str, wanted: str) -> bool:
    entry = Path(entry_path)
    full = entry.as_posix().lower()
    wanted_lower = wanted.lower()
    if "/" in wanted_lower:
        # ComfyUI writes the file's path below its folder; SwarmUI the same without the suffix.
        bare = full[: -len(entry.suffix)] if entry.suffix else full
        return full.endswith("/" + wanted_lower) or bare.endswith("/" + wanted_lower)
    if entry.name.lower() == wanted_lower:
        return True
    stem = entry.stem.lower() if entry.suffix else entry.name.lower()
    return stem == wanted_lower or stem == Path(wanted_lower).stem


def _hash_kind(value: str | None) -> tuple[str, str] | None:
    """("short"|"old"|"full", hex) for a hash an image records; None for another kind (InvokeAI
    v4 records BLAKE3, which HalfSafe does not compute)."""
    if not value:
        return None
    text = value.strip().lower()
    if text.startswith("sha256:"):
        text = text[7:]
    if not re.fullmatch(r"[0-9a-f]+", text):
        return None
    return {8: ("old", text), 10: ("short", text), 64: ("full", text)}.get(len(text))


def old_a1111_hash(path: str | Path) -> str:
    """A1111's hash before v1.0: sha256 of the 64 KiB at offset 1 MiB, first 8 hex digits."""
    with Path(path).open("rb") as file:
        file.seek(0x100000)
        return hashlib.sha256(file.read(0x10000)).hexdigest()[:8]


def _file_matches_hash(
    path: str, kind: str, value: str, cancel: CancelToken | None, cached_only: bool
) -> bool:
    from app.core import checkpoint

    try:
        if kind == "old":
            return old_a1111_hash(path) == value
        if cached_only:
            short = checkpoint.cached_model_hash(path)
            if short is None:
                return False
        else:
            short = checkpoint.model_hash(path, cancel=cancel)
        if kind == "short":
            return short == value
        resolved = Path(path).resolve()
        full = checkpoint.cached_value(str(resolved), checkpoint.file_stamp(resolved), "sha256")
        return full == value
    except OSError:
        return False


def find_model(
    record: Record,
    folders: list[str] | None = None,
    *,
    on_progress: ProgressCallback | None = None,
    cancel: CancelToken | None = None,
) -> ModelMatch:
    """The record's model in the library (`library.scan_library`: the settings' model folders
    plus the usual installs, or `folders`), by name and hash.

    Names first (a file name, a stem, or ComfyUI's path below its models folder); a recorded
    hash then confirms one of them. When no named file carries the hash, files whose hashes
    are already cached are compared, then the other safetensors files are hashed (seconds per
    GB, cached for next time; cancellable). A file found by name whose hash differs is still
    returned, with a note. Runs on the calling thread.
    """
    from app.core import library
    from app.core.demo import DEMO_MODELS

    if record.made_by == "halfsafe" and record.model in DEMO_MODELS:
        # HalfSafe's own built-in demos live in no folder: they are built, not found.
        return ModelMatch(True, record.model, [], "built-in demo")
    progress = on_progress or no_progress
    looked_in = [str(f) for f in library.library_folders(folders)]
    scanned = library.scan_library(folders, on_progress=progress, cancel=cancel)
    # A VAE is never the image's model, but may be the VAE it names.
    entries = [e for e in scanned if e.error is None and e.role == library.MODEL]
    vaes = [e.path for e in scanned if e.error is None and e.role == library.VAE]

    roots = library.library_roots(folders)
    unread = [e.error for e in scanned if e.error and e.format == "config"]

    def match(*args: Any) -> ModelMatch:
        return ModelMatch(*args, vaes=vaes, roots=roots, unread=unread)

    names = _wanted_names(record)
    by_name = [e for e in entries if any(_name_matches(e.path, n) for n in names)]
    hashed = _hash_kind(record.model_hash)
    files = [e for e in entries if e.format == "single_file"]
    if hashed is not None:
        kind, value = hashed
        for entry in by_name:
            if entry.format == "single_file" and _file_matches_hash(
                entry.path, kind, value, cancel, cached_only=False
            ):
                return match(True, entry.path, looked_in, "hash and name")
        for entry in files:
            if _file_matches_hash(entry.path, kind, value, cancel, cached_only=True):
                return match(True, entry.path, looked_in, "hash")
        if not by_name:
            for done, entry in enumerate(files):
                if cancel is not None:
                    cancel.raise_if_cancelled()
                progress("Looking for the model by its hash", done, len(files))
                if _file_matches_hash(entry.path, kind, value, cancel, cached_only=False):
                    return match(True, entry.path, looked_in, "hash")
    if by_name:
        note = None
        if hashed is not None:
            note = (
                f"{by_name[0].path} has the image's model name but not its hash "
                f"({record.model_hash}): it may be another version of the file."
            )
        return match(True, by_name[0].path, looked_in, "name", note)
    return match(False, None, looked_in)


def find_vae(
    name: str | None,
    model_path: str,
    library_vaes: Sequence[str] = (),
    folders: Sequence[str | Path] | None = None,
) -> str | None:
    """A separate VAE the record names, by its file name: next to the model, in the VAE
    folders (A1111's models/VAE, ComfyUI's models/vae) beside the model's folder, then among
    the VAEs the library found (`library_vaes`: VAE folders of other installs, ComfyUI's
    extra_model_paths.yaml).

    The name comes from an image, so it resolves only inside the model folders (`folders`,
    default the library's, `library.library_roots`): the search climbs from the model no
    higher than the model folder that holds it, and a file that is a link leading out of the
    folders is passed over. Stats files; never opens one."""
    if not name or name.lower() in ("none", "automatic", "baked vae", "default"):
        return None
    from app.core import limits

    if folders is None:
        from app.core import library

        folders = library.library_roots()
    wanted = Path(name.replace("\\", "/")).name.lower()
    model = Path(model_path)
    places = [model.parent]
    for parent in model.parents:
        if not limits.within(parent, folders):
            break
        places.extend([parent / "VAE", parent / "vae"])
    for place in places:
        try:
            for candidate in place.iterdir():
                if (
                    candidate.name.lower() in (wanted, wanted + ".safetensors")
                    and limits.is_regular_file(candidate)
                    and limits.within(candidate, folders)
                ):
                    return str(candidate)
        except OSError:
            continue
    return next(
        (
            v
            for v in library_vaes
            if Path(v).name.lower() in (wanted, wanted + ".safetensors")
            and limits.within(v, folders)
        ),
        None,
    )
