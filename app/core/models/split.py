"""Models kept as split files, as ComfyUI and Forge users keep Flux.1, Chroma, SD3.x, Z-Image
and Qwen-Image: a transformer file (in `diffusion_models/` or `unet/`), its text encoders (in
`text_encoders/` or `clip/`) and its VAE (in `vae/`), each a file of its own (`.safetensors`,
bf16/fp16 or fp8, or `.gguf`: every file is read through `Checkpoint`, which dequantises fp8 and
GGUF weights, see `quantized.py`); and Stability AI's SD3.x checkpoints, which may carry their
text encoders and VAE inside the same file.

Which layout a transformer file is in is asked of the families (each family module holds its
layout: the keys that mark it, its config reader and its key table; `layouts.py` what they
share). Here: finding that layout, and the companions. The companions come from
`--text-encoder PATH` (repeatable) and `--vae PATH`, or are found by their contents in the
usual sibling folders (a file there that cannot be read or built is passed over, named with
why); a missing one is named in one sentence. Every header is read before any tensor; nothing
reaches the network (shipped configs in `app/resources/configs`, shipped CLIP, T5 and Qwen
vocabularies).
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from app.core import limits, paths
from app.core.checkpoint.header import SafetensorsHeader, read_header
from app.core.encoders import kinds
from app.core.encoders.kind import VaeKind
from app.core.errors import BadFileError, HalfSafeError, UnsupportedModelError
from app.core.families import FAMILIES, family
from app.core.formats import int4
from app.core.formats.layouts import (
    Layout,
    Need,
    PartKind,
    Shapes,
    SplitModel,
    listed,
)
from app.core.models import parts

TRANSFORMER_FOLDERS = ("diffusion_models", "unet")
TEXT_ENCODER_FOLDERS = ("text_encoders", "clip")
VAE_FOLDERS = ("vae",)
# Companion files: safetensors, and GGUF (a T5 encoder in llama.cpp's names reads as
# transformers' layout, see gguf.transformers_names).
COMPANION_SUFFIXES = (".safetensors", ".gguf")


# Which layout a transformer file is in ------------------------------------------------------


def find_layout(shapes: Shapes) -> tuple[str, str] | None:
    """(family name, key prefix) of a transformer file in a layout read here, or None. The
    families are asked in the registry's order: the first whose layout matches wins (Chroma
    before Flux.1: the same blocks, and more)."""
    for candidate in FAMILIES:
        layout = candidate.layout
        if layout is None:
            continue
        for prefix in layout.prefixes():
            if all(prefix + m in shapes for m in layout.markers) and not any(
                prefix + m in shapes for m in layout.excluded
            ):
                return candidate.id, prefix
    return None


def layout_of(name: str) -> Layout:
    """The transformer layout of the family `name` (what `find_layout` returns)."""
    layout = family(name).layout
    if layout is None:
        raise ValueError(f"{name} models have no transformer-file layout")
    return layout


def read_model(shapes: Shapes, file_name: str = "") -> SplitModel | None:
    """What a transformer file holds, or None when it is in no layout read here; its
    `file_name` tells a variant whose weights are shaped as another's (Flux.1 Kontext's as
    dev's). Raises ValueError with words completing "this <layout words> is not one HalfSafe
    can build: "."""
    found = find_layout(shapes)
    if found is None:
        return None
    name, prefix = found
    layout = layout_of(name)
    model = layout.read(shapes, prefix)
    return layout.named(model, file_name) if layout.named and file_name else model


def layout_words(shapes: Shapes) -> str:
    """ "Flux-style transformer" for the file's layout ("transformer" when none)."""
    found = find_layout(shapes)
    return layout_of(found[0]).words if found else "transformer"


# Companions --------------------------------------------------------------------------------

# Directory entries looked at in one sibling folder (a models folder holds dozens of files).
MAX_FOLDER_ENTRIES = 10_000
# Headers read when looking for one component. Files whose name says what they are come first,
# then the largest (a text encoder or VAE is megabytes, junk rarely is): junk hides a companion
# only when more than this many files rank above it.
MAX_CANDIDATES = 256
_PASSED_OVER_SHOWN = 3  # files a sentence names before "and N more"


@dataclass(frozen=True)
class Companions:
    """The files a split transformer runs with (by component, None where missing), the other
    files that fit a component as well as the one chosen, and the files in the sibling folders
    passed over, each with why (words completing "<file>: ")."""

    found: dict[str, Path | None]
    looked_in: tuple[Path, ...]
    also_fit: dict[str, tuple[Path, ...]] = field(default_factory=dict)
    passed_over: dict[Path, str] = field(default_factory=dict)
    # Files of another family or size in the folders (what each is), named only when a
    # component is missing: a text_encoders/ folder holds every model's encoders.
    other_parts: dict[Path, str] = field(default_factory=dict)
    # Files refused for what they are (a 4-bit LLM export), each with its own sentence: where
    # one is the only file passed over for a missing part, it is the answer.
    refused: dict[Path, HalfSafeError] = field(default_factory=dict)

    def missing(self) -> list[str]:
        return [c for c, path in self.found.items() if path is None]

    def used(self) -> dict[str, str]:
        """component -> the companion file it is read from, as reports name it."""
        return {c: str(path) for c, path in self.found.items() if path is not None}


@dataclass(frozen=True)
class _File:
    path: Path
    size: int


def _siblings(model: Path, folders: tuple[str, ...]) -> list[Path]:
    """Folders named `folders` beside the transformer's folder (ComfyUI's models/ tree)."""
    root = model.parent.parent
    return [root / name for name in folders if (root / name).is_dir()]


def _files(folders: list[Path]) -> list[_File]:
    """The .safetensors and .gguf files in `folders`, at most MAX_FOLDER_ENTRIES entries looked
    at in each; an unreadable folder or entry is left out."""
    found: list[_File] = []
    for folder in folders:
        try:
            with os.scandir(folder) as listing:
                for count, entry in enumerate(listing):
                    if count >= MAX_FOLDER_ENTRIES:
                        break
                    if not entry.name.lower().endswith(COMPANION_SUFFIXES):
                        continue
                    with contextlib.suppress(OSError):
                        if entry.is_file():  # follows a symlink, as the loader will
                            found.append(_File(Path(entry.path), entry.stat().st_size))
        except OSError:
            continue
    return found


def _ranked(need: Need, files: list[_File]) -> list[_File]:
    """The files worth reading for `need`, best first, at most MAX_CANDIDATES of them: named
    for it, then the largest, then by name."""
    ranked = sorted(files, key=lambda f: (not _hinted(need, f.path), -f.size, f.path.name))
    return ranked[:MAX_CANDIDATES]


def _hinted(need: Need, path: Path) -> bool:
    """Whether the file's name has a word starting with one of the need's hints ("t5xxl_fp16"
    says t5, "sd3_vae" says sd3 but not ae)."""
    stem = path.stem.lower()
    return any(re.search(rf"(^|[^a-z0-9]){re.escape(h)}", stem) for h in need.hints)


def _cannot_build(kind: PartKind, error: Exception) -> str:
    """Why a file of `kind` cannot be built, completing "<file>: "."""
    if isinstance(error, ValueError):
        reason = str(error).rstrip(".")
    else:  # a fault no check foresaw costs this file only, named as such
        words = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
        reason = (
            f"HalfSafe could not read it ({type(error).__name__}{': ' + words if words else ''})"
        )
    return f"this {kind.words} cannot be built: {reason}"


class _Search:
    """One search of the sibling folders: each file's header is read once, and a file that
    cannot be read, or not built as what it holds, is passed over with why."""

    def __init__(self) -> None:
        self.headers: dict[Path, Shapes | None] = {}
        self.passed_over: dict[Path, str] = {}
        # Readable files of the role looked for that fit no need: whose part each is.
        self.other_parts: dict[Path, str] = {}
        self.refused: dict[Path, HalfSafeError] = {}

    def shapes(self, path: Path) -> Shapes | None:
        if path not in self.headers:
            try:
                header = read_header(path)
                self.headers[path] = header.shapes()
                if isinstance(header, SafetensorsHeader):
                    try:
                        int4.refuse_int4(path, header.dtypes())
                    except BadFileError as error:  # a 4-bit LLM export: its own sentence
                        self.refused[path] = error
                        raise
            except HalfSafeError as error:
                problem = getattr(error, "problem", str(error))
                self.passed_over[path] = problem.rstrip(".")
                self.headers[path] = None
            except Exception as error:  # one file's fault costs that file only
                self.passed_over[path] = f"the file cannot be read ({type(error).__name__})"
                self.headers[path] = None
        return self.headers[path]

    def fits(self, need: Need, path: Path) -> bool:
        shapes = self.shapes(path)
        if shapes is None:
            return False
        try:
            fits = _fits(need, shapes)
        except Exception as error:  # ValueError: damaged shapes; anything else: unforeseen
            self.passed_over.setdefault(path, _cannot_build(need.kind, error))
            return False
        if not fits and path not in self.passed_over:
            part = (
                parts.text_encoder_of(shapes) if need.is_text_encoder else parts.vae_file_of(shapes)
            )
            if part is not None:
                self.other_parts.setdefault(path, part.noted())
        return fits


def find_companions(
    model: Path, split_model: SplitModel, text_encoders: list[str], vae: str | None
) -> Companions:
    """The companions of a transformer file: the files given first (each must fit one of
    its needs and be buildable: a sentence otherwise), then the sibling folders, by contents
    (a T5 as wide as the transformer's text input, a CLIP of the width it takes, a VAE whose
    latent channels fit, each readable as the loader will read it), preferring a file whose
    name says what it is where several fit, then the first by name. Headers only, at most
    MAX_CANDIDATES per component (see `_ranked`). A file in the folders that cannot be read
    or built is passed over with why, never raised."""
    needs = split_model.companions
    found: dict[str, Path | None] = {n.component: None for n in needs}
    for given in text_encoders:
        path = Path(given).expanduser()
        if not path.is_file():
            raise BadFileError(path, "the text encoder does not exist (no such file).")
        if path.suffix.lower() not in COMPANION_SUFFIXES:
            raise UnsupportedModelError(
                path, "split text encoders are read from .safetensors or .gguf files."
            )
        shapes = _header_shapes(path)
        if kinds.text_encoder_kind(shapes) is None:
            raise UnsupportedModelError(
                path,
                f"this is not a text encoder HalfSafe reads ({kinds.words()} in the layout "
                "their files use).",
            )
        open_needs = [n for n in needs if n.is_text_encoder and found[n.component] is None]
        if not any(n.is_text_encoder for n in needs):
            raise UnsupportedModelError(
                path,
                f"the {split_model.title} file given with it carries its own text encoders, so "
                "--text-encoder has nothing to add.",
            )
        fitting = []
        for need in open_needs:
            try:
                if _fits(need, shapes):
                    fitting.append(need)
            except ValueError as error:
                raise UnsupportedModelError(path, _cannot_build(need.kind, error) + ".") from None
        if not fitting:
            _refuse_text_encoder(path, shapes, model, split_model, open_needs, found)
        need = next((n for n in fitting if _hinted(n, path)), fitting[0])
        found[need.component] = path
    if vae is not None:  # in place of the file's own VAE too, as for any checkpoint
        found["vae"] = Path(vae).expanduser()
        _check_given_vae(found["vae"], model, split_model)
    folders = _siblings(model, TEXT_ENCODER_FOLDERS)
    vae_folders = _siblings(model, VAE_FOLDERS)
    files = {True: _files(folders), False: _files(vae_folders)}  # by need.is_text_encoder
    search = _Search()
    also_fit: dict[str, tuple[Path, ...]] = {}
    for component in [c for c, path in found.items() if path is None]:
        need = next(n for n in needs if n.component == component)
        taken = set(found.values())
        fitting = [
            f.path
            for f in _ranked(need, files[need.is_text_encoder])
            if f.path not in taken and search.fits(need, f.path)
        ]
        fitting.sort(key=lambda p: (not _hinted(need, p), p.name, str(p)))
        if fitting:
            found[component], others = fitting[0], tuple(fitting[1:])
            if others:
                also_fit[component] = others
    used = set(found.values())
    others = {p: why for p, why in search.other_parts.items() if p not in used}
    return Companions(
        found, tuple(folders + vae_folders), also_fit, search.passed_over, others, search.refused
    )


def _refuse_text_encoder(
    path: Path,
    shapes: Shapes,
    model: Path,
    split_model: SplitModel,
    open_needs: list[Need],
    found: dict[str, Path | None],
) -> None:
    """The one sentence for a text encoder given that fits none of the needs left: what it is
    and whose, the transformer and its family, what it still needs, and the need it would
    fit that another file given already fills."""
    part = parts.text_encoder_of(shapes)
    assert part is not None  # its kind was read
    # The needs of its own kind where there are some (a CLIP where a CLIP-G goes), else all.
    same = [n for n in open_needs if n.kind.holds(shapes)]
    wanted = listed([n.words for n in same or open_needs] or ["no other text encoder"])
    for need in split_model.companions:
        taken = found.get(need.component)
        if need.is_text_encoder and taken is not None and _fits_quietly(need, shapes):
            wanted += f" (it fits {need.words}, already given as {taken.name})"
            break
    parts.refuse(
        path, part, parts.model_words(split_model.title, "transformer", model), wanted, model
    )


def _fits_quietly(need: Need, shapes: Shapes) -> bool:
    try:
        return _fits(need, shapes)
    except ValueError:
        return False


def _check_given_vae(path: Path, model: Path, split_model: SplitModel) -> None:
    """Refuse a --vae whose header or config says it makes other latents than the transformer
    works on (other channels, the other layout, another family's latent scale), before
    anything is read."""
    need = next((n for n in split_model.needs if not n.is_text_encoder), None)
    if need is None:
        return
    kind = need.kind
    assert isinstance(kind, VaeKind)  # the need that is not a text encoder
    scales: tuple[float, ...] = ()
    if not kind.layout:  # a latent scale in the shipped config of an original-layout VAE
        config = paths.resource("configs", split_model.configs, "vae", "config.json")
        if limits.is_regular_file(config):
            value = limits.read_json_object(config).get("scaling_factor")
            scales = (float(value),) if isinstance(value, (int, float)) else ()
    parts.check_vae(
        path,
        channels=split_model.latent_channels,
        scales=scales,
        layout=kind.layout,
        model=parts.model_words(split_model.title, "transformer", model),
        model_file=model,
        wanted=need.words,
    )


def _header_shapes(path: Path) -> Shapes:
    """A companion's tensor shapes from its header. A 4-bit LLM export (GPTQ, AWQ, W4A8) is
    refused as what it is (`int4`): its packed layers lack the plain weights, which would
    otherwise be all a sentence could name."""
    header = read_header(path)
    if isinstance(header, SafetensorsHeader):
        int4.refuse_int4(path, header.dtypes())
    return header.shapes()


def _fits(need: Need, shapes: Shapes) -> bool:
    """Whether a file fits `need`; ValueError when it is of its kind but cannot be built."""
    width = need.kind.width(shapes)
    return width is not None and need.fits(width)


def _passed_over_words(passed: list[tuple[Path, str]]) -> str:
    """ "a.safetensors (why), b.gguf (why) and 4 more" """
    shown = [f"{path} ({why})" for path, why in passed[:_PASSED_OVER_SHOWN]]
    rest = len(passed) - len(shown)
    return listed(shown + ([f"{rest} more"] if rest else []))


def companion_notes(split_model: SplitModel, companions: Companions) -> list[str]:
    """Sentences for a report on the companions found in the folders: which file was used
    where several fit, and the files passed over."""
    notes = []
    for need in split_model.companions:
        chosen, others = (
            companions.found.get(need.component),
            companions.also_fit.get(need.component),
        )
        if chosen is not None and others:
            flag = "--text-encoder PATH" if need.is_text_encoder else "--vae PATH"
            notes.append(
                f"Several files fit {need.words}: HalfSafe used {chosen} as {need.component}, "
                f"not {listed([str(p) for p in others])}; give {flag} to use another."
            )
    passed = list(companions.passed_over.items())
    if passed:
        notes.append(f"Passed over in the model folders: {_passed_over_words(passed)}.")
    return notes


def missing_sentence(split_model: SplitModel, companions: Companions, model: Path) -> str | None:
    """One sentence naming what a transformer file still needs, or None; where the one file
    passed over for it was refused for what it is (a 4-bit LLM export), that refusal is raised,
    naming that file."""
    absent = [n for n in split_model.companions if companions.found.get(n.component) is None]
    if not absent:
        return None
    words = [n.words for n in absent]
    text = any(n.is_text_encoder for n in absent)
    image = any(not n.is_text_encoder for n in absent)
    root = model.parent.parent
    folders = (TEXT_ENCODER_FOLDERS if text else ()) + (VAE_FOLDERS if image else ())
    flags = [
        flag for flag, wanted in (("--text-encoder PATH", text), ("--vae PATH", image)) if wanted
    ]
    places = " or ".join(str(root / f) for f in folders)
    # The files passed over where it was looked for may be the one the user meant.
    passed = [
        (path, why) for path, why in companions.passed_over.items() if path.parent.name in folders
    ]
    refused = [companions.refused[path] for path, _ in passed if path in companions.refused]
    if len(passed) == 1 and refused:  # the one file there, refused for what it is
        first = refused[0]
        problem = getattr(first, "problem", str(first)).rstrip(".")
        raise BadFileError(
            passed[0][0],
            f"{problem}; it is the only file found for the {listed(words)} of {model}.",
        )
    # Then the parts of another family or size, of the kind missing: a file named for it first.
    wrong = [
        (path, why)
        for path, why in companions.other_parts.items()
        if path.parent.name in folders
        and path not in companions.passed_over
        and any(n.is_text_encoder == (path.parent.name in TEXT_ENCODER_FOLDERS) for n in absent)
    ]
    wrong.sort(key=lambda item: (not any(_hinted(n, item[0]) for n in absent), item[0].name))
    passed += wrong
    return (
        f"this {split_model.title} transformer file needs {listed(words)}, which "
        f"{'is' if len(absent) == 1 else 'are'} neither given ({' and '.join(flags)}) nor "
        f"found in {places}"
        + (f" (passed over: {_passed_over_words(passed)})" if passed else "")
        + "."
    )
